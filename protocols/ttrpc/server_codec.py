"""The server side of a ttrpc connection, sans I/O: frames in, events out, replies as bytes.

One explicit state per stream, from the server's point of view (research
ttrpc.md §4.2): a stream opens with a Request, is *remote closed* once the
client sends no more (a unary or ``remote closed`` Request, or Data with
``remote closed``), and is *finished* once the server sent its Response
(or, for streams, Data with ``remote closed`` after the client closed).
Bad input gets the Go server's status on that stream id, never a closed
connection (§3): oversize frames, even ids, reused ids, undecodable
Requests, Data for streams that are not active. Unknown frame types are
ignored, as Go does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from gateway.sdk import LocalProtocolError

from . import status as statuses
from . import ttrpc_pb2
from .connection import FramedConnection
from .events import BadInput, Call, HalfClosed, Message, ServerEvent
from .frames import MAX_DATA, Flags, Frame, MessageType, Oversize, encode_frame
from .status import Status

__all__ = ["ServerConnection", "StreamState"]

_REQUEST = MessageType.REQUEST.value
_DATA = MessageType.DATA.value


class StreamState(enum.Enum):
    #: The client may still send Data.
    OPEN = "open"
    #: The client sends nothing more; the server still answers.
    REMOTE_CLOSED = "remote closed"
    #: The server closed its side (Data ``remote closed``) before the client did.
    LOCAL_CLOSED = "local closed"


@dataclass(slots=True)
class _Stream:
    state: StreamState
    #: A unary call (Request flags 0): one Response, no Data either way.
    unary: bool


class ServerConnection(FramedConnection[ServerEvent]):
    """One accepted connection's protocol state (see the module docstring). After
    :class:`ConnectionClosed` its calls are abandoned: Go's server drops their replies."""

    def __init__(self, max_data: int = MAX_DATA) -> None:
        super().__init__(max_data)
        self._streams: dict[int, _Stream] = {}
        self._last_request = 0

    # -- input -------------------------------------------------------------------------
    def _frame(self, frame: Frame | Oversize) -> ServerEvent | None:
        sid = frame.stream_id
        if isinstance(frame, Oversize):
            return BadInput(sid, statuses.oversize(frame.length), self._end(sid))
        type = frame.type
        if type != _REQUEST and type != _DATA:
            return None  # unknown types (and a client's Response) are ignored, as Go does
        if not sid & 1:
            return BadInput(sid, statuses.id_not_odd())
        if type == _REQUEST:
            return self._request(frame)
        return self._data(frame)

    def _request(self, frame: Frame) -> ServerEvent | None:
        sid = frame.stream_id
        if sid <= self._last_request:
            return BadInput(sid, statuses.id_reused())
        self._last_request = sid
        try:
            request = ttrpc_pb2.Request.FromString(frame.data)
        except DecodeError as e:
            return BadInput(sid, statuses.unmarshal_request(str(e) or "invalid wire-format data"))
        return self._opened(sid, request, frame)

    def _opened(self, sid: int, request: ttrpc_pb2.Request, frame: Frame) -> ServerEvent | None:
        """Open the stream and make its event (a proxy may take the stream itself, keep
        its state its own way and return None)."""
        flags = frame.flags
        client_streams = bool(flags & Flags.REMOTE_OPEN)
        unary = not flags & (Flags.REMOTE_OPEN | Flags.REMOTE_CLOSED)
        state = StreamState.OPEN if client_streams else StreamState.REMOTE_CLOSED
        self._streams[sid] = _Stream(state, unary)
        return Call(sid, request, flags, client_streams, frame.data)

    def _data(self, frame: Frame) -> ServerEvent | None:
        sid = frame.stream_id
        stream = self._streams.get(sid)
        if stream is None or stream.state is StreamState.REMOTE_CLOSED or stream.unary:
            return BadInput(sid, statuses.stream_inactive())
        closing = bool(frame.flags & Flags.REMOTE_CLOSED)
        if closing:
            if stream.state is StreamState.LOCAL_CLOSED:
                del self._streams[sid]
            else:
                stream.state = StreamState.REMOTE_CLOSED
        return self._received(sid, None if frame.flags & Flags.NO_DATA else frame.data, closing)

    def _received(self, sid: int, message: bytes | None, closing: bool) -> ServerEvent | None:
        """The events of a Data frame on an active stream: its ``message`` (None: the
        frame carried none), then the close (a proxy may pass them on itself)."""
        if message is None:
            # Without ``remote closed`` such a frame says nothing at all.
            return HalfClosed(sid) if closing else None
        if closing:
            # Data with ``remote closed`` and a message: the message, then the close
            # (Go also answers INVALID_ARGUMENT, and later a second Response; we do not).
            self._queued.append(HalfClosed(sid))
        return Message(sid, message)

    def _end(self, sid: int) -> bool:
        """The stream ``sid`` is answered with an error Response now: finished."""
        return self._streams.pop(sid, None) is not None

    # -- output ------------------------------------------------------------------------
    def stream_state(self, stream_id: int) -> StreamState | None:
        """The stream's state, None once finished (or never opened)."""
        stream = self._streams.get(stream_id)
        return None if stream is None else stream.state

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    def respond(self, stream_id: int, payload: bytes = b"", status: Status | None = None) -> bytes:
        """The Response that finishes the stream: ``payload`` if OK, else ``status``
        (an OK Response omits its status, as Go's server does)."""
        self._require(stream_id)
        del self._streams[stream_id]
        response = ttrpc_pb2.Response()
        if status is not None and not status.ok:
            response.status.CopyFrom(status.to_pb())
        else:
            response.payload = payload
        return encode_frame(stream_id, MessageType.RESPONSE, 0, response.SerializeToString())

    def send_data(self, stream_id: int, data: bytes | None, *, close: bool = False) -> bytes:
        """A Data frame of a streaming call: a message (``None``: no message, with
        ``close``), the last one if ``close``. A unary stream has no Data."""
        stream = self._require(stream_id)
        if stream.unary:
            raise LocalProtocolError(f"stream {stream_id} is unary: answer it with respond()")
        if data is None and not close:
            raise LocalProtocolError("a Data frame without a message must close the stream")
        flags = (Flags.REMOTE_CLOSED if close else 0) | (Flags.NO_DATA if data is None else 0)
        if close:
            self._close_local(stream_id, stream)
        return encode_frame(stream_id, MessageType.DATA, flags, data or b"")

    def _close_local(self, stream_id: int, stream: _Stream) -> None:
        """Our side of the stream closes (Data ``remote closed`` goes out): the stream is
        finished if the client's side was closed already."""
        if stream.state is StreamState.REMOTE_CLOSED:
            del self._streams[stream_id]
        else:
            stream.state = StreamState.LOCAL_CLOSED

    def reply(self, event: BadInput) -> bytes:
        """The error Response to a :class:`BadInput`, on its stream id."""
        response = ttrpc_pb2.Response(status=event.status.to_pb())
        return encode_frame(event.stream_id, MessageType.RESPONSE, 0, response.SerializeToString())

    def _require(self, stream_id: int) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None or stream.state is StreamState.LOCAL_CLOSED:
            raise LocalProtocolError(f"stream {stream_id} is not open for sending")
        return stream
