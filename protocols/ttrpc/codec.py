"""The ttrpc codecs, sans I/O: frames in, events out, replies and calls as bytes.

Every codec here reads frames with :class:`~.frames.FrameReader` and stands on
the toolkit's :class:`~gateway.protocol.lifecycle.Lifecycle` (see
``docs/codecs.md``): ``receive_data``, ``next_event`` until
:data:`~gateway.sdk.NEED_DATA`, a :class:`~gateway.sdk.ConnectionClosed`
once the peer closed (then every time). ttrpc has no connection-level error:
bad input is answered on its stream and the connection goes on, as Go's
server does, so these codecs never enter ``ERROR``.

* :class:`ServerCodec`, the server side. One explicit state per stream,
  from the server's point of view (as containerd's Go server keeps it): a stream opens
  with a Request, is *remote closed* once the client sends no more (a unary
  or ``remote closed`` Request, or Data with ``remote closed``), and is
  *finished* once the server sent its Response (or, for streams, Data with
  ``remote closed`` after the client closed). Bad input gets the Go server's
  status on that stream id, never a closed connection: oversize frames,
  even ids, reused ids, undecodable Requests, Data for streams that are not
  active. Unknown frame types are ignored, as Go does.
* :class:`ClientCodec`, the client side. Stream ids are odd, from 1, rising
  by 2, and reach the wire in the order :meth:`ClientCodec.start` hands them
  out (the driver writes them in that order). What each call kind sends is
  what Go's client sends: unary ``Request`` flags 0; server streaming
  ``remote closed`` with the request inside; client and bidi streaming
  ``remote open``, then Data, then Data ``remote closed | no data``. A
  Response ends a stream whatever the client still meant to send. Frames for
  streams already over are dropped quietly (a late reply after a local
  timeout), an oversize one fails only its stream.
* :class:`ProxyServerCodec` and :class:`ProxyClientCodec`, a proxy's two
  sides (see :ref:`the proxy pair <proxy-pair>` below).

.. _proxy-pair:

**The proxy pair.** A :class:`ProxyServerCodec` is the server side of one
client's connection; a :class:`ProxyClientCodec` is one connection to an
upstream server, carrying the streams of many clients. Between them, frames
are relayed without events. The routing state is theirs and typed: a
``_Route`` per relayed stream (the client's codec and stream id, the
upstream's codec and stream id, the stream's state), and the codecs name
each other, never the driver. The driver's *router* names the upstream codec
for a new stream's service; the Request goes into that codec's output under
an id of its own (odd, from 1, rising by 2, in the order they reach the
wire), the client's Data follows it there, and what the server sends comes
back into the client codec's output under the client's id, the frame's type,
flags and bytes untouched. The driver moves the bytes and keeps its own map
from codecs to its connections: :meth:`ProxyServerCodec.take_touched` names
the upstream codecs with output (:meth:`ProxyClientCodec.data_to_send`), and
:meth:`ProxyClientCodec.take_relayed` hands over what each client codec's
peer gets, as :class:`Relayed`.

Everything else is the server codec's: a stream whose service is served
locally, or whose upstream connection is not ready (the router says None),
comes out as a :class:`~.events.Call` as usual, and the driver relays it
later with :meth:`ProxyServerCodec.relay`; Data of a relayed stream whose
upstream connection has no room (``has_room``) comes out as
:class:`~.events.Message` / :class:`~.events.HalfClosed`, for the driver to
relay with :meth:`ProxyServerCodec.relay_data` once it has; bad input comes
out as :class:`~.events.BadInput` for the driver to answer.

**What reaches the upstream.** Each relayed stream has one state (a small
int, :data:`OPEN` ... :data:`OVER`), moved by what the client sends
(:data:`CLIENT_STEP`) and by what the upstream sends (:data:`UPSTREAM_STEP`),
both directions in one place. It is the upstream's view of the stream, as
containerd's Go server keeps it: Go forgets a stream once it sent its
Response or its Data ``remote closed``, and up to 1.2.7 a Data frame for a
stream it forgot, or for a unary method whatever the Request's flags, kills
the whole server (a panic on its connection's reader). So a client's Data
goes up only while its side is open and the upstream's too, and only on a
stream opened ``remote open`` for a method the upstream connection was told
takes the client's messages (``client_streaming``: the Request's flags are
the client's word, not the method's kind). Every other Data frame is
answered here as Go answers it, or dropped where Go says nothing.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final, Generic, NamedTuple, TypeVar

from google.protobuf.message import DecodeError

from gateway.sdk import (
    NEED_DATA,
    CodecState,
    ConnectionClosed,
    Lifecycle,
    LocalProtocolError,
    NeedData,
)

from . import status as statuses
from . import ttrpc_pb2
from .events import (
    BadInput,
    Call,
    ClientEvent,
    HalfClosed,
    Message,
    Reply,
    ServerEvent,
    StreamMessage,
)
from .frames import (
    HEADER,
    MAX_DATA,
    Flags,
    Frame,
    FrameReader,
    MessageType,
    Oversize,
    encode_frame,
    frames_size,
)
from .status import Code, Status, oversize, status_of

__all__ = [
    "CLIENT_STEP",
    "UPSTREAM_STEP",
    "CallKind",
    "ClientCodec",
    "CodecState",
    "FramedCodec",
    "ProxyClientCodec",
    "ProxyServerCodec",
    "Relayed",
    "Router",
    "ServerCodec",
    "StreamState",
]

E = TypeVar("E")

_OPEN_CODEC: Final = CodecState.OPEN
_REQUEST = MessageType.REQUEST.value
_DATA = MessageType.DATA.value
_RESPONSE = MessageType.RESPONSE.value
#: Odd ids up to here; a connection that used them all must be replaced.
MAX_CLIENT_ID = 2**31 - 1


class FramedCodec(Lifecycle, Generic[E]):
    """What every ttrpc codec shares: a frame reader on the lifecycle's buffer, a queue
    of decided events, and the loop that turns frames into events (each role says how,
    in :meth:`_frame`)."""

    def __init__(self, max_data: int = MAX_DATA) -> None:
        super().__init__()
        self._reader = FrameReader(max_data, self._buffer)
        #: Events decided and not yet returned (a close after its last message).
        self._queued: deque[E] = deque()
        #: Frames cut from what was received, and the index of the next to decide.
        self._frames: list[Frame | Oversize] = []
        self._next = 0

    @property
    def held_bytes(self) -> int:
        """Received bytes not yet decided: a partial frame, whole frames not yet turned
        into events (skipped oversize data excluded)."""
        return self._reader.held_bytes + frames_size(self._frames[self._next :])

    def next_event(self) -> E | ConnectionClosed | NeedData:
        """The next event, :data:`~gateway.sdk.NEED_DATA`, or :class:`ConnectionClosed`
        once the peer closed its side (then every time)."""
        if self._queued:
            return self._queued.popleft()
        if self._state is not _OPEN_CODEC:
            return self._not_open()
        frames, decide = self._frames, self._frame
        i = self._next
        while True:
            if i >= len(frames):
                # Cut every whole frame at once: many small frames arrive in one read.
                frames = self._frames = self._reader.frames()
                i = 0
                if not frames:
                    self._next = 0
                    return self._closed() if self._buffer.eof else NEED_DATA
            frame = frames[i]
            i += 1
            event = decide(frame)
            if event is not None:
                self._next = i
                return event

    def _release(self) -> None:
        super()._release()
        self._frames = []
        self._next = 0
        self._queued.clear()

    def _frame(self, frame: Frame | Oversize) -> E | None:
        """The event a frame makes (None: it makes none)."""
        raise NotImplementedError


# -- the server side ----------------------------------------------------------------------


class StreamState(enum.Enum):
    """A stream's state, from the server's point of view."""

    #: The client may still send Data.
    OPEN = "open"
    #: The client sends nothing more; the server still answers.
    REMOTE_CLOSED = "remote closed"
    #: The server closed its side (Data ``remote closed``) before the client did.
    LOCAL_CLOSED = "local closed"


@dataclass(slots=True)
class _ServerStream:
    state: StreamState
    #: A unary call (Request flags 0): one Response, no Data either way.
    unary: bool


class ServerCodec(FramedCodec[ServerEvent]):
    """One accepted connection's protocol state (see the module docstring). After
    :class:`ConnectionClosed` its calls are abandoned: Go's server drops their replies."""

    def __init__(self, max_data: int = MAX_DATA) -> None:
        super().__init__(max_data)
        self._streams: dict[int, _ServerStream] = {}
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
        self._streams[sid] = _ServerStream(state, unary)
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

    def _close_local(self, stream_id: int, stream: _ServerStream) -> None:
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

    def _require(self, stream_id: int) -> _ServerStream:
        stream = self._streams.get(stream_id)
        if stream is None or stream.state is StreamState.LOCAL_CLOSED:
            raise LocalProtocolError(f"stream {stream_id} is not open for sending")
        return stream


# -- the client side ----------------------------------------------------------------------


class CallKind(enum.Enum):
    """The four kinds of call, by who streams messages."""

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


@dataclass(slots=True)
class _ClientStream:
    kind: CallKind
    #: We sent our last message (or the kind sends none after the Request).
    local_closed: bool


class ClientCodec(FramedCodec[ClientEvent]):
    """One connection's calls, from the client's side (see the module docstring).
    After :class:`ConnectionClosed`, :meth:`fail_all` says which calls failed."""

    def __init__(self, max_data: int = MAX_DATA) -> None:
        super().__init__(max_data)
        self._streams: dict[int, _ClientStream] = {}
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
        self._streams[sid] = _ClientStream(kind, local_closed=not kind.client_streams)
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

    def _open_for_sending(self, stream_id: int) -> _ClientStream:
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


# -- the proxy pair -----------------------------------------------------------------------


#: The upstream codec for a new stream of a service, None when the driver must decide
#: (a local service, no connection ready, too many calls).
Router = Callable[[str], "ProxyClientCodec | None"]

_REMOTE_OPEN = Flags.REMOTE_OPEN
_REMOTE_CLOSED = Flags.REMOTE_CLOSED
_NO_DATA = Flags.NO_DATA
_CLOSE = Flags.REMOTE_CLOSED | Flags.NO_DATA
_pack = HEADER.pack

# -- a relayed stream's states ---------------------------------------------------------------
#: The client may send messages and its close; the upstream's side is open.
OPEN: Final = 0
#: The client sent its close; the upstream's side is open (its handler runs on).
HALF_CLOSED: Final = 1
#: The client may send nothing: a unary or server-streaming Request, or a message
#: after its close, which Go answers once and then forgets the stream for.
SHUT: Final = 2
#: Opened ``remote open`` for a method not among the upstream's ``client_streaming``:
#: as :data:`SHUT`, and the first frame refused names the method (for the log).
UNDECLARED: Final = 3
#: Answered here (an oversize frame) or its client went away: the call runs on
#: upstream and what it sends is dropped.
ORPHANED: Final = 4
#: Over: the upstream sent its Response or Data ``remote closed``, or failed. The
#: stream is forgotten on both sides (a client's Data for it: no longer active).
OVER: Final = 5

# -- what the client sends on a relayed stream: a Data frame, by its flags --------------------
#: Index ``(flags & remote closed) | (flags & no data) >> 1``.
MESSAGE, MESSAGE_CLOSE, EMPTY, CLOSE = 0, 1, 2, 3

# -- what is done with it ------------------------------------------------------------------
#: Relay the frame's message and/or close upstream (as two frames if both).
FORWARD: Final = 0
#: Drop it: Go says nothing either.
IGNORE: Final = 1
#: Answer INVALID_ARGUMENT ``StreamID is no longer active``.
INACTIVE: Final = 2
#: Answer INVALID_ARGUMENT ``data handling error: ttrpc: stream closed``.
CLOSED: Final = 3
#: Answer as :data:`INACTIVE`, naming the method for the driver's log.
UNDECLARED_ANSWER: Final = 4

#: (next state, action) for each state (row) and client Data frame (column: message,
#: message + close, no data, close).
CLIENT_STEP: Final[tuple[tuple[tuple[int, int], ...], ...]] = (
    # OPEN: messages and the close go up.
    ((OPEN, FORWARD), (HALF_CLOSED, FORWARD), (OPEN, IGNORE), (HALF_CLOSED, FORWARD)),
    # HALF_CLOSED: Go answers a message "stream closed" and forgets the stream; a
    # repeated close, or a frame without data, it ignores.
    ((SHUT, CLOSED), (SHUT, CLOSED), (HALF_CLOSED, IGNORE), (HALF_CLOSED, IGNORE)),
    # SHUT: nothing goes up (Go 1.2.4 crashes on Data for a unary method).
    ((SHUT, INACTIVE),) * 4,
    # UNDECLARED: as SHUT, once saying why.
    ((SHUT, UNDECLARED_ANSWER),) * 4,
    # ORPHANED, OVER: no longer the client's (never looked up: the client's side has
    # no record of them).
    ((ORPHANED, INACTIVE),) * 4,
    ((OVER, INACTIVE),) * 4,
)

# -- what the upstream sends on a stream ----------------------------------------------------
#: Data, Data ``remote closed``, Response, a failure (oversize frame, lost connection).
U_DATA, U_CLOSE, U_RESPONSE, U_FAIL = 0, 1, 2, 3
#: Relay the frame to the client; drop it; answer the failure's status.
RELAY, DROP, FAIL = 0, 1, 2

_LIVE = ((None, RELAY), (OVER, RELAY), (OVER, RELAY), (OVER, FAIL))
#: (next state, action) for each state (row) and upstream event (column); None: the
#: state stays. A Response or Data ``remote closed`` ends the stream, whatever the
#: client's side (Go forgets it then).
UPSTREAM_STEP: Final[tuple[tuple[tuple[int | None, int], ...], ...]] = (
    _LIVE,  # OPEN
    _LIVE,  # HALF_CLOSED
    _LIVE,  # SHUT
    _LIVE,  # UNDECLARED
    ((None, DROP), (OVER, DROP), (OVER, DROP), (OVER, DROP)),  # ORPHANED
    ((None, DROP),) * 4,  # OVER (never looked up: the route is gone)
)

_STREAM_INACTIVE = statuses.stream_inactive()
_STREAM_CLOSED = statuses.stream_closed()


class Relayed(NamedTuple):
    """Frames the upstream sent for one client: what :meth:`ProxyClientCodec.take_relayed`
    hands the driver, for the connection whose codec is ``client``."""

    client: ProxyServerCodec
    data: bytes


class _Route:
    """A relayed stream: the client's codec and id, the upstream's, and its state."""

    __slots__ = ("method", "owner", "state", "stream_id", "upstream", "upstream_id")

    def __init__(
        self,
        owner: ProxyServerCodec,
        stream_id: int,
        upstream: ProxyClientCodec,
        upstream_id: int,
        state: int,
        method: str,
    ) -> None:
        self.owner = owner
        self.stream_id = stream_id
        self.upstream = upstream
        self.upstream_id = upstream_id
        self.state = state
        #: ``service/method`` of an :data:`UNDECLARED` stream, else "".
        self.method = method


class ProxyServerCodec(ServerCodec):
    """A client's connection to the proxy: relayed streams pass through (see the module
    docstring), the rest is :class:`ServerCodec`'s.

    ``router`` names the upstream codec for a new stream's service (None: the
    stream comes out as a :class:`~.events.Call`); ``has_room`` says whether an
    upstream codec takes more output now.
    """

    def __init__(
        self,
        router: Router,
        max_data: int = MAX_DATA,
        has_room: Callable[[ProxyClientCodec], bool] = lambda upstream: True,
    ) -> None:
        super().__init__(max_data)
        self.router = router
        #: Whether an upstream connection takes more now; when not, a relayed stream's
        #: Data comes out as events for the driver to relay once it does (:meth:`relay_data`).
        self.has_room = has_room
        #: Relayed streams not over nor orphaned, by our stream id (the server codec's
        #: own stream records hold only the streams served here).
        self._relayed: dict[int, _Route] = {}
        #: Upstream connections given frames since :meth:`take_touched`.
        self._touched: dict[ProxyClientCodec, None] = {}

    @property
    def relayed_streams(self) -> int:
        """Streams relayed upstream and not over."""
        return len(self._relayed)

    def take_touched(self) -> list[ProxyClientCodec]:
        """The upstream connections given frames since the last call (their output waits)."""
        if not self._touched:
            return []
        touched = list(self._touched)
        self._touched.clear()
        return touched

    def relay(self, call: Call, request: bytes, upstream: ProxyClientCodec) -> None:
        """Relay the stream that came out as ``call`` on ``upstream``, with ``request``
        (the Request as received, or with its deadline shrunk)."""
        sid = call.stream_id
        if self.stream_state(sid) is None:
            raise LocalProtocolError(f"stream {sid} is not open")
        self._relay_on(upstream, sid, call.flags, request, call.request)
        del self._streams[sid]  # its state is the route's from now on

    def _relay_on(
        self,
        upstream: ProxyClientCodec,
        stream_id: int,
        flags: int,
        data: bytes,
        request: ttrpc_pb2.Request,
    ) -> None:
        self._relayed[stream_id] = upstream.open(self, stream_id, flags, data, request)
        self._touched[upstream] = None

    def orphan_all(self) -> None:
        """The client went away: its relayed streams run on upstream, their replies dropped."""
        for route in self._relayed.values():
            route.state = ORPHANED
        self._relayed.clear()

    def upstream_of(self, stream_id: int) -> ProxyClientCodec | None:
        """The upstream connection a relayed stream is on (None: not relayed, or over)."""
        route = self._relayed.get(stream_id)
        return None if route is None else route.upstream

    def relay_data(self, stream_id: int, message: bytes | None, closing: bool) -> None:
        """Relay a client's ``message`` (None: none) on a relayed stream, then its close:
        what came out as events because its upstream connection had no room.

        Nothing goes once the stream is over (the upstream ended it meanwhile).
        """
        route = self._relayed.get(stream_id)
        if route is not None:
            self._forward(route, message, closing)

    def _forward(self, route: _Route, message: bytes | None, closing: bool) -> None:
        upstream, sid = route.upstream, route.upstream_id
        # A message and the close go as two frames: Go answers Data that carries both
        # INVALID_ARGUMENT, and then forgets the stream while its handler runs on.
        if message is not None:
            upstream.queue_data(sid, 0, message)
        if closing:
            upstream.queue_data(sid, _CLOSE, b"")
        self._touched[upstream] = None

    def failure(self, stream_id: int, status: Status) -> bytes:
        """The Response answering ``status`` on a relayed stream that cannot go on."""
        response = ttrpc_pb2.Response(status=status.to_pb())
        return encode_frame(stream_id, _RESPONSE, 0, response.SerializeToString())

    # -- input: relayed streams pass through ----------------------------------------------
    def _opened(self, sid: int, request: ttrpc_pb2.Request, frame: Frame) -> ServerEvent | None:
        upstream = self.router(request.service)
        if upstream is None:
            return super()._opened(sid, request, frame)
        self._relay_on(upstream, sid, frame.flags, frame.data, request)
        return None

    def _data(self, frame: Frame) -> ServerEvent | None:
        sid = frame.stream_id
        route = self._relayed.get(sid)
        if route is None:
            return super()._data(frame)  # served here, or unknown
        flags = frame.flags
        route.state, action = CLIENT_STEP[route.state][
            (flags & _REMOTE_CLOSED) | (flags & _NO_DATA) >> 1
        ]
        if action == FORWARD:
            message = None if flags & _NO_DATA else frame.data
            closing = bool(flags & _REMOTE_CLOSED)
            if self.has_room(route.upstream):
                self._forward(route, message, closing)
                return None
            # Its upstream connection is full: Message / HalfClosed for the driver.
            return self._received(sid, message, closing)
        if action == IGNORE:
            return None
        if action == CLOSED:
            return BadInput(sid, _STREAM_CLOSED)
        if action == UNDECLARED_ANSWER:
            return BadInput(sid, _STREAM_INACTIVE, note=route.method)
        return BadInput(sid, _STREAM_INACTIVE)

    def _end(self, sid: int) -> bool:
        route = self._relayed.pop(sid, None)
        if route is None:
            return super()._end(sid)
        route.state = ORPHANED  # answered here: what the upstream sends is dropped
        return True


class ProxyClientCodec(FramedCodec[None]):
    """The streams of many clients on one upstream connection (see the module docstring).

    It makes no events: what it receives goes to the clients' codecs
    (:meth:`take_relayed`). ``client_streaming``: the methods
    (``service/method``) the upstream takes the client's messages on, its
    client-streaming and bidi ones.
    """

    def __init__(
        self,
        max_data: int = MAX_DATA,
        client_streaming: Collection[str] = frozenset(),
    ) -> None:
        super().__init__(max_data)
        self.client_streaming = client_streaming
        self._routes: dict[int, _Route] = {}
        self._next_id = 1
        self._out = bytearray()
        #: Bytes for each client connection since :meth:`take_relayed`.
        self._relayed: dict[ProxyServerCodec, bytearray] = {}

    @property
    def active_streams(self) -> int:
        """Streams the upstream has not ended (orphaned ones too: they run on there)."""
        return len(self._routes)

    @property
    def exhausted(self) -> bool:
        """Every stream id is used: open another connection for new streams."""
        return self._next_id > MAX_CLIENT_ID

    # -- output ------------------------------------------------------------------------
    def open(
        self,
        owner: ProxyServerCodec,
        stream_id: int,
        flags: int,
        data: bytes,
        request: ttrpc_pb2.Request,
    ) -> _Route:
        """Queue a client's Request (``data``, ``request`` decoded) as a stream of this
        connection; the stream's route."""
        sid = self._next_id
        if sid > MAX_CLIENT_ID:
            raise LocalProtocolError("this connection has used every stream id; open another")
        if len(data) > MAX_DATA:
            raise LocalProtocolError(f"a Request of {len(data)} bytes is over {MAX_DATA}")
        self._next_id = sid + 2
        state, method = SHUT, ""
        if flags & _REMOTE_OPEN:
            path = f"{request.service}/{request.method}"
            if path in self.client_streaming:
                state = OPEN
            else:
                state, method = UNDECLARED, path
        route = _Route(owner, stream_id, self, sid, state, method)
        self._routes[sid] = route
        out = self._out
        out += _pack(len(data), sid, _REQUEST, flags)
        out += data
        return route

    def queue_data(self, sid: int, flags: int, data: bytes) -> None:
        """Queue a Data frame for our stream ``sid`` (the client's side decided it goes)."""
        out = self._out
        out += _pack(len(data), sid, _DATA, flags)
        out += data

    def data_to_send(self) -> bytes:
        """The frames queued for the server since the last call."""
        data = bytes(self._out)
        self._out.clear()
        return data

    def take_relayed(self) -> list[Relayed]:
        """What each client codec's peer gets since the last call: its frames, in order."""
        if not self._relayed:
            return []
        relayed = [Relayed(owner, bytes(data)) for owner, data in self._relayed.items()]
        self._relayed.clear()
        return relayed

    def fail_all(self, status: Status) -> int:
        """The connection is gone: answer ``status`` on every live stream (to collect with
        :meth:`take_relayed`); how many there were."""
        failed = 0
        for route in list(self._routes.values()):
            if self._step(route, U_FAIL) == FAIL:
                failed += 1
                self._deliver(route.owner, route.owner.failure(route.stream_id, status))
        return failed

    def _step(self, route: _Route, event: int) -> int:
        """Move ``route`` by what the upstream sent (:data:`UPSTREAM_STEP`); the action."""
        state, action = UPSTREAM_STEP[route.state][event]
        if state is not None:  # OVER, the only state the upstream moves a stream to
            route.state = state
            del self._routes[route.upstream_id]
            if action != DROP:  # the client's side forgets it too
                del route.owner._relayed[route.stream_id]
        return action

    def _deliver(self, owner: ProxyServerCodec, frame: bytes) -> None:
        relayed = self._relayed.get(owner)
        if relayed is None:
            self._relayed[owner] = bytearray(frame)
        else:
            relayed += frame

    # -- input -------------------------------------------------------------------------
    def _frame(self, frame: Frame | Oversize) -> None:
        route = self._routes.get(frame.stream_id)
        if route is None:
            return  # a stream that is over: dropped, as Go's client does
        if isinstance(frame, Oversize):
            if self._step(route, U_FAIL) == FAIL:
                status = statuses.oversize(frame.length)
                self._deliver(route.owner, route.owner.failure(route.stream_id, status))
            return
        type_ = frame.type
        if type_ == _DATA:
            event = frame.flags & _REMOTE_CLOSED  # U_DATA or U_CLOSE
        elif type_ == _RESPONSE:
            event = U_RESPONSE
        else:
            return  # unknown types are ignored, as Go's client does
        if self._step(route, event) == RELAY:
            data = frame.data
            self._deliver(route.owner, _pack(len(data), route.stream_id, type_, frame.flags) + data)
