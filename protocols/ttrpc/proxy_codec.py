"""A proxy's connection to an upstream ttrpc server, sans I/O: many clients' streams on one.

Each stream a client opens through the proxy gets an id of this connection's
own (odd, from 1, rising by 2, in the order they reach the wire), mapped to
its *owner* (whatever the driver uses for the client's connection) and the
client's stream id. What the server sends comes back as :class:`Relay`
events naming the owner and the client's id, the frame's type, flags and
bytes untouched. A stream is over once the server sent its Response, or its
Data ``remote closed`` after the client closed its side too; frames for
streams that are over, or whose owner went away (:meth:`orphan`), are
dropped. An oversize frame fails only its stream (:class:`Failed`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from gateway.errors import LocalProtocolError

from . import status as statuses
from .connection import FramedConnection
from .frames import HEADER, MAX_DATA, Flags, Frame, MessageType, Oversize
from .status import Status

__all__ = ["Failed", "ProxyClientConnection", "Relay", "UpstreamEvent"]

#: The last odd id a connection may use; then it takes no new streams.
MAX_CLIENT_ID = 2**31 - 1


class Relay(NamedTuple):
    """A frame for the client's stream ``stream_id`` on ``owner``'s connection.

    ``ends``: the stream is over on this connection (the owner's codec decides
    the same from the frame).
    """

    owner: Any
    stream_id: int
    type: int
    flags: int
    data: bytes
    ends: bool


@dataclass(frozen=True, slots=True)
class Failed:
    """The stream cannot go on (the server sent an oversize frame): answer ``status``."""

    owner: Any
    stream_id: int
    status: Status


UpstreamEvent = Relay | Failed


class _Route:
    __slots__ = ("client_open", "owner", "server_open", "stream_id")

    def __init__(self, owner: Any, stream_id: int, client_open: bool) -> None:
        self.owner = owner
        self.stream_id = stream_id
        #: The client may still send Data (a client- or bidi-streaming call).
        self.client_open = client_open
        #: The server has not closed its side.
        self.server_open = True


class ProxyClientConnection(FramedConnection[UpstreamEvent]):
    """The streams of many clients on one upstream connection (see the module docstring)."""

    def __init__(self, max_data: int = MAX_DATA) -> None:
        super().__init__(max_data)
        self._routes: dict[int, _Route] = {}
        self._next_id = 1

    @property
    def active_streams(self) -> int:
        return len(self._routes)

    @property
    def exhausted(self) -> bool:
        """Every stream id is used: open another connection for new streams."""
        return self._next_id > MAX_CLIENT_ID

    # -- output ------------------------------------------------------------------------
    def open(self, owner: Any, stream_id: int, flags: int, request: bytes) -> tuple[int, bytes]:
        """A client's Request, as its stream on this connection: the id and the frame."""
        if self._next_id > MAX_CLIENT_ID:
            raise LocalProtocolError("this connection has used every stream id; open another")
        sid = self._next_id
        self._next_id += 2
        if len(request) > MAX_DATA:
            raise LocalProtocolError(f"a Request of {len(request)} bytes is over {MAX_DATA}")
        self._routes[sid] = _Route(owner, stream_id, bool(flags & Flags.REMOTE_OPEN))
        return sid, HEADER.pack(len(request), sid, MessageType.REQUEST, flags) + request

    def data(self, sid: int, flags: int, data: bytes) -> bytes:
        """A client's Data frame for our stream ``sid`` (``b""``: the stream takes none)."""
        route = self._routes.get(sid)
        if route is None or not route.client_open:
            return b""
        if flags & Flags.REMOTE_CLOSED:
            route.client_open = False
            if not route.server_open:
                del self._routes[sid]
        return HEADER.pack(len(data), sid, MessageType.DATA, flags) + data

    def orphan(self, sid: int) -> None:
        """The stream's client went away: the call runs on (ttrpc cannot cancel it) and
        what the server still sends for it is dropped."""
        route = self._routes.get(sid)
        if route is not None:
            route.owner = None

    def fail_all(self) -> list[tuple[Any, int]]:
        """The connection is gone: the (owner, client stream id) of every live stream."""
        lost = [(r.owner, r.stream_id) for r in self._routes.values() if r.owner is not None]
        self._routes.clear()
        return lost

    # -- input -------------------------------------------------------------------------
    def _frame(self, frame: Frame | Oversize) -> UpstreamEvent | None:
        sid = frame.stream_id
        route = self._routes.get(sid)
        if route is None:
            return None  # a stream that is over: dropped, as Go's client does
        if isinstance(frame, Oversize):
            del self._routes[sid]
            if route.owner is None:
                return None
            return Failed(route.owner, route.stream_id, statuses.oversize(frame.length))
        type, flags = frame.type, frame.flags
        if type == MessageType.RESPONSE:
            ends = True
        elif type == MessageType.DATA:
            if flags & Flags.REMOTE_CLOSED:
                route.server_open = False
            ends = not route.server_open and not route.client_open
        else:
            return None  # unknown types are ignored, as Go's client does
        if ends:
            del self._routes[sid]
        if route.owner is None:
            return None
        return Relay(route.owner, route.stream_id, type, flags, frame.data, ends)
