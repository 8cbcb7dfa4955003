"""The ``ws`` transport: ``ws://`` and ``wss://`` listeners and upstreams for any stream protocol.

TCP underneath (the built-in ``tcp`` transport's sockets); ``wss`` is the
listener's or upstream's ``tls`` table, which the runtime applies before
:meth:`WebSocketTransport.accepted` / :meth:`~WebSocketTransport.connected`
run. So that an address never says more than is true, ``wss://`` without a
``tls`` table, and ``ws://`` with one, fail the handshake naming the mistake.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

import trio

from gateway.sdk import RemoteProtocolError, Transport
from gateway.sdk import tcp_transport as tcp
from interchange_websocket.address import WsAddress, parse_ws_address
from interchange_websocket.handshake import client_handshake, server_handshake
from interchange_websocket.stream import WebSocketStream

__all__ = ["WebSocketListener", "WebSocketTransport"]


class WebSocketListener(trio.abc.Listener[trio.abc.Stream]):
    """A TCP listener that remembers the address it serves (for its name)."""

    def __init__(self, inner: trio.SocketListener, address: WsAddress) -> None:
        self.inner = inner
        self.address = address

    async def accept(self) -> trio.abc.Stream:
        return await self.inner.accept()

    async def aclose(self) -> None:
        await self.inner.aclose()


class WebSocketTransport(Transport):
    """WebSocket (RFC 6455) over TCP, and over TLS for ``wss``."""

    name = "ws"
    schemes = ("ws", "wss")

    def check_address(self, address: str) -> None:
        parse_ws_address(address)

    async def listen(self, address: str) -> Sequence[trio.abc.Listener[trio.abc.Stream]]:
        ws = parse_ws_address(address)
        return [WebSocketListener(inner, ws) for inner in await tcp.listen(ws.host_header)]

    async def adopt(
        self, address: str, sockets: Sequence[socket.socket]
    ) -> Sequence[trio.abc.Listener[trio.abc.Stream]]:
        """The TCP sockets a supervisor bound for ``address``, each serving WebSocket."""
        ws = parse_ws_address(address)
        return [WebSocketListener(inner, ws) for inner in await tcp.adopt(ws.host_header, sockets)]

    def listener_name(self, listener: trio.abc.Listener[Any]) -> str:
        """``ws://127.0.0.1:41234/path``, with the subprotocols a client must offer."""
        assert isinstance(listener, WebSocketListener)
        ws = listener.address
        name = f"{ws.scheme}://{tcp.listener_name(listener.inner)}{ws.path}"
        if ws.subprotocols:
            name += "?" + urlencode([("subprotocol", p) for p in ws.subprotocols])
        return name

    def peer_name(self, stream: trio.abc.Stream) -> str:
        return tcp.peer_name(stream)

    async def connect(self, address: str) -> trio.abc.Stream:
        return await tcp.connect(parse_ws_address(address).host_header)

    async def accepted(self, stream: trio.abc.Stream, address: str) -> WebSocketStream:
        ws = parse_ws_address(address)
        _check_tls(ws, stream, "listener")
        return await server_handshake(stream, ws)

    async def connected(self, stream: trio.abc.Stream, address: str) -> WebSocketStream:
        ws = parse_ws_address(address)
        _check_tls(ws, stream, "upstream")
        return await client_handshake(stream, ws)


def _check_tls(ws: WsAddress, stream: trio.abc.Stream, role: str) -> None:
    """``wss`` needs the ``tls`` table's layer underneath, and ``ws`` must not have one."""
    tls = _has_tls(stream)
    if ws.secure and not tls:
        raise RemoteProtocolError(f"websocket: wss:// needs a tls table on the {role}")
    if tls and not ws.secure:
        raise RemoteProtocolError(
            f"websocket: this {role} has a tls table: write wss://, not ws://"
        )


def _has_tls(stream: trio.abc.Stream) -> bool:
    """Whether a ``trio.SSLStream`` is under ``stream`` (through ``transport_stream`` links)."""
    for _ in range(8):
        if isinstance(stream, trio.SSLStream):
            return True
        inner = getattr(stream, "transport_stream", None)
        if inner is None:
            return False
        stream = inner
    return False
