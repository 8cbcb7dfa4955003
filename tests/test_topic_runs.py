"""In-memory topics that keep each publish as a *run*, tested through the hub's API only.

A topic stores the messages of one publish together; a group's queue holds slices of
runs and a subscriber's unacked deliveries are slices with consecutive tags. The
semantics must stay those of single copies, so the first test drives a hub with random
operations and compares every answer with a plain per-copy reference model: the
deliveries (tags, messages, redelivered flags), the ``KeyError`` of a bad ack, the
counters of ``stats()``, ``credit``/``unacked``, ``inflight`` and every receipt.
The other tests cover what a random walk reaches rarely: runs of thousands of
messages, fan-out with a group leaving mid-run, the backlog, and publishers that wait.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from harness import Task, receive_now, settle, start
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

from gateway.core.destination import Delivery, Subscription
from gateway.core.hub import Hub, HubLimits
from gateway.core.model import MESSAGE_OVERHEAD, Message, Outcome
from gateway.core.receipts import Receipt, Result

# -- helpers ------------------------------------------------------------------------


SIZE = 250


def msg(n: int, size: int = SIZE, headers: Mapping[str, str] | None = None) -> Message:
    """Message number ``n`` for topic ``t``, padded so that ``Message.size == size``."""
    body = b"%d." % n
    extra = sum(len(k) + len(v) for k, v in headers.items()) if headers else 0
    body = body.ljust(size - MESSAGE_OVERHEAD - extra, b".")
    if headers:
        return Message("t", body, headers)
    return Message("t", body)


def number(d: Delivery) -> int:
    return int(d.message.body.split(b".")[0])


def numbers(deliveries: Sequence[Delivery]) -> list[int]:
    return [number(d) for d in deliveries]


def tags(deliveries: Sequence[Delivery]) -> list[int]:
    return [d.tag for d in deliveries]


def stats_of(hub: Hub) -> dict[str, Any]:
    return hub.destination("t").stats()


def group_stats(hub: Hub, group: str | None = None) -> dict[str, Any]:
    groups: dict[str, dict[str, Any]] = stats_of(hub)["groups"]
    if group is None:
        (only,) = groups.values()
        return only
    return groups[group]


def held(hub: Hub, group: str | None = None) -> tuple[int, int, int]:
    """(queued, held, held_bytes) of a group."""
    g = group_stats(hub, group)
    return g["queued"], g["held"], g["held_bytes"]


def unwrap(fn: Callable[[], None]) -> None:
    """Run ``fn``; report a lone exception, not the nursery's group around it."""
    try:
        fn()
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


# -- a per-copy reference model -------------------------------------------------------
#
# The model keeps one object per copy, as the topic did before runs: a group's queue
# is a list of copies, a member's unacked deliveries a dict from tag to copy. Copy
# number ``n`` is message number ``n``; messages are numbered in publish order, which
# is the topic's order (only one publisher runs at a time).

BUFFER_MESSAGES = 20
BUFFER_BYTES = 9000
OVERSIZE = BUFFER_BYTES + 1
SIZES = (220, 260, 300, 450, 700)
NAMED = ("a", "b", "c")


def _run(count: int, sizes: list[int], oversize: int | None) -> list[int]:
    """The sizes of one publish; an oversize message (rejected) makes it go one by one."""
    run = sizes[:count]
    if oversize is not None and oversize < count:
        run[oversize] = OVERSIZE
    return run


#: The sizes of the messages of one publish (1-6 messages).
RUNS = st.builds(
    _run,
    st.integers(1, 6),
    st.lists(st.sampled_from(SIZES), min_size=6, max_size=6),
    st.sampled_from((None,) * 10 + tuple(range(6))),
)


@dataclass
class _MCopy:
    n: int
    redelivered: bool = False


@dataclass
class _MGroup:
    anonymous: bool
    queue: list[_MCopy] = field(default_factory=list)
    held: int = 0
    held_bytes: int = 0
    members: int = 0


@dataclass
class _MPublish:
    numbers: list[int]
    #: Messages the publisher has not stored yet (it waits for room).
    waiting: list[int]
    task: Task
    legs: int = 0
    worst: Outcome = Outcome.DELIVERED
    #: Each message's own worst outcome, where it is not DELIVERED.
    results: dict[int, Outcome] = field(default_factory=dict)

    def worsen(self, n: int, outcome: Outcome) -> None:
        self.worst = max(self.worst, outcome)
        self.results[n] = max(self.results.get(n, Outcome.DELIVERED), outcome)

    @property
    def finished(self) -> bool:
        return not self.waiting

    @property
    def settled(self) -> bool:
        return self.finished and self.legs == 0


@dataclass
class _MMember:
    sub: Subscription
    key: str
    credit: int | None
    max_unacked: int
    max_unacked_bytes: int | None
    unacked: dict[int, _MCopy] = field(default_factory=dict)
    unacked_bytes: int = 0
    next_tag: int = 1
    settled_tags: list[int] = field(default_factory=list)
    open: bool = True


class _Model:
    def __init__(self) -> None:
        self.groups: dict[str, _MGroup] = {}
        self.backlog = _MGroup(anonymous=False)
        self.sizes: list[int] = []
        self.publish_of: list[int] = []
        self.publishes: list[_MPublish] = []
        #: Groups holding a copy of message n, for messages stored in more than one.
        self.fanout: dict[int, int] = {}
        #: Messages published while no group existed: settled at once, stored nowhere.
        self.discarded = 0

    # publishing
    def targets(self) -> list[_MGroup]:
        """Every group; none (not the backlog) when there is no group."""
        return list(self.groups.values())

    def pump(self) -> None:
        """The publisher stores what fits, one message at a time (as a run, when all fit
        at once: the same copies in the same order). With no group, a message is
        discarded: delivered without a leg, however full the backlog is."""
        if not self.publishes:
            return
        p = self.publishes[-1]
        while p.waiting:
            n = p.waiting[0]
            size = self.sizes[n]
            targets = self.targets()
            if size > BUFFER_BYTES:
                p.worsen(n, Outcome.REJECTED)
            elif not targets:
                self.discarded += 1
            else:
                if not all(
                    g.held < BUFFER_MESSAGES and g.held_bytes + size <= BUFFER_BYTES
                    for g in targets
                ):
                    return
                p.legs += len(targets)
                if len(targets) > 1:
                    self.fanout[n] = len(targets)
                for g in targets:
                    g.queue.append(_MCopy(n))
                    g.held += 1
                    g.held_bytes += size
            p.waiting.pop(0)

    def leg(self, n: int, outcome: Outcome | None) -> None:
        p = self.publishes[self.publish_of[n]]
        p.legs -= 1
        assert p.legs >= 0
        if outcome is not None:
            p.worsen(n, outcome)

    # subscribing
    def group(self, key: str, anonymous: bool) -> _MGroup:
        g = self.groups.get(key)
        if g is None:
            g = _MGroup(anonymous)
            if not self.groups and self.backlog.queue:
                # The first group adopts what the last anonymous group left behind.
                g, self.backlog = self.backlog, _MGroup(anonymous=False)
                g.anonymous = anonymous
            self.groups[key] = g
        return g

    def receive(self, m: _MMember, max_count: int | None) -> list[tuple[int, int, bool]]:
        g = self.groups[m.key]
        n = m.max_unacked - len(m.unacked)
        if m.credit is not None:
            n = min(n, m.credit)
        if max_count is not None:
            n = min(n, max_count)
        out: list[tuple[int, int, bool]] = []
        while len(out) < n and g.queue:
            c = g.queue[0]
            size = self.sizes[c.n]
            # A copy larger than the whole byte window goes alone.
            if (
                m.max_unacked_bytes is not None
                and m.unacked
                and m.unacked_bytes + size > m.max_unacked_bytes
            ):
                break
            g.queue.pop(0)
            tag = m.next_tag
            m.next_tag += 1
            m.unacked[tag] = c
            m.unacked_bytes += size
            out.append((tag, c.n, c.redelivered))
        if m.credit is not None:
            m.credit -= len(out)
        return out

    def _release(self, m: _MMember, tag: int) -> _MCopy:
        c = m.unacked.pop(tag)
        m.unacked_bytes -= self.sizes[c.n]
        m.settled_tags.append(tag)
        return c

    def _free(self, g: _MGroup, c: _MCopy) -> None:
        g.held -= 1
        g.held_bytes -= self.sizes[c.n]

    def ack_many(self, m: _MMember, chosen: Sequence[int]) -> int | None:
        """Ack ``chosen`` in order; the index of the first bad tag (KeyError), or None."""
        g = self.groups[m.key]
        for i, tag in enumerate(chosen):
            if tag not in m.unacked:
                return i
            c = self._release(m, tag)
            self._free(g, c)
            self.leg(c.n, Outcome.DELIVERED)
        return None

    def nack(self, m: _MMember, tag: int, requeue: bool, outcome: Outcome) -> None:
        g = self.groups[m.key]
        c = self._release(m, tag)
        if requeue:
            c.redelivered = True
            self.return_in_order(g, [c])
        else:
            self._free(g, c)
            self.leg(c.n, outcome)

    def close(self, m: _MMember) -> None:
        g = self.groups[m.key]
        returned = list(m.unacked.values())
        m.unacked.clear()
        m.unacked_bytes = 0
        for c in returned:
            c.redelivered = True
        if returned:
            self.return_in_order(g, returned)
        m.open = False
        g.members -= 1
        if g.anonymous and not g.members:
            self.leave(m.key)

    def leave(self, key: str) -> None:
        g = self.groups.pop(key)
        heir = next(iter(self.groups.values()), self.backlog)
        moved: list[_MCopy] = []
        for c in g.queue:
            if self.fanout.get(c.n, 1) > 1:
                self.fanout[c.n] -= 1
                self.leg(c.n, None)
            else:
                moved.append(c)
        if moved:
            self.return_in_order(heir, moved)
            heir.held += len(moved)
            heir.held_bytes += sum(self.sizes[c.n] for c in moved)

    @staticmethod
    def return_in_order(g: _MGroup, copies: list[_MCopy]) -> None:
        """The per-copy rule: the returned copies and the head of the queue older than
        the newest of them are merged in publish order."""
        copies.sort(key=lambda c: c.n)
        newest = copies[-1].n
        head: list[_MCopy] = []
        while g.queue and g.queue[0].n < newest:
            head.append(g.queue.pop(0))
        head += copies
        head.sort(key=lambda c: c.n)
        g.queue[:0] = head

    def stats(self) -> dict[str, Any]:
        return {
            "kind": "topic",
            "backlog": len(self.backlog.queue),
            "discarded": self.discarded,
            "filtered": 0,
            "groups": {
                key: {
                    "queued": len(g.queue),
                    "held_bytes": g.held_bytes,
                    "held": g.held,
                    "members": g.members,
                }
                for key, g in self.groups.items()
            },
        }


# -- the state machine ----------------------------------------------------------------


class TopicRunsMachine(RuleBasedStateMachine):
    """Drives one hub (in a trio run on another thread) and the model side by side.

    Every call into the hub runs in the trio thread (``trio.from_thread``); after each
    step the test waits until every task is blocked, so the one publisher that may be
    waiting for room has done all it can.
    """

    def __init__(self, nursery: trio.Nursery) -> None:
        super().__init__()
        self.nursery = nursery
        self.hub = Hub(limits=HubLimits(buffer_bytes=BUFFER_BYTES, buffer_messages=BUFFER_MESSAGES))
        self.model = _Model()
        self.members: list[_MMember] = []
        # Model-independent checks, per group key: copies settled there, delivered
        # now (to any member), delivered ever.
        self.settled_in: dict[str, set[int]] = {}
        self.outstanding: dict[str, set[int]] = {}
        self.seen: dict[str, set[int]] = {}
        #: Steps since the last drain (a drain is many steps: not too often).
        self.steps = 0

    # plumbing
    def sync(self, fn: Callable[[], Any]) -> Any:
        return trio.from_thread.run_sync(fn)

    def after(self) -> None:
        self.steps += 1
        trio.from_thread.run(settle)
        self.model.pump()
        if self.model.publishes:
            p = self.model.publishes[-1]
            assert p.task.error is None, f"publisher failed: {p.task.error!r}"
            assert p.task.done == p.finished, (
                f"publisher done={p.task.done}, but the model has {p.waiting} still waiting"
            )

    def open_members(self) -> list[_MMember]:
        return [m for m in self.members if m.open]

    def pick(self, index: int) -> _MMember:
        live = self.open_members()
        return live[index % len(live)]

    def publishing(self) -> bool:
        return bool(self.model.publishes) and not self.model.publishes[-1].finished

    def has_members(self) -> bool:
        return bool(self.open_members())

    def join(
        self,
        group: str | None,
        credit: int | None = None,
        max_unacked: int = 1024,
        max_unacked_bytes: int | None = None,
    ) -> _MMember:
        before = set(self.sync(lambda: stats_of(self.hub))["groups"])
        sub = self.sync(
            lambda: self.hub.subscribe(
                "t",
                group,
                credit=credit,
                max_unacked=max_unacked,
                max_unacked_bytes=max_unacked_bytes,
            )
        )
        if group is None:
            (key,) = set(self.sync(lambda: stats_of(self.hub))["groups"]) - before
        else:
            key = group
        assert sub.credit == credit
        self.model.group(key, anonymous=group is None).members += 1
        m = _MMember(sub, key, credit, max_unacked, max_unacked_bytes)
        self.members.append(m)
        for table in (self.settled_in, self.outstanding, self.seen):
            table.setdefault(key, set())
        self.after()
        return m

    def do_receive(self, m: _MMember, max_count: int | None) -> list[Delivery]:
        got: list[Delivery] = trio.from_thread.run(receive_now, m.sub, max_count)
        expected = self.model.receive(m, max_count)
        actual = [(d.tag, number(d), d.redelivered) for d in got]
        assert actual == expected, "deliveries (tag, message, redelivered) differ from the model"
        key = m.key
        for d in got:
            n = number(d)
            assert d.message == msg(n, self.model.sizes[n])
            assert n not in self.outstanding[key], f"{n} delivered twice at once in {key}"
            assert n not in self.settled_in[key], f"{n} delivered again after it settled in {key}"
            if n in self.seen[key]:
                assert d.redelivered, f"redelivery of {n} in {key} not flagged"
            self.seen[key].add(n)
            self.outstanding[key].add(n)
        self.after()
        return got

    def settled_here(self, m: _MMember, n: int) -> None:
        self.outstanding[m.key].discard(n)
        self.settled_in[m.key].add(n)

    def do_ack_many(self, m: _MMember, chosen: list[int]) -> None:
        copies = {tag: c.n for tag, c in m.unacked.items()}
        bad = self.model.ack_many(m, chosen)
        try:
            self.sync(lambda: m.sub.ack_many(iter(chosen)))
        except KeyError:
            assert bad is not None, f"ack_many({chosen}) raised KeyError with no bad tag"
        else:
            assert bad is None, f"ack_many({chosen}) accepted bad tag {chosen[bad]}"
        for tag in chosen[: len(chosen) if bad is None else bad]:
            self.settled_here(m, copies[tag])
        self.after()

    def do_close(self, m: _MMember) -> None:
        self.sync(m.sub.close)
        for c in m.unacked.values():
            self.outstanding[m.key].discard(c.n)
        self.model.close(m)
        self.after()

    # rules
    @initialize(
        configs=st.lists(
            st.tuples(
                st.sampled_from((None, *NAMED)),
                st.sampled_from((None, None, 0, 2, 5)),
                st.sampled_from((1, 3, 8, 1024)),
                st.sampled_from((None, None, 450, 1000)),
            ),
            max_size=3,
        ),
        runs=st.lists(RUNS, max_size=3),
        left=st.one_of(
            st.none(),
            st.tuples(
                st.lists(RUNS, min_size=1, max_size=2),
                st.sampled_from((None, 0, 1, 3, 8)),
                st.integers(0, 4),
            ),
        ),
    )
    def start_with(
        self,
        configs: list[tuple[str | None, int | None, int, int | None]],
        runs: list[list[int]],
        left: tuple[list[list[int]], int | None, int] | None,
    ) -> None:
        """Some subscribers and some runs to begin with (before or after them; a run
        published before any group is discarded). First, maybe, an anonymous subscriber
        that takes runs, receives and acks some and leaves: the rest waits in the
        backlog for the first group, and runs published meanwhile are discarded."""
        if left is not None:
            leaver_runs, taken, acked = left
            leaver = self.join(None)
            for sizes in leaver_runs:
                if not self.publishing():
                    self.publish(sizes)
            got = self.do_receive(leaver, taken)
            if got and acked:
                self.do_ack_many(leaver, tags(got)[:acked])
            self.do_close(leaver)
        for i, config in enumerate(configs):
            if i < len(runs) and not self.publishing():
                self.publish(runs[i])
            self.join(*config)
        for sizes in runs[len(configs) :]:
            if not self.publishing():
                self.publish(sizes)

    @precondition(lambda self: len(self.open_members()) < 6)
    @rule(
        group=st.sampled_from((None, *NAMED)),
        credit=st.sampled_from((None, None, 0, 2, 5)),
        max_unacked=st.sampled_from((1, 3, 8, 1024)),
        max_unacked_bytes=st.sampled_from((None, None, 450, 1000)),
        declare_only=st.booleans(),
    )
    def subscribe(
        self,
        group: str | None,
        credit: int | None,
        max_unacked: int,
        max_unacked_bytes: int | None,
        declare_only: bool,
    ) -> None:
        if declare_only and group is not None:
            # A named group without members collects (and may adopt the backlog).
            self.sync(lambda: self.hub.destination("t").declare_group(group))
            self.model.group(group, anonymous=False)
            for table in (self.settled_in, self.outstanding, self.seen):
                table.setdefault(group, set())
            self.after()
        else:
            self.join(group, credit, max_unacked, max_unacked_bytes)

    @precondition(lambda self: not self.publishing())
    @rule(sizes=RUNS)
    def publish(self, sizes: list[int]) -> None:
        first = len(self.model.sizes)
        nums = list(range(first, first + len(sizes)))
        messages = [msg(n, size) for n, size in zip(nums, sizes, strict=True)]
        self.model.sizes += sizes
        self.model.publish_of += [len(self.model.publishes)] * len(sizes)
        task = self.sync(lambda: start(self.nursery, self.hub.publish, messages))
        self.model.publishes.append(_MPublish(nums, list(nums), task))
        self.after()

    @precondition(lambda self: self.has_members())
    @rule(index=st.integers(0, 11), max_count=st.sampled_from((None, 0, 1, 2, 3, 5, 8)))
    def receive(self, index: int, max_count: int | None) -> None:
        self.do_receive(self.pick(index), max_count)

    @precondition(lambda self: self.has_members())
    @rule(
        index=st.integers(0, 11),
        mode=st.sampled_from(
            ("all", "prefix", "suffix", "middle", "reversed", "shuffled", "mixed", "mixed")
        ),
        k=st.integers(0, 40),
        i=st.integers(0, 40),
        picks=st.lists(st.integers(0, 60), min_size=1, max_size=10),
    )
    def ack_many(self, index: int, mode: str, k: int, i: int, picks: list[int]) -> None:
        """Ack several deliveries in one call: consecutive runs of tags, other orders, and
        lists with duplicates, settled or unknown tags (KeyError after the good ones)."""
        m = self.pick(index)
        unacked = sorted(m.unacked)
        bad = [0, -1, m.next_tag, m.next_tag + 2, *m.settled_tags[-4:]]
        if not unacked:
            mode = "mixed"
        k = 1 + k % max(1, len(unacked))
        chosen: list[int]
        if mode == "all":
            chosen = unacked
        elif mode == "reversed":
            chosen = unacked[::-1]
        elif mode == "shuffled":
            chosen = list(unacked)
            random.Random(i).shuffle(chosen)
        elif mode == "prefix":
            chosen = unacked[:k]
        elif mode == "suffix":
            chosen = unacked[-k:]
        elif mode == "middle":
            start = i % (len(unacked) - k + 1)
            chosen = unacked[start : start + k]
        else:
            pool = unacked + bad
            chosen = [pool[p % len(pool)] for p in picks]
        self.do_ack_many(m, chosen)

    @precondition(lambda self: self.has_members())
    @rule(
        index=st.integers(0, 11),
        which=st.integers(0, 50),
        requeue=st.booleans(),
        outcome=st.sampled_from((Outcome.FAILED, Outcome.REJECTED)),
        bad=st.sampled_from((None, None, None, "settled", "unknown")),
    )
    def nack(
        self, index: int, which: int, requeue: bool, outcome: Outcome, bad: str | None
    ) -> None:
        m = self.pick(index)
        if bad is not None or not m.unacked:
            # A settled or unknown tag: KeyError, and nothing changes.
            tag = m.settled_tags[-1] if bad == "settled" and m.settled_tags else m.next_tag
            with pytest.raises(KeyError):
                self.sync(lambda: m.sub.nack(tag, requeue=requeue, outcome=outcome))
            self.after()
            return
        tag = sorted(m.unacked)[which % len(m.unacked)]
        n = m.unacked[tag].n
        self.sync(lambda: m.sub.nack(tag, requeue=requeue, outcome=outcome, reason=outcome.name))
        self.model.nack(m, tag, requeue, outcome)
        self.outstanding[m.key].discard(n)
        if not requeue:
            self.settled_in[m.key].add(n)
        self.after()

    @precondition(lambda self: self.has_members())
    @rule(index=st.integers(0, 11), n=st.integers(0, 5))
    def grant(self, index: int, n: int) -> None:
        m = self.pick(index)
        self.sync(lambda: m.sub.grant(n))
        if m.credit is not None:
            m.credit += n
        self.after()

    @precondition(lambda self: self.has_members())
    @rule(index=st.integers(0, 11))
    def close(self, index: int) -> None:
        self.do_close(self.pick(index))

    @precondition(lambda self: self.steps >= 20)
    @rule()
    def drain(self) -> None:
        """Close everyone, then drain every group: every receipt must settle."""
        for m in self.open_members():
            self.do_close(m)
        drainers = [self.join(key) for key in list(self.model.groups)]
        if not drainers and self.model.backlog.queue:
            drainers.append(self.join(None))
        for _ in range(200):
            progress = False
            for m in drainers:
                got = self.do_receive(m, None)
                if got:
                    self.do_ack_many(m, tags(got))
                    progress = True
            if not progress and not self.publishing():
                break
        assert not self.publishing(), "the publisher is still waiting after a drain"
        assert all(p.settled for p in self.model.publishes)
        stats = self.sync(lambda: stats_of(self.hub))
        assert stats["backlog"] == 0
        for g in stats["groups"].values():
            assert (g["queued"], g["held"], g["held_bytes"]) == (0, 0, 0)
        assert self.sync(lambda: self.hub.inflight) == 0
        self.steps = 0

    # checks after every step
    @invariant()
    def matches_the_model(self) -> None:
        actual = self.sync(lambda: stats_of(self.hub))
        expected = self.model.stats()
        assert actual == expected, "stats() differ from the model"
        assert list(actual["groups"]) == list(expected["groups"]), "group order"
        for m in self.open_members():
            assert m.sub.unacked == len(m.unacked)
            assert m.sub.credit == m.credit
        for i, p in enumerate(self.model.publishes):
            if not p.task.done:
                continue
            receipt: Receipt = p.task.result
            assert receipt.done() == p.settled, (
                f"receipt of publish {i} ({p.numbers}): done={receipt.done()}, "
                f"the model has {p.legs} legs pending"
            )
            if p.settled:
                assert receipt.outcome is p.worst, f"receipt of publish {i}"
                # Each message's own result: its worst nack (reason: the outcome's
                # name), REJECTED when oversize, else the plain delivered Result().
                for j, (n, result) in enumerate(zip(p.numbers, receipt.results(), strict=True)):
                    outcome = p.results.get(n, Outcome.DELIVERED)
                    assert result.outcome is outcome, f"result {j} of publish {i}"
                    if outcome is Outcome.DELIVERED:
                        assert result == Result()
                    elif self.model.sizes[n] > BUFFER_BYTES:
                        assert "exceeds the buffer" in result.reason
                    else:
                        assert result.reason == outcome.name
        inflight = sum(not p.settled for p in self.model.publishes)
        assert self.sync(lambda: self.hub.inflight) == inflight

    def teardown(self) -> None:
        # Wake a publisher still waiting for room; it ends with ClosedResourceError.
        self.sync(self.hub.close)
        trio.from_thread.run(settle)


MODEL_SETTINGS = settings(
    max_examples=100,
    stateful_step_count=50,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)


def test_runs_behave_like_single_copies() -> None:
    """Random publishes of 1-6 messages, receives, acks in any order (with bad tags),
    nacks, credit, byte windows, closes and drains: every answer equals the model's."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await trio.to_thread.run_sync(
                lambda: run_state_machine_as_test(
                    lambda: TopicRunsMachine(nursery), settings=MODEL_SETTINGS
                )
            )
            nursery.cancel_scope.cancel()

    unwrap(lambda: trio.run(main))


def _walk(machine: TopicRunsMachine, rnd: random.Random, steps: int) -> None:
    """``steps`` random operations, weighted towards receiving and acking."""
    ops = ("publish", "receive", "ack_many", "nack", "close", "subscribe", "grant")
    weights = (4, 6, 4, 2, 1, 2, 1)
    machine.matches_the_model()
    for _ in range(steps):
        op = rnd.choices(ops, weights)[0]
        if op == "subscribe" or not machine.has_members():
            if len(machine.open_members()) < 6:
                machine.subscribe(
                    rnd.choice((None, *NAMED)),
                    rnd.choice((None, None, 0, 2, 5)),
                    rnd.choice((1, 3, 8, 1024)),
                    rnd.choice((None, None, 450, 1000)),
                    declare_only=rnd.random() < 0.1,
                )
        elif op == "publish":
            if not machine.publishing():
                count = rnd.randint(1, 6)
                oversize = rnd.randrange(6) if rnd.random() < 0.1 else None
                machine.publish(_run(count, rnd.choices(SIZES, k=6), oversize))
        elif op == "receive":
            machine.receive(rnd.randrange(12), rnd.choice((None, None, 1, 2, 3, 5, 8)))
        elif op == "ack_many":
            mode = rnd.choice(
                ("all", "prefix", "suffix", "middle", "reversed", "shuffled", "mixed")
            )
            picks = [rnd.randrange(60) for _ in range(rnd.randint(1, 10))]
            machine.ack_many(rnd.randrange(12), mode, rnd.randrange(40), rnd.randrange(40), picks)
        elif op == "nack":
            machine.nack(
                rnd.randrange(12),
                rnd.randrange(50),
                rnd.random() < 0.6,
                rnd.choice((Outcome.FAILED, Outcome.REJECTED)),
                rnd.choice((None,) * 8 + ("settled", "unknown")),
            )
        elif op == "close":
            machine.close(rnd.randrange(12))
        else:
            machine.grant(rnd.randrange(12), rnd.randint(0, 5))
        machine.matches_the_model()
    machine.drain()
    machine.matches_the_model()


@pytest.mark.parametrize("seed", range(4))
def test_long_random_walks_behave_like_single_copies(seed: int) -> None:
    """Longer, weighted random walks through the same machine (fixed seeds): more of
    them split runs, settle leases partly and close with partly acked leases."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:

            def walks() -> None:
                rnd = random.Random(seed)
                for _ in range(25):
                    machine = TopicRunsMachine(nursery)
                    try:
                        _walk(machine, rnd, 80)
                    finally:
                        machine.teardown()

            await trio.to_thread.run_sync(walks)
            nursery.cancel_scope.cancel()

    unwrap(lambda: trio.run(main))


# -- large runs -----------------------------------------------------------------------

LARGE = 10_000


def large_run(headers_every: int = 0) -> list[Message]:
    """A publish of LARGE messages of uneven sizes; some with headers when asked."""
    return [
        msg(
            i,
            size=MESSAGE_OVERHEAD + 10 + (i * 37) % 301,
            headers={"h": "x" * (i % 5)} if headers_every and i % headers_every == 0 else None,
        )
        for i in range(LARGE)
    ]


async def receive_in_chunks(sub: Subscription, n: int, chunks: Sequence[int]) -> list[Delivery]:
    got: list[Delivery] = []
    i = 0
    while len(got) < n:
        part = await receive_now(sub, chunks[i % len(chunks)])
        assert part, f"nothing to receive after {len(got)} of {n}"
        assert len(part) <= chunks[i % len(chunks)]
        got += part
        i += 1
    return got


async def test_large_run_in_uneven_chunks_acked_in_reverse() -> None:
    hub = Hub()
    sub = hub.subscribe("t", max_unacked=2 * LARGE)
    messages = large_run(headers_every=1000)
    sizes = [m.size for m in messages]
    total = sum(sizes)
    receipt = await hub.publish(messages)
    assert held(hub) == (LARGE, LARGE, total)
    got = await receive_in_chunks(sub, LARGE, [1, 7, 300, 2, 1499, 3, 4096])
    assert [d.message for d in got] == messages
    assert tags(got) == list(range(1, LARGE + 1))
    assert not any(d.redelivered for d in got)
    assert await receive_now(sub) == []
    assert held(hub) == (0, LARGE, total)
    assert sub.unacked == LARGE
    remaining = total
    for k, d in enumerate(reversed(got), 1):
        sub.ack(d.tag)
        remaining -= sizes[number(d)]
        if k % 997 == 0:
            assert held(hub) == (0, LARGE - k, remaining)
            assert sub.unacked == LARGE - k
            assert not receipt.done()
    assert receipt.outcome is Outcome.DELIVERED
    assert held(hub) == (0, 0, 0)
    assert sub.unacked == 0
    assert hub.inflight == 0
    with pytest.raises(KeyError):
        sub.ack(got[LARGE // 2].tag)


async def test_large_run_acked_in_random_batches_with_nacks_and_bad_tags() -> None:
    rnd = random.Random(10_000)
    hub = Hub()
    sub = hub.subscribe("t", max_unacked=2 * LARGE)
    messages = large_run()
    sizes = [m.size for m in messages]
    receipt = await hub.publish(messages)
    got = await receive_in_chunks(sub, LARGE, [4095, 1, 2, 3, 999])
    order = list(got)
    rnd.shuffle(order)
    pending = {d.tag: d for d in got}
    # Some deliveries are nacked (requeued) on the way: they come back first, flagged.
    requeued = {d.tag for d in rnd.sample(got, 50)}
    cuts = [0, *sorted(rnd.sample(range(1, LARGE), 40)), LARGE]
    seen: set[int] = set()
    for lo, hi in itertools.pairwise(cuts):
        batch = order[lo:hi]
        seen.update(d.tag for d in batch)
        acks = [d.tag for d in batch if d.tag not in requeued]
        if len(acks) > 3 and rnd.random() < 0.3:
            # A settled tag in the middle: the ones before it settle, the rest do not.
            settled = next(iter(set(range(1, LARGE + 1)) - set(pending)), None)
            if settled is not None:
                cut = len(acks) // 2
                with pytest.raises(KeyError, match=rf"\btag {settled}\b"):
                    sub.ack_many([*acks[:cut], settled, *acks[cut:]])
                for tag in acks[:cut]:
                    del pending[tag]
                acks = acks[cut:]
        sub.ack_many(acks)
        for tag in acks:
            del pending[tag]
        for d in batch:
            if d.tag in requeued:
                sub.nack(d.tag)
                del pending[d.tag]
        assert sub.unacked == len(pending)
        queued, count, nbytes = held(hub)
        assert queued == len([t for t in requeued if t in seen])
        assert count == len(pending) + queued
        assert nbytes == sum(sizes[number(d)] for d in pending.values()) + sum(
            sizes[number(got[t - 1])] for t in requeued if t in seen
        )
    assert not pending
    assert not receipt.done()
    again = await receive_now(sub)
    assert sorted(numbers(again)) == sorted(number(got[t - 1]) for t in requeued)
    assert all(d.redelivered for d in again)
    sub.ack_many(d.tag for d in again)
    assert receipt.outcome is Outcome.DELIVERED
    assert held(hub) == (0, 0, 0)
    assert hub.inflight == 0


async def test_large_run_partly_acked_then_closed_redelivers_the_rest_in_order() -> None:
    rnd = random.Random(3)
    hub = Hub()
    first = hub.subscribe("t", "g", max_unacked=2 * LARGE)
    messages = large_run()
    receipt = await hub.publish(messages)
    got = await receive_in_chunks(first, 6000, [1000, 1, 998, 1, 1000, 3000])
    acked = sorted(rnd.sample(range(6000), 3500))
    # Acked in runs of consecutive tags and singly, out of order.
    runs = [acked[i : i + 40] for i in range(0, len(acked), 40)]
    rnd.shuffle(runs)
    for part in runs:
        first.ack_many(got[i].tag for i in part)
    first.close()
    unacked = sorted(set(range(6000)) - set(acked))
    second = hub.subscribe("t", "g", max_unacked=2 * LARGE)
    rest = await receive_in_chunks(second, LARGE - len(acked), [LARGE])
    assert numbers(rest) == unacked + list(range(6000, LARGE))
    assert [d.redelivered for d in rest] == [True] * len(unacked) + [False] * (LARGE - 6000)
    assert not receipt.done()
    second.ack_many(d.tag for d in rest)
    assert receipt.outcome is Outcome.DELIVERED
    assert held(hub, "g") == (0, 0, 0)


async def test_large_run_through_a_byte_window() -> None:
    hub = Hub()
    window = 50_000
    sub = hub.subscribe("t", max_unacked=2 * LARGE, max_unacked_bytes=window)
    messages = large_run()
    sizes = [m.size for m in messages]
    receipt = await hub.publish(messages)
    received: list[Delivery] = []
    while len(received) < LARGE:
        got = await receive_now(sub)
        assert got
        start_ = len(received)
        nbytes = sum(sizes[start_ : start_ + len(got)])
        assert nbytes <= window
        # As many as fit: the next one would not have.
        if start_ + len(got) < LARGE:
            assert nbytes + sizes[start_ + len(got)] > window
        assert await receive_now(sub) == [], "received past the byte window"
        received += got
        # Ack all but the last delivery: the window then holds just that one.
        sub.ack_many(d.tag for d in got[:-1])
        sub.ack(got[-1].tag)
    assert numbers(received) == list(range(LARGE))
    assert receipt.outcome is Outcome.DELIVERED


async def test_large_run_fanned_out_to_two_groups() -> None:
    hub = Hub()
    a = hub.subscribe("t", "a", max_unacked=2 * LARGE)
    b = hub.subscribe("t", "b", max_unacked=2 * LARGE)
    messages = large_run()
    total = sum(m.size for m in messages)
    receipt = await hub.publish(messages)
    got_a = await receive_in_chunks(a, LARGE, [LARGE])
    a.ack_many(d.tag for d in got_a)
    assert held(hub, "a") == (0, 0, 0)
    assert held(hub, "b") == (LARGE, LARGE, total)
    assert not receipt.done()
    got_b = await receive_in_chunks(b, LARGE, [5000, 1, 4999])
    b.ack_many(reversed(tags(got_b)))
    assert receipt.outcome is Outcome.DELIVERED
    assert hub.inflight == 0


# -- fan-out: a group leaving mid-run -----------------------------------------------------


async def test_anonymous_group_leaving_mid_run_settles_its_copies_neutral() -> None:
    """Three groups share a run; the anonymous one leaves with some copies acked, some
    delivered (one nacked back) and some queued. Its copies settle neutral; the named
    groups are untouched, and the receipt waits for them alone."""
    hub = Hub()
    a = hub.subscribe("t", "a")
    anon = hub.subscribe("t")
    b = hub.subscribe("t", "b")
    messages = [msg(i) for i in range(40)]
    receipt = await hub.publish(messages)
    got_a = await receive_now(a, 25)
    a.ack_many(tags(got_a[:10]))
    a.ack_many(reversed(tags(got_a[15:25])))
    got_anon = await receive_now(anon, 30)
    anon.ack_many(tags(got_anon[5:12]))
    anon.nack(got_anon[0].tag)
    anon.nack(got_anon[20].tag, requeue=False, outcome=Outcome.FAILED, reason="anon")
    before = stats_of(hub)["groups"]
    anon.close()
    after = stats_of(hub)["groups"]
    assert list(after) == ["a", "b"], "the anonymous group is gone"
    assert after == {k: v for k, v in before.items() if k in ("a", "b")}
    assert held(hub, "a") == (15, 20, 20 * SIZE)
    assert not receipt.done()
    # a gets the rest of its copies (not redelivered), b all of its own.
    rest_a = await receive_now(a)
    assert numbers(rest_a) == list(range(25, 40))
    assert not any(d.redelivered for d in rest_a)
    a.ack_many(tags(got_a[10:15]) + tags(rest_a))
    got_b = await receive_now(b)
    assert numbers(got_b) == list(range(40))
    assert not receipt.done()
    b.ack_many(tags(got_b))
    # The leaving group's nack without requeue still counts: the worst outcome wins.
    assert receipt.outcome is Outcome.FAILED
    assert receipt.reason == "anon"
    assert hub.inflight == 0


async def test_anonymous_group_leaving_moves_only_copies_to_the_first_remaining_group() -> None:
    """The first run went to the anonymous group alone (its copies are the only ones):
    they move to the first remaining group, in publish order, flagged where they were
    delivered. Copies of the second run, which every group got, settle neutral."""
    hub = Hub()
    anon = hub.subscribe("t")
    r1 = await hub.publish([msg(i) for i in range(20)])
    late = hub.subscribe("t", "late")
    other = hub.subscribe("t", "other")
    r2 = await hub.publish([msg(i) for i in range(20, 30)])
    got = await receive_now(anon, 25)
    assert numbers(got) == list(range(25))
    anon.ack_many(tags(got[3:8]))
    anon.ack(got[21].tag)
    anon.nack(got[1].tag)  # requeued: queued again, flagged
    anon.close()
    assert held(hub, "late") == (10 + 15, 10 + 15, (10 + 15) * SIZE)
    assert held(hub, "other") == (10, 10, 10 * SIZE)
    moved = await receive_now(late)
    expected_moved = [0, 1, 2, *range(8, 20)]
    assert numbers(moved) == [*expected_moved, *range(20, 30)]
    # 0..2 and 8..19 had been delivered; 20..29 are late's own copies.
    assert [d.redelivered for d in moved] == [True] * 15 + [False] * 10
    assert not r1.done()
    late.ack_many(tags(moved[:15]))
    assert r1.outcome is Outcome.DELIVERED
    assert not r2.done()
    late.ack_many(tags(moved[15:]))
    assert not r2.done()
    got_other = await receive_now(other)
    assert numbers(got_other) == list(range(20, 30))
    other.ack_many(tags(got_other))
    assert r2.outcome is Outcome.DELIVERED
    assert hub.inflight == 0


async def test_anonymous_groups_leaving_one_after_another_split_a_run() -> None:
    """Three anonymous groups share a run; one acks half of it and leaves, another
    leaves, and the last leaves after a named group joined: only the copies nobody
    else acked move on, in order, and the receipt still needs them."""
    hub = Hub()
    x, y, z = hub.subscribe("t"), hub.subscribe("t"), hub.subscribe("t")
    receipt = await hub.publish([msg(i) for i in range(10)])
    got_z = await receive_now(z, 5)
    z.ack_many(tags(got_z))
    z.close()
    y.close()
    got_x = await receive_now(x, 7)
    x.ack(got_x[6].tag)
    heir = hub.subscribe("t", "heir")
    assert not receipt.done()
    x.close()
    assert held(hub, "heir") == (4, 4, 4 * SIZE)
    moved = await receive_now(heir)
    # 0..4: acked by z. 6: acked by x. 5, 7..9: only x still held them.
    assert numbers(moved) == [5, 7, 8, 9]
    assert [d.redelivered for d in moved] == [True, False, False, False]
    assert not receipt.done()
    heir.ack_many(tags(moved))
    assert receipt.outcome is Outcome.DELIVERED


async def test_last_anonymous_group_leaving_mid_run_returns_the_rest_to_the_backlog() -> None:
    hub = Hub()
    anon = hub.subscribe("t", credit=6)
    receipt = await hub.publish([msg(i) for i in range(12)])
    got = await receive_now(anon)
    assert numbers(got) == list(range(6))
    anon.ack_many([got[4].tag, got[0].tag, got[2].tag])
    anon.close()
    assert stats_of(hub) == {
        "kind": "topic",
        "backlog": 9,
        "discarded": 0,
        "filtered": 0,
        "groups": {},
    }
    hub.destination("t").declare_group("g")
    assert stats_of(hub)["backlog"] == 0
    assert held(hub, "g") == (9, 9, 9 * SIZE)
    member = hub.subscribe("t", "g")
    rest = await receive_now(member)
    assert numbers(rest) == [1, 3, 5, *range(6, 12)]
    assert [d.redelivered for d in rest] == [True] * 3 + [False] * 6
    member.ack_many(tags(rest))
    assert receipt.outcome is Outcome.DELIVERED


# -- the backlog --------------------------------------------------------------------------


def backlog_stats(backlog: int, discarded: int = 0) -> dict[str, Any]:
    """``stats()`` of topic ``t`` with no group and ``backlog`` copies left behind."""
    return {
        "kind": "topic",
        "backlog": backlog,
        "discarded": discarded,
        "filtered": 0,
        "groups": {},
    }


async def test_backlog_runs_are_adopted_whole_by_the_first_group() -> None:
    """Three runs an anonymous subscriber left untouched wait in the backlog, whole;
    the first group to subscribe adopts them (the second gets none of them)."""
    hub = Hub()
    leaver = hub.subscribe("t", credit=0)
    r1 = await hub.publish([msg(i) for i in range(5)])
    r2 = await hub.publish([msg(5)])
    r3 = await hub.publish([msg(i) for i in range(6, 13)])
    leaver.close()
    assert stats_of(hub) == backlog_stats(13)
    assert hub.inflight == 3
    # New publishes never join the backlog: with no group they are discarded.
    dropped = await hub.publish([msg(i) for i in range(100, 103)])
    assert dropped.outcome is Outcome.DELIVERED
    assert stats_of(hub) == backlog_stats(13, discarded=3)
    first = hub.subscribe("t", "first", credit=4)
    second = hub.subscribe("t", "second")
    assert stats_of(hub)["backlog"] == 0
    assert held(hub, "first") == (13, 13, 13 * SIZE)
    assert held(hub, "second") == (0, 0, 0)
    got = await receive_now(first)
    assert numbers(got) == [0, 1, 2, 3]
    assert not any(d.redelivered for d in got), "never delivered before"
    assert first.credit == 0
    first.grant(100)
    got += await receive_now(first, 5)  # across the runs' boundaries
    assert numbers(got) == list(range(9))
    assert tags(got) == list(range(1, 10))
    assert await receive_now(second) == []
    first.ack_many(tags(got[:6]))
    assert r1.outcome is Outcome.DELIVERED
    assert r2.outcome is Outcome.DELIVERED
    assert not r3.done()
    # A later run goes to both groups.
    r4 = await hub.publish([msg(13), msg(14)])
    rest = await receive_now(first)
    assert numbers(rest) == [*range(9, 15)]
    first.ack_many(tags(got[6:]) + tags(rest))
    assert r3.outcome is Outcome.DELIVERED
    assert not r4.done()
    ack = await receive_now(second)
    assert numbers(ack) == [13, 14]
    second.ack_many(tags(ack))
    assert r4.outcome is Outcome.DELIVERED
    assert hub.inflight == 0


async def test_backlog_adopted_by_an_anonymous_subscriber_goes_back_when_it_leaves() -> None:
    hub = Hub()
    leaver = hub.subscribe("t", credit=0)
    receipt = await hub.publish([msg(i) for i in range(8)])
    leaver.close()
    assert stats_of(hub) == backlog_stats(8)
    anon = hub.subscribe("t", max_unacked=5)
    got = await receive_now(anon)
    assert numbers(got) == [0, 1, 2, 3, 4]
    anon.ack_many(tags(got)[::2])  # 0, 2, 4
    anon.nack(got[3].tag)  # 3 requeued first
    anon.close()
    assert stats_of(hub) == backlog_stats(5)
    again = hub.subscribe("t")
    rest = await receive_now(again)
    assert numbers(rest) == [1, 3, 5, 6, 7]
    assert [d.redelivered for d in rest] == [True, True, False, False, False]
    again.ack_many(tags(rest))
    assert receipt.outcome is Outcome.DELIVERED


async def test_a_run_after_a_full_backlog_is_discarded_and_then_waits_one_by_one() -> None:
    """A full backlog holds no publisher: with no group, a run is discarded whole at
    once. The group that adopts the backlog adopts its room too: a run that does not
    fit in what is left goes one by one as acks make room."""
    hub = Hub(limits=HubLimits(buffer_messages=10))
    leaver = hub.subscribe("t", credit=0)
    r1 = await hub.publish([msg(i) for i in range(6)])
    r2 = await hub.publish([msg(i) for i in range(6, 10)])
    leaver.close()
    assert stats_of(hub) == backlog_stats(10)
    with trio.fail_after(1):
        dropped = await hub.publish([msg(i) for i in range(100, 108)])
    assert dropped.outcome is Outcome.DELIVERED
    assert stats_of(hub) == backlog_stats(10, discarded=8)
    sub = hub.subscribe("t", max_unacked=100)
    assert held(hub) == (10, 10, 10 * SIZE)
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(i) for i in range(10, 14)])
        await settle()
        assert not task.done
        got = await receive_now(sub)
        assert numbers(got) == list(range(10))
        sub.ack_many(tags(got[:3]))
        await settle()
        assert not task.done
        assert held(hub) == (3, 10, 10 * SIZE), "three of the run were stored one by one"
        sub.ack(got[3].tag)
        await settle()
        assert task.done
    r3: Receipt = task.result
    rest = await receive_now(sub)
    assert numbers(rest) == list(range(10, 14))
    sub.ack_many(tags(got[4:]))
    assert r1.outcome is Outcome.DELIVERED
    assert r2.outcome is Outcome.DELIVERED
    assert not r3.done()
    sub.ack_many(tags(rest))
    assert r3.outcome is Outcome.DELIVERED
    assert stats_of(hub)["discarded"] == 8


# -- publishers waiting for room ------------------------------------------------------------


@pytest.mark.parametrize(
    "limits",
    [
        HubLimits(buffer_messages=10),
        HubLimits(buffer_bytes=10 * SIZE),
        HubLimits(buffer_messages=10, buffer_bytes=10 * SIZE),
    ],
    ids=["count", "bytes", "both"],
)
async def test_a_run_that_fits_exactly_is_taken_whole_and_one_more_waits(
    limits: HubLimits,
) -> None:
    hub = Hub(limits=limits)
    sub = hub.subscribe("t", max_unacked=100)
    await hub.publish([msg(i) for i in range(4)])
    with trio.fail_after(1):
        await hub.publish([msg(i) for i in range(4, 10)])  # exactly the room left
    assert held(hub) == (10, 10, 10 * SIZE)
    got = await receive_now(sub)
    sub.ack_many(tags(got[:3]))
    async with trio.open_nursery() as nursery:
        # Room for three; four do not fit whole, so they go one by one.
        task = start(nursery, hub.publish, [msg(i) for i in range(10, 14)])
        await settle()
        assert not task.done
        assert held(hub) == (3, 10, 10 * SIZE)
        sub.ack(got[3].tag)
        await settle()
        assert task.done
    assert held(hub) == (4, 10, 10 * SIZE)
    assert numbers(await receive_now(sub)) == [10, 11, 12, 13]


async def test_a_run_that_does_not_fit_goes_one_by_one_as_acks_make_room() -> None:
    """The messages of a run too big for the room left are stored one at a time, each
    as soon as an ack (in any order), or a nack without requeue, makes room for it; a
    nack with requeue makes none. Order and receipts are those of one run."""
    hub = Hub(limits=HubLimits(buffer_messages=10))
    sub = hub.subscribe("t", max_unacked=100)
    r0 = await hub.publish([msg(i) for i in range(4)])
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(i) for i in range(4, 16)])
        await settle()
        assert not task.done
        assert held(hub) == (10, 10, 10 * SIZE)
        got = await receive_now(sub)
        assert numbers(got) == list(range(10))
        sub.ack_many([got[7].tag, got[2].tag, got[5].tag])
        await settle()
        assert held(hub) == (3, 10, 10 * SIZE), "exactly three more stored"
        assert not task.done
        sub.nack(got[0].tag)  # requeued: still held, no room
        await settle()
        assert held(hub) == (4, 10, 10 * SIZE)
        sub.nack(got[1].tag, requeue=False, outcome=Outcome.REJECTED, reason="bad")
        await settle()
        assert held(hub) == (5, 10, 10 * SIZE)
        more = await receive_now(sub)
        assert numbers(more) == [0, 10, 11, 12, 13]
        assert [d.redelivered for d in more] == [True] + [False] * 4
        sub.ack_many(tags(more))  # consecutive tags across runs of one message
        await settle()
        assert task.done, "the last two fit now"
        assert held(hub) == (2, 7, 7 * SIZE)
    rest = await receive_now(sub)
    assert numbers(rest) == [14, 15]
    sub.ack_many(tags(rest))
    receipt: Receipt = task.result
    assert not r0.done()
    assert not receipt.done()
    sub.ack(got[3].tag)
    assert r0.outcome is Outcome.REJECTED  # message 1 was rejected
    assert r0.reason == "bad"
    assert not receipt.done()
    sub.ack_many([got[i].tag for i in (4, 6, 8, 9)])
    assert receipt.outcome is Outcome.DELIVERED
    assert held(hub) == (0, 0, 0)
    assert hub.inflight == 0


async def test_a_run_waits_on_the_byte_bound_message_by_message() -> None:
    limit = 2000
    hub = Hub(limits=HubLimits(buffer_bytes=limit))
    sub = hub.subscribe("t", max_unacked=100)
    sizes = [300, 700, 250, 600, 400, 900, 220, 500]
    messages = [msg(i, size=s) for i, s in enumerate(sizes)]
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, messages)
        received: list[Delivery] = []
        for _ in range(100):
            await settle()
            queued, count, nbytes = held(hub)
            assert nbytes <= limit
            # Stored: exactly the prefix of the run that fits with what is held.
            stored = len(received) + queued
            assert count == queued, "every delivery was acked"
            assert nbytes == sum(sizes[len(received) : stored])
            if stored < len(sizes):
                assert nbytes + sizes[stored] > limit, "a message that fits was not stored"
            if task.done:
                break
            got = await receive_now(sub, 1)
            received += got
            sub.ack_many(tags(got))
        assert task.done
    received += await receive_now(sub)
    assert numbers(received) == list(range(len(sizes)))


async def test_the_slowest_group_paces_a_run_going_one_by_one() -> None:
    hub = Hub(limits=HubLimits(buffer_messages=5))
    fast = hub.subscribe("t", "fast", max_unacked=100)
    slow = hub.subscribe("t", "slow", max_unacked=100)
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(i) for i in range(8)])
        await settle()
        assert held(hub, "fast")[1] == held(hub, "slow")[1] == 5
        fast_got = await receive_now(fast)
        fast.ack_many(tags(fast_got))
        await settle()
        assert held(hub, "fast") == (0, 0, 0), "the slow group is still full"
        slow_got = await receive_now(slow, 2)
        slow.ack_many(tags(slow_got)[::-1])
        await settle()
        assert held(hub, "fast") == (2, 2, 2 * SIZE)
        assert held(hub, "slow") == (5, 5, 5 * SIZE)
        assert not task.done
        slow_got += await receive_now(slow)
        slow.ack_many(tags(slow_got[2:]))
        await settle()
        assert task.done
    receipt: Receipt = task.result
    assert not receipt.done()
    for sub in (fast, slow):
        sub.ack_many(tags(await receive_now(sub)))
    assert receipt.outcome is Outcome.DELIVERED
    assert hub.inflight == 0


# -- waking waiting subscribers -----------------------------------------------------------


async def wait_for(sub: Subscription, max_count: int | None = None) -> list[Delivery]:
    with trio.fail_after(5):
        return await sub.receive(max_count)


@pytest.mark.parametrize(
    "how", ["ack", "ack_many_partial", "nack_requeue", "nack_drop", "grant", "byte_window"]
)
async def test_a_waiting_member_wakes_when_its_own_window_opens(how: str) -> None:
    hub = Hub()
    credit = 3 if how == "grant" else None
    window = 2 * SIZE if how == "byte_window" else None
    max_unacked = 100 if how in ("grant", "byte_window") else 3
    sub = hub.subscribe("t", credit=credit, max_unacked=max_unacked, max_unacked_bytes=window)
    await hub.publish([msg(i) for i in range(6)])
    got = await receive_now(sub)
    assert len(got) == (2 if how == "byte_window" else 3)
    async with trio.open_nursery() as nursery:
        task = start(nursery, wait_for, sub)
        await settle()
        assert not task.done
        if how == "ack":
            sub.ack(got[1].tag)
        elif how in ("ack_many_partial", "byte_window"):
            sub.ack_many([got[-1].tag])
        elif how == "nack_requeue":
            sub.nack(got[2].tag)
        elif how == "nack_drop":
            sub.nack(got[0].tag, requeue=False)
        else:
            sub.grant(1)
        await settle()
        assert task.done, f"still waiting after {how}"
    assert task.error is None
    assert len(task.result) == 1
    expected = 2 if how == "nack_requeue" else len(got)
    assert number(task.result[0]) == expected


@pytest.mark.parametrize("how", ["nack", "close", "anonymous_heir"])
async def test_a_waiting_member_wakes_when_copies_come_back(how: str) -> None:
    hub = Hub()
    if how == "anonymous_heir":
        giver = hub.subscribe("t")
        await hub.publish([msg(i) for i in range(3)])
        waiter = hub.subscribe("t", "heir")
    else:
        giver = hub.subscribe("t", "g")
        waiter = hub.subscribe("t", "g")
        await hub.publish([msg(i) for i in range(3)])
    got = await receive_now(giver)
    assert numbers(got) == [0, 1, 2]
    giver.ack(got[0].tag)
    async with trio.open_nursery() as nursery:
        task = start(nursery, wait_for, waiter)
        await settle()
        assert not task.done
        if how == "nack":
            giver.nack(got[2].tag)
        else:
            giver.close()
        await settle()
        assert task.done, f"still waiting after {how}"
    assert task.error is None
    if how == "nack":
        assert numbers(task.result) == [2]
    else:
        assert numbers(task.result) == [1, 2]
    assert all(d.redelivered for d in task.result)


# -- ack_many across leases ---------------------------------------------------------------


@pytest.mark.parametrize("how", ["ack", "nack", "nack_drop"])
async def test_ack_many_stops_at_a_settled_tag_in_the_middle_lease(how: str) -> None:
    """Twelve deliveries in three leases; one in the middle lease is settled first (by
    an ack, a requeueing nack or a dropping nack). An ack_many of all twelve settles
    the ones before it and raises KeyError naming it; the ones after stay unacked."""
    hub = Hub()
    sub = hub.subscribe("t")
    runs = [await hub.publish([msg(i) for i in range(j, j + 4)]) for j in (0, 4, 8)]
    got = await receive_now(sub, 3)  # lease 1: 0..2
    got += await receive_now(sub, 6)  # lease 2: 3, then 4..7 (two runs)
    got += await receive_now(sub, 4)  # lease 3: 8..11
    assert tags(got) == list(range(1, 13))
    if how == "ack":
        sub.ack(got[6].tag)
    else:
        sub.nack(got[6].tag, requeue=how == "nack")
    with pytest.raises(KeyError, match=rf"\btag {got[6].tag}\b"):
        sub.ack_many(tags(got))
    assert sub.unacked == 5, "7..11 did not settle"
    assert runs[0].outcome is Outcome.DELIVERED
    assert not runs[1].done()
    with pytest.raises(KeyError):
        sub.ack_many([got[7].tag, got[5].tag])  # 5 settled before: 7 settles, then stop
    assert sub.unacked == 4
    sub.ack_many(tags(got[8:]))
    assert runs[2].outcome is Outcome.DELIVERED
    if how == "nack":
        assert not runs[1].done()
        assert held(hub) == (1, 1, SIZE)
        (again,) = await receive_now(sub)
        assert (number(again), again.redelivered, again.tag) == (6, True, 13)
        sub.ack(again.tag)
    expected = Outcome.FAILED if how == "nack_drop" else Outcome.DELIVERED
    assert runs[1].outcome is expected
    assert held(hub) == (0, 0, 0)


async def test_acks_and_nacks_after_close_raise_and_settle_nothing() -> None:
    """Closing gave the deliveries back: their old tags are gone, and must not settle
    the copies that are now queued again."""
    hub = Hub()
    a = hub.subscribe("t", "g")
    receipt = await hub.publish([msg(i) for i in range(5)])
    got = await receive_now(a)
    a.ack(got[1].tag)
    a.close()
    for tag in tags(got):
        with pytest.raises(KeyError):
            a.ack(tag)
        with pytest.raises(KeyError):
            a.nack(tag, requeue=False)
    with pytest.raises(KeyError):
        a.ack_many(tags(got))
    assert held(hub, "g") == (4, 4, 4 * SIZE)
    assert not receipt.done()
    b = hub.subscribe("t", "g")
    again = await receive_now(b)
    assert numbers(again) == [0, 2, 3, 4]
    b.ack_many(tags(again))
    assert receipt.outcome is Outcome.DELIVERED


@pytest.mark.parametrize(
    ("pick", "settled"),
    [
        ([0, 1, 1, 2], [0, 1]),  # a duplicate stops at its second occurrence
        ([3, 2, 1, 0, 3], [3, 2, 1, 0]),
        ([0, 1, 2, 3, 99], [0, 1, 2, 3]),  # an unknown tag after a whole lease
        ([2, 3, -1, 0], [2, 3]),  # tag 0: never a delivery's
        ([1, 3, 5, 4, 4], [1, 3, 5, 4]),
    ],
)
async def test_ack_many_with_duplicates_and_unknown_tags(
    pick: list[int], settled: list[int]
) -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg(i) for i in range(6)])
    got = await receive_now(sub)
    chosen = [got[i].tag if 0 <= i < len(got) else (0 if i < 0 else 1000) for i in pick]
    with pytest.raises(KeyError):
        sub.ack_many(chosen)
    assert sub.unacked == 6 - len(settled)
    assert held(hub) == (0, 6 - len(settled), (6 - len(settled)) * SIZE)
    for i in range(6):
        if i in settled:
            with pytest.raises(KeyError):
                sub.ack(got[i].tag)
        else:
            sub.ack(got[i].tag)
    assert receipt.outcome is Outcome.DELIVERED


async def test_nack_in_a_partly_acked_lease_then_close_returns_the_rest_in_order() -> None:
    hub = Hub()
    a = hub.subscribe("t", "g")
    receipt = await hub.publish([msg(i) for i in range(10)])
    got = await receive_now(a, 8)
    a.ack_many([got[1].tag, got[2].tag, got[6].tag])
    a.nack(got[4].tag)
    a.nack(got[5].tag, requeue=False)
    with pytest.raises(KeyError):
        a.nack(got[6].tag)
    a.close()
    b = hub.subscribe("t", "g")
    rest = await receive_now(b)
    assert numbers(rest) == [0, 3, 4, 7, 8, 9]
    assert [d.redelivered for d in rest] == [True, True, True, True, False, False]
    b.ack_many(tags(rest))
    assert receipt.outcome is Outcome.FAILED


async def test_close_after_nacks_in_either_order_redelivers_in_publish_order() -> None:
    """Copies requeued by nacks (5, then 2) and one returned by close (3) are all
    redeliveries at the head of the queue; ``_return_in_order`` promises they come
    back in publish order, whatever the order of the nacks."""
    hub = Hub()
    a = hub.subscribe("t", "g")
    await hub.publish([msg(i) for i in range(8)])
    got = await receive_now(a, 6)
    a.nack(got[2].tag)
    a.nack(got[5].tag)  # the queue now starts 5, 2, 6, 7
    a.ack_many([*tags(got[:2]), got[4].tag])
    a.close()  # returns 3
    b = hub.subscribe("t", "g")
    assert numbers(await receive_now(b)) == [2, 3, 5, 6, 7]
