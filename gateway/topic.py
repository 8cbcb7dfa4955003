"""In-memory topics: the default destination, created on first use.

Every *group* subscribed to a topic gets its own copy of each message
(fan-out); inside a group, each copy goes to one member that pulls it
(competing consumers). A message published while no group exists waits in
the topic's backlog, which the first group to subscribe adopts: a topic with
no subscriber holds messages rather than dropping them.

Each group's buffer (queued plus delivered-but-unacked) is bounded in bytes
and in count. A publisher waits until every group has room, so a slow group
slows its publishers: data is never dropped to make room.

A leg of the publisher's receipt settles when the group acks its copy. A
group of one (an anonymous subscriber) that leaves returns its copies: to the
backlog if it was the last group, else they settle neutral, since the other
groups still deliver theirs. A named group outlives its members and keeps
collecting until the hub closes.

Copies are kept per *run* (the messages of one publish), not per message: a
group's queue holds slices of runs and a subscriber's unacked deliveries are
slices too, so a window of thousands of events costs a handful of objects and
C-level list operations on its way through, not thousands of Python steps.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import repeat

import trio

from .destination import Delivery, Destination, Subscription
from .model import MESSAGE_OVERHEAD, Message, Outcome
from .receipts import Receipt

__all__ = ["Topic", "TopicLimits"]

_anonymous_ids = itertools.count(1)

#: Builds a Delivery from a 3-tuple without the named tuple's Python-level __new__.
_new_delivery = functools.partial(tuple.__new__, Delivery)


class TopicLimits:
    """Bounds applied to every group of a topic."""

    __slots__ = ("max_bytes", "max_messages")

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, max_messages: int = 100_000) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages


_HEADERS = operator.attrgetter("headers")
_BODY = operator.attrgetter("body")


def _sizes(messages: Sequence[Message]) -> list[int]:
    """``Message.size`` of each message; C-level loops when none has headers."""
    if any(map(_HEADERS, messages)):
        return [m.size for m in messages]
    return list(map(MESSAGE_OVERHEAD.__add__, map(len, map(_BODY, messages))))


class _Run:
    """The messages of one publish into a topic, shared by every group's copies.

    Message ``i`` is copy number ``seq0 + i`` of the topic (publish order, which
    redelivery keeps). ``fanout[i]`` counts the groups that still hold a copy of
    message ``i``; it is ``None`` when there is one group (every copy is the only one).
    """

    __slots__ = ("fanout", "messages", "receipt", "seq0", "sizes")

    def __init__(
        self,
        messages: list[Message],
        sizes: list[int],
        receipt: Receipt,
        seq0: int,
        fanout: list[int] | None,
    ) -> None:
        self.messages = messages
        self.sizes = sizes
        self.receipt = receipt
        self.seq0 = seq0
        self.fanout = fanout


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
        return self.run.seq0 + self.start

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


class _Group:
    __slots__ = ("anonymous", "members", "name", "queue", "used_bytes", "used_count", "waiters")

    def __init__(self, name: str | None, anonymous: bool) -> None:
        self.name = name
        self.anonymous = anonymous
        self.queue: deque[_Slice] = deque()
        #: Bytes and copies held: queued plus delivered and not yet settled.
        self.used_bytes = 0
        self.used_count = 0
        self.members: list[TopicSubscription] = []
        #: Members waiting for a copy to arrive.
        self.waiters = trio.lowlevel.ParkingLot()

    def queued(self) -> int:
        return sum(s.end - s.start for s in self.queue)

    def push(self, piece: _Slice, nbytes: int) -> None:
        self.queue.append(piece)
        self.used_bytes += nbytes
        self.used_count += piece.end - piece.start
        if self.waiters:
            self.waiters.unpark_all()


class Topic(Destination):
    """An in-memory, bounded, fan-out destination with competing-consumer groups."""

    def __init__(self, name: str, limits: TopicLimits | None = None) -> None:
        self.name = name
        self.limits = limits or TopicLimits()
        self._groups: dict[str, _Group] = {}
        #: Where messages wait while no group exists.
        self._backlog = _Group(None, anonymous=False)
        #: Publishers waiting for room.
        self._space = trio.lowlevel.ParkingLot()
        self._closed = False
        self._seq = 0

    # -- publishing -----------------------------------------------------------
    def _targets(self) -> list[_Group]:
        return list(self._groups.values()) if self._groups else [self._backlog]

    def check(self, message: Message) -> str | None:
        if message.size > self.limits.max_bytes:
            return (
                f"message of {message.size} bytes exceeds the buffer of destination "
                f"{self.name!r} ({self.limits.max_bytes} bytes)"
            )
        return None

    async def put(self, message: Message, receipt: Receipt) -> None:
        size = message.size
        limits = self.limits
        while True:
            if self._closed:
                raise trio.ClosedResourceError(f"destination {self.name!r} is closed")
            groups = self._targets()
            if all(
                g.used_count < limits.max_messages and g.used_bytes + size <= limits.max_bytes
                for g in groups
            ):
                break
            await self._space.park()
        self._store([message], [size], size, receipt, groups)

    async def put_many(self, messages: Sequence[Message], receipt: Receipt) -> None:
        """All of ``messages`` at once when every group has room for them, else one by one."""
        limits = self.limits
        sizes = _sizes(messages)
        total = sum(sizes)
        n = len(messages)
        groups = self._targets()
        if (
            self._closed
            or total > limits.max_bytes
            or not all(
                g.used_count + n <= limits.max_messages and g.used_bytes + total <= limits.max_bytes
                for g in groups
            )
        ):
            # Too big to take whole now: per message, waiting for room (and
            # rejecting what can never fit) exactly as single publishes do.
            await super().put_many(messages, receipt)
            return
        if n:
            self._store(list(messages), sizes, total, receipt, groups)

    def _store(
        self,
        messages: list[Message],
        sizes: list[int],
        total: int,
        receipt: Receipt,
        groups: list[_Group],
    ) -> None:
        n = len(messages)
        receipt.add_legs(n * len(groups))
        fanout = [len(groups)] * n if len(groups) > 1 else None
        run = _Run(messages, sizes, receipt, self._seq + 1, fanout)
        self._seq += n
        for g in groups:
            g.push(_Slice(run, 0, n, False), total)

    # -- subscribing ----------------------------------------------------------
    def declare_group(self, group: str) -> None:
        self._group(group, anonymous=False)

    def _group(self, name: str, anonymous: bool) -> _Group:
        g = self._groups.get(name)
        if g is None:
            g = _Group(name, anonymous)
            if not self._groups and self._backlog.queue:
                # The first group adopts what waited for a subscriber.
                g.queue, self._backlog.queue = self._backlog.queue, deque()
                g.used_bytes, self._backlog.used_bytes = self._backlog.used_bytes, 0
                g.used_count, self._backlog.used_count = self._backlog.used_count, 0
            self._groups[name] = g
        return g

    def subscribe(
        self,
        group: str | None = None,
        *,
        credit: int | None = None,
        max_unacked: int = 1024,
        max_unacked_bytes: int | None = None,
    ) -> TopicSubscription:
        if self._closed:
            raise trio.ClosedResourceError(f"destination {self.name!r} is closed")
        if max_unacked < 1:
            raise ValueError("max_unacked must be at least 1")
        if credit is not None and credit < 0:
            raise ValueError("credit must not be negative")
        anonymous = group is None
        name = f"~{next(_anonymous_ids)}" if group is None else group
        g = self._group(name, anonymous)
        sub = TopicSubscription(self, g, credit, max_unacked, max_unacked_bytes)
        g.members.append(sub)
        return sub

    def _freed(self, group: _Group, count: int, nbytes: int) -> None:
        """``count`` copies (``nbytes``) of ``group`` settled: wake those waiting for room."""
        group.used_bytes -= nbytes
        group.used_count -= count
        if count:
            if group.waiters:
                group.waiters.unpark_all()
            if self._space:
                self._space.unpark_all()

    def _leave(self, sub: TopicSubscription) -> None:
        g = sub._group
        g.members.remove(sub)
        if g.members or not g.anonymous:
            if g.waiters:
                g.waiters.unpark_all()
            return
        # The last member of an anonymous group left: the group goes with it. A copy
        # another group also holds is no longer needed; an only copy moves on, to
        # the first remaining group or to the backlog, so it is never lost.
        del self._groups[g.name]  # type: ignore[arg-type]
        g.waiters.unpark_all()
        pieces, g.queue = g.queue, deque()
        heir = next(iter(self._groups.values()), self._backlog)
        moved: list[_Slice] = []
        for piece in pieces:
            run = piece.run
            fanout = run.fanout
            if fanout is None:
                moved.append(piece)
                continue
            for i in range(piece.start, piece.end):
                if fanout[i] > 1:
                    fanout[i] -= 1
                    run.receipt.settle_leg(None)
                else:
                    moved.append(_Slice(run, i, i + 1, piece.redelivered))
        if moved:
            _return_in_order(heir, moved)
            heir.used_bytes += sum(p.nbytes() for p in moved)
            heir.used_count += sum(p.end - p.start for p in moved)
            if heir.waiters:
                heir.waiters.unpark_all()
        if self._space:
            self._space.unpark_all()

    def close(self) -> None:
        self._closed = True
        self._space.unpark_all()
        for g in self._groups.values():
            for m in list(g.members):
                m._closed = True
            g.waiters.unpark_all()

    def stats(self) -> dict[str, object]:
        groups = {
            name: {
                "queued": g.queued(),
                "held_bytes": g.used_bytes,
                "held": g.used_count,
                "members": len(g.members),
            }
            for name, g in self._groups.items()
        }
        return {"backlog": self._backlog.queued(), "groups": groups}


class TopicSubscription(Subscription):
    """A member of a topic group."""

    def __init__(
        self,
        topic: Topic,
        group: _Group,
        credit: int | None,
        max_unacked: int,
        max_unacked_bytes: int | None,
    ) -> None:
        self._topic = topic
        self._group = group
        self.destination = topic.name
        self.group = None if group.anonymous else group.name
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

    def _take(self, n: int) -> list[Delivery]:
        """Up to ``n`` copies from the head of the group's queue, within the byte window."""
        queue = self._group.queue
        limit = self._max_unacked_bytes
        out: list[Delivery] = []
        taken = 0
        while taken < n and queue:
            piece = queue[0]
            run = piece.run
            lo = piece.start
            hi = min(piece.end, lo + n - taken)
            if limit is None:
                nbytes = sum(run.sizes[lo:hi])
            else:
                # Within the byte window; a copy larger than all of it goes alone.
                nbytes = 0
                held = self._unacked_bytes
                sizes = run.sizes
                for i in range(lo, hi):
                    if (self._unacked or i > lo) and held + nbytes + sizes[i] > limit:
                        hi = i
                        break
                    nbytes += sizes[i]
                if hi == lo:
                    break
            tag0 = self._next_tag
            k = hi - lo
            self._next_tag = tag0 + k
            self._leases.append(_Lease(run, lo, hi, tag0, piece.redelivered))
            self._lease_tags.append(tag0)
            self._unacked += k
            self._unacked_bytes += nbytes
            out += map(
                _new_delivery,
                zip(range(tag0, tag0 + k), run.messages[lo:hi], repeat(piece.redelivered)),
            )
            taken += k
            if hi == piece.end:
                queue.popleft()
            else:
                piece.start = hi
        if self._credit is not None:
            self._credit -= taken
        return out

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
                    lease.run.receipt.settle_legs(ok, Outcome.DELIVERED)
                if ok < hi - lo:
                    raise KeyError(f"unknown or already settled delivery tag {tag + ok}")
                tag += ok
        finally:
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
            lease.run.receipt.settle_leg(outcome, reason)

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


def _return_in_order(group: _Group, pieces: list[_Slice]) -> None:
    """Put ``pieces`` back at the head of ``group``'s queue, keeping publish order.

    Every return comes through here, so the queue stays in publish order and just
    the part of it older than the newest returned copy is merged; accounting is the
    caller's.
    Pieces never overlap and each holds consecutive copies, so ordering them by
    their first copy orders every copy.
    """
    newest = max(p.run.seq0 + p.end - 1 for p in pieces)
    queue = group.queue
    head = list(pieces)
    while queue and queue[0].first_seq < newest:
        head.append(queue.popleft())
    head.sort(key=lambda p: p.first_seq)
    queue.extendleft(reversed(head))
