"""Offsets, read limits and input partitions of the ``interchange`` data source:
pure planning over a segment service, no Spark and no I/O of its own.

A durable destination ``NAME`` is kept in the segments ``NAME/0`` …
``NAME/N-1``, one per partition, each an append-only log addressed by byte
offset. A position in the stream is therefore one byte offset per partition,
written as JSON the way Spark's Kafka source writes its offsets::

    {"logs": {"0": 1234}, "parts": {"0": 0, "1": 880, "2": 96}}

(partition indexes are strings, as JSON keys must be). In ``startingOffsets``
and ``endingOffsets`` an offset may also be ``-2`` (earliest: the retained
start) or ``-1`` (latest: the durable end), and the whole option may be the
word ``earliest`` or ``latest``. A partition or destination the JSON leaves out
starts at earliest and ends at latest. A byte offset given inside an event
means the boundary before that event.

Every offset planned here is an event boundary: the durable end, a retained
start, or an answer of the gateway's ``LocateOffset``, which finds boundaries
from the store's record index without reading data. That is what keeps
planning cheap on Spark's driver: one ``GetStreamSegmentInfo`` per partition
per trigger and a ``LocateOffset`` per partition a read limit cuts.

Read limits are shared across partitions: ``maxRecordsPerTrigger`` and
``maxBytesPerTrigger`` are divided evenly among the partitions that have data,
a partition needing less than its share leaving the rest to the others, and
every partition with data reads at least one event (so a trigger may read up
to one event per partition more than the limit; it never stalls).

Input partitions: one Spark task per partition range, a range above
``maxBytesPerPartition`` cut at event boundaries into pieces of about equal size
(as many as a multiple of ``minPartitions``, so the last wave of tasks is as full
as the others), and with ``minPartitions`` the largest ranges halved until there
are that many, so a destination of one partition is still read by several cores.

Data loss: retention drops a segment's oldest chunks whether or not a reader
got to them. A planned start below a segment's retained start is an error
naming the segment and the bytes lost (``failOnDataLoss``, the default), or,
with ``failOnDataLoss`` false, skipped to the retained start with a WARNING
saying the same.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple, Protocol

__all__ = [
    "DEFAULT_MAX_BYTES_PER_PARTITION",
    "EARLIEST",
    "LATEST",
    "Bound",
    "DataLossError",
    "OffsetSpec",
    "Offsets",
    "Planner",
    "SegmentRange",
    "checked_start",
    "offsets_from_json",
    "offsets_to_json",
    "parse_offsets",
    "segment_name",
    "share",
]

log = logging.getLogger("gateway.pipeline")

#: The offset meaning "the retained start" in offset JSON (as Kafka's -2).
EARLIEST = -2
#: The offset meaning "the durable end" in offset JSON (as Kafka's -1).
LATEST = -1
#: A range above this many bytes is read by several Spark tasks (64 MiB).
DEFAULT_MAX_BYTES_PER_PARTITION = 64 << 20

#: A byte offset per partition per destination: ``{destination: {partition: offset}}``.
Offsets = dict[str, dict[int, int]]
#: ``"earliest"``, ``"latest"``, or offsets that may hold EARLIEST / LATEST.
OffsetSpec = str | Offsets


class SegmentState(Protocol):
    """What planning needs of a segment's ``StreamSegmentInfo``."""

    @property
    def segment(self) -> str: ...
    @property
    def start(self) -> int: ...
    @property
    def end(self) -> int: ...
    @property
    def first_event(self) -> int: ...
    @property
    def next_event(self) -> int: ...


class SegmentService(Protocol):
    """The calls of the blocking segment client planning makes."""

    def partitions(self, destination: str) -> Sequence[SegmentState]: ...
    def locate(self, segment: str, target: int, events: int | None = None) -> tuple[int, int]: ...


class DataLossError(RuntimeError):
    """Events a query was to read were dropped by retention before it read them."""


@dataclass(frozen=True)
class SegmentRange:
    """Bytes ``[start, end)`` of one partition's segment: one Spark task's read.
    Both ends are event boundaries."""

    destination: str
    partition: int
    segment: str
    start: int
    end: int


class Bound(NamedTuple):
    """How far a trigger may read a partition: a byte offset and the index of the
    event there."""

    offset: int
    event: int


def segment_name(destination: str, partition: int) -> str:
    """The segment keeping ``partition`` of ``destination``."""
    return f"{destination}/{partition}"


def parse_offsets(text: str, *, option: str) -> OffsetSpec:
    """``earliest``, ``latest`` or the offsets of a JSON ``startingOffsets`` /
    ``endingOffsets`` option; ValueError naming ``option`` and what is wrong."""
    word = text.strip().lower()
    if word in ("earliest", "latest"):
        return word
    try:
        doc = json.loads(text)
    except ValueError:
        raise ValueError(
            f"option {option}: expected earliest, latest or JSON like "
            f'{{"logs": {{"0": 0}}}}, not {text!r}'
        ) from None
    try:
        offsets = offsets_from_json(doc)
    except ValueError as e:
        raise ValueError(f"option {option}: {e}") from None
    for destination, parts in offsets.items():
        for partition, offset in parts.items():
            if offset < EARLIEST:
                raise ValueError(
                    f"option {option}: {destination} partition {partition}: offset {offset}"
                    f" (a byte offset, {LATEST} for latest or {EARLIEST} for earliest)"
                )
    return offsets


def offsets_from_json(doc: object) -> Offsets:
    """Offsets from their JSON form (as Spark hands them back); ValueError if ``doc``
    is not ``{destination: {partition: offset}}``."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"offsets must be a JSON object, not {type(doc).__name__}")
    out: Offsets = {}
    for destination, parts in doc.items():
        if not isinstance(parts, Mapping):
            raise ValueError(f"{destination}: expected an object of partition: offset")
        own: dict[int, int] = {}
        for key, offset in parts.items():
            if not str(key).isdigit() or type(offset) is not int:
                raise ValueError(
                    f"{destination}: expected partition index: integer offset,"
                    f" not {key!r}: {offset!r}"
                )
            own[int(key)] = offset
        out[str(destination)] = own
    return out


def offsets_to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    """The JSON form of ``offsets`` (string partition keys, in order)."""
    return {
        destination: {str(p): parts[p] for p in sorted(parts)}
        for destination, parts in sorted(offsets.items())
    }


def share(total: int, available: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
    """``total`` divided among the keys with something ``available``: evenly, a key
    needing less than its share getting what it has and leaving the rest to the
    others, at least 1 for every key with anything available. Keys with nothing
    get 0. Deterministic: ties are broken by key."""
    out = dict.fromkeys(available, 0)
    pending = sorted((a, key) for key, a in available.items() if a > 0)
    remaining = total
    while pending:
        fair = max(1, remaining // len(pending))
        amount, key = pending[0]
        if amount > fair:
            break
        out[key] = amount
        remaining -= amount
        pending.pop(0)
    if pending:
        base, extra = divmod(max(remaining, 0), len(pending))
        for i, (amount, key) in enumerate(pending):
            out[key] = min(amount, max(1, base + (1 if i < extra else 0)))
    return out


def checked_start(
    destination: str,
    partition: int,
    start: int,
    retained: int,
    *,
    fail: bool,
    why: str = "were dropped by retention",
) -> int:
    """``start``, or ``retained`` when the bytes before it are gone (``why``) before
    ``start`` was read: DataLossError when ``fail`` (``failOnDataLoss``), else a
    WARNING. Both name the segment and the bytes lost."""
    if start >= retained:
        return start
    segment = segment_name(destination, partition)
    facts = (
        f"segment {segment!r}: bytes {start} to {retained} ({retained - start} bytes)"
        f" {why} before this query read them"
    )
    if fail:
        raise DataLossError(
            f"{facts}; the query stops (failOnDataLoss is true; set it to false to"
            f" skip to byte {retained})"
        )
    log.warning("%s; skipping to byte %d (failOnDataLoss is false)", facts, retained)
    return retained


class Planner:
    """Planning over ``service`` for the destinations a query reads.

    ``fail_on_data_loss`` decides what a start below the retained start is (see
    the module's docstring); ``max_bytes_per_partition`` is where ranges are
    split, and ``min_partitions`` how many ranges a plan has at least, the
    largest halved until then, so that one busy partition keeps several Spark
    cores reading."""

    def __init__(
        self,
        service: SegmentService,
        destinations: Sequence[str],
        *,
        fail_on_data_loss: bool = True,
        max_bytes_per_partition: int = DEFAULT_MAX_BYTES_PER_PARTITION,
        min_partitions: int = 1,
    ) -> None:
        self.service = service
        self.destinations = tuple(destinations)
        self.fail_on_data_loss = fail_on_data_loss
        self.max_bytes_per_partition = max_bytes_per_partition
        self.min_partitions = min_partitions

    # -- the segments now ------------------------------------------------------

    def layout(self) -> dict[str, list[SegmentState]]:
        """Every destination's partitions as the gateway reports them now (an
        empty list: no segment yet, the destination was never written)."""
        return {d: list(self.service.partitions(d)) for d in self.destinations}

    def resolve(
        self,
        spec: OffsetSpec,
        layout: Mapping[str, Sequence[SegmentState]],
        missing: int = EARLIEST,
    ) -> Offsets:
        """Concrete offsets of a ``startingOffsets`` / ``endingOffsets`` value over
        ``layout``: earliest is each retained start, latest each durable end; a
        partition the JSON leaves out is ``missing`` (EARLIEST for a start, LATEST
        for an end). A byte offset given inside the
        retained data becomes the event boundary at or before it, one past the
        durable end becomes the end; one below the retained start is kept, for the
        data-loss check to judge. Offsets of destinations not read are ignored."""
        out: Offsets = {}
        for destination, infos in layout.items():
            given = spec.get(destination, {}) if isinstance(spec, dict) else {}
            own: dict[int, int] = {}
            for partition, info in enumerate(infos):
                offset = given.get(partition, missing)
                if spec == "latest" or offset == LATEST or offset >= info.end:
                    offset = info.end
                elif spec == "earliest" or offset == EARLIEST:
                    offset = info.start
                elif offset > info.start:
                    offset = self.service.locate(info.segment, offset)[0]
                own[partition] = offset
            out[destination] = own
        return out

    def bounds(self, layout: Mapping[str, Sequence[SegmentState]]) -> dict[tuple[str, int], Bound]:
        """The durable end of every partition of ``layout``, with its event index:
        what a trigger may read up to (AvailableNow freezes these)."""
        return {
            (destination, p): Bound(info.end, info.next_event)
            for destination, infos in layout.items()
            for p, info in enumerate(infos)
        }

    # -- data loss -------------------------------------------------------------

    def checked_start(self, destination: str, partition: int, start: int, retained: int) -> int:
        """:func:`checked_start` under this planner's ``fail_on_data_loss``."""
        return checked_start(destination, partition, start, retained, fail=self.fail_on_data_loss)

    # -- streaming triggers ----------------------------------------------------

    def latest(
        self,
        start: Offsets,
        *,
        max_rows: int | None = None,
        max_bytes: int | None = None,
        target: Mapping[tuple[str, int], Bound] | None = None,
    ) -> Offsets:
        """The end of the next micro-batch from ``start``: as far as the durable
        ends (or the frozen ``target``), within ``max_rows`` events or
        ``max_bytes`` bytes shared across partitions. A partition ``start`` does
        not know yet joins at its retained start, reading nothing in this batch
        (so a replay of the batch plans the same ranges)."""
        layout = self.layout()
        bounds = self.bounds(layout) if target is None else dict(target)
        begin: dict[tuple[str, int], int] = {}
        end: Offsets = {d: {} for d in layout}
        for destination, infos in layout.items():
            known = start.get(destination, {})
            for p, info in enumerate(infos):
                if p not in known:
                    end[destination][p] = info.start
                    continue
                offset = known[p]
                if self.fail_on_data_loss:
                    offset = self.checked_start(destination, p, offset, info.start)
                offset = max(offset, info.start)
                bound = bounds.get((destination, p))
                if bound is None or bound.offset <= offset:
                    end[destination][p] = max(offset, known[p])
                    continue
                begin[(destination, p)] = offset
                end[destination][p] = bound.offset
        if max_rows is not None:
            self._limit_rows(begin, bounds, max_rows, end)
        elif max_bytes is not None:
            self._limit_bytes(begin, bounds, max_bytes, end)
        return end

    def _limit_rows(
        self,
        begin: Mapping[tuple[str, int], int],
        bounds: Mapping[tuple[str, int], Bound],
        max_rows: int,
        end: Offsets,
    ) -> None:
        """Cut ``end`` to ``max_rows`` events shared over the partitions of ``begin``."""
        first = {
            key: self.service.locate(segment_name(*key), offset)[1] for key, offset in begin.items()
        }
        available = {key: bounds[key].event - first[key] for key in begin}
        for key, rows in share(max_rows, available).items():
            if rows < available[key]:
                located = self.service.locate(segment_name(*key), begin[key], rows)[0]
                end[key[0]][key[1]] = min(located, bounds[key].offset)

    def _limit_bytes(
        self,
        begin: Mapping[tuple[str, int], int],
        bounds: Mapping[tuple[str, int], Bound],
        max_bytes: int,
        end: Offsets,
    ) -> None:
        """Cut ``end`` to about ``max_bytes`` shared over the partitions of ``begin``:
        the last boundary within each share, or one event past the start."""
        available = {key: bounds[key].offset - offset for key, offset in begin.items()}
        for key, size in share(max_bytes, available).items():
            if size < available[key]:
                segment = segment_name(*key)
                located = self.service.locate(segment, begin[key] + size)[0]
                if located <= begin[key]:
                    located = self.service.locate(segment, begin[key], 1)[0]
                end[key[0]][key[1]] = min(located, bounds[key].offset)

    # -- input partitions ------------------------------------------------------

    def ranges(self, start: Offsets, end: Offsets) -> list[SegmentRange]:
        """The byte ranges from ``start`` to ``end``, one per partition that has
        data, split at event boundaries above ``max_bytes_per_partition`` and
        until there are ``min_partitions`` (:meth:`spread`). A
        partition ``start`` does not know begins at its retained start; a start
        below the retained start is data loss (:meth:`checked_start`)."""
        layout = self.layout()
        out: list[SegmentRange] = []
        for destination, parts in sorted(end.items()):
            infos = layout.get(destination, [])
            for p, stop in sorted(parts.items()):
                retained = infos[p].start if p < len(infos) else 0
                first = start.get(destination, {}).get(p, retained)
                first = self.checked_start(destination, p, first, retained)
                if stop > first:
                    whole = SegmentRange(destination, p, segment_name(destination, p), first, stop)
                    out.extend(self.split(whole))
        return self.spread(out)

    def split(self, whole: SegmentRange) -> Iterable[SegmentRange]:
        """``whole`` in pieces of about equal size, at most
        ``max_bytes_per_partition`` bytes each, cut at event boundaries (an event
        larger than that is a piece of its own). The count of pieces is rounded up
        to a multiple of ``min_partitions``: pieces of equal size in whole waves
        keep every core busy to the end, where a short last piece would leave all
        but one idle."""
        size = whole.end - whole.start
        pieces = -(-size // self.max_bytes_per_partition)
        if pieces > 1:
            pieces = -(-pieces // self.min_partitions) * self.min_partitions
        start = whole.start
        for k in range(1, pieces):
            cut = self.service.locate(whole.segment, whole.start + size * k // pieces)[0]
            if cut <= start:
                cut = self.service.locate(whole.segment, start, 1)[0]
            if cut >= whole.end:
                break
            yield SegmentRange(whole.destination, whole.partition, whole.segment, start, cut)
            start = cut
        if whole.end > start:
            yield SegmentRange(whole.destination, whole.partition, whole.segment, start, whole.end)

    def spread(self, ranges: Sequence[SegmentRange]) -> list[SegmentRange]:
        """``ranges`` with the largest halved at an event boundary until there are
        ``min_partitions`` of them or none can be cut (single events), in order.
        The same ranges always give the same pieces, as a replay needs."""
        out = list(ranges)
        whole: set[SegmentRange] = set()
        while len(out) < self.min_partitions:
            candidates = [r for r in out if r not in whole]
            if not candidates:
                break
            big = max(candidates, key=lambda r: r.end - r.start)
            cut = self.service.locate(big.segment, big.start + (big.end - big.start) // 2)[0]
            if cut <= big.start:
                cut = self.service.locate(big.segment, big.start, 1)[0]
            if not big.start < cut < big.end:
                whole.add(big)
                continue
            i = out.index(big)
            out[i : i + 1] = [replace(big, end=cut), replace(big, start=cut)]
        return out
