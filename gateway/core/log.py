"""Replayable log destinations: groups, committed positions and retention, over
an entry storage that a subclass provides.

A log keeps every message appended to it, in order, at an *offset* (0, 1, 2,
…, a :class:`~gateway.core.model.Position`) and lets subscribers read it by
position: from the earliest retained message, from the tail, or from any
offset in between, and optionally up to an end (a finite read). As in a topic,
every *group* reads the whole log (fan-out) and the members of one group
compete for its messages; each group keeps a *committed position*: every
offset below it was acked (or skipped) by the group, so a named group that
leaves and comes back resumes there, its unacked messages redelivered first.

A publisher's leg settles once the copy is stored, not when a group consumes
it: the log, not the consumers, is where a message is safe. What "stored"
means is the storage's: in memory at once (:class:`gateway.core.memory_log.MemoryLog`),
or once the segment store made it durable (:class:`gateway.durable.log.DurableLog`).

Retention is bounded in bytes (``Message.size``). To make room the oldest
entries go first, but only those every group has committed past; when that is
not enough, ``overflow="block"`` makes the publisher wait for acks
(backpressure, as a full topic does) and ``overflow="drop_oldest"`` evicts
anyway, each group that still needed the evicted entries counting them as
``dropped`` and moving its committed position past them (a member holding one
unacked may still ack it; given back, it counts as dropped too). Entries no
group needs stay until the size bound pushes them out, so a new subscriber can
still replay them.

The base keeps, for every retained entry, the running byte total up to it, in
one sequence with a moving head (compacted once the head passes half of it):
the bytes of any range of offsets, and the offset where a byte budget runs
out, cost one subtraction or one bisection, whatever the storage. The
messages themselves are the storage's: a subclass stores a run
(:meth:`LogDestination._store`), keeps the recent messages in a list the base
reads directly (``_recent``: a run is handed out as one C-level slice), reads
older ones on demand (:meth:`LogDestination._read`), and forgets what was
evicted (:meth:`LogDestination._release`). Offsets in ``_holes`` hold no readable
message (a durable record that failed its checksum; always older than the
recent ones): they are never delivered, and count as dropped for every group
that reaches them.

A log may be one *partition* of a destination (``partition``): the positions
it gives out carry that partition, and it takes start and end positions of
that partition only. A subscription that merges several partitions
(:class:`gateway.durable.partitioned.PartitionedLog`) takes from each member
without waiting (:meth:`LogSubscription.take`, sharing one byte window) and
waits on all of them in one task (:meth:`LogSubscription.watch`).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
from abc import abstractmethod
from collections.abc import Callable, Iterable, Iterator, MutableSequence, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, Literal

import trio

from gateway.core.destination import (
    QUEUE_GROUP,
    Delivery,
    Destination,
    DestinationFigures,
    DestinationInfo,
    EndOfStream,
    GroupFigures,
    LogFigures,
    StartAt,
    StopAt,
    Subscription,
    anonymous_group,
    message_sizes,
    new_delivery,
    refusal,
)
from gateway.core.errors import StorageFull
from gateway.core.model import Message, Outcome, Position, Positions
from gateway.core.reasons import Refusal
from gateway.core.receipts import Receipt

if TYPE_CHECKING:
    from gateway.core.filters import Filter

__all__ = [
    "QUEUE_GROUP",
    "LogDestination",
    "LogGroup",
    "LogSubscription",
    "PositionRun",
    "positions",
]

_NO_HOLES: frozenset[int] = frozenset()
#: A queue's ``unmatched`` figure looks at this many waiting entries at most.
UNMATCHED_SCAN = 100_000


def positions(lo: int, hi: int, partition: int = 0) -> list[Position]:
    """``Position(lo, partition)`` … ``Position(hi - 1, partition)``."""
    return list(map(tuple.__new__, repeat(Position), zip(range(lo, hi), repeat(partition))))


class PositionRun(Sequence[Position]):
    """``Position(first, partition)`` … ``Position(first + n - 1, partition)``, each made
    only when read: what a log tells a receipt about a stored run, which most
    publishers never ask for (a list of them cost a tenth of a small publish)."""

    __slots__ = ("first", "n", "partition")

    def __init__(self, first: int, n: int, partition: int = 0) -> None:
        self.first = first
        self.n = n
        self.partition = partition

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Position]:
        return iter(positions(self.first, self.first + self.n, self.partition))

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            lo, hi, step = i.indices(self.n)
            if step != 1:
                return [self[k] for k in range(lo, hi, step)]
            return PositionRun(self.first + lo, max(0, hi - lo), self.partition)
        if i < 0:
            i += self.n
        if not 0 <= i < self.n:
            raise IndexError(f"position {i} of a run of {self.n}")
        return Position(self.first + i, self.partition)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"PositionRun({self.first}, {self.n}, partition={self.partition})"


def _matching_run(
    f: Filter | None, messages: Sequence[Message], base: int, lo: int, covered: int, want: int
) -> int:
    """The end of the run from ``lo`` (which matches) of at most ``want`` entries that
    ``f`` matches, within ``covered``."""
    if f is None:
        return min(covered, lo + want)
    hi = lo + 1
    while hi < covered and hi - lo < want and f.matches(messages[hi - base].headers):
        hi += 1
    return hi


def _offset_of(where: Position | Positions | int, what: str, partition: int) -> int:
    if isinstance(where, Position):
        if where.partition != partition:
            raise ValueError(f"{what} {where!r}: this log is partition {partition}")
        return where.offset
    if isinstance(where, Positions):
        if where.partitions != (partition,):
            raise ValueError(
                f"{what} {where.format()!r}: this log is partition {partition} only, "
                f"so positions must name partition {partition} and no other"
            )
        return where.offsets[partition]
    if isinstance(where, int) and not isinstance(where, bool):
        return where
    raise ValueError(
        f"{what} must be 'earliest', 'latest', an offset, a Position or Positions: {where!r}"
    )


class LogGroup:
    """One group's reading state (a durable log saves and restores its position).

    ``cursor`` is the next offset never handed out; below it every offset is
    settled (acked, rejected, skipped by the filter, dropped), unacked at a
    member, waiting in ``redeliver``, or (a queue's) waiting in ``passed``.
    ``committed`` is the first offset not settled: ``settled`` holds the
    settled offsets above it. Eviction under
    ``drop_oldest`` moves both past the evicted entries, even ones a member
    still holds unacked: the group can never read them again.
    """

    __slots__ = (
        "anonymous",
        "committed",
        "cursor",
        "dropped",
        "filter",
        "members",
        "name",
        "passed",
        "redeliver",
        "rejected",
        "returns",
        "selective",
        "settled",
        "waiters",
        "watchers",
    )

    def __init__(self, name: str, anonymous: bool, filter: Filter | None, start: int) -> None:
        self.name = name
        self.anonymous = anonymous
        self.filter = filter
        self.cursor = start
        self.committed = start
        self.settled: set[int] = set()
        #: Offsets given back (nack, close), a heap: handed out first, lowest first.
        self.redeliver: list[int] = []
        #: A queue's offsets that a consumer with a selector read past without a
        #: match, sorted: never delivered, not settled (so the committed position
        #: stays below them, and a durable log reads them again after a restart);
        #: every member looks at them first, with the redeliveries.
        self.passed: list[int] = []
        #: Members with a selector of their own (a queue's consumers only).
        self.selective = 0
        #: How many times offsets were given back to ``redeliver``: a selector's
        #: horizon (see LogSubscription._take_held) holds until then.
        self.returns = 0
        self.members: list[LogSubscription] = []
        #: Members waiting for something to take.
        self.waiters = trio.lowlevel.ParkingLot()
        #: Lots of tasks that wait on several subscriptions at once, woken with the
        #: waiters (:meth:`LogSubscription.watch`).
        self.watchers: list[trio.lowlevel.ParkingLot] = []
        self.dropped = 0
        self.rejected = 0

    def settle(self, offsets: Sequence[int]) -> bool:
        """Mark ``offsets`` settled; return True if the committed position moved."""
        c = self.committed
        if offsets and min(offsets) < c:
            # Deliveries of entries evicted under drop_oldest: already passed.
            offsets = [o for o in offsets if o >= c]
        settled = self.settled
        settled.update(offsets)
        if c not in settled:
            return False
        while c in settled:
            settled.remove(c)
            c += 1
        self.committed = c
        return True

    def settle_range(self, lo: int, hi: int) -> bool:
        """Mark offsets ``lo`` to ``hi`` (exclusive) settled, those below the committed
        position passed over (evicted under drop_oldest); True if committed moved."""
        return self.settle_run(max(lo, self.committed), hi)

    def settle_run(self, lo: int, hi: int) -> bool:
        """Mark offsets ``lo`` to ``hi`` (exclusive) settled; True if committed moved."""
        if lo >= hi:
            return False
        if lo != self.committed:
            self.settled.update(range(lo, hi))
            return False
        c = hi
        settled = self.settled
        while c in settled:
            settled.remove(c)
            c += 1
        self.committed = c
        return True

    def skip_to(self, offset: int) -> None:
        """Commit everything below ``offset``, whatever its state (eviction)."""
        if offset <= self.committed:
            return
        settled = self.settled = {o for o in self.settled if o >= offset}
        while offset in settled:
            settled.remove(offset)
            offset += 1
        self.committed = offset

    def wake(self) -> None:
        if self.waiters:
            self.waiters.unpark_all()
        if self.watchers:
            for lot in self.watchers:
                lot.unpark_all()


class LogDestination(Destination):
    """A replayable, bounded log with committed positions per group; where its
    messages live is the subclass's (see the module docstring)."""

    #: Makes the sequence of running byte totals (a list; an ``array`` saves memory).
    _ends_type: Callable[[], MutableSequence[int]] = list
    #: Offsets whose message cannot be read, all below ``_recent_first``: never
    #: delivered (see the module docstring).
    _holes: frozenset[int] | set[int]
    #: The storage's messages in memory: ``_recent[o - _recent_base]`` is the one
    #: at offset ``o`` for ``_recent_first <= o < tail``; older ones come from ``_read``.
    _recent: Sequence[Message]
    _recent_base: int
    _recent_first: int

    def __init__(
        self,
        name: str,
        *,
        retain_bytes: int,
        kind: Literal["topic", "queue"] = "topic",
        overflow: Literal["block", "drop_oldest"] = "block",
        element_size: int | None = None,
        partition: int = 0,
    ) -> None:
        if retain_bytes < 1:
            raise ValueError("retain_bytes must be at least 1")
        if kind not in ("topic", "queue"):
            raise ValueError(f"kind must be 'topic' or 'queue', not {kind!r}")
        if overflow not in ("block", "drop_oldest"):
            raise ValueError(f"overflow must be 'block' or 'drop_oldest', not {overflow!r}")
        if partition < 0:
            raise ValueError(f"partition must not be negative: {partition}")
        self.name = name
        #: Which partition of its destination this log is: every position it gives
        #: out carries it, and it takes only start and end positions of it.
        self.partition = partition
        self.retain_bytes = retain_bytes
        self.kind = kind
        self.overflow = overflow
        self.element_size = element_size
        #: ``_ends[i]``: bytes appended up to and including offset ``_base + i``;
        #: entries from index ``_head`` on are retained.
        self._ends = self._ends_type()
        self._base = 0
        #: Bytes appended before offset ``_base`` (any origin: only differences count).
        self._base_bytes = 0
        self._head = 0
        # Instance attributes, not class defaults: the interpreter reads those faster.
        self._holes = _NO_HOLES
        self._recent = ()
        self._recent_base = self._recent_first = 0
        self._groups: dict[str, LogGroup] = {}
        #: Publishers waiting for room.
        self._space = trio.lowlevel.ParkingLot()
        #: Publishes waiting now for groups to commit (the log is full), and for the
        #: storage under the log to have room (its disk is full).
        self.blocked = 0
        self.held_by_storage = 0
        self._closed = False
        #: Deliveries handed out and acked: plain counts for the metrics.
        self.delivered = 0
        self.acked = 0
        self._info = DestinationInfo(
            name,
            "log",
            element_size,
            positions=True,
            queue_group=QUEUE_GROUP if kind == "queue" else None,
        )
        if kind == "queue":
            # Exists from the start, so it holds every message from the first offset.
            self._groups[QUEUE_GROUP] = LogGroup(QUEUE_GROUP, False, None, 0)

    # -- the storage ------------------------------------------------------------------
    @abstractmethod
    def _store(self, messages: Sequence[Message], receipt: Receipt, index: int, first: int) -> None:
        """Keep ``messages`` at offsets ``first``…; add one leg per message to
        ``receipt`` (publish indexes ``index``…) and settle each with
        ``settle_stored`` once it is stored. Raise, keeping nothing, if it cannot."""

    def _read(self, lo: int, hi: int) -> tuple[Sequence[Message], int, int]:
        """Messages older than ``_recent_first``: ``(messages, base, covered)``, where
        ``messages[o - base]`` is the message at each offset ``o`` from ``lo``
        (retained, below ``hi <= _recent_first``) up to ``covered`` (``lo < covered
        <= hi``). An unreadable entry is in ``_holes`` once this returns (with any
        message in its place)."""
        raise NotImplementedError(f"log {self.name!r} keeps every message in memory")

    def _release(self, new_first: int, compacted: int) -> None:
        """Entries below ``new_first`` were evicted, and the first ``compacted``
        slots of ``_ends`` dropped (for storage kept in step with it)."""

    def _changed(self) -> None:
        """A group came or its committed position moved, or ``first`` moved (for
        storage that remembers them)."""

    # -- the entries --------------------------------------------------------------
    @property
    def first(self) -> int:
        """The offset of the oldest retained entry (== ``tail`` when empty)."""
        return self._base + self._head

    @property
    def tail(self) -> int:
        """The offset the next appended message will get."""
        return self._base + len(self._ends)

    def _cum(self, offset: int) -> int:
        """Bytes appended before ``offset`` (which must not be compacted away)."""
        i = offset - self._base
        return self._ends[i - 1] if i > 0 else self._base_bytes

    def _size(self, offset: int) -> int:
        return self._cum(offset + 1) - self._cum(offset)

    def _sizes_of(self, lo: int, hi: int) -> list[int]:
        """The size of each entry from ``lo`` to ``hi`` (exclusive)."""
        seg = self._ends[lo - self._base : hi - self._base]
        return list(map(operator.sub, seg, [self._cum(lo), *seg[:-1]]))

    def _entries(self, lo: int, hi: int) -> tuple[Sequence[Message], int, int]:
        """``(messages, base, covered)`` as :meth:`_read` says, for any retained ``lo``."""
        if lo >= self._recent_first:
            return self._recent, self._recent_base, hi
        return self._read(lo, min(hi, self._recent_first))

    def _readable(self, lo: int, hi: int) -> int:
        """The first hole from ``lo`` on, or ``hi`` if there is none below it."""
        return min((h for h in self._holes if lo <= h < hi), default=hi)

    @property
    def retained_bytes(self) -> int:
        return self._cum(self.tail) - self._cum(self.first)

    @property
    def full(self) -> bool:
        """A publisher waits for room now, or nothing more fits without evicting."""
        return self.blocked > 0 or self.retained_bytes >= self.retain_bytes

    # -- publishing -----------------------------------------------------------------
    def check(self, message: Message) -> Refusal | None:
        return refusal(self.name, message, self.retain_bytes, self.element_size)

    @property
    def info(self) -> DestinationInfo:
        return self._info

    async def put(self, message: Message, receipt: Receipt, index: int = 0) -> None:
        await self.put_many((message,), receipt, index)

    async def put_many(self, messages: Sequence[Message], receipt: Receipt, base: int = 0) -> None:
        """Append ``messages`` in order, each leg settled as stored at its position.

        As many as fit are appended at once; with ``overflow="block"`` the rest
        wait for groups to commit. A refused message settles REJECTED and takes
        no offset.
        """
        n = len(messages)
        sizes = message_sizes(messages)
        limit = self.retain_bytes
        element = self.element_size
        i = 0
        while i < n:
            if self._closed:
                raise trio.ClosedResourceError(f"destination {self.name!r} is closed")
            problem = self.check(messages[i])
            if problem is not None:
                receipt.add_legs()
                receipt.settle(base + i, Outcome.REJECTED, problem.text, reason_code=problem.code)
                i += 1
                continue
            room = self._room()
            j, need = i, 0
            while j < n:
                size = sizes[j]
                if need + size > room or size > limit:
                    break
                if element is not None and len(messages[j].body) != element:
                    break
                need += size
                j += 1
            if j == i:
                # Only with overflow="block": wait until groups commit past old entries.
                if not self._skip_unmatched():
                    self.blocked += 1
                    try:
                        await self._space.park()
                    finally:
                        self.blocked -= 1
                continue
            self._make_room(need)
            try:
                self._append(messages[i:j], sizes[i:j], receipt, base + i)
            except StorageFull as full:
                # Nothing was kept: hold the publisher until the disk has room, then retry.
                self.held_by_storage += 1
                try:
                    await full.room()
                finally:
                    self.held_by_storage -= 1
                continue
            i = j

    def _room(self) -> int:
        """Bytes that may be appended now (evicting only what may be evicted)."""
        if self.overflow == "drop_oldest":
            return self.retain_bytes
        first = self.first
        hold = min((g.committed for g in self._groups.values()), default=self.tail)
        hold = max(hold, first)
        return self.retain_bytes - self.retained_bytes + self._cum(hold) - self._cum(first)

    def _skip_unmatched(self) -> bool:
        """Move filtered groups past entries their filter does not match (as a reader
        would), so those stop holding retention; True if a committed position moved."""
        moved = False
        tail = self.tail
        for g in self._groups.values():
            f = g.filter
            if f is None:
                continue
            lo = hi = g.cursor
            while hi < tail:
                messages, base, covered = self._entries(hi, tail)
                covered = self._readable(hi, covered) if self._holes else covered
                start = hi
                while hi < covered and not f.matches(messages[hi - base].headers):
                    hi += 1
                if hi == start or hi < covered:
                    break
            g.cursor = hi
            moved |= g.settle_run(lo, hi)
        if moved:
            self._changed()
        return moved

    def _make_room(self, need: int) -> None:
        """Evict the oldest entries until ``need`` more bytes fit."""
        excess = self.retained_bytes + need - self.retain_bytes
        if excess <= 0:
            return
        target = self._cum(self.first) + excess
        index = bisect.bisect_left(self._ends, target, self._head)
        self._evict(self._base + index + 1)

    def _evict(self, new_first: int) -> None:
        """Drop the entries below ``new_first``; groups that still needed them skip them."""
        old_first = self.first
        for g in self._groups.values():
            if g.committed < new_first:
                self._drop(g, old_first, new_first)
        self._head += new_first - old_first
        compacted = 0
        if self._head * 2 > len(self._ends):
            compacted = head = self._head
            self._base_bytes = self._cum(self._base + head)
            del self._ends[:head]
            self._base += head
            self._head = 0
        self._release(new_first, compacted)
        self._changed()

    def _drop(self, g: LogGroup, lo: int, hi: int) -> None:
        """Entries ``lo`` to ``hi`` go while ``g`` still needs some: count them as
        dropped, and move the group's cursor and committed position past them.

        A delivery of one that a member holds unacked stays with it (it has the
        message) and may still be acked; given back, it counts as dropped.
        """
        heap = g.redeliver
        dropped = 0
        while heap and heap[0] < hi:
            heapq.heappop(heap)
            dropped += 1
        if g.passed:
            gone = bisect.bisect_left(g.passed, hi)
            del g.passed[:gone]
            dropped += gone
        start = max(g.cursor, lo)
        if start < hi:
            f = g.filter
            if f is None:
                dropped += hi - start
            else:
                holes = self._holes
                while start < hi:
                    messages, base, covered = self._entries(start, hi)
                    if holes:
                        dropped += sum(
                            1
                            for o in range(start, covered)
                            if o in holes or f.matches(messages[o - base].headers)
                        )
                    else:
                        run = messages[start - base : covered - base]
                        dropped += sum(1 for m in run if f.matches(m.headers))
                    start = covered
            g.cursor = hi
        g.dropped += dropped
        g.skip_to(hi)

    def _append(
        self, messages: Sequence[Message], sizes: list[int], receipt: Receipt, index: int
    ) -> None:
        first = self.tail
        ends = self._ends
        last = ends[-1] if ends else self._base_bytes
        ends.extend(itertools.islice(itertools.accumulate(sizes, initial=last), 1, None))
        try:
            self._store(messages, receipt, index, first)
        except BaseException:
            del ends[first - self._base :]
            raise
        for g in self._groups.values():
            g.wake()

    def _extend(self, sizes: Iterable[int]) -> None:
        """Entries of ``sizes`` were stored at the tail by someone else: take them in."""
        ends = self._ends
        last = ends[-1] if ends else self._base_bytes
        ends.extend(itertools.islice(itertools.accumulate(sizes, initial=last), 1, None))
        for g in self._groups.values():
            g.wake()

    def _advanced(self, group: LogGroup | None = None) -> None:
        """``group``'s committed position moved or it left (None: maybe several did):
        publishers may find room."""
        if self._space:
            self._space.unpark_all()

    def _requeue(self, g: LogGroup, offsets: Iterable[int]) -> None:
        """Give unacked ``offsets`` back to ``g``; evicted ones count as dropped."""
        first = self.first
        g.returns += 1
        for offset in offsets:
            if offset < first:
                g.dropped += 1
            else:
                heapq.heappush(g.redeliver, offset)
        g.wake()

    # -- subscribing ------------------------------------------------------------------
    def _start_offset(self, start: StartAt | None) -> int:
        if start is None or start == "latest":
            return self.tail
        if start == "earliest":
            return self.first
        offset = _offset_of(start, "start", self.partition)
        if offset > self.tail:
            raise ValueError(
                f"start {offset} is past the tail of log {self.name!r} (next offset {self.tail})"
            )
        return max(offset, self.first)

    def _end_offset(self, end: StopAt | None) -> int | None:
        if end is None:
            return None
        if end == "latest":
            return self.tail
        offset = _offset_of(end, "end", self.partition)
        if offset < 0:
            raise ValueError(f"end must not be negative: {offset}")
        return offset

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
    ) -> LogSubscription:
        """Join ``group`` (or a group of one); a new group starts at ``start``, an
        existing named group resumes at its redeliveries and cursor."""
        if self._closed:
            raise trio.ClosedResourceError(f"destination {self.name!r} is closed")
        if max_unacked < 1:
            raise ValueError("max_unacked must be at least 1")
        if max_unacked_bytes is not None and max_unacked_bytes < 1:
            raise ValueError("max_unacked_bytes must be at least 1")
        if credit is not None and credit < 0:
            raise ValueError("credit must not be negative")
        stop = self._end_offset(end)
        selector = None
        if self.kind == "queue":
            # On a queue the filter is the member's own selector, not the group's.
            selector, filter = filter, None
            group = QUEUE_GROUP
        g = self._groups.get(group) if group is not None else None
        if g is not None:
            if g.filter != filter:
                raise ValueError(
                    f"group {group!r} of {self.name!r} has filter {g.filter!r}, not {filter!r}"
                )
        else:
            offset = self._start_offset(start)
            name = anonymous_group() if group is None else group
            g = self._groups[name] = LogGroup(name, group is None, filter, offset)
            if group is not None:
                self._changed()
        sub = LogSubscription(
            self, g, credit, max_unacked, max_unacked_bytes, stop, selector, positions
        )
        g.members.append(sub)
        g.selective += selector is not None
        return sub

    def declare_group(self, group: str) -> None:
        """Create named ``group`` at the earliest retained entry, if it does not exist
        (a queue's one group always exists)."""
        if self.kind != "queue" and group not in self._groups:
            self._groups[group] = LogGroup(group, False, None, self.first)
            self._changed()

    def _leave(self, sub: LogSubscription) -> None:
        g = sub._group
        if sub in g.members:
            g.members.remove(sub)
            g.selective -= sub._selector is not None
        if g.anonymous and not g.members and self._groups.get(g.name) is g:
            # A group of one goes with its member, releasing what it held.
            del self._groups[g.name]
            self._advanced(g)
        g.wake()

    def close(self) -> None:
        self._closed = True
        self._space.unpark_all()
        for g in self._groups.values():
            for member in g.members:
                member._closed = True
            g.wake()

    def _unmatched(self, g: LogGroup) -> int | None:
        """A queue's entries waiting for a consumer (held, or past the cursor) that no
        present consumer's selector matches (0 while a consumer without one, or none
        at all, is present); None for a log that is no queue.

        Computed when asked (status, metrics): it reads the waiting entries, the
        oldest :data:`UNMATCHED_SCAN` at most (a durable log reads them from disk).
        """
        if self.kind != "queue":
            return None
        if not g.members or g.selective < len(g.members):
            return 0
        selectors = [m._selector for m in g.members if m._selector is not None]

        def unwanted(message: Message) -> bool:
            return not any(f.matches(message.headers) for f in selectors)

        count = 0
        held = sorted(itertools.chain(g.redeliver, g.passed))[:UNMATCHED_SCAN]
        for offset in held:
            messages, base, _ = self._entries(offset, offset + 1)
            count += offset not in self._holes and unwanted(messages[offset - base])
        lo = g.cursor
        tail = min(self.tail, lo + UNMATCHED_SCAN - len(held))
        while lo < tail:
            messages, base, covered = self._entries(lo, tail)
            count += sum(
                1
                for o in range(lo, covered)
                if o not in self._holes and unwanted(messages[o - base])
            )
            lo = covered
        return count

    def stats(self) -> dict[str, object]:
        groups = {
            name: {
                "committed": g.committed,
                "next": g.cursor,
                "unacked": sum(m.unacked for m in g.members),
                "members": len(g.members),
                "dropped": g.dropped,
                "rejected": g.rejected,
                **({"unmatched": self._unmatched(g)} if self.kind == "queue" else {}),
            }
            for name, g in self._groups.items()
        }
        return {
            "kind": "log",
            "first": self.first,
            "next": self.tail,
            "bytes": self.retained_bytes,
            "messages": self.tail - self.first,
            "full": self.full,
            "blocked": self.blocked,
            "held_by_storage": self.held_by_storage,
            "groups": groups,
        }

    def figures(self) -> DestinationFigures:
        """Its figures; a group's backlog runs from its committed position to the tail."""
        tail = self.tail
        groups = tuple(
            GroupFigures(
                name,
                members=len(g.members),
                queued=max(0, tail - g.cursor) + len(g.passed),
                unacked=sum(m.unacked for m in g.members),
                backlog=max(0, tail - g.committed),
                committed=g.committed,
                dropped=g.dropped,
                rejected=g.rejected,
                filter=str(g.filter) if g.filter is not None else None,
                unmatched=self._unmatched(g),
            )
            for name, g in self._groups.items()
        )
        retained = self.retained_bytes
        return DestinationFigures(
            "log",
            received=tail,
            delivered=self.delivered,
            acked=self.acked,
            backlog=max((g.backlog for g in groups), default=0),
            backlog_bytes=None if groups else 0,
            kept=tail - self.first,
            kept_bytes=retained,
            kept_fill=retained / self.retain_bytes,
            full=self.full,
            groups=groups,
            limit_bytes=self.retain_bytes,
            log=LogFigures(
                self.first,
                tail,
                retained,
                self.retain_bytes,
                self.overflow,
                blocked=self.blocked,
                held_by_storage=self.held_by_storage,
            ),
            unmatched=sum(g.unmatched or 0 for g in groups) if self.kind == "queue" else None,
        )


class LogSubscription(Subscription):
    """A member of a log group: deliveries carry their :class:`Position`."""

    def __init__(
        self,
        log: LogDestination,
        group: LogGroup,
        credit: int | None,
        max_unacked: int,
        max_unacked_bytes: int | None,
        end: int | None,
        selector: Filter | None = None,
        positions: bool = True,
    ) -> None:
        self._log = log
        #: Whether deliveries carry their Position (see Destination.subscribe).
        self._positions = positions
        self._group = group
        self.destination = log.name
        self.group = None if group.anonymous else group.name
        #: A queue consumer's own filter: it takes only the entries this matches.
        self._selector = selector
        self.filter = group.filter if selector is None else selector
        self._credit = credit
        self._max_unacked = max_unacked
        self._max_unacked_bytes = max_unacked_bytes
        #: Exclusive end of a finite read, or None.
        self._end = end
        #: Unacked deliveries: tag → offset, as runs (and tag → bytes under a byte window).
        self._tags = _TagRuns()
        self._tag_bytes: dict[int, int] | None = {} if max_unacked_bytes is not None else None
        self._unacked_bytes = 0
        self._next_tag = 1
        self._closed = False
        #: Set once ``receive`` raised EndOfStream: it raises it from then on.
        self._ended = False
        #: Lots this subscription wakes besides its own waiters (:meth:`watch`).
        self._watching: list[trio.lowlevel.ParkingLot] = []
        #: A selector's horizon: no held entry up to this offset matches it, as long
        #: as the group's ``returns`` is still ``_horizon_returns`` (see _take_held).
        self._horizon = -1
        self._horizon_returns = -1

    @property
    def credit(self) -> int | None:
        return self._credit

    @property
    def unacked(self) -> int:
        return len(self._tags)

    @property
    def unacked_bytes(self) -> int:
        """``Message.size`` of the deliveries not yet acked, counted only under a
        ``max_unacked_bytes`` window (0 without one)."""
        return self._unacked_bytes

    @property
    def committed(self) -> Position:
        return Position(self._group.committed, self._log.partition)

    def resume_positions(self) -> Positions:
        """Where to subscribe again (``start``) to read on where this left off: the
        group's first offset never handed out, after every delivery it received
        (a group of one's are this subscription's own)."""
        return Positions({self._log.partition: self._group.cursor})

    def grant(self, n: int) -> None:
        if n < 0:
            raise ValueError("credit must not be negative")
        if self._credit is not None:
            self._credit += n
            self._group.wake()

    def _room(self) -> int:
        n = self._max_unacked - len(self._tags)
        if self._credit is not None:
            n = min(n, self._credit)
        return n

    def _finished(self) -> bool:
        """Nothing below ``end`` is left for this finite read (for a queue consumer with a
        selector: nothing it matches; what it does not match waits for others)."""
        end = self._end
        if end is None:
            return False
        g = self._group
        if g.cursor < end:
            return False
        f = self._selector
        if f is None:
            return not (g.redeliver and g.redeliver[0] < end) and not (
                g.passed and g.passed[0] < end
            )
        log = self._log
        for offset in itertools.chain(g.redeliver, g.passed):
            if offset < end and offset not in log._holes:
                messages, base, _ = log._entries(offset, offset + 1)
                if f.matches(messages[offset - base].headers):
                    return False
        return True

    async def receive(self, max_count: int | None = None) -> list[Delivery]:
        waiters = self._group.waiters
        take = LogSubscription.take  # not the instance's, which a counting facade may wrap
        while True:
            out = take(self, max_count)
            if out:
                return out
            await waiters.park()

    def take(self, max_count: int | None = None, *, shared_bytes: int = 0) -> list[Delivery]:
        """What :meth:`receive` would return now, without waiting: [] where it would wait.

        For a subscription that merges several logs (one task takes from each, and
        waits on all of them with :meth:`watch`). ``shared_bytes`` is what the
        other subscriptions that share this one's ``max_unacked_bytes`` window
        hold unacked: deliveries stop where the sum would pass the window, and
        one alone may pass it only when neither holds anything. Raises
        ``trio.ClosedResourceError`` once closed and :class:`EndOfStream` once a
        finite read ended, as :meth:`receive` does.
        """
        if self._closed:
            raise trio.ClosedResourceError("subscription closed")
        if self._ended:
            raise EndOfStream(f"read of {self.destination!r} ended at offset {self._end}")
        n = self._room()
        if max_count is not None:
            n = min(n, max_count)
        out = self._take(n, shared_bytes)
        if not out and self._finished():
            self._ended = True
            raise EndOfStream(f"read of {self.destination!r} ended at offset {self._end}")
        return out

    def watch(self, lot: trio.lowlevel.ParkingLot) -> None:
        """Unpark every task in ``lot`` whenever this subscription may have something
        new to take (whenever a waiting :meth:`receive` would wake: an append, an ack
        or nack of its group, credit, a departure, closing), until it closes. So one
        task can wait on several subscriptions without a task per subscription;
        a wake-up is a hint, to be checked with :meth:`take`."""
        self._watching.append(lot)
        self._group.watchers.append(lot)

    def _take(self, n: int, shared: int = 0) -> list[Delivery]:
        """Up to ``n`` deliveries (redeliveries first), within the byte window less
        ``shared`` (see :meth:`take`); also moves the cursor past entries the filter
        skips and holes."""
        limit = self._max_unacked_bytes
        if shared and limit is not None:
            limit -= shared
        out: list[Delivery] = []
        full = moved = False
        g = self._group
        if self._selector is not None:
            moved = self._take_selected(out, n, limit, shared, self._selector)
        else:
            if n > 0 and (g.redeliver or g.passed):
                full, moved = self._take_returned(out, n, limit, shared)
            if self._take_new(out, n, limit, shared, full):
                moved = True
        if self._credit is not None:
            self._credit -= len(out)
        self._log.delivered += len(out)
        if moved:
            self._log._advanced(self._group)
        return out

    def _take_returned(
        self, out: list[Delivery], n: int, limit: int | None, shared: int
    ) -> tuple[bool, bool]:
        """Redeliveries into ``out``, lowest offset first, up to ``n`` in all: whether the
        byte window is full, and whether the committed position moved (unreadable
        ones are dropped for the group). A queue's entries passed over by a selector
        come in offset order with them, not flagged as redelivered: they never were
        delivered."""
        log = self._log
        g = self._group
        again, passed = g.redeliver, g.passed
        tags = self._tags
        tag_bytes = self._tag_bytes
        end = self._end
        recent, recent_base, recent_first = log._recent, log._recent_base, log._recent_first
        held = self._unacked_bytes
        full = moved = False
        # ``passed`` is sorted: taken from its front, cut once at the end.
        taken, left = 0, len(passed)
        # Never below the first retained offset: eviction and _requeue see to it.
        while (again or taken < left) and len(out) < n:
            redelivered = bool(again) and not (taken < left and passed[taken] < again[0])
            offset = again[0] if redelivered else passed[taken]
            if end is not None and offset >= end:
                break
            if offset >= recent_first:
                message = recent[offset - recent_base]
            else:
                messages, base, _ = log._read(offset, offset + 1)
                message = messages[offset - base]
                if offset in log._holes:
                    if redelivered:
                        heapq.heappop(again)
                    else:
                        taken += 1
                    g.dropped += 1
                    moved |= g.settle((offset,))
                    continue
            size = log._size(offset)
            if limit is not None and (tags or shared) and held + size > limit:
                full = True
                break
            if redelivered:
                heapq.heappop(again)
            else:
                taken += 1
            tag = self._next_tag
            self._next_tag = tag + 1
            tags.add_run(tag, offset, 1)
            if tag_bytes is not None:
                tag_bytes[tag] = size
            held += size
            position = Position(offset, log.partition) if self._positions else None
            delivery = (tag, message, redelivered, position, None)
            out.append(new_delivery(delivery))
        if taken:
            del passed[:taken]
        self._unacked_bytes = held
        return full, moved

    def _take_selected(
        self, out: list[Delivery], n: int, limit: int | None, shared: int, selector: Filter
    ) -> bool:
        """A queue consumer's take with a selector: the held entries (given back or passed
        over) it matches, lowest first, then new ones from the group's cursor; new
        entries it does not match go to the group's ``passed`` for the others.
        Whether the committed position moved (unreadable entries are dropped)."""
        full, moved = self._take_held(out, n, limit, shared, selector)
        log = self._log
        g = self._group
        stop = log.tail if self._end is None else min(log.tail, self._end)
        passed = g.passed
        while not full and len(out) < n and g.cursor < stop:
            lo = g.cursor
            if lo >= log._recent_first:
                messages, base, covered = log._recent, log._recent_base, stop
            else:
                messages, base, covered = log._read(lo, min(stop, log._recent_first))
                covered = log._readable(lo, covered)
                if covered == lo:
                    moved |= self._drop_unreadable(lo, stop)
                    continue
            hi = lo
            while hi < covered and not selector.matches(messages[hi - base].headers):
                hi += 1
            if hi > lo:
                # Above every offset held already: appending keeps it sorted.
                passed.extend(range(lo, hi))
                g.cursor = hi
                continue
            hi = _matching_run(selector, messages, base, lo, covered, n - len(out))
            if limit is not None:
                hi, full = self._fit(lo, hi, limit, shared)
                if hi == lo:
                    continue
            self._hand_out(out, messages, base, lo, hi)
        return moved

    def _take_held(
        self, out: list[Delivery], n: int, limit: int | None, shared: int, selector: Filter
    ) -> tuple[bool, bool]:
        """The group's held entries (redeliveries and entries passed over) that
        ``selector`` matches, lowest first, into ``out``: whether the byte window is
        full, and whether the committed position moved.

        The cost of selectors: it reads every held entry below the last one it takes,
        but starts past the ones its last scan found nothing in (its *horizon*),
        unless offsets were given back since: then from the lowest again.
        """
        g = self._group
        if n <= 0 or not (g.redeliver or g.passed):
            return False, False
        log = self._log
        end = self._end
        horizon = self._horizon if self._horizon_returns == g.returns else -1
        passed = g.passed
        unseen = itertools.islice(passed, bisect.bisect_right(passed, horizon), None)
        held = heapq.merge(
            zip(sorted(o for o in g.redeliver if o > horizon), repeat(True)),
            zip(unseen, repeat(False)),
        )
        taken: list[int] = []
        full = moved = False
        for offset, again in held:
            if len(out) >= n or (end is not None and offset >= end):
                break
            messages, base, _ = log._entries(offset, offset + 1)
            if offset in log._holes:
                taken.append(offset)
                g.dropped += 1
                moved |= g.settle((offset,))
            elif selector.matches((message := messages[offset - base]).headers):
                if not self._hand_out_one(out, offset, message, again, limit, shared):
                    full = True
                    break
                taken.append(offset)
            horizon = offset
        self._horizon, self._horizon_returns = horizon, g.returns
        if taken:
            _remove_held(g, taken)
        return full, moved

    def _hand_out_one(
        self,
        out: list[Delivery],
        offset: int,
        message: Message,
        again: bool,
        limit: int | None,
        shared: int,
    ) -> bool:
        """Deliver the entry at ``offset`` into ``out``, if it fits the byte window."""
        size = self._log._size(offset)
        if limit is not None and (self._tags or shared) and self._unacked_bytes + size > limit:
            return False
        tag = self._next_tag
        self._next_tag = tag + 1
        self._tags.add_run(tag, offset, 1)
        if self._tag_bytes is not None:
            self._tag_bytes[tag] = size
        self._unacked_bytes += size
        position = Position(offset, self._log.partition) if self._positions else None
        out.append(new_delivery((tag, message, again, position, None)))
        return True

    def _take_new(
        self, out: list[Delivery], n: int, limit: int | None, shared: int, full: bool
    ) -> bool:
        """Entries from the group's cursor into ``out``, up to ``n`` in all and within the
        byte window (unless it is ``full`` already); the cursor also moves past holes
        and entries the filter skips. Whether the committed position moved."""
        log = self._log
        g = self._group
        recent_first = log._recent_first
        stop = log.tail if self._end is None else min(log.tail, self._end)
        f = g.filter
        moved = False
        while g.cursor < stop:
            lo = g.cursor
            if lo >= recent_first:
                messages, base, covered = log._recent, log._recent_base, stop
            else:
                messages, base, covered = log._read(lo, min(stop, recent_first))
                covered = log._readable(lo, covered)
                if covered == lo:  # unreadable: never delivered; dropped for this group
                    moved |= self._drop_unreadable(lo, stop)
                    continue
            if f is not None:
                hi = lo
                while hi < covered and not f.matches(messages[hi - base].headers):
                    hi += 1
                if hi > lo:
                    g.cursor = hi
                    moved |= g.settle_run(lo, hi)
                    continue
            if full or len(out) >= n:
                break
            hi = _matching_run(f, messages, base, lo, covered, n - len(out))
            if limit is not None:
                hi, full = self._fit(lo, hi, limit, shared)
                if hi == lo:
                    continue
            self._hand_out(out, messages, base, lo, hi)
        return moved

    def _drop_unreadable(self, lo: int, stop: int) -> bool:
        """Move the cursor past the unreadable entries from ``lo`` (holes), dropped for
        the group; whether the committed position moved."""
        g = self._group
        holes = self._log._holes
        hi = lo + 1
        while hi < stop and hi in holes:
            hi += 1
        g.dropped += hi - lo
        g.cursor = hi
        return g.settle_run(lo, hi)

    def _fit(self, lo: int, hi: int, limit: int, shared: int) -> tuple[int, bool]:
        """The end of the longest run from ``lo`` (up to ``hi``) that fits the byte window
        (one entry alone if none does and nothing is held), and whether the window is
        full after it."""
        log = self._log
        budget = log._cum(lo) + limit - self._unacked_bytes
        ebase = log._base
        fit = bisect.bisect_right(log._ends, budget, lo - ebase, hi - ebase) + ebase
        if fit == lo:
            if self._tags or shared:
                return lo, True
            return lo + 1, False
        return fit, fit < hi

    def _hand_out(
        self, out: list[Delivery], messages: Sequence[Message], base: int, lo: int, hi: int
    ) -> None:
        """Deliver entries ``lo`` to ``hi`` (``messages[o - base]`` for offset ``o``) and
        move the cursor past them."""
        log = self._log
        k = hi - lo
        tag0 = self._next_tag
        self._next_tag = tag0 + k
        run_tags = range(tag0, tag0 + k)
        self._tags.add_run(tag0, lo, k)
        if self._tag_bytes is not None:
            self._tag_bytes.update(zip(run_tags, log._sizes_of(lo, hi), strict=True))
        self._unacked_bytes += log._cum(hi) - log._cum(lo)
        out += map(
            new_delivery,
            zip(
                run_tags,
                messages[lo - base : hi - base],
                repeat(False),
                positions(lo, hi, log.partition) if self._positions else repeat(None),
                repeat(None),
            ),
        )
        self._group.cursor = hi

    def _settled(self, offsets: list[int], nbytes: int) -> None:
        self._unacked_bytes -= nbytes
        g = self._group
        if g.settle(offsets):
            self._log._advanced(g)
        g.wake()

    def ack(self, tag: int) -> None:
        self.ack_many((tag,))

    def ack_many(self, tags: Iterable[int]) -> None:
        """Settle ``tags`` in order; an unknown or settled tag raises KeyError after the
        ones before it settled.

        Consecutive ascending tags of one run handed out together (an in-order ack
        of a batch, as a list or a range) settle as one range of offsets."""
        if isinstance(tags, (list, range)) and len(tags) > 1 and self._ack_run(tags):
            return
        unacked = self._tags
        tag_bytes = self._tag_bytes
        offsets: list[int] = []
        nbytes = 0
        try:
            for tag in tags:
                offset = unacked.pop(tag)
                if offset is None:
                    raise KeyError(f"unknown or already settled delivery tag {tag}")
                offsets.append(offset)
                if tag_bytes is not None:
                    nbytes += tag_bytes.pop(tag)
        finally:
            if offsets:
                self._log.acked += len(offsets)
                self._settled(offsets, nbytes)

    def _ack_run(self, tags: list[int] | range) -> bool:
        """Settle ``tags`` at once if they are consecutive ascending tags held in one
        run; whether they were (else nothing is settled)."""
        tag, k = tags[0], len(tags)
        if tags[-1] != tag + k - 1:
            return False
        if isinstance(tags, list) and tags != list(range(tag, tag + k)):
            return False
        if isinstance(tags, range) and tags.step != 1:
            return False
        lo = self._tags.pop_run(tag, k)
        if lo is None:
            return False
        nbytes = 0
        if self._tag_bytes is not None:
            pop = self._tag_bytes.pop
            nbytes = sum(pop(t) for t in range(tag, tag + k))
        self._log.acked += k
        self._unacked_bytes -= nbytes
        g = self._group
        if g.settle_range(lo, lo + k):
            self._log._advanced(g)
        g.wake()
        return True

    def nack(
        self,
        tag: int,
        *,
        requeue: bool = True,
        outcome: Outcome = Outcome.FAILED,
        reason: str = "",
    ) -> None:
        """Redeliver the message to the group, or (``requeue=False``) skip it there.

        The publisher's receipt settled when the message was stored, so ``outcome``
        and ``reason`` settle nothing; a skipped message counts as ``rejected``.
        """
        offset = self._tags.pop(tag)
        if offset is None:
            raise KeyError(f"unknown or already settled delivery tag {tag}")
        if self._tag_bytes is not None:
            self._unacked_bytes -= self._tag_bytes.pop(tag)
        g = self._group
        if requeue:
            self._log._requeue(g, (offset,))
        else:
            g.rejected += 1
            self._settled([offset], 0)

    def close(self) -> None:
        g = self._group
        if self._closed and self not in g.members:
            return
        self._closed = True
        if self._tags:
            offsets = self._tags.all_offsets()
            self._tags.clear()
            if self._tag_bytes is not None:
                self._tag_bytes.clear()
            self._unacked_bytes = 0
            self._log._requeue(g, offsets)
        self._log._leave(self)
        if self._watching:
            for lot in self._watching:
                g.watchers.remove(lot)
            self._watching.clear()


def _remove_held(g: LogGroup, offsets: list[int]) -> None:
    """Take ``offsets`` (ascending) out of ``g``'s redeliveries and entries passed over."""
    gone = set(offsets)
    heap = g.redeliver
    if heap and not gone.isdisjoint(heap):
        heap[:] = [o for o in heap if o not in gone]
        heapq.heapify(heap)
    passed = g.passed
    for offset in reversed(offsets):
        i = bisect.bisect_left(passed, offset)
        if i < len(passed) and passed[i] == offset:
            del passed[i]


class _TagRuns:
    """A subscription's unacked deliveries, tag → offset, kept as runs: consecutive tags
    for consecutive offsets are one entry (a batch handed out is one run, and the
    next batch usually extends it), so handing out and acking a batch in order cost
    a few list operations instead of a dict entry per delivery.

    Tags are added in increasing order (the subscription's next tag only grows); a
    run is ``[start, end)`` of tags from offset ``offset``, runs sorted and disjoint.
    """

    __slots__ = ("count", "ends", "offsets", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.offsets: list[int] = []
        #: Tags held in all.
        self.count = 0

    def __len__(self) -> int:
        return self.count

    def __bool__(self) -> bool:
        return self.count > 0

    def add_run(self, tag: int, offset: int, k: int) -> None:
        """Tags ``tag`` to ``tag + k`` (above every tag held) for offsets from ``offset``."""
        ends = self.ends
        if ends and ends[-1] == tag and self.offsets[-1] + tag - self.starts[-1] == offset:
            ends[-1] = tag + k
        else:
            self.starts.append(tag)
            ends.append(tag + k)
            self.offsets.append(offset)
        self.count += k

    def pop(self, tag: int) -> int | None:
        """Remove ``tag``: its offset, or None if it is not held."""
        return self.pop_run(tag, 1)

    def pop_run(self, tag: int, k: int) -> int | None:
        """Remove tags ``tag`` to ``tag + k`` if one run holds them all: the offset of
        ``tag`` (the others follow it), else None and nothing removed."""
        i = bisect.bisect_right(self.starts, tag) - 1
        if i < 0 or tag + k > self.ends[i] or k <= 0:
            return None
        starts, ends, offsets = self.starts, self.ends, self.offsets
        start, end = starts[i], ends[i]
        offset = offsets[i] + tag - start
        if tag == start:
            if tag + k == end:
                del starts[i], ends[i], offsets[i]
            else:
                starts[i] = tag + k
                offsets[i] = offset + k
        else:
            ends[i] = tag
            if tag + k < end:
                starts.insert(i + 1, tag + k)
                ends.insert(i + 1, end)
                offsets.insert(i + 1, offset + k)
        self.count -= k
        return offset

    def all_offsets(self) -> list[int]:
        """Every offset held, in tag order."""
        return [
            o
            for start, end, offset in zip(self.starts, self.ends, self.offsets, strict=True)
            for o in range(offset, offset + end - start)
        ]

    def clear(self) -> None:
        self.starts.clear()
        self.ends.clear()
        self.offsets.clear()
        self.count = 0
