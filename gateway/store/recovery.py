"""Recovery of a segment directory: find where the data ends, what is damaged,
and bring the files back to a consistent state; never refuse.

Two passes over the chunks, oldest first, each holding one chunk's index at a
time. The first reads every index entry (its own checksum, its place in the
sequence) and checks the data it describes: that the data file holds it and,
for the chunks that may be torn (all of them when asked), its CRC. That finds
the last good record of the segment: everything after it is a *torn tail*,
cut away. The second pass writes the result: damaged records before that
point stay where they are, flagged corrupt in the index (offsets and event
indexes do not move); stretches no valid entry describes (a lost index tail,
a garbled entry) get a synthesized corrupt entry covering their bytes and
events; data files are cut or extended to the bytes their entries cover.
With ``repair=False`` (``gateway store verify`` and ``inspect``) nothing is
written and the report says the same.

Damage to an index loses no record whose data can be proven intact: a
damaged header is rebuilt from the file name and the entries (it only
repeats what they say); an entry with one damaged byte is repaired from its
own CRC (and its data must then match its data CRC); a stretch of records
whose entries are damaged beyond that is rebuilt from the data where the
data CRC a damaged entry still holds matches the bytes, which must be whole
events numbered densely between the neighbours. Bytes nothing proves intact
stay a corrupt record: never delivered.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from gateway.store.layout import (
    FLAG_CORRUPT,
    INDEX_ENTRY,
    INDEX_HEADER,
    META_FILE,
    TMP_SUFFIX,
    ZERO_WRITER,
    IndexEntry,
    IndexHeader,
    UnknownFormat,
    chunk_paths,
    chunk_starts,
    crc32,
    damaged_entry_fields,
    decode_name,
    fsync_directory,
    read_document,
    repair_entry,
)
from gateway.store.records import RecordFormat, count_events

__all__ = ["RecoveredChunk", "RecoveredSegment", "RecoveryReport", "recover_segment"]

log = logging.getLogger("gateway.store")

#: Which chunks get their data checksums verified: all, those that may be torn, none.
Verify = Literal["all", "tail", "none"]

_READ_BLOCK = 1 << 20
#: Damaged entry slots remembered per stretch for rebuilding its records from the data.
_MAX_CANDIDATES = 4096
#: The formats a rebuilt record may take from its damaged entry.
_FORMATS = frozenset({RecordFormat.RAW, RecordFormat.ENVELOPE})


@dataclass(slots=True)
class RecoveryReport:
    """What recovery found in one segment."""

    segment: str
    #: Records kept (corrupt ones included).
    records: int = 0
    #: Records kept in place whose data is damaged (found now or flagged before).
    corrupt_records: int = 0
    #: Bytes of data cut away (a torn tail, garbage after the last record).
    truncated_bytes: int = 0
    #: Bytes whose checksums were verified.
    verified_bytes: int = 0
    #: Index headers rebuilt and entries repaired or rebuilt from the data: damage to
    #: the index that lost nothing.
    repaired: int = 0
    seconds: float = 0.0
    #: What was found and where, one line each.
    problems: list[str] = field(default_factory=list)


@dataclass(slots=True)
class RecoveredChunk:
    """A chunk as recovery left it."""

    start: int
    first_event: int
    next_event: int
    size: int
    records: int
    newest_us: int
    #: The entries, kept only for the last (active) chunk.
    entries: list[IndexEntry] | None = None


@dataclass(slots=True)
class RecoveredSegment:
    name: str
    directory: Path
    chunks: list[RecoveredChunk]
    first_event: int
    ledger: dict[uuid.UUID, int]
    report: RecoveryReport


@dataclass(slots=True)
class _Scan:
    """Pass 1's findings about one chunk."""

    start: int
    header: IndexHeader | None
    data_size: int
    index_size: int
    #: The index has a header, but it is damaged.
    header_damaged: bool = False
    #: Index slots that were unreadable or out of sequence.
    dropped_slots: int = 0
    #: Entries with one damaged byte, repaired from their CRC, by slot.
    repaired: dict[int, IndexEntry] = field(default_factory=dict)
    #: Offset and first event of the first entry kept.
    first_entry: tuple[int, int] | None = None
    kept: int = 0
    #: Positions (among the kept entries) whose data is missing or fails its checksum.
    bad: set[int] = field(default_factory=set)
    #: Position of the last kept entry whose data is fine (or that was flagged before).
    last_good: int = -1
    flagged: int = 0
    verified: bool = False


class _Sequence:
    """Which valid entries belong to the segment: each must lie inside its chunk and
    follow the previous one (bytes and events only move forward)."""

    def __init__(self) -> None:
        self.end = -1
        self.next_event = -1

    def accepts(self, entry: IndexEntry, start: int, limit: int | None) -> bool:
        if entry.offset < start or (limit is not None and entry.end > limit):
            return False
        if entry.offset < self.end or entry.first_event < self.next_event:
            return False
        self.end, self.next_event = entry.end, entry.next_event
        return True


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return -1


def _read_header(path: Path, start: int) -> tuple[IndexHeader | None, bool]:
    """The chunk's index header if it is intact, and whether there is a damaged one
    (which the entries after it survive: they have CRCs of their own). A header cut
    short is no damage: a crash while the chunk was being created."""
    try:
        with open(path, "rb") as f:
            data = f.read(INDEX_HEADER.size)
    except FileNotFoundError:
        return None, False
    if len(data) < INDEX_HEADER.size:
        return None, False
    try:
        header = IndexHeader.unpack(data)
    except UnknownFormat as e:
        raise UnknownFormat(f"{path}: {e}") from None
    if header is None or header.start != start:
        return None, True
    return header, False


def _slots(path: Path) -> Iterator[tuple[int, bytes, IndexEntry | None]]:
    """Every entry slot of an index file, whatever its header: the slot's number, its
    bytes and its entry, or None if its checksum fails (a partial entry at the end
    included)."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below; a generator's with would do the same
    except FileNotFoundError:
        return
    with f:
        f.seek(INDEX_HEADER.size)
        size = INDEX_ENTRY.size
        slot = 0
        while True:
            block = f.read(_READ_BLOCK - _READ_BLOCK % size)
            if not block:
                return
            for pos in range(0, len(block) - size + 1, size):
                yield slot, block[pos : pos + size], IndexEntry.unpack(block, pos)
                slot += 1
            if len(block) % size:
                yield slot, block[len(block) - len(block) % size :], None
                return


class _DataFile:
    """A chunk's data file, opened on first use."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self._fd = -1

    def read(self, pos: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``pos`` of the file (fewer where it ends)."""
        if self.size < 0:
            return b""
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDONLY)
        parts: list[bytes] = []
        while length > 0:
            block = os.pread(self._fd, min(length, _READ_BLOCK), pos)
            if not block:
                break
            parts.append(block)
            pos += len(block)
            length -= len(block)
        return b"".join(parts)

    def crc(self, pos: int, length: int) -> int | None:
        """The CRC-32 of ``length`` bytes at ``pos``; None if the file ends before."""
        if self.size < 0:
            return None
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDONLY)
        crc = 0
        while length > 0:
            block = os.pread(self._fd, min(length, _READ_BLOCK), pos)
            if not block:
                return None
            crc = crc32(block, crc)
            pos += len(block)
            length -= len(block)
        return crc

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def recover_segment(
    directory: Path, *, verify: Verify = "tail", repair: bool = True
) -> RecoveredSegment:
    """Recover the segment in ``directory`` (see the module docstring)."""
    began = time.monotonic()
    name = decode_name(directory.name)
    report = RecoveryReport(name)
    meta = read_document(directory / META_FILE) or {}
    if repair:
        for leftover in directory.glob("*" + TMP_SUFFIX):
            leftover.unlink()
    starts = chunk_starts(directory)
    if not starts:
        starts = [0]
    scans = _first_pass(directory, starts, verify, report)
    chunks, ledger = _second_pass(directory, name, scans, meta, report, repair)
    if repair:
        fsync_directory(directory)
    first_event = _meta_first_event(meta)
    report.seconds = time.monotonic() - began
    return RecoveredSegment(name, directory, chunks, first_event, ledger, report)


def _first_pass(
    directory: Path, starts: list[int], verify: Verify, report: RecoveryReport
) -> list[_Scan]:
    scans: list[_Scan] = []
    sequence = _Sequence()
    for i, start in enumerate(starts):
        data_path, index_path = chunk_paths(directory, start)
        limit = starts[i + 1] if i + 1 < len(starts) else None
        header, header_damaged = _read_header(index_path, start)
        scan = _Scan(start, header, _file_size(data_path), _file_size(index_path), header_damaged)
        scan.verified = (
            verify == "all"
            or (verify == "tail" and i >= len(starts) - 2)
            or (limit is not None and scan.data_size != limit - start)
        )
        data = _DataFile(data_path, scan.data_size)
        try:
            for slot, raw, entry in _slots(index_path):
                repaired = False
                if entry is None:
                    entry = repair_entry(raw)
                    repaired = entry is not None
                if entry is None or not sequence.accepts(entry, start, limit):
                    scan.dropped_slots += 1
                    continue
                if repaired:
                    scan.repaired[slot] = entry
                position = scan.kept
                scan.kept += 1
                if scan.first_entry is None:
                    scan.first_entry = (entry.offset, entry.first_event)
                if entry.corrupt:
                    scan.flagged += 1
                    scan.last_good = position
                    continue
                missing = entry.end - start > scan.data_size
                # A repaired entry is kept only if its data proves it, verified or not.
                if not missing and (scan.verified or repaired):
                    report.verified_bytes += entry.length
                    if data.crc(entry.offset - start, entry.length) != entry.data_crc:
                        missing = True
                if missing:
                    scan.bad.add(position)
                else:
                    scan.last_good = position
        finally:
            data.close()
        scans.append(scan)
    return scans


def _chunk_first_event(scan: _Scan) -> int:
    """A chunk's first event, as its first entry (checksummed) or else its intact header
    says; -1 if neither does."""
    if scan.first_entry is not None and scan.first_entry[0] == scan.start:
        return scan.first_entry[1]
    if scan.header is not None:
        return scan.header.first_event
    return -1


def _gap(offset: int, end: int, first_event: int, next_event: int, timestamp_us: int) -> IndexEntry:
    """A corrupt entry standing for bytes and events no valid entry describes."""
    return IndexEntry(
        offset,
        first_event,
        end - offset,
        max(0, next_event - first_event),
        RecordFormat.RAW,
        FLAG_CORRUPT,
        ZERO_WRITER,
        0,
        timestamp_us,
        0,
    )


def _second_pass(
    directory: Path,
    name: str,
    scans: list[_Scan],
    meta: dict[str, object],
    report: RecoveryReport,
    repair: bool,
) -> tuple[list[RecoveredChunk], dict[uuid.UUID, int]]:
    """Write what the first pass found: chunks past the last good record are dropped,
    the others keep their entries up to it, with the gaps between them filled."""
    work = _SecondPass(directory, name, scans, meta, report, repair)
    for i, scan in enumerate(scans):
        if i > work.keep:
            work.drop(scan)
        else:
            work.chunks.append(work.recover(i, scan))
    if not work.chunks:
        raise AssertionError("recovery keeps at least one chunk")
    return work.chunks, work.ledger


def _ledger(meta: dict[str, object]) -> dict[uuid.UUID, int]:
    """Each writer's last event number as the segment's metadata remembers it."""
    ledger: dict[uuid.UUID, int] = {}
    writers = meta.get("writers")
    if isinstance(writers, dict):
        for key, number in writers.items():
            try:
                ledger[uuid.UUID(hex=str(key))] = int(number)
            except (ValueError, TypeError):
                continue
    return ledger


@dataclass(slots=True)
class _ChunkWork:
    """The second pass's state while it goes through one chunk's index."""

    scan: _Scan
    #: Where the next chunk starts (None: this is the last chunk).
    limit: int | None
    #: Position (among the valid entries) of the last one kept; later ones are torn tail.
    cut: int
    first_event: int
    data: _DataFile
    entries: list[IndexEntry] = field(default_factory=list)
    #: The index must be rewritten.
    changed: bool = False
    position: int = -1
    #: Damaged slots since the last entry kept: what a stretch may be rebuilt from.
    candidates: list[bytes] = field(default_factory=list)


class _SecondPass:
    """The second pass over a segment's chunks, oldest first: where the bytes and events
    of the chunks kept so far end, and what it found and rebuilt on the way."""

    def __init__(
        self,
        directory: Path,
        name: str,
        scans: list[_Scan],
        meta: dict[str, object],
        report: RecoveryReport,
        repair: bool,
    ) -> None:
        self.directory, self.name, self.scans, self.meta = directory, name, scans, meta
        self.report, self.repair = report, repair
        # The last good record: everything after it is the torn tail.
        self.last = max((i for i, s in enumerate(scans) if s.last_good >= 0), default=-1)
        self.keep = max(self.last, 0)
        self.ledger = _ledger(meta)
        self.sequence = _Sequence()
        self.chunks: list[RecoveredChunk] = []
        self.expected_offset = scans[0].start
        self.expected_event = -1
        #: The newest timestamp of the chunks kept so far (for a gap at a chunk's end).
        self.newest = 0

    def drop(self, scan: _Scan) -> None:
        """A chunk wholly after the last good record: the torn tail."""
        removed = max(scan.data_size, 0)
        self.report.truncated_bytes += removed
        self.report.problems.append(
            f"torn tail: chunk at byte {scan.start} dropped ({removed} bytes of data)"
        )
        if self.repair:
            for path in chunk_paths(self.directory, scan.start):
                path.unlink(missing_ok=True)

    def recover(self, i: int, scan: _Scan) -> RecoveredChunk:
        """Keep the chunk's entries up to the last good record, fill what none describes,
        and bring its files in line with them."""
        data_path, index_path = chunk_paths(self.directory, scan.start)
        limit = self.scans[i + 1].start if i + 1 < len(self.scans) else None
        cut = scan.last_good if i == self.last else (scan.kept - 1 if i < self.last else -1)
        if self.expected_event < 0:
            self.expected_event = _chunk_first_event(scan)
        data = _DataFile(data_path, scan.data_size)
        chunk = _ChunkWork(scan, limit, cut, self.expected_event, data)
        chunk.changed = scan.header is None or scan.dropped_slots > 0 or bool(scan.repaired)
        if scan.header_damaged:
            _note_repair(
                self.report,
                self.name,
                self.repair,
                f"index header of the chunk at byte {scan.start} damaged",
                "rebuilt from the file name and the entries",
            )
        try:
            for slot, raw, entry in _slots(index_path):
                self._slot(chunk, slot, raw, entry)
            if self.expected_event < 0:
                self.expected_event = chunk.first_event = _meta_first_event(self.meta)
            if i < self.last and limit is not None:
                self._fill_to_next_chunk(chunk, limit, self.scans[i + 1])
        finally:
            data.close()
        return self._finish(i, chunk, data_path, index_path)

    def _slot(self, chunk: _ChunkWork, slot: int, raw: bytes, entry: IndexEntry | None) -> None:
        """One slot of the chunk's index: a candidate for rebuilding if damaged, dropped
        if out of sequence or in the torn tail, else kept."""
        scan = chunk.scan
        if entry is None:
            entry = scan.repaired.get(slot)
        if entry is None:
            if len(chunk.candidates) < _MAX_CANDIDATES and len(raw) == INDEX_ENTRY.size:
                chunk.candidates.append(raw)
            return
        if not self.sequence.accepts(entry, scan.start, chunk.limit):
            return
        chunk.position += 1
        if chunk.position > chunk.cut:
            chunk.changed = True
            self.report.problems.append(
                f"torn tail: record at byte {entry.offset} (events {entry.first_event}.."
                f"{entry.next_event - 1}) dropped"
            )
            return
        if slot in scan.repaired:
            _note_repair(
                self.report,
                self.name,
                self.repair,
                f"index entry of the record at byte {entry.offset} (events "
                f"{entry.first_event}..{entry.next_event - 1}) damaged in one byte",
                "repaired from its checksum",
            )
        self._keep(chunk, entry)

    def _keep(self, chunk: _ChunkWork, entry: IndexEntry) -> None:
        """Keep a valid entry: fill the gap before it, flag it if its data is bad."""
        if self.expected_event < 0:
            self.expected_event = chunk.first_event = entry.first_event
        if entry.offset > self.expected_offset or entry.first_event > self.expected_event:
            self._fill(
                chunk,
                (self.expected_offset, entry.offset),
                (self.expected_event, entry.first_event),
                entry.timestamp_us,
            )
        chunk.candidates = []
        if chunk.position in chunk.scan.bad:
            entry = self._flag_corrupt(entry)
            chunk.changed = True
        elif entry.corrupt:
            self.report.problems.append(
                f"corrupt record at byte {entry.offset} (events {entry.first_event}.."
                f"{entry.next_event - 1}): flagged damaged before; kept in place, "
                "never delivered"
            )
        chunk.entries.append(entry)
        self.expected_offset, self.expected_event = entry.end, entry.next_event

    def _flag_corrupt(self, entry: IndexEntry) -> IndexEntry:
        """The entry of a record whose data is missing or fails its checksum, flagged."""
        self.report.problems.append(
            f"corrupt record at byte {entry.offset} (events {entry.first_event}.."
            f"{entry.next_event - 1}): data checksum fails; kept in place"
        )
        if self.repair:
            log.error(
                "segment %r: the record at byte %d (events %d..%d) failed its "
                "checksum; kept in place, its events read as corrupt",
                self.name,
                entry.offset,
                entry.first_event,
                entry.next_event - 1,
            )
        return replace(entry, flags=entry.flags | FLAG_CORRUPT)

    def _fill_to_next_chunk(self, chunk: _ChunkWork, limit: int, following: _Scan) -> None:
        """Bytes (and events) up to the next chunk that no entry describes."""
        next_first = max(_chunk_first_event(following), self.expected_event)
        if self.expected_offset < limit or next_first > self.expected_event:
            self._fill(
                chunk,
                (self.expected_offset, limit),
                (self.expected_event, next_first),
                self.newest,
            )
        self.expected_offset, self.expected_event = limit, next_first

    def _fill(
        self,
        chunk: _ChunkWork,
        span: tuple[int, int],
        events: tuple[int, int],
        timestamp_us: int,
    ) -> None:
        _fill(
            chunk.entries,
            chunk.data,
            chunk.scan.start,
            span,
            events,
            chunk.candidates,
            timestamp_us,
            self.report,
            self.name,
            self.repair,
        )
        chunk.changed = True

    def _finish(
        self, i: int, chunk: _ChunkWork, data_path: Path, index_path: Path
    ) -> RecoveredChunk:
        """Cut or extend the data file, count the entries, rewrite the index if needed."""
        scan, entries = chunk.scan, chunk.entries
        size = (entries[-1].end if entries else scan.start) - scan.start
        if i < self.last and chunk.limit is not None:
            size = chunk.limit - scan.start
        _fix_data(data_path, scan, size, self.report, self.repair, tail=i == self.keep)
        if entries:
            self.newest = max(self.newest, max(e.timestamp_us for e in entries))
        self.report.corrupt_records += sum(1 for e in entries if e.corrupt)
        self.report.records += len(entries)
        for entry in entries:
            if entry.writer != ZERO_WRITER:
                self.ledger[uuid.UUID(bytes=entry.writer)] = entry.last_event_number
        if self.repair and (chunk.changed or scan.index_size != _index_size(len(entries))):
            _rewrite_index(index_path, IndexHeader(scan.start, chunk.first_event), entries)
        if self.repair and scan.verified:
            # What a crashed process wrote may still be only in the page cache: it is
            # durable before recovery reports it (writers are told their numbers).
            for path in (data_path, index_path):
                _fdatasync(path)
        return RecoveredChunk(
            scan.start,
            chunk.first_event,
            entries[-1].next_event if entries else chunk.first_event,
            size,
            len(entries),
            max((e.timestamp_us for e in entries), default=0),
            entries if i == self.keep else None,
        )


def _fill(
    entries: list[IndexEntry],
    data: _DataFile,
    chunk_start: int,
    span: tuple[int, int],
    events: tuple[int, int],
    candidates: list[bytes],
    timestamp_us: int,
    report: RecoveryReport,
    name: str,
    repair: bool,
) -> None:
    """Entries for the bytes ``span`` and the events ``events`` that no valid entry
    describes: the records the data proves (:func:`_rebuild`), then one corrupt record
    for whatever is left."""
    (offset, end), (first_event, next_event) = span, events
    for entry in _rebuild(data, chunk_start, span, events, candidates, timestamp_us):
        entries.append(entry)
        offset, first_event = entry.end, entry.next_event
        _note_repair(
            report,
            name,
            repair,
            f"index entry of the record at byte {entry.offset} (events {entry.first_event}.."
            f"{entry.next_event - 1}) damaged",
            "rebuilt from the data, which the data CRC it held proves intact (without its "
            "writer's number)",
        )
    if offset < end or first_event < next_event:
        entries.append(_gap(offset, end, first_event, next_event, timestamp_us))
        _note_gap(report, name, entries[-1])


def _rebuild(
    data: _DataFile,
    chunk_start: int,
    span: tuple[int, int],
    events: tuple[int, int],
    candidates: list[bytes],
    timestamp_us: int,
) -> list[IndexEntry]:
    """The records at the start of ``span`` that damaged entries (``candidates``, in
    index order) still prove: the entry says where the record starts (the next byte
    to account for), its length and its data CRC, and the bytes there match that CRC
    and are whole events, numbered densely from the first of ``events`` and not past
    its end (the next entry's first event). Their writer and last event number are not
    trusted (any damaged byte may be there): the writer's ledger stays as the other
    records leave it. The format is the entry's if it names one, else raw."""
    (pos, end), (event, next_event) = span, events
    out: list[IndexEntry] = []
    for raw in candidates:
        if pos >= end:
            break
        offset, _, length, _, fmt, data_crc = damaged_entry_fields(raw)
        if offset != pos or length <= 0 or pos + length > end:
            continue
        block = data.read(pos - chunk_start, length)
        if len(block) != length or crc32(block) != data_crc:
            continue
        try:
            count = count_events(block)
        except ValueError:
            continue
        if count < 1 or event + count > next_event:
            continue
        record_format = fmt if fmt in _FORMATS else RecordFormat.RAW
        out.append(
            IndexEntry(
                pos, event, length, count, record_format, 0, ZERO_WRITER, 0, timestamp_us, data_crc
            )
        )
        pos += length
        event += count
    return out


def _note_repair(report: RecoveryReport, name: str, repair: bool, damage: str, remedy: str) -> None:
    """Damage to an index that lost nothing: reported, and logged when repaired."""
    report.repaired += 1
    if repair:
        report.problems.append(f"{damage}: {remedy}")
        log.warning("segment %r: %s: %s", name, damage, remedy)
    else:
        report.problems.append(f"{damage}: can be {remedy} (the next start does)")


def _meta_first_event(meta: dict[str, object]) -> int:
    value = meta.get("first_event", 0)
    return value if isinstance(value, int) else 0


def _note_gap(report: RecoveryReport, name: str, entry: IndexEntry) -> None:
    report.problems.append(
        f"no valid index entry for bytes {entry.offset}..{entry.end - 1} (events "
        f"{entry.first_event}..{entry.next_event - 1}): kept as a corrupt record"
    )
    log.error(
        "segment %r: no valid index entry describes bytes %d..%d; kept as a corrupt record",
        name,
        entry.offset,
        entry.end - 1,
    )


def _index_size(entries: int) -> int:
    return INDEX_HEADER.size + entries * INDEX_ENTRY.size


def _fix_data(
    path: Path, scan: _Scan, size: int, report: RecoveryReport, repair: bool, *, tail: bool
) -> None:
    """Cut the data file to ``size`` bytes (a torn tail, garbage) or extend it with
    zeros (a hole its corrupt records cover)."""
    found = max(scan.data_size, 0)
    if found == size and scan.data_size >= 0:
        return
    if found > size:
        report.truncated_bytes += found - size
        what = "torn tail" if tail else "garbage after the last record of a chunk"
        report.problems.append(f"{what}: {found - size} bytes cut at byte {scan.start + size}")
    elif found < size:
        report.problems.append(
            f"data missing: bytes {scan.start + found}..{scan.start + size - 1} (read as corrupt)"
        )
    if repair:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        finally:
            os.close(fd)


def _fdatasync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _rewrite_index(path: Path, header: IndexHeader, entries: list[IndexEntry]) -> None:
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        f.write(header.pack())
        for entry in entries:
            f.write(entry.pack())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
