"""What the ttrpc codecs report: calls, their messages and bad input on the server
side; messages and replies on the client side.

Events are frozen dataclasses, as in h11. The server codec answers nothing
by itself: a :class:`BadInput` carries the status the Go server would send
on that stream, and the driver sends it with ``reply`` (or not, for a proxy
that decides otherwise). The client codec's events are :class:`StreamMessage`
and :class:`Reply`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import ttrpc_pb2
from .status import Status

__all__ = [
    "BadInput",
    "Call",
    "ClientEvent",
    "HalfClosed",
    "Message",
    "Reply",
    "ServerEvent",
    "StreamMessage",
]


@dataclass(frozen=True, slots=True)
class Call:
    """A new stream: the decoded Request and how the client will go on.

    ``client_streams``: the client sends Data messages (Request flag ``remote
    open``); otherwise the Request's payload is the call's (only) input
    message, even when it is 0 bytes long.
    """

    stream_id: int
    request: ttrpc_pb2.Request
    flags: int
    client_streams: bool
    #: The Request as received, for a proxy to forward byte for byte.
    data: bytes = field(default=b"", compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class Message:
    """One message of a client-streaming call (0 bytes is a message too)."""

    stream_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class HalfClosed:
    """The client sends no more messages on this stream (``remote closed``)."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class BadInput:
    """The client broke a rule for ``stream_id``; ``status`` is the Go server's reply.

    ``ends_stream``: the stream was active and is over now (the reply is its
    Response); the driver stops its handler. The connection goes on.
    """

    stream_id: int
    status: Status
    ends_stream: bool = False
    #: For the driver's log, never sent: a proxy names here the ``service/method`` whose
    #: client messages it does not relay (not among the upstream's ``client_streaming``).
    note: str = ""


ServerEvent = Call | Message | HalfClosed | BadInput


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """A message the server sent on a streaming call (0 bytes is a message)."""

    stream_id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    """The end of a call: a Response (``payload`` and ``status``), or, for a server
    stream that ended OK, its Data ``remote closed`` (``payload`` None)."""

    stream_id: int
    status: Status
    payload: bytes | None


ClientEvent = StreamMessage | Reply
