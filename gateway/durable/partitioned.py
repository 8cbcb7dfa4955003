"""Partitioned durable logs: one destination over several logs, one per partition.

A ``[[destinations]]`` entry with ``store = "embedded"`` and ``partitions = N``
above 1 is a :class:`PartitionedLog` named ``NAME`` over the durable logs
(:class:`~gateway.durable.log.DurableLog`) of the segments ``NAME/0`` …
``NAME/N-1``, partition ``p`` in segment ``NAME/p``. Each partition is a
complete log of its own (offsets from 0, retention bounded by ``retain``,
groups and their committed positions); the destination spreads messages over
them and merges them for subscribers.

Publishing. With a ``partition_key`` (a header name), a message goes to
partition ``crc32(value) % N`` of its header's value (UTF-8), so messages with
the same value stay in one partition, in order. Messages without a key (no
``partition_key``, or the header missing) are spread *sticky* round-robin, as
Kafka's sticky partitioner does: all of them in one ``put_many`` go to one
partition (one record in its segment), those of the next ``put_many`` to the
next. A publish whose messages go to several partitions is stored with one
``put_many`` per partition, partitions in ascending order. Order holds within
a partition only. Each message's receipt position carries its partition
(``receipt.results()[i].position == Position(offset, p)``).

Subscribing. A group of the destination is that group in every partition,
and one :class:`PartitionedSubscription` is a member in each of them and
merges their deliveries: one credit (``grant``, ``credit``), one
``max_unacked`` and ``max_unacked_bytes`` bound over all partitions, and
delivery tags unique across partitions (``partition_tag * N + p``), so
``ack``, ``ack_many``, ``nack`` and ``reply`` go to the partition that
delivered. Each ``receive`` starts taking at the partition after the one the
previous started at, so no partition starves another; waiting for any
partition to have something is one parked task woken by all of them
(:meth:`~gateway.core.log.LogSubscription.watch`), not a poll.

Where a subscription starts and ends: ``"earliest"``, ``"latest"``, None and
an integer offset apply to every partition (an offset must not be past any
partition's tail); a ``Position(offset, p)`` applies to partition ``p``, and
the others start at ``"earliest"`` (for ``end``: read to ``"latest"``);
:class:`~gateway.core.model.Positions` apply to each partition they name, the
others as for a Position (a partition the log does not have is a ValueError
naming it, as is a start past a partition's tail: then no partition gets the
group). A finite read raises :class:`~gateway.core.destination.EndOfStream`
once the read of every partition ended.

Resuming. :meth:`PartitionedSubscription.resume_positions` names, in every
partition, the group's first offset never handed out: after every delivery
received there (acked or not), or where the subscription started if none
came. Subscribing again with it as ``start`` (and the same ``end``) delivers
exactly what the first subscription had not received, in every partition.

``committed`` is None: committed positions are per partition, on
:attr:`PartitionedSubscription.committed_positions` (a list, partition ``p``
at index ``p``).

Each partition keeps its groups in its own store state document (see
:mod:`gateway.durable.log`: partition 0 under the destination's name, as a
destination of one partition always did, so raising ``partitions`` keeps its
groups; partition ``p`` under ``NAME/p``), and a named group resumes in every
partition after a restart.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

import trio

from gateway.core.destination import (
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
    new_delivery,
)
from gateway.core.log import LogDestination, LogSubscription
from gateway.core.model import Message, Outcome, Position, Positions, Reply
from gateway.core.reasons import Reason, Refusal
from gateway.core.receipts import Receipt

if TYPE_CHECKING:
    from gateway.core.filters import Filter

__all__ = ["PartitionedLog", "PartitionedSubscription", "partition_of"]


def partition_of(value: str, partitions: int) -> int:
    """The partition of a message whose ``partition_key`` header is ``value``."""
    return zlib.crc32(value.encode("utf-8", "surrogatepass")) % partitions


class PartitionedLog(Destination):
    """One log destination over ``parts``, partition ``p`` being ``parts[p]`` (see the
    module docstring). Each part must be named ``name`` and be partition ``p``."""

    def __init__(
        self, name: str, parts: Sequence[LogDestination], *, partition_key: str | None = None
    ) -> None:
        if not parts:
            raise ValueError("a partitioned log needs at least one partition")
        for p, part in enumerate(parts):
            if part.name != name or part.partition != p:
                raise ValueError(
                    f"partition {p} of log {name!r} is partition {part.partition} of {part.name!r}"
                )
        self.name = name
        #: The partitions' logs, partition ``p`` at index ``p``.
        self.parts: tuple[LogDestination, ...] = tuple(parts)
        self.partition_key = partition_key
        #: Where the next run of messages without a key goes.
        self._sticky = 0

    @property
    def partitions(self) -> int:
        return len(self.parts)

    @property
    def info(self) -> DestinationInfo:
        return self.parts[0].info

    def check(self, message: Message) -> Refusal | None:
        return self.parts[0].check(message)

    # -- publishing -----------------------------------------------------------------------
    async def put(self, message: Message, receipt: Receipt, index: int = 0) -> None:
        await self.put_many((message,), receipt, index)

    async def put_many(self, messages: Sequence[Message], receipt: Receipt, base: int = 0) -> None:
        """Store each message in its partition (see the module docstring), one
        ``put_many`` per partition; waits as a full partition makes it wait."""
        if not messages:
            return
        n = len(self.parts)
        key = self.partition_key
        sticky = self._sticky
        if key is None:
            self._sticky = sticky + 1 if sticky + 1 < n else 0
            await self.parts[sticky].put_many(messages, receipt, base)
            return
        chosen: list[int] = []
        keyless = False
        for message in messages:
            value = message.headers.get(key)
            if value is None:
                keyless = True
                chosen.append(sticky)
            else:
                chosen.append(partition_of(value, n))
        if keyless:
            self._sticky = sticky + 1 if sticky + 1 < n else 0
        if chosen.count(chosen[0]) == len(chosen):
            await self.parts[chosen[0]].put_many(messages, receipt, base)
            return
        shares: dict[int, list[int]] = {}
        for i, p in enumerate(chosen):
            shares.setdefault(p, []).append(i)
        for p in sorted(shares):
            indexes = shares[p]
            scattered = _Scatter(receipt, [base + i for i in indexes])
            await self.parts[p].put_many(
                [messages[i] for i in indexes], cast(Receipt, scattered), 0
            )

    # -- subscribing ----------------------------------------------------------------------
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
    ) -> PartitionedSubscription:
        """Join ``group`` in every partition (or a group of one in each), merged into
        one subscription; ``start`` and ``end`` as the module docstring says."""
        if credit is not None and credit < 0:
            raise ValueError("credit must not be negative")
        starts = self._per_partition(start, "earliest", "start")
        ends = self._per_partition(end, "latest", "end")
        for p, (part, where) in enumerate(zip(self.parts, starts, strict=True)):
            # Checked before any partition has the group: none gets it if one refuses.
            offset = where.offset if isinstance(where, Position) else where
            if isinstance(offset, int) and not isinstance(offset, bool) and offset > part.tail:
                raise ValueError(
                    f"start {offset} is past the tail of partition {p} of log {self.name!r} "
                    f"(next offset {part.tail})"
                )
        subs: list[LogSubscription] = []
        try:
            for part, s, e in zip(self.parts, starts, ends, strict=True):
                subs.append(
                    part.subscribe(
                        group,
                        max_unacked=max_unacked,
                        max_unacked_bytes=max_unacked_bytes,
                        start=s,
                        end=e,
                        filter=filter,
                        positions=positions,
                    )
                )
        except BaseException:
            for sub in subs:
                sub.close()
            raise
        return PartitionedSubscription(self.name, subs, credit, max_unacked, max_unacked_bytes)

    def _per_partition(
        self, where: Any, others: Literal["earliest", "latest"], what: str
    ) -> list[Any]:
        """``where`` for each partition: a Position for its own partition only,
        Positions for each partition they name (``others`` for the rest)."""
        n = len(self.parts)
        if isinstance(where, Position):
            if not 0 <= where.partition < n:
                raise ValueError(f"{what} {where!r}: log {self.name!r} has partitions 0 to {n - 1}")
            return [where if p == where.partition else others for p in range(n)]
        if isinstance(where, Positions):
            unknown = [p for p in where.partitions if p >= n]
            if unknown:
                raise ValueError(
                    f"{what} {where.format()!r} names partition {unknown[0]}: "
                    f"log {self.name!r} has partitions 0 to {n - 1}"
                )
            return [where.get(p) or others for p in range(n)]
        return [where] * n

    def declare_group(self, group: str) -> None:
        """Create named ``group`` in every partition that does not have it."""
        for part in self.parts:
            part.declare_group(group)

    def close(self) -> None:
        for part in self.parts:
            part.close()

    def stats(self) -> dict[str, object]:
        """Totals over the partitions (``messages``, ``bytes``, ``received``,
        ``delivered``, ``acked``; per group ``members``, ``unacked``, ``behind``,
        ``dropped``, ``rejected``), and each partition's own stats under
        ``partitions``."""
        parts: list[dict[str, Any]] = [part.stats() for part in self.parts]
        groups: dict[str, dict[str, int]] = {}
        for stats in parts:
            part_groups: dict[str, dict[str, int]] = stats["groups"]
            for name, g in part_groups.items():
                total = groups.setdefault(
                    name, {"members": 0, "unacked": 0, "behind": 0, "dropped": 0, "rejected": 0}
                )
                total["members"] = max(total["members"], g["members"])
                total["unacked"] += g["unacked"]
                total["behind"] += stats["next"] - g["committed"]
                total["dropped"] += g["dropped"]
                total["rejected"] += g["rejected"]
        return {
            "kind": "log",
            "messages": sum(s["messages"] for s in parts),
            "bytes": sum(s["bytes"] for s in parts),
            "received": sum(part.tail for part in self.parts),
            "delivered": sum(part.delivered for part in self.parts),
            "acked": sum(part.acked for part in self.parts),
            "groups": groups,
            "partitions": parts,
        }

    def figures(self) -> DestinationFigures:
        """The partitions' figures summed (offsets count messages over all of them); a
        group is summed over the partitions it is in, and the fill is the fullest
        partition's (each is bounded by its own ``retain``)."""
        parts = [part.figures() for part in self.parts]
        logs = [f.log for f in parts if f.log is not None]
        states: dict[str, list[GroupFigures]] = {}
        for f in parts:
            for g in f.groups:
                states.setdefault(g.name, []).append(g)
        groups = tuple(_merged(name, same) for name, same in states.items())
        first = self.parts[0]
        return DestinationFigures(
            "log",
            received=sum(f.received for f in parts),
            delivered=sum(f.delivered for f in parts),
            acked=sum(f.acked for f in parts),
            backlog=max((g.backlog for g in groups), default=0),
            backlog_bytes=None if groups else 0,
            kept=sum(f.kept for f in parts),
            kept_bytes=sum(f.kept_bytes for f in parts),
            kept_fill=max(f.kept_fill for f in parts),
            full=any(f.full for f in parts),
            groups=groups,
            unmatched=_sum_known(f.unmatched for f in parts),
            limit_bytes=first.retain_bytes,
            log=LogFigures(
                sum(log.first for log in logs),
                sum(log.next for log in logs),
                sum(log.retained_bytes for log in logs),
                first.retain_bytes,
                first.overflow,
                blocked=sum(log.blocked for log in logs),
                held_by_storage=sum(log.held_by_storage for log in logs),
                partitions=len(self.parts),
            ),
        )


def _merged(name: str, states: Sequence[GroupFigures]) -> GroupFigures:
    """Group ``name`` summed over its ``states`` in the partitions that have it
    (members: the most of any)."""
    return GroupFigures(
        name,
        members=max(g.members for g in states),
        queued=sum(g.queued for g in states),
        unacked=sum(g.unacked for g in states),
        backlog=sum(g.backlog for g in states),
        committed=sum(g.committed or 0 for g in states),
        dropped=sum(g.dropped for g in states),
        rejected=sum(g.rejected for g in states),
        filter=states[0].filter,
        unmatched=_sum_known(g.unmatched for g in states),
    )


def _sum_known(values: Iterable[int | None]) -> int | None:
    """The sum of the values that are known; None when none is (not a queue)."""
    known = [v for v in values if v is not None]
    return sum(known) if known else None


class PartitionedSubscription(Subscription):
    """A member of a group in every partition, merged (see the module docstring)."""

    def __init__(
        self,
        destination: str,
        parts: Sequence[LogSubscription],
        credit: int | None,
        max_unacked: int,
        max_unacked_bytes: int | None,
    ) -> None:
        self.destination = destination
        self.group = parts[0].group
        self.filter = parts[0].filter
        self._parts = tuple(parts)
        self._credit = credit
        self._max_unacked = max_unacked
        self._max_unacked_bytes = max_unacked_bytes
        #: Partitions whose finite read ended.
        self._part_ended = [False] * len(parts)
        self._ended = False
        self._closed = False
        #: The partition the next take starts at.
        self._next = 0
        #: Where a waiting ``receive`` parks; every partition's subscription wakes it.
        self._lot = trio.lowlevel.ParkingLot()
        for part in self._parts:
            part.watch(self._lot)
        #: Lots of tasks that watch this subscription (:meth:`watch`), woken by a grant.
        self._watching: list[trio.lowlevel.ParkingLot] = []

    @property
    def credit(self) -> int | None:
        return self._credit

    @property
    def unacked(self) -> int:
        return sum(part.unacked for part in self._parts)

    @property
    def committed(self) -> Position | None:
        """None: each partition has its own, in :attr:`committed_positions`."""
        return None

    @property
    def committed_positions(self) -> list[Position]:
        """The group's committed position in each partition (partition ``p`` at index ``p``)."""
        return [part.committed for part in self._parts]

    def resume_positions(self) -> Positions:
        """Where to subscribe again (``start``) to read on where this left off, in
        every partition: there, the group's first offset never handed out, after
        every delivery it received (a group of one's are this subscription's own;
        in a partition it received nothing from, where it started)."""
        return Positions(
            {p: part.resume_positions().offsets[p] for p, part in enumerate(self._parts)}
        )

    def grant(self, n: int) -> None:
        if n < 0:
            raise ValueError("credit must not be negative")
        if self._credit is not None:
            self._credit += n
            self._lot.unpark_all()
            for lot in self._watching:
                lot.unpark_all()

    async def receive(self, max_count: int | None = None) -> list[Delivery]:
        take = PartitionedSubscription.take  # not the instance's, which a counting facade may wrap
        while True:
            out = take(self, max_count)
            if out:
                return out
            await self._lot.park()

    def watch(self, lot: trio.lowlevel.ParkingLot) -> None:
        """Wake ``lot`` whenever any partition may have something new, or credit came."""
        self._watching.append(lot)
        for part in self._parts:
            part.watch(lot)

    def take(self, max_count: int | None = None) -> list[Delivery]:
        """What the partitions have now, within the one credit and unacked window,
        starting at the partition after the previous start (``[]``: nothing)."""
        if self._closed:
            raise trio.ClosedResourceError("subscription closed")
        if self._ended:
            raise EndOfStream(f"read of {self.destination!r} ended in every partition")
        parts = self._parts
        n = len(parts)
        room = self._max_unacked - sum(part.unacked for part in parts)
        if self._credit is not None:
            room = min(room, self._credit)
        if max_count is not None:
            room = min(room, max_count)
        room = max(room, 0)
        held = 0 if self._max_unacked_bytes is None else sum(p.unacked_bytes for p in parts)
        ended = self._part_ended
        out: list[Delivery] = []
        start = self._next
        self._next = start + 1 if start + 1 < n else 0
        for i in range(start, start + n):
            p = i if i < n else i - n
            if ended[p]:
                continue
            part = parts[p]
            own = part.unacked_bytes
            try:
                got = part.take(room - len(out), shared_bytes=held - own)
            except EndOfStream:
                ended[p] = True
                continue
            if got:
                held += part.unacked_bytes - own
                out += [new_delivery((t * n + p, m, r, pos, by)) for t, m, r, pos, by in got]
        if self._credit is not None:
            self._credit -= len(out)
        if not out and all(ended):
            self._ended = True
            raise EndOfStream(f"read of {self.destination!r} ended in every partition")
        return out

    def _route(self, tag: int) -> tuple[LogSubscription, int]:
        """The partition's subscription that delivered ``tag``, and its tag there."""
        tag_there, p = divmod(tag, len(self._parts))
        return self._parts[p], tag_there

    def ack(self, tag: int) -> None:
        part, tag_there = self._route(tag)
        try:
            part.ack(tag_there)
        except KeyError:
            raise KeyError(f"unknown or already settled delivery tag {tag}") from None

    def ack_many(self, tags: Iterable[int]) -> None:
        """Settle ``tags`` in order (each run of one partition's in one call there); an
        unknown or settled tag raises KeyError after the ones before it settled."""
        n = len(self._parts)
        run: list[int] = []
        run_tags: list[int] = []
        current = -1
        for tag in tags:
            tag_there, p = divmod(tag, n)
            if p != current and run:
                self._ack_run(current, run, run_tags)
                run, run_tags = [], []
            current = p
            run.append(tag_there)
            run_tags.append(tag)
        if run:
            self._ack_run(current, run, run_tags)

    def _ack_run(self, p: int, tags_there: list[int], tags: list[int]) -> None:
        part = self._parts[p]
        before = part.unacked
        try:
            part.ack_many(tags_there)
        except KeyError:
            bad = tags[before - part.unacked]
            raise KeyError(f"unknown or already settled delivery tag {bad}") from None

    def nack(
        self, tag: int, *, requeue: bool = True, outcome: Outcome = Outcome.FAILED, reason: str = ""
    ) -> None:
        """Redeliver the message (in its partition), or skip it there (``requeue=False``)."""
        part, tag_there = self._route(tag)
        try:
            part.nack(tag_there, requeue=requeue, outcome=outcome, reason=reason)
        except KeyError:
            raise KeyError(f"unknown or already settled delivery tag {tag}") from None

    def reply(self, tag: int, reply: Reply) -> None:
        part, tag_there = self._route(tag)
        part.reply(tag_there, reply)

    def close(self) -> None:
        """Leave every partition's group (unacked deliveries go back to it); idempotent."""
        self._closed = True
        for part in self._parts:
            part.close()
        self._lot.unpark_all()
        for lot in self._watching:
            lot.unpark_all()
        self._watching.clear()


class _Scatter:
    """The receipt of a publish as one partition sees its share of the messages: the
    share's indexes ``0…`` are the publish's ``indexes``. Forwards what a log
    destination calls on a receipt, with the indexes translated."""

    __slots__ = ("_indexes", "_receipt")

    def __init__(self, receipt: Receipt, indexes: list[int]) -> None:
        self._receipt = receipt
        self._indexes = indexes

    def add_legs(self, n: int = 1) -> None:
        self._receipt.add_legs(n)

    def settle(
        self,
        index: int,
        outcome: Outcome | None,
        reason: str = "",
        *,
        reason_code: Reason = Reason.REFUSED_BY_TARGET,
        code: int | None = None,
        details: Mapping[str, str] | None = None,
        reply: Reply | None = None,
    ) -> None:
        self._receipt.settle(
            self._indexes[index],
            outcome,
            reason,
            reason_code=reason_code,
            code=code,
            details=details,
            reply=reply,
        )

    def settle_range(
        self,
        start: int,
        stop: int,
        outcome: Outcome | None,
        reason: str = "",
        *,
        reason_code: Reason = Reason.REFUSED_BY_TARGET,
    ) -> None:
        for lo, hi, first in self._runs(start, stop):
            self._receipt.settle_range(
                first, first + hi - lo, outcome, reason, reason_code=reason_code
            )

    def settle_stored(self, start: int, destination: str, positions: Sequence[Position]) -> None:
        for lo, hi, first in self._runs(start, start + len(positions)):
            self._receipt.settle_stored(first, destination, positions[lo - start : hi - start])

    def _runs(self, start: int, stop: int) -> Iterator[tuple[int, int, int]]:
        """Runs ``lo``…``hi`` of the share's indexes that are consecutive in the
        publish, each with the publish index of ``lo``."""
        indexes = self._indexes
        lo = start
        while lo < stop:
            hi = lo + 1
            while hi < stop and indexes[hi] == indexes[hi - 1] + 1:
                hi += 1
            yield lo, hi, indexes[lo]
            lo = hi
