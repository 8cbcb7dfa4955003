"""The store's on-disk format: file names, the index file's header and entries,
and atomically replaced small documents. Pure code over bytes and paths; the
description for people is docs/store.md.

A store directory holds ``segments/<name>/`` (one per segment, the name
percent-encoded), ``states/<owner>.state`` and, while no store has it open
after a clean shutdown, the marker ``clean``. A segment directory holds chunk
files ``<first byte offset, 20 digits>.data`` (the raw event-framed bytes)
with their sidecar ``.index`` (a header, then one fixed-size entry per
record), and ``meta`` (the ledger snapshot and the logical first event).
"""

from __future__ import annotations

import functools
import os
import struct
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote_to_bytes

import msgpack

try:  # ISA-L's CRC-32 is the same function, about three times as fast.
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - platforms without an ISA-L wheel
    from zlib import crc32

__all__ = [
    "CLEAN_MARKER",
    "FLAG_CORRUPT",
    "INDEX_ENTRY",
    "INDEX_HEADER",
    "INDEX_MAGIC",
    "INDEX_VERSION",
    "META_FILE",
    "SEGMENTS_DIR",
    "STATES_DIR",
    "TMP_SUFFIX",
    "ZERO_UUID",
    "ZERO_WRITER",
    "IndexEntry",
    "IndexHeader",
    "UnknownFormat",
    "chunk_paths",
    "chunk_starts",
    "crc32",
    "damaged_entry_fields",
    "decode_name",
    "encode_name",
    "fsync_directory",
    "pack_document",
    "pack_entry",
    "read_document",
    "repair_entry",
    "unpack_document",
    "write_document",
]

SEGMENTS_DIR = "segments"
STATES_DIR = "states"
META_FILE = "meta"
#: Present only between a clean close and the next open: recovery may trust the indexes.
CLEAN_MARKER = "clean"
DATA_SUFFIX = ".data"
#: A file being replaced atomically (left over only by a crash; recovery removes it).
TMP_SUFFIX = ".tmp"
INDEX_SUFFIX = ".index"

INDEX_MAGIC = b"ICHGIDX\x00"
INDEX_VERSION = 1
#: magic, version, entry size, header CRC, chunk's first byte offset, chunk's first event.
#: The header CRC is the CRC-32 of the other 28 bytes; 0 in an index written before the
#: header had one (those bytes were reserved and zero).
INDEX_HEADER = struct.Struct("<8sHHIQQ")
#: offset, first event, length, count, format, flags, (reserved), writer, last event
#: number, timestamp (µs since the epoch), data CRC-32; then the CRC-32 of all that.
_ENTRY_BODY = struct.Struct("<QQIIBB6x16sqqI")
INDEX_ENTRY = struct.Struct(_ENTRY_BODY.format + "I")
#: An entry's flag: recovery found the record's data damaged and kept it in place.
FLAG_CORRUPT = 1
ZERO_UUID = uuid.UUID(int=0)
ZERO_WRITER = bytes(16)

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def encode_name(name: str) -> str:
    """A segment or owner name as one safe file name, reversibly: every byte of its
    UTF-8 except ASCII letters, digits, ``-`` and ``_`` becomes ``%XX``."""
    if not name:
        raise ValueError("a name must not be empty")
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in name.encode())


def decode_name(file_name: str) -> str:
    """The inverse of :func:`encode_name`."""
    return unquote_to_bytes(file_name).decode()


def chunk_paths(directory: Path, start: int) -> tuple[Path, Path]:
    """The data and index file of the chunk whose first byte is at ``start``."""
    stem = f"{start:020d}"
    return directory / (stem + DATA_SUFFIX), directory / (stem + INDEX_SUFFIX)


def chunk_starts(directory: Path) -> list[int]:
    """The first byte offsets of the chunks in a segment directory (data or index
    file present), ascending."""
    starts: set[int] = set()
    for entry in os.scandir(directory):
        stem, dot, suffix = entry.name.partition(".")
        if dot and "." + suffix in (DATA_SUFFIX, INDEX_SUFFIX) and stem.isdigit():
            starts.add(int(stem))
    return sorted(starts)


class UnknownFormat(Exception):
    """Files of a newer format: nothing of them is touched (recovery would cut them)."""


@dataclass(frozen=True, slots=True)
class IndexHeader:
    start: int
    first_event: int

    def pack(self) -> bytes:
        fields = INDEX_HEADER.pack(
            INDEX_MAGIC, INDEX_VERSION, INDEX_ENTRY.size, 0, self.start, self.first_event
        )
        crc = _header_crc(fields)
        return fields[:12] + crc.to_bytes(4, "little") + fields[16:]

    @classmethod
    def unpack(cls, data: bytes) -> IndexHeader | None:
        """The header, or None if ``data`` is not an intact header of this version: its
        CRC fails or, in an index written before headers had one, a field is not what
        this version writes (damaged: recovery rebuilds it from the file name and the
        entries). UnknownFormat for an intact header of another version."""
        if len(data) < INDEX_HEADER.size:
            return None
        magic, version, entry_size, crc, start, first_event = INDEX_HEADER.unpack_from(data)
        ours = (magic, version, entry_size) == (INDEX_MAGIC, INDEX_VERSION, INDEX_ENTRY.size)
        if crc:
            if crc != _header_crc(data):
                return None
            if magic != INDEX_MAGIC:
                return None
            if not ours:
                raise UnknownFormat(
                    f"index format version {version}, entries of {entry_size} bytes (this "
                    f"version reads {INDEX_VERSION}, entries of {INDEX_ENTRY.size} bytes)"
                )
        elif not ours:
            # Without a CRC nothing tells a newer version from a damaged byte: a newer
            # version writes the CRC, so this is damage.
            return None
        return cls(start, first_event)


def _header_crc(data: bytes | memoryview) -> int:
    """The CRC-32 of a packed header's bytes other than its CRC field."""
    return crc32(bytes(data[16 : INDEX_HEADER.size]), crc32(bytes(data[:12])))


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One record (one ``append``) as its index entry describes it."""

    offset: int
    first_event: int
    length: int
    count: int
    format: int
    flags: int
    #: The writer's UUID as 16 bytes (all zero: none).
    writer: bytes
    last_event_number: int
    timestamp_us: int
    data_crc: int

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def next_event(self) -> int:
        return self.first_event + self.count

    @property
    def corrupt(self) -> bool:
        return bool(self.flags & FLAG_CORRUPT)

    def pack(self) -> bytes:
        return pack_entry(
            self.offset,
            self.first_event,
            self.length,
            self.count,
            self.format,
            self.flags,
            self.writer,
            self.last_event_number,
            self.timestamp_us,
            self.data_crc,
        )

    @classmethod
    def unpack(cls, data: bytes | memoryview, pos: int = 0) -> IndexEntry | None:
        """The entry at ``pos``, or None if its own checksum fails."""
        body = bytes(data[pos : pos + _ENTRY_BODY.size])
        (crc,) = struct.unpack_from("<I", data, pos + _ENTRY_BODY.size)
        if crc32(body) != crc:
            return None
        offset, first, length, count, fmt, flags, writer, last, ts, data_crc = _ENTRY_BODY.unpack(
            body
        )
        return cls(offset, first, length, count, fmt, flags, writer, last, ts, data_crc)


def damaged_entry_fields(data: bytes | memoryview) -> tuple[int, int, int, int, int, int]:
    """The offset, first event, length, count, format and data CRC an entry whose own
    checksum fails says, unchecked (any of them may be what is damaged): recovery
    rebuilds a record from its data only where the data's CRC proves it."""
    (offset, first, length, count, fmt, _, _, _, _, data_crc) = _ENTRY_BODY.unpack_from(data)
    return offset, first, length, count, fmt, data_crc


def repair_entry(data: bytes | memoryview) -> IndexEntry | None:
    """The entry in the ``INDEX_ENTRY.size`` bytes ``data``, whose own checksum fails,
    as it was before one of its bytes was damaged (a flipped bit, a bad byte): the one
    byte whose change makes the checksum hold. None if no single byte does. CRC-32
    tells every single-byte error in 72 bytes from every other (tested), so the repair
    is never a guess; the caller still checks that the entry fits its neighbours and
    that the record's data matches the data CRC it holds."""
    if len(data) != INDEX_ENTRY.size:
        return None
    body = bytes(data[: _ENTRY_BODY.size])
    stored = int.from_bytes(data[_ENTRY_BODY.size : INDEX_ENTRY.size], "little")
    syndrome = crc32(body) ^ stored
    if not syndrome:
        return IndexEntry.unpack(data)
    if syndrome in _crc_field_errors():
        # The damaged byte is in the stored CRC itself: the fields are intact.
        fixed = body + crc32(body).to_bytes(4, "little")
    else:
        error = _body_errors().get(syndrome)
        if error is None:
            return None
        position, value = error
        damaged = bytearray(body)
        damaged[position] ^= value
        fixed = bytes(damaged) + data[_ENTRY_BODY.size : INDEX_ENTRY.size]
    return IndexEntry.unpack(fixed)


@functools.cache
def _body_errors() -> dict[int, tuple[int, int]]:
    """CRC difference -> (position, xor value) of each single-byte error in an entry's
    body. CRC-32 is affine: crc(body ^ e) == crc(body) ^ crc(e) ^ crc(zeros)."""
    size = _ENTRY_BODY.size
    zero = crc32(bytes(size))
    errors: dict[int, tuple[int, int]] = {}
    for position in range(size):
        pattern = bytearray(size)
        for value in range(1, 256):
            pattern[position] = value
            errors[crc32(pattern) ^ zero] = (position, value)
    if len(errors) != size * 255 or errors.keys() & _crc_field_errors():
        raise AssertionError("CRC-32 no longer tells single-byte errors apart")
    return errors


@functools.cache
def _crc_field_errors() -> frozenset[int]:
    """The differences a single damaged byte of the stored CRC makes."""
    return frozenset(value << (8 * byte) for byte in range(4) for value in range(1, 256))


def pack_entry(
    offset: int,
    first_event: int,
    length: int,
    count: int,
    format: int,
    flags: int,
    writer: bytes,
    last_event_number: int,
    timestamp_us: int,
    data_crc: int,
) -> bytes:
    """An index entry's bytes (the append path's fast spelling of IndexEntry.pack)."""
    body = _ENTRY_BODY.pack(
        offset,
        first_event,
        length,
        count,
        format,
        flags,
        writer,
        last_event_number,
        timestamp_us,
        data_crc,
    )
    return body + crc32(body).to_bytes(4, "little")


def fsync_directory(path: Path) -> None:
    """Make the names in ``path`` durable (created, renamed and removed files)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pack_document(document: dict[str, Any]) -> bytes:
    """A small document in msgpack (TypeError for what msgpack cannot hold)."""
    return msgpack.packb(document, use_bin_type=True)


def write_document(path: Path, data: bytes) -> None:
    """Replace ``path`` atomically and durably by ``data`` (a packed document): a
    temporary file, fsync, rename, fsync of the directory. Blocking: run it in a worker
    thread."""
    tmp = path.with_name(path.name + TMP_SUFFIX)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(path.parent)


def read_document(path: Path) -> dict[str, Any] | None:
    """The msgpack document in ``path``; None if it is missing or unreadable."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return unpack_document(data)


def unpack_document(data: bytes) -> dict[str, Any] | None:
    """The document packed in ``data``; None if it is not one."""
    try:
        document = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException):
        return None
    return document if isinstance(document, dict) else None
