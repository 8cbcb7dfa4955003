"""TCP: ``host:port``, ``[v6addr]:port`` and ``*:port`` / ``:port`` (all interfaces).

TCP is the fallback transport: it claims every address that does not start
with a ``scheme:`` prefix, so a typo still gets a TCP-shaped error message
instead of "no transport".
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Sequence
from typing import Any

import trio

from gateway.transports.base import Transport

__all__ = ["TcpTransport", "format_sockaddr", "parse_address", "transport"]

_EXAMPLE = "expected host:port, e.g. 127.0.0.1:5044"
#: A ``scheme:`` prefix that is not ``host:port`` (the part after the colon is not a port).
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+-]*:(?!\d*$)")
_HOST = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_.])?$")
#: How often to retry making the IPv4 and IPv6 wildcard listeners share a random port.
_SAME_PORT_ATTEMPTS = 5


def parse_address(address: str) -> tuple[str | None, int]:
    """Split a TCP address into ``(host, port)``; ``None`` host means every interface.

    Raises ``ValueError`` with a user-facing reason; does no I/O.
    """
    if not address or address != address.strip() or any(c.isspace() for c in address):
        raise ValueError(f"{_EXAMPLE} (without spaces)" if address else _EXAMPLE)
    if address.startswith("["):
        end = address.find("]")
        if end < 0:
            raise ValueError("missing ']' after the IPv6 address, e.g. [::1]:5044")
        host: str | None = address[1:end]
        rest = address[end + 1 :]
        if not rest.startswith(":"):
            raise ValueError("expected [v6addr]:port, e.g. [::1]:5044")
        port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{host!r} in brackets is not an IPv6 address")
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise ValueError(_EXAMPLE)
        if ":" in host:
            raise ValueError("IPv6 addresses need brackets, e.g. [::1]:5044")
        if host in ("", "*"):
            host = None
        elif not _HOST.match(host) or len(host) > 253:
            raise ValueError(f"{host!r} is not a valid host name or IP address")
    if not port_text:
        raise ValueError(f"missing port; {_EXAMPLE}")
    if not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"port must be a number 0..65535, not {port_text!r}")
    port = int(port_text)
    if port > 65535:
        raise ValueError(f"port must be 0..65535, not {port}")
    return host, port


def format_sockaddr(sockaddr: object) -> str:
    """``('1.2.3.4', 80)`` → ``1.2.3.4:80``; IPv6 in brackets, IPv4-mapped shown as IPv4."""
    if not isinstance(sockaddr, tuple) or len(sockaddr) < 2:
        return str(sockaddr) if sockaddr else ""
    host, port = str(sockaddr[0]), sockaddr[1]
    if ":" in host:
        try:
            mapped = ipaddress.IPv6Address(host.split("%", 1)[0]).ipv4_mapped
        except ValueError:
            mapped = None
        if mapped is not None:
            return f"{mapped}:{port}"
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def enable_keepalive(sock: trio.socket.SocketType) -> None:
    """Turn on TCP keepalive so half-dead peers are eventually noticed (best effort)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    except OSError:
        pass


class TcpTransport(Transport):
    """Listeners and connections over TCP, IPv4 and IPv6."""

    kind = "socket"
    name = "tcp"
    fallback = True

    def claims(self, address: str) -> bool:
        """Anything that is not ``scheme:…`` for another scheme (``unix:/x`` is not ours)."""
        return not _SCHEME.match(address)

    def check_address(self, address: str) -> None:
        parse_address(address)

    async def listen(self, address: str) -> list[trio.SocketListener]:
        """Bind ``address``; with a wildcard host and port 0 all listeners share one port."""
        host, port = parse_address(address)
        listeners = await trio.open_tcp_listeners(port, host=host)
        if port == 0 and len({_port(listener) for listener in listeners}) > 1:
            listeners = await self._same_port(listeners, host)
        for listener in listeners:
            # Linux and the BSDs copy SO_KEEPALIVE from the listening socket to accepted ones.
            enable_keepalive(listener.socket)
        return listeners

    async def adopt(
        self, address: str, sockets: Sequence[socket.socket]
    ) -> list[trio.SocketListener]:
        """Serve sockets bound for ``address`` elsewhere (a supervisor), keepalive on."""
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(s)) for s in sockets]
        for listener in listeners:
            enable_keepalive(listener.socket)
        return listeners

    async def _same_port(
        self, listeners: list[trio.SocketListener], host: str | None
    ) -> list[trio.SocketListener]:
        """Re-bind every family on the first listener's random port (it may be taken: retry)."""
        for _ in range(_SAME_PORT_ATTEMPTS):
            port = _port(listeners[0])
            for listener in listeners:
                await listener.aclose()
            try:
                return await trio.open_tcp_listeners(port, host=host)
            except OSError:
                listeners = await trio.open_tcp_listeners(0, host=host)
                if len({_port(listener) for listener in listeners}) == 1:
                    return listeners
        return listeners

    async def connect(self, address: str) -> trio.abc.Stream:
        host, port = parse_address(address)
        if host is None:
            raise ValueError(f"cannot connect to {address!r}: a host is needed, e.g. 127.0.0.1")
        if port == 0:
            raise ValueError(f"cannot connect to {address!r}: port 0 is only for listening")
        stream = await trio.open_tcp_stream(host, port)
        enable_keepalive(stream.socket)
        return stream

    def peer_name(self, stream: trio.abc.Stream) -> str:
        sock = _socket_of(stream)
        if sock is None:
            return ""
        try:
            return format_sockaddr(sock.getpeername())
        except OSError:
            return ""

    def listener_name(self, listener: trio.abc.Listener[Any]) -> str:
        sock = getattr(listener, "socket", None)
        return format_sockaddr(sock.getsockname()) if sock is not None else ""


def _port(listener: trio.SocketListener) -> int:
    return int(listener.socket.getsockname()[1])


def _socket_of(stream: trio.abc.Stream) -> trio.socket.SocketType | None:
    """The socket under ``stream``, looking through wrappers such as ``trio.SSLStream``."""
    for _ in range(8):
        sock = getattr(stream, "socket", None)
        if sock is not None:
            return sock
        inner = getattr(stream, "transport_stream", None)
        if inner is None:
            return None
        stream = inner
    return None


transport = TcpTransport()
