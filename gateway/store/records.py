"""What a stored record holds: event framing and the kinds of payload.

A segment stores event-framed bytes exactly as a segment-append client sent
them (Pravega's ``[i32 type=0][i32 length][payload]``, big-endian as Java's
``DataOutputStream`` writes them), so a byte-offset read returns exactly what
was appended. Pure code: no I/O, no trio.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable

__all__ = [
    "EVENT_HEADER",
    "EVENT_TYPE",
    "RecordFormat",
    "count_events",
    "event_offsets",
    "frame_events",
    "split_events",
]

#: The 8-byte header before each event's payload: type (always 0) and payload length.
EVENT_HEADER = struct.Struct(">ii")
#: Pravega's wire type code of an Event, the only type a segment holds.
EVENT_TYPE = 0


class RecordFormat(enum.IntEnum):
    """What the payloads of a record are; kept per record in the index."""

    #: Appended by a segment-append client: opaque bytes.
    RAW = 0
    #: Written by the hub: each payload is a msgpack envelope of a Message.
    ENVELOPE = 1
    #: Only ever returned by reads: the record failed its checksum (payload ``b""``).
    CORRUPT = 255


def frame_events(payloads: Iterable[bytes]) -> bytes:
    """The event framing of ``payloads``, in order, as one byte string."""
    pack = EVENT_HEADER.pack
    parts: list[bytes] = []
    for payload in payloads:
        parts.append(pack(EVENT_TYPE, len(payload)))
        parts.append(payload)
    return b"".join(parts)


def event_offsets(data: bytes | bytearray | memoryview) -> list[int]:
    """The offset in ``data`` of each event header; ValueError unless ``data`` is exactly
    whole events (type 0, a non-negative length, nothing left over). On every append's
    path, hence the lean loop: the careful checks run only to explain a failure."""
    unpack = EVENT_HEADER.unpack_from
    size = len(data)
    offsets: list[int] = []
    add = offsets.append
    pos = 0
    try:
        while pos < size:
            kind, length = unpack(data, pos)
            if kind or length < 0:
                break
            add(pos)
            pos += 8 + length
    except struct.error:
        pass
    if pos != size:
        raise ValueError(_framing_error(data, offsets[-1] if pos > size else pos))
    return offsets


def _framing_error(data: bytes | bytearray | memoryview, pos: int) -> str:
    """What is wrong with the event at ``pos``."""
    if len(data) - pos < EVENT_HEADER.size:
        return f"a partial event header at byte {pos}"
    kind, length = EVENT_HEADER.unpack_from(data, pos)
    if kind != EVENT_TYPE:
        return f"event type {kind} at byte {pos} (only {EVENT_TYPE} is stored)"
    return f"event length {length} at byte {pos}: negative, or past the end of the data"


def count_events(data: bytes | bytearray | memoryview) -> int:
    """How many whole events ``data`` frames; ValueError on bad framing."""
    return len(event_offsets(data))


def split_events(data: bytes | memoryview) -> list[bytes]:
    """The payloads framed in ``data`` (the inverse of :func:`frame_events`);
    ValueError on bad framing."""
    view = memoryview(data)
    header = EVENT_HEADER.size
    unpack = EVENT_HEADER.unpack_from
    out: list[bytes] = []
    for pos in event_offsets(view):
        length = unpack(view, pos)[1]
        out.append(bytes(view[pos + header : pos + header + length]))
    return out
