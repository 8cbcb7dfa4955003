"""Per-group filters and calls (request/reply), tested through the hub's public API.

Example tests cover each rule on its own. Two state machines then drive a hub from a
worker thread (every hub call runs in the trio thread, as in test_topic_runs.py) and
compare it with a per-copy reference model: filtered and unfiltered groups on one
topic, and calls with deadlines on a mock clock while service members come and go.
Each machine runs under hypothesis and as seeded random walks (longer, better mixed).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from harness import receive_now, settle
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from gateway.core.filters import Condition, Filter, Op
from gateway.core.hub import Hub, HubLimits
from gateway.core.model import MESSAGE_OVERHEAD, Message, Outcome, Reply
from gateway.core.receipts import Receipt

RED = Filter.equals(color="red")
N_GT_3 = Filter((Condition("n", Op.GT, 3),))
FAILED, DELIVERED = Outcome.FAILED, Outcome.DELIVERED


def m(body: bytes, dest: str = "t", **headers: str) -> Message:
    return Message(dest, body, headers)


def stats(hub: Hub, dest: str = "t") -> dict[str, Any]:
    return hub.destination(dest).stats()


def held(hub: Hub, group: str, dest: str = "t") -> tuple[int, int]:
    g = stats(hub, dest)["groups"][group]
    return g["held"], g["held_bytes"]


def bodies(deliveries: list[Any]) -> list[bytes]:
    return [d.message.body for d in deliveries]


# -- filters: examples ------------------------------------------------------------------


async def test_a_filtered_group_gets_holds_and_is_waited_for_only_when_it_matches() -> None:
    hub = Hub()
    reds = hub.subscribe("t", "reds", filter=RED)
    everything = hub.subscribe("t")
    batch = [m(b"1", color="red"), m(b"2", color="blue"), m(b"3"), m(b"4", color="red", n="9")]
    receipt = await hub.publish(batch)
    assert held(hub, "reds") == (2, batch[0].size + batch[3].size)
    got = await receive_now(reds)
    assert [(d.tag, d.message) for d in got] == [(1, batch[0]), (2, batch[3])]
    everything.ack_many(d.tag for d in await receive_now(everything))
    reds.ack(got[0].tag)
    assert not receipt.done(), "the receipt waits for the reds' copies, and only those"
    reds.ack(got[1].tag)
    assert (receipt.outcome, held(hub, "reds"), stats(hub)["filtered"]) == (DELIVERED, (0, 0), 0)


async def test_messages_no_group_takes_settle_at_once() -> None:
    hub = Hub()
    receipt = await hub.publish([m(b"0", color="red")])  # no group at all
    assert (receipt.outcome, stats(hub)["discarded"], stats(hub)["filtered"]) == (DELIVERED, 1, 0)
    reds = hub.subscribe("t", "reds", filter=RED)
    big = hub.subscribe("t", filter=N_GT_3)
    receipt = await hub.publish([m(b"1", color="blue", n="2"), m(b"2", n="x"), m(b"3")])
    assert [r.outcome for r in receipt.results()] == [DELIVERED] * 3
    assert (receipt.outcome, stats(hub)["discarded"], stats(hub)["filtered"]) == (DELIVERED, 1, 3)
    assert all(g["held"] == g["held_bytes"] == 0 for g in stats(hub)["groups"].values())
    assert await receive_now(reds) == await receive_now(big) == []
    # One group matching is enough not to count as filtered.
    receipt = await hub.publish([m(b"4", n="5"), m(b"5", color="green")])
    (d,) = await receive_now(big)
    assert (d.message.body, receipt.done(), stats(hub)["filtered"]) == (b"4", False, 4)
    big.ack(d.tag)
    assert receipt.outcome is DELIVERED


async def test_filtered_messages_cost_no_credit_and_no_buffer_space(
    autojump_clock: trio.abc.Clock,
) -> None:
    hub = Hub(limits=HubLimits(buffer_messages=2))
    reds = hub.subscribe("t", "reds", filter=RED, credit=1)
    with trio.fail_after(1):  # nobody acks: messages "reds" took would block the publisher
        receipt = await hub.publish([m(b"%d" % i, color="blue") for i in range(50)])
        receipt2 = await hub.publish([m(b"r1", color="red"), m(b"r2", color="red")])
    assert (receipt.done(), receipt2.done(), held(hub, "reds")[0]) == (True, False, 2)
    with trio.move_on_after(1) as scope:
        await hub.publish([m(b"r3", color="red")])
    assert scope.cancelled_caught, "a third red message waits for room"
    (d,) = await receive_now(reds)
    assert (d.tag, d.message.body, reds.credit) == (1, b"r1", 0)


async def test_members_of_a_named_group_share_one_filter() -> None:
    hub = Hub()
    hub.subscribe("t", "g", filter=Filter.equals(color="red"))
    hub.subscribe("t", "g", filter=Filter((Condition("color", Op.EQ, "red"),)))  # an equal one
    for other in (None, Filter(), N_GT_3, Filter.equals(color="blue")):
        with pytest.raises(ValueError, match="share one filter"):
            hub.subscribe("t", "g", filter=other)
    hub.subscribe("t", "plain")
    with pytest.raises(ValueError, match="share one filter"):
        hub.subscribe("t", "plain", filter=RED)
    assert stats(hub)["groups"]["g"]["members"] == 2
    hub.subscribe("t", filter=RED)  # anonymous groups are groups of one: any filter
    hub.subscribe("t", filter=N_GT_3)


async def test_a_named_filtered_group_keeps_its_copies_when_its_members_leave() -> None:
    hub = Hub()
    a = hub.subscribe("t", "reds", filter=RED)
    receipt = await hub.publish([m(b"1", color="red"), m(b"2"), m(b"3", color="red")])
    assert len(await receive_now(a, 1)) == 1
    a.close()
    assert (held(hub, "reds")[0], receipt.done()) == (2, False)
    b = hub.subscribe("t", "reds", filter=RED)
    got = await receive_now(b)
    assert [(d.message.body, d.redelivered) for d in got] == [(b"1", True), (b"3", False)]
    b.ack_many(d.tag for d in got)
    assert receipt.outcome is DELIVERED


async def test_copies_left_by_an_anonymous_group_go_to_a_group_that_wants_them() -> None:
    hub = Hub()
    a = hub.subscribe("t")
    receipt = await hub.publish([m(b"blue", color="blue"), m(b"red", color="red")])
    reds = hub.subscribe("t", "reds", filter=RED)
    blues = hub.subscribe("t", "blues", filter=Filter.equals(color="blue"))
    a.close()  # its only copies move on, each to the first group whose filter matches
    (r,), (b,) = await receive_now(reds), await receive_now(blues)
    assert (r.message.body, b.message.body, r.redelivered) == (b"red", b"blue", False)
    reds.ack(r.tag)
    blues.ack(b.tag)
    assert receipt.outcome is DELIVERED


async def test_a_filtered_first_group_adopts_only_the_backlog_it_matches() -> None:
    hub = Hub()
    a = hub.subscribe("t")
    receipt = await hub.publish([m(b"blue", color="blue"), m(b"red", color="red")])
    a.close()  # the last group: its copies go to the backlog
    reds = hub.subscribe("t", filter=RED)
    got = await receive_now(reds)
    assert bodies(got) == [b"red"]
    reds.ack(got[0].tag)
    assert not receipt.done(), "blue is still owed"


@pytest.mark.parametrize("how", ["adopted", "handed over"])
async def test_copies_parked_in_the_backlog_are_not_stranded(how: str) -> None:
    hub = Hub()
    a = hub.subscribe("t", filter=None if how == "adopted" else Filter.equals(color="blue"))
    receipt = await hub.publish([m(b"blue", color="blue")])
    if how == "adopted":
        a.close()  # the last group: blue goes to the backlog
        hub.subscribe("t", "reds", filter=RED)  # the first group adopts nothing of it
    else:
        hub.subscribe("t", "reds", filter=RED)
        a.close()  # no remaining group wants blue: it goes to the backlog
    everything = hub.subscribe("t", "all")
    # Whether "all" gets the copy or it settles otherwise, the publisher must not wait.
    everything.ack_many(d.tag for d in await receive_now(everything))
    assert receipt.outcome is DELIVERED, "the receipt waits on a copy nobody can get"


# -- calls: examples ------------------------------------------------------------------


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    """A hub with its call timers running (tests add ``autojump_clock`` for mock time)."""
    hub = Hub()
    async with trio.open_nursery() as nursery:
        await nursery.start(hub.run)
        yield hub
        nursery.cancel_scope.cancel()


NOBODY = (FAILED, "no subscriber to answer the call")


async def test_a_call_settles_at_its_reply(hub: Hub, autojump_clock: Any) -> None:
    sub = hub.subscribe("svc", "workers")
    receipt = await hub.call(m(b"q", "svc"), 5)
    (d,) = await receive_now(sub)
    assert d.reply_by == trio.current_time() + 5 == receipt.reply_by
    await trio.sleep(4)
    answer = Reply(b"a", {"k": "v"}, "text/plain", 0, "")
    sub.reply(d.tag, answer)
    assert (receipt.outcome, receipt.reply, receipt.results()[0].reply) == (DELIVERED,) + (
        answer,
    ) * 2
    assert (held(hub, "workers", "svc"), hub.inflight) == ((0, 0), 0)
    await trio.sleep(2)  # the deadline passing changes nothing now
    assert (receipt.outcome, receipt.reason) == (DELIVERED, "")
    with pytest.raises(KeyError):
        sub.reply(d.tag, answer)


async def test_a_call_fails_at_its_deadline(hub: Hub, autojump_clock: Any) -> None:
    sub = hub.subscribe("svc", "workers")
    start = trio.current_time()
    receipt = await hub.call(m(b"q", "svc"), 2.5)
    (d,) = await receive_now(sub)
    assert await receipt.wait() is FAILED
    assert trio.current_time() == start + 2.5
    assert (receipt.reason, receipt.results()[0].reason) == ("no reply within 2.5s",) * 2
    sub.reply(d.tag, Reply(b"late"))  # settles the copy, changes nothing else
    assert (receipt.outcome, receipt.reply, held(hub, "workers", "svc")) == (FAILED, None, (0, 0))


async def test_a_call_nobody_answers_fails_at_once_or_when_its_copies_settle(
    hub: Hub, autojump_clock: Any
) -> None:
    for timeout in (0, -1):
        with pytest.raises(ValueError):
            await hub.call(m(b"q", "svc"), timeout)
    receipt = await hub.call(m(b"q", "svc"), 5)
    assert (receipt.outcome, receipt.reason) == NOBODY
    hub.subscribe("svc", filter=RED)
    receipt = await hub.call(m(b"q", "svc", color="blue"), 5)  # no filter matches
    assert (receipt.outcome, receipt.reason, hub.inflight) == (*NOBODY, 0)
    one, two = hub.subscribe("svc"), hub.subscribe("svc")
    receipt = await hub.call(m(b"q", "svc"), 5)
    (d1,), (d2,) = await receive_now(one), await receive_now(two)
    one.ack(d1.tag)
    assert not receipt.done(), "the other copy may still be answered"
    two.ack(d2.tag)
    assert (receipt.outcome, receipt.reason[-15:]) == (FAILED, "without a reply")


async def test_calls_need_the_hub_running() -> None:
    with pytest.raises(RuntimeError):
        await Hub().call(m(b"q", "svc"), 5)


async def test_the_first_reply_wins_and_other_copies_are_dropped(
    hub: Hub, autojump_clock: Any
) -> None:
    one, two = hub.subscribe("svc", "g1"), hub.subscribe("svc", "g2")
    receipt = await hub.call(m(b"q", "svc"), 5)
    (d1,), (d2,) = await receive_now(one), await receive_now(two)
    one.ack(d1.tag)
    two.reply(d2.tag, Reply(b"second"))
    assert (receipt.outcome, receipt.reply) == (DELIVERED, Reply(b"second"))
    receipt = await hub.call(m(b"q2", "svc"), 5)
    (d1,) = await receive_now(one)
    one.reply(d1.tag, Reply(b"first"))
    assert (receipt.reply, held(hub, "g2", "svc")[0]) == (Reply(b"first"), 1)
    assert await receive_now(two) == [], "an answered call's queued copy is dropped"
    assert (held(hub, "g2", "svc"), hub.inflight) == ((0, 0), 0)
    r1, r2 = await hub.call(m(b"q3", "svc"), 1), await hub.call(m(b"q4", "svc"), 10)
    await trio.sleep(2)
    assert (r1.reason, r2.done(), held(hub, "g1", "svc")[0]) == ("no reply within 1s", False, 2)
    (d1,) = await receive_now(one)  # an expired call's queued copy is dropped too
    assert (d1.message.body, held(hub, "g1", "svc")[0]) == (b"q4", 1)


async def test_a_reply_wins_over_an_earlier_failed_copy(hub: Hub, autojump_clock: Any) -> None:
    one, two = hub.subscribe("svc", "g1"), hub.subscribe("svc", "g2")
    receipt = await hub.call(m(b"q", "svc"), 5)
    (d1,), (d2,) = await receive_now(one), await receive_now(two)
    one.nack(d1.tag, requeue=False, reason="cannot")
    assert not receipt.done()
    two.reply(d2.tag, Reply(b"answer"))
    assert (receipt.reply, receipt.outcome, receipt.reason) == (Reply(b"answer"), DELIVERED, "")
    assert receipt.results()[0].outcome is DELIVERED


async def test_reply_to_a_plain_delivery_or_an_unknown_tag_raises() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    receipt = await hub.publish([m(b"plain")])
    (d,) = await receive_now(sub)
    assert d.reply_by is None
    with pytest.raises(ValueError):
        sub.reply(d.tag, Reply(b"x"))
    with pytest.raises(KeyError):
        sub.reply(99, Reply(b"x"))
    assert (receipt.done(), sub.unacked) == (False, 1), "a refused reply settles nothing"
    sub.ack(d.tag)
    assert receipt.outcome is DELIVERED


async def test_a_member_leaving_mid_call_hands_it_on(hub: Hub, autojump_clock: Any) -> None:
    leaver, stayer = hub.subscribe("svc", "workers"), hub.subscribe("svc", "workers")
    receipt = await hub.call(m(b"q", "svc"), 5)
    (d,) = await receive_now(leaver)
    await trio.sleep(3)
    leaver.close()
    (again,) = await receive_now(stayer)
    assert (again.redelivered, again.reply_by, again.message) == (True, d.reply_by, d.message)
    stayer.reply(again.tag, Reply(b"re:q"))
    assert (receipt.outcome, receipt.reply) == (DELIVERED, Reply(b"re:q"))


async def test_a_group_is_a_load_balanced_service(hub: Hub, autojump_clock: Any) -> None:
    members = [hub.subscribe("svc", "workers") for _ in range(3)]
    receipts = [await hub.call(m(b"q%d" % i, "svc"), 5) for i in range(6)]
    served = []
    for sub in members * 2:
        (d,) = await receive_now(sub, 1)
        served.append(d.message.body)
        sub.reply(d.tag, Reply(b"re:" + d.message.body))
    assert sorted(served) == [b"q%d" % i for i in range(6)]
    assert [r.reply for r in receipts] == [Reply(b"re:q%d" % i) for i in range(6)]


async def test_many_answered_calls_then_one_expires(hub: Hub, autojump_clock: Any) -> None:
    """Answered calls pile up in the deadline heap until pruned; expiry still works."""
    sub = hub.subscribe("svc", "workers")
    for i in range(1500):
        r = await hub.call(m(b"%d" % i, "svc"), 100 + i % 7)
        (d,) = await receive_now(sub)
        sub.reply(d.tag, Reply(d.message.body))
        assert r.reply == Reply(b"%d" % i)
    start = trio.current_time()
    last = await hub.call(m(b"last", "svc"), 1)
    await last.wait()
    assert (trio.current_time(), last.reason) == (start + 1, "no reply within 1s")


# -- state machines: plumbing -----------------------------------------------------------

MACHINE_SETTINGS = settings(
    max_examples=40,
    stateful_step_count=50,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def in_thread(body: Callable[[trio.Nursery], None], **run: Any) -> None:
    """Run ``body`` in a worker thread while trio runs the hub in this one."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await trio.to_thread.run_sync(body, nursery)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main, **run)
    except BaseExceptionGroup as group:  # report a lone failure, not the group around it
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


def sync(fn: Callable[[], Any]) -> Any:
    return trio.from_thread.run_sync(fn)


def walks(factory: Callable[[trio.Nursery], Any], seed: int, n: int, steps: int) -> Any:
    """A body for :func:`in_thread`: ``n`` random walks of ``steps`` steps, then a drain."""

    def body(nursery: trio.Nursery) -> None:
        rnd = random.Random(seed)
        for _ in range(n):
            machine = factory(nursery)
            try:
                for _ in range(steps):
                    machine.random_step(rnd)
                    machine.matches_the_model()
                machine.drain()
                machine.matches_the_model()
            finally:
                machine.teardown()

    return body


# -- the filter machine -----------------------------------------------------------------

#: Filters by name: the gateway's filter and the model's own predicate.
FILTERS: dict[str, tuple[Filter | None, Callable[[Mapping[str, str]], bool]]] = {
    "none": (None, lambda h: True),
    "empty": (Filter(), lambda h: True),
    "red": (RED, lambda h: h.get("color") == "red"),
    "blue": (Filter.equals(color="blue"), lambda h: h.get("color") == "blue"),
    "n>3": (N_GT_3, lambda h: "n" in h and int(h["n"]) > 3),
    "green,n<=2": (
        Filter((Condition("color", Op.EQ, "green"), Condition("n", Op.LE, 2))),
        lambda h: h.get("color") == "green" and "n" in h and int(h["n"]) <= 2,
    ),
}
COLORS = ("red", "green", "blue")
GROUPS = (None, None, "a", "b", "c")
HEADERS = st.fixed_dictionaries(
    {}, optional={"color": st.sampled_from(COLORS), "n": st.integers(0, 6).map(str)}
)


@dataclass
class FMessage:
    message: Message
    size: int
    #: Groups that took a copy (less anonymous groups that left with theirs).
    holders: int = 0
    pending: int = 0
    worst: Outcome = DELIVERED


@dataclass
class FGroup:
    fkey: str
    anonymous: bool
    #: (message number, redelivered), in publish order.
    queue: list[tuple[int, bool]] = field(default_factory=list)
    members: int = 0
    #: Messages it may ever get: those it matched at publish time, and inherited ones.
    entitled: set[int] = field(default_factory=set)


@dataclass
class Member:
    sub: Any
    group: str = ""
    unacked: dict[int, Any] = field(default_factory=dict)
    next_tag: int = 1
    open: bool = True


class FilterMachine(RuleBasedStateMachine):
    def __init__(self, nursery: trio.Nursery) -> None:
        super().__init__()
        self.hub = Hub()
        self.msgs: list[FMessage] = []
        self.groups: dict[str, FGroup] = {}
        self.backlog: list[tuple[int, bool]] = []
        self.members: list[Member] = []
        self.publishes: list[tuple[Receipt, list[int], list[Receipt]]] = []
        self.discarded = self.filtered = 0

    def live(self) -> list[Member]:
        return [x for x in self.members if x.open]

    def pick(self, i: int) -> Member:
        return self.live()[i % len(self.live())]

    def matches(self, fkey: str, n: int) -> bool:
        return FILTERS[fkey][1](self.msgs[n].message.headers)

    @initialize(
        subs=st.lists(
            st.tuples(st.sampled_from(GROUPS), st.sampled_from(list(FILTERS))), max_size=4
        ),
        batch=st.lists(HEADERS, max_size=5),
    )
    def start(self, subs: list[tuple[str | None, str]], batch: list[dict[str, str]]) -> None:
        """Some groups (and messages for them) to begin with."""
        for group, fkey in subs:
            self.subscribe(group, fkey)
        if batch:
            self.publish(batch)

    @precondition(lambda self: len(self.live()) < 6)
    @rule(group=st.sampled_from(GROUPS), fkey=st.sampled_from(list(FILTERS)))
    def subscribe(self, group: str | None, fkey: str) -> None:
        flt = FILTERS[fkey][0]
        old = self.groups.get(group) if group else None
        if old is not None and old.fkey != fkey:
            with pytest.raises(ValueError):
                sync(lambda: self.hub.subscribe("t", group, filter=flt))
            return
        before = set(sync(lambda: stats(self.hub))["groups"])
        sub = sync(lambda: self.hub.subscribe("t", group, filter=flt))
        assert sub.filter == flt
        (name,) = [group] if group else set(sync(lambda: stats(self.hub))["groups"]) - before
        if old is None:
            g = FGroup(fkey, group is None)
            if self.backlog:  # a new group adopts what the backlog holds that it wants
                backlog, self.backlog = self.backlog, []
                self.hand_over(backlog, [g])
            self.groups[name] = g
        self.groups[name].members += 1
        self.members.append(Member(sub, name))

    @rule(batch=st.lists(HEADERS, min_size=1, max_size=5))
    def publish(self, batch: list[dict[str, str]]) -> None:
        first = len(self.msgs)
        messages = [Message("t", b"m%d" % (first + i), h) for i, h in enumerate(batch)]
        receipt: Receipt = trio.from_thread.run(self.hub.publish, messages)
        settled: list[Receipt] = []
        receipt.add_done_callback(settled.append)
        self.publishes.append((receipt, list(range(first, first + len(batch))), settled))
        for n, message in enumerate(messages, first):
            size = sum(len(k) + len(v) for k, v in message.headers.items())
            self.msgs.append(FMessage(message, MESSAGE_OVERHEAD + len(message.body) + size))
            takers = [g for g in self.groups.values() if self.matches(g.fkey, n)]
            self.discarded += not self.groups
            self.filtered += bool(self.groups) and not takers
            for g in takers:
                g.queue.append((n, False))
                g.entitled.add(n)
            self.msgs[n].holders = self.msgs[n].pending = len(takers)

    def take(self, x: Member, k: int | None) -> int:
        g = self.groups[x.group]
        expected, g.queue = g.queue[:k], g.queue[len(g.queue) if k is None else k :]
        got = trio.from_thread.run(receive_now, x.sub, k)
        assert [(d.tag, d.message, d.redelivered, d.reply_by) for d in got] == [
            (x.next_tag + i, self.msgs[n].message, r, None) for i, (n, r) in enumerate(expected)
        ]
        for d, (n, _) in zip(got, expected, strict=True):
            # Independent of the model's queues: what the group's filter and history allow.
            assert FILTERS[g.fkey][1](d.message.headers), f"{x.group} got a message it filters"
            assert n in g.entitled, f"{x.group} got message {n}, which it never took"
            x.unacked[d.tag] = n
        x.next_tag += len(got)
        return len(got)

    @precondition(lambda self: self.live())
    @rule(i=st.integers(0, 11), k=st.sampled_from((1, 2, 3, None)))
    def receive(self, i: int, k: int | None) -> None:
        self.take(self.pick(i), k)

    def settled(self, n: int, outcome: Outcome) -> None:
        self.msgs[n].pending -= 1
        self.msgs[n].worst = max(self.msgs[n].worst, outcome)

    @precondition(lambda self: any(x.unacked for x in self.live()))
    @rule(i=st.integers(0, 11), picks=st.lists(st.integers(0, 30), min_size=1, max_size=6))
    def ack(self, i: int, picks: list[int]) -> None:
        x = self.pick(i)
        tags = sorted(x.unacked)
        chosen = list(dict.fromkeys(tags[p % len(tags)] for p in picks)) if tags else []
        sync(lambda: x.sub.ack_many(chosen))
        for tag in chosen:
            self.settled(x.unacked.pop(tag), DELIVERED)

    @precondition(lambda self: any(x.unacked for x in self.live()))
    @rule(i=st.integers(0, 11), pick=st.integers(0, 30), requeue=st.booleans())
    def nack(self, i: int, pick: int, requeue: bool) -> None:
        x = self.pick(i)
        if x.unacked:
            tag = sorted(x.unacked)[pick % len(x.unacked)]
            sync(lambda: x.sub.nack(tag, requeue=requeue, reason="no"))
            n = x.unacked.pop(tag)
            if requeue:
                g = self.groups[x.group]
                g.queue = sorted([*g.queue, (n, True)])
            else:
                self.settled(n, FAILED)

    @precondition(lambda self: self.live())
    @rule(i=st.integers(0, 11))
    def close(self, i: int) -> None:
        x = self.pick(i)
        g = self.groups[x.group]
        pieces = sorted([*g.queue, *((n, True) for n in x.unacked.values())])
        sync(x.sub.close)
        sync(x.sub.close)  # idempotent
        x.open, x.unacked, g.members = False, {}, g.members - 1
        if not g.anonymous:
            g.queue = pieces  # a named group keeps everything
            return
        # The last member of an anonymous group takes the group along: a copy another
        # group took settles neutral; an only copy moves to the first remaining group
        # that wants it, else to the backlog.
        del self.groups[x.group]
        moved = []
        for n, r in pieces:
            if self.msgs[n].holders > 1:
                self.msgs[n].holders -= 1
                self.msgs[n].pending -= 1
            else:
                moved.append((n, r))
        self.hand_over(moved, list(self.groups.values()))

    def hand_over(self, copies: list[tuple[int, bool]], groups: list[FGroup]) -> None:
        for n, r in copies:
            heir = next((g for g in groups if self.matches(g.fkey, n)), None)
            if heir is None:
                self.backlog = sorted([*self.backlog, (n, r)])
            else:
                heir.queue = sorted([*heir.queue, (n, r)])
                heir.entitled.add(n)

    @rule()
    def drain(self) -> None:
        """Members for every group (the backlog too) take and ack everything."""
        if self.backlog:
            self.subscribe(None, "none")
        for name, g in list(self.groups.items()):
            if not g.members:
                self.subscribe(name, g.fkey)
        for x in self.live():
            while True:
                tags = sorted(x.unacked)
                sync(lambda x=x, tags=tags: x.sub.ack_many(tags))
                for tag in tags:
                    self.settled(x.unacked.pop(tag), DELIVERED)
                if not self.take(x, None):
                    break
        # Copies parked in the backlog were adopted by the unfiltered group above.
        assert not self.backlog
        for receipt, _, _ in self.publishes:
            assert receipt.done()

    @invariant()
    def matches_the_model(self) -> None:
        actual, inflight = sync(lambda: (stats(self.hub), self.hub.inflight))
        unacked: dict[str, list[int]] = {}
        for x in self.live():
            assert x.sub.unacked == len(x.unacked)
            unacked.setdefault(x.group, []).extend(x.unacked.values())
        groups = {}
        for name, g in self.groups.items():
            holding = [n for n, _ in g.queue] + unacked.get(name, [])
            groups[name] = {
                "queued": len(g.queue),
                "held_bytes": sum(self.msgs[n].size for n in holding),
                "held": len(holding),
                "members": g.members,
                **({"filter": str(FILTERS[g.fkey][0])} if g.fkey != "none" else {}),
            }
        counts = {"backlog": len(self.backlog), "discarded": self.discarded}
        assert actual == {"kind": "topic", **counts, "filtered": self.filtered, "groups": groups}
        assert list(actual["groups"]) == list(groups), "group order"
        pending = 0
        for receipt, numbers, settled in self.publishes:
            msgs = [self.msgs[n] for n in numbers]
            done = all(msg.pending == 0 for msg in msgs)
            pending += not done
            assert (receipt.done(), len(settled)) == (done, done), f"{numbers}: {receipt!r}"
            if done:
                assert [r.outcome for r in receipt.results()] == [msg.worst for msg in msgs]
                assert receipt.outcome is max(msg.worst for msg in msgs)
        assert inflight == pending

    def random_step(self, rnd: random.Random) -> None:
        op = rnd.choices(("sub", "pub", "recv", "ack", "nack", "close"), (2, 4, 5, 4, 1, 2))[0]
        if op == "sub" or not self.live():
            if len(self.live()) < 6:
                self.subscribe(rnd.choice(GROUPS), rnd.choice(list(FILTERS)))
        elif op == "pub":
            headers = [{"color": rnd.choice(COLORS), "n": str(rnd.randrange(7))} for _ in "12345"]
            for h in headers:
                for key in [k for k in h if rnd.random() < 0.3]:
                    del h[key]
            self.publish(headers[: rnd.randint(1, 5)])
        elif op == "recv":
            self.receive(rnd.randrange(12), rnd.choice((1, 2, 3, None)))
        elif op == "ack":
            self.ack(rnd.randrange(12), [rnd.randrange(30) for _ in range(rnd.randint(1, 6))])
        elif op == "nack":
            self.nack(rnd.randrange(12), rnd.randrange(30), rnd.random() < 0.5)
        else:
            self.close(rnd.randrange(12))

    def teardown(self) -> None:
        sync(self.hub.close)


def test_filtered_and_unfiltered_groups_behave_like_the_model() -> None:
    in_thread(
        lambda nursery: run_state_machine_as_test(
            lambda: FilterMachine(nursery), settings=MACHINE_SETTINGS
        )
    )


@pytest.mark.parametrize("seed", range(2))
def test_random_walks_with_filtered_groups(seed: int) -> None:
    in_thread(walks(FilterMachine, seed, 20, 100))


# -- the call machine -------------------------------------------------------------------


@dataclass
class Call:
    body: bytes
    timeout: float
    reply_by: float
    receipt: Receipt
    settled: list[Receipt] = field(default_factory=list)
    #: None while pending; then DELIVERED (answered) or FAILED with ``reason``.
    outcome: Outcome | None = None
    reason: str = ""


class CallMachine(RuleBasedStateMachine):
    """Callers and one named group of service members, on a mock clock moved by jumps."""

    def __init__(self, nursery: trio.Nursery, clock: trio.testing.MockClock) -> None:
        super().__init__()
        self.clock = clock
        self.hub = Hub()
        self.scope: trio.CancelScope = trio.from_thread.run(nursery.start, self._serve)
        self.calls: list[Call] = []
        #: The group's queue: (call number, redelivered), in call order.
        self.queue: list[tuple[int, bool]] = []
        self.group = False
        #: Members' unacked: tag → (call number, the request body delivered).
        self.members: list[Member] = []
        self.settled_tags: list[tuple[Member, int]] = []

    async def _serve(self, task_status: trio.TaskStatus[trio.CancelScope]) -> None:
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.hub.run)
                task_status.started(scope)

    def live(self) -> list[Member]:
        return [x for x in self.members if x.open]

    def pick(self, i: int) -> Member:
        return self.live()[i % len(self.live())]

    def fail(self, c: Call, reason: str) -> None:
        if c.outcome is None:
            c.outcome, c.reason = FAILED, reason

    @initialize(members=st.integers(0, 3))
    def start(self, members: int) -> None:
        for _ in range(members):
            self.join()

    @precondition(lambda self: len(self.live()) < 4)
    @rule()
    def join(self) -> None:
        self.members.append(Member(sync(lambda: self.hub.subscribe("svc", "workers"))))
        self.group = True

    @rule(timeout=st.sampled_from((0.5, 1, 2, 3, 5)))
    def call(self, timeout: float) -> None:
        body = b"call-%d" % len(self.calls)
        now = sync(trio.current_time)
        receipt = trio.from_thread.run(self.hub.call, Message("svc", body), timeout)
        c = Call(body, timeout, now + timeout, receipt)
        receipt.add_done_callback(c.settled.append)
        if self.group:
            self.queue.append((len(self.calls), False))
        else:
            self.fail(c, "no subscriber to answer the call")
        self.calls.append(c)

    @rule(dt=st.sampled_from((0.5, 1, 2)))
    def advance(self, dt: float) -> None:
        sync(lambda: self.clock.jump(dt))
        trio.from_thread.run(settle)  # hub.run expires what is due
        now = sync(trio.current_time)
        for c in self.calls:
            if c.reply_by <= now:
                self.fail(c, f"no reply within {c.timeout:g}s")

    @precondition(lambda self: self.live())
    @rule(i=st.integers(0, 7), k=st.sampled_from((1, 2, None)))
    def receive(self, i: int, k: int | None) -> None:
        x = self.pick(i)
        expected = []
        while self.queue and (k is None or len(expected) < k):
            n, redelivered = self.queue.pop(0)
            if self.calls[n].outcome is None:  # else dropped: answered or expired
                expected.append((n, redelivered))
        got = trio.from_thread.run(receive_now, x.sub, k)
        assert [(d.tag, d.message.body, d.redelivered, d.reply_by) for d in got] == [
            (x.next_tag + j, self.calls[n].body, r, self.calls[n].reply_by)
            for j, (n, r) in enumerate(expected)
        ]
        for d, (n, _) in zip(got, expected, strict=True):
            x.unacked[d.tag] = (n, d.message.body)
        x.next_tag += len(got)

    @precondition(lambda self: any(x.unacked for x in self.live()))
    @rule(
        i=st.integers(0, 7),
        pick=st.integers(0, 7),
        how=st.sampled_from(("reply", "reply", "reply", "ack", "nack", "reject")),
    )
    def answer(self, i: int, pick: int, how: str) -> None:
        x = self.pick(i)
        if not x.unacked:
            return
        tag = sorted(x.unacked)[pick % len(x.unacked)]
        n, body = x.unacked.pop(tag)
        c = self.calls[n]
        if how == "reply":  # the service answers the request it was handed: an echo
            sync(lambda: x.sub.reply(tag, Reply(b"re:" + body)))
            if c.outcome is None:
                c.outcome = DELIVERED
        elif how == "ack":
            sync(lambda: x.sub.ack(tag))
            self.fail(c, "the call was settled without a reply")
        elif how == "nack":
            sync(lambda: x.sub.nack(tag))
            self.queue = sorted([*self.queue, (n, True)])
        else:
            sync(lambda: x.sub.nack(tag, requeue=False, reason="refused"))
            self.fail(c, "refused")
        self.settled_tags.append((x, tag))

    @precondition(lambda self: self.settled_tags)
    @rule(i=st.integers(0, 30))
    def reply_again(self, i: int) -> None:
        x, tag = self.settled_tags[i % len(self.settled_tags)]
        with pytest.raises(KeyError):
            sync(lambda: x.sub.reply(tag, Reply(b"again")))

    @precondition(lambda self: self.live())
    @rule(i=st.integers(0, 7))
    def leave(self, i: int) -> None:
        x = self.pick(i)
        sync(x.sub.close)
        x.open = False
        self.queue = sorted([*self.queue, *((n, True) for n, _ in x.unacked.values())])

    def drain(self) -> None:
        self.advance(5)
        assert all(c.outcome is not None for c in self.calls)

    @invariant()
    def matches_the_model(self) -> None:
        for c in self.calls:
            r = c.receipt
            assert (r.outcome, len(c.settled)) == (c.outcome, c.outcome is not None), c.body
            if c.outcome is DELIVERED:
                assert r.reply == Reply(b"re:" + c.body), "a reply reached the wrong caller"
                assert (r.results()[0].reply, r.reason) == (r.reply, "")
            elif c.outcome is not None:
                assert (r.reply, r.reason, r.results()[0].reason) == (None, c.reason, c.reason)
        assert sync(lambda: self.hub.inflight) == sum(c.outcome is None for c in self.calls)
        if self.group:
            g = sync(lambda: stats(self.hub, "svc"))["groups"]["workers"]
            live = self.live()
            unacked = sum(len(x.unacked) for x in live)
            assert (g["queued"], g["members"], g["held"]) == (
                len(self.queue),
                len(live),
                len(self.queue) + unacked,
            )

    def random_step(self, rnd: random.Random) -> None:
        ops = ("join", "call", "advance", "receive", "answer", "again", "leave")
        op = rnd.choices(ops, (1, 4, 2, 4, 5, 0.3, 1))[0]
        if op == "join" or not self.live():
            if len(self.live()) < 4:
                self.join()
        elif op == "call":
            self.call(rnd.choice((0.5, 1, 2, 3, 5)))
        elif op == "advance":
            self.advance(rnd.choice((0.5, 1, 2)))
        elif op == "receive":
            self.receive(rnd.randrange(8), rnd.choice((1, 2, None)))
        elif op == "answer" and any(x.unacked for x in self.live()):
            how = rnd.choice(("reply", "reply", "reply", "ack", "nack", "reject"))
            self.answer(rnd.randrange(8), rnd.randrange(8), how)
        elif op == "again" and self.settled_tags:
            self.reply_again(rnd.randrange(30))
        elif op == "leave":
            self.leave(rnd.randrange(8))

    def teardown(self) -> None:
        sync(self.scope.cancel)
        sync(self.hub.close)


def test_calls_with_deadlines_and_members_leaving_behave_like_the_model() -> None:
    clock = trio.testing.MockClock()
    in_thread(
        lambda nursery: run_state_machine_as_test(
            lambda: CallMachine(nursery, clock), settings=MACHINE_SETTINGS
        ),
        clock=clock,
    )


@pytest.mark.parametrize("seed", range(2))
def test_random_walks_of_calls(seed: int) -> None:
    clock = trio.testing.MockClock()
    in_thread(walks(lambda nursery: CallMachine(nursery, clock), seed, 20, 100), clock=clock)
