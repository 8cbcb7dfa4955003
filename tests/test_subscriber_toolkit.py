"""The subscriber toolkit (``gateway.protocol.subscriber`` and ``.tags``): pumps from hub
subscriptions to a peer, peer tags (cumulative acks over a wrapping sequence space
included), ack-on-write, one window over several subscriptions, saturating demand,
what happens to unacked deliveries when a subscription closes or the peer leaves;
and the non-blocking ``take``/``watch`` every subscription kind has.

All on trio's MockClock: nothing here waits in real time.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from harness import settle
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.destination import Delivery, Destination, EndOfStream, Subscription
from gateway.core.facade import HubFacade
from gateway.core.hub import Hub
from gateway.core.memory_log import MemoryLog
from gateway.core.model import Message, Outcome, Reply
from gateway.core.receipts import Receipt
from gateway.durable.partitioned import PartitionedLog
from gateway.protocol.events import NEED_DATA, ConnectionClosed
from gateway.protocol.plugin import ConnectionInfo, ListenerSettings, ServerConnection
from gateway.protocol.session import Session
from gateway.protocol.tags import TagTable
from gateway.sdk import (
    MAX_DEMAND,
    Demand,
    Feed,
    FeedStop,
    NotACall,
    SerialSpace,
    Subscriber,
    UnknownTag,
)

pytestmark = pytest.mark.usefixtures("autojump_clock")

MICROMESSAGE2 = SerialSpace(1, 65535)


# -- helpers ------------------------------------------------------------------------------


class Peer:
    """The wire as a protocol's ``send`` callback would fill it: (tag, delivery) in order.

    ``gate``: while set and not yet set off, a write waits (a peer that does not read).
    """

    def __init__(self) -> None:
        self.got: list[tuple[int, Delivery]] = []
        self.gate: trio.Event | None = None
        #: Called after each delivery is written (a protocol's reaction mid-batch).
        self.after: Callable[[int, Delivery], None] | None = None

    async def send(self, tag: int, d: Delivery) -> None:
        if self.gate is not None:
            await self.gate.wait()
        self.got.append((tag, d))
        if self.after is not None:
            self.after(tag, d)

    @property
    def tags(self) -> list[int]:
        return [tag for tag, _ in self.got]

    @property
    def bodies(self) -> list[bytes]:
        return [d.message.body for _, d in self.got]


class Destinations:
    """A provider of ready-made destinations to the hub."""

    def __init__(self, **destinations: Destination) -> None:
        self.destinations = destinations

    def open(self, name: str) -> Destination | None:
        return self.destinations.get(name)


def partitioned(name: str, n: int) -> PartitionedLog:
    parts = [MemoryLog(name, retain_bytes=1 << 20) for _ in range(n)]
    for p, part in enumerate(parts):
        part.partition = p
    return PartitionedLog(name, parts)


@pytest.fixture
def hub() -> Hub:
    """Topics by default; ``log`` a memory log, ``plog`` a log of 3 partitions."""
    logs = Destinations(log=MemoryLog("log", retain_bytes=1 << 20), plog=partitioned("plog", 3))
    return Hub(providers=[logs])


@asynccontextmanager
async def subscriber(**options: Any) -> AsyncIterator[Subscriber]:
    """A subscriber whose pumps run until the block ends; then it is closed."""
    async with trio.open_nursery() as nursery:
        s = Subscriber(nursery, **options)
        try:
            yield s
        finally:
            s.close()
            nursery.cancel_scope.cancel()


async def publish_each(hub: Hub, destination: str, n: int) -> list[Receipt]:
    """``n`` messages ``m0``… published one by one: one receipt each."""
    return [await hub.publish([Message(destination, b"m%d" % i)]) for i in range(n)]


def settled(receipts: list[Receipt]) -> list[bool]:
    return [r.done() for r in receipts]


# -- serial arithmetic and the tag table ------------------------------------------------------


sizes = st.one_of(st.none(), st.integers(2, 70_000))


@given(sizes, st.integers(-5, 5), st.data())
def test_serial_steps_and_order(size: int | None, first: int, data: st.DataObject) -> None:
    space = SerialSpace(first, size)
    top = first + (size or 1_000_000) - 1
    a = data.draw(st.integers(first, top), "a")
    k = data.draw(st.integers(0, (size or 1_000_000) - 1), "k")
    b = space.after(a, k)
    assert b in space
    assert space.distance(a, b) == k
    assert space.precedes(a, b) == (k > 0 and (size is None or 2 * k < size))
    assert not (space.precedes(a, b) and space.precedes(b, a))
    if size is None or size % 2 or 2 * k != size:
        # Total order but for exactly half the space apart (RFC 1982: undefined).
        assert a == b or space.precedes(a, b) or space.precedes(b, a)


def test_micromessage2_wraps_from_65535_to_1() -> None:
    space = MICROMESSAGE2
    assert (space.after(65535), space.after(65534, 3), space.last) == (1, 2, 65535)
    assert space.precedes(65535, 1)
    assert space.precedes(65000, 100)
    assert not space.precedes(100, 65000)
    assert 0 not in space
    assert 65536 not in space
    assert space.max_window == 32767


@given(
    st.integers(2, 300),
    st.data(),
)
def test_a_cumulative_ack_pops_exactly_the_tags_up_to_it(size: int, data: st.DataObject) -> None:
    space = SerialSpace(1, size)
    start = data.draw(st.integers(1, size), "start")
    n = data.draw(st.integers(1, max(1, space.max_window or 1)), "n")
    table: TagTable[str] = TagTable(space, start)
    tags = [table.add("feed", hub_tag) for hub_tag in range(n)]
    assert tags == [space.after(start, i) for i in range(n)]
    settled_early = data.draw(st.sets(st.sampled_from(range(n))), "acked one by one")
    for i in settled_early:
        table.pop(tags[i])
    through = data.draw(st.integers(0, n - 1), "through")
    popped = table.pop_through(tags[through])
    expected = [i for i in range(through + 1) if i not in settled_early]
    assert [hub_tag for _, hub_tag in popped] == expected
    assert list(table) == [tags[i] for i in range(through + 1, n) if i not in settled_early]


@given(st.one_of(st.none(), st.integers(2, 300)), st.data())
def test_add_many_hands_out_what_add_would(size: int | None, data: st.DataObject) -> None:
    space = SerialSpace(1, size)
    start = data.draw(st.integers(1, size or 1000), "start")
    limit = 50 if space.max_window is None else space.max_window
    one, many = TagTable[str](space, start), TagTable[str](space, start)
    for _ in range(data.draw(st.integers(1, 4), "batches")):
        n = data.draw(st.integers(0, limit - len(one)), "n")
        hub_tags = list(range(n))
        calls = [i % 2 == 0 for i in range(n)]
        expected = [one.add("feed", h, c) for h, c in zip(hub_tags, calls, strict=True)]
        assert many.add_many("feed", hub_tags, calls) == expected
        assert list(many) == list(one)
        if len(one) and data.draw(st.booleans(), "ack"):
            newest = list(one)[-1]
            assert many.pop_through(newest) == one.pop_through(newest)


def test_a_cumulative_ack_of_a_tag_never_handed_out_is_refused() -> None:
    table: TagTable[str] = TagTable(MICROMESSAGE2, 65535)
    with pytest.raises(UnknownTag, match="never handed out delivery tag 1"):
        table.pop_through(1)
    table.add("feed", 7)
    with pytest.raises(UnknownTag, match="never handed out delivery tag 1"):
        table.pop_through(1)
    assert table.pop_through(65535) == [("feed", 7)]
    assert table.pop_through(65535) == []  # a repeated cumulative ack settles nothing


def test_demand_saturates() -> None:
    demand = Demand(MAX_DEMAND - 1)
    demand.grant(10)
    assert demand.value == MAX_DEMAND
    demand.grant(MAX_DEMAND)
    assert demand.value == MAX_DEMAND
    small = Demand(5, limit=8)
    small.grant(100)
    assert small.value == 8
    unlimited = Demand()
    unlimited.grant(MAX_DEMAND)
    assert unlimited.value is None
    with pytest.raises(ValueError, match="negative"):
        demand.grant(-1)


async def test_a_wrapping_space_needs_a_window_under_half_of_it() -> None:
    async with trio.open_nursery() as nursery:
        with pytest.raises(ValueError, match="at most 32767"):
            Subscriber(nursery, space=MICROMESSAGE2)
        with pytest.raises(ValueError, match="at most 32767"):
            Subscriber(nursery, space=MICROMESSAGE2, window=40_000)
        Subscriber(nursery, space=MICROMESSAGE2, window=32767)
        Subscriber(nursery, space=MICROMESSAGE2, ack="write")  # nothing is compared


# -- peer tags and cumulative acks ------------------------------------------------------------


async def test_cumulative_ack_across_a_wrap(hub: Hub) -> None:
    peer = Peer()
    async with subscriber(space=MICROMESSAGE2, start=65533, window=100) as s:
        s.add(hub.subscribe("t"), peer.send)
        receipts = await publish_each(hub, "t", 6)
        await settle()
        assert peer.tags == [65533, 65534, 65535, 1, 2, 3]
        assert peer.bodies == [b"m%d" % i for i in range(6)]
        assert s.ack_through(1) == 4  # 65533 … 65535, then 1
        assert settled(receipts) == [True] * 4 + [False] * 2
        assert (s.outstanding, s.busy()) == (2, True)
        with pytest.raises(UnknownTag, match="never handed out"):
            s.ack_through(4)
        s.ack(3)
        assert s.ack_through(3) == 1  # 2; 3 was acked by itself
        assert s.ack_through(3) == 0
        assert all(settled(receipts))
        assert (s.outstanding, s.busy()) == (0, False)


async def test_send_many_gets_each_batch_with_consecutive_tags_in_one_call(hub: Hub) -> None:
    batches: list[list[int]] = []
    peer = Peer()

    async def send_many(tags: list[int], deliveries: list[Delivery]) -> None:
        batches.append(tags)
        for tag, d in zip(tags, deliveries, strict=True):
            await peer.send(tag, d)

    async with subscriber(space=MICROMESSAGE2, start=65534, window=4) as s:
        s.add(hub.subscribe("t"), peer.send, send_many=send_many)
        receipts = await hub.publish([Message("t", b"m%d" % i) for i in range(6)])
        await settle()
        assert batches == [[65534, 65535, 1, 2]]  # one call for what the window allowed
        assert s.outstanding == 4
        assert s.ack_through(1) == 3
        await settle()
        assert batches[1:] == [[3, 4]]  # the two left, in the room three acks made
        assert s.ack_through(4) == 3
        assert receipts.done()
    assert peer.bodies == [b"m%d" % i for i in range(6)]


async def test_send_many_with_ack_on_write_acks_each_batch_once_written(hub: Hub) -> None:
    batches: list[list[bytes]] = []
    flushed = trio.Event()

    async def send_many(tags: list[int], deliveries: list[Delivery]) -> None:
        assert tags == [d.tag for d in deliveries]  # the hub's tags: the peer settles nothing
        batches.append([d.message.body for d in deliveries])

    async def never(tag: int, d: Delivery) -> None:
        raise AssertionError("send_many takes every batch")

    async with subscriber(ack="write") as s:
        feed = s.add(hub.subscribe("t"), never, send_many=send_many, flush=flushed.wait)
        receipts = await publish_each(hub, "t", 3)
        await settle()
        assert batches == [[b"m0", b"m1", b"m2"]]  # one call for the batch
        # Handed over, not yet written out: not acked, and owed by a drain.
        assert (any(settled(receipts)), s.busy(), feed.writing) == (False, True, 3)
        flushed.set()
        await settle()
        assert all(r.outcome is Outcome.DELIVERED for r in receipts)
        assert (s.busy(), feed.writing, len(s.tags)) == (False, 0, 0)
        more = await publish_each(hub, "t", 2)
        await settle()
        assert batches[1:] == [[b"m0", b"m1"]]
        assert all(settled(more))


async def test_send_many_with_ack_on_write_that_fails_acks_nothing(hub: Hub) -> None:
    async def send_many(tags: list[int], deliveries: list[Delivery]) -> None:
        raise trio.BrokenResourceError("the peer went away")

    receipts: list[Receipt] = []
    subscribers: list[Subscriber] = []

    async def deliver() -> None:
        async with subscriber(ack="write") as s:
            subscribers.append(s)
            s.add(hub.subscribe("t", "g"), Peer().send, send_many=send_many)
            receipts.extend(await publish_each(hub, "t", 2))
            await settle()

    with pytest.raises(ExceptionGroup) as raised:
        await deliver()
    assert raised.group_contains(trio.BrokenResourceError)
    assert (settled(receipts), subscribers[0].busy()) == ([False, False], False)
    # Closing the subscriber handed them back to the group: another member gets them.
    rest = hub.subscribe("t", "g").take()
    assert [(d.message.body, d.redelivered) for d in rest] == [(b"m0", True), (b"m1", True)]


async def test_tags_keep_wrapping_in_a_small_space(hub: Hub) -> None:
    space = SerialSpace(0, 8)
    peer = Peer()
    async with subscriber(space=space, window=3) as s:
        s.add(hub.subscribe("t"), peer.send)
        receipts = await publish_each(hub, "t", 20)
        acked = 0
        while acked < 20:
            await settle()
            assert s.outstanding <= 3
            acked += s.ack_through(peer.tags[-1])
    assert peer.tags == [i % 8 for i in range(20)]
    assert peer.bodies == [b"m%d" % i for i in range(20)]
    assert all(settled(receipts))


async def test_ack_nack_and_reply_by_peer_tag(hub: Hub, nursery: trio.Nursery) -> None:
    nursery.start_soon(hub.run)
    await settle()
    peer = Peer()
    async with subscriber() as s:
        s.add(hub.subscribe("svc", "workers"), peer.send)
        receipts = await publish_each(hub, "svc", 2)
        call = await hub.call(Message("svc", b"ping"), timeout=10)
        await settle()
        (a, _), (b, _), (c, asked) = peer.got
        assert asked.reply_by is not None
        with pytest.raises(NotACall, match=f"delivery {a} is not a call"):
            s.reply(a, Reply(b"no"))
        s.ack(a)  # still outstanding after the refused reply
        s.reply(c, Reply(b"pong"))
        s.nack(b, requeue=False, outcome=Outcome.REJECTED, reason="bad")
        with pytest.raises(UnknownTag, match=f"unknown or already settled delivery tag {a}"):
            s.ack(a)
        assert s.outstanding == 0
    assert [r.outcome for r in receipts] == [Outcome.DELIVERED, Outcome.REJECTED]
    assert call.reply is not None
    assert call.reply.body == b"pong"


async def test_a_nacked_delivery_comes_back_under_a_new_tag(hub: Hub) -> None:
    peer = Peer()
    async with subscriber() as s:
        s.add(hub.subscribe("t"), peer.send)
        (receipt,) = await publish_each(hub, "t", 1)
        await settle()
        s.nack(peer.tags[0])
        await settle()
        (first, _), (again, d) = peer.got
        assert (again != first, d.redelivered, receipt.done()) == (True, True, False)
        s.ack_many([again])
        assert receipt.outcome is Outcome.DELIVERED


# -- windows and demand -----------------------------------------------------------------------


async def test_one_window_over_three_subscriptions(hub: Hub) -> None:
    peer = Peer()
    most = 0

    def count(tag: int, d: Delivery) -> None:
        nonlocal most
        most = max(most, s.outstanding)

    peer.after = count
    receipts: list[Receipt] = []
    async with subscriber(window=4) as s:
        subs = [hub.subscribe(name, "g", max_unacked=100) for name in ("a", "b", "c")]
        for name in ("a", "b", "c"):
            receipts += await publish_each(hub, name, 5)
        for sub in subs:  # each has 5 to give: the pumps share the window
            s.add(sub, peer.send)
        await settle()
        # The window is shared fairly: every subscription got some of it.
        assert len(peer.got) == 4
        assert {d.message.destination for _, d in peer.got} == {"a", "b", "c"}
        acked = 0
        while acked < len(peer.got):
            s.ack(peer.tags[acked])
            acked += 1
            await settle()
            assert s.outstanding <= 4
    assert most == 4
    assert len(peer.got) == 15
    assert all(r.outcome is Outcome.DELIVERED for r in receipts)
    for name in ("a", "b", "c"):  # each subscription in its own order
        bodies = [d.message.body for _, d in peer.got if d.message.destination == name]
        assert bodies == [b"m%d" % i for i in range(5)]


async def test_one_window_over_logs_and_a_partitioned_log(hub: Hub) -> None:
    """take/watch of every kind under one window: a topic, a log, a partitioned log."""
    peer = Peer()
    async with subscriber(window=2) as s:
        for name in ("t", "log", "plog"):
            s.add(hub.subscribe(name), peer.send)
        for name in ("t", "log", "plog"):
            await publish_each(hub, name, 3)
        await settle()
        while len(peer.got) < 9:
            assert s.outstanding == 2
            s.ack_through(peer.tags[-1])
            await settle()
    assert sorted(peer.bodies) == sorted([b"m%d" % i for i in range(3)] * 3)


async def test_feed_demand_saturates_and_bounds_deliveries(hub: Hub) -> None:
    peer = Peer()
    async with subscriber() as s:
        feed = s.add(hub.subscribe("t"), peer.send, credit=2)
        await publish_each(hub, "t", 5)
        await settle()
        assert (len(peer.got), feed.demand.value) == (2, 0)
        feed.grant(MAX_DEMAND)
        await settle()
        assert (len(peer.got), feed.demand.value) == (5, MAX_DEMAND - 3)
        feed.grant(MAX_DEMAND)
        assert feed.demand.value == MAX_DEMAND


async def test_connection_demand_spans_its_feeds(hub: Hub) -> None:
    peer = Peer()
    async with subscriber(credit=1) as s:
        s.add(hub.subscribe("a"), peer.send)
        s.add(hub.subscribe("b"), peer.send)
        await publish_each(hub, "a", 2)
        await publish_each(hub, "b", 2)
        await settle()
        assert len(peer.got) == 1
        s.grant(2)
        await settle()
        assert len(peer.got) == 3
        assert s.demand.value == 0


# -- ack-on-write -------------------------------------------------------------------------


async def test_ack_on_write_acks_once_written(hub: Hub) -> None:
    peer = Peer()
    flushed = trio.Event()
    async with subscriber(ack="write") as s:
        feed = s.add(hub.subscribe("t"), peer.send, flush=flushed.wait)
        receipts = await publish_each(hub, "t", 3)
        await settle()
        # Handed to the peer, not yet written out: not acked, and owed by the drain.
        assert (len(peer.got), any(settled(receipts)), s.busy()) == (3, False, True)
        assert feed.writing == 3
        flushed.set()
        await settle()
        assert all(r.outcome is Outcome.DELIVERED for r in receipts)
        assert (s.busy(), feed.writing) == (False, 0)
        with pytest.raises(UnknownTag):
            s.ack(peer.tags[0])  # nothing for the peer to settle


async def test_ack_on_write_stopped_mid_batch_gives_the_rest_back(hub: Hub) -> None:
    peer = Peer()
    async with subscriber(ack="write") as s:
        sub = hub.subscribe("t", "g")
        receipts = await publish_each(hub, "t", 3)
        feed = s.add(sub, peer.send)  # takes the three as one batch
        peer.after = lambda tag, d: feed.stop()
        await settle()
        assert settled(receipts) == [True, False, False]
        other = hub.subscribe("t", "g")
        rest = other.take()
        assert [(d.message.body, d.redelivered) for d in rest] == [(b"m1", True), (b"m2", True)]


# -- closing, draining, leaving -----------------------------------------------------------


async def test_a_subscription_closed_while_deliveries_are_unacked(hub: Hub) -> None:
    peer = Peer()
    async with subscriber() as s:
        feed = s.add(hub.subscribe("t", "g"), peer.send)
        receipts = await publish_each(hub, "t", 3)
        await settle()
        assert (s.outstanding, feed.outstanding) == (3, 3)
        feed.close()
        # The peer's tags are forgotten and the deliveries went back to the group.
        assert (s.outstanding, s.busy(), s.pending(), feed.done) == (0, False, False, True)
        with pytest.raises(UnknownTag):
            s.ack(peer.tags[0])
        other = hub.subscribe("t", "g")
        back = other.take()
        assert [(d.message.body, d.redelivered) for d in back] == [
            (b"m0", True),
            (b"m1", True),
            (b"m2", True),
        ]
        other.ack_many([d.tag for d in back])
    assert all(r.outcome is Outcome.DELIVERED for r in receipts)


async def test_a_subscription_closed_under_its_feed_stops_the_pump(hub: Hub) -> None:
    peer = Peer()
    stops: list[FeedStop] = []

    async def ended(feed: Feed, why: FeedStop) -> None:
        stops.append(why)

    async with subscriber() as s:
        sub = hub.subscribe("t", "g")
        feed = s.add(sub, peer.send, ended=ended)
        await publish_each(hub, "t", 2)
        await settle()
        sub.close()  # the hub side closes, not through the feed
        await settle()
        assert (stops, feed.stopped, s.outstanding, s.pending()) == (
            [FeedStop.CLOSED],
            FeedStop.CLOSED,
            0,
            False,
        )
        with pytest.raises(UnknownTag):
            s.ack(peer.tags[0])


async def test_redelivery_after_a_peer_leaves(hub: Hub) -> None:
    first, second = Peer(), Peer()
    async with subscriber() as gone:
        gone.add(hub.subscribe("jobs", "workers"), first.send)
        receipts = await publish_each(hub, "jobs", 3)
        await settle()
        gone.ack(first.tags[0])
        async with subscriber() as s:
            s.add(hub.subscribe("jobs", "workers"), second.send)
            await settle()
            assert second.got == []  # the first member holds them
            gone.close()  # its peer left without acking the rest
            await settle()
            assert [(d.message.body, d.redelivered) for _, d in second.got] == [
                (b"m1", True),
                (b"m2", True),
            ]
            s.ack_many(second.tags)
    assert all(r.outcome is Outcome.DELIVERED for r in receipts)


async def test_drain_stops_mid_batch_and_waits_for_what_was_sent(hub: Hub) -> None:
    peer = Peer()
    async with subscriber() as s:
        sub = hub.subscribe("t", "g")
        receipts = await publish_each(hub, "t", 3)
        feed = s.add(sub, peer.send)  # takes the three as one batch
        peer.after = lambda tag, d: s.drain()
        await settle()
        # One was sent before the drain; the two taken with it went back at once.
        assert (peer.bodies, feed.stopped, s.busy(), s.pending()) == (
            [b"m0"],
            FeedStop.STOPPED,
            True,
            True,
        )
        other = hub.subscribe("t", "g")
        assert [d.message.body for d in other.take()] == [b"m1", b"m2"]
        s.ack(peer.tags[0])  # the peer still settles what it got
        assert (s.busy(), s.pending(), feed.done, settled(receipts)[0]) == (
            False,
            False,
            True,
            True,
        )


async def test_a_finite_read_ends_and_is_still_settled(hub: Hub) -> None:
    await publish_each(hub, "log", 3)
    peer = Peer()
    stops: list[tuple[FeedStop, int]] = []

    async def ended(feed: Feed, why: FeedStop) -> None:
        stops.append((why, len(peer.got)))

    async with subscriber() as s:
        feed = s.add(hub.subscribe("log", start="earliest", end="latest"), peer.send, ended=ended)
        await settle()
        assert stops == [(FeedStop.END, 3)]
        assert (feed.done, s.pending()) == (False, True)  # the peer owes its acks
        s.ack_through(peer.tags[-1])
        assert (feed.done, s.pending()) == (True, False)
        assert feed.sub.committed is not None
        assert feed.sub.committed.offset == 3


# -- take and watch on every kind -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["t", "log", "plog"], ids=["topic", "log", "partitioned"])
async def test_take_and_watch(hub: Hub, nursery: trio.Nursery, name: str) -> None:
    sub: Subscription = hub.subscribe(name, credit=1)
    lot = trio.lowlevel.ParkingLot()
    sub.watch(lot)
    woken = 0

    async def watcher() -> None:
        nonlocal woken
        while True:
            await lot.park()
            woken += 1

    nursery.start_soon(watcher)
    await settle()
    assert sub.take() == []
    await hub.publish([Message(name, b"a"), Message(name, b"b")])
    await settle()
    assert woken >= 1
    got = sub.take()
    assert [d.message.body for d in got] == [b"a"]
    assert sub.take() == []  # out of credit, though b is there
    before = woken
    sub.grant(1)
    await settle()
    assert woken > before
    assert sub.take(0) == []
    assert [d.message.body for d in sub.take()] == [b"b"]
    before = woken
    sub.close()
    await settle()
    assert woken > before
    with pytest.raises(trio.ClosedResourceError):
        sub.take()


class Tally:
    def __init__(self) -> None:
        self.n = 0

    def inc(self, amount: float = 1) -> None:
        self.n += int(amount)


@pytest.mark.parametrize("name", ["t", "log", "plog"], ids=["topic", "log", "partitioned"])
async def test_a_counting_facade_counts_each_delivery_once(hub: Hub, name: str) -> None:
    """A listener's facade counts what its subscriptions hand out, by receive or take."""
    sent = Tally()
    facade = HubFacade(hub, sent=sent)
    sub = facade.subscribe(name, "g")
    await publish_each(hub, name, 4)
    assert len(sub.take(1)) == 1
    assert len(await sub.receive(1)) == 1
    peer = Peer()
    async with subscriber() as s:
        s.add(sub, peer.send)
        await settle()
    assert (len(peer.got), sent.n) == (2, 4)


async def test_take_ends_a_finite_read(hub: Hub) -> None:
    await publish_each(hub, "log", 1)
    sub = hub.subscribe("log", start="earliest", end="latest")
    assert len(sub.take()) == 1
    with pytest.raises(EndOfStream):
        sub.take()


# -- a Session that has a subscriber ----------------------------------------------------------


class _Quiet:
    """A codec for a peer that never sends a whole event."""

    held_bytes = 0

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def next_event(self) -> Any:
        return NEED_DATA


class _Delivering(Session):
    """Delivers ``destination`` to its peer as lines of bodies."""

    def __init__(self, stream: trio.abc.Stream, hub: Hub, destination: str) -> None:
        super().__init__(stream, _Quiet(), log=logging.getLogger("test"))
        self.hub = hub
        self.destination = destination
        self.peer = Peer()
        self.feed: Feed | None = None

    def started(self) -> None:
        self.subscriber = Subscriber(self.nursery, progress=self.progress)
        sub = self.hub.subscribe(self.destination, "g")
        self.feed = self.subscriber.add(sub, self.peer.send)


async def test_a_session_counts_its_subscriber_and_closes_it(hub: Hub) -> None:
    near, far = trio.testing.memory_stream_pair()
    session = _Delivering(far, hub, "t")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        await settle()
        # An open subscription keeps the connection, though nothing is owed.
        assert (session.pending(), session.busy()) == (True, False)
        receipts = await publish_each(hub, "t", 2)
        await settle()
        assert (session.pending(), session.busy()) == (True, True)
        session.draining()  # the gateway drains: no more deliveries, acks still count
        assert session.feed is not None
        assert session.feed.stopped is FeedStop.STOPPED
        assert session.busy()
        assert session.subscriber is not None
        session.subscriber.ack(session.peer.tags[0])
        await near.aclose()  # the peer leaves with one delivery unacked
    # run() ended and closed the subscriber: the unacked delivery is back in the group.
    other = hub.subscribe("t", "g")
    assert [(d.message.body, d.redelivered) for d in other.take()] == [(b"m1", True)]
    assert settled(receipts) == [True, False]


# -- the example in docs/plugins.md ---------------------------------------------------------------

PLUGINS_MD = Path(__file__).resolve().parent.parent / "docs" / "plugins.md"


def documented_example() -> str:
    """The Python block of plugins.md's section on the subscriber toolkit."""
    text = PLUGINS_MD.read_text(encoding="utf-8")
    section = text.split("### Delivering to subscribers", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 1
    return str(blocks[0])


@dataclass(frozen=True)
class Line:
    data: bytes


class LineCodec:
    """Each line an event with its bytes in ``data``, as the example says."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.eof = False

    @property
    def held_bytes(self) -> int:
        return len(self.buf)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            self.buf += data
        else:
            self.eof = True

    def next_event(self) -> Any:
        i = self.buf.find(b"\n")
        if i < 0:
            return ConnectionClosed() if self.eof else NEED_DATA
        line = bytes(self.buf[:i])
        del self.buf[: i + 1]
        return Line(line)


async def read_lines(stream: trio.abc.Stream, n: int) -> list[bytes]:
    data = b""
    while data.count(b"\n") < n:
        data += await stream.receive_some()
    return data.splitlines()


def test_the_docs_no_longer_wire_conn_pending() -> None:
    assert "conn.pending" not in PLUGINS_MD.read_text(encoding="utf-8")


async def test_the_documented_subscriber_session_runs(hub: Hub, nursery: trio.Nursery) -> None:
    namespace: dict[str, Any] = {"LineCodec": LineCodec}
    exec(compile(documented_example(), str(PLUGINS_MD), "exec"), namespace)
    near, far = trio.testing.memory_stream_pair()
    listener = ListenerSettings("l", "line", "127.0.0.1:0", "d", options={})
    info = ConnectionInfo("line", "l", "peer")
    conn = ServerConnection(far, info, listener, HubFacade(hub), trio.Event())
    session = namespace["SubscriberSession"](conn)
    done = trio.Event()

    async def serve() -> None:
        await session.serve()
        done.set()

    nursery.start_soon(serve)
    await near.send_all(b"sub jobs\n")
    await settle()
    receipts = await publish_each(hub, "jobs", 3)
    assert await read_lines(near, 3) == [b"msg 1 m0", b"msg 2 m1", b"msg 3 m2"]
    await near.send_all(b"ack 2\n")
    await settle()
    assert settled(receipts) == [True, True, False]
    assert session.pending()  # its subscription is open
    await near.send_all(b"ack 3\nack 9\n")  # 9 was never sent: a protocol error
    await done.wait()
    assert all(settled(receipts))
