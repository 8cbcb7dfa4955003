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

A stream is over once the server sent its Response, or its Data ``remote
closed`` after the client closed its side too. What the server sends for a
stream that is over, or whose client went away (:meth:`~ProxyClientConnection.orphan`),
is dropped. An oversize frame from the server fails only its stream
(RESOURCE_EXHAUSTED to the client), as does a lost connection
(:meth:`~ProxyClientConnection.fail_all`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.errors import LocalProtocolError

from . import status as statuses
from . import ttrpc_pb2
from .connection import FramedConnection
from .events import ServerEvent
from .frames import HEADER, MAX_DATA, Flags, Frame, MessageType, Oversize
from .server_codec import ServerConnection, StreamState
from .status import Status

__all__ = ["ProxyClientConnection", "ProxyServerConnection", "Router"]

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
_CLOSE = Flags.REMOTE_CLOSED | Flags.NO_DATA
_pack = HEADER.pack
_LOCAL_CLOSED = StreamState.LOCAL_CLOSED


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
        #: Relayed streams still open: our stream id -> (upstream connection, its id).
        self._relayed: dict[int, tuple[ProxyClientConnection, int]] = {}
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

    def relay(
        self, stream_id: int, flags: int, request: bytes, upstream: ProxyClientConnection
    ) -> None:
        """Relay the stream that came out as a :class:`~.events.Call` on ``upstream``,
        with ``request`` (the Request as received, or with its deadline shrunk)."""
        if self.stream_state(stream_id) is None:
            raise LocalProtocolError(f"stream {stream_id} is not open")
        self._relay_on(upstream, stream_id, flags, request)

    def _relay_on(
        self, upstream: ProxyClientConnection, stream_id: int, flags: int, request: bytes
    ) -> None:
        self._relayed[stream_id] = (upstream, upstream.open(self, stream_id, flags, request))
        self._touched[upstream] = None

    def orphan_all(self) -> None:
        """The client went away: its relayed streams run on upstream, their replies dropped."""
        for upstream, sid in self._relayed.values():
            upstream.orphan(sid)
        self._relayed.clear()

    # -- what the upstream connection calls ---------------------------------------------
    def relayed(
        self, stream_id: int, type: int, flags: int, data: bytes, ends: bool
    ) -> bytes | None:
        """The bytes of a frame the server sent for our stream ``stream_id`` (``ends``:
        the stream is over upstream); None if the stream is over here already."""
        if ends:
            self._relayed.pop(stream_id, None)
        # A Response finishes the stream and Data with ``remote closed`` closes our
        # side, as if we had sent them; nothing more goes out once it is over (an
        # oversize frame was answered meanwhile): never a second Response.
        streams = self._streams
        stream = streams.get(stream_id)
        if stream is None or stream.state is _LOCAL_CLOSED:
            return None
        if type == _RESPONSE:
            del streams[stream_id]
        elif type == _DATA and flags & _REMOTE_CLOSED:
            self._close_local(stream_id, stream)
        return _pack(len(data), stream_id, type, flags) + data

    def relay_failed(self, stream_id: int, status: Status) -> bytes | None:
        """The stream cannot go on upstream: the Response answering ``status``, None if
        the stream is over here already."""
        self._relayed.pop(stream_id, None)
        if self.stream_state(stream_id) is None:
            return None
        return self.respond(stream_id, status=status)

    # -- input: relayed streams pass through ----------------------------------------------
    def _opened(self, sid: int, request: ttrpc_pb2.Request, frame: Frame) -> ServerEvent | None:
        upstream = self.router(request.service)
        if upstream is None:
            return super()._opened(sid, request, frame)
        self._relay_on(upstream, sid, frame.flags, frame.data)
        return None

    def _received(self, sid: int, message: bytes | None, closing: bool) -> ServerEvent | None:
        relayed = self._relayed.get(sid)
        if relayed is None or not self.has_room(relayed[0]):
            # Not relayed, or its upstream is full: Message / HalfClosed events.
            return super()._received(sid, message, closing)
        self.relay_data(sid, message, closing)
        return None

    def upstream_of(self, stream_id: int) -> ProxyClientConnection | None:
        """The upstream connection a relayed stream is on (None: not relayed, or over)."""
        relayed = self._relayed.get(stream_id)
        return None if relayed is None else relayed[0]

    def relay_data(self, stream_id: int, message: bytes | None, closing: bool) -> None:
        """Relay a client's ``message`` (None: none) on a relayed stream, then its close.

        Nothing goes once the stream is over here (answered meanwhile).
        """
        relayed = self._relayed.get(stream_id)
        if relayed is None:
            return
        upstream, upstream_sid = relayed
        # A message and the close go as two frames: Go servers mishandle Data that
        # carries both (research §3).
        if message is not None:
            upstream.send_data(upstream_sid, 0, message)
        if closing:
            upstream.send_data(upstream_sid, _CLOSE, b"")
            if stream_id not in self._streams:  # our side had closed: the stream is over
                del self._relayed[stream_id]
        self._touched[upstream] = None

    def _end(self, sid: int) -> bool:
        relayed = self._relayed.pop(sid, None)
        if relayed is not None:
            relayed[0].orphan(relayed[1])  # answered here: what the server sends is dropped
        return super()._end(sid)


class _Route:
    __slots__ = ("client_open", "owner", "server_open", "stream_id")

    def __init__(self, owner: ProxyServerConnection, stream_id: int, client_open: bool) -> None:
        self.owner: ProxyServerConnection | None = owner
        self.stream_id = stream_id
        #: The client may still send Data (a client- or bidi-streaming call).
        self.client_open = client_open
        #: The server has not closed its side.
        self.server_open = True


class ProxyClientConnection(FramedConnection[None]):
    """The streams of many clients on one upstream connection (see the module docstring).

    It makes no events: what it receives goes to the clients' connections
    (:meth:`take_relayed`). ``context`` is the driver's.
    """

    def __init__(self, context: Any = None, max_data: int = MAX_DATA) -> None:
        super().__init__(max_data)
        self.context = context
        self._routes: dict[int, _Route] = {}
        self._next_id = 1
        self._out = bytearray()
        #: Bytes for each client connection since :meth:`take_relayed`.
        self._relayed: dict[ProxyServerConnection, bytearray] = {}

    @property
    def active_streams(self) -> int:
        return len(self._routes)

    @property
    def exhausted(self) -> bool:
        """Every stream id is used: open another connection for new streams."""
        return self._next_id > MAX_CLIENT_ID

    # -- output ------------------------------------------------------------------------
    def open(self, owner: ProxyServerConnection, stream_id: int, flags: int, request: bytes) -> int:
        """Queue a client's Request as a stream of this connection; its id here."""
        sid = self._next_id
        if sid > MAX_CLIENT_ID:
            raise LocalProtocolError("this connection has used every stream id; open another")
        if len(request) > MAX_DATA:
            raise LocalProtocolError(f"a Request of {len(request)} bytes is over {MAX_DATA}")
        self._next_id = sid + 2
        self._routes[sid] = _Route(owner, stream_id, bool(flags & _REMOTE_OPEN))
        out = self._out
        out += _pack(len(request), sid, _REQUEST, flags)
        out += request
        return sid

    def send_data(self, sid: int, flags: int, data: bytes) -> None:
        """Queue a client's Data frame for our stream ``sid`` (none once the client's
        side is closed: the frame is not the server's to see)."""
        route = self._routes.get(sid)
        if route is None or not route.client_open:
            return
        if flags & Flags.REMOTE_CLOSED:
            route.client_open = False
            if not route.server_open:
                del self._routes[sid]
        out = self._out
        out += HEADER.pack(len(data), sid, _DATA, flags)
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

    def orphan(self, sid: int) -> None:
        """The stream's client went away: the call runs on (ttrpc cannot cancel it) and
        what the server still sends for it is dropped."""
        route = self._routes.get(sid)
        if route is not None:
            route.owner = None

    def fail_all(self, status: Status) -> int:
        """The connection is gone: answer ``status`` on every live stream (to collect with
        :meth:`take_relayed`); how many there were."""
        failed = 0
        for route in self._routes.values():
            if route.owner is not None:
                failed += 1
                self._deliver(route.owner, route.owner.relay_failed(route.stream_id, status))
        self._routes.clear()
        return failed

    def _deliver(self, owner: ProxyServerConnection, frame: bytes | None) -> None:
        if frame is not None:
            relayed = self._relayed.get(owner)
            if relayed is None:
                self._relayed[owner] = bytearray(frame)
            else:
                relayed += frame

    # -- input -------------------------------------------------------------------------
    def _frame(self, frame: Frame | Oversize) -> None:
        sid = frame.stream_id
        route = self._routes.get(sid)
        if route is None:
            return  # a stream that is over: dropped, as Go's client does
        owner = route.owner
        if isinstance(frame, Oversize):
            del self._routes[sid]
            if owner is not None:
                status = statuses.oversize(frame.length)
                self._deliver(owner, owner.relay_failed(route.stream_id, status))
            return
        type_, flags = frame.type, frame.flags
        if type_ == _RESPONSE:
            ends = True
        elif type_ == _DATA:
            if flags & _REMOTE_CLOSED:
                route.server_open = False
            ends = not route.server_open and not route.client_open
        else:
            return  # unknown types are ignored, as Go's client does
        if ends:
            del self._routes[sid]
        if owner is not None:
            self._deliver(owner, owner.relayed(route.stream_id, type_, flags, frame.data, ends))
