"""The proxy's two sides, sans I/O: client connections whose streams ride shared upstream ones.

A :class:`ProxyServerConnection` is the server side of one client's
connection; a :class:`ProxyClientConnection` is one connection to an
upstream server, carrying the streams of many clients. Between them, frames
are relayed without events: the driver's *router* names the upstream
connection for a new stream's service, the Request goes into that
connection's output under an id of its own (odd, from 1, rising by 2, in the
order they reach the wire), the client's Data follows it there, and what the
server sends comes back into the client connection's output under the
client's id, the frame's type, flags and bytes untouched. The driver moves
the bytes: :meth:`ProxyServerConnection.take_touched` names the upstream
connections with output (:meth:`ProxyClientConnection.data_to_send`), and
:meth:`ProxyClientConnection.take_relayed` hands over what each client gets.

Everything else is the server codec's: a stream whose service is served
locally, or whose upstream connection is not ready (the router says None),
comes out as a :class:`~.events.Call` as usual, and the driver relays it
later with :meth:`ProxyServerConnection.relay`; Data of a relayed stream
whose upstream connection has no room (``has_room``) comes out as
:class:`~.events.Message` / :class:`~.events.HalfClosed`, for the driver to
relay with :meth:`ProxyServerConnection.relay_data` once it has; bad input
comes out as :class:`~.events.BadInput` for the driver to answer.

**What reaches the upstream.** Each relayed stream has one state (a small
int, :data:`OPEN` ... :data:`ORPHANED`), moved by what the client sends
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

from collections.abc import Callable, Collection
from typing import Any, Final

from gateway.sdk import LocalProtocolError

from . import status as statuses
from . import ttrpc_pb2
from .connection import FramedConnection
from .events import BadInput, Call, ServerEvent
from .frames import HEADER, MAX_DATA, Flags, Frame, MessageType, Oversize, encode_frame
from .server_codec import ServerConnection
from .status import Status

__all__ = [
    "CLIENT_STEP",
    "UPSTREAM_STEP",
    "ProxyClientConnection",
    "ProxyServerConnection",
    "Router",
]

#: The last odd id a connection may use; then it takes no new streams.
MAX_CLIENT_ID = 2**31 - 1

#: The upstream connection for a new stream of a service, None when the driver
#: must decide (a local service, no connection ready, too many calls).
Router = Callable[[str], "ProxyClientConnection | None"]

_REQUEST = MessageType.REQUEST.value
_DATA = MessageType.DATA.value
_RESPONSE = MessageType.RESPONSE.value
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


class _Route:
    """A relayed stream: the client's id and connection, the upstream's, and its state."""

    __slots__ = ("method", "owner", "state", "stream_id", "upstream", "upstream_id")

    def __init__(
        self,
        owner: ProxyServerConnection,
        stream_id: int,
        upstream: ProxyClientConnection,
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


class ProxyServerConnection(ServerConnection):
    """A client's connection to the proxy: relayed streams pass through (see the module
    docstring), the rest is :class:`ServerConnection`'s.

    ``context`` is the driver's, for the driver (the session this connection
    belongs to).
    """

    def __init__(
        self,
        router: Router,
        context: Any = None,
        max_data: int = MAX_DATA,
        has_room: Callable[[ProxyClientConnection], bool] = lambda upstream: True,
    ) -> None:
        super().__init__(max_data)
        self.router = router
        #: Whether an upstream connection takes more now; when not, a relayed stream's
        #: Data comes out as events for the driver to relay once it does (:meth:`relay_data`).
        self.has_room = has_room
        self.context = context
        #: Relayed streams not over nor orphaned, by our stream id (the server codec's
        #: own stream records hold only the streams served here).
        self._relayed: dict[int, _Route] = {}
        #: Upstream connections given frames since :meth:`take_touched`.
        self._touched: dict[ProxyClientConnection, None] = {}

    @property
    def relayed_streams(self) -> int:
        """Streams relayed upstream and not over."""
        return len(self._relayed)

    def take_touched(self) -> list[ProxyClientConnection]:
        """The upstream connections given frames since the last call (their output waits)."""
        if not self._touched:
            return []
        touched = list(self._touched)
        self._touched.clear()
        return touched

    def relay(self, call: Call, request: bytes, upstream: ProxyClientConnection) -> None:
        """Relay the stream that came out as ``call`` on ``upstream``, with ``request``
        (the Request as received, or with its deadline shrunk)."""
        sid = call.stream_id
        if self.stream_state(sid) is None:
            raise LocalProtocolError(f"stream {sid} is not open")
        self._relay_on(upstream, sid, call.flags, request, call.request)
        del self._streams[sid]  # its state is the route's from now on

    def _relay_on(
        self,
        upstream: ProxyClientConnection,
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

    def upstream_of(self, stream_id: int) -> ProxyClientConnection | None:
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


class ProxyClientConnection(FramedConnection[None]):
    """The streams of many clients on one upstream connection (see the module docstring).

    It makes no events: what it receives goes to the clients' connections
    (:meth:`take_relayed`). ``client_streaming``: the methods
    (``service/method``) the upstream takes the client's messages on, its
    client-streaming and bidi ones. ``context`` is the driver's.
    """

    def __init__(
        self,
        context: Any = None,
        max_data: int = MAX_DATA,
        client_streaming: Collection[str] = frozenset(),
    ) -> None:
        super().__init__(max_data)
        self.context = context
        self.client_streaming = client_streaming
        self._routes: dict[int, _Route] = {}
        self._next_id = 1
        self._out = bytearray()
        #: Bytes for each client connection since :meth:`take_relayed`.
        self._relayed: dict[ProxyServerConnection, bytearray] = {}

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
        owner: ProxyServerConnection,
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

    def take_relayed(self) -> list[tuple[ProxyServerConnection, bytes]]:
        """What each client connection gets since the last call: its frames, in order."""
        if not self._relayed:
            return []
        relayed = [(owner, bytes(data)) for owner, data in self._relayed.items()]
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

    def _deliver(self, owner: ProxyServerConnection, frame: bytes) -> None:
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
