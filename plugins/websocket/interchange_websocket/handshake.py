"""The opening handshake, both roles, with ``wsproto``'s HTTP upgrade.

Server: read the upgrade request (h11 bounds its head to 16 KiB), judge it
against the listener's address (path, origin, subprotocol) and answer 101, or
an HTTP error with a one-line text body: 400 for a bad request, 403 for an
origin not allowed, 404 for another path, 426 for a request that is not a
WebSocket upgrade. Client: send the request with ``Host``, the path, the
subprotocols to offer and ``Origin``; anything but a 101 is a failed handshake.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import NoReturn

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Event, RejectConnection, Request
from wsproto.utilities import RemoteProtocolError as WsRemoteProtocolError

from gateway.sdk import RemoteProtocolError
from interchange_websocket.address import WsAddress
from interchange_websocket.stream import RECEIVE_CHUNK, WebSocketStream

__all__ = ["Refusal", "client_handshake", "judge", "server_handshake"]


@dataclass(frozen=True, slots=True)
class Refusal:
    """An HTTP answer instead of the upgrade, and why (its body)."""

    status: int
    reason: str
    headers: tuple[tuple[str, str], ...] = ()

    def response(self) -> bytes:
        """The whole HTTP/1.1 response; the connection closes after it."""
        body = (self.reason + "\n").encode()
        lines = [
            f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}",
            "Content-Type: text/plain; charset=utf-8",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in self.headers),
        ]
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


_UPGRADE = (("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13"))


def judge(request: Request, address: WsAddress) -> Refusal | str | None:
    """Refuse ``request``, or the subprotocol to accept it with (None: none)."""
    path = request.target.split("?", 1)[0]
    if path != address.path:
        return Refusal(404, f"no websocket at {path}; try {address.path}")
    origin = _header(request, b"origin")
    if address.origins and origin is not None and origin.lower() not in address.origins:
        return Refusal(403, f"origin {origin} is not allowed")
    if not address.subprotocols:
        return None
    for name in address.subprotocols:
        if name in request.subprotocols:
            return name
    return Refusal(400, "offer one of the subprotocols " + ", ".join(address.subprotocols))


def _header(request: Request, name: bytes) -> str | None:
    for key, value in request.extra_headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _refusal_for(error: WsRemoteProtocolError) -> Refusal:
    """The answer to a request wsproto could not take as an upgrade."""
    text = str(error)
    if "Upgrade" in text:
        return Refusal(426, f"this is a websocket endpoint: {text}", _UPGRADE)
    hint = error.event_hint
    status = hint.status_code if isinstance(hint, RejectConnection) else 400
    return Refusal(status, text, _UPGRADE if status == 426 else ())


async def server_handshake(stream: trio.abc.Stream, address: WsAddress) -> WebSocketStream:
    """Accept an upgrade request on ``stream`` for the listener at ``address``."""
    ws = WSConnection(ConnectionType.SERVER)
    try:
        request = await _first(stream, ws, Request)
    except WsRemoteProtocolError as e:
        await _refuse(stream, _refusal_for(e))
    assert isinstance(request, Request)
    decision = judge(request, address)
    if isinstance(decision, Refusal):
        await _refuse(stream, decision)
    await stream.send_all(ws.send(AcceptConnection(subprotocol=decision)))
    return WebSocketStream(stream, ws, max_message=address.max_message, subprotocol=decision)


async def _refuse(stream: trio.abc.Stream, refusal: Refusal) -> NoReturn:
    """Answer with ``refusal`` and fail the handshake with its reason (never returns)."""
    try:
        await stream.send_all(refusal.response())
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    raise RemoteProtocolError(f"websocket: refused with {refusal.status}: {refusal.reason}")


async def client_handshake(stream: trio.abc.Stream, address: WsAddress) -> WebSocketStream:
    """Upgrade ``stream`` to a WebSocket for the upstream at ``address``."""
    ws = WSConnection(ConnectionType.CLIENT)
    origin = [(b"Origin", address.origins[0].encode())] if address.origins else []
    request = Request(
        host=address.host_header,
        target=address.path,
        subprotocols=list(address.subprotocols),
        extra_headers=origin,
    )
    await stream.send_all(ws.send(request))
    try:
        answer = await _first(stream, ws, (AcceptConnection, RejectConnection))
    except WsRemoteProtocolError as e:
        raise RemoteProtocolError(f"websocket: bad upgrade answer: {e}") from None
    if isinstance(answer, RejectConnection):
        raise RemoteProtocolError(f"websocket: the server answered HTTP {answer.status_code}")
    assert isinstance(answer, AcceptConnection)
    if address.subprotocols and answer.subprotocol is None:
        offered = ", ".join(address.subprotocols)
        raise RemoteProtocolError(f"websocket: the server chose none of the subprotocols {offered}")
    return WebSocketStream(
        stream, ws, max_message=address.max_message, subprotocol=answer.subprotocol
    )


async def _first(
    stream: trio.abc.Stream, ws: WSConnection, kinds: type[Event] | tuple[type[Event], ...]
) -> Event:
    """Read until wsproto produces an event of ``kinds``; what follows stays in ``ws``."""
    while True:
        data = await stream.receive_some(RECEIVE_CHUNK)
        if not data:
            raise RemoteProtocolError("websocket: closed during the opening handshake")
        ws.receive_data(bytes(data))
        for event in ws.events():
            if isinstance(event, kinds):
                return event
