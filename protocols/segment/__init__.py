"""Segment append (the Pravega segment-store wire protocol) for Interchange.

The sans-IO codec imports no I/O library: the commands are frozen
dataclasses (:mod:`.commands`), one command's bytes are encoded and decoded
by :mod:`.frames` (strings in Java's modified UTF-8, :mod:`.mutf8`), append
blocks are cut and put back together by :mod:`.blocks`, and
:mod:`.codec` holds the connection state machines of both roles. It speaks
the protocol toolkit's vocabulary (:data:`NEED_DATA`,
:class:`ConnectionClosed`, re-exported here).
"""

from gateway.sdk import NEED_DATA, ConnectionClosed

from .blocks import Append, BlockWriter
from .codec import (
    ClientConnection,
    ClientEvent,
    EventReassembler,
    Limits,
    SegmentProtocolError,
    ServerConnection,
    ServerEvent,
    State,
)
from .commands import (
    MAX_EVENT_PAYLOAD,
    MAX_WIRECOMMAND_SIZE,
    NULL_EVENT_NUMBER,
    OLDEST_COMPATIBLE_VERSION,
    WIRE_VERSION,
    AppendBlock,
    AppendBlockEnd,
    AppendSetup,
    AuthTokenCheckFailed,
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
    "ClientConnection",
    "ClientEvent",
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
    "ServerConnection",
    "ServerEvent",
    "SetupAppend",
    "State",
    "WrongHost",
    "decode_command",
    "encode",
    "event_frame",
]
