"""The segment-append codec's events: the wire commands, one frozen dataclass each.

Each command, with its type code, is an event the codecs return or send;
:class:`Append` is the one a server codec makes of an append block and its
end (see :mod:`.blocks`), and :data:`ServerEvent` / :data:`ClientEvent` say
what each role's ``next_event`` returns.

The layout is Pravega's segment-store wire protocol (``WireCommands.java``,
wire version 17, oldest compatible 5: the specification's draft became
this protocol, which keeps every concept of the draft). Each dataclass lists
its fields **in wire order**, so ``DataAppended`` starts with the writer id,
not the request id. Trailing fields that newer Pravega versions added
default to what an older peer's shorter command decodes to: ``-1`` for
numbers and ``""`` for stack traces.

A command's ``TYPE`` is its code in the 8-byte header ``[type:i32][length:i32]``.
:class:`Event`, :class:`PartialEvent` and :class:`Padding` only ever travel
inside an append block, never as commands of their own.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Final, TypeAlias
from uuid import UUID

__all__ = [
    "MAX_EVENT_PAYLOAD",
    "MAX_WIRECOMMAND_SIZE",
    "NULL_EVENT_NUMBER",
    "OLDEST_COMPATIBLE_VERSION",
    "READ_FORMATS",
    "WIRE_VERSION",
    "Append",
    "AppendBlock",
    "AppendBlockEnd",
    "AppendSetup",
    "AuthTokenCheckFailed",
    "ClientEvent",
    "Command",
    "CommandType",
    "DataAppended",
    "ErrorMessage",
    "Event",
    "GetStreamSegmentInfo",
    "Hello",
    "InvalidEventNumber",
    "KeepAlive",
    "LocateOffset",
    "NoSuchSegment",
    "OffsetLocated",
    "OperationUnsupported",
    "Padding",
    "PartialEvent",
    "PayloadFormat",
    "ReadSegment",
    "SegmentAlreadyExists",
    "SegmentIsSealed",
    "SegmentIsTruncated",
    "SegmentRead",
    "ServerEvent",
    "SetupAppend",
    "StreamSegmentInfo",
    "WrongHost",
    "unpack_format_runs",
]

#: The protocol version this implementation speaks, and the oldest it accepts.
WIRE_VERSION: Final = 17
OLDEST_COMPATIBLE_VERSION: Final = 5
#: Largest ``length`` in a command header (16 MiB - 1).
MAX_WIRECOMMAND_SIZE: Final = 0x00FFFFFF
#: Largest event payload (Pravega's ``Serializer.MAX_EVENT_SIZE``); its frame adds 8 bytes.
MAX_EVENT_PAYLOAD: Final = 8 * 1024 * 1024
#: ``Long.MIN_VALUE``: no event of this writer is stored yet.
NULL_EVENT_NUMBER: Final = -(2**63)
#: :attr:`ReadSegment.flags` bit 0: report the payload formats (:attr:`SegmentRead.formats`).
READ_FORMATS: Final = 1
#: One entry of :attr:`SegmentRead.formats`: ``[offset:i64][format:i8]``.
_FORMAT_ENTRY: Final = struct.Struct(">qb")


class PayloadFormat(enum.IntEnum):
    """How a segment's event payloads are to be read (Interchange's extension).

    The numbers are the store's record formats: a raw payload is opaque
    bytes, an envelope is a hub message as :mod:`gateway.durable.envelope`
    stores it (body, headers, content type, source, stored time).
    """

    RAW = 0
    ENVELOPE = 1


class CommandType(enum.IntEnum):
    """The type codes of the commands this implementation knows."""

    HELLO = -127
    PARTIAL_EVENT = -2
    PADDING = -1
    EVENT = 0
    SETUP_APPEND = 1
    APPEND_SETUP = 2
    APPEND_BLOCK = 3
    APPEND_BLOCK_END = 4
    DATA_APPENDED = 7
    READ_SEGMENT = 9
    SEGMENT_READ = 10
    GET_STREAM_SEGMENT_INFO = 11
    STREAM_SEGMENT_INFO = 12
    LOCATE_OFFSET = 41
    OFFSET_LOCATED = 42
    WRONG_HOST = 50
    SEGMENT_IS_SEALED = 51
    SEGMENT_ALREADY_EXISTS = 52
    NO_SUCH_SEGMENT = 53
    INVALID_EVENT_NUMBER = 55
    SEGMENT_IS_TRUNCATED = 56
    OPERATION_UNSUPPORTED = 57
    AUTH_TOKEN_CHECK_FAILED = 60
    ERROR_MESSAGE = 61
    KEEP_ALIVE = 100


class Command:
    """Base of every wire command; never instantiated itself."""

    __slots__ = ()
    TYPE: ClassVar[CommandType]


@dataclass(frozen=True, slots=True)
class Hello(Command):
    """The version range a peer speaks; the client sends it first, the server answers it."""

    TYPE: ClassVar[CommandType] = CommandType.HELLO
    high_version: int = WIRE_VERSION
    low_version: int = OLDEST_COMPATIBLE_VERSION

    @property
    def compatible(self) -> bool:
        """Whether this range overlaps ours (:data:`OLDEST_COMPATIBLE_VERSION` ..
        :data:`WIRE_VERSION`); a server closes after answering one that does not."""
        return self.low_version <= WIRE_VERSION and self.high_version >= OLDEST_COMPATIBLE_VERSION


@dataclass(frozen=True, slots=True)
class KeepAlive(Command):
    """A liveness probe; the server echoes it. Any payload is skipped."""

    TYPE: ClassVar[CommandType] = CommandType.KEEP_ALIVE


@dataclass(frozen=True, slots=True)
class SetupAppend(Command):
    """A writer asks to append to ``segment``; answered by :class:`AppendSetup` or an error."""

    TYPE: ClassVar[CommandType] = CommandType.SETUP_APPEND
    request_id: int
    writer_id: UUID
    segment: str
    delegation_token: str = ""
    #: Interchange's trailing field: the writer's events are raw payloads (0,
    #: also when absent) or envelopes (1) the server checks and stores as such.
    payload_format: int = PayloadFormat.RAW


@dataclass(frozen=True, slots=True)
class AppendSetup(Command):
    """The writer may append; every event up to ``last_event_number`` is stored already.

    ``last_event_number`` is :data:`NULL_EVENT_NUMBER` for a writer with no
    event stored (a draft-literal peer's 0 means the same).
    """

    TYPE: ClassVar[CommandType] = CommandType.APPEND_SETUP
    request_id: int
    segment: str
    writer_id: UUID
    last_event_number: int
    #: Interchange's trailing field: the payload format the server accepted
    #: (-1, absent: a server that does not know the field, so only raw).
    payload_format: int = -1


@dataclass(frozen=True, slots=True)
class AppendBlock(Command):
    """The start of an append block: the writer and the block's bytes.

    On the wire the header's length covers the whole block, so a client
    streams events into it after the 16-byte writer id; ``data`` is every
    byte after the writer id (whole events, then one :class:`PartialEvent`
    or :class:`Padding` filling the block).
    """

    TYPE: ClassVar[CommandType] = CommandType.APPEND_BLOCK
    writer_id: UUID
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class AppendBlockEnd(Command):
    """Closes the block just sent: how much of it is whole events, the partial
    event's tail (``data``), and which events the block held."""

    TYPE: ClassVar[CommandType] = CommandType.APPEND_BLOCK_END
    writer_id: UUID
    size_of_whole_events: int
    data: bytes
    num_events: int
    last_event_number: int
    request_id: int = -1


@dataclass(frozen=True, slots=True)
class Event(Command):
    """One event; its frame ``[0][length][payload]`` is also how segments store it."""

    TYPE: ClassVar[CommandType] = CommandType.EVENT
    data: bytes


@dataclass(frozen=True, slots=True)
class PartialEvent(Command):
    """The first bytes of an event that did not fit in its block (the last thing in it)."""

    TYPE: ClassVar[CommandType] = CommandType.PARTIAL_EVENT
    data: bytes


@dataclass(frozen=True, slots=True)
class Padding(Command):
    """``length`` zero bytes that fill a block closed early."""

    TYPE: ClassVar[CommandType] = CommandType.PADDING
    length: int


@dataclass(frozen=True, slots=True)
class DataAppended(Command):
    """Every event of the writer up to ``event_number`` is stored.

    ``previous_event_number`` is what the previous ack (or the
    :class:`AppendSetup`) said, and ``current_segment_write_offset`` the
    segment's length after the append.
    """

    TYPE: ClassVar[CommandType] = CommandType.DATA_APPENDED
    writer_id: UUID
    event_number: int
    previous_event_number: int = -1
    request_id: int = -1
    current_segment_write_offset: int = -1


@dataclass(frozen=True, slots=True)
class ReadSegment(Command):
    """Read ``segment`` from byte ``offset``; the server answers with one or more
    :class:`SegmentRead` of any size."""

    TYPE: ClassVar[CommandType] = CommandType.READ_SEGMENT
    segment: str
    offset: int
    suggested_length: int
    delegation_token: str = ""
    request_id: int = -1
    #: Interchange's trailing field: :data:`READ_FORMATS` asks for
    #: :attr:`SegmentRead.formats` (0, also when absent: no flag).
    flags: int = 0


@dataclass(frozen=True, slots=True)
class SegmentRead(Command):
    """Segment bytes from ``offset`` (event frames, cut anywhere)."""

    TYPE: ClassVar[CommandType] = CommandType.SEGMENT_READ
    segment: str
    offset: int
    at_tail: bool
    end_of_segment: bool
    data: bytes
    request_id: int = -1
    #: Interchange's trailing field, only sent when the read asked with
    #: :data:`READ_FORMATS`: ``n x [offset:i64][format:i8]`` (see
    #: :attr:`format_runs`); None when absent.
    formats: bytes | None = None

    @property
    def format_runs(self) -> list[tuple[int, int]]:
        """:attr:`formats` as ``(offset, format)`` runs, ascending, the first at
        :attr:`offset`: the payload format of the events from that offset up
        to the next run (or the end of the data). ``[]`` when absent.

        Raises ValueError for a blob that is not whole 9-byte entries (the
        client codec refuses such a reply before it gets here).
        """
        return unpack_format_runs(self.formats or b"")

    @staticmethod
    def pack_formats(runs: Sequence[tuple[int, int]]) -> bytes:
        """``runs`` (``(offset, format)`` pairs) as the :attr:`formats` blob."""
        return b"".join(_FORMAT_ENTRY.pack(offset, fmt) for offset, fmt in runs)


def unpack_format_runs(blob: bytes) -> list[tuple[int, int]]:
    """The ``(offset, format)`` runs of a :attr:`SegmentRead.formats` blob."""
    if len(blob) % _FORMAT_ENTRY.size:
        raise ValueError(f"a formats blob of {len(blob)} bytes is not whole 9-byte entries")
    return [(int(o), int(f)) for o, f in _FORMAT_ENTRY.iter_unpack(blob)]


@dataclass(frozen=True, slots=True)
class GetStreamSegmentInfo(Command):
    """Ask what a segment holds; answered by :class:`StreamSegmentInfo`, also
    for a segment that does not exist (never created by asking)."""

    TYPE: ClassVar[CommandType] = CommandType.GET_STREAM_SEGMENT_INFO
    request_id: int
    segment: str
    delegation_token: str = ""


@dataclass(frozen=True, slots=True)
class StreamSegmentInfo(Command):
    """What a segment holds: its retained bytes ``start_offset .. write_offset``.

    ``write_offset`` is the durable end (what a read can return);
    ``last_modified`` is the time of the last durable append in ms since the
    epoch (0: unknown). A missing segment has ``exists`` false and zeros.
    ``first_event`` and ``next_event`` are Interchange's trailing fields: the
    event index of the event at ``start_offset`` and of the next one appended
    (-1 when absent).
    """

    TYPE: ClassVar[CommandType] = CommandType.STREAM_SEGMENT_INFO
    request_id: int
    segment: str
    exists: bool
    is_sealed: bool
    is_deleted: bool
    last_modified: int
    write_offset: int
    start_offset: int
    first_event: int = -1
    next_event: int = -1


@dataclass(frozen=True, slots=True)
class LocateOffset(Command):
    """Find an event boundary (Interchange's command): the last one at or before
    ``target_offset`` (clamped into the retained, durable bytes), or with
    ``events = n >= 0`` the one ``n`` events after it (clamped to the end).
    Answered by :class:`OffsetLocated` or ``NoSuchSegment``."""

    TYPE: ClassVar[CommandType] = CommandType.LOCATE_OFFSET
    request_id: int
    segment: str
    target_offset: int
    delegation_token: str = ""
    events: int = -1


@dataclass(frozen=True, slots=True)
class OffsetLocated(Command):
    """The boundary a :class:`LocateOffset` asked for, and the index of the event
    that starts there (the segment's next event index at its end; -1 absent)."""

    TYPE: ClassVar[CommandType] = CommandType.OFFSET_LOCATED
    request_id: int
    segment: str
    offset: int
    event_index: int = -1


@dataclass(frozen=True, slots=True)
class WrongHost(Command):
    """The segment lives on ``correct_host``."""

    TYPE: ClassVar[CommandType] = CommandType.WRONG_HOST
    request_id: int
    segment: str
    correct_host: str
    server_stack_trace: str = ""


@dataclass(frozen=True, slots=True)
class SegmentIsSealed(Command):
    """The segment takes no more appends (sealed at ``offset``)."""

    TYPE: ClassVar[CommandType] = CommandType.SEGMENT_IS_SEALED
    request_id: int
    segment: str
    server_stack_trace: str = ""
    offset: int = -1


@dataclass(frozen=True, slots=True)
class SegmentAlreadyExists(Command):
    TYPE: ClassVar[CommandType] = CommandType.SEGMENT_ALREADY_EXISTS
    request_id: int
    segment: str
    server_stack_trace: str = ""


@dataclass(frozen=True, slots=True)
class NoSuchSegment(Command):
    TYPE: ClassVar[CommandType] = CommandType.NO_SUCH_SEGMENT
    request_id: int
    segment: str
    server_stack_trace: str = ""
    #: The offset the request named.
    offset: int = -1


@dataclass(frozen=True, slots=True)
class InvalidEventNumber(Command):
    """The writer's event number is not above the last one stored: it must set up again."""

    TYPE: ClassVar[CommandType] = CommandType.INVALID_EVENT_NUMBER
    writer_id: UUID
    request_id: int
    server_stack_trace: str = ""
    event_number: int = -1


@dataclass(frozen=True, slots=True)
class SegmentIsTruncated(Command):
    """A read below the segment's retained start, which is ``start_offset``."""

    TYPE: ClassVar[CommandType] = CommandType.SEGMENT_IS_TRUNCATED
    request_id: int
    segment: str
    start_offset: int
    server_stack_trace: str = ""
    #: The offset the request named.
    offset: int = -1


@dataclass(frozen=True, slots=True)
class OperationUnsupported(Command):
    TYPE: ClassVar[CommandType] = CommandType.OPERATION_UNSUPPORTED
    request_id: int
    operation_name: str
    server_stack_trace: str = ""


@dataclass(frozen=True, slots=True)
class AuthTokenCheckFailed(Command):
    """The delegation token was refused (``error_code``: -1 unspecified, 0 failed, 1 expired)."""

    TYPE: ClassVar[CommandType] = CommandType.AUTH_TOKEN_CHECK_FAILED
    request_id: int
    server_stack_trace: str = ""
    error_code: int = -1


@dataclass(frozen=True, slots=True)
class ErrorMessage(Command):
    """A generic failure (``error_code``: -1 unspecified, 0 illegal argument)."""

    TYPE: ClassVar[CommandType] = CommandType.ERROR_MESSAGE
    request_id: int
    segment: str
    message: str
    error_code: int = -1


@dataclass(frozen=True, slots=True)
class Append:
    """One append block received whole and checked: ``event_count`` events of a writer.

    Answer it with ``DataAppended`` once its data is stored
    (:meth:`~protocols.segment.ServerCodec.acknowledge`).
    """

    writer_id: UUID
    #: The block end's request id (-1 from a peer too old to send one).
    request_id: int
    #: The events' frames, ``[0][len][payload]`` each: what the segment stores.
    data: bytes
    event_count: int
    #: The number of the block's last event; its first is ``last - count + 1``.
    last_event_number: int
    #: The segment the writer was set up for.
    segment: str
    #: The payload format the writer was set up with (the ``AppendSetup``'s):
    #: a server stores envelopes only after checking each one.
    payload_format: int = PayloadFormat.RAW


#: What :meth:`ServerCodec.next_event` returns (besides NEED_DATA and ConnectionClosed).
ServerEvent: TypeAlias = (
    Hello | KeepAlive | SetupAppend | ReadSegment | Append | GetStreamSegmentInfo | LocateOffset
)
#: What :meth:`ClientCodec.next_event` returns (besides NEED_DATA and ConnectionClosed).
ClientEvent: TypeAlias = (
    Hello
    | KeepAlive
    | AppendSetup
    | DataAppended
    | SegmentRead
    | StreamSegmentInfo
    | OffsetLocated
    | WrongHost
    | SegmentIsSealed
    | SegmentAlreadyExists
    | NoSuchSegment
    | InvalidEventNumber
    | SegmentIsTruncated
    | OperationUnsupported
    | AuthTokenCheckFailed
    | ErrorMessage
)
