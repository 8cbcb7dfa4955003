"""Durable logs across restarts and in the segment store: what the shared log suite
(tests/test_memlog.py) cannot see. Through the Destination/Subscription interface, the
store's public API and its files only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from harness import receive_now

from gateway.core.destination import Delivery, Subscription
from gateway.core.filters import Filter
from gateway.core.model import Message, Outcome, Position
from gateway.core.receipts import Receipt
from gateway.durable.log import DurableLog
from gateway.store import RecordFormat, Segment, Store, frame_events
from gateway.store.store import SWEEP_SECONDS

BIG = 10**9


@asynccontextmanager
async def opened(
    directory: Path, name: str = "t", *, store_options: dict[str, Any] | None = None, **options: Any
) -> AsyncIterator[tuple[DurableLog, Store, Segment]]:
    """A store at ``directory`` and the durable log ``name`` in it (closed at the end)."""
    async with Store.open(directory, **(store_options or {"fsync": "never"})) as store:
        segment = store.segment(name)
        assert segment is not None
        log = DurableLog(name, segment, store, **{"retain_bytes": BIG, **options})
        try:
            yield log, store, segment
        finally:
            log.close()


def msgs(ns: Sequence[int] | range, **headers: str) -> list[Message]:
    return [Message("t", b"m%d" % n, headers) for n in ns]


async def publish(log: DurableLog, messages: Sequence[Message]) -> Receipt:
    receipt = Receipt(len(messages))
    await log.put_many(messages, receipt)
    receipt.seal()
    return receipt


def offsets(deliveries: Sequence[Delivery]) -> list[int]:
    return [d.position.offset if d.position else -1 for d in deliveries]


def bodies(deliveries: Sequence[Delivery]) -> list[bytes]:
    return [d.message.body for d in deliveries]


async def read_all(sub: Subscription, *, ack: bool = True) -> list[Delivery]:
    got = await receive_now(sub)
    if ack:
        sub.ack_many([d.tag for d in got])
    return got


def stats(log: DurableLog) -> dict[str, Any]:
    return log.stats()


def group_stats(log: DurableLog, group: str) -> dict[str, int]:
    groups: dict[str, dict[str, int]] = stats(log)["groups"]
    return groups[group]


async def until(predicate: Callable[[], bool]) -> None:
    """Wait in trio time: the committer syncs and deletes in worker threads."""
    while not predicate():
        await trio.sleep(0.01)


# -- restarts -------------------------------------------------------------------------


async def test_a_restart_keeps_messages_positions_and_named_groups(tmp_path: Path) -> None:
    only_x = Filter.equals(k="x")
    async with opened(tmp_path, store_options={"fsync": "interval"}) as (log, _, _):
        log.declare_group("idle")
        g = log.subscribe("g", start="earliest")
        f = log.subscribe("f", filter=only_x)
        anonymous = log.subscribe(start="earliest")
        await (await publish(log, msgs(range(6), k="x") + msgs(range(6, 10), k="y"))).wait()
        got = await read_all(g, ack=False)
        g.ack_many([d.tag for d in got[:5]])  # 0-4 acked, 5-9 delivered and not acked
        assert bodies(await read_all(f)) == [b"m%d" % n for n in range(6)]
        await read_all(anonymous)
        before = (stats(log)["first"], stats(log)["next"], stats(log)["bytes"])
    async with opened(tmp_path) as (log, _, _):
        assert (stats(log)["first"], stats(log)["next"], stats(log)["bytes"]) == before
        assert sorted(stats(log)["groups"]) == ["f", "g", "idle"]
        assert [group_stats(log, n)["committed"] for n in ("f", "g", "idle")] == [10, 5, 0]
        g = log.subscribe("g", start="latest")  # exists: start is ignored
        assert g.committed == Position(5)
        again = await read_all(g)
        assert (offsets(again), bodies(again)) == (
            [5, 6, 7, 8, 9],
            [b"m%d" % n for n in range(5, 10)],
        )
        assert again[0].message == Message("t", b"m5", {"k": "x"})
        idle = await read_all(log.subscribe("idle"))
        assert offsets(idle) == list(range(10))
        with pytest.raises(ValueError, match="filter"):
            log.subscribe("f")  # the filter came back with the group
        assert await receive_now(log.subscribe("f", filter=only_x)) == []
        # New messages continue the offsets.
        receipt = await publish(log, msgs([10]))
        assert receipt.results()[0].position == Position(10)
        assert offsets(await read_all(g)) == [10]
    async with opened(tmp_path) as (log, _, _):
        assert group_stats(log, "g")["committed"] == 11


async def test_a_queue_keeps_its_one_group_across_restarts(tmp_path: Path) -> None:
    async with opened(tmp_path, kind="queue") as (log, _, _):
        await publish(log, msgs(range(4)))
        sub = log.subscribe()
        got = await read_all(sub, ack=False)
        sub.ack(got[0].tag)
    async with opened(tmp_path, kind="queue") as (log, _, _):
        assert list(stats(log)["groups"]) == ["queue"]
        assert offsets(await read_all(log.subscribe("any"))) == [1, 2, 3]


async def test_many_messages_through_a_restart_in_order(tmp_path: Path) -> None:
    """Tens of thousands of messages, read back from the segment (the cache holds few)."""
    n, batch, cache = 30_000, 500, 64 * 1024
    async with opened(
        tmp_path, store_options={"fsync": "interval", "chunk_bytes": 64 * 1024}, cache_bytes=cache
    ) as (log, store, _):
        g = log.subscribe("g", start="earliest", max_unacked=n)
        receipts = [await publish(log, msgs(range(i, i + batch))) for i in range(0, n, batch)]
        for receipt in receipts:
            assert await receipt.wait() == Outcome.DELIVERED
        assert receipts[-1].results()[-1].position == Position(n - 1)
        got = await receive_now(g, n // 2)
        g.ack_many([d.tag for d in got])
        assert store.stats()["commits"] < n // batch  # group commits
    async with opened(tmp_path, cache_bytes=cache) as (log, _, segment):
        assert segment.stats()["chunks"] > 10
        g = log.subscribe("g", max_unacked=n)
        rest: list[Delivery] = []
        while chunk := await receive_now(g, 1000):
            rest += chunk
        assert offsets(rest) == list(range(n // 2, n))
        assert bodies(rest) == [b"m%d" % i for i in range(n // 2, n)]
        replay: list[Delivery] = []
        everything = log.subscribe(start="earliest", max_unacked=n)
        while chunk := await receive_now(everything, 3000):
            replay += chunk
        assert bodies(replay) == [b"m%d" % i for i in range(n)]
        assert stats(log)["cached"] < 1000  # 64 KiB of the 30 000


# -- durability -----------------------------------------------------------------------


async def test_receipts_settle_only_once_durable(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    """The clock moves only when the test jumps it: the committer's fsyncs run in
    worker threads, during which an autojump clock would move on its own."""

    async def spin_until(predicate: Callable[[], bool]) -> None:
        while not predicate():
            await trio.sleep(0)

    options = {"fsync": "interval", "fsync_interval": 1.0}
    async with opened(tmp_path, store_options=options) as (log, store, segment):
        await spin_until(lambda: store.stats()["commits"] > 0)  # the segment's creation, at 0
        sub = log.subscribe()
        receipt = await publish(log, msgs(range(3)))
        assert not receipt.done()
        # Subscribers need not wait for the fsync.
        assert offsets(await read_all(sub)) == [0, 1, 2]
        mock_clock.jump(0.9)
        await trio.testing.wait_all_tasks_blocked()
        assert not receipt.done()
        assert segment.durable_end < segment.end
        mock_clock.jump(0.2)
        await spin_until(receipt.done)
        assert receipt.outcome == Outcome.DELIVERED
        assert segment.durable_end == segment.end
        assert [r.position for r in receipt.results()] == [Position(i) for i in range(3)]


async def test_appends_after_the_store_closed_fail(tmp_path: Path) -> None:
    async with opened(tmp_path) as (log, _, _):
        pass
    with pytest.raises(trio.ClosedResourceError):
        await publish(log, msgs([0]))
    with pytest.raises(trio.ClosedResourceError):
        log.subscribe()


# -- other writers, retention, damage ---------------------------------------------------


async def test_raw_records_of_another_writer_are_messages(tmp_path: Path) -> None:
    async with opened(tmp_path) as (log, _, segment):
        sub = log.subscribe("g")
        await publish(log, msgs([0]))
        segment.append(frame_events([b"raw1", b"raw2"]), 2)  # a segment-append client
        receipt = await publish(log, msgs([3]))
        assert receipt.results()[0].position == Position(3)
        got = await read_all(sub)
        assert [d.message for d in got] == [
            Message("t", b"m0"),
            Message("t", b"raw1"),
            Message("t", b"raw2"),
            Message("t", b"m3"),
        ]
        assert offsets(got) == [0, 1, 2, 3]
    async with opened(tmp_path) as (log, _, _):
        got = await read_all(log.subscribe(start="earliest"))
        assert bodies(got) == [b"m0", b"raw1", b"raw2", b"m3"]


async def test_eviction_truncates_the_segment(tmp_path: Path) -> None:
    size = Message("t", b"m0").size
    async with opened(tmp_path, retain_bytes=3 * size, overflow="drop_oldest") as (log, _, seg):
        for i in range(10):
            await publish(log, msgs([i]))
        assert (stats(log)["first"], seg.first_event) == (7, 7)
    async with opened(tmp_path, retain_bytes=3 * size) as (log, _, _):
        assert (stats(log)["first"], stats(log)["next"]) == (7, 10)
        assert bodies(await read_all(log.subscribe(start="earliest"))) == [b"m7", b"m8", b"m9"]


async def test_a_smaller_bound_on_open_evicts_what_no_group_holds(tmp_path: Path) -> None:
    size = Message("t", b"m0").size
    async with opened(tmp_path) as (log, _, _):
        await publish(log, msgs(range(6)))
        g = log.subscribe("g", start="earliest")
        await receive_now(g, 2)  # delivered, not acked: the group still holds 0 on
    async with opened(tmp_path, retain_bytes=2 * size) as (log, _, _):
        assert (stats(log)["first"], stats(log)["bytes"]) == (0, 6 * size)  # block: held
        g = log.subscribe("g")
        g.ack_many([d.tag for d in await receive_now(g, 3)])
    async with opened(tmp_path, retain_bytes=2 * size) as (log, _, segment):
        assert (stats(log)["first"], segment.first_event) == (3, 3)  # down to what g holds
    async with opened(tmp_path, retain_bytes=2 * size, overflow="drop_oldest") as (log, _, _):
        assert (stats(log)["first"], stats(log)["bytes"]) == (4, 2 * size)
        assert group_stats(log, "g")["dropped"] == 1


async def test_raw_appends_beyond_the_bound(tmp_path: Path) -> None:
    size = Message("t", b"raw0").size
    async with opened(tmp_path, retain_bytes=3 * size) as (log, _, segment):
        g = log.subscribe("g", start="earliest")
        segment.append(frame_events([b"raw%d" % i for i in range(5)]), 5)
        assert (stats(log)["first"], stats(log)["next"]) == (0, 5)  # block: g holds them
        g.ack_many([d.tag for d in await receive_now(g, 4)])
        segment.append(frame_events([b"raw5"]), 1)
        assert stats(log)["first"] == 3  # what g committed past went, down to the bound
    async with opened(tmp_path, retain_bytes=3 * size, overflow="drop_oldest") as (log, _, seg):
        seg.append(frame_events([b"raw6", b"raw7"]), 2)
        assert (stats(log)["first"], stats(log)["bytes"]) == (5, 3 * size)
        assert group_stats(log, "g")["dropped"] == 1  # raw4, never read
        assert bodies(await read_all(log.subscribe("g"))) == [b"raw5", b"raw6", b"raw7"]


async def test_retention_by_the_store_drops_like_drop_oldest(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store_options = {"fsync": "never", "chunk_bytes": 1000, "retain_bytes": 2000}
    async with opened(tmp_path, store_options=store_options) as (log, _, segment):
        lagging = log.subscribe("lagging", max_unacked=1000)
        for i in range(0, 100, 5):
            await publish(log, msgs(range(i, i + 5)))
        await until(lambda: stats(log)["first"] > 0)  # told once the files are gone
        assert trio.current_time() >= SWEEP_SECONDS
        first = segment.first_event
        assert stats(log)["first"] == first
        assert (lagging.committed, group_stats(log, "lagging")["dropped"]) == (
            Position(first),
            first,
        )
        got = await read_all(lagging)
        assert offsets(got) == list(range(first, 100))


async def test_corrupt_and_undecodable_events_are_skipped(tmp_path: Path) -> None:
    async with opened(tmp_path) as (log, _, segment):
        log.declare_group("g")
        for i in range(0, 6, 2):  # three records of two events
            await publish(log, msgs([i, i + 1]))
        segment.append(frame_events([b"\xc1"]), 1, format=RecordFormat.ENVELOPE)
        await publish(log, msgs([7]))
    [data] = (tmp_path / "segments").glob("*/*.data")
    raw = bytearray(data.read_bytes())
    raw[raw.index(b"m2")] ^= 0xFF  # the second record fails its checksum
    data.write_bytes(raw)
    async with opened(tmp_path) as (log, _, _):
        sub = log.subscribe("g")
        got = await read_all(sub)
        assert (offsets(got), bodies(got)) == ([0, 1, 4, 5, 7], [b"m0", b"m1", b"m4", b"m5", b"m7"])
        assert sub.committed == Position(8)
        assert group_stats(log, "g")["dropped"] == 3
        assert stats(log)["unreadable"] == 3
        replay = await read_all(log.subscribe(start=2, filter=Filter.equals(k="x")))
        assert replay == []
