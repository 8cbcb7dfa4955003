"""The interfaces a transport plugin implements.

A :class:`Transport` turns an address (a ``bind`` or ``connect`` string) into
listeners and outgoing streams: plain sockets (``tcp``, ``unix``) or a URL
scheme with a handshake and framing of its own (``ws://``). A
:class:`StreamLayer` wraps an established stream in something a listener or
upstream asks for by *role* (``tls``). On each connection the runtime runs, in
the connection's own task and within its ``handshake_timeout``: the layer's
handshake if a ``tls`` table asks for one, then the transport's
:meth:`~Transport.accepted` (server) or :meth:`~Transport.connected`
(client). Protocols only see the stream that comes out.
"""

from __future__ import annotations

import re
import socket
import ssl
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import trio

from gateway.core.model import PeerIdentity

__all__ = [
    "ClientAuth",
    "SocketTransport",
    "StreamLayer",
    "TlsClientSettings",
    "TlsServerSettings",
    "Transport",
    "address_host",
    "address_scheme",
]

ClientAuth = Literal["none", "optional", "required"]

#: ``scheme://`` at the start of an address (RFC 3986 scheme syntax).
_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def address_scheme(address: str) -> str | None:
    """``ws://h:1/p`` → ``ws`` (lower case); None when the address is not ``scheme://…``."""
    match = _URL_SCHEME.match(address)
    return match.group(1).lower() if match else None


def address_host(address: str) -> str | None:
    """The host of ``host:port`` or ``scheme://[user@]host[:port][/path]``, brackets removed.

    None when there is none. Pure string work: nothing is resolved.
    """
    match = _URL_SCHEME.match(address)
    if match:
        address = address[match.end() :].split("/", 1)[0].split("?", 1)[0]
        address = address.rpartition("@")[2]
        if address.startswith("[") and "]" in address:
            return address[1 : address.index("]")] or None
        if ":" not in address:
            return address or None
    host = address.rsplit(":", 1)[0]
    return host.strip("[]") or None


class Transport(ABC):
    """Opens listeners and connections for the addresses it claims.

    Registered in the ``interchange.transports`` entry-point group (an
    instance, or a class that is instantiated without arguments).
    """

    kind: ClassVar[str] = "transport"
    #: Short name shown by ``gateway plugins`` and in logs (``tcp``, ``unix``, ``ws``).
    name: ClassVar[str]
    #: URL schemes this transport claims: ``("ws", "wss")`` claims ``ws://…`` and ``wss://…``.
    schemes: ClassVar[tuple[str, ...]] = ()
    #: Takes every address that no other transport claims (``tcp``: ``host:port``).
    fallback: ClassVar[bool] = False

    def claims(self, address: str) -> bool:
        """Whether ``address`` is this transport's: by default, ``scheme://`` of :attr:`schemes`."""
        return address_scheme(address) in self.schemes

    @abstractmethod
    def check_address(self, address: str) -> None:
        """Raise ``ValueError`` with a user-facing reason if ``address`` is malformed.

        Pure: binds and resolves nothing (``gateway check`` calls it).
        """

    @abstractmethod
    async def listen(self, address: str) -> Sequence[trio.abc.Listener[trio.abc.Stream]]:
        """Bind and listen on ``address``; a port of 0 picks a free one.

        Any ``trio.abc.Listener`` will do. ``accept`` must return at once with
        the new stream: a handshake belongs in :meth:`accepted`, which runs in
        the connection's own task, never in the accept loop.
        """

    async def adopt(
        self, address: str, sockets: Sequence[socket.socket]
    ) -> Sequence[trio.abc.Listener[trio.abc.Stream]]:
        """Listen on ``sockets``, already bound and listening for ``address``, instead of binding.

        The workers of ``gateway run --workers N`` serve the sockets their
        supervisor bound once (with :meth:`listen`), so that every worker
        accepts from the same queue. The listeners own the sockets (closing a
        listener closes its socket). The default wraps each stream socket in a
        ``trio.SocketListener``; a transport whose :meth:`listen` returns
        listeners of its own (``ws``) wraps them the same way.
        """
        return [trio.SocketListener(trio.socket.from_stdlib_socket(s)) for s in sockets]

    @abstractmethod
    async def connect(self, address: str) -> trio.abc.Stream:
        """Open a stream to ``address`` (within the upstream's ``connect_timeout``)."""

    @abstractmethod
    def peer_name(self, stream: trio.abc.Stream) -> str:
        """The remote end of an accepted or connected stream, for logs and metadata."""

    @abstractmethod
    def listener_name(self, listener: trio.abc.Listener[Any]) -> str:
        """The address a listener actually bound, with the real port when 0 was asked.

        It is what ``Gateway.addresses`` reports, so it should be an address
        this transport can ``connect`` to (``ws://127.0.0.1:8080/path``).
        """

    async def accepted(self, stream: trio.abc.Stream, address: str) -> trio.abc.Stream:
        """Server side: make a freshly accepted stream ready for the protocol.

        ``address`` is the listener's ``bind``. Runs in the connection's task
        after the TLS layer, within the listener's ``handshake_timeout``;
        raising (or running out of time) closes this connection only. Return
        the stream the protocol reads and writes (for instance one that
        unframes messages). The default returns ``stream``.
        """
        return stream

    async def connected(self, stream: trio.abc.Stream, address: str) -> trio.abc.Stream:
        """Client side: the same after :meth:`connect` and TLS, for ``address``.

        Runs within the upstream's ``handshake_timeout``. The default returns ``stream``.
        """
        return stream

    @property
    def handshakes(self) -> bool:
        """Whether :meth:`accepted` or :meth:`connected` is overridden (the stream is not plain)."""
        cls = type(self)
        return cls.accepted is not Transport.accepted or cls.connected is not Transport.connected

    def server_name(self, address: str) -> str | None:
        """The host TLS verifies and sends as SNI when connecting to ``address`` (None: none)."""
        return address_host(address)


#: The former name of :class:`Transport`, from when every transport was a socket.
SocketTransport = Transport


@dataclass(frozen=True, slots=True)
class TlsServerSettings:
    cert: Path
    key: Path
    client_ca: Path | None = None
    client_auth: ClientAuth = "none"
    #: Lowest TLS version accepted: "1.2" or "1.3".
    min_version: str = "1.2"


@dataclass(frozen=True, slots=True)
class TlsClientSettings:
    #: CA bundle to verify the server with; ``None`` uses the system store.
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    #: Name to verify and send as SNI; defaults to the host of the address.
    server_name: str | None = None
    verify: bool = True
    min_version: str = "1.2"


class StreamLayer(ABC):
    """Wraps an established stream, e.g. in TLS.

    The runtime finds a layer by its :attr:`role`, not its name: a listener or
    upstream with a ``tls`` table uses the layer whose role is ``"tls"``. If a
    third party's layer has the same role as the built-in one, it replaces it.
    """

    kind: ClassVar[str] = "layer"
    name: ClassVar[str]
    #: What the layer is for. The methods below are the ``"tls"`` role's interface.
    role: ClassVar[str] = "tls"

    @abstractmethod
    def server_context(self, settings: TlsServerSettings) -> ssl.SSLContext:
        """Build the server-side context; raise ``ValueError`` naming a bad file."""

    @abstractmethod
    def client_context(self, settings: TlsClientSettings) -> ssl.SSLContext:
        """Build the client-side context; raise ``ValueError`` naming a bad file."""

    @abstractmethod
    async def wrap_server(
        self, stream: trio.abc.Stream, context: ssl.SSLContext
    ) -> tuple[trio.abc.Stream, PeerIdentity | None]:
        """Complete the server handshake; return the stream and the verified peer."""

    @abstractmethod
    async def wrap_client(
        self, stream: trio.abc.Stream, context: ssl.SSLContext, server_hostname: str | None
    ) -> tuple[trio.abc.Stream, PeerIdentity | None]:
        """Complete the client handshake; return the stream and the server's identity."""
