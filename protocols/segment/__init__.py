"""Segment append (the Pravega segment-store wire protocol) for Interchange.

The sans-IO codec imports no I/O library: its events are the wire commands,
frozen dataclasses (:mod:`.events`), one command's bytes are encoded and
decoded by :mod:`.frames` (strings in Java's modified UTF-8, :mod:`.mutf8`),
append blocks are cut and put back together by :mod:`.blocks`, and
:mod:`.codec` holds the codecs of both roles, :class:`ServerCodec` and
:class:`ClientCodec`. It speaks the protocol toolkit's vocabulary
(:data:`NEED_DATA`, :class:`ConnectionClosed`, :class:`CodecState`,
re-exported here).
"""

from gateway.sdk import NEED_DATA, ConnectionClosed

from .blocks import BlockWriter
from .codec import (
    ClientCodec,
    CodecState,
    EventReassembler,
    Limits,
    SegmentProtocolError,
    ServerCodec,
)
from .events import (
    MAX_EVENT_PAYLOAD,
    MAX_WIRECOMMAND_SIZE,
    NULL_EVENT_NUMBER,
    OLDEST_COMPATIBLE_VERSION,
    WIRE_VERSION,
    Append,
    AppendBlock,
    AppendBlockEnd,
    AppendSetup,
    AuthTokenCheckFailed,
    ClientEvent,
    Command,
    CommandType,
    DataAppended,
    ErrorMessage,
    Event,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    NoSuchSegment,
    OperationUnsupported,
    Padding,
    PartialEvent,
    ReadSegment,
    SegmentAlreadyExists,
    SegmentIsSealed,
    SegmentIsTruncated,
    SegmentRead,
    ServerEvent,
    SetupAppend,
    WrongHost,
)
from .frames import decode_command, encode, event_frame

__all__ = [
    "MAX_EVENT_PAYLOAD",
    "MAX_WIRECOMMAND_SIZE",
    "NEED_DATA",
    "NULL_EVENT_NUMBER",
    "OLDEST_COMPATIBLE_VERSION",
    "WIRE_VERSION",
    "Append",
    "AppendBlock",
    "AppendBlockEnd",
    "AppendSetup",
    "AuthTokenCheckFailed",
    "BlockWriter",
    "ClientCodec",
    "ClientEvent",
    "CodecState",
    "Command",
    "CommandType",
    "ConnectionClosed",
    "DataAppended",
    "ErrorMessage",
    "Event",
    "EventReassembler",
    "Hello",
    "InvalidEventNumber",
    "KeepAlive",
    "Limits",
    "NoSuchSegment",
    "OperationUnsupported",
    "Padding",
    "PartialEvent",
    "ReadSegment",
    "SegmentAlreadyExists",
    "SegmentIsSealed",
    "SegmentIsTruncated",
    "SegmentProtocolError",
    "SegmentRead",
    "ServerCodec",
    "ServerEvent",
    "SetupAppend",
    "WrongHost",
    "decode_command",
    "encode",
    "event_frame",
]
