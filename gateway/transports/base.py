"""The interfaces a transport plugin implements."""

from __future__ import annotations

import ssl
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import trio

from ..model import PeerIdentity

ClientAuth = Literal["none", "optional", "required"]


class SocketTransport(ABC):
    """Opens listeners and connections for one address scheme."""

    kind: ClassVar[str] = "socket"
    #: Short name shown by ``gateway plugins`` (``tcp``, ``unix``).
    name: ClassVar[str]

    @abstractmethod
    def claims(self, address: str) -> bool:
        """Whether ``address`` (a ``bind`` or ``connect`` string) is this transport's."""

    @abstractmethod
    def check_address(self, address: str) -> None:
        """Raise ``ValueError`` with a user-facing reason if ``address`` is malformed.

        Pure: binds and resolves nothing (``gateway check`` calls it).
        """

    @abstractmethod
    async def listen(self, address: str) -> list[trio.SocketListener]:
        """Bind and listen on ``address``; a port of 0 picks a free one."""

    @abstractmethod
    async def connect(self, address: str) -> trio.abc.Stream:
        """Open a stream to ``address``."""

    @abstractmethod
    def peer_name(self, stream: trio.abc.Stream) -> str:
        """The remote end of an accepted or connected stream, for logs and metadata."""

    @abstractmethod
    def listener_name(self, listener: trio.SocketListener) -> str:
        """The address a listener actually bound (with the real port when 0 was asked)."""


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
    """Wraps an established stream, e.g. in TLS."""

    kind: ClassVar[str] = "layer"
    name: ClassVar[str]

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
