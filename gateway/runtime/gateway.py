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

import contextlib
import dataclasses
import logging
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, cast

import trio
from prometheus_client import Counter

from gateway.config.loader import Config
from gateway.core.budget import MemoryBudget
from gateway.core.errors import ProtocolError, first_leaf
from gateway.core.facade import HubFacade
from gateway.core.hub import Hub
from gateway.core.routing import Router
from gateway.core.topic import TopicLimits
from gateway.ops.admin import serve_admin
from gateway.ops.loglines import Throttled, line_guard
from gateway.ops.logsetup import log_context
from gateway.ops.metrics import Metrics, Tally
from gateway.ops.metrics_http import serve_metrics
from gateway.ops.reload import Plan, ReloadRefused
from gateway.ops.reload import plan as plan_reload
from gateway.protocol.guard import Guard
from gateway.protocol.plugin import (
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
    describe_error,
)
from gateway.runtime.accept import accept_forever
from gateway.runtime.catalog import Catalog
from gateway.runtime.registry import Registry, default_registry
from gateway.transports.base import StreamLayer, Transport
from gateway.transports.nowait import NowaitSender, nowait_sender
from gateway.transports.tls import describe_handshake_failure, ssl_error_words

if TYPE_CHECKING:
    from gateway.store import Store

__all__ = ["Gateway"]

log = logging.getLogger("gateway.runtime.gateway")

_LOST = (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError, ConnectionError)


class _TrackedStream(trio.abc.Stream):
    """Passes everything through, counting bytes; carries the connection's :class:`Guard`.

    Until the protocol's driver reports progress itself (a
    :class:`~gateway.protocol.Session` does), every transfer counts as
    activity for the idle timeout, as a plugin of its own may expect.
    """

    def __init__(self, inner: trio.abc.Stream, received: Tally, sent: Tally, guard: Guard) -> None:
        self.inner = inner
        #: trio's name for the stream under a layer (the hang-up probe follows it).
        self.transport_stream = inner
        self.guard = guard
        self.conn: ServerConnection | None = None
        self._received = received
        self._sent = sent
        #: Bytes of this connection, for its closing log line.
        self.bytes_in = 0
        self.bytes_out = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self._received.inc(len(data))
        self.bytes_in += len(data)
        if self.conn is not None and not self.guard.reports_progress:
            self.conn.touch()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        self._count_sent(len(data))

    def nowait_sender(self) -> NowaitSender | None:
        """The inner stream's way to write without waiting, counting what it writes."""
        inner = nowait_sender(self.inner)
        if inner is None:
            return None

        def send(data: bytes | bytearray | memoryview) -> int:
            sent = inner(data)
            if sent:
                self._count_sent(sent)
            return sent

        return send

    def _count_sent(self, n: int) -> None:
        self._sent.inc(n)
        self.bytes_out += n
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
    #: Set when this listener's connections must finish: at shutdown, or when a
    #: reload removes the listener.
    draining: trio.Event = field(default_factory=trio.Event)
    #: Set once its sockets are closed (a reload may bind the same address again).
    closed: trio.Event = field(default_factory=trio.Event)
    #: The listener's whole task (a reload cancels a removed one after its drain).
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    #: A reload removed it: it is forgotten once its connections are gone.
    removed: bool = False
    #: The hub as this listener's connections see it: it counts their messages.
    facade: HubFacade | None = None


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
        #: Where listeners and upstreams run (a reload starts new ones there).
        self._work: trio.Nursery | None = None
        self._upstream_scopes: dict[str, trio.CancelScope] = {}
        #: One reload at a time: a second SIGHUP waits for the first.
        self._reload_lock = trio.Lock()
        self._listeners: dict[str, _ListenerState] = {}
        #: Woken whenever a connection ends (drain waits for all of them).
        self._connection_ended = trio.lowlevel.ParkingLot()
        #: True once every in-flight publish settled within the drain deadline.
        self.drained_cleanly: bool | None = None
        self.metrics = Metrics()
        line_guard.suppressed = self.metrics.log_lines_suppressed
        self.metrics.memory_budget.set(self.budget.limit)
        budget = self.budget
        self.metrics.memory_used.set_function(lambda: budget.used)
        self.metrics.watch_hub(self.hub, lambda: [u.name for u in self.config.upstreams])
        #: Publishes abandoned at shutdown (unsettled when the drain deadline passed).
        self.abandoned = 0
        #: Where ``GET /metrics`` is served (real ports), once running.
        self.metrics_addresses: list[str] = []
        #: Where the admin API and the status page are served (real ports), once running.
        self.admin_addresses: list[str] = []
        #: Each upstream's context (state, last error) by name, once running.
        self.upstream_contexts: dict[str, UpstreamContext] = {}
        #: When :meth:`run` started (wall clock), for the uptime.
        self.started_at: float | None = None
        #: When every listener was bound and the gateway served (wall clock).
        self.serving_since: float | None = None
        #: The embedded segment store while running, if the config needs one.
        self.store: Store | None = None

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
        """Open the store, set plugins up, bind, serve until :meth:`shutdown`, drain,
        tear down, close the store, return."""
        self.started_at = time.time()
        async with contextlib.AsyncExitStack() as stack:
            if self.needs_store:
                self.store = await stack.enter_async_context(self._open_store())
                self.catalog.store = self.store
                self.metrics.watch_store(self.store)
            await self._run(task_status)

    @property
    def needs_store(self) -> bool:
        """A durable destination is configured, or a listener's protocol stores segments."""
        return any(s.store for s in self.config.destinations) or any(
            self.plugins[ls.protocol].needs_store for ls in self.config.listeners
        )

    def _open_store(self) -> contextlib.AbstractAsyncContextManager[Store]:
        from gateway.store import Store

        settings = self.config.store
        directory = self.config.gateway.data_dir / "store"
        log.info("store: %s (fsync %s)", directory, settings.fsync)
        return Store.open(
            directory,
            fsync=settings.fsync,
            fsync_interval=settings.fsync_interval,
            chunk_bytes=settings.chunk_bytes,
            retain_age=settings.retain_age,
        )

    async def _run(self, task_status: trio.TaskStatus[Gateway]) -> None:
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
            self._work = work
            for up in self.config.upstreams:
                endpoint = self._upstreams[up.protocol][up.name]
                work.start_soon(self._run_upstream, endpoint, name=f"upstream {up.name}")
            if self.config.metrics_bind is not None:
                await work.start(self._serve_metrics, self.config.metrics_bind)
            if self.config.admin_bind is not None:
                await work.start(self._serve_admin, self.config.admin_bind)
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
            self.serving_since = time.time()
            task_status.started(self)
            await self._shutdown_requested.wait()
            await self._drain()
            work.cancel_scope.cancel()

    # -- reload ----------------------------------------------------------------------
    async def reload(self, config: Config) -> Plan:
        """Apply ``config`` to the running gateway without dropping what it keeps.

        Raises :class:`~gateway.ops.reload.ReloadRefused` (nothing changed) when the
        new config cannot be applied without a restart or a certificate cannot
        be read; see :mod:`gateway.ops.reload` for what is kept, added and removed.
        A second reload waits for the first.
        """
        async with self._reload_lock:
            if self._work is None or self.draining.is_set():
                raise ReloadRefused("the gateway is not serving")
            change = plan_reload(self.config, config, set(self.plugins))
            # Everything that can fail is prepared before anything changes.
            contexts: dict[str, ssl.SSLContext | None] = {}
            for ls in change.keep_listeners:
                layer = self.registry.layer_for("tls") if ls.tls else None
                try:
                    contexts[ls.name] = layer.server_context(ls.tls) if layer and ls.tls else None
                except (OSError, ValueError, ssl.SSLError) as e:
                    raise ReloadRefused(f"listener {ls.name!r}: cannot load TLS: {e}") from e
            for ls in change.keep_listeners:
                state = self._listeners[ls.name]
                state.settings = ls
                state.tls_context = contexts[ls.name]
            for name in change.remove_listeners:
                state = self._listeners[name]
                state.removed = True
                state.accept_scope.cancel()
                state.draining.set()
                self._work.start_soon(self._retire_listener, state)
            for name in change.remove_upstreams:
                scope = self._upstream_scopes.pop(name, None)
                if scope is not None:
                    scope.cancel()
                self.upstream_contexts.pop(name, None)
            self.hub.router = Router(config.routes)
            self.catalog.replace(config.destinations)
            self.config.gateway.drain_timeout = config.gateway.drain_timeout
            old = self.config
            self.config = dataclasses.replace(
                old,
                listeners=config.listeners,
                upstreams=config.upstreams,
                routes=config.routes,
                destinations=config.destinations,
                path=config.path,
            )
            for up in change.add_upstreams:
                self.hub.add_upstream(up.name)
                self.hub.destination(f"upstream:{up.name}").declare_group(UpstreamContext.group)
                endpoint = Upstream(up, self._connector(up))
                self._upstreams.setdefault(up.protocol, {})[up.name] = endpoint
                self._work.start_soon(self._run_upstream, endpoint, name=f"upstream {up.name}")
            for ls in change.add_listeners:
                previous = self._listeners.get(ls.name)
                if previous is not None:  # changed: its sockets close before the new bind
                    await previous.closed.wait()
                await self._work.start(self._serve_listener, ls, name=f"listener {ls.name}")
            log.info("reloaded %s: %s", config.path or "the config", change.summary())
            return change

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run ``fn(*args)`` as a task of the serving gateway (a reload on SIGHUP)."""
        if self._work is None:
            raise RuntimeError("the gateway is not serving")
        self._work.start_soon(fn, *args)

    async def _retire_listener(self, state: _ListenerState) -> None:
        """A removed listener's connections get ``drain_timeout`` to finish, then stop."""
        with trio.move_on_after(self.config.gateway.drain_timeout):
            while state.connections:
                await self._connection_ended.park()
        state.scope.cancel()

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
                store=self.store,
                log=PrefixLogger(
                    logging.getLogger(f"gateway.protocol.plugin.{name}"), f"plugin {name}"
                ),
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
        for state in self._listeners.values():
            state.draining.set()
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

    async def _listen_plain(
        self, bind: str, what: str
    ) -> tuple[list[trio.SocketListener], list[str]]:
        """Bind an HTTP endpoint (``what``: metrics, admin): its listeners and their names."""
        transport = self.registry.transport_for(bind)
        if transport.handshakes:
            # Plain HTTP: the transport's handshake would never run.
            raise OSError(
                f"{what} cannot bind {bind}: the {transport.name} transport has a handshake "
                f"of its own, and the {what} endpoint is plain HTTP (use host:port or unix:)"
            )
        try:
            listeners = await transport.listen(bind)
        except OSError as e:
            raise OSError(e.errno, f"{what} cannot bind {bind}: {e.strerror or e}") from None
        # The endpoints only accept and read bytes: any listener of a plain transport does.
        plain = cast("list[trio.SocketListener]", list(listeners))
        return plain, [transport.listener_name(sl) for sl in listeners]

    async def _serve_admin(
        self, bind: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners, self.admin_addresses = await self._listen_plain(bind, "admin")
        log.info("admin: status page and /api/status on %s", " ".join(self.admin_addresses))
        task_status.started()
        await serve_admin(
            self,
            listeners,
            max_connections=self.config.admin_max_connections,
            idle_timeout=self.config.admin_idle_timeout,
        )

    async def _serve_metrics(
        self, bind: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        listeners, self.metrics_addresses = await self._listen_plain(bind, "metrics")
        log.info("metrics: GET /metrics on %s", " ".join(self.metrics_addresses))
        task_status.started()
        # serve_metrics only accepts and reads bytes: any listener of a plain transport does.
        await serve_metrics(
            self.metrics,
            listeners,
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
            self.metrics.messages_received,
            self.metrics.messages_sent,
        ):
            family.labels(listener=ls.name)  # every series from 0, before any connection
        state.facade = HubFacade(
            self.hub,
            received=self.metrics.messages_received.labels(listener=ls.name),
            sent=self.metrics.messages_sent.labels(listener=ls.name),
        )
        try:
            with state.scope:
                async with trio.open_nursery() as nursery:
                    with state.accept_scope:
                        async with trio.open_nursery() as accepting:
                            for sl in listeners:
                                accepting.start_soon(self._accept_loop, state, sl, nursery)
                            task_status.started()
                    # Accepting stopped; connections in ``nursery`` go on until cancelled.
                    for sl in listeners:
                        await trio.aclose_forcefully(sl)
                    state.closed.set()
        finally:
            for sl in listeners:
                await trio.aclose_forcefully(sl)
            state.closed.set()
            if state.removed and self._listeners.get(ls.name) is state:
                del self._listeners[ls.name]

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
            state.throttle.logger.debug(
                "[%s %s] connection refused: %s",
                ls.name,
                state.transport.peer_name(stream),
                reason.replace("_", " "),
                extra={"listener": ls.name, "close_reason": reason.replace("_", " ")},
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
        started = trio.current_time()
        #: Why the connection closed, for its closing line (the first reason given wins).
        why = ""
        tracked: _TrackedStream | None = None
        log_context(listener=ls.name, peer=peer)
        plog.debug("%s connection accepted", prefix)

        def warn(reason: str, msg: str, *args: object) -> None:
            throttle.warning(f"{ls.name}:{reason}", f"{prefix} {msg}", *args)

        def refused(reason: str) -> None:
            nonlocal why
            why = why or reason.replace("_", " ")
            metrics.refused_connections.labels(listener=ls.name, reason=reason).inc()

        def tls_failed(reason: str, detail: str) -> None:
            nonlocal why
            why = why or f"TLS handshake failed: {reason.replace('_', ' ')}"
            metrics.tls_handshake_failures.labels(listener=ls.name, reason=reason).inc()
            throttle.info(
                f"{ls.name}:tls:{reason}",
                f"{prefix} TLS handshake failed (%s): %s",
                reason.replace("_", " "),
                detail,
            )

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
                    why = _handshake_failed(plog, warn, prefix, stage, e, errors, tls_failed)
                    return
                if handshake.cancelled_caught:
                    errors.inc()
                    refused("handshake_timeout")
                    if stage == "TLS":
                        metrics.tls_handshake_failures.labels(
                            listener=ls.name, reason="timeout"
                        ).inc()
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
                    state.facade or self.facade,
                    state.draining,
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
                lost = _lost_reason(first_leaf(eg))
                why = why or f"lost: {lost}"
                plog.info("%s connection lost: %s", prefix, lost)
            except* Exception as eg:
                errors.inc()
                why = why or f"error: {type(first_leaf(eg)).__name__}"
                plog.error("%s connection failed; closing it", prefix, exc_info=first_leaf(eg))
        finally:
            if plog.isEnabledFor(logging.DEBUG):
                why = why or ("shutdown" if self.draining.is_set() else "peer closed")
                duration = trio.current_time() - started
                bytes_in = tracked.bytes_in if tracked is not None else 0
                bytes_out = tracked.bytes_out if tracked is not None else 0
                plog.debug(
                    "%s connection closed after %.3fs (%s): %d bytes in, %d bytes out",
                    prefix,
                    duration,
                    why,
                    bytes_in,
                    bytes_out,
                    extra={
                        "duration": round(duration, 6),
                        "close_reason": why,
                        "bytes_in": bytes_in,
                        "bytes_out": bytes_out,
                    },
                )
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
        with trio.CancelScope() as scope:
            self._upstream_scopes[upstream.name] = scope
            await self._upstream_forever(upstream)

    async def _upstream_forever(self, upstream: Upstream) -> None:
        plugin = self.plugins[upstream.settings.protocol]
        log_context(upstream=upstream.name)
        received = self.metrics.upstream_messages_received.labels(upstream=upstream.name)
        ctx = UpstreamContext(upstream, HubFacade(self.hub, received=received), self.metrics)
        self.upstream_contexts[upstream.name] = ctx
        while True:
            try:
                await plugin.run_upstream(ctx)
                ctx.log.warning("upstream stopped by its protocol; restarting")
                ctx.failed("stopped by its protocol")
            except* Exception as eg:
                ctx.log.error("upstream failed; restarting after backoff", exc_info=first_leaf(eg))
                leaf = first_leaf(eg)
                ctx.failed(f"failed: {type(leaf).__name__}: {leaf}")
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
    tls_failed: Callable[[str, str], None],
) -> str:
    """Log a server-side handshake that raised (only that connection closes); say why.

    A TLS handshake the peer broke (a certificate refused, no certificate, not
    TLS at all, a hang-up) goes to ``tls_failed`` with its reason and OpenSSL's
    words for it.
    """
    leaf = first_leaf(error)
    if isinstance(leaf, _LOST):
        if stage == "TLS":
            reason, detail = describe_handshake_failure(leaf)
            tls_failed(reason, detail)
            return f"TLS handshake failed: {reason.replace('_', ' ')}"
        lost = _lost_reason(leaf)
        plog.info("%s connection lost during the %s handshake: %s", prefix, stage, lost)
        return f"lost: {lost}"
    errors.inc()
    if isinstance(leaf, ProtocolError | trio.TooSlowError | ValueError):
        warn("handshake_failed", "%s handshake failed: %s; closing", stage, leaf)
    else:
        plog.error("%s %s handshake failed; closing", prefix, stage, exc_info=leaf)
    return f"{stage} handshake failed"


def _lost_reason(error: BaseException) -> str:
    """Why a connection broke, in words: OpenSSL's, the socket error's, or trio's."""
    e: BaseException | None = error
    for _ in range(8):
        if e is None:
            break
        if isinstance(e, ssl.SSLError):
            return ssl_error_words(e)
        e = e.__cause__ or e.__context__
    return describe_error(error)
