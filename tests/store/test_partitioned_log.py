"""Partitioned durable logs (``partitions = N``): one destination over the segments
``NAME/0`` … ``NAME/N-1``. Through the Destination/Subscription interface, the store's
public API, and a running gateway."""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from harness import host_port, receive_now, running_gateway, settle, start
from interchange_ndjson.client import NdjsonClient

from gateway.core.destination import Delivery, EndOfStream, Subscription
from gateway.core.model import Message, Outcome, Position
from gateway.core.receipts import Receipt
from gateway.durable.log import DurableLog
from gateway.durable.partitioned import PartitionedLog
from gateway.ops.status import snapshot
from gateway.store import Store

BIG = 10**9


@asynccontextmanager
async def opened(
    directory: Path,
    name: str = "t",
    partitions: int = 3,
    *,
    partition_key: str | None = None,
    **options: Any,
) -> AsyncIterator[tuple[PartitionedLog, Store]]:
    """A store at ``directory`` and the partitioned durable log ``name`` in it, laid out
    as the catalog lays one out (closed at the end)."""
    async with Store.open(directory, fsync="never") as store:
        parts = [
            DurableLog(
                name,
                store.segment(f"{name}/{p}"),
                store,
                partition=p,
                **{"retain_bytes": BIG, **options},
            )
            for p in range(partitions)
        ]
        log = PartitionedLog(name, parts, partition_key=partition_key)
        try:
            yield log, store
        finally:
            await close_before_the_store(log)


async def close_before_the_store(log: PartitionedLog | DurableLog) -> None:
    """Close ``log`` and let the store's committer start writing the state documents
    that closing saved, before the store closes: the store loses documents a commit took
    when the store's close cancels that commit before its worker threads started."""
    log.close()
    await settle()


def msg(body: str, **headers: str) -> Message:
    return Message("t", body.encode(), headers)


def msgs(prefix: str, n: int, **headers: str) -> list[Message]:
    return [msg(f"{prefix}{i}", **headers) for i in range(n)]


async def publish(log: PartitionedLog, messages: Sequence[Message]) -> Receipt:
    receipt = Receipt(len(messages))
    await log.put_many(messages, receipt)
    receipt.seal()
    return receipt


async def stored(log: PartitionedLog, messages: Sequence[Message]) -> list[Position]:
    """Publish and wait until durable; each message's position."""
    receipt = await publish(log, messages)
    assert await receipt.wait() == Outcome.DELIVERED
    found = [r.position for r in receipt.results()]
    assert all(p is not None for p in found)
    return [p for p in found if p is not None]


async def spread(log: PartitionedLog, runs: int, size: int) -> None:
    """``runs`` keyless runs of ``size`` messages ``r<run>.<i>``: run ``k`` in partition
    ``k % N`` (sticky round-robin)."""
    for k in range(runs):
        await stored(log, [msg(f"r{k}.{i}") for i in range(size)])


def bodies(deliveries: Sequence[Delivery]) -> list[str]:
    return [d.message.body.decode() for d in deliveries]


def where(deliveries: Sequence[Delivery]) -> list[tuple[int, int]]:
    """(partition, offset) of each delivery."""
    return [(d.position.partition, d.position.offset) for d in deliveries if d.position]


async def drain(sub: Subscription) -> list[Delivery]:
    """Everything the subscription has now (up to the end of a finite read), acked."""
    got: list[Delivery] = []
    try:
        while chunk := await receive_now(sub):
            got += chunk
            sub.ack_many([d.tag for d in chunk])
    except EndOfStream:
        pass
    return got


# -- publishing ---------------------------------------------------------------------------


async def test_a_key_picks_the_partition_and_keeps_the_order_of_its_messages(
    tmp_path: Path,
) -> None:
    keys = [f"host-{i}" for i in range(12)]
    async with opened(tmp_path, partition_key="host") as (log, store):
        published: list[Message] = []
        placed: list[Position] = []
        for round_ in range(4):  # interleaved keys, several publishes
            batch = [msg(f"{key}#{round_}", host=key) for key in keys]
            published += batch
            placed += await stored(log, batch)
        partition = {m.headers["host"]: p.partition for m, p in zip(published, placed, strict=True)}
        for m, p in zip(published, placed, strict=True):
            assert p.partition == partition[m.headers["host"]]
            assert p.partition == zlib.crc32(m.headers["host"].encode()) % 3
        assert len(set(partition.values())) == 3  # twelve keys use every partition
        # Offsets are dense per partition, in publish order.
        per_partition: dict[int, list[int]] = defaultdict(list)
        for p in placed:
            per_partition[p.partition].append(p.offset)
        for offsets in per_partition.values():
            assert offsets == list(range(len(offsets)))
        # A partition's share of one publish is one record (one append).
        assert sum(store.segment(f"t/{p}").stats()["appends"] for p in range(3)) == 4 * 3
        got = await drain(log.subscribe(start="earliest", max_unacked=100))
        assert sorted(bodies(got)) == sorted(m.body.decode() for m in published)
        for key in keys:
            assert [b for b in bodies(got) if b.startswith(f"{key}#")] == [
                f"{key}#{r}" for r in range(4)
            ]


async def test_messages_without_the_key_go_sticky_round_robin(tmp_path: Path) -> None:
    async with opened(tmp_path, partition_key="host") as (log, _):
        first = await stored(log, msgs("a", 3))
        second = await stored(log, msgs("b", 3))
        assert {p.partition for p in first} == {0}
        assert {p.partition for p in second} == {1}
        mixed = await stored(log, [msg("k", host="x"), msg("c0"), msg("c1")])
        assert mixed[0].partition == zlib.crc32(b"x") % 3
        assert [p.partition for p in mixed[1:]] == [2, 2]
        # A publish whose keys all have a header leaves the rotation where it was.
        await stored(log, [msg("k", host="x")])
        assert {p.partition for p in await stored(log, msgs("d", 2))} == {0}


async def test_without_a_key_each_run_goes_whole_to_the_next_partition(tmp_path: Path) -> None:
    async with opened(tmp_path) as (log, store):
        runs = [await stored(log, msgs(f"r{k}.", 4)) for k in range(6)]
        for k, placed in enumerate(runs):
            assert placed == [Position(k // 3 * 4 + i, k % 3) for i in range(4)]
        # Kafka's sticky partitioner: one record per run, not one per message.
        assert [store.segment(f"t/{p}").stats()["appends"] for p in range(3)] == [2, 2, 2]
        assert sorted(store.names()) == ["t/0", "t/1", "t/2"]
        assert log.stats()["messages"] == 24


async def test_info_and_refusals_are_the_partitions(tmp_path: Path) -> None:
    async with opened(tmp_path, element_size=4) as (log, _):
        info = log.info
        assert (info.name, info.kind, info.positions, info.element_size) == ("t", "log", True, 4)
        assert info.queue_group is None
        receipt = await publish(log, [msg("abcd"), msg("toolong"), msg("efgh")])
        assert await receipt.wait() == Outcome.REJECTED
        results = receipt.results()
        assert [r.outcome for r in results] == [
            Outcome.DELIVERED,
            Outcome.REJECTED,
            Outcome.DELIVERED,
        ]
        assert results[0].position == Position(0, 0)
        assert results[2].position == Position(1, 0)
    async with opened(tmp_path / "q", kind="queue") as (queue, _):
        assert queue.info.queue_group == "queue"


# -- subscribing ----------------------------------------------------------------------------


async def test_a_merged_subscription_gets_everything_once_within_one_credit_and_window(
    tmp_path: Path,
) -> None:
    async with opened(tmp_path) as (log, _):
        await spread(log, 9, 4)  # 12 messages in each partition
        sub = log.subscribe("g", start="earliest", credit=5, max_unacked=8)
        first = await receive_now(sub)
        assert len(first) == 5
        assert sub.credit == 0
        assert await receive_now(sub) == []
        sub.grant(10)
        second = await receive_now(sub)
        assert len(second) == 3  # max_unacked counts every partition's unacked
        assert sub.unacked == 8
        assert await receive_now(sub) == []
        held = first + second
        assert len({d.tag for d in held}) == 8  # unique across partitions
        sub.ack_many([d.tag for d in held[:2]])
        assert len(await receive_now(sub)) == 2
        assert sub.credit == 5  # 10 granted, 3 + 2 taken
        # Another group reads everything through a small window.
        everything = await drain(log.subscribe("h", start="earliest", max_unacked=5))
        assert sorted(bodies(everything)) == sorted(f"r{k}.{i}" for k in range(9) for i in range(4))
        assert len(set(where(everything))) == 36
        # Within each partition, in order.
        for p in range(3):
            offsets = [o for q, o in where(everything) if q == p]
            assert offsets == list(range(12))


async def test_no_partition_starves_and_the_byte_window_spans_partitions(tmp_path: Path) -> None:
    async with opened(tmp_path) as (log, _):
        await spread(log, 3, 5)
        one_at_a_time = log.subscribe(start="earliest")
        partitions = [where(await receive_now(one_at_a_time, 1))[0][0] for _ in range(6)]
        assert sorted(partitions[:3]) == [0, 1, 2]
        assert sorted(partitions[3:]) == [0, 1, 2]
        size = msg("r0.0").size
        windowed = log.subscribe(start="earliest", max_unacked_bytes=2 * size)
        got = await receive_now(windowed)
        assert len(got) == 2
        assert windowed.unacked == 2
        assert await receive_now(windowed) == []
        windowed.ack(got[0].tag)
        assert len(await receive_now(windowed)) == 1
        # One alone larger than the window passes only when no partition holds one.
        tiny = log.subscribe(start="earliest", max_unacked_bytes=1)
        lone = await receive_now(tiny)
        assert len(lone) == 1
        assert await receive_now(tiny) == []
        tiny.nack(lone[0].tag)  # back to its partition, redelivered first there
        other = await receive_now(tiny)  # this receive starts at another partition
        assert len(other) == 1
        assert where(other)[0][0] != where(lone)[0][0]
        assert await receive_now(tiny) == []  # nor the redelivery, while other is held
        tiny.ack(other[0].tag)
        redelivered: list[Delivery] = []
        for _ in range(3):  # one at a time, each receive starting at the next partition
            [one] = await receive_now(tiny)
            tiny.ack(one.tag)
            redelivered += [one] if one.redelivered else []
        assert where(redelivered) == where(lone)


async def test_acks_and_nacks_go_to_the_partition_that_delivered(tmp_path: Path) -> None:
    async with opened(tmp_path) as (log, _):
        await spread(log, 3, 2)
        sub = log.subscribe("g", start="earliest")
        got = await receive_now(sub)
        assert len(got) == 6
        by_place = {(d.position.partition, d.position.offset): d for d in got if d.position}
        sub.nack(by_place[(2, 1)].tag)
        sub.nack(by_place[(1, 0)].tag, requeue=False)
        again = await receive_now(sub)
        assert [(where([d])[0], d.redelivered, d.message.body) for d in again] == [
            ((2, 1), True, b"r2.1")
        ]
        with pytest.raises(KeyError, match=str(by_place[(1, 0)].tag)):
            sub.ack(by_place[(1, 0)].tag)  # settled by the nack
        sub.ack(by_place[(0, 0)].tag)
        assert sub.committed is None
        assert sub.committed_positions == [Position(1, 0), Position(1, 1), Position(0, 2)]
        # In order until a settled tag (the nacked delivery's): the ones before it settle.
        stale = by_place[(2, 1)].tag
        with pytest.raises(KeyError, match=rf"tag {stale}\b"):
            sub.ack_many([by_place[(0, 1)].tag, by_place[(2, 0)].tag, stale, again[0].tag])
        assert sub.committed_positions == [Position(2, 0), Position(1, 1), Position(1, 2)]
        sub.ack_many([by_place[(1, 1)].tag, again[0].tag])
        assert sub.committed_positions == [Position(2, 0), Position(2, 1), Position(2, 2)]
        assert sub.unacked == 0
        assert log.stats()["groups"]["g"] == {
            "members": 1,
            "unacked": 0,
            "behind": 0,
            "dropped": 0,
            "rejected": 1,
        }


async def test_closing_gives_unacked_deliveries_back_to_the_group(tmp_path: Path) -> None:
    async with opened(tmp_path) as (log, _):
        await spread(log, 3, 2)
        first = log.subscribe("g", start="earliest")
        got = await receive_now(first)
        first.ack_many([d.tag for d in got[:2]])
        first.close()
        with pytest.raises(trio.ClosedResourceError):
            await receive_now(first)
        second = log.subscribe("g")
        again = await drain(second)
        assert sorted(where(again)) == sorted(where(got[2:]))
        assert all(d.redelivered for d in again)


async def test_start_at_a_position_of_one_partition(tmp_path: Path) -> None:
    async with opened(tmp_path) as (log, _):
        await spread(log, 6, 1)  # two messages in each partition
        got = await drain(log.subscribe(start=Position(1, 2)))
        assert sorted(where(got)) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 1)]
        assert sorted(where(await drain(log.subscribe(start=1)))) == [(0, 1), (1, 1), (2, 1)]
        assert await drain(log.subscribe(start="latest")) == []
        with pytest.raises(ValueError, match="partitions 0 to 2"):
            log.subscribe(start=Position(0, 3))
        await stored(log, [msg("extra")])  # partition 0 is longer now
        with pytest.raises(ValueError, match="partition 1"):
            log.subscribe("late", start=3)
        assert "late" not in log.stats()["groups"]  # no partition kept the group


async def test_finite_reads_end_once_every_partition_ended(tmp_path: Path) -> None:
    async with opened(tmp_path) as (log, _):
        await spread(log, 6, 1)
        to_latest = log.subscribe(start="earliest", end="latest")
        await stored(log, [msg("after")])  # past the end of partition 0's read
        assert len(await receive_now(to_latest)) == 6
        with pytest.raises(EndOfStream):
            await receive_now(to_latest)
        with pytest.raises(EndOfStream):
            await receive_now(to_latest)  # from then on
        part_of_one = log.subscribe(start="earliest", end=Position(1, 1))
        got = await drain(part_of_one)
        assert sorted(where(got)) == [(0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (2, 1)]
        with pytest.raises(EndOfStream):
            await receive_now(part_of_one)


async def test_a_waiting_receive_wakes_for_any_partition_without_polling(
    tmp_path: Path,
) -> None:
    async with opened(tmp_path) as (log, _), trio.open_nursery() as nursery:
        await spread(log, 3, 1)
        sub = log.subscribe(start="latest", end=2)  # one more message in each partition
        waiting = start(nursery, sub.receive)
        with trio.fail_after(5):  # a receive that polled would never let this return
            await settle()
        assert not waiting.done
        await publish(log, [msg("p0")])  # runs go to partitions 0, 1, 2 in turn
        await settle()
        assert waiting.done
        assert bodies(waiting.result) == ["p0"]
        await publish(log, [msg("p1")])
        assert bodies(await receive_now(sub)) == ["p1"]
        ending = start(nursery, sub.receive)
        await settle()
        assert not ending.done  # partition 2 has not reached its end
        await publish(log, [msg("p2")])
        await settle()
        assert bodies(ending.result) == ["p2"]
        last = start(nursery, sub.receive)
        await settle()
        assert isinstance(last.error, EndOfStream)
        # Credit and closing wake a waiting receive too.
        starved = log.subscribe(start="earliest", credit=0)
        waiting = start(nursery, starved.receive)
        await settle()
        assert not waiting.done
        starved.grant(1)
        await settle()
        assert len(waiting.result) == 1
        closed = start(nursery, log.subscribe().receive)
        await settle()
        log.close()
        await settle()
        assert isinstance(closed.error, trio.ClosedResourceError)


# -- groups and restarts ----------------------------------------------------------------------


async def test_a_named_group_resumes_in_every_partition_after_a_restart(tmp_path: Path) -> None:
    async with opened(tmp_path) as (log, _):
        log.declare_group("idle")
        await spread(log, 6, 2)  # four messages in each partition
        sub = log.subscribe("g", start="earliest")
        got = await receive_now(sub)
        acked = [d for d in got if d.position and d.position.offset < d.position.partition + 1]
        sub.ack_many([d.tag for d in acked])  # partition p: offsets 0..p acked
        assert sub.committed_positions == [Position(1, 0), Position(2, 1), Position(3, 2)]
    async with opened(tmp_path) as (log, _):
        assert sorted(log.stats()["groups"]) == ["g", "idle"]
        sub = log.subscribe("g", start="latest")  # exists: start is ignored
        assert sub.committed_positions == [Position(1, 0), Position(2, 1), Position(3, 2)]
        rest = await drain(sub)
        assert sorted(where(rest)) == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
        assert len(await drain(log.subscribe("idle"))) == 12
        assert (await stored(log, [msg("next")]))[0] == Position(4, 0)  # round-robin restarts
    async with opened(tmp_path) as (log, _):
        assert log.subscribe("g").committed_positions == [
            Position(4, 0),
            Position(4, 1),
            Position(4, 2),
        ]


async def test_partition_0_keeps_the_groups_of_a_destination_of_one_partition(
    tmp_path: Path,
) -> None:
    async with Store.open(tmp_path, fsync="never") as store:
        single = DurableLog("t", store.segment("t/0"), store, retain_bytes=BIG)
        receipt = Receipt(3)
        await single.put_many(msgs("old", 3), receipt)
        receipt.seal()
        sub = single.subscribe("g", start="earliest")
        got = await receive_now(sub)
        sub.ack_many([d.tag for d in got[:2]])
        await close_before_the_store(single)
    owners = ("t", "t/1", "t/2")
    async with opened(tmp_path) as (log, store):
        await spread(log, 3, 1)  # one message in each partition; partition 0's is offset 3
        sub = log.subscribe("g", start="earliest")
        assert sub.committed_positions == [Position(2, 0), Position(0, 1), Position(0, 2)]
        assert sorted(bodies(await drain(sub))) == ["old2", "r0.0", "r1.0", "r2.0"]
        # Each partition's groups in its own document: the name, then NAME/p.
        assert [store.load_state(owner)["groups"]["g"]["committed"] for owner in owners] == [
            4,
            1,
            1,
        ]


# -- in a gateway ------------------------------------------------------------------------------


def partitioned_config() -> dict[str, Any]:
    return {
        "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
        "destinations": [
            {
                "name": "events",
                "store": "embedded",
                "partitions": 3,
                "partition_key": "host",
                "retain_age": "1h",
                "groups": ["audit"],
            }
        ],
    }


async def test_a_gateway_spreads_a_partitioned_destination_over_its_segments(
    tmp_path: Path,
) -> None:
    hosts = [f"h{i}" for i in range(6)]
    async with running_gateway(partitioned_config(), base_dir=tmp_path) as gw:
        receipt = await gw.hub.publish(
            [Message("events", f"{h}:{n}".encode(), {"host": h}) for n in range(5) for h in hosts]
        )
        assert await receipt.wait() == Outcome.DELIVERED
        placed = [r.position for r in receipt.results()]
        assert {p.partition for p in placed if p} == {0, 1, 2}
        async with NdjsonClient(
            await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        ) as client:
            answer = await client.publish(b"h0:5", "events", headers={"host": "h0"})
            assert answer.status == "delivered"
        assert gw.store is not None
        assert sorted(gw.store.names()) == ["events/0", "events/1", "events/2"]
        assert {gw.store.segment(f"events/{p}").retain_age for p in range(3)} == {3600}
        sub = gw.hub.subscribe("events", "audit", max_unacked=100)
        with trio.fail_after(10):
            got = await sub.receive()
        # The first three of each partition: the group commits past them there.
        sub.ack_many([d.tag for d in got if d.position and d.position.offset < 3])
        assert gw.metrics.value("interchange_store_segments") == 3
    by_host: dict[str, list[str]] = defaultdict(list)
    for d in got:
        host = d.message.headers["host"]
        assert d.position is not None
        assert d.position.partition == zlib.crc32(host.encode()) % 3
        by_host[host].append(d.message.body.decode())
    assert by_host == {h: [f"{h}:{n}" for n in range(6 if h == "h0" else 5)] for h in hosts}
    async with running_gateway(partitioned_config(), base_dir=tmp_path) as gw:
        sub = gw.hub.subscribe("events", "audit")
        assert sub.committed_positions == [Position(3, p) for p in range(3)]
        with trio.fail_after(10):
            rest = await sub.receive()
    assert sorted(where(rest)) == sorted(where([d for d in got if d.position.offset >= 3]))


async def test_status_and_metrics_show_a_partitioned_destination(tmp_path: Path) -> None:
    async with running_gateway(partitioned_config(), base_dir=tmp_path) as gw:
        sub = gw.hub.subscribe("events", "readers")
        await gw.hub.publish([Message("events", b"e%d" % i, {"host": f"h{i}"}) for i in range(9)])
        with trio.fail_after(10):
            got = []
            while len(got) < 9:
                got += await sub.receive()
        sub.ack_many(d.tag for d in got[:4])
        status = snapshot(gw)
        exposition = gw.metrics.exposition().decode()
    (events,) = [d for d in status["destinations"] if d["name"] == "events"]
    assert events["kind"] == "log"
    assert (events["log"]["partitions"], events["log"]["next"]) == (3, 9)
    (readers,) = [g for g in events["groups"] if g["name"] == "readers"]
    assert (readers["unacked"], readers["behind"]) == (5, 5)
    assert 'interchange_destination_messages_in_total{destination="events"} 9.0' in exposition
    assert (
        'interchange_group_unacked_messages{destination="events",group="readers"} 5.0' in exposition
    )


async def test_a_subscriber_that_reads_no_positions_gets_none_from_every_partition(
    tmp_path: Path,
) -> None:
    async with opened(tmp_path) as (log, _):
        for i in range(3):
            await publish(log, msgs(f"p{i}-", 2))  # sticky: one partition per publish
        sub = log.subscribe(start="earliest", positions=False)
        got = await receive_now(sub)
        assert sorted(d.message.body for d in got) == sorted(
            f"p{i}-{j}".encode() for i in range(3) for j in range(2)
        )
        assert {d.position for d in got} == {None}
