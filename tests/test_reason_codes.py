"""Reason codes and destination figures, through the hub's and the metrics' public interfaces.

Every failure the hub can produce is driven here: its receipt (and the failed
message's ``Result``) carries a :class:`~gateway.core.reasons.Reason` chosen
where the failure happened, and ``interchange_publishes_total`` counts it under
the code's label, whatever its text says. Every code has a scenario (a new code
without one fails :func:`test_every_code_has_a_scenario`).

Each destination kind (topic, queue, memory log, durable log, partitioned log)
answers :meth:`~gateway.core.destination.Destination.figures`, and the metrics
export any destination through it, a kind they have never heard of included.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway
from prometheus_client.parser import text_string_to_metric_families

from gateway.core.destination import (
    Destination,
    DestinationFigures,
    DestinationInfo,
    GroupFigures,
    Subscription,
)
from gateway.core.filters import Filter
from gateway.core.hub import Hub, HubLimits
from gateway.core.memory_log import MemoryLog
from gateway.core.model import MESSAGE_OVERHEAD, Message, Outcome, Reply
from gateway.core.reasons import PUBLISH_REASONS, Reason, Refusal
from gateway.core.receipts import Receipt
from gateway.core.topic import Topic
from gateway.durable.log import DurableLog
from gateway.durable.partitioned import PartitionedLog
from gateway.ops.metrics import Metrics
from gateway.store import Store


def msg(destination: str, body: bytes = b"x", **headers: str) -> Message:
    return Message(destination, body, headers)


class Provider:
    """Claims a few names for destinations other than topics."""

    def open(self, name: str) -> Destination | None:
        if name == "elements":
            return Topic(name, element_size=4)
        if name == "log":
            return MemoryLog(name, retain_bytes=4096)
        if name == "nostore":
            raise LookupError(f"destination {name!r} is durable but no store is open")
        return None


def publishes(metrics: Metrics) -> dict[tuple[str, str], float]:
    """``interchange_publishes_total`` as read from the ``/metrics`` text, by labels."""
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        if family.name == "interchange_publishes":
            for s in family.samples:
                out[(s.labels["outcome"], s.labels["reason"])] = s.value
    return out


# -- one scenario per code: each returns the receipt that failed (None: the publisher got none)


Scenario = Callable[[Hub], Awaitable["Receipt | None"]]


async def too_large(hub: Hub) -> Receipt:
    return await hub.publish([msg("t"), msg("t", b"x" * 2048)])


async def wrong_size(hub: Hub) -> Receipt:
    return await hub.publish([msg("elements", b"abcd"), msg("elements", b"abc")])


async def too_many_destinations(hub: Hub) -> Receipt:
    for i in range(4):
        hub.destination(f"d{i}")
    return await hub.publish([msg("d0"), msg("one-too-many")])


async def no_upstream(hub: Hub) -> Receipt:
    return await hub.publish([msg("t"), msg("upstream:nowhere")])


async def takes_no_calls(hub: Hub) -> Receipt:
    return await hub.call(msg("log"), 1.0)


async def unavailable(hub: Hub) -> Receipt:
    return await hub.publish([msg("t"), msg("nostore")])


async def closed(hub: Hub) -> None:
    hub.subscribe("t")
    await hub.publish([msg("t"), msg("t")])  # fills t's only group: never acked

    async def publish_into_full_buffer() -> None:
        with pytest.raises(trio.ClosedResourceError):
            await hub.publish([msg("t")])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_into_full_buffer)
        await trio.testing.wait_all_tasks_blocked()
        hub.close()
    return


async def expired(hub: Hub) -> Receipt:
    hub.subscribe("svc")  # takes the call, never answers
    receipt = await hub.call(msg("svc"), 5.0)
    await receipt.wait()
    return receipt


async def no_subscriber(hub: Hub) -> Receipt:
    receipt = await hub.call(msg("nobody"), 5.0)
    await receipt.wait()
    return receipt


async def no_reply(hub: Hub) -> Receipt:
    sub = hub.subscribe("svc")
    receipt = await hub.call(msg("svc"), 5.0)
    [delivery] = await sub.receive()
    sub.ack(delivery.tag)  # settled, but not answered
    await receipt.wait()
    return receipt


async def refused_by_target(hub: Hub) -> Receipt:
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg("t"), msg("t")])
    first, second = await sub.receive()
    sub.ack(first.tag)
    sub.nack(second.tag, requeue=False, outcome=Outcome.REJECTED, reason="not for me")
    await receipt.wait()
    return receipt


#: code → (scenario, outcome, index of the failed message in its publish).
SCENARIOS: dict[Reason, tuple[Scenario, Outcome, int]] = {
    Reason.TOO_LARGE: (too_large, Outcome.REJECTED, 1),
    Reason.WRONG_SIZE: (wrong_size, Outcome.REJECTED, 1),
    Reason.TOO_MANY_DESTINATIONS: (too_many_destinations, Outcome.REJECTED, 1),
    Reason.NO_UPSTREAM: (no_upstream, Outcome.REJECTED, 1),
    Reason.TAKES_NO_CALLS: (takes_no_calls, Outcome.REJECTED, 0),
    Reason.UNAVAILABLE: (unavailable, Outcome.REJECTED, 1),
    Reason.CLOSED: (closed, Outcome.FAILED, 0),
    Reason.EXPIRED: (expired, Outcome.FAILED, 0),
    Reason.NO_SUBSCRIBER: (no_subscriber, Outcome.FAILED, 0),
    Reason.NO_REPLY: (no_reply, Outcome.FAILED, 0),
    Reason.REFUSED_BY_TARGET: (refused_by_target, Outcome.REJECTED, 1),
}


def test_every_code_has_a_scenario() -> None:
    # ABANDONED needs a protocol session (test_a_sender_that_leaves...); OTHER is no
    # failure of the hub's (test_a_receipt_made_settled...).
    assert set(SCENARIOS) | {Reason.ABANDONED, Reason.OTHER} == set(Reason)


def test_every_code_has_a_label_of_the_bounded_set() -> None:
    assert {code.label for code in Reason} == set(PUBLISH_REASONS)
    assert len(PUBLISH_REASONS) < len(Reason)  # labels group codes: few series
    assert [code for code in Reason if code.value != code.name.lower()] == []


@pytest.mark.parametrize("code", list(SCENARIOS), ids=lambda c: c.value)
async def test_each_failure_carries_its_code_and_is_counted_under_its_label(
    code: Reason, autojump_clock: trio.testing.MockClock
) -> None:
    scenario, outcome, index = SCENARIOS[code]
    hub = Hub(
        limits=HubLimits(max_destinations=4, buffer_bytes=1024, buffer_messages=2),
        providers=[Provider()],
    )
    metrics = Metrics()
    metrics.watch_hub(hub)
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        receipt = await scenario(hub)
        nursery.cancel_scope.cancel()
    if receipt is not None:
        assert receipt.outcome is outcome
        assert receipt.reason_code is code
        assert receipt.reason  # the text stays, for humans
        results = receipt.results()
        assert results[index].reason_code is code
        assert results[index].outcome is outcome
        assert [r.reason_code for i, r in enumerate(results) if i != index] == [None] * (
            len(results) - 1
        )
    assert hub.not_delivered == {(outcome, code): 1}
    assert publishes(metrics) == {
        ("delivered", ""): hub.delivered,
        (outcome.name.lower(), code.label): 1,
    }


async def test_the_text_of_a_reason_does_not_choose_its_label() -> None:
    """A subscriber may say anything, the words of the gateway's own reasons included."""
    hub = Hub()
    metrics = Metrics()
    metrics.watch_hub(hub)
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg("t"), msg("t"), msg("t")])
    a, b, c = await sub.receive()
    sub.nack(a.tag, requeue=False, reason="its sender closed the connection; not settled")
    sub.nack(b.tag, requeue=False, reason="message of 9 bytes exceeds the buffer of destination")
    sub.nack(c.tag, requeue=False)  # no reason at all: still the target's refusal
    assert [r.reason_code for r in receipt.results()] == [Reason.REFUSED_BY_TARGET] * 3
    assert publishes(metrics)[("failed", "refused_by_target")] == 1


async def test_a_refusal_keeps_its_code_in_every_log_kind(tmp_path: Path) -> None:
    """Logs refuse what can never fit as topics do, partitioned ones through each partition."""
    async with Store.open(tmp_path, fsync="never") as store:
        parts = [
            DurableLog("p", store.segment(f"p/{p}"), store, partition=p, retain_bytes=4096)
            for p in range(3)
        ]
        logs: list[Destination] = [
            MemoryLog("m", retain_bytes=4096, element_size=4),
            DurableLog("d", store.segment("d"), store, retain_bytes=4096),
            PartitionedLog("p", parts, partition_key="k"),
        ]
        for log in logs:
            big = msg(log.name, b"x" * 5000, k="a")
            assert isinstance(log.check(big), Refusal)
            receipt = Receipt(3)
            await log.put_many([msg(log.name, b"abcd", k="a"), big, msg(log.name, k="b")], receipt)
            receipt.seal()
            await receipt.wait()
            codes = [r.reason_code for r in receipt.results()]
            if log.info.element_size:
                assert codes == [None, Reason.WRONG_SIZE, Reason.WRONG_SIZE], log.name
            else:
                assert codes == [None, Reason.TOO_LARGE, None], log.name
            log.close()
        await trio.testing.wait_all_tasks_blocked()


async def test_a_receipt_made_settled_without_a_code_is_other() -> None:
    receipt = Receipt.settled(Outcome.FAILED, "refused up front", 2)
    assert receipt.reason_code is Reason.OTHER
    assert [r.reason_code for r in receipt.results()] == [Reason.OTHER] * 2
    assert Reason.OTHER.label == "other"
    assert Receipt.settled(Outcome.DELIVERED).reason_code is None


async def test_an_answered_call_has_no_code() -> None:
    """A call's copies that failed before the first reply no longer count."""
    hub = Hub()
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        a, b = hub.subscribe("svc"), hub.subscribe("svc")
        receipt = await hub.call(msg("svc"), 5.0)
        [da], [db] = await a.receive(), await b.receive()
        a.nack(da.tag, requeue=False, reason="busy")
        b.reply(db.tag, Reply(b"ok"))
        assert receipt.outcome is Outcome.DELIVERED
        assert receipt.reason_code is None
        assert receipt.results()[0].reason_code is None
        nursery.cancel_scope.cancel()


async def test_a_sender_that_leaves_with_publishes_pending_is_counted_abandoned(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The protocol session settles what its departed sender is owed as ABANDONED."""
    config = {
        "gateway": {"drain_timeout": "1s"},
        "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
        "destinations": [{"name": "jobs", "kind": "queue"}],
    }
    async with running_gateway(config) as gw:
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        lines = b"".join(b'{"op":"pub","id":%d,"dest":"jobs","body":"j"}\n' % i for i in (1, 2, 3))
        await stream.send_all(lines)
        await until(lambda: gw.hub.inflight == 3)
        await stream.aclose()
        await until(lambda: gw.hub.inflight == 0)
        assert gw.hub.not_delivered == {(Outcome.FAILED, Reason.ABANDONED): 3}
        assert publishes(gw.metrics)[("failed", "abandoned")] == 3


async def until(check: Callable[[], bool]) -> None:
    with trio.fail_after(60):
        while not check():
            await trio.sleep(0.05)


# -- figures ----------------------------------------------------------------------------------

#: What every message below is charged: a body of one byte, one header ``k`` of one byte.
SIZE = MESSAGE_OVERHEAD + 3


async def test_a_topics_figures() -> None:
    hub = Hub(limits=HubLimits(buffer_bytes=10 * SIZE, buffer_messages=4))
    await hub.publish([msg("t", k="v")])  # no group yet: discarded
    named = hub.subscribe("t", "g", filter=Filter.equals(k="v"))
    anonymous = hub.subscribe("t")
    await hub.publish([msg("t", k="v"), msg("t", k="v"), msg("t", k="w")])
    await anonymous.receive(1)
    f = hub.destination("t").figures()
    assert (f.kind, f.received, f.delivered, f.acked) == ("topic", 4, 1, 0)
    assert (f.discarded, f.filtered) == (1, 0)
    assert (f.limit_bytes, f.limit_messages, f.log) == (10 * SIZE, 4, None)
    g, anon = f.groups
    assert g == GroupFigures(
        "g",
        members=1,
        queued=2,
        unacked=0,
        backlog=2,
        backlog_bytes=2 * SIZE,
        fill=0.5,
        filter=str(Filter.equals(k="v")),
    )
    assert not g.anonymous
    assert (anon.queued, anon.unacked, anon.backlog, anon.fill) == (2, 1, 3, 0.75)
    assert anon.anonymous
    assert not anon.full
    assert not f.full
    assert (f.backlog, f.backlog_bytes, f.kept, f.kept_bytes) == (5, 5 * SIZE, 0, 0)
    # The anonymous group fills up: publishers would wait.
    await hub.publish([msg("t", k="w")])
    f = hub.destination("t").figures()
    assert f.full
    assert f.groups[1].full
    # The anonymous group leaves: the copies only it held, which the named group does
    # not want, are kept for the next group; the named group outlives its member.
    anonymous.close()
    named.close()
    f = hub.destination("t").figures()
    assert (f.kept, f.kept_bytes, f.kept_fill) == (2, 2 * SIZE, 0.5)
    assert [(gf.name, gf.members, gf.backlog) for gf in f.groups] == [("g", 0, 2)]
    assert f.backlog == 4
    await hub.publish([msg("t", k="w")])  # no group's filter matches it
    assert hub.destination("t").figures().filtered == 1


async def test_a_queues_figures() -> None:
    q = Topic("q", kind="queue")
    await q.put_many([msg("q"), msg("q")], Receipt(2))
    f = q.figures()
    assert f.kind == "queue" == q.info.kind
    assert [(g.name, g.queued, g.members) for g in f.groups] == [("queue", 2, 0)]
    assert f.discarded == 0
    assert f.backlog == 2


def check_log_figures(f: DestinationFigures, partitions: int = 1) -> None:
    """Figures of a log holding 6 one-byte messages; group "g" acked 2, "~" none."""
    assert f.kind == "log"
    assert f.discarded is None
    assert f.limit_messages is None
    assert f.log is not None
    assert (f.log.first, f.log.next, f.log.partitions) == (0, 6, partitions)
    assert f.log.retained_bytes == f.kept_bytes == 6 * SIZE
    assert f.kept == 6
    assert f.received == 6
    assert not f.full
    by_name = {g.name: g for g in f.groups}
    g = by_name["g"]
    assert (g.members, g.unacked, g.backlog, g.backlog_bytes, g.fill) == (1, 1, 4, None, None)
    assert g.committed is not None
    # The group furthest behind: one of the anonymous groups (each partition has its own).
    assert f.backlog == max(g.backlog for g in f.groups)
    assert len(f.groups) == 1 + partitions
    if partitions == 1:
        assert f.backlog == 6
    assert f.backlog_bytes is None
    assert f.delivered == 3
    assert f.acked == 2


async def fill_log(log: Destination) -> None:
    """6 messages; named group "g" takes 3 and acks 2; an anonymous group takes none."""
    g = log.subscribe("g", start="earliest")
    log.subscribe(start="earliest")
    receipt = Receipt(6)
    await log.put_many([msg(log.name, k=str(i)) for i in range(6)], receipt)
    receipt.seal()
    await receipt.wait()
    deliveries = await g.receive(3)
    g.ack_many([d.tag for d in deliveries[:2]])


async def test_a_memory_logs_figures() -> None:
    log = MemoryLog("m", retain_bytes=12 * SIZE)
    await fill_log(log)
    f = log.figures()
    check_log_figures(f)
    assert f.kept_fill == 0.5
    assert f.limit_bytes == 12 * SIZE
    assert f.groups[0].committed == 2
    assert f.groups[0].queued == 3


async def test_a_durable_logs_figures(tmp_path: Path) -> None:
    async with Store.open(tmp_path, fsync="never") as store:
        log = DurableLog("d", store.segment("d"), store, retain_bytes=12 * SIZE)
        await fill_log(log)
        check_log_figures(log.figures())
        log.close()
        await trio.testing.wait_all_tasks_blocked()


async def test_a_partitioned_logs_figures_are_summed(tmp_path: Path) -> None:
    async with Store.open(tmp_path, fsync="never") as store:
        parts = [
            DurableLog("p", store.segment(f"p/{p}"), store, partition=p, retain_bytes=12 * SIZE)
            for p in range(3)
        ]
        log = PartitionedLog("p", parts, partition_key="k")
        await fill_log(log)
        f = log.figures()
        check_log_figures(f, partitions=3)
        fullest = max(p.retained_bytes for p in parts) / (12 * SIZE)
        assert f.kept_fill == fullest
        assert f.groups[0].members == 1  # the most of any partition, not the sum
        log.close()
        await trio.testing.wait_all_tasks_blocked()


class Elsewhere(Destination):
    """A destination of a kind the metrics never heard of: it keeps nothing, and says so
    through its figures."""

    name = "elsewhere"

    def check(self, message: Message) -> Refusal | None:
        return None

    async def put(self, message: Message, receipt: Receipt, index: int = 0) -> None:
        receipt.add_legs()
        receipt.settle(index, Outcome.DELIVERED)

    @property
    def info(self) -> DestinationInfo:
        return DestinationInfo(self.name, "topic")

    def subscribe(self, group: str | None = None, **options: Any) -> Subscription:
        raise ValueError("nothing to subscribe to")

    def declare_group(self, group: str) -> None:
        pass

    def close(self) -> None:
        pass

    def figures(self) -> DestinationFigures:
        group = GroupFigures("far", members=2, queued=0, unacked=1, backlog=7, fill=0.25)
        return DestinationFigures(
            "topic",
            received=11,
            delivered=5,
            acked=4,
            backlog=7,
            backlog_bytes=None,
            kept=3,
            kept_bytes=300,
            kept_fill=0.5,
            full=False,
            groups=(group,),
        )


class ElsewhereProvider:
    def open(self, name: str) -> Destination | None:
        return Elsewhere() if name == "elsewhere" else None


def samples(metrics: Metrics, destination: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for s in family.samples:
            if s.labels.get("destination") == destination:
                out[(s.name, s.labels.get("group", ""))] = s.value
    return out


async def test_metrics_read_any_destination_through_its_figures() -> None:
    hub = Hub(providers=[ElsewhereProvider()])
    metrics = Metrics()
    metrics.watch_hub(hub)
    await hub.publish([msg("elsewhere")])
    assert samples(metrics, "elsewhere") == {
        ("interchange_destination_messages_in_total", ""): 11,
        ("interchange_destination_messages_out_total", ""): 5,
        ("interchange_destination_messages_acked_total", ""): 4,
        ("interchange_destination_backlog_messages", ""): 3,
        ("interchange_destination_backlog_bytes", ""): 300,
        ("interchange_destination_buffer_fill_ratio", ""): 0.5,
        ("interchange_destination_backlog_messages", "far"): 7,
        ("interchange_destination_buffer_fill_ratio", "far"): 0.25,
        ("interchange_group_subscribers", "far"): 2,
        ("interchange_group_unacked_messages", "far"): 1,
    }


def test_figures_are_frozen() -> None:
    f = Topic("t").figures()
    with pytest.raises(AttributeError):
        f.backlog = 1  # type: ignore[misc]
    assert isinstance(f.groups, Sequence)


def test_the_operations_guide_lists_every_code_with_its_label() -> None:
    text = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    section = text.split("## Why did a publish fail? Reason codes", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \|", section, re.MULTILINE)
    assert rows == [(code.value, code.label) for code in Reason]
