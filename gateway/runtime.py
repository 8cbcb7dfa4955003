"""The runtime: listeners, connections and upstreams under one trio nursery.

Life of a gateway: set up its own instance of every protocol plugin the
config uses, bind every listener, start every upstream, serve; on a shutdown
request stop accepting, let in-flight publishes settle until the drain
deadline, cancel what is left, tear the plugins down (in reverse order) and
close the hub. Each listener has
its own nursery with one task per connection, and each connection its own
nursery: an error in one connection is logged with the peer address and
closes that connection only.

Protections (docs/limits.md): connections per listener and per peer address,
an accept loop that survives running out of descriptors, a :class:`Guard` on
every connection's stream (idle timeout on useful progress, partial input
charged to the gateway's :class:`MemoryBudget`, departed peers' work settled
as failed), and warnings rate-limited per listener and reason.
"""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import cast

import trio
from prometheus_client import Counter

from .accept import accept_forever
from .budget import MemoryBudget
from .catalog import Catalog
from .config import Config
from .errors import ProtocolError, first_leaf
from .facade import HubFacade
from .hub import Hub
from .logs import Throttled
from .metrics import Metrics
from .metrics_http import serve_metrics
from .plugin import (
    ConnectionInfo,
    ListenerSettings,
    PluginEnv,
    PluginError,
    PrefixLogger,
    ProtocolPlugin,
    ServerConnection,
    Upstream,
    UpstreamContext,
    UpstreamSettings,
)
from .protocol.guard import Guard
from .registry import Registry, default_registry
from .routing import Router
from .topic import TopicLimits
from .transports.base import StreamLayer, Transport

__all__ = ["Gateway"]

log = logging.getLogger("gateway.runtime")

_LOST = (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, ConnectionError)


class _TrackedStream(trio.abc.Stream):
    """Passes everything through, counting bytes; carries the connection's :class:`Guard`.

    Until the protocol's driver reports progress itself (a
    :class:`~gateway.protocol.Session` does), every transfer counts as
    activity for the idle timeout, as a plugin of its own may expect.
    """

    def __init__(
        self, inner: trio.abc.Stream, received: Counter, sent: Counter, guard: Guard
    ) -> None:
        self.inner = inner
        #: trio's name for the stream under a layer (the hang-up probe follows it).
        self.transport_stream = inner
        self.guard = guard
        self.conn: ServerConnection | None = None
        self._received = received
        self._sent = sent

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self._received.inc(len(data))
        if self.conn is not None and not self.guard.reports_progress:
            self.conn.touch()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        self._sent.inc(len(data))
        if self.conn is not None and not self.guard.reports_progress:
            self.conn.touch()

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        send_eof = getattr(self.inner, "send_eof", None)
        if send_eof is not None:
            await send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class _ListenerState:
    settings: ListenerSettings
    plugin: ProtocolPlugin
    transport: Transport
    tls_context: ssl.SSLContext | None
    #: The layer with the ``tls`` role, when the listener has a ``tls`` table.
    tls_layer: StreamLayer | None
    #: Warnings about this listener's connections, one per reason per interval.
    throttle: Throttled
    addresses: list[str] = field(default_factory=list)
    connections: int = 0
    #: Open connections by peer host (TCP only), for ``max_connections_per_address``.
    per_address: dict[str, int] = field(default_factory=dict)
    accept_scope: trio.CancelScope = field(default_factory=trio.CancelScope)


class Gateway:
    """A configured gateway; ``await run()`` serves until :meth:`shutdown`."""

    def __init__(self, config: Config, registry: Registry | None = None) -> None:
        self.config = config
        self.registry = registry or default_registry()
        limits = config.gateway.limits
        #: Bytes held across destinations and connections ([gateway] memory_budget).
        self.budget = MemoryBudget(limits.memory_budget)
        self.catalog = Catalog(
            config.destinations,
            TopicLimits(limits.buffer_bytes, limits.buffer_messages, self.budget),
        )
        self.hub = Hub(
            Router(config.routes),
            limits,
            providers=[self.catalog],
            upstreams=[u.name for u in config.upstreams],
            budget=self.budget,
        )
        #: The hub as protocols see it.
        self.facade = HubFacade(self.hub)
        #: This gateway's own instance of every protocol its config uses, by name.
        self.plugins: dict[str, ProtocolPlugin] = {
            name: self.registry.protocol(name)()
            for name in sorted(
                {ls.protocol for ls in config.listeners} | {up.protocol for up in config.upstreams}
            )
        }
        #: Upstream endpoints by protocol, then name (built when running).
        self._upstreams: dict[str, dict[str, Upstream]] = {}
        #: Set when draining starts; protocols stop taking new work.
        self.draining = trio.Event()
        self._shutdown_requested = trio.Event()
        self._listeners: dict[str, _ListenerState] = {}
        #: Woken whenever a connection ends (drain waits for all of them).
        self._connection_ended = trio.lowlevel.ParkingLot()
        #: True once every in-flight publish settled within the drain deadline.
        self.drained_cleanly: bool | None = None
        self.metrics = Metrics()
        self.metrics.memory_budget.set(self.budget.limit)
        budget = self.budget
        self.metrics.memory_used.set_function(lambda: budget.used)
        #: Publishes abandoned at shutdown (unsettled when the drain deadline passed).
        self.abandoned = 0
        #: Where ``GET /metrics`` is served (real ports), once running.
        self.metrics_addresses: list[str] = []

    # -- public ----------------------------------------------------------------
    @property
    def addresses(self) -> dict[str, list[str]]:
        """Listener name → the addresses it is bound to (real ports)."""
        return {name: list(s.addresses) for name, s in self._listeners.items()}

    def connections(self, listener: str) -> int:
        return self._listeners[listener].connections

    def shutdown(self) -> None:
        """Ask the gateway to drain and stop; ``run`` returns when it has."""
        self._shutdown_requested.set()

    async def run(
        self, *, task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Set plugins up, bind, serve until :meth:`shutdown`, drain, tear down, return."""
        try:
            async with trio.open_nursery() as background:
                await background.start(self.hub.run)
                for name in self.catalog.names():
                    self.hub.destination(name)
                for up in self.config.upstreams:
                    self.hub.destination(f"upstream:{up.name}").declare_group(UpstreamContext.group)
                    endpoint = Upstream(up, self._connector(up))
                    self._upstreams.setdefault(up.protocol, {})[up.name] = endpoint
                ready = await self._set_up_plugins(background)
                try:
                    await self._serve(task_status)
                finally:
                    with trio.CancelScope(shield=True):
                        await self._tear_down(ready)
                    background.cancel_scope.cancel()
        finally:
            if self.drained_cleanly is None and self.hub.inflight:
                # Stopped without a drain (a second signal, a crash): abandoned too.
                self.drained_cleanly = False
                self.abandoned = self.hub.inflight
            self.hub.close()

    async def _serve(self, task_status: trio.TaskStatus[Gateway]) -> None:
        async with trio.open_nursery() as work:
            for up in self.config.upstreams:
                endpoint = self._upstreams[up.protocol][up.name]
                work.start_soon(self._run_upstream, endpoint, name=f"upstream {up.name}")
            if self.config.metrics_bind is not None:
                await work.start(self._serve_metrics, self.config.metrics_bind)
            for ls in self.config.listeners:
                await work.start(self._serve_listener, ls, name=f"listener {ls.name}")
            log.info(
                "serving: %s",
                ", ".join(
                    f"{n} ({s.settings.protocol}) on {' '.join(s.addresses)}"
                    for n, s in self._listeners.items()
                )
                or "no listeners",
            )
            task_status.started(self)
            await self._shutdown_requested.wait()
            await self._drain()
            work.cancel_scope.cancel()

    # -- plugins -------------------------------------------------------------------
    async def _set_up_plugins(self, nursery: trio.Nursery) -> list[str]:
        """Await every plugin's ``setup`` in name order; on a failure undo and raise."""
        ready: list[str] = []
        for name, plugin in self.plugins.items():
            env = PluginEnv(
                hub=self.facade,
                metrics=self.metrics,
                nursery=nursery,
                listeners=[ls for ls in self.config.listeners if ls.protocol == name],
                upstreams=dict(self._upstreams.get(name, {})),
                shutdown=self.draining,
                data_dir=self.config.gateway.data_dir,
                log=PrefixLogger(logging.getLogger(f"gateway.plugin.{name}"), f"plugin {name}"),
            )
            try:
                await plugin.setup(env)
            except Exception as e:
                with trio.CancelScope(shield=True):
                    await self._tear_down(ready)
                raise PluginError(
                    f"protocol plugin {name!r} failed to set up: {type(e).__name__}: {e}"
                ) from e
            ready.append(name)
        return ready

    async def _tear_down(self, names: list[str]) -> None:
        """Await ``teardown`` of ``names`` in reverse order; a failure is logged, not fatal."""
        for name in reversed(names):
            try:
                with trio.move_on_after(self.config.gateway.drain_timeout) as scope:
                    await self.plugins[name].teardown()
                if scope.cancelled_caught:
                    log.error("protocol plugin %r: teardown timed out", name)
            except Exception:
                log.exception("protocol plugin %r: teardown failed", name)

    async def _drain(self) -> None:
        log.info("shutting down: no new connections; draining in-flight work")
        for state in self._listeners.values():
            state.accept_scope.cancel()
        self.draining.set()
        deadline = self.config.gateway.drain_timeout
        with trio.move_on_after(deadline):
            await self.hub.wait_idle()
            # Settled work still has to reach the senders: protocols send their
            # last acks and close by themselves once nothing is pending.
            while any(s.connections for s in self._listeners.values()):
                await self._connection_ended.park()
        self.drained_cleanly = self.hub.inflight == 0
        if self.drained_cleanly:
            open_connections = sum(s.connections for s in self._listeners.values())
            log.info(
                "drained; closing%s", f" {open_connections} connections" * bool(open_connections)
            )
        else:
            self.abandoned = self.hub.inflight
            log.warning(
                "%d publishes still unsettled after %gs; abandoning them, their senders get"
                " no ack (exit status 3)",
                self.abandoned,
                deadline,
            )
        for state in self._listeners.values():
            state.throttle.flush()

    async def _serve_metrics(
        self, bind: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        transport = self.registry.transport_for(bind)
        if transport.handshakes:
            # Prometheus speaks plain HTTP: the transport's handshake would never run.
            raise OSError(
                f"metrics cannot bind {bind}: the {transport.name} transport has a handshake "
                "of its own, and the metrics endpoint is plain HTTP (use host:port or unix:)"
            )
        try:
            listeners = await transport.listen(bind)
        except OSError as e:
            raise OSError(e.errno, f"metrics cannot bind {bind}: {e.strerror or e}") from None
        self.metrics_addresses = [transport.listener_name(sl) for sl in listeners]
        log.info("metrics: GET /metrics on %s", " ".join(self.metrics_addresses))
        task_status.started()
        # serve_metrics only accepts and reads bytes: any listener of a plain transport does.
        await serve_metrics(
            self.metrics,
            cast("list[trio.SocketListener]", list(listeners)),
            max_connections=self.config.metrics_max_connections,
            idle_timeout=self.config.metrics_idle_timeout,
        )

    # -- listeners ---------------------------------------------------------------
    async def _serve_listener(
        self, ls: ListenerSettings, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        plugin = self.plugins[ls.protocol]
        transport = self.registry.transport_for(ls.bind)
        tls_layer = self.registry.layer_for("tls") if ls.tls else None
        tls_context = tls_layer.server_context(ls.tls) if tls_layer and ls.tls else None
        throttle = Throttled(
            logging.getLogger(f"gateway.protocol.{ls.protocol}"),
            suppressed=self.metrics.log_lines_suppressed,
        )
        state = _ListenerState(ls, plugin, transport, tls_context, tls_layer, throttle)
        try:
            listeners = await transport.listen(ls.bind)
        except OSError as e:
            raise OSError(e.errno, f"listener {ls.name!r} cannot bind {ls.bind}: {e.strerror or e}")
        state.addresses = [transport.listener_name(sl) for sl in listeners]
        self._listeners[ls.name] = state
        for family in (
            self.metrics.connections,
            self.metrics.connections_open,
            self.metrics.connection_errors,
            self.metrics.bytes_received,
            self.metrics.bytes_sent,
            self.metrics.abandoned_publishes,
        ):
            family.labels(listener=ls.name)  # every series from 0, before any connection
        try:
            async with trio.open_nursery() as nursery:
                with state.accept_scope:
                    async with trio.open_nursery() as accepting:
                        for sl in listeners:
                            accepting.start_soon(self._accept_loop, state, sl, nursery)
                        task_status.started()
                # Accepting stopped; connections in ``nursery`` go on until cancelled.
        finally:
            for sl in listeners:
                await trio.aclose_forcefully(sl)

    async def _accept_loop(
        self,
        state: _ListenerState,
        listener: trio.abc.Listener[trio.abc.Stream],
        nursery: trio.Nursery,
    ) -> None:
        ls = state.settings

        def refuse(stream: trio.abc.Stream, reason: str, limit: int) -> None:
            self.metrics.refused_connections.labels(listener=ls.name, reason=reason).inc()
            state.throttle.warning(
                f"{ls.name}:{reason}",
                "listener %s: %d connections (%s); refusing %s",
                ls.name,
                limit,
                reason,
                state.transport.peer_name(stream),
            )
            nursery.start_soon(trio.aclose_forcefully, stream)

        def handle(stream: trio.abc.Stream) -> None:
            if state.connections >= ls.max_connections:
                refuse(stream, "max_connections", ls.max_connections)
                return
            host = _peer_host(stream) if ls.max_connections_per_address else None
            if host is not None:
                held = state.per_address.get(host, 0)
                if held >= ls.max_connections_per_address:
                    refuse(stream, "max_connections_per_address", ls.max_connections_per_address)
                    return
                state.per_address[host] = held + 1
            state.connections += 1
            nursery.start_soon(self._connection, state, stream, host)

        await accept_forever(
            listener,
            handle,
            name=ls.name,
            log=state.throttle,
            errors=self.metrics.accept_errors,
        )

    async def _connection(
        self, state: _ListenerState, stream: trio.abc.Stream, host: str | None = None
    ) -> None:
        ls = state.settings
        peer = state.transport.peer_name(stream)
        prefix = f"[{ls.name} {peer}]"
        plog = logging.getLogger(f"gateway.protocol.{ls.protocol}")
        throttle = state.throttle
        metrics = self.metrics
        metrics.connections.labels(listener=ls.name).inc()
        open_gauge = metrics.connections_open.labels(listener=ls.name)
        open_gauge.inc()
        errors = metrics.connection_errors.labels(listener=ls.name)
        account = self.budget.account(self.config.gateway.limits.connection_memory)

        def warn(reason: str, msg: str, *args: object) -> None:
            throttle.warning(f"{ls.name}:{reason}", f"{prefix} {msg}", *args)

        def refused(reason: str) -> None:
            metrics.refused_connections.labels(listener=ls.name, reason=reason).inc()

        try:
            try:
                # Handshakes run here, in the connection's task, never in the accept
                # loop: TLS first, then the transport's own (a WebSocket upgrade).
                identity = None
                stage = "TLS"
                try:
                    with trio.move_on_after(ls.handshake_timeout) as handshake:
                        if state.tls_layer is not None and state.tls_context is not None:
                            stream, identity = await state.tls_layer.wrap_server(
                                stream, state.tls_context
                            )
                        stage = state.transport.name
                        stream = await state.transport.accepted(stream, ls.bind)
                except Exception as e:
                    _handshake_failed(plog, warn, prefix, stage, e, errors)
                    return
                if handshake.cancelled_caught:
                    errors.inc()
                    refused("handshake_timeout")
                    warn("handshake_timeout", "%s handshake timed out; closing", stage)
                    return
                info = ConnectionInfo(
                    protocol=ls.protocol,
                    endpoint=ls.name,
                    peer=peer,
                    local=state.addresses[0] if state.addresses else "",
                    identity=identity,
                    tls=state.tls_context is not None,
                )
                conn: ServerConnection | None = None

                def touch() -> None:
                    if conn is not None:
                        conn.touch()

                guard = Guard(
                    account,
                    on_progress=touch,
                    on_abandoned=metrics.abandoned_publishes.labels(listener=ls.name).inc,
                    on_refused=refused,
                    warn=warn,
                )
                tracked = _TrackedStream(
                    stream,
                    metrics.bytes_received.labels(listener=ls.name),
                    metrics.bytes_sent.labels(listener=ls.name),
                    guard,
                )
                conn = ServerConnection(
                    tracked,
                    info,
                    ls,
                    self.facade,
                    self.draining,
                    metrics,
                    self._upstreams.get(ls.protocol),
                )
                tracked.conn = conn
                async with trio.open_nursery() as nursery:
                    if ls.idle_timeout > 0:
                        nursery.start_soon(_idle_watchdog, conn, guard, nursery.cancel_scope)
                    await state.plugin.serve(conn)
                    nursery.cancel_scope.cancel()
            except* ProtocolError as eg:
                # The peer's fault, not a fault of ours: each protocol counts its own.
                refused("protocol_error")
                warn("protocol_error", "protocol error: %s; closing", first_leaf(eg))
            except* trio.TooSlowError as eg:
                errors.inc()
                refused("timeout")
                warn("timeout", "timed out: %s; closing", first_leaf(eg))
            except* _LOST as eg:
                plog.info("%s connection lost: %s", prefix, first_leaf(eg))
            except* Exception as eg:
                errors.inc()
                plog.error("%s connection failed; closing it", prefix, exc_info=first_leaf(eg))
        finally:
            account.close()
            open_gauge.dec()
            state.connections -= 1
            if host is not None:
                left = state.per_address[host] - 1
                if left:
                    state.per_address[host] = left
                else:
                    del state.per_address[host]
            self._connection_ended.unpark_all()
            await trio.aclose_forcefully(stream)

    # -- upstreams -----------------------------------------------------------------
    def _connector(
        self, up: UpstreamSettings
    ) -> Callable[[str], Awaitable[tuple[trio.abc.Stream, ConnectionInfo]]]:
        """How ``up`` opens a connection to one of its addresses.

        The transport connects (within ``connect_timeout``); then, within
        ``handshake_timeout``, the ``tls`` layer's handshake if configured and
        the transport's own (:meth:`~gateway.transports.Transport.connected`).
        A handshake that fails or times out is a failed attempt (``OSError`` or
        ``trio.TooSlowError``): the upstream tries its next address.
        """
        tls_layer = self.registry.layer_for("tls") if up.tls else None
        tls_context = tls_layer.client_context(up.tls) if tls_layer and up.tls else None

        async def connect(address: str) -> tuple[trio.abc.Stream, ConnectionInfo]:
            transport = self.registry.transport_for(address)
            with trio.fail_after(up.connect_timeout):
                stream = await transport.connect(address)
            identity = None
            stage = "TLS"
            try:
                with trio.move_on_after(up.handshake_timeout) as handshake:
                    if tls_layer is not None and tls_context is not None:
                        stream, identity = await tls_layer.wrap_client(
                            stream, tls_context, _server_name(up, transport, address)
                        )
                    stage = transport.name
                    stream = await transport.connected(stream, address)
                if handshake.cancelled_caught:
                    raise trio.TooSlowError(
                        f"{stage} handshake timed out after {up.handshake_timeout:g}s"
                    )
            except ProtocolError as e:
                await trio.aclose_forcefully(stream)
                raise OSError(f"{stage} handshake failed: {e}") from e
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            return stream, ConnectionInfo(
                protocol=up.protocol,
                endpoint=up.name,
                peer=address,
                identity=identity,
                tls=tls_context is not None,
            )

        return connect

    async def _run_upstream(self, upstream: Upstream) -> None:
        plugin = self.plugins[upstream.settings.protocol]
        ctx = UpstreamContext(upstream, self.facade, self.metrics)
        while True:
            try:
                await plugin.run_upstream(ctx)
                ctx.log.warning("upstream stopped by its protocol; restarting")
            except* Exception as eg:
                ctx.log.error("upstream failed; restarting after backoff", exc_info=first_leaf(eg))
            await ctx.backoff.sleep()


async def _idle_watchdog(conn: ServerConnection, guard: Guard, scope: trio.CancelScope) -> None:
    """Close the connection once it made no useful progress for ``idle_timeout``.

    Progress is what the protocol's driver reports (see :class:`Guard`); a
    connection with work pending (unsettled publishes, open subscriptions) is
    never idle.
    """
    timeout = conn.listener.idle_timeout
    while True:
        now = trio.current_time()
        deadline = conn.last_activity + timeout
        if now >= deadline:
            if not (conn.busy or guard.pending()):
                guard.refused("idle")
                conn.log.info("no progress for %gs; closing", timeout)
                scope.cancel()
                return
            deadline = now + timeout
        await trio.sleep_until(deadline)


def _peer_host(stream: trio.abc.Stream) -> str | None:
    """The peer's IP address, for per-address limits (None: not an IP connection)."""
    sock = getattr(stream, "socket", None)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return None


def _server_name(up: UpstreamSettings, transport: Transport, address: str) -> str | None:
    if up.tls is not None and up.tls.server_name:
        return up.tls.server_name
    return transport.server_name(address)


def _handshake_failed(
    plog: logging.Logger,
    warn: Callable[..., None],
    prefix: str,
    stage: str,
    error: Exception,
    errors: Counter,
) -> None:
    """Log a server-side handshake that raised; only that connection closes."""
    leaf = first_leaf(error)
    if isinstance(leaf, _LOST):
        plog.info("%s connection lost during the %s handshake: %s", prefix, stage, leaf)
        return
    errors.inc()
    if isinstance(leaf, ProtocolError | trio.TooSlowError | ValueError):
        warn("handshake_failed", "%s handshake failed: %s; closing", stage, leaf)
    else:
        plog.error("%s %s handshake failed; closing", prefix, stage, exc_info=leaf)
