"""One chunk of a segment: its data file, its index file and the per-record
columns the segment looks records up in.

A chunk covers the bytes ``[start, start + size)`` of its segment and the
events ``[first_event, next_event)``; its records never cross into the next
chunk. The columns (record offsets, first events, formats, data checksums)
are loaded from the index on demand and may be dropped again (``unload``) to
bound memory; the file descriptors are opened on demand too and closed by the
store's :class:`FileCache`. Nothing here is async: writes go straight to the
OS page cache, fsync is the committer's business.
"""

from __future__ import annotations

import bisect
import os
from array import array
from collections import OrderedDict
from pathlib import Path

from gateway.store.layout import FLAG_CORRUPT, INDEX_ENTRY, INDEX_HEADER, IndexEntry, IndexHeader
from gateway.store.records import RecordFormat

__all__ = ["Chunk", "FileCache"]

# The fields of an index entry the columns keep, by position in INDEX_ENTRY.
_OFFSET, _FIRST, _FORMAT, _FLAGS, _CRC = 0, 1, 4, 5, 9


class Chunk:
    """The files and the in-memory summary of one chunk."""

    __slots__ = (
        "_crcs",
        "_events",
        "_formats",
        "_offsets",
        "created",
        "data_path",
        "dirty",
        "fd",
        "first_event",
        "index_fd",
        "index_path",
        "newest_us",
        "next_event",
        "pins",
        "records",
        "size",
        "start",
    )

    def __init__(self, data_path: Path, index_path: Path, start: int, first_event: int) -> None:
        self.data_path = data_path
        self.index_path = index_path
        self.start = start
        self.first_event = first_event
        self.next_event = first_event
        self.size = 0
        self.records = 0
        #: Timestamp (µs since the epoch) of the newest record: age retention.
        self.newest_us = 0
        self.fd: int | None = None
        self.index_fd: int | None = None
        #: Written since the committer's last fsync of it.
        self.dirty = False
        #: Reasons the file descriptors must stay open (the active chunk, an fsync in flight).
        self.pins = 0
        #: Its files exist. A new chunk's are made by its first append (so a segment, or
        #: the next chunk, costs no disk space before it holds data: on a full disk,
        #: declaring a destination or rolling a chunk cannot fail).
        self.created = True
        self._offsets: array[int] | None = array("q")
        self._events: array[int] | None = array("q")
        self._formats: bytearray | None = bytearray()
        self._crcs: array[int] | None = array("L")

    @property
    def end(self) -> int:
        return self.start + self.size

    # -- columns --------------------------------------------------------------

    def set_records(self, entries: list[IndexEntry]) -> None:
        """Take the columns and the summary from recovered index entries."""
        self._offsets = array("q", (e.offset for e in entries))
        self._events = array("q", (e.first_event for e in entries))
        self._formats = bytearray(RecordFormat.CORRUPT if e.corrupt else e.format for e in entries)
        self._crcs = array("L", (e.data_crc for e in entries))
        self.records = len(entries)
        if entries:
            last = entries[-1]
            self.size = last.end - self.start
            self.next_event = last.next_event
            self.newest_us = max(e.timestamp_us for e in entries)

    @property
    def loaded(self) -> bool:
        return self._offsets is not None

    def unload(self) -> None:
        """Drop the columns (reloaded from the index when next needed)."""
        self._offsets = self._events = self._crcs = None
        self._formats = None

    def _load(self) -> None:
        with open(self.index_path, "rb") as f:
            f.seek(INDEX_HEADER.size)
            data = f.read(self.records * INDEX_ENTRY.size)
        rows = list(INDEX_ENTRY.iter_unpack(data))
        self._offsets = array("q", (r[_OFFSET] for r in rows))
        self._events = array("q", (r[_FIRST] for r in rows))
        self._formats = bytearray(
            RecordFormat.CORRUPT if r[_FLAGS] & FLAG_CORRUPT else r[_FORMAT] for r in rows
        )
        self._crcs = array("L", (r[_CRC] for r in rows))

    def columns(self) -> tuple[array[int], array[int], bytearray, array[int]]:
        """Record offsets, first events, formats, data CRCs (loaded if needed)."""
        if self._offsets is None:
            self._load()
        assert self._offsets is not None
        assert self._events is not None
        assert self._formats is not None
        assert self._crcs is not None
        return self._offsets, self._events, self._formats, self._crcs

    def record_of_event(self, event: int) -> int:
        """The index of the record holding ``event`` (first_event <= event < next_event)."""
        events = self.columns()[1]
        return bisect.bisect_right(events, event) - 1

    def record_of_offset(self, offset: int) -> int:
        """The index of the record holding byte ``offset``."""
        offsets = self.columns()[0]
        return bisect.bisect_right(offsets, offset) - 1

    def record_bounds(self, r: int) -> tuple[int, int, int, int]:
        """Offset, length, first event and count of record ``r``."""
        offsets, events, _, _ = self.columns()
        offset, first = offsets[r], events[r]
        if r + 1 < self.records:
            return offset, offsets[r + 1] - offset, first, events[r + 1] - first
        return offset, self.end - offset, first, self.next_event - first

    # -- files ------------------------------------------------------------------

    def create(self) -> None:
        """Create both files of a new chunk (its index holding just the header). On an
        OSError (a full disk) whatever it made is removed again and the error propagates."""
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL
        made: list[Path] = []
        try:
            self.fd = os.open(self.data_path, flags, 0o644)
            made.append(self.data_path)
            self.index_fd = os.open(self.index_path, flags, 0o644)
            made.append(self.index_path)
            _write_at(self.index_fd, IndexHeader(self.start, self.first_event).pack(), 0)
        except OSError:
            self.close()
            for path in made:
                path.unlink(missing_ok=True)
            raise
        self.created = True

    def open(self, *, index: bool = False) -> int:
        """The data file descriptor (and the index one if ``index``), opened if needed."""
        if self.fd is None:
            self.fd = os.open(self.data_path, os.O_RDWR)
        if index and self.index_fd is None:
            self.index_fd = os.open(self.index_path, os.O_RDWR)
        return self.fd

    def close(self) -> None:
        for fd in (self.fd, self.index_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.index_fd = None

    def append(
        self,
        data: bytes | bytearray | memoryview,
        entry: bytes,
        first_event: int,
        count: int,
        format: int,
        crc: int,
        timestamp_us: int,
    ) -> None:
        """Write one record and its index entry; on an OSError (a full disk) both files
        are cut back to where they were and the error propagates."""
        fd = self.open(index=True)
        index_fd = self.index_fd
        assert index_fd is not None
        index_pos = INDEX_HEADER.size + self.records * INDEX_ENTRY.size
        try:
            _write_at(fd, data, self.size)
            _write_at(index_fd, entry, index_pos)
        except OSError:
            os.ftruncate(fd, self.size)
            os.ftruncate(index_fd, index_pos)
            raise
        offsets, events, formats, crcs = self.columns()
        offsets.append(self.start + self.size)
        events.append(first_event)
        formats.append(format)
        crcs.append(crc)
        self.size += len(data)
        self.records += 1
        self.next_event = first_event + count
        self.newest_us = timestamp_us
        self.dirty = True

    def pread(self, n: int, offset: int) -> bytes:
        """Up to ``n`` stored bytes from segment byte ``offset`` (inside this chunk)."""
        return os.pread(self.open(), n, offset - self.start)


def _write_at(fd: int, data: bytes | bytearray | memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


class FileCache:
    """Bounds the open chunk files of a store: the least recently used unpinned
    chunk is closed (and its columns dropped) beyond ``limit``."""

    def __init__(self, limit: int = 128, *, keep_dirty: bool = True) -> None:
        self.limit = limit
        #: Keep chunks the committer has yet to sync open (it syncs them by descriptor).
        self.keep_dirty = keep_dirty
        self._chunks: OrderedDict[Chunk, None] = OrderedDict()

    def touch(self, chunk: Chunk) -> None:
        self._chunks[chunk] = None
        self._chunks.move_to_end(chunk)
        if len(self._chunks) > self.limit:
            for old in list(self._chunks):
                if len(self._chunks) <= self.limit:
                    break
                if old.pins or (old.dirty and self.keep_dirty):
                    continue
                del self._chunks[old]
                old.close()
                old.unload()

    def forget(self, chunk: Chunk) -> None:
        self._chunks.pop(chunk, None)

    def close_all(self) -> None:
        for chunk in self._chunks:
            chunk.close()
        self._chunks.clear()
