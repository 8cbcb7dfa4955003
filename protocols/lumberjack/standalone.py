"""A Lumberjack server for applications: ``async for batch in server``.

For programs that want Beats traffic without running the gateway: each
window arrives as a :class:`Batch`; the client is acked only after
``batch.ack()`` (in window order, with keepalives while the application
takes its time). ``batch.fail()`` closes that connection unacked, so the
client resends the window.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import trio

from gateway.sdk import Outcome, PeerIdentity, Receipt, identity_from_der

from . import Window
from .server import ServerSettings, serve_connection

__all__ = ["Batch", "LumberjackServer", "open_server"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Batch:
    """One window of events from one connection."""

    #: ``(seq, JSON bytes)`` for ``J`` frames, ``(seq, {key: value})`` for ``D`` frames.
    events: list[tuple[int, bytes | dict[str, str]]]
    version: int
    peer: str
    identity: PeerIdentity | None
    _receipt: Receipt = field(repr=False, default_factory=lambda: Receipt(1))

    def ack(self) -> None:
        """The events are safe: let the server ack the window."""
        self._settle(Outcome.DELIVERED)

    def fail(self, reason: str = "") -> None:
        """The events could not be kept: close the connection without acking."""
        self._settle(Outcome.FAILED, reason)

    def _settle(self, outcome: Outcome, reason: str = "") -> None:
        if not self._receipt.done():
            self._receipt.settle(0, outcome, reason)


class LumberjackServer:
    """Listening sockets plus the batches they produce."""

    def __init__(
        self, listeners: list[trio.SocketListener], receive: trio.MemoryReceiveChannel[Batch]
    ) -> None:
        self.listeners = listeners
        self._receive = receive

    @property
    def port(self) -> int:
        """The port bound (useful when 0 was asked)."""
        return int(self.listeners[0].socket.getsockname()[1])

    def __aiter__(self) -> AsyncIterator[Batch]:
        return self._receive.__aiter__()

    async def receive(self) -> Batch:
        return await self._receive.receive()


@asynccontextmanager
async def open_server(
    host: str = "127.0.0.1",
    port: int = 5044,
    *,
    ssl_context: ssl.SSLContext | None = None,
    settings: ServerSettings | None = None,
    handshake_timeout: float = 10.0,
) -> AsyncIterator[LumberjackServer]:
    """Serve Lumberjack on ``host:port`` while the context is open."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    send, receive = trio.open_memory_channel[Batch](0)

    async def handle(stream: trio.SocketStream) -> None:
        peer_addr = stream.socket.getpeername()
        peer = f"{peer_addr[0]}:{peer_addr[1]}"
        conn: trio.abc.Stream = stream
        identity = None
        try:
            if ssl_context is not None:
                tls = trio.SSLStream(stream, ssl_context, server_side=True)
                with trio.fail_after(handshake_timeout):
                    await tls.do_handshake()
                der = tls.getpeercert(binary_form=True)
                identity = identity_from_der(der) if der else None
                conn = tls

            async def sink(window: Window) -> Receipt:
                batch = Batch(window.events, window.version, peer, identity)
                batch._receipt.add_legs()
                batch._receipt.seal()
                await send.send(batch)
                return batch._receipt

            await serve_connection(conn, sink, settings, logger=log)
        except (trio.BrokenResourceError, trio.TooSlowError, ssl.SSLError) as e:
            log.info("%s: connection ended: %s", peer, e)
        finally:
            await trio.aclose_forcefully(conn)

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, listeners)
        try:
            yield LumberjackServer(listeners, receive)
        finally:
            nursery.cancel_scope.cancel()
