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
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Sequence

import trio

from .destination import Delivery, Destination, Subscription
from .model import Message, Outcome
from .receipts import Receipt

__all__ = ["Topic", "TopicLimits"]

_anonymous_ids = itertools.count(1)
#: The fan-out of a copy that was its message's only one; shared, as it is never
#: decremented (only counts above 1 are).
_ONLY_COPY = [1]


class TopicLimits:
    """Bounds applied to every group of a topic."""

    __slots__ = ("max_bytes", "max_messages")

    def __init__(self, max_bytes: int = 64 * 1024 * 1024, max_messages: int = 100_000) -> None:
        self.max_bytes = max_bytes
        self.max_messages = max_messages


class _Copy:
    """One group's copy of a message, with the receipt leg it settles."""

    __slots__ = ("fanout", "message", "receipt", "redelivered", "seq", "size")

    def __init__(
        self, message: Message, receipt: Receipt, size: int, seq: int, fanout: list[int]
    ) -> None:
        self.message = message
        self.receipt = receipt
        self.size = size
        #: Publish order within the topic: redelivered copies go back in this order.
        self.seq = seq
        #: Shared by the copies of one publish: how many groups still hold one.
        self.fanout = fanout
        self.redelivered = False


class _Group:
    __slots__ = ("anonymous", "members", "name", "queue", "used_bytes", "used_count", "waiters")

    def __init__(self, name: str | None, anonymous: bool) -> None:
        self.name = name
        self.anonymous = anonymous
        self.queue: deque[_Copy] = deque()
        #: Bytes and copies held: queued plus delivered and not yet settled.
        self.used_bytes = 0
        self.used_count = 0
        self.members: list[TopicSubscription] = []
        #: Members waiting for a copy to arrive.
        self.waiters = trio.lowlevel.ParkingLot()

    def has_room(self, size: int, limits: TopicLimits) -> bool:
        return self.used_count < limits.max_messages and self.used_bytes + size <= limits.max_bytes

    def push(self, copy: _Copy) -> None:
        self.queue.append(copy)
        self.used_bytes += copy.size
        self.used_count += 1
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
            if all(g.has_room(size, limits) for g in groups):
                break
            await self._space.park()
        receipt.add_legs(len(groups))
        self._seq += 1
        fanout = [len(groups)]
        for g in groups:
            g.push(_Copy(message, receipt, size, self._seq, fanout))

    async def put_many(self, messages: Sequence[Message], receipt: Receipt) -> None:
        """All of ``messages`` at once when every group has room for them, else one by one."""
        limits = self.limits
        sizes = [m.size for m in messages]
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
        receipt.add_legs(n * len(groups))
        seq = self._seq
        self._seq += n
        if len(groups) == 1:
            g = groups[0]
            g.queue.extend(
                _Copy(m, receipt, size, seq + i, _ONLY_COPY)
                for i, (m, size) in enumerate(zip(messages, sizes, strict=True), 1)
            )
            g.used_bytes += total
            g.used_count += n
            if g.waiters:
                g.waiters.unpark_all()
            return
        fanouts = [[len(groups)] for _ in range(n)]
        for g in groups:
            g.queue.extend(
                _Copy(m, receipt, size, seq + i, fanout)
                for i, (m, size, fanout) in enumerate(zip(messages, sizes, fanouts, strict=True), 1)
            )
            g.used_bytes += total
            g.used_count += n
            if g.waiters:
                g.waiters.unpark_all()

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

    def _release(self, group: _Group, copy: _Copy) -> None:
        group.used_bytes -= copy.size
        group.used_count -= 1
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
        copies, g.queue = g.queue, deque()
        heir = next(iter(self._groups.values()), self._backlog)
        moved = []
        for copy in copies:
            if copy.fanout[0] > 1:
                copy.fanout[0] -= 1
                copy.receipt.settle_leg(None)
            else:
                moved.append(copy)
        if moved:
            _return_in_order(heir, moved)
            heir.used_bytes += sum(c.size for c in moved)
            heir.used_count += len(moved)
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
                "queued": len(g.queue),
                "held_bytes": g.used_bytes,
                "held": g.used_count,
                "members": len(g.members),
            }
            for name, g in self._groups.items()
        }
        return {"backlog": len(self._backlog.queue), "groups": groups}


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
        self._unacked: dict[int, _Copy] = {}
        self._unacked_bytes = 0
        self._tags = itertools.count(1)
        self._closed = False

    @property
    def credit(self) -> int | None:
        return self._credit

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    def grant(self, n: int) -> None:
        if n < 0:
            raise ValueError("credit must not be negative")
        if self._credit is not None:
            self._credit += n
            if self._group.waiters:
                self._group.waiters.unpark_all()

    def _room(self) -> int:
        n = self._max_unacked - len(self._unacked)
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
        queue = self._group.queue
        unacked = self._unacked
        tags = self._tags
        out: list[Delivery] = []
        append = out.append
        limit = self._max_unacked_bytes
        held = self._unacked_bytes
        n = min(n, len(queue))
        while len(out) < n:
            copy = queue[0]
            if limit is not None and unacked and held + copy.size > limit:
                break
            queue.popleft()
            tag = next(tags)
            unacked[tag] = copy
            held += copy.size
            append(Delivery(tag, copy.message, copy.redelivered))
        self._unacked_bytes = held
        if self._credit is not None:
            self._credit -= len(out)
        return out

    def _settle(self, tag: int) -> _Copy:
        try:
            copy = self._unacked.pop(tag)
        except KeyError:
            raise KeyError(f"unknown or already settled delivery tag {tag}") from None
        self._unacked_bytes -= copy.size
        # Room in the unacked window may let this or another member take more.
        if self._group.waiters:
            self._group.waiters.unpark_all()
        return copy

    def ack(self, tag: int) -> None:
        self.ack_many((tag,))

    def ack_many(self, tags: Iterable[int]) -> None:
        unacked = self._unacked
        g = self._group
        freed_bytes = freed = 0
        run_receipt: Receipt | None = None
        run = 0
        try:
            for tag in tags:
                try:
                    copy = unacked.pop(tag)
                except KeyError:
                    raise KeyError(f"unknown or already settled delivery tag {tag}") from None
                freed_bytes += copy.size
                freed += 1
                # Consecutive copies of one publish settle together.
                if copy.receipt is not run_receipt:
                    if run_receipt is not None:
                        run_receipt.settle_legs(run, Outcome.DELIVERED)
                    run_receipt, run = copy.receipt, 0
                run += 1
        finally:
            if run_receipt is not None:
                run_receipt.settle_legs(run, Outcome.DELIVERED)
            self._unacked_bytes -= freed_bytes
            g.used_bytes -= freed_bytes
            g.used_count -= freed
            if freed:
                if g.waiters:
                    g.waiters.unpark_all()
                if self._topic._space:
                    self._topic._space.unpark_all()

    def nack(
        self,
        tag: int,
        *,
        requeue: bool = True,
        outcome: Outcome = Outcome.FAILED,
        reason: str = "",
    ) -> None:
        copy = self._settle(tag)
        if requeue:
            copy.redelivered = True
            self._group.queue.appendleft(copy)
            if self._group.waiters:
                self._group.waiters.unpark_all()
        else:
            self._topic._release(self._group, copy)
            copy.receipt.settle_leg(outcome, reason)

    def close(self) -> None:
        if self._closed and self not in self._group.members:
            return
        self._closed = True
        # Give unacked copies back to the head of the queue, in publish order.
        returned = list(self._unacked.values())
        self._unacked.clear()
        self._unacked_bytes = 0
        for copy in returned:
            copy.redelivered = True
        if returned:
            _return_in_order(self._group, returned)
        if self in self._group.members:
            self._topic._leave(self)


def _return_in_order(group: _Group, copies: list[_Copy]) -> None:
    """Put ``copies`` back at the head of ``group``'s queue, keeping publish order.

    Only the head can be out of order (earlier nacks), so just the part of the
    queue older than the newest returned copy is merged; accounting is the caller's.
    """
    copies.sort(key=lambda c: c.seq)
    newest = copies[-1].seq
    head = []
    queue = group.queue
    while queue and queue[0].seq < newest:
        head.append(queue.popleft())
    head.extend(copies)
    head.sort(key=lambda c: c.seq)
    queue.extendleft(reversed(head))
