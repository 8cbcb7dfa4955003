"""A segment: an append-only sequence of event-framed records on disk.

Byte offsets address a segment (a segment-append ``ReadSegment`` reads from
any of them) and so do event indexes (dense, from 0 since the segment was
created: the durable destinations' positions). Writes happen at once in the
trio thread, straight to the OS page cache; when they become *durable* is up
to the store's committer and its fsync policy, and ``durable_end``,
``when_durable`` and the writer ledger follow that. Reads are synchronous
too (``pread`` of data the page cache most likely holds), bounded by their
``max_bytes``.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import trio

from gateway.store.chunk import Chunk, FileCache
from gateway.store.layout import ZERO_UUID, chunk_paths, crc32, pack_entry
from gateway.store.records import EVENT_HEADER, RecordFormat, count_events, event_offsets
from gateway.store.space import DiskSpace, is_full

__all__ = ["Appended", "Segment", "SegmentDamaged", "SegmentHost", "SegmentTruncated"]

log = logging.getLogger("gateway.store")

_HEADER = EVENT_HEADER.size
_CORRUPT_EVENT = (RecordFormat.CORRUPT, b"")


@dataclass(frozen=True, slots=True)
class Appended:
    """Where one append landed."""

    #: Byte offset of the first appended byte.
    offset: int
    #: Byte offset just after the last.
    end: int
    #: Event index of the first appended event.
    first_event: int
    #: Events appended.
    count: int


class SegmentHost(Protocol):
    """What a segment needs of the store that holds it (the store is one).

    Named here so that a segment does not import the store, which imports it.
    """

    chunk_bytes: int
    retain_bytes: int | None
    retain_age: float | None
    files: FileCache
    space: DiskSpace
    record_cache: Any

    def now_us(self) -> int: ...
    def create_files(self, segment: Segment, chunk: Chunk) -> None: ...
    def written(self, segment: Segment, chunk: Chunk) -> None: ...
    def wants_commit(self, segment: Segment) -> None: ...
    def cache_record(self, key: Any, value: Any, size: int) -> None: ...


class SegmentTruncated(Exception):
    """A read below the retained start of a segment: the data is gone (retention or
    ``truncate_before``); ``start`` and ``first_event`` say where data begins now."""

    def __init__(self, segment: str, start: int, first_event: int) -> None:
        super().__init__(f"segment {segment!r} starts at byte {start} (event {first_event}) now")
        self.start = start
        self.first_event = first_event


class SegmentDamaged(Exception):
    """A raw read starting in a damaged record (its data failed its checksum, found by
    recovery or by a read): its bytes ``[offset, end)`` are never returned, and reading
    may go on at ``end``, where the next record starts."""

    def __init__(self, segment: str, offset: int, end: int) -> None:
        super().__init__(
            f"segment {segment!r}: bytes {offset}..{end - 1} are a damaged record (its data "
            f"failed its checksum) and are never read; reading goes on at byte {end}"
        )
        self.offset = offset
        self.end = end


OnAppend = Callable[[Appended, RecordFormat], None]
OnTruncate = Callable[[int], None]


class Segment:
    """One segment of a :class:`~gateway.store.store.Store` (get it from ``Store.segment``)."""

    def __init__(
        self,
        store: SegmentHost,
        name: str,
        directory: Path,
        chunks: list[Chunk],
        first_event: int,
        ledger: dict[uuid.UUID, int],
        corrupt_records: int = 0,
    ) -> None:
        self.name = name
        self.directory = directory
        self._store = store
        self._chunks = chunks
        last = chunks[-1]
        self.end = last.end
        self.durable_end = self.end
        self.next_event = last.next_event
        self.first_event = min(max(first_event, chunks[0].first_event), self.next_event)
        #: Retention bounds of this segment: the store's, unless its owner sets its own.
        self.retain_bytes: int | None = store.retain_bytes
        self.retain_age: float | None = store.retain_age
        self._written_ledger = dict(ledger)
        self._durable_ledger = dict(ledger)
        #: (end, writer, last event number) of appends not yet durable, in order.
        self._ledger_pending: deque[tuple[int, uuid.UUID, int]] = deque()
        self._callbacks: list[tuple[int, int, Callable[[], None]]] = []
        self._sequence = itertools.count()
        self._observers: list[tuple[OnAppend, OnTruncate | None]] = []
        self._lot = trio.lowlevel.ParkingLot()
        self._closed = False
        #: Records recovery found damaged, and those reads found since (by offset: each is
        #: logged and counted once).
        self._recovered_corrupt = corrupt_records
        self._found_corrupt: set[int] = set()
        #: Per chunk (by start), how many of its first records reads have checked: raw
        #: reads of those go straight to the file (damaged ones are known and skipped).
        self._checked: dict[int, int] = {}
        #: Retention wants every chunk below this event deleted (the committer does it).
        self.delete_below = self.first_event
        self.meta_dirty = False
        self._stats = {"appends": 0, "appended_bytes": 0, "appended_events": 0, "reads": 0}
        #: Byte offset of the first retained byte (of event ``first_event``).
        self.start = self.event_offset(self.first_event)

    # -- appending ---------------------------------------------------------------

    def append(
        self,
        data: bytes | bytearray | memoryview,
        count: int,
        *,
        format: RecordFormat = RecordFormat.RAW,
        writer: uuid.UUID | None = None,
        last_event_number: int | None = None,
        verified: bool = False,
    ) -> Appended:
        """Write one record: ``data`` must be exactly ``count`` >= 1 event-framed events
        (else ValueError and nothing is written). Written to the OS at once, durable
        later; observers are called before it returns. ``writer`` and
        ``last_event_number`` (both or neither) update that writer's ledger entry, which
        becomes durable with the record. trio.ClosedResourceError once the store closed;
        StorageFull (nothing written) while the disk is full: retry after ``await
        error.room()``.

        ``verified=True`` says the caller has already walked the framing and counted
        ``count`` events (the segment-append codec does, and so does a writer that framed
        the events itself); the walk is then not repeated, which on the append path of
        1 KiB events is about a fifth of the gateway's time. Wrong framing stored this way
        reads back as a corrupt record, never as other events."""
        if self._closed:
            raise trio.ClosedResourceError(f"the store of segment {self.name!r} is closed")
        if count < 1:
            raise ValueError(f"an append holds at least one event, not {count}")
        if not verified:
            found = count_events(data)
            if found != count:
                raise ValueError(f"the data frames {found} events, not {count}")
        if (writer is None) != (last_event_number is None):
            raise ValueError("writer and last_event_number go together")
        store = self._store
        size = len(data)
        if store.space.full:
            raise store.space.refuse(f"segment {self.name!r}", size)
        chunk = self._chunks[-1]
        if chunk.size and chunk.size + size > store.chunk_bytes:
            chunk = self._roll()
        offset = self.end
        first = self.next_event
        crc = crc32(data)
        now = store.now_us()
        writer_bytes = writer.bytes if writer is not None else ZERO_UUID.bytes
        entry = pack_entry(
            offset, first, size, count, format, 0, writer_bytes, last_event_number or 0, now, crc
        )
        try:
            if not chunk.created:
                store.create_files(self, chunk)
            chunk.append(data, entry, first, count, format, crc, now)
        except OSError as e:
            if is_full(e):
                raise store.space.exhausted(e, f"segment {self.name!r}", size) from e
            raise
        store.files.touch(chunk)
        end = offset + size
        self.end = end
        self.next_event = first + count
        stats = self._stats
        stats["appends"] += 1
        stats["appended_bytes"] += size
        stats["appended_events"] += count
        if writer is not None and last_event_number is not None:
            self._written_ledger[writer] = last_event_number
            self._ledger_pending.append((end, writer, last_event_number))
        store.written(self, chunk)
        appended = Appended(offset, end, first, count)
        for on_append, _ in tuple(self._observers):
            on_append(appended, format)
        self._lot.unpark_all()
        return appended

    def _roll(self) -> Chunk:
        """Start a new chunk at the end (the old one stays dirty until the committer
        has synced it); its files come with its first append."""
        data_path, index_path = chunk_paths(self.directory, self.end)
        chunk = Chunk(data_path, index_path, self.end, self.next_event)
        chunk.created = False
        self._chunks.append(chunk)
        return chunk

    # -- durability --------------------------------------------------------------

    def when_durable(self, end: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (in the trio thread, from the committer task) once
        ``durable_end >= end``; at once (synchronously) if it already is. Callbacks run
        in order of ``end``."""
        if end <= self.durable_end:
            callback()
            return
        heapq.heappush(self._callbacks, (end, next(self._sequence), callback))
        self._store.wants_commit(self)

    async def durable(self, end: int) -> None:
        """Wait until ``durable_end >= end``."""
        if end <= self.durable_end:
            return
        event = trio.Event()
        self.when_durable(end, event.set)
        await event.wait()

    @property
    def has_callbacks(self) -> bool:
        return bool(self._callbacks)

    def advance_durable(self, end: int, *, callbacks: bool = True) -> None:
        """Everything below ``end`` is durable now (the committer says so; under
        ``never``, the append); run the callbacks that waited for it if ``callbacks``."""
        if end > self.durable_end:
            self.durable_end = end
            pending = self._ledger_pending
            while pending and pending[0][0] <= end:
                _, writer, number = pending.popleft()
                self._durable_ledger[writer] = number
        waiting = self._callbacks
        while callbacks and waiting and waiting[0][0] <= self.durable_end:
            callback = heapq.heappop(waiting)[2]
            try:
                callback()
            except Exception:
                log.exception("a durability callback of segment %r failed", self.name)

    def last_event_number(self, writer: uuid.UUID, *, durable: bool = True) -> int | None:
        """The writer's last event number stored (``durable``: durable under the fsync
        policy; else written, maybe not yet durable); None for a writer never seen."""
        return (self._durable_ledger if durable else self._written_ledger).get(writer)

    # -- reading -------------------------------------------------------------------

    def _check_offset(self, offset: int) -> None:
        if offset < self.start:
            raise SegmentTruncated(self.name, self.start, self.first_event)
        if offset > self.end:
            raise ValueError(f"offset {offset} is beyond the end ({self.end}) of {self.name!r}")

    def _chunk_at_offset(self, offset: int) -> Chunk:
        i = bisect.bisect_right(self._chunks, offset, key=_chunk_start) - 1
        chunk = self._chunks[max(i, 0)]
        self._store.files.touch(chunk)
        return chunk

    def _chunk_at_event(self, event: int) -> Chunk:
        i = bisect.bisect_right(self._chunks, event, key=_chunk_first_event) - 1
        chunk = self._chunks[max(i, 0)]
        self._store.files.touch(chunk)
        return chunk

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Raw stored bytes from ``offset`` (any offset, not only event boundaries), at
        most ``max_bytes``; b"" at ``end``. SegmentTruncated below ``start``; ValueError
        beyond ``end``.

        Never the bytes of a damaged record: each record's CRC (and framing) is checked
        the first time a read reaches it, as ``read_events`` does. A read that reaches a
        damaged record stops before it (fewer bytes than asked; it always ends on an
        event boundary), a read starting in one raises SegmentDamaged, whose ``end`` is
        where reading may go on."""
        self._check_offset(offset)
        self._stats["reads"] += 1
        stop = offset + max(0, min(max_bytes, self.end - offset))
        parts: list[bytes] = []
        pos = offset
        while pos < stop:
            chunk = self._chunk_at_offset(pos)
            limit = min(stop, chunk.end)
            r = chunk.record_of_offset(pos)
            checked_end = self._checked_end(chunk, r, limit)
            if checked_end > pos:
                # Records already checked: straight from the file, many at once.
                data = chunk.pread(checked_end - pos, pos)
                if not data:
                    break
                parts.append(data)
                pos += len(data)
                continue
            # Records not checked yet: read whole, checked, up to the first damaged one.
            record_offset, length, _, _ = chunk.record_bounds(r)
            data, intact_end = self._check_records(chunk, r, limit)
            if intact_end <= pos:
                if parts:
                    break
                raise SegmentDamaged(self.name, record_offset, record_offset + length)
            piece = data[pos - record_offset : min(limit, intact_end) - record_offset]
            parts.append(piece)
            pos += len(piece)
            if intact_end < limit:
                break  # a damaged record follows
        return b"".join(parts)

    def _check_records(self, chunk: Chunk, r: int, limit: int) -> tuple[bytes, int]:
        """Read records ``r``, ``r+1``, ... of ``chunk`` up to the one holding byte
        ``limit - 1``, whole and in one read, and check each (CRC, framing) until one is
        damaged (it is marked so). The bytes read, from record ``r``'s start, and where
        the intact ones end."""
        offsets, events, formats, crcs = chunk.columns()
        records = chunk.records
        q = bisect.bisect_left(offsets, limit, r + 1, records)
        start = offsets[r]
        data = chunk.pread((offsets[q] if q < records else chunk.end) - start, start)
        view = memoryview(data)
        found = self._found_corrupt
        intact_end = start
        for i in range(r, q):
            if i + 1 < records:
                end, count = offsets[i + 1], events[i + 1] - events[i]
            else:
                end, count = chunk.end, chunk.next_event - events[i]
            record = view[offsets[i] - start : end - start]
            damaged = formats[i] == RecordFormat.CORRUPT or (found and offsets[i] in found)
            if not damaged and not _intact(record, end - offsets[i], crcs[i], count):
                damaged = True
                self._note_corrupt(offsets[i])
            self._was_checked(chunk, i)
            if damaged:
                formats[i] = RecordFormat.CORRUPT
                break
            intact_end = end
        return data, intact_end

    def _checked_end(self, chunk: Chunk, r: int, limit: int) -> int:
        """Where the run of records from ``r`` that reads checked and found intact ends
        (at most ``limit``); the start of record ``r`` if it is not one of them."""
        offsets, _, formats, _ = chunk.columns()
        checked = min(self._checked.get(chunk.start, 0), chunk.records)
        found = self._found_corrupt
        corrupt = RecordFormat.CORRUPT
        q = r
        while q < checked and offsets[q] < limit and formats[q] != corrupt:
            if found and offsets[q] in found:
                break
            q += 1
        end = offsets[q] if q < chunk.records else chunk.end
        return min(end, limit)

    def read_events(
        self, first: int, max_count: int, max_bytes: int
    ) -> list[tuple[RecordFormat, bytes]]:
        """Payloads (without the 8-byte event header) of events ``first``, ``first+1``,
        ...: at most ``max_count``, stopping before ``max_bytes`` of payload is passed
        but always at least one event when ``first < next_event``; [] at ``next_event``.
        SegmentTruncated below ``first_event``; ValueError beyond ``next_event``. Events
        of a record that failed its checksum come back as ``(CORRUPT, b"")`` so indexes
        stay dense."""
        if first < self.first_event:
            raise SegmentTruncated(self.name, self.start, self.first_event)
        if first > self.next_event:
            raise ValueError(
                f"event {first} is beyond the next event ({self.next_event}) of {self.name!r}"
            )
        self._stats["reads"] += 1
        out: list[tuple[RecordFormat, bytes]] = []
        total = 0
        event = first
        while len(out) < max_count and event < self.next_event:
            chunk = self._chunk_at_event(event)
            r = chunk.record_of_event(event)
            before = event
            while r < chunk.records and len(out) < max_count:
                _, _, record_first, count = chunk.record_bounds(r)
                skip = event - record_first
                if skip < 0:
                    break
                if skip < count:
                    fmt, data, offsets = self._record(chunk, r)
                    if fmt is RecordFormat.CORRUPT:
                        n = min(count - skip, max_count - len(out))
                        out.extend([_CORRUPT_EVENT] * n)
                        event += n
                    else:
                        take = min(count, skip + max_count - len(out))
                        for i in range(skip, take):
                            pos = offsets[i]
                            stop = offsets[i + 1] if i + 1 < count else len(data)
                            size = stop - pos - _HEADER
                            if out and total + size > max_bytes:
                                return out
                            total += size
                            out.append((fmt, data[pos + _HEADER : stop]))
                        event += take - skip
                r += 1
            if event == before:
                # Recovery keeps event indexes dense; a hole here is a bug, not a loop.
                raise RuntimeError(f"segment {self.name!r}: no record holds event {event}")
        return out

    def _record(self, chunk: Chunk, r: int) -> tuple[RecordFormat, bytes, list[int]]:
        """Record ``r`` of ``chunk``: its format, data and event offsets, read and checked
        once (a small cache in the store keeps them for sequential readers). A record
        recovery flagged, or that fails its CRC or framing, is ``(CORRUPT, b"", [])``."""
        offset, length, _, count = chunk.record_bounds(r)
        formats = chunk.columns()[2]
        if formats[r] != RecordFormat.CORRUPT and offset in self._found_corrupt:
            formats[r] = RecordFormat.CORRUPT  # found before the columns were reloaded
        if formats[r] == RecordFormat.CORRUPT:
            self._was_checked(chunk, r)
            return RecordFormat.CORRUPT, b"", []
        cache = self._store.record_cache
        key = (self, offset)
        cached = cache.get(key)
        if cached is not None:
            cache.move_to_end(key)
            self._was_checked(chunk, r)
            return cached
        data = chunk.pread(length, offset)
        found: list[int] | None = None
        if len(data) == length and crc32(data) == chunk.columns()[3][r]:
            try:
                found = event_offsets(data)
            except ValueError:
                found = None
        self._was_checked(chunk, r)
        if found is None or len(found) != count:  # as _intact says
            formats[r] = RecordFormat.CORRUPT
            self._note_corrupt(offset)
            return RecordFormat.CORRUPT, b"", []
        result = (RecordFormat(formats[r]), data, found)
        self._store.cache_record(key, result, length)
        return result

    def _was_checked(self, chunk: Chunk, r: int) -> None:
        """Record ``r`` of ``chunk`` was checked (and, if damaged, marked so)."""
        checked = self._checked
        if checked.get(chunk.start, 0) == r:
            checked[chunk.start] = r + 1

    def _note_corrupt(self, offset: int) -> None:
        if offset not in self._found_corrupt:
            self._found_corrupt.add(offset)
            log.error(
                "segment %r: the record at byte %d failed its checksum; its events read as corrupt",
                self.name,
                offset,
            )

    def event_offset(self, index: int) -> int:
        """The byte offset of event ``index`` (``first_event <= index <= next_event``;
        ``next_event`` gives ``end``). Inside a corrupt record: the record's offset."""
        if index == self.next_event:
            return self.end
        if not self._chunks[0].first_event <= index < self.next_event:
            raise ValueError(
                f"event {index} is not in [{self.first_event}, {self.next_event}] of {self.name!r}"
            )
        chunk = self._chunk_at_event(index)
        r = chunk.record_of_event(index)
        offset, _, record_first, _ = chunk.record_bounds(r)
        if index == record_first:
            return offset
        fmt, _, offsets = self._record(chunk, r)
        if fmt is RecordFormat.CORRUPT:
            return offset
        return offset + offsets[index - record_first]

    # -- locating (reads bounded by the durable end) ------------------------------------

    @property
    def durable_next_event(self) -> int:
        """The index of the event at ``durable_end``: the events below it are durable.

        From the record index alone: ``durable_end`` is a record boundary (the
        committer makes whole records durable)."""
        end = self.durable_end
        if end >= self.end:
            return self.next_event
        if end <= self.start:
            return self.first_event
        chunk = self._chunk_at_offset(end)
        offset, _, first, _ = chunk.record_bounds(chunk.record_of_offset(end))
        return max(first, self.first_event) if offset == end else first

    @property
    def last_modified_us(self) -> int:
        """When the newest durable data was appended, in µs since the epoch (0: nothing
        durable, or a store that does not know). Kept per chunk, not per record: while
        appends wait for their commit, it may be the time of one of those (the newest
        record of the chunk holding the durable end)."""
        end = self.durable_end
        for chunk in reversed(self._chunks):
            if chunk.records and chunk.start < end:
                return chunk.newest_us
        return 0

    def locate(self, target: int, events: int | None = None) -> tuple[int, int]:
        """An event boundary and the index of the event starting there.

        ``target`` is clamped into ``[start, durable_end]``; B is the last boundary at
        or before it. Without ``events`` (or with a negative one) the answer is B;
        with ``events = n >= 0``, the boundary ``n`` events after B, clamped to the
        durable end (whose index is :attr:`durable_next_event`). Found with the
        record index (offsets and first events); a record holding several events is
        read only when the answer falls inside it (the store's record cache keeps
        it), never a scan. A damaged record's events have no known boundaries: B
        inside one is its start, and counting ``n`` events into one answers its
        end (so a planner stepping forward always gets past it)."""
        end = max(self.durable_end, self.start)
        last = self.durable_next_event
        target = min(max(target, self.start), end)
        if target >= end:
            offset, index = end, last
        else:
            offset, index = self._boundary_at(target)
        if events is None or events <= 0:
            return offset, index
        index = min(index + events, last)
        if index >= last:
            return end, last
        return self._event_boundary(index)

    def _event_boundary(self, index: int) -> tuple[int, int]:
        """Where event ``index`` starts, and ``index``; past a damaged record holding it."""
        chunk = self._chunk_at_event(index)
        r = chunk.record_of_event(index)
        offset, length, first, count = chunk.record_bounds(r)
        if index == first:
            return offset, index
        fmt, _, offsets = self._record(chunk, r)
        if fmt is RecordFormat.CORRUPT:
            return offset + length, first + count
        return offset + offsets[index - first], index

    def _boundary_at(self, target: int) -> tuple[int, int]:
        """The last event boundary at or before ``target`` (retained, below the end)."""
        chunk = self._chunk_at_offset(target)
        r = chunk.record_of_offset(target)
        offset, _, first, count = chunk.record_bounds(r)
        if target == offset or count == 1:
            return offset, first
        fmt, _, offsets = self._record(chunk, r)
        if fmt is RecordFormat.CORRUPT:
            return offset, first
        i = bisect.bisect_right(offsets, target - offset) - 1
        if first + i < self.first_event:  # the start is inside this record
            return self.start, self.first_event
        return offset + offsets[i], first + i

    def formats(self, offset: int, end: int) -> list[tuple[int, int]]:
        """The payload formats of the bytes ``[offset, end)`` as runs ``(from, format)``:
        ascending, the first at ``offset``, each format (a RecordFormat value) holding
        up to the next run or ``end``. From the record index only; [] for an empty
        range. SegmentTruncated below ``start``; ValueError beyond ``end``."""
        self._check_offset(offset)
        end = min(end, self.end)
        runs: list[tuple[int, int]] = []
        pos = offset
        while pos < end:
            chunk = self._chunk_at_offset(pos)
            offsets, _, formats, _ = chunk.columns()
            r = chunk.record_of_offset(pos)
            if not 0 <= r < chunk.records:
                break  # (an empty chunk holds no byte below the end)
            for q in range(r, chunk.records):
                if not runs or runs[-1][1] != formats[q]:
                    runs.append((pos, formats[q]))
                pos = offsets[q + 1] if q + 1 < chunk.records else chunk.end
                if pos >= end:
                    break
        return runs

    async def wait_for(self, offset: int) -> None:
        """Return once ``end > offset``; trio.ClosedResourceError if the store closes
        first. Callers bound the wait with a cancel scope."""
        while self.end <= offset:
            if self._closed:
                raise trio.ClosedResourceError(f"the store of segment {self.name!r} closed")
            await self._lot.park()

    # -- observers and retention -----------------------------------------------------

    def observe(
        self, on_append: OnAppend, on_truncate: OnTruncate | None = None
    ) -> Callable[[], None]:
        """Call ``on_append`` after every append (from any writer), ``on_truncate(new
        first event)`` after retention dropped events; returns an unsubscribe function."""
        pair = (on_append, on_truncate)
        self._observers.append(pair)

        def unsubscribe() -> None:
            if pair in self._observers:
                self._observers.remove(pair)

        return unsubscribe

    @property
    def observed(self) -> bool:
        """Something follows this segment's appends (a durable destination does: the
        segment is its, with its retention)."""
        return bool(self._observers)

    def truncate_before(self, event_index: int) -> None:
        """The owner no longer needs events below ``event_index``: ``first_event`` moves
        there (reads below it raise SegmentTruncated) and whole chunk files entirely below
        it are deleted (by the committer, once they are durable). Idempotent."""
        event_index = min(event_index, self.next_event)
        if event_index <= self.first_event:
            return
        self.first_event = event_index
        self.start = self.event_offset(event_index)
        self.delete_below = max(self.delete_below, event_index)
        self.meta_dirty = True
        self._store.wants_commit(self)

    def deletable_chunks(self) -> list[Chunk]:
        """The oldest chunks retention or ``truncate_before`` want gone and that may go:
        never the active chunk, only chunks entirely durable."""
        out: list[Chunk] = []
        for chunk in self._chunks[:-1]:
            if chunk.next_event > self.delete_below or chunk.end > self.durable_end:
                break
            out.append(chunk)
        return out

    def retire(self, chunks: list[Chunk]) -> bool:
        """These oldest chunks are about to be deleted: move the start past them now,
        so that no read reaches their files while they go. True if it moved."""
        head = self._chunks[len(chunks)]
        if head.first_event <= self.first_event:
            return False
        self.first_event = head.first_event
        self.start = head.start
        return True

    def drop_chunks(self, chunks: list[Chunk], moved: bool) -> None:
        """These oldest chunks are gone (after :meth:`retire`; the store deletes their
        files): forget them and, if the start moved, tell the observers."""
        if not chunks:
            return
        del self._chunks[: len(chunks)]
        for chunk in chunks:
            self._checked.pop(chunk.start, None)
        if moved:
            for _, on_truncate in tuple(self._observers):
                if on_truncate is not None:
                    on_truncate(self.first_event)

    @property
    def chunks(self) -> list[Chunk]:
        """The retained chunks, oldest first (the last is the active one)."""
        return self._chunks

    def meta_document(self) -> dict[str, object]:
        """The ledger snapshot and logical start, as the ``meta`` file keeps them."""
        return {
            "first_event": self.first_event,
            "writers": {w.hex: n for w, n in self._durable_ledger.items()},
        }

    # -- life cycle ------------------------------------------------------------------

    def close(self) -> None:
        """The store closed: wake the waiters, refuse appends."""
        self._closed = True
        self._lot.unpark_all()

    def stats(self) -> dict[str, int]:
        """Counters and sizes: bytes, events, chunks, records, corrupt_records, appends,
        appended_bytes, appended_events, reads, writers."""
        return {
            "bytes": sum(c.size for c in self._chunks),
            "events": self.next_event - self.first_event,
            "chunks": len(self._chunks),
            "records": sum(c.records for c in self._chunks),
            "corrupt_records": self._recovered_corrupt + len(self._found_corrupt),
            "writers": len(self._written_ledger),
            "start": self.start,
            "end": self.end,
            "durable_end": self.durable_end,
            "first_event": self.first_event,
            "next_event": self.next_event,
            **self._stats,
        }


def _intact(data: memoryview, length: int, crc: int, count: int) -> bool:
    """A record's bytes are all there, match its CRC and frame exactly its ``count``
    events."""
    if len(data) != length or crc32(data) != crc:
        return False
    try:
        return count_events(data) == count
    except ValueError:
        return False


def _chunk_start(chunk: Chunk) -> int:
    return chunk.start


def _chunk_first_event(chunk: Chunk) -> int:
    return chunk.first_event
