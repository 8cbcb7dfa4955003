"""In-memory topics and queues: the default destinations, created on first use.

Every *group* subscribed to a topic gets its own copy of each message
(fan-out); inside a group, each copy goes to one member that pulls it
(competing consumers). A message published to a topic while no group exists
is settled at once and counted as ``discarded``: nobody listens, as with NATS
or MQTT, and the publisher is not held. Named groups (declared in config or
by a subscriber) outlive their members and keep collecting.

A *queue* is a topic with exactly one group, which exists from the start and
which every subscriber joins whatever group it names: each message goes to
exactly one consumer, and messages wait for consumers to come. A consumer of a
queue may carry its own filter, a *selector* (as JMS selectors do): it takes
only the queued copies its selector matches, from anywhere in the queue and in
publish order, and leaves the others where they are; a copy no present
consumer matches stays queued (counted as ``unmatched``) until one comes. A
consumer without a selector takes from the head, as before: while no member of
the queue has a selector, a take costs nothing more than it did.

A group may carry a filter over headers, applied where a message is stored: a
message that does not match costs that group no copy, no receipt leg, no
credit and no memory. A call (request/reply) is a message whose receipt wants
a reply; a subscriber answers it with :meth:`TopicSubscription.reply`, and
copies of a call that was answered or expired are dropped, not delivered.

Each group's buffer (queued plus delivered-but-unacked) is bounded in bytes
and in count. A publisher waits until every group has room, so a slow group
slows its publishers: data is never dropped to make room.

A leg of the publisher's receipt settles when the group acks its copy. A
group of one (an anonymous subscriber) that leaves returns its copies: to the
backlog if it was the last group (the next group adopts them, so a copy taken
is never lost), else they settle neutral, since the other groups still
deliver theirs.

Copies are kept per *run* (the messages of one publish), not per message: a
group's queue holds slices of runs and a subscriber's unacked deliveries are
slices too, so a window of thousands of events costs a handful of objects and
C-level list operations on its way through, not thousands of Python steps.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Literal

import trio

from gateway.core.budget import MemoryBudget
from gateway.core.destination import (
    QUEUE_GROUP,
    Delivery,
    Destination,
    DestinationFigures,
    DestinationInfo,
    GroupFigures,
    StartAt,
    StopAt,
    Subscription,
    anonymous_group,
    message_sizes,
    new_delivery,
    refusal,
)
from gateway.core.model import Message, Outcome, Reply
from gateway.core.reasons import Refusal
from gateway.core.receipts import Receipt

if TYPE_CHECKING:
    from gateway.core.filters import Filter

__all__ = ["QUEUE_GROUP", "Topic", "TopicLimits"]

#: The last copy of a queued slice, to find where a selector's scan resumes.
_LAST_SEQ = operator.attrgetter("last_seq")


class TopicLimits:
    """Bounds applied to every group of a topic, and the gateway's budget they share."""

    __slots__ = ("budget", "max_bytes", "max_messages")

    def __init__(
        self,
        max_bytes: int = 64 * 1024 * 1024,
        max_messages: int = 100_000,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages
        #: Every group's held bytes are charged here too (None: only per-group bounds).
        self.budget = budget


class _Run:
    """Messages of one put into a topic, shared by the groups that take them all.

    A put is a *batch*: its message ``j`` is copy number ``seq0 + j`` of the
    topic (publish order, which redelivery keeps) and message ``base + j`` of
    the publisher's receipt. A run holds the whole batch (``index`` None), or,
    for a filtered group, just the batch messages at ``index``. ``fanout[j]``
    counts the groups that still hold a copy of batch message ``j`` (shared by
    every run of the batch); it is ``None`` when one unfiltered group took the
    batch (every copy is the only one).
    """

    __slots__ = ("base", "fanout", "index", "messages", "receipt", "reply_by", "seq0", "sizes")

    def __init__(
        self,
        messages: list[Message],
        sizes: list[int],
        receipt: Receipt,
        seq0: int,
        fanout: list[int] | None,
        base: int = 0,
        index: list[int] | None = None,
    ) -> None:
        self.messages = messages
        self.sizes = sizes
        self.receipt = receipt
        self.seq0 = seq0
        self.fanout = fanout
        self.base = base
        self.index = index
        self.reply_by = receipt.reply_by

    def local(self, i: int) -> int:
        """The batch index of this run's message ``i``."""
        return i if self.index is None else self.index[i]

    def settle(self, lo: int, hi: int, outcome: Outcome | None, reason: str = "") -> None:
        """Settle the legs of this run's messages ``lo`` to ``hi`` alike."""
        if self.index is None:
            self.receipt.settle_range(self.base + lo, self.base + hi, outcome, reason)
            return
        base, index, settle = self.base, self.index, self.receipt.settle_range
        for i in range(lo, hi):
            settle(base + index[i], base + index[i] + 1, outcome, reason)


class _Slice:
    """Copies ``start`` to ``end`` (exclusive) of a run, queued in one group."""

    __slots__ = ("end", "redelivered", "run", "start")

    def __init__(self, run: _Run, start: int, end: int, redelivered: bool) -> None:
        self.run = run
        self.start = start
        self.end = end
        #: True when an earlier delivery of these copies was not acked.
        self.redelivered = redelivered

    @property
    def first_seq(self) -> int:
        return self.run.seq0 + self.run.local(self.start)

    @property
    def last_seq(self) -> int:
        return self.run.seq0 + self.run.local(self.end - 1)

    def nbytes(self) -> int:
        return sum(self.run.sizes[self.start : self.end])


class _Lease:
    """Copies ``lo`` to ``hi`` of a run delivered to one member as tags ``tag0``…

    ``acked`` marks the copies settled since (acked or nacked); ``left`` counts
    the others. It stays ``None`` until a settlement covers less than the whole lease.
    """

    __slots__ = ("acked", "hi", "left", "lo", "redelivered", "run", "tag0")

    def __init__(self, run: _Run, lo: int, hi: int, tag0: int, redelivered: bool) -> None:
        self.run = run
        self.lo = lo
        self.hi = hi
        self.tag0 = tag0
        self.redelivered = redelivered
        self.left = hi - lo
        self.acked: bytearray | None = None

    def unsettled(self) -> list[_Slice]:
        """The copies not settled yet, as slices of contiguous copies."""
        if self.acked is None:
            return [_Slice(self.run, self.lo, self.hi, True)]
        out = []
        acked = self.acked
        i, n = 0, len(acked)
        while i < n:
            i = acked.find(0, i)
            if i < 0:
                break
            j = acked.find(1, i)
            if j < 0:
                j = n
            out.append(_Slice(self.run, self.lo + i, self.lo + j, True))
            i = j
        return out


class _Waiters:
    """A group's members waiting in ``receive``, and the lots of tasks that watch its
    members (:meth:`TopicSubscription.watch`): whatever wakes the one wakes the others.

    Stands where a ``ParkingLot`` would (``park``, ``unpark_all``, truth), so every
    place that wakes waiting members wakes the watchers too.
    """

    __slots__ = ("lot", "watchers")

    def __init__(self) -> None:
        self.lot = trio.lowlevel.ParkingLot()
        self.watchers: list[trio.lowlevel.ParkingLot] = []

    def __bool__(self) -> bool:
        return bool(self.watchers) or bool(self.lot)

    def unpark_all(self) -> None:
        if self.lot:
            self.lot.unpark_all()
        for lot in self.watchers:
            if lot:
                lot.unpark_all()

    async def park(self) -> None:
        await self.lot.park()


class _Group:
    __slots__ = (
        "anonymous",
        "budget",
        "filter",
        "members",
        "name",
        "queue",
        "returns",
        "selective",
        "used_bytes",
        "used_count",
        "waiters",
    )

    def __init__(
        self,
        name: str | None,
        anonymous: bool,
        filter: Filter | None = None,
        budget: MemoryBudget | None = None,
    ) -> None:
        self.name = name
        self.anonymous = anonymous
        self.budget = budget
        #: Only messages whose headers match are stored for this group.
        self.filter = filter
        self.queue: deque[_Slice] = deque()
        #: Bytes and copies held: queued plus delivered and not yet settled.
        self.used_bytes = 0
        self.used_count = 0
        self.members: list[TopicSubscription] = []
        #: Members with a selector of their own (a queue's consumers only).
        self.selective = 0
        #: How many times copies went back into the queue, behind newer ones: a
        #: selector's horizon (see TopicSubscription._take_selected) holds until then.
        self.returns = 0
        #: Members waiting for a copy to arrive, and tasks watching the group.
        self.waiters = _Waiters()

    def queued(self) -> int:
        return sum(s.end - s.start for s in self.queue)

    def push(self, piece: _Slice, nbytes: int) -> None:
        self.queue.append(piece)
        self.used_bytes += nbytes
        if self.budget is not None:
            self.budget.charge(nbytes)
        self.used_count += piece.end - piece.start
        if self.waiters:
            self.waiters.unpark_all()


#: Which groups take copies of a put: each with the batch indexes it takes
#: (None: all of them), and what those cost it in copies and bytes.
_Plan = list[tuple[_Group, list[int] | None, int, int]]


class Topic(Destination):
    """An in-memory, bounded, fan-out destination with competing-consumer groups.

    ``kind="queue"`` makes it a queue: one group that every subscriber joins.
    """

    def __init__(
        self,
        name: str,
        limits: TopicLimits | None = None,
        *,
        kind: Literal["topic", "queue"] = "topic",
        element_size: int | None = None,
        groups: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.limits = limits or TopicLimits()
        self.kind = kind
        self.element_size = element_size
        self._groups: dict[str, _Group] = {}
        #: Copies an anonymous group left behind while no other group existed.
        self._backlog = _Group(None, anonymous=False, budget=self.limits.budget)
        #: Publishers waiting for room.
        self._space = trio.lowlevel.ParkingLot()
        self._closed = False
        self._seq = 0
        #: Messages published while no group existed (topics only).
        self.discarded = 0
        #: Copies that no group's filter matched.
        self.filtered = 0
        #: Messages put (stored or discarded), deliveries handed out, deliveries acked
        #: (or answered): plain counts for the metrics, read at scrape time.
        self.received = 0
        self.delivered = 0
        self.acked = 0
        #: Of ``received``, the copies another worker forwarded (``--workers N``):
        #: the figures leave them out, so that summing the workers counts each
        #: message once, in the worker it was published in.
        self.forwarded_in = 0
        #: Groups with a filter (none: the batch fast path applies).
        self._filtering = 0
        #: Told ``(name, True)`` when the first group comes and ``(name, False)`` when
        #: the last goes (workers forward by it: :mod:`gateway.core.peers`); None: nobody.
        self.on_interest: Callable[[str, bool], None] | None = None
        self._info = DestinationInfo(
            name, kind, element_size, queue_group=QUEUE_GROUP if kind == "queue" else None
        )
        if kind == "queue":
            self._group(QUEUE_GROUP, anonymous=False)
        #: Groups its config entry declares: such a topic has one home worker
        #: with ``--workers N`` rather than a copy in every worker.
        self.declared_groups = tuple(groups)
        for group in groups:
            self.declare_group(group)

    @property
    def info(self) -> DestinationInfo:
        return self._info

    # -- publishing -----------------------------------------------------------
    def _targets(self) -> list[_Group]:
        return list(self._groups.values())

    def _plan(self, messages: Sequence[Message], sizes: list[int]) -> _Plan:
        """Which groups take which of ``messages`` (filters applied once per group)."""
        plan: _Plan = []
        total = -1
        for g in self._targets():
            if g.filter is None:
                if total < 0:
                    total = sum(sizes)
                plan.append((g, None, len(sizes), total))
            else:
                index = g.filter.select(messages)
                plan.append((g, index, len(index), sum(sizes[i] for i in index)))
        return plan

    def _fits(self, plan: _Plan) -> bool:
        limits = self.limits
        return all(
            g.used_count + n <= limits.max_messages and g.used_bytes + b <= limits.max_bytes
            for g, _, n, b in plan
        )

    def check(self, message: Message) -> Refusal | None:
        return refusal(self.name, message, self.limits.max_bytes, self.element_size)

    async def put(self, message: Message, receipt: Receipt, index: int = 0) -> None:
        messages, sizes = [message], [message.size]
        budget = self.limits.budget
        while True:
            if self._closed:
                raise trio.ClosedResourceError(f"destination {self.name!r} is closed")
            plan = self._plan(messages, sizes)
            if self._fits(plan):
                if budget is None:
                    break
                nbytes = sum(b for _, _, _, b in plan)
                if budget.fits(nbytes):
                    break
                await budget.wait_for_room(nbytes)
                continue
            await self._space.park()
        self._store(messages, sizes, receipt, plan, index)

    async def put_many(self, messages: Sequence[Message], receipt: Receipt, base: int = 0) -> None:
        """All of ``messages`` at once when every group has room for them, else one by one."""
        limits = self.limits
        sizes = message_sizes(messages)
        if not self._closed and (
            self.element_size is None or all(len(m.body) == self.element_size for m in messages)
        ):
            if not self._filtering:
                # No filter anywhere: every group takes the whole batch.
                n = len(messages)
                total = sum(sizes)
                groups = list(self._groups.values())
                if (
                    total <= limits.max_bytes
                    and all(
                        g.used_count + n <= limits.max_messages
                        and g.used_bytes + total <= limits.max_bytes
                        for g in groups
                    )
                    and (limits.budget is None or limits.budget.fits(total * len(groups)))
                ):
                    if n:
                        self._store_whole(list(messages), sizes, total, receipt, groups, base)
                    return
            elif not sizes or max(sizes) <= limits.max_bytes:
                plan = self._plan(messages, sizes)
                if (
                    all(b <= limits.max_bytes for _, _, _, b in plan)
                    and self._fits(plan)
                    and (limits.budget is None or limits.budget.fits(sum(b for _, _, _, b in plan)))
                ):
                    if messages:
                        self._store(list(messages), sizes, receipt, plan, base)
                    return
        # Too big to take whole now: per message, waiting for room (and
        # rejecting what can never fit) exactly as single publishes do.
        await super().put_many(messages, receipt, base)

    def _store_whole(
        self,
        messages: list[Message],
        sizes: list[int],
        total: int,
        receipt: Receipt,
        groups: list[_Group],
        base: int,
    ) -> None:
        """Store a batch that every one of ``groups`` takes whole (none: discard it)."""
        n = len(messages)
        seq0 = self._seq + 1
        self._seq += n
        self.received += n
        if not groups:
            self.discarded += n
            return
        receipt.add_legs(n * len(groups))
        run = _Run(
            messages, sizes, receipt, seq0, [len(groups)] * n if len(groups) > 1 else None, base
        )
        for g in groups:
            g.push(_Slice(run, 0, n, False), total)

    def _store(
        self,
        messages: list[Message],
        sizes: list[int],
        receipt: Receipt,
        plan: _Plan,
        base: int,
    ) -> None:
        if all(index is None for _, index, _, _ in plan):
            total = plan[0][3] if plan else 0
            self._store_whole(messages, sizes, total, receipt, [g for g, *_ in plan], base)
            return
        n = len(messages)
        seq0 = self._seq + 1
        self._seq += n
        self.received += n
        # Some group filters: count each message's copies, then one run per selection.
        counts = [0] * n
        whole: _Run | None = None
        runs: list[tuple[_Group, _Run, int]] = []
        fanout = counts
        for g, index, k, nbytes in plan:
            if index is None:
                if whole is None:
                    whole = _Run(messages, sizes, receipt, seq0, fanout, base)
                counts[:] = map((1).__add__, counts)
                runs.append((g, whole, nbytes))
            elif k:
                for i in index:
                    counts[i] += 1
                run = _Run(
                    [messages[i] for i in index],
                    [sizes[i] for i in index],
                    receipt,
                    seq0,
                    fanout,
                    base,
                    index,
                )
                runs.append((g, run, nbytes))
        legs = sum(counts)
        self.filtered += counts.count(0)
        receipt.add_legs(legs)
        for g, run, nbytes in runs:
            g.push(_Slice(run, 0, len(run.messages), False), nbytes)

    # -- subscribing ----------------------------------------------------------
    def declare_group(self, group: str) -> None:
        self._group(self._group_name(group), anonymous=False)

    def _group_name(self, group: str) -> str:
        return QUEUE_GROUP if self.kind == "queue" else group

    def _group(self, name: str, anonymous: bool, filter: Filter | None = None) -> _Group:
        g = self._groups.get(name)
        if g is None:
            g = _Group(name, anonymous, filter, self.limits.budget)
            self._filtering += filter is not None
            if self._backlog.queue:
                # A new group adopts what an earlier group left behind and no other
                # group wanted, as far as its filter matches; the rest waits on.
                pieces, self._backlog.queue = self._backlog.queue, deque()
                if self.limits.budget is not None:
                    self.limits.budget.release(self._backlog.used_bytes)
                self._backlog.used_bytes = self._backlog.used_count = 0
                self._hand_over(list(pieces), [g])
            first = not self._groups
            self._groups[name] = g
            if first and self.on_interest is not None:
                self.on_interest(self.name, True)
        return g

    @property
    def has_groups(self) -> bool:
        """Some group (named, or a subscriber's own) takes copies now."""
        return bool(self._groups)

    def _hand_over(self, pieces: list[_Slice], groups: list[_Group]) -> None:
        """Give each copy to the first of ``groups`` whose filter matches it, else to
        the backlog: a copy a group took is never lost, nor given to a group that
        does not want it."""
        if not groups or groups[0].filter is None:
            # The first group takes everything (or, with none, the backlog keeps it).
            targets = {id(groups[0] if groups else self._backlog): pieces}
        else:
            targets = {}
            for piece in pieces:
                run = piece.run
                for i in range(piece.start, piece.end):
                    headers = run.messages[i].headers
                    heir = next(
                        (g for g in groups if g.filter is None or g.filter.matches(headers)),
                        self._backlog,
                    )
                    targets.setdefault(id(heir), []).append(
                        _Slice(run, i, i + 1, piece.redelivered)
                    )
        for heir in [*groups, self._backlog]:
            moved = targets.pop(id(heir), None)
            if not moved:
                continue
            _return_in_order(heir, moved)
            nbytes = sum(p.nbytes() for p in moved)
            heir.used_bytes += nbytes
            if heir.budget is not None:
                heir.budget.charge(nbytes)
            heir.used_count += sum(p.end - p.start for p in moved)
            if heir.waiters:
                heir.waiters.unpark_all()

    def subscribe(
        self,
        group: str | None = None,
        *,
        credit: int | None = None,
        max_unacked: int = 1024,
        max_unacked_bytes: int | None = None,
        start: StartAt | None = None,
        end: StopAt | None = None,
        filter: Filter | None = None,
        positions: bool = True,
    ) -> TopicSubscription:
        if self._closed:
            raise trio.ClosedResourceError(f"destination {self.name!r} is closed")
        if max_unacked < 1:
            raise ValueError("max_unacked must be at least 1")
        if credit is not None and credit < 0:
            raise ValueError("credit must not be negative")
        if (start is not None and start != "latest") or end is not None:
            raise ValueError(
                f"destination {self.name!r} is a {self.kind}: it keeps no log, so a "
                "subscription cannot start or end at a position (configure 'retain' for one)"
            )
        selector = None
        if self.kind == "queue":
            # On a queue the filter is the member's own selector, not the group's.
            selector, filter = filter, None
            group = QUEUE_GROUP
        elif group is not None:
            existing = self._groups.get(group)
            if existing is not None and existing.filter != filter:
                raise ValueError(
                    f"group {group!r} of {self.name!r} has filter {_show(existing.filter)}, "
                    f"not {_show(filter)}: members of a group share one filter"
                )
        anonymous = group is None
        name = anonymous_group() if group is None else group
        g = self._group(name, anonymous, filter)
        sub = TopicSubscription(self, g, credit, max_unacked, max_unacked_bytes, selector)
        g.members.append(sub)
        g.selective += selector is not None
        return sub

    def _freed(self, group: _Group, count: int, nbytes: int) -> None:
        """``count`` copies (``nbytes``) of ``group`` settled: wake those waiting for room."""
        group.used_bytes -= nbytes
        group.used_count -= count
        if group.budget is not None:
            group.budget.release(nbytes)
        if count:
            if group.waiters:
                group.waiters.unpark_all()
            if self._space:
                self._space.unpark_all()

    def _leave(self, sub: TopicSubscription) -> None:
        g = sub._group
        g.members.remove(sub)
        g.selective -= sub._selector is not None
        if g.members or not g.anonymous:
            if g.waiters:
                g.waiters.unpark_all()
            return
        # The last member of an anonymous group left: the group goes with it. A copy
        # another group also holds is no longer needed; an only copy moves on, to
        # the first remaining group or to the backlog, so it is never lost.
        del self._groups[g.name]  # type: ignore[arg-type]
        self._filtering -= g.filter is not None
        if not self._groups and self.on_interest is not None:
            self.on_interest(self.name, False)
        if g.budget is not None:
            # What it held is charged again below to whichever group takes it over.
            g.budget.release(g.used_bytes)
        g.waiters.unpark_all()
        pieces, g.queue = g.queue, deque()
        moved: list[_Slice] = []
        for piece in pieces:
            run = piece.run
            fanout = run.fanout
            if fanout is None:
                moved.append(piece)
                continue
            for i in range(piece.start, piece.end):
                j = run.local(i)
                if fanout[j] > 1:
                    fanout[j] -= 1
                    run.settle(i, i + 1, None)
                else:
                    moved.append(_Slice(run, i, i + 1, piece.redelivered))
        if moved:
            self._hand_over(moved, list(self._groups.values()))
        if self._space:
            self._space.unpark_all()

    def close(self) -> None:
        self._closed = True
        self._space.unpark_all()
        for g in self._groups.values():
            for m in list(g.members):
                m._closed = True
            g.waiters.unpark_all()

    def _unmatched(self, g: _Group) -> int | None:
        """A queue's queued copies that no present consumer's selector matches (0 while
        a consumer without one, or none at all, is present); None for a topic.

        Computed when asked (status, metrics), by one scan of the queue.
        """
        if self.kind != "queue":
            return None
        if not g.members or g.selective < len(g.members):
            return 0
        selectors = [m._selector for m in g.members if m._selector is not None]
        count = 0
        for piece in g.queue:
            messages = piece.run.messages
            for i in range(piece.start, piece.end):
                headers = messages[i].headers
                count += not any(f.matches(headers) for f in selectors)
        return count

    def stats(self) -> dict[str, object]:
        groups = {
            name: {
                "queued": g.queued(),
                "held_bytes": g.used_bytes,
                "held": g.used_count,
                "members": len(g.members),
                **({"filter": str(g.filter)} if g.filter is not None else {}),
                **({"unmatched": self._unmatched(g)} if self.kind == "queue" else {}),
            }
            for name, g in self._groups.items()
        }
        return {
            "kind": self.kind,
            "backlog": self._backlog.queued(),
            "discarded": self.discarded,
            "filtered": self.filtered,
            "groups": groups,
        }

    @property
    def backlog_bytes(self) -> int:
        """Bytes of the copies left behind by departed groups (``stats()["backlog"]``)."""
        return self._backlog.used_bytes

    def figures(self) -> DestinationFigures:
        limits = self.limits
        max_bytes, max_messages = limits.max_bytes, limits.max_messages

        def fill(held: int, nbytes: int) -> float:
            return max(nbytes / max_bytes, held / max_messages)

        groups = tuple(
            GroupFigures(
                name,
                members=len(g.members),
                queued=(queued := g.queued()),
                unacked=g.used_count - queued,
                backlog=g.used_count,
                backlog_bytes=g.used_bytes,
                fill=fill(g.used_count, g.used_bytes),
                filter=str(g.filter) if g.filter is not None else None,
                unmatched=self._unmatched(g),
            )
            for name, g in self._groups.items()
        )
        kept, kept_bytes = self._backlog.queued(), self._backlog.used_bytes
        return DestinationFigures(
            self.kind,
            received=self.received - self.forwarded_in,
            delivered=self.delivered,
            acked=self.acked,
            backlog=sum(g.backlog for g in groups) + kept,
            backlog_bytes=sum(g.backlog_bytes or 0 for g in groups) + kept_bytes,
            kept=kept,
            kept_bytes=kept_bytes,
            kept_fill=fill(kept, kept_bytes),
            full=any(g.full for g in groups),
            groups=groups,
            limit_bytes=max_bytes,
            limit_messages=max_messages,
            discarded=self.discarded,
            filtered=self.filtered,
            unmatched=sum(g.unmatched or 0 for g in groups) if self.kind == "queue" else None,
        )


def _show(f: Filter | None) -> str:
    return "none" if f is None else repr(str(f))


class TopicSubscription(Subscription):
    """A member of a topic group (or a consumer of a queue, with its own ``selector``)."""

    def __init__(
        self,
        topic: Topic,
        group: _Group,
        credit: int | None,
        max_unacked: int,
        max_unacked_bytes: int | None,
        selector: Filter | None = None,
    ) -> None:
        self._topic = topic
        self._group = group
        self.destination = topic.name
        self.group = None if group.anonymous else group.name
        #: A queue consumer's own filter: it takes only the copies this matches.
        self._selector = selector
        self.filter = group.filter if selector is None else selector
        self._credit = credit
        self._max_unacked = max_unacked
        self._max_unacked_bytes = max_unacked_bytes
        #: Deliveries not yet settled, in tag order, and the first tag of each.
        self._leases: list[_Lease] = []
        self._lease_tags: list[int] = []
        self._unacked = 0
        self._unacked_bytes = 0
        self._next_tag = 1
        self._closed = False
        #: Lots this subscription wakes besides its own waiters (:meth:`watch`).
        self._watching: list[trio.lowlevel.ParkingLot] = []
        #: A selector's horizon: no copy queued up to this one matches it, as long
        #: as the group's ``returns`` is still ``_horizon_returns`` (see _take_selected).
        self._horizon = 0
        self._horizon_returns = -1

    @property
    def credit(self) -> int | None:
        return self._credit

    @property
    def unacked(self) -> int:
        return self._unacked

    def grant(self, n: int) -> None:
        if n < 0:
            raise ValueError("credit must not be negative")
        if self._credit is not None:
            self._credit += n
            if self._group.waiters:
                self._group.waiters.unpark_all()

    def _room(self) -> int:
        n = self._max_unacked - self._unacked
        if self._credit is not None:
            n = min(n, self._credit)
        return n

    async def receive(self, max_count: int | None = None) -> list[Delivery]:
        g = self._group
        while True:
            if self._closed:
                raise trio.ClosedResourceError("subscription closed")
            n = self._room()
            if max_count is not None:
                n = min(n, max_count)
            if n > 0 and g.queue:
                out = self._take(n)
                if out:
                    return out
            await g.waiters.park()

    def take(self, max_count: int | None = None) -> list[Delivery]:
        """What :meth:`receive` would return now, without waiting (``[]``: it would wait)."""
        if self._closed:
            raise trio.ClosedResourceError("subscription closed")
        n = self._room()
        if max_count is not None:
            n = min(n, max_count)
        return self._take(n) if n > 0 and self._group.queue else []

    def watch(self, lot: trio.lowlevel.ParkingLot) -> None:
        """Wake ``lot`` whenever a waiting :meth:`receive` would wake, until closed."""
        self._watching.append(lot)
        self._group.waiters.watchers.append(lot)

    def _take(self, n: int) -> list[Delivery]:
        """Up to ``n`` copies from the head of the group's queue, within the byte window."""
        if self._selector is not None:
            return self._take_selected(n, self._selector)
        queue = self._group.queue
        out: list[Delivery] = []
        taken = 0
        while taken < n and queue:
            piece = queue[0]
            run = piece.run
            if run.reply_by is not None and run.receipt.done():
                # A call that was answered elsewhere or expired: nobody wants it now.
                queue.popleft()
                run.settle(piece.start, piece.end, None)
                self._topic._freed(self._group, piece.end - piece.start, piece.nbytes())
                continue
            lo = piece.start
            hi, nbytes = self._fit(run, lo, min(piece.end, lo + n - taken))
            if hi == lo:
                break
            self._lease(out, run, lo, hi, nbytes, piece.redelivered)
            taken += hi - lo
            if hi == piece.end:
                queue.popleft()
            else:
                piece.start = hi
        if self._credit is not None:
            self._credit -= taken
        self._topic.delivered += taken
        return out

    def _take_selected(self, n: int, selector: Filter) -> list[Delivery]:
        """Up to ``n`` copies ``selector`` matches, first ones first, from anywhere in the
        queue and within the byte window; the copies passed over stay where they were.

        Scans the queue from its head until it took ``n`` (or the window is full):
        the cost of a selector is a scan of the copies it does not match. The scan
        starts past the copies its last one found nothing in (its *horizon*), unless
        copies went back into the queue since: then from the head again.
        """
        g = self._group
        queue = g.queue
        horizon = self._horizon if self._horizon_returns == g.returns else 0
        skip = bisect.bisect_right(queue, horizon, key=_LAST_SEQ) if horizon else 0
        queue.rotate(-skip)
        out: list[Delivery] = []
        kept: list[_Slice] = []
        taken = freed = freed_bytes = 0
        full = False
        for _ in range(len(queue) - skip):
            if taken >= n or full:
                break
            piece = queue.popleft()
            run = piece.run
            if run.reply_by is not None and run.receipt.done():
                horizon = piece.last_seq
                run.settle(piece.start, piece.end, None)
                freed += piece.end - piece.start
                freed_bytes += piece.nbytes()
                continue
            first = piece.start
            k, full, stop = self._take_from(piece, selector, n - taken, out, kept)
            taken += k
            if stop > first:
                horizon = run.seq0 + run.local(stop - 1)
            if piece.start < piece.end:
                kept.append(piece)
        queue.extendleft(reversed(kept))
        queue.rotate(skip)
        self._horizon, self._horizon_returns = horizon, g.returns
        if freed:
            self._topic._freed(g, freed, freed_bytes)
        if self._credit is not None:
            self._credit -= taken
        self._topic.delivered += taken
        return out

    def _take_from(
        self, piece: _Slice, selector: Filter, n: int, out: list[Delivery], kept: list[_Slice]
    ) -> tuple[int, bool, int]:
        """Up to ``n`` copies of ``piece`` that ``selector`` matches, into ``out``; the
        ones before them it passed over go to ``kept`` and ``piece`` keeps the rest.
        Returns how many it took, whether the byte window is full, and the index
        where it stopped (every copy before it was passed over or taken)."""
        run = piece.run
        messages = run.messages
        taken = 0
        i = piece.start
        while i < piece.end and taken < n:
            if not selector.matches(messages[i].headers):
                i += 1
                continue
            j = i + 1
            while j < piece.end and j - i < n - taken and selector.matches(messages[j].headers):
                j += 1
            hi, nbytes = self._fit(run, i, j)
            if hi == i:
                return taken, True, i
            if i > piece.start:
                kept.append(_Slice(run, piece.start, i, piece.redelivered))
            self._lease(out, run, i, hi, nbytes, piece.redelivered)
            taken += hi - i
            piece.start = i = hi
            if hi < j:
                return taken, True, i
        return taken, False, i

    def _lease(
        self, out: list[Delivery], run: _Run, lo: int, hi: int, nbytes: int, redelivered: bool
    ) -> None:
        """Deliver copies ``lo`` to ``hi`` of ``run`` (``nbytes``) into ``out``, as one lease."""
        tag0 = self._next_tag
        k = hi - lo
        self._next_tag = tag0 + k
        self._leases.append(_Lease(run, lo, hi, tag0, redelivered))
        self._lease_tags.append(tag0)
        self._unacked += k
        self._unacked_bytes += nbytes
        out += map(
            new_delivery,
            zip(
                range(tag0, tag0 + k),
                run.messages[lo:hi],
                repeat(redelivered),
                repeat(None),
                repeat(run.reply_by),
            ),
        )

    def _fit(self, run: _Run, lo: int, hi: int) -> tuple[int, int]:
        """How far from ``lo`` (up to ``hi``) the copies of ``run`` fit the byte window,
        and their bytes; a copy larger than all of it goes alone."""
        sizes = run.sizes
        limit = self._max_unacked_bytes
        if limit is None:
            return hi, sum(sizes[lo:hi])
        nbytes = 0
        held = self._unacked_bytes
        for i in range(lo, hi):
            if (self._unacked or i > lo) and held + nbytes + sizes[i] > limit:
                return i, nbytes
            nbytes += sizes[i]
        return hi, nbytes

    def _lease_of(self, tag: int) -> int:
        """The index in ``_leases`` of the lease that holds ``tag``, or -1."""
        i = bisect.bisect_right(self._lease_tags, tag) - 1
        if i >= 0:
            lease = self._leases[i]
            if tag < lease.tag0 + lease.hi - lease.lo:
                return i
        return -1

    def _mark(self, i: int, lo: int, hi: int) -> int:
        """Settle offsets ``lo:hi`` of lease ``i`` (none may be settled); return their bytes."""
        lease = self._leases[i]
        k = hi - lo
        run = lease.run
        nbytes = sum(run.sizes[lease.lo + lo : lease.lo + hi])
        lease.left -= k
        if not lease.left:
            del self._leases[i]
            del self._lease_tags[i]
        elif lease.acked is None:
            lease.acked = bytearray(lease.hi - lease.lo)
            lease.acked[lo:hi] = b"\x01" * k
        else:
            lease.acked[lo:hi] = b"\x01" * k
        self._unacked -= k
        self._unacked_bytes -= nbytes
        return nbytes

    def _unsettled_prefix(self, i: int, lo: int, hi: int) -> int:
        """How many offsets from ``lo`` (up to ``hi``) of lease ``i`` are not settled yet."""
        acked = self._leases[i].acked
        if acked is None:
            return hi - lo
        j = acked.find(1, lo, hi)
        return hi - lo if j < 0 else j - lo

    def ack(self, tag: int) -> None:
        self.ack_many((tag,))

    def ack_many(self, tags: Iterable[int]) -> None:
        """Settle ``tags`` in order; an unknown or settled tag raises KeyError after the
        ones before it settled."""
        tags = tags if isinstance(tags, list) else list(tags)
        n = len(tags)
        if not n:
            return
        first = tags[0]
        if n == 1 or (tags[-1] - first == n - 1 and tags == list(range(first, first + n))):
            self._ack_range(first, first + n)
            return
        # Any other order: runs of consecutive tags, one at a time.
        start = prev = first
        for tag in itertools.islice(tags, 1, None):
            if tag != prev + 1:
                self._ack_range(start, prev + 1)
                start = tag
            prev = tag
        self._ack_range(start, prev + 1)

    def _ack_range(self, tag: int, stop: int) -> None:
        """Ack tags ``tag`` to ``stop`` (exclusive), settling each lease's part at once."""
        g = self._group
        freed = freed_bytes = 0
        try:
            while tag < stop:
                i = self._lease_of(tag)
                if i < 0:
                    raise KeyError(f"unknown or already settled delivery tag {tag}")
                lease = self._leases[i]
                lo = tag - lease.tag0
                hi = min(stop - lease.tag0, lease.hi - lease.lo)
                ok = self._unsettled_prefix(i, lo, hi)
                if ok:
                    freed_bytes += self._mark(i, lo, lo + ok)
                    freed += ok
                    lease.run.settle(lease.lo + lo, lease.lo + lo + ok, Outcome.DELIVERED)
                if ok < hi - lo:
                    raise KeyError(f"unknown or already settled delivery tag {tag + ok}")
                tag += ok
        finally:
            self._topic.acked += freed
            self._topic._freed(g, freed, freed_bytes)

    def nack(
        self,
        tag: int,
        *,
        requeue: bool = True,
        outcome: Outcome = Outcome.FAILED,
        reason: str = "",
    ) -> None:
        i = self._lease_of(tag)
        lease = self._leases[i] if i >= 0 else None
        if lease is None or not self._unsettled_prefix(i, tag - lease.tag0, tag - lease.tag0 + 1):
            raise KeyError(f"unknown or already settled delivery tag {tag}")
        offset = tag - lease.tag0
        nbytes = self._mark(i, offset, offset + 1)
        g = self._group
        if self._group.waiters:
            self._group.waiters.unpark_all()
        if requeue:
            # Back before every new copy, in publish order among the other returns.
            index = lease.lo + offset
            _return_in_order(g, [_Slice(lease.run, index, index + 1, True)])
        else:
            self._topic._freed(g, 1, nbytes)
            index = lease.lo + offset
            lease.run.settle(index, index + 1, outcome, reason)

    def reply(self, tag: int, reply: Reply) -> None:
        i = self._lease_of(tag)
        lease = self._leases[i] if i >= 0 else None
        if lease is None or not self._unsettled_prefix(i, tag - lease.tag0, tag - lease.tag0 + 1):
            raise KeyError(f"unknown or already settled delivery tag {tag}")
        run = lease.run
        if run.reply_by is None:
            raise ValueError(f"delivery {tag} is not a call; ack it instead")
        offset = tag - lease.tag0
        nbytes = self._mark(i, offset, offset + 1)
        self._topic._freed(self._group, 1, nbytes)
        self._topic.acked += 1
        run.receipt.settle(run.base + run.local(lease.lo + offset), Outcome.DELIVERED, reply=reply)

    def close(self) -> None:
        if self._closed and self not in self._group.members:
            return
        self._closed = True
        # Give unacked copies back to the head of the queue, in publish order.
        returned = [piece for lease in self._leases for piece in lease.unsettled()]
        self._leases.clear()
        self._lease_tags.clear()
        self._unacked = 0
        self._unacked_bytes = 0
        if returned:
            _return_in_order(self._group, returned)
        if self in self._group.members:
            self._topic._leave(self)
        if self._watching:
            watchers = self._group.waiters.watchers
            for lot in self._watching:
                watchers.remove(lot)
            self._watching.clear()


def _return_in_order(group: _Group, pieces: list[_Slice]) -> None:
    """Put ``pieces`` back at the head of ``group``'s queue, keeping publish order.

    Every return comes through here, so the queue stays in publish order and just
    the part of it older than the newest returned copy is merged; accounting is the
    caller's.
    Pieces never overlap and each holds consecutive copies, so ordering them by
    their first copy orders every copy.
    """
    newest = max(p.last_seq for p in pieces)
    group.returns += 1
    queue = group.queue
    head = list(pieces)
    while queue and queue[0].first_seq < newest:
        head.append(queue.popleft())
    head.sort(key=lambda p: p.first_seq)
    queue.extendleft(reversed(head))
