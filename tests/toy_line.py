"""A toy line protocol that exercises every seam of the plugin interface, for tests.

``toyline`` is one line per frame. It is not shipped: tests register it in a
:class:`~gateway.runtime.registry.Registry` of their own.

* **Server role: a transparent proxy.** Each line a client sends is forwarded,
  unchanged and without the hub, to the listener's ``upstream`` (an upstream
  of this protocol), and the one line that answers it goes back to the
  client. Upstream connections come from a pool per upstream that the plugin
  builds in ``setup`` and closes in ``teardown``: the seam a ttrpc proxy uses.
* **Client role: ingress.** With ``ingress = true`` an upstream connects to a
  remote line server, publishes every line it receives into the upstream's
  local ``destination`` with the connection's source metadata, and answers
  ``ack`` only once the receipt settled (backpressure: at most ``window``
  unanswered lines, then it stops reading).

Both roles stand on the protocol toolkit: :class:`LineCodec` is sans-IO over
a :class:`~gateway.protocol.ReceiveBuffer`, and the drivers are
:class:`~gateway.protocol.Session` subclasses.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import trio

from gateway.core.model import Message, Outcome
from gateway.core.receipts import Receipt
from gateway.protocol.options import REQUIRED, Option
from gateway.protocol.plugin import (
    ConnectionInfo,
    PluginEnv,
    ProtocolPlugin,
    Role,
    ServerConnection,
    Upstream,
    UpstreamContext,
)
from gateway.sdk import (
    NEED_DATA,
    ConnectionClosed,
    NeedData,
    ReceiveBuffer,
    RemoteProtocolError,
    Session,
)

MAX_LINE = 65536


@dataclass(frozen=True, slots=True)
class Line:
    data: bytes


class LineCodec:
    """Lines in, lines out; a line longer than ``MAX_LINE`` is the peer's error."""

    def __init__(self) -> None:
        self.buffer = ReceiveBuffer()

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self.buffer.feed(data)

    @property
    def held_bytes(self) -> int:
        return len(self.buffer)

    def next_event(self) -> Line | ConnectionClosed | NeedData:
        buf = self.buffer
        nl = buf.find(b"\n")
        if nl < 0:
            if len(buf) > MAX_LINE:
                raise RemoteProtocolError(f"line longer than {MAX_LINE} bytes")
            return ConnectionClosed() if buf.eof else NEED_DATA
        line = bytes(buf.data[buf.pos : nl])
        buf.advance(nl + 1)
        return Line(line)

    def send(self, event: Line) -> bytes:
        return event.data + b"\n"


class PooledLine:
    """One upstream connection and the codec that reads its answers."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.codec = LineCodec()

    async def exchange(self, line: bytes) -> bytes:
        await self.stream.send_all(self.codec.send(Line(line)))
        while True:
            event = self.codec.next_event()
            if isinstance(event, Line):
                return event.data
            if isinstance(event, ConnectionClosed):
                raise trio.BrokenResourceError("the upstream closed the connection")
            self.codec.receive_data(await self.stream.receive_some(MAX_LINE))


class Pool:
    """At most ``size`` connections to one upstream, reused between client connections."""

    def __init__(self, upstream: Upstream, size: int) -> None:
        self.upstream = upstream
        self.opened = 0
        self._idle: list[PooledLine] = []
        self._slots = trio.Semaphore(size)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[PooledLine]:
        async with self._slots:
            if self._idle:
                conn = self._idle.pop()
            else:
                stream, _ = await self.upstream.connect()
                self.opened += 1
                conn = PooledLine(stream)
            try:
                yield conn
            except BaseException:
                await trio.aclose_forcefully(conn.stream)  # its state is unknown: never reuse
                raise
            self._idle.append(conn)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            await trio.aclose_forcefully(conn.stream)


class _ProxySession(Session):
    def __init__(self, conn: ServerConnection, pool: Pool) -> None:
        super().__init__(conn.stream, LineCodec(), log=conn.log, shutdown=conn.shutdown)
        self.pool = pool

    async def handle(self, event: Line) -> None:
        async with self.pool.connection() as upstream:
            answer = await upstream.exchange(event.data)
        self.write(answer + b"\n")


class _IngressSession(Session):
    def __init__(self, ctx: UpstreamContext, stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        super().__init__(stream, LineCodec(), log=ctx.log, max_answers=ctx.options["window"])
        self.ctx = ctx
        self.info = info

    async def handle(self, event: Line) -> None:
        message = Message(self.ctx.ingress, event.data, source=self.ctx.source(self.info))
        await self.submit(lambda: self.ctx.hub.publish([message]), _ack)

    def end_of_input(self) -> None:
        raise trio.BrokenResourceError("the remote closed the connection")


def _ack(receipt: Receipt) -> bytes:
    if receipt.outcome is not Outcome.DELIVERED:
        raise RemoteProtocolError(f"not kept: {receipt.reason}")  # close unacked: resent
    return b"ack\n"


class ToyLinePlugin(ProtocolPlugin):
    """Records its lifecycle in :attr:`events` (per instance: per gateway)."""

    name = "toyline"
    roles: ClassVar[frozenset[Role]] = frozenset({"server", "client"})
    listener_options: ClassVar[dict[str, Option]] = {
        "upstream": Option("upstream", REQUIRED, "the upstream every line is proxied to"),
        "pool_size": Option("int", 2, "connections per upstream", minimum=1),
    }
    upstream_options: ClassVar[dict[str, Option]] = {
        "ingress": Option("bool", False, "publish the lines the remote sends"),
        "window": Option("int", 8, "lines published and not yet acked", minimum=1),
    }

    def __init__(self) -> None:
        self.events: list[str] = []
        self.pools: dict[str, Pool] = {}
        self.env: PluginEnv | None = None

    async def setup(self, env: PluginEnv) -> None:
        self.env = env
        size = max((ls.options["pool_size"] for ls in env.listeners), default=1)
        self.pools = {name: Pool(up, size) for name, up in env.upstreams.items()}
        self.events.append("setup")

    async def teardown(self) -> None:
        for pool in self.pools.values():
            await pool.aclose()
        self.events.append("teardown")

    async def serve(self, conn: ServerConnection) -> None:
        upstream = conn.upstream(conn.options["upstream"])  # LookupError: not ours
        await _ProxySession(conn, self.pools[upstream.name]).run()

    async def run_upstream(self, ctx: UpstreamContext) -> None:
        if not ctx.options["ingress"]:
            await trio.sleep_forever()  # a proxy target only

        async def session(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
            await _IngressSession(ctx, stream, info).run()

        await ctx.run_sessions(session)


def registered(*plugins: type[ProtocolPlugin]) -> Any:
    """A registry with the installed transports and ``plugins`` as its protocols."""
    from gateway.runtime.registry import Registered, Registry, default_registry

    return Registry(
        {
            p.name: Registered(p.name, f"tests:{p.__name__}", "tests", "0", plugin=p)
            for p in plugins
        },
        default_registry().transports,
    )
