"""Log destinations, tested through the public Destination/Subscription interface only.

Every test takes ``make_log``, a factory parametrized by implementation: the in-memory
:class:`~gateway.core.memory_log.MemoryLog` and the durable :class:`~gateway.durable.log.DurableLog`
(each log in a segment store of its own, in the test's tmp dir; once with its cache of
recent messages, once reading every message back from the segment), which must pass the
same suite. Messages are published as the hub does (``put_many`` into a fresh receipt, then
``seal``). The last test drives a log with random operations (hypothesis) against a small
reference model of each group's delivered, acked and pending offsets.
"""

from __future__ import annotations

import contextlib
import functools
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from harness import receive_now, settle, start
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from gateway.core.destination import Delivery, Destination, EndOfStream, Subscription
from gateway.core.filters import Filter
from gateway.core.log import PositionRun
from gateway.core.memory_log import MemoryLog
from gateway.core.model import MESSAGE_OVERHEAD, Message, Outcome, Position, Reply
from gateway.core.receipts import Receipt
from gateway.durable.log import DurableLog
from gateway.store import Store

# -- the implementations under test -------------------------------------------------


#: ``(name, *, retain_bytes, kind="topic", overflow="block", element_size=None) -> Destination``
MakeLog = Callable[..., Destination]


@contextlib.contextmanager
def memory_logs(directory: Path) -> Iterator[MakeLog]:
    yield MemoryLog


@contextlib.contextmanager
def durable_logs(directory: Path, cache_bytes: int | None = None) -> Iterator[MakeLog]:
    """Each log in a store of its own under ``directory``, with ``fsync="never"``: a
    record is durable once written, so legs settle inside ``put_many`` as a memory
    log's do (the interval policy's wait is tested in tests/store/test_durable_log.py).

    The stores are not opened with ``Store.open``: a log is made synchronously, in the
    trio thread or (the random walk, a sync test that runs trio itself) a worker
    thread, where nothing can be awaited and pytest-trio gives sync tests no async
    fixture. Under ``never`` nothing here needs the store's committer."""
    stores: list[Store] = []

    def make(name: str, **options: Any) -> Destination:
        store = Store(directory / f"store{len(stores)}", fsync="never")
        store._recover()  # what Store.open does first: the directories, here empty
        stores.append(store)
        segment = store.segment(name)
        assert segment is not None
        return DurableLog(name, segment, store, cache_bytes=cache_bytes, **options)

    try:
        yield make
    finally:
        for store in stores:
            for name in store.names():
                segment = store.segment(name)
                assert segment is not None
                for chunk in segment.chunks:
                    chunk.close()


IMPLEMENTATIONS: dict[str, Callable[[Path], contextlib.AbstractContextManager[MakeLog]]] = {
    "memory": memory_logs,
    "durable": durable_logs,
    # Nothing cached: every delivery is read back from the segment.
    "durable-from-disk": functools.partial(durable_logs, cache_bytes=1),
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def make_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MakeLog]:
    """A factory of log destinations of one implementation."""
    with IMPLEMENTATIONS[request.param](tmp_path) as make:
        yield make


# -- helpers ------------------------------------------------------------------------

SIZE = 300  #: Message.size of msg(n)
BIG = 10**9


def msg(n: int, size: int = SIZE, **headers: str) -> Message:
    """Message number ``n``, padded so that ``Message.size == size``."""
    extra = sum(len(k) + len(v) for k, v in headers.items())
    body = b"m%d." % n
    return Message("t", body.ljust(size - MESSAGE_OVERHEAD - extra, b"."), headers)


def msgs(ns: Sequence[int] | range, size: int = SIZE) -> list[Message]:
    return [msg(n, size) for n in ns]


def number(d: Delivery) -> int:
    return int(d.message.body.split(b".")[0][1:])


def numbers(deliveries: Sequence[Delivery]) -> list[int]:
    return [number(d) for d in deliveries]


def offsets(deliveries: Sequence[Delivery]) -> list[int]:
    return [d.position.offset if d.position else -1 for d in deliveries]


def flagged(deliveries: Sequence[Delivery]) -> list[tuple[int, bool]]:
    """(offset, redelivered) of each delivery."""
    return [(o, d.redelivered) for o, d in zip(offsets(deliveries), deliveries, strict=True)]


def committed_offset(sub: Subscription) -> int:
    return sub.committed.offset if sub.committed else -1


def tags(deliveries: Sequence[Delivery]) -> list[int]:
    return [d.tag for d in deliveries]


async def publish(dest: Destination, messages: Sequence[Message]) -> Receipt:
    receipt = Receipt(len(messages))
    await dest.put_many(messages, receipt)
    receipt.seal()
    return receipt


def stored_at(receipt: Receipt) -> list[int | None]:
    return [r.position.offset if r.position else None for r in receipt.results()]


def stats_of(dest: Destination, *keys: str) -> Any:
    """``stats()``, or the values at ``keys`` as a tuple."""
    stats = dest.stats()
    return tuple(stats[k] for k in keys) if keys else stats


def group_stats(dest: Destination, group: str) -> dict[str, int]:
    groups: dict[str, dict[str, int]] = stats_of(dest)["groups"]
    return groups[group]


async def read_all(sub: Subscription) -> list[Delivery]:
    """Everything available now, acked."""
    got = await receive_now(sub)
    sub.ack_many(tags(got))
    return got


# -- appending and positions --------------------------------------------------------


async def test_offsets_and_positions_in_receipts_and_deliveries(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    info = log.info
    assert (info.name, info.kind, info.positions, info.queue_group) == ("t", "log", True, None)
    first = await publish(log, msgs(range(3)))
    second = await publish(log, msgs(range(3, 5)))
    # A log's legs settle when stored, before anyone reads.
    assert (first.outcome, second.outcome) == (Outcome.DELIVERED, Outcome.DELIVERED)
    assert (stored_at(first), stored_at(second)) == ([0, 1, 2], [3, 4])
    assert second.results()[1].position == Position(4)
    sub = log.subscribe(start="earliest")
    got = await receive_now(sub)
    assert numbers(got) == offsets(got) == [0, 1, 2, 3, 4]
    assert [d.position for d in got] == [Position(i) for i in range(5)]
    assert flagged(got) == [(i, False) for i in range(5)]
    assert tags(got) == [1, 2, 3, 4, 5]
    stats = stats_of(log, "kind", "first", "next", "messages", "bytes")
    assert stats == ("log", 0, 5, 5, 5 * SIZE)
    receipt = Receipt(1)
    await log.put(msg(5), receipt)
    receipt.seal()
    assert receipt.result(0).position == Position(5)


def test_a_position_run_is_the_positions_it_stands_for() -> None:
    run = PositionRun(7, 4, partition=2)
    listed = [Position(o, 2) for o in range(7, 11)]
    assert (len(run), list(run), run) == (4, listed, listed)
    assert (run[0], run[-1], run[1:3]) == (listed[0], listed[-1], listed[1:3])
    assert run[::2] == listed[::2]
    assert run[3:1] == []
    with pytest.raises(IndexError):
        run[4]


async def test_a_subscriber_that_reads_no_positions_gets_none(make_log: MakeLog) -> None:
    """``positions=False``: the same deliveries, in the same order, without a Position,
    first-hand and redelivered; other subscribers still get theirs."""
    log = make_log("t", retain_bytes=BIG)
    await publish(log, msgs(range(4)))
    bare = log.subscribe("g", start="earliest", positions=False)
    full = log.subscribe(start="earliest")
    got = await receive_now(bare)
    assert [d.message.body for d in got] == [msg(i).body for i in range(4)]
    assert [d.position for d in got] == [None] * 4
    bare.nack(got[1].tag)  # back to the group: redelivered, still without a position
    (again,) = await receive_now(bare)
    assert (again.message.body, again.redelivered, again.position) == (msg(1).body, True, None)
    assert [d.position for d in await receive_now(full)] == [Position(i) for i in range(4)]


async def test_refused_messages_take_no_offset(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=1000, element_size=4)
    ok = Message("t", b"abcd")
    assert log.check(ok) is None
    assert log.check(Message("t", b"abc")) is not None
    receipt = await publish(log, [ok, Message("t", b"toolong"), ok])
    assert receipt.outcome == Outcome.REJECTED
    results = receipt.results()
    assert [r.outcome for r in results] == [Outcome.DELIVERED, Outcome.REJECTED, Outcome.DELIVERED]
    assert stored_at(receipt) == [0, None, 1]
    # Larger than all the log may retain.
    big = make_log("big", retain_bytes=500)
    receipt = await publish(big, [msg(0, 501), msg(1, 500)])
    assert [r.outcome for r in receipt.results()] == [Outcome.REJECTED, Outcome.DELIVERED]
    assert "exceeds" in receipt.results()[0].reason
    assert stored_at(receipt) == [None, 0]


async def test_many_publishes_through_a_small_log_keep_their_offsets(make_log: MakeLog) -> None:
    """Eviction and reuse of storage over time never shifts an offset."""
    log = make_log("t", retain_bytes=10 * SIZE)
    sub = log.subscribe("g")
    for i in range(0, 600, 3):
        receipt = await publish(log, msgs(range(i, i + 3)))
        assert stored_at(receipt) == [i, i + 1, i + 2]
        got = await read_all(sub)
        assert numbers(got) == offsets(got) == [i, i + 1, i + 2]
    assert sub.committed == Position(600)
    first, tail, nbytes = stats_of(log, "first", "next", "bytes")
    assert (tail, nbytes) == (600, 10 * SIZE)
    got = await receive_now(log.subscribe(start="earliest"))
    assert numbers(got) == offsets(got) == list(range(first, 600)) == list(range(590, 600))


async def test_a_large_batch_read_in_chunks_acked_in_reverse(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    sub = log.subscribe("g", start="earliest", max_unacked=20_000)
    await publish(log, [Message("t", b"%d" % i) for i in range(10_000)])
    got: list[Delivery] = []
    for chunk in (1, 7, 500, 3000, None):
        got += await receive_now(sub, chunk)
    assert offsets(got) == list(range(10_000))
    assert [int(d.message.body) for d in got] == list(range(10_000))
    sub.ack_many(reversed(tags(got)))
    assert (sub.committed, sub.unacked) == (Position(10_000), 0)


# -- where a read starts and ends ---------------------------------------------------


async def test_start_earliest_latest_offset_and_clamping(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=3 * SIZE)
    await publish(log, msgs(range(5)))  # nobody needs them: 0 and 1 were pushed out
    assert stats_of(log, "first", "next") == (2, 5)
    earliest = log.subscribe(start="earliest")
    latest = log.subscribe(start="latest")
    default = log.subscribe()
    at3 = log.subscribe(start=3)
    at_pos = log.subscribe(start=Position(4))
    clamped = log.subscribe(start=0)
    at_tail = log.subscribe(start=5)
    with pytest.raises(ValueError, match="tail"):
        log.subscribe(start=6)
    with pytest.raises(ValueError, match="tail"):
        log.subscribe("named", start=Position(7))
    assert "named" not in stats_of(log)["groups"]
    assert clamped.committed == Position(2)
    assert numbers(await read_all(earliest)) == [2, 3, 4]
    assert numbers(await read_all(at3)) == [3, 4]
    assert numbers(await read_all(at_pos)) == [4]
    assert numbers(await read_all(clamped)) == [2, 3, 4]
    for sub in (latest, default, at_tail):
        assert await receive_now(sub) == []
    await publish(log, [msg(5)])  # every reader is past 2: it may go
    for sub in (latest, default, at_tail, earliest):
        assert offsets(await receive_now(sub)) == [5]


async def test_end_as_offset_position_and_latest(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    await publish(log, msgs(range(5)))
    by_int = log.subscribe(start="earliest", end=3)
    by_pos = log.subscribe(start=1, end=Position(2))
    by_latest = log.subscribe(start="earliest", end="latest")
    await publish(log, msgs(range(5, 7)))
    got = await receive_now(by_int)
    assert offsets(got) == [0, 1, 2]
    for _ in range(3):  # every call from then on
        with pytest.raises(EndOfStream):
            await by_int.receive()
    by_int.ack_many(tags(got))  # still acked after the end
    assert by_int.committed == Position(3)
    assert offsets(await receive_now(by_pos)) == [1]
    with pytest.raises(EndOfStream):
        await by_pos.receive()
    assert offsets(await receive_now(by_latest)) == [0, 1, 2, 3, 4]
    with pytest.raises(EndOfStream):
        await by_latest.receive()
    # An end below where the group already is: nothing to read.
    with pytest.raises(EndOfStream):
        await log.subscribe(end=2).receive()
    # A filtered read ends over the messages it skips.
    await publish(log, [msg(7, k="x"), msg(8, k="y")])
    only_x = log.subscribe(start=7, end="latest", filter=Filter.equals(k="x"))
    assert offsets(await receive_now(only_x)) == [7]
    with pytest.raises(EndOfStream):
        await only_x.receive()


async def test_end_past_the_tail_waits_for_appends(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    await publish(log, msgs(range(2)))
    sub = log.subscribe(start="earliest", end=4, credit=1)
    assert offsets(await receive_now(sub)) == [0]
    assert await receive_now(sub) == []  # no credit: not the end yet
    sub.grant(5)
    assert offsets(await receive_now(sub)) == [1]
    assert await receive_now(sub) == []  # waits for offsets 2 and 3
    await publish(log, msgs(range(2, 6)))
    assert offsets(await receive_now(sub)) == [2, 3]
    with pytest.raises(EndOfStream):
        await sub.receive()


async def test_unacked_redelivery_below_the_end_is_read_before_the_end(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    await publish(log, msgs(range(4)))
    first = log.subscribe("g", start="earliest")
    got = await receive_now(first, 2)
    first.close()
    finite = log.subscribe("g", end=1)
    again = await receive_now(finite)
    assert flagged(again) == [(0, True)]
    with pytest.raises(EndOfStream):
        await finite.receive()
    assert got[0].tag == again[0].tag == 1


# -- groups -------------------------------------------------------------------------


async def test_named_group_resumes_at_its_committed_position(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    await publish(log, msgs(range(5)))
    sub = log.subscribe("g", start="earliest")
    got = await receive_now(sub)
    assert offsets(got) == [0, 1, 2, 3, 4]
    sub.ack(got[0].tag)
    sub.ack(got[3].tag)  # out of order: committed stays at 1 until 1 is acked
    sub.ack(got[1].tag)
    assert sub.committed == Position(2)
    sub.close()
    sub.close()  # idempotent
    with pytest.raises(KeyError):
        sub.ack(got[2].tag)
    await publish(log, msgs(range(5, 7)))
    expected = {"committed": 2, "next": 5, "unacked": 0, "members": 0, "dropped": 0}
    assert group_stats(log, "g") == {**expected, "rejected": 0}
    with log.subscribe("g", start="latest") as back:  # start is ignored: the group exists
        assert back.committed == Position(2)
        again = await receive_now(back)
        assert flagged(again) == [(2, True), (4, True), (5, False), (6, False)]
        back.ack_many(tags(again))
        assert back.committed == Position(7)
    with pytest.raises(trio.ClosedResourceError):
        await back.receive()
    assert group_stats(log, "g")["members"] == 0


async def test_groups_each_get_every_message(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    log.declare_group("a")
    b = log.subscribe("b")
    await publish(log, msgs(range(3)))
    a = log.subscribe("a")  # declared at "earliest": it collected from offset 0
    got_a = await receive_now(a)
    got_b = await receive_now(b)
    assert offsets(got_a) == offsets(got_b) == [0, 1, 2]
    a.ack_many(tags(got_a))
    assert (a.committed, b.committed) == (Position(3), Position(0))
    assert (a.group, b.group) == ("a", "b")
    # Anonymous subscribers: groups of one, gone when they close.
    x, y = log.subscribe(start="earliest"), log.subscribe(start="earliest")
    assert x.group is None
    assert offsets(await receive_now(x)) == offsets(await receive_now(y)) == [0, 1, 2]
    assert len(stats_of(log)["groups"]) == 4
    x.close()
    y.close()
    assert list(stats_of(log)["groups"]) == ["a", "b"]


async def test_competing_members_get_distinct_offsets(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    m1 = log.subscribe("g")
    m2 = log.subscribe("g", start="earliest")  # joins: start is ignored
    await publish(log, msgs(range(10)))
    got1 = await receive_now(m1, 3)
    got2 = await receive_now(m2, 4)
    got1 += await receive_now(m1, 1)
    assert (offsets(got1), offsets(got2)) == ([0, 1, 2, 7], [3, 4, 5, 6])
    m1.close()  # its unacked go to the other member, first and flagged
    rest = await receive_now(m2)
    assert flagged(rest) == [(0, True), (1, True), (2, True), (7, True), (8, False), (9, False)]
    assert m2.unacked == 10


async def test_queue_kind_has_one_group_from_the_start(make_log: MakeLog) -> None:
    log = make_log("q", retain_bytes=BIG, kind="queue")
    assert log.info.queue_group == "queue"
    await publish(log, msgs(range(4)))
    a = log.subscribe("whatever", start="latest")
    b = log.subscribe()
    assert a.group == b.group == "queue"
    assert offsets(await receive_now(a, 3)) == [0, 1, 2]  # held from offset 0
    assert offsets(await receive_now(b)) == [3]
    assert list(stats_of(log)["groups"]) == ["queue"]


async def test_credit_and_max_unacked(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    await publish(log, msgs(range(10)))
    sub = log.subscribe(start="earliest", credit=2)
    assert (offsets(await receive_now(sub)), sub.credit) == ([0, 1], 0)
    assert await receive_now(sub) == []
    sub.grant(3)
    assert (offsets(await receive_now(sub, 2)), sub.credit) == ([2, 3], 1)
    window = log.subscribe(start="earliest", max_unacked=3)
    got = await receive_now(window)
    assert (offsets(got), window.unacked) == ([0, 1, 2], 3)
    assert await receive_now(window) == []
    window.ack(got[1].tag)
    assert offsets(await receive_now(window)) == [3]
    assert window.credit is None


async def test_max_unacked_bytes(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    await publish(log, [msg(0), msg(1), msg(2), msg(3, 1000), msg(4)])
    sub = log.subscribe(start="earliest", max_unacked_bytes=700)
    got = await receive_now(sub)
    assert offsets(got) == [0, 1]
    assert await receive_now(sub) == []
    sub.ack(got[0].tag)
    got = await receive_now(sub)
    assert offsets(got) == [2]
    sub.ack_many([2, 3])
    big = await receive_now(sub)  # larger than the window: alone, when nothing is unacked
    assert offsets(big) == [3]
    assert await receive_now(sub) == []
    sub.nack(big[0].tag)
    assert offsets(await receive_now(sub)) == [3]


async def test_filters_skip_without_cost_and_belong_to_the_group(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    wanted = Filter.equals(k="x")
    sub = log.subscribe("f", credit=2, filter=wanted)
    assert sub.filter == wanted
    kinds = ["y", "x", "y", "y", "x", "x", "y"]
    await publish(log, [msg(i, k=k) for i, k in enumerate(kinds)])
    got = await receive_now(sub)
    assert (offsets(got), sub.credit) == ([1, 4], 0)
    assert sub.committed == Position(1)  # 0 was skipped; 1 is unacked
    sub.ack_many(tags(got))
    assert sub.committed == Position(5)  # 2 and 3 were skipped
    sub.grant(5)
    got = await receive_now(sub)
    assert offsets(got) == [5]
    sub.ack(got[0].tag)
    assert sub.committed == Position(7)  # 6 skipped too
    log.subscribe("f", filter=Filter.equals(k="x")).close()
    with pytest.raises(ValueError, match="filter"):
        log.subscribe("f", filter=Filter.equals(k="y"))
    with pytest.raises(ValueError, match="filter"):
        log.subscribe("f")
    log.subscribe("plain")
    with pytest.raises(ValueError, match="filter"):
        log.subscribe("plain", filter=wanted)


# -- acks and nacks -------------------------------------------------------------------


async def test_ack_many_with_a_bad_tag_settles_the_ones_before(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    await publish(log, msgs(range(3)))
    sub = log.subscribe(start="earliest")
    await receive_now(sub)
    with pytest.raises(KeyError):
        sub.ack_many([1, 99, 2])
    assert (sub.unacked, sub.committed) == (2, Position(1))
    with pytest.raises(KeyError):
        sub.ack(1)
    with pytest.raises(KeyError):
        sub.nack(1)
    sub.ack_many([3, 2])
    assert sub.committed == Position(3)


async def test_acks_of_consecutive_tags_settle_like_one_by_one(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    await publish(log, msgs(range(8)))
    sub = log.subscribe("g", start="earliest", max_unacked_bytes=4 * SIZE)
    assert tags(await receive_now(sub)) == [1, 2, 3, 4]
    sub.ack_many(range(2, 4))  # the middle of the batch: its bytes make room for two
    more = await receive_now(sub)
    assert (offsets(more), tags(more)) == ([4, 5], [5, 6])
    assert (sub.unacked, sub.committed) == (4, Position(0))
    with pytest.raises(KeyError):
        sub.ack_many([1, 2])  # 2 is settled: 1 is acked before the error
    assert (sub.unacked, sub.committed) == (3, Position(3))
    sub.nack(5)
    sub.ack_many([4, 6])
    assert (sub.unacked, sub.committed) == (0, Position(4))
    again = await receive_now(sub)
    assert (flagged(again), tags(again)) == ([(4, True), (6, False), (7, False)], [7, 8, 9])
    sub.ack_many(range(7, 10))  # consecutive tags, not consecutive offsets
    assert (sub.unacked, sub.committed) == (0, Position(8))
    with pytest.raises(KeyError):
        sub.ack_many(range(1, 3))


async def test_nack_requeue_and_reject(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=BIG)
    receipt = await publish(log, msgs(range(3)))
    sub = log.subscribe("g", start="earliest")
    got = await receive_now(sub)
    sub.nack(got[1].tag)
    sub.nack(got[0].tag, requeue=False, outcome=Outcome.REJECTED, reason="bad")
    again = await receive_now(sub)
    assert (flagged(again), tags(again)) == ([(1, True)], [4])
    assert sub.committed == Position(1)
    sub.ack_many([4, 3])
    assert sub.committed == Position(3)
    assert group_stats(log, "g")["rejected"] == 1
    assert receipt.outcome == Outcome.DELIVERED  # settled when stored; untouched
    with pytest.raises(ValueError):
        sub.reply(again[0].tag, Reply())  # logs take no calls


# -- retention --------------------------------------------------------------------------


async def test_block_makes_the_publisher_wait_until_a_group_acks(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=3 * SIZE)
    sub = log.subscribe("g")
    await publish(log, msgs(range(3)))
    async with trio.open_nursery() as nursery:
        task = start(nursery, publish, log, msgs(range(3, 6)))
        await settle()
        assert not task.done
        got = await receive_now(sub)
        assert offsets(got) == [0, 1, 2]
        sub.ack(got[1].tag)  # 0 is not acked: nothing may go yet
        await settle()
        assert (task.done, stats_of(log, "next")) == (False, (3,))
        sub.ack(got[0].tag)  # 0 and 1 may go: two of the three waiting fit
        await settle()
        assert not task.done
        assert stats_of(log, "first", "next") == (2, 5)
        assert offsets(await receive_now(sub)) == [3, 4]
        sub.ack(got[2].tag)
        await settle()
        assert (task.done, task.error) == (True, None)
    assert stored_at(task.result) == [3, 4, 5]
    assert stats_of(log, "first", "next") == (3, 6)
    assert offsets(await receive_now(sub)) == [5]


async def test_drop_oldest_counts_only_what_each_group_still_needed(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=4 * SIZE, overflow="drop_oldest")
    filtered = log.subscribe("f", filter=Filter.equals(k="x"))
    plain = log.subscribe("p")
    await publish(log, [msg(i, k=k) for i, k in enumerate("xyxy")])
    got = await receive_now(plain, 2)
    plain.nack(got[0].tag)  # back for redelivery...
    plain.ack(got[1].tag)
    await publish(log, [msg(i, k="y") for i in range(4, 7)])  # ...but 0-2 go first
    assert group_stats(log, "p")["dropped"] == 2  # 0 (given back) and 2
    assert group_stats(log, "f")["dropped"] == 2  # 0 and 2, the ones it wanted
    assert filtered.committed == plain.committed == Position(3)
    assert offsets(await receive_now(plain)) == [3, 4, 5, 6]
    assert await receive_now(filtered) == []
    assert filtered.committed == Position(7)


async def test_anonymous_reader_holds_retention_until_it_closes(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=2 * SIZE)
    await publish(log, msgs(range(2)))
    reader = log.subscribe(start="earliest")
    async with trio.open_nursery() as nursery:
        task = start(nursery, publish, log, [msg(2)])
        await settle()
        assert not task.done
        reader.close()
        await settle()
        assert (task.done, stored_at(task.result)) == (True, [2])


async def test_filtered_group_does_not_hold_messages_it_skips(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=2 * SIZE)
    log.subscribe("f", filter=Filter.equals(k="x"))
    receipt = await publish(log, [msg(i, k="y") for i in range(5)])
    assert stored_at(receipt) == [0, 1, 2, 3, 4]
    assert group_stats(log, "f")["committed"] >= 3


async def test_drop_oldest_evicts_and_counts_dropped(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=3 * SIZE, overflow="drop_oldest")
    log.declare_group("g")
    sub = log.subscribe("h")
    await publish(log, msgs(range(2)))
    got = await receive_now(sub)
    receipt = await publish(log, msgs(range(2, 6)))  # never waits
    assert stored_at(receipt) == [2, 3, 4, 5]
    assert stats_of(log, "first", "next") == (3, 6)
    assert group_stats(log, "g")["dropped"] == 3
    # 2 was dropped; 0 and 1 are unacked at the member, which still has them.
    assert group_stats(log, "h")["dropped"] == 1
    assert sub.committed == Position(3)  # nothing below 3 can be read again
    later = log.subscribe("g")
    assert offsets(await receive_now(later)) == [3, 4, 5]
    sub.ack(got[0].tag)  # an evicted delivery can still be acked...
    sub.nack(got[1].tag)  # ...but not redelivered: it counts as dropped
    assert group_stats(log, "h")["dropped"] == 2
    rest = await receive_now(sub)
    assert flagged(rest) == [(3, False), (4, False), (5, False)]
    sub.ack_many(tags(rest))
    assert sub.committed == Position(6)


async def test_a_range_ack_over_evicted_entries_moves_committed_on(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=3 * SIZE, overflow="drop_oldest")
    sub = log.subscribe("h", start="earliest")
    await publish(log, msgs(range(3)))
    got = await receive_now(sub)
    await publish(log, msgs(range(3, 5)))  # evicts 0 and 1, which the member still holds
    assert sub.committed == Position(2)
    got += await receive_now(sub)
    assert (offsets(got), tags(got)) == ([0, 1, 2, 3, 4], [1, 2, 3, 4, 5])
    sub.ack_many(range(1, 6))
    assert (sub.committed, sub.unacked) == (Position(5), 0)


async def test_data_no_group_needs_stays_until_pushed_out_by_size(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=3 * SIZE)
    sub = log.subscribe("g")
    await publish(log, msgs(range(3)))
    await read_all(sub)
    assert stats_of(log, "messages") == (3,)  # acked by every group, still kept
    await publish(log, msgs(range(3, 5)))  # only as much goes as the new ones need
    assert stats_of(log, "first", "messages", "bytes") == (2, 3, 3 * SIZE)
    replay = log.subscribe(start="earliest")
    assert offsets(await receive_now(replay)) == [2, 3, 4]


# -- waiting and closing ------------------------------------------------------------------


async def test_receive_waits_for_an_append(make_log: MakeLog, autojump_clock: Any) -> None:
    log = make_log("t", retain_bytes=BIG)
    sub = log.subscribe()
    with trio.move_on_after(10) as scope:
        await sub.receive()
    assert scope.cancelled_caught
    async with trio.open_nursery() as nursery:
        task = start(nursery, sub.receive)
        await settle()
        assert not task.done
        await publish(log, [msg(7)])
        await settle()
        assert (task.done, offsets(task.result)) == (True, [0])


async def test_close_wakes_receivers_and_blocked_publishers(make_log: MakeLog) -> None:
    log = make_log("t", retain_bytes=SIZE)
    sub = log.subscribe("g")
    idle = log.subscribe("idle", start="latest", filter=Filter.equals(k="none"))
    await publish(log, [msg(0)])
    await read_all(sub)
    async with trio.open_nursery() as nursery:
        receiver = start(nursery, idle.receive)
        await publish(log, [msg(1)])  # room: 0 was acked
        closed_sub = log.subscribe()
        own = start(nursery, closed_sub.receive)
        blocked = start(nursery, publish, log, [msg(2)])
        await settle()
        assert (receiver.done, own.done, blocked.done) == (False, False, False)
        closed_sub.close()
        await settle()
        assert isinstance(own.error, trio.ClosedResourceError)
        log.close()
        await settle()
        assert isinstance(receiver.error, trio.ClosedResourceError)
        assert isinstance(blocked.error, trio.ClosedResourceError)
    with pytest.raises(trio.ClosedResourceError):
        await sub.receive()
    with pytest.raises(trio.ClosedResourceError):
        log.subscribe()
    with pytest.raises(trio.ClosedResourceError):
        await publish(log, [msg(3)])


# -- a random walk against a reference model --------------------------------------------

FILTERS: dict[str, Filter | None] = {"a": None, "b": None, "f": Filter.equals(k="x")}


@dataclass
class _MGroup:
    """What the model knows of one group: where it started, its next fresh offset, the
    offsets given back, unacked at a live member, settled and ever delivered."""

    start: int
    filter: Filter | None
    cursor: int
    committed: int  #: the last committed position seen
    returned: set[int] = field(default_factory=set)
    outstanding: set[int] = field(default_factory=set)
    settled: set[int] = field(default_factory=set)
    delivered: set[int] = field(default_factory=set)


@dataclass
class _MMember:
    sub: Subscription
    key: str
    credit: int | None
    max_unacked: int
    unacked: dict[int, int] = field(default_factory=dict)  #: tag -> offset
    open: bool = True


class LogMachine(RuleBasedStateMachine):
    """Drives one log (in a trio run, from another thread) and the model side by side.

    Retention is never short here, so no call waits: each runs in the trio thread."""

    def __init__(self, make_log: MakeLog) -> None:
        super().__init__()
        self.log = make_log("t", retain_bytes=BIG)
        self.kinds: list[str] = []  #: header k of each offset
        self.groups: dict[str, _MGroup] = {}
        self.members: list[_MMember] = []
        self.anonymous = 0

    def call(self, fn: Callable[[], Any]) -> Any:
        return trio.from_thread.run_sync(fn)

    def live(self, key: str | None = None) -> list[_MMember]:
        return [m for m in self.members if m.open and key in (None, m.key)]

    def pick(self, index: int) -> _MMember:
        live = self.live()
        return live[index % len(live)]

    def matching(self, g: _MGroup, lo: int) -> set[int]:
        f = g.filter
        return {o for o in range(lo, len(self.kinds)) if not f or f.matches({"k": self.kinds[o]})}

    def committed_of(self, key: str) -> int:
        live = self.live(key)
        return committed_offset(live[0].sub) if live else group_stats(self.log, key)["committed"]

    def join(self, group: str | None, start_at: Any, credit: int | None, max_unacked: int) -> None:
        tail = len(self.kinds)
        key = group if group is not None else f"~{self.anonymous}"
        flt = FILTERS.get(group or "")
        at = {None: tail, "latest": tail, "earliest": 0}.get(start_at, start_at)
        at = at.offset if isinstance(at, Position) else at
        new = key not in self.groups
        if new and at > tail:
            with pytest.raises(ValueError):
                self.call(lambda: self.log.subscribe(group, start=start_at, filter=flt))
            return
        sub = self.call(
            lambda: self.log.subscribe(
                group, credit=credit, max_unacked=max_unacked, start=start_at, filter=flt
            )
        )
        if new:
            self.groups[key] = _MGroup(at, flt, at, at)
            self.anonymous += group is None
        self.members.append(_MMember(sub, key, credit, max_unacked))

    def receive_on(self, m: _MMember, max_count: int | None) -> list[Delivery]:
        """Receive what the model says is there: redeliveries first, then fresh ones."""
        g = self.groups[m.key]
        got: list[Delivery] = trio.from_thread.run(receive_now, m.sub, max_count)
        fresh = sorted(self.matching(g, g.cursor))
        k = len(g.returned) + len(fresh)
        for bound in (max_count, m.credit, m.max_unacked - len(m.unacked)):
            k = k if bound is None else min(k, bound)
        again = sorted(g.returned)[:k]
        expected = [(o, True) for o in again] + [(o, False) for o in fresh[: k - len(again)]]
        assert flagged(got) == expected
        for d, (o, _) in zip(got, expected, strict=True):
            assert o not in g.outstanding, f"{o} delivered twice at once in {m.key}"
            assert (number(d), d.tag in m.unacked) == (o, False)
            m.unacked[d.tag] = o
            g.outstanding.add(o)
            g.returned.discard(o)
            g.delivered.add(o)
        if len(again) < len(expected):
            g.cursor = expected[-1][0] + 1
        if m.credit is not None:
            m.credit -= len(got)
        return got

    def settle_tags(self, m: _MMember, chosen: list[int], requeue: bool = False) -> None:
        g = self.groups[m.key]
        for tag in chosen:
            o = m.unacked.pop(tag)
            g.outstanding.discard(o)
            (g.returned if requeue else g.settled).add(o)

    # rules
    @rule(ks=st.lists(st.sampled_from("xy"), min_size=1, max_size=6))
    def append(self, ks: list[str]) -> None:
        first = len(self.kinds)
        batch = [msg(first + i, k=k) for i, k in enumerate(ks)]
        receipt = trio.from_thread.run(publish, self.log, batch)
        assert (receipt.done(), stored_at(receipt)) == (True, list(range(first, first + len(ks))))
        self.kinds += ks

    @precondition(lambda self: len(self.live()) < 6)
    @rule(
        group=st.sampled_from((None, "a", "b", "f")),
        start_at=st.sampled_from((None, "earliest", "latest"))
        | st.integers(0, 40)
        | st.integers(0, 40).map(Position),
        credit=st.sampled_from((None, None, 0, 2, 5)),
        max_unacked=st.sampled_from((1, 3, 1024)),
    )
    def subscribe(
        self, group: str | None, start_at: Any, credit: int | None, max_unacked: int
    ) -> None:
        self.join(group, start_at, credit, max_unacked)

    @precondition(lambda self: any(k in self.groups for k in FILTERS))
    @rule(group=st.sampled_from(tuple(FILTERS)))
    def wrong_filter(self, group: str) -> None:
        other = Filter.equals(k="y") if FILTERS[group] is None else None
        if group in self.groups:
            with pytest.raises(ValueError):
                self.call(lambda: self.log.subscribe(group, filter=other))

    @precondition(lambda self: any(k in self.groups and not self.live(k) for k in FILTERS))
    @rule(data=st.data())
    def rejoin(self, data: st.DataObject) -> None:
        """A named group without members comes back: everything unacked returns first."""
        key = data.draw(
            st.sampled_from([k for k in FILTERS if k in self.groups and not self.live(k)])
        )
        returned = set(self.groups[key].returned)
        self.join(key, "latest", None, 1024)
        assert {
            o for o, again in flagged(self.receive_on(self.members[-1], None)) if again
        } == returned

    @precondition(lambda self: bool(self.live()))
    @rule(index=st.integers(0, 11), max_count=st.sampled_from((None, 0, 1, 2, 5)))
    def receive(self, index: int, max_count: int | None) -> None:
        self.receive_on(self.pick(index), max_count)

    @precondition(lambda self: bool(self.live()))
    @rule(index=st.integers(0, 11), seed=st.integers(0, 1000), bad=st.booleans())
    def ack(self, index: int, seed: int, bad: bool) -> None:
        """Ack some deliveries in random order; a bad tag raises after the ones before it."""
        m = self.pick(index)
        rnd = random.Random(seed)
        chosen = rnd.sample(sorted(m.unacked), rnd.randint(0, len(m.unacked)))
        if bad:
            cut = rnd.randint(0, len(chosen))
            with pytest.raises(KeyError):
                self.call(lambda: m.sub.ack_many([*chosen[:cut], 10_000, *chosen[cut:]]))
            chosen = chosen[:cut]
        else:
            self.call(lambda: m.sub.ack_many(chosen))
        self.settle_tags(m, chosen)

    @precondition(lambda self: any(m.unacked for m in self.live()))
    @rule(data=st.data(), as_range=st.booleans())
    def ack_in_order(self, data: st.DataObject, as_range: bool) -> None:
        """Ack a slice of the unacked tags in ascending order (a batch acked as it was
        handed out), as a list, or as a range when its tags are consecutive."""
        m = data.draw(st.sampled_from([m for m in self.live() if m.unacked]))
        held = sorted(m.unacked)
        i = data.draw(st.integers(0, len(held) - 1))
        chosen = held[i : data.draw(st.integers(i + 1, len(held)))]
        tags: list[int] | range = chosen
        if as_range and chosen == list(range(chosen[0], chosen[-1] + 1)):
            tags = range(chosen[0], chosen[-1] + 1)
        self.call(lambda: m.sub.ack_many(tags))
        self.settle_tags(m, chosen)

    @precondition(lambda self: any(m.unacked for m in self.live()))
    @rule(data=st.data(), requeue=st.booleans())
    def nack(self, data: st.DataObject, requeue: bool) -> None:
        m = data.draw(st.sampled_from([m for m in self.live() if m.unacked]))
        tag = data.draw(st.sampled_from(sorted(m.unacked)))
        self.call(lambda: m.sub.nack(tag, requeue=requeue))
        self.settle_tags(m, [tag], requeue)

    @precondition(lambda self: bool(self.live()))
    @rule(index=st.integers(0, 11), n=st.integers(0, 5))
    def grant(self, index: int, n: int) -> None:
        m = self.pick(index)
        self.call(lambda: m.sub.grant(n))
        m.credit = None if m.credit is None else m.credit + n

    @precondition(lambda self: bool(self.live()))
    @rule(index=st.integers(0, 11))
    def close(self, index: int) -> None:
        m = self.pick(index)
        self.call(m.sub.close)
        self.settle_tags(m, list(m.unacked), requeue=True)
        m.open = False
        if m.key.startswith("~"):
            del self.groups[m.key]

    # checks
    @invariant()
    def committed_positions(self) -> None:
        """Committed never goes back, never passes an offset not settled, and is not
        behind the first one either (or the next fresh one)."""
        for key, g in self.groups.items():
            committed = self.committed_of(key)
            assert committed >= g.committed, f"committed of {key} went back"
            g.committed = committed
            pending = self.matching(g, g.start) - g.settled
            assert committed <= min(pending, default=len(self.kinds)), f"{key} passed {pending}"
            assert committed >= min(pending | {g.cursor}), f"{key} committed lags"
            if not key.startswith("~"):
                stats = group_stats(self.log, key)
                counts = (len(g.outstanding), len(self.live(key)))
                assert (stats["unacked"], stats["members"]) == counts
        for m in self.live():
            assert (m.sub.unacked, m.sub.credit) == (len(m.unacked), m.credit)

    def teardown(self) -> None:
        """Drain every group: each gets every matching offset since it started."""
        for key, g in list(self.groups.items()):
            for m in self.live(key):
                self.call(lambda m=m: m.sub.ack_many(list(m.unacked)))
                self.settle_tags(m, list(m.unacked))
            if not self.live(key):
                self.join(key, None, None, 1024)
            m = self.live(key)[0]
            self.call(lambda m=m: m.sub.grant(BIG))
            m.credit = None if m.credit is None else m.credit + BIG
            while got := self.receive_on(m, None):
                self.call(lambda m=m, got=got: m.sub.ack_many(tags(got)))
                self.settle_tags(m, tags(got))
            assert g.delivered >= self.matching(g, g.start), f"{key} missed some"
            assert self.committed_of(key) == len(self.kinds)
        self.call(self.log.close)


def test_random_operations_match_the_model(make_log: MakeLog) -> None:
    """Random appends, subscribes (named, anonymous, filtered; any start), receives,
    acks in any order (with bad tags), nacks, grants, closes and rejoins."""
    run = settings(
        max_examples=150,
        stateful_step_count=40,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )

    def walk() -> None:
        run_state_machine_as_test(lambda: LogMachine(make_log), settings=run)

    async def main() -> None:
        await trio.to_thread.run_sync(walk)

    trio.run(main)
