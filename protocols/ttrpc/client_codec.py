"""The client side of a ttrpc connection, sans I/O: calls out as bytes, replies in as events.

Stream ids are odd, from 1, rising by 2, and reach the wire in the order
:meth:`ClientConnection.start` hands them out (the driver writes them in that
order). What each call kind sends is what Go's client sends (research
ttrpc.md §4.2): unary ``Request`` flags 0; server streaming ``remote closed``
with the request inside; client and bidi streaming ``remote open``, then
Data, then Data ``remote closed | no data``. A Response ends a stream
whatever the client still meant to send. Frames for streams already over are
dropped quietly (a late reply after a local timeout), an oversize one fails
only its stream.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from gateway.sdk import LocalProtocolError

from . import ttrpc_pb2
from .connection import FramedConnection
from .frames import MAX_DATA, Flags, Frame, MessageType, Oversize, encode_frame
from .status import Code, Status, oversize, status_of

__all__ = ["CallKind", "ClientConnection", "ClientEvent", "Reply", "StreamMessage"]

#: Odd ids up to here; a connection that used them all must be replaced.
MAX_CLIENT_ID = 2**31 - 1


class CallKind(enum.Enum):
    UNARY = "unary"
    SERVER_STREAMING = "server streaming"
    CLIENT_STREAMING = "client streaming"
    BIDI = "bidi"

    @property
    def client_streams(self) -> bool:
        return self in (CallKind.CLIENT_STREAMING, CallKind.BIDI)


#: The Request's flags for each kind of call, as Go's client sets them.
_FLAGS = {
    CallKind.UNARY: Flags.NONE,
    CallKind.SERVER_STREAMING: Flags.REMOTE_CLOSED,
    CallKind.CLIENT_STREAMING: Flags.REMOTE_OPEN,
    CallKind.BIDI: Flags.REMOTE_OPEN,
}


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


@dataclass(slots=True)
class _Stream:
    kind: CallKind
    #: We sent our last message (or the kind sends none after the Request).
    local_closed: bool


class ClientConnection(FramedConnection[ClientEvent]):
    """One connection's calls, from the client's side (see the module docstring).
    After :class:`ConnectionClosed`, :meth:`fail_all` says which calls failed."""

    def __init__(self, max_data: int = MAX_DATA) -> None:
        super().__init__(max_data)
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1

    # -- output ------------------------------------------------------------------------
    def start(
        self,
        kind: CallKind,
        service: str,
        method: str,
        payload: bytes = b"",
        *,
        timeout_nano: int = 0,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> tuple[int, bytes]:
        """Open a call: its stream id and the Request frame. ``payload`` is the request
        message of unary and server-streaming calls (client-streaming ones send Data)."""
        if self._next_id > MAX_CLIENT_ID:
            raise LocalProtocolError("this connection has used every stream id; open another")
        if kind.client_streams and payload:
            raise LocalProtocolError(f"a {kind.value} call sends its messages as Data")
        sid = self._next_id
        request = ttrpc_pb2.Request(
            service=service, method=method, payload=payload, timeout_nano=timeout_nano
        )
        if metadata:
            request.metadata.extend(ttrpc_pb2.KeyValue(key=k, value=v) for k, v in metadata)
        wire = encode_frame(sid, MessageType.REQUEST, _FLAGS[kind], request.SerializeToString())
        self._next_id += 2
        self._streams[sid] = _Stream(kind, local_closed=not kind.client_streams)
        return sid, wire

    def send(self, stream_id: int, data: bytes) -> bytes:
        """One message of a client-streaming or bidi call."""
        self._open_for_sending(stream_id)
        return encode_frame(stream_id, MessageType.DATA, 0, data)

    def close_send(self, stream_id: int) -> bytes:
        """No more messages from us: Data ``remote closed | no data``."""
        stream = self._open_for_sending(stream_id)
        stream.local_closed = True
        return encode_frame(stream_id, MessageType.DATA, Flags.REMOTE_CLOSED | Flags.NO_DATA)

    def abandon(self, stream_id: int) -> None:
        """Forget a call (a local timeout, a cancelled caller): there is no cancel frame,
        so its late frames are dropped when they come."""
        self._streams.pop(stream_id, None)

    def _open_for_sending(self, stream_id: int) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None or not stream.kind.client_streams or stream.local_closed:
            raise LocalProtocolError(f"stream {stream_id} takes no more messages from us")
        return stream

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    def is_active(self, stream_id: int) -> bool:
        return stream_id in self._streams

    # -- input -------------------------------------------------------------------------
    def fail_all(self) -> list[int]:
        """The connection is gone: the ids of the calls that were still active."""
        ids = list(self._streams)
        self._streams.clear()
        return ids

    def _frame(self, frame: Frame | Oversize) -> ClientEvent | None:
        sid = frame.stream_id
        stream = self._streams.get(sid)
        if stream is None:
            return None  # a call we no longer wait for (or never made)
        if isinstance(frame, Oversize):
            del self._streams[sid]
            return Reply(sid, oversize(frame.length), b"")
        if frame.type == MessageType.RESPONSE:
            del self._streams[sid]
            try:
                response = ttrpc_pb2.Response.FromString(frame.data)
            except DecodeError as e:
                return Reply(sid, Status(Code.INTERNAL, f"undecodable response: {e}"), b"")
            status = status_of(response)
            return Reply(sid, status, response.payload if status.ok else b"")
        if frame.type != MessageType.DATA:
            return None  # unknown types are ignored, as Go does
        if stream.kind is CallKind.UNARY or stream.kind is CallKind.CLIENT_STREAMING:
            del self._streams[sid]
            return Reply(
                sid,
                Status(Code.INTERNAL, 'unexpected "data" message received: protocol error'),
                b"",
            )
        closing = bool(frame.flags & Flags.REMOTE_CLOSED)
        message = None if frame.flags & Flags.NO_DATA else StreamMessage(sid, frame.data)
        if not closing:
            return message
        del self._streams[sid]
        end = Reply(sid, Status(Code.OK), None)
        if message is None:
            return end
        self._queued.append(end)
        return message
