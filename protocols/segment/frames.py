"""Encoding and decoding of one segment-append command (no I/O, no state).

Every command is an 8-byte header ``[type:i32][length:i32]`` (big-endian,
``0 <= length <= 0x00FFFFFF``) and ``length`` bytes of fields written with
Java's ``DataOutput``: ``i32``/``i64`` big-endian, a UUID as its 16 bytes
(most significant half first), a boolean as one byte (any non-zero byte
reads as true), a string as ``writeUTF`` (:mod:`.mutf8`), a blob as an
``i32`` length and its bytes.

Each command's fields are one row of :data:`FIELDS`, which both directions
read: :func:`encode` writes every field, :func:`decode` reads them in order
and then, as Pravega does, lets newer peers and older ones talk:

* a trailing optional field the body is too short for takes its default
  (``-1``, or ``""`` for a stack trace): a 24-byte ``DataAppended`` from an
  old server decodes with the three newer fields at ``-1``;
* bytes after the last known field are skipped.

Interchange's own trailing fields (:data:`EXTENSIONS`: the payload format of
``SetupAppend``/``AppendSetup``, the flags of ``ReadSegment``, the formats of
``SegmentRead``, the event indexes of ``StreamSegmentInfo``/``LocateOffset``/
``OffsetLocated``) take their dataclass default when absent, and are left
out by :func:`encode` while they hold it and nothing after them is set: a
command that uses none of them is byte for byte what a Pravega peer sends.

Event frames (``[0][length][payload]``, the unit stored in a segment) are
walked by :func:`count_events`, which the block assembler and the segment
reader share.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import Any, Final
from uuid import UUID

from gateway.sdk import LocalProtocolError, RemoteProtocolError

from . import mutf8
from .events import (
    MAX_WIRECOMMAND_SIZE,
    AppendBlock,
    AppendBlockEnd,
    AppendSetup,
    AuthTokenCheckFailed,
    Command,
    CommandType,
    DataAppended,
    ErrorMessage,
    Event,
    GetStreamSegmentInfo,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    LocateOffset,
    NoSuchSegment,
    OffsetLocated,
    OperationUnsupported,
    Padding,
    PartialEvent,
    ReadSegment,
    SegmentAlreadyExists,
    SegmentIsSealed,
    SegmentIsTruncated,
    SegmentRead,
    SetupAppend,
    StreamSegmentInfo,
    WrongHost,
)

__all__ = [
    "COMMANDS",
    "EXTENSIONS",
    "FIELDS",
    "HEADER",
    "count_events",
    "decode",
    "decode_command",
    "encode",
    "event_frame",
    "type_name",
]

#: ``[type:i32][length:i32]``: every command's header, and every event frame's.
HEADER: Final = struct.Struct(">ii")
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_U16: Final = struct.Struct(">H")

#: Each command's fields in wire order: ``(attribute, kind)``. Kinds: ``i32``,
#: ``i64``, ``uuid``, ``bool``, ``utf`` (``writeUTF``), ``blob`` (``i32`` length
#: and bytes), ``rest`` (every remaining byte), ``zeros`` (the body's length);
#: a trailing ``?`` marks an optional field (defaults ``-1`` / ``""``).
FIELDS: Final[dict[type[Command], tuple[tuple[str, str], ...]]] = {
    Hello: (("high_version", "i32"), ("low_version", "i32")),
    KeepAlive: (),
    SetupAppend: (
        ("request_id", "i64"),
        ("writer_id", "uuid"),
        ("segment", "utf"),
        ("delegation_token", "utf"),
        ("payload_format", "i32?"),
    ),
    AppendSetup: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("writer_id", "uuid"),
        ("last_event_number", "i64"),
        ("payload_format", "i32?"),
    ),
    AppendBlock: (("writer_id", "uuid"), ("data", "rest")),
    AppendBlockEnd: (
        ("writer_id", "uuid"),
        ("size_of_whole_events", "i32"),
        ("data", "blob"),
        ("num_events", "i32"),
        ("last_event_number", "i64"),
        ("request_id", "i64?"),
    ),
    Event: (("data", "rest"),),
    PartialEvent: (("data", "rest"),),
    Padding: (("length", "zeros"),),
    DataAppended: (
        ("writer_id", "uuid"),
        ("event_number", "i64"),
        ("previous_event_number", "i64?"),
        ("request_id", "i64?"),
        ("current_segment_write_offset", "i64?"),
    ),
    ReadSegment: (
        ("segment", "utf"),
        ("offset", "i64"),
        ("suggested_length", "i32"),
        ("delegation_token", "utf"),
        ("request_id", "i64?"),
        ("flags", "i32?"),
    ),
    SegmentRead: (
        ("segment", "utf"),
        ("offset", "i64"),
        ("at_tail", "bool"),
        ("end_of_segment", "bool"),
        ("data", "blob"),
        ("request_id", "i64?"),
        ("formats", "blob?"),
    ),
    GetStreamSegmentInfo: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("delegation_token", "utf"),
    ),
    StreamSegmentInfo: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("exists", "bool"),
        ("is_sealed", "bool"),
        ("is_deleted", "bool"),
        ("last_modified", "i64"),
        ("write_offset", "i64"),
        ("start_offset", "i64"),
        ("first_event", "i64?"),
        ("next_event", "i64?"),
    ),
    LocateOffset: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("target_offset", "i64"),
        ("delegation_token", "utf"),
        ("events", "i64?"),
    ),
    OffsetLocated: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("offset", "i64"),
        ("event_index", "i64?"),
    ),
    WrongHost: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("correct_host", "utf"),
        ("server_stack_trace", "utf?"),
    ),
    SegmentIsSealed: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("server_stack_trace", "utf?"),
        ("offset", "i64?"),
    ),
    SegmentAlreadyExists: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("server_stack_trace", "utf?"),
    ),
    NoSuchSegment: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("server_stack_trace", "utf?"),
        ("offset", "i64?"),
    ),
    InvalidEventNumber: (
        ("writer_id", "uuid"),
        ("request_id", "i64"),
        ("server_stack_trace", "utf?"),
        ("event_number", "i64?"),
    ),
    SegmentIsTruncated: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("start_offset", "i64"),
        ("server_stack_trace", "utf?"),
        ("offset", "i64?"),
    ),
    OperationUnsupported: (
        ("request_id", "i64"),
        ("operation_name", "utf"),
        ("server_stack_trace", "utf?"),
    ),
    AuthTokenCheckFailed: (
        ("request_id", "i64"),
        ("server_stack_trace", "utf?"),
        ("error_code", "i32?"),
    ),
    ErrorMessage: (
        ("request_id", "i64"),
        ("segment", "utf"),
        ("message", "utf"),
        ("error_code", "i32"),
    ),
}

#: Command class by type code.
COMMANDS: Final[dict[int, type[Command]]] = {cls.TYPE: cls for cls in FIELDS}

#: Interchange's trailing optional fields (no Pravega peer sends them) and
#: their defaults: what an absent field decodes to, and what :func:`encode`
#: leaves out when nothing after it differs from its default.
EXTENSIONS: Final[dict[type[Command], dict[str, Any]]] = {
    cls: {f.name: f.default for f in dataclasses.fields(cls) if f.name in names}
    for cls, names in (
        (SetupAppend, {"payload_format"}),
        (AppendSetup, {"payload_format"}),
        (ReadSegment, {"flags"}),
        (SegmentRead, {"formats"}),
        (StreamSegmentInfo, {"first_event", "next_event"}),
        (LocateOffset, {"events"}),
        (OffsetLocated, {"event_index"}),
    )
}


def type_name(code: int) -> str:
    """A type code as a name for messages (``APPEND_BLOCK``, or ``type 43``)."""
    try:
        return CommandType(code).name
    except ValueError:
        return f"type {code}"


# -- encoding ------------------------------------------------------------------------------


def _put_int(st: struct.Struct, bits: int) -> Callable[[Any], bytes]:
    def put(value: Any) -> bytes:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"expected an int, not {value!r}")
        try:
            return st.pack(value)
        except struct.error:
            raise LocalProtocolError(f"{value} does not fit in a signed {bits}-bit field") from None

    return put


def _put_utf(value: Any) -> bytes:
    try:
        return mutf8.encode_utf(value)
    except mutf8.ModifiedUTF8Error as e:
        raise LocalProtocolError(str(e)) from None


def _put_uuid(value: Any) -> bytes:
    if not isinstance(value, UUID):
        raise TypeError(f"expected a UUID, not {value!r}")
    return value.bytes


def _put_blob(value: Any) -> bytes:
    return _I32.pack(len(value)) + bytes(value)


def _put_zeros(length: Any) -> bytes:
    if not isinstance(length, int) or length < 0:
        raise LocalProtocolError(f"a padding length is a non-negative int, not {length!r}")
    return bytes(length)


_PUT: Final[dict[str, Callable[[Any], bytes]]] = {
    "i32": _put_int(_I32, 32),
    "i64": _put_int(_I64, 64),
    "uuid": _put_uuid,
    "bool": lambda value: b"\x01" if value else b"\x00",
    "utf": _put_utf,
    "blob": _put_blob,
    "rest": bytes,
    "zeros": _put_zeros,
}


def encode(command: Command) -> bytes:
    """``command``'s header and fields; every optional field is written.

    Refused with :class:`~gateway.core.errors.LocalProtocolError`: a number out of
    its field's range, a string over 65535 bytes of modified UTF-8, a command
    over :data:`~.events.MAX_WIRECOMMAND_SIZE` bytes.
    """
    try:
        spec = FIELDS[type(command)]
    except KeyError:
        raise LocalProtocolError(f"not a segment-append command: {command!r}") from None
    values = [getattr(command, name) for name, _kind in spec]
    extension = EXTENSIONS.get(type(command))
    if extension:
        while values and spec[len(values) - 1][0] in extension:
            if values[-1] != extension[spec[len(values) - 1][0]]:
                break
            values.pop()
    parts = [b""]
    for (_name, kind), value in zip(spec, values, strict=False):
        parts.append(_PUT[kind.rstrip("?")](value))
    length = sum(map(len, parts))
    if length > MAX_WIRECOMMAND_SIZE:
        raise LocalProtocolError(
            f"{type(command).__name__} of {length} bytes exceeds the {MAX_WIRECOMMAND_SIZE}"
            " byte command limit"
        )
    parts[0] = HEADER.pack(command.TYPE, length)
    return b"".join(parts)


def event_frame(payload: bytes) -> bytes:
    """One event as it travels in a block and is stored in a segment: ``[0][len][payload]``."""
    return HEADER.pack(0, len(payload)) + payload


# -- decoding ------------------------------------------------------------------------------


class _Fields:
    """A cursor over one command's body; running short is the peer's error."""

    __slots__ = ("data", "end", "name", "pos")

    def __init__(self, data: bytes | bytearray | memoryview, pos: int, end: int, name: str):
        self.data = data
        self.pos = pos
        self.end = end
        self.name = name

    def _take(self, n: int) -> int:
        pos = self.pos
        if n > self.end - pos:
            raise RemoteProtocolError(f"{self.name} ends inside its fields")
        self.pos = pos + n
        return pos

    def i32(self) -> int:
        return int(_I32.unpack_from(self.data, self._take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack_from(self.data, self._take(8))[0])

    def uuid(self) -> UUID:
        p = self._take(16)
        return UUID(bytes=bytes(self.data[p : p + 16]))

    def bool(self) -> bool:
        return self.data[self._take(1)] != 0

    def raw(self, n: int) -> bytes:
        p = self._take(n)
        return bytes(self.data[p : p + n])

    def utf(self) -> str:
        n = int(_U16.unpack_from(self.data, self._take(2))[0])
        p = self._take(n)
        try:
            return mutf8.decode(self.data[p : p + n])
        except mutf8.ModifiedUTF8Error as e:
            raise RemoteProtocolError(f"{self.name}: {e}") from None

    def blob(self) -> bytes:
        n = self.i32()
        if n < 0:
            raise RemoteProtocolError(f"{self.name}: negative data length {n}")
        return self.raw(n)

    def rest(self) -> bytes:
        return self.raw(self.end - self.pos)

    def zeros(self) -> int:
        n = self.end - self.pos
        self.pos = self.end
        return n

    def opt(self, kind: str, default: Any = -1) -> Any:
        """Java's ``available() >= size ? read : default`` (``> 0`` for a string)."""
        left = self.end - self.pos
        if kind == "utf":
            return self.utf() if left > 0 else ("" if default == -1 else default)
        size = 8 if kind == "i64" else 4
        return getattr(self, kind)() if left >= size else default


def decode(code: int, data: bytes | bytearray | memoryview, start: int, end: int) -> Command:
    """The command of type ``code`` whose body is ``data[start:end]``.

    Refused with :class:`~gateway.core.errors.RemoteProtocolError`: an unknown
    type, a body shorter than its required fields, a bad string or length.
    """
    cls = COMMANDS.get(code)
    if cls is None:
        raise RemoteProtocolError(f"unknown command {type_name(code)}")
    cursor = _Fields(data, start, end, cls.__name__)
    extension = EXTENSIONS.get(cls, {})
    values = []
    for name, kind in FIELDS[cls]:
        if kind[-1] == "?":
            values.append(cursor.opt(kind[:-1], extension.get(name, -1)))
        else:
            values.append(getattr(cursor, kind)())
    return cls(*values)


def decode_command(data: bytes | bytearray | memoryview, start: int = 0) -> tuple[Command, int]:
    """The whole command at ``data[start:]`` and the offset after it.

    Unlike a connection, it knows no direction or state: any command,
    :class:`~.events.Event` included, decodes.
    """
    if len(data) - start < HEADER.size:
        raise RemoteProtocolError("a command header is 8 bytes")
    code, length = HEADER.unpack_from(data, start)
    if not 0 <= length <= MAX_WIRECOMMAND_SIZE:
        raise RemoteProtocolError(f"command length {length} outside 0..{MAX_WIRECOMMAND_SIZE}")
    body = start + HEADER.size
    if len(data) - body < length:
        raise RemoteProtocolError(f"{type_name(code)} of {length} bytes is cut short")
    return decode(code, data, body, body + length), body + length


def count_events(data: bytes | bytearray, start: int, end: int, max_payload: int) -> int:
    """How many event frames ``data[start:end]`` holds, exactly and nothing else.

    Refused with :class:`~gateway.core.errors.RemoteProtocolError`: a frame whose
    type is not 0 (``EVENT``), a negative length or a payload over
    ``max_payload`` bytes, a frame cut by ``end``.
    """
    unpack = HEADER.unpack_from
    p = frame = start
    count = 0
    last = end - 8
    while p <= last:
        frame = p
        code, length = unpack(data, p)
        if code or length < 0 or length > max_payload:
            if code:
                raise RemoteProtocolError(
                    f"{type_name(code)} where an event frame was expected, at byte {p - start}"
                )
            raise RemoteProtocolError(
                f"event of {length} bytes at byte {p - start}: outside 0..{max_payload}"
            )
        p += 8 + length
        count += 1
    if p != end:
        cut = p if p < end else frame
        raise RemoteProtocolError(f"the event frame at byte {cut - start} is cut short")
    return count
