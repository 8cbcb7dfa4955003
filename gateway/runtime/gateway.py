"""The runtime: listeners, connections and upstreams under one trio nursery.

Life of a gateway: set up its own instance of every protocol plugin the
config uses, bind every listener, start every upstream, serve; on a shutdown
request stop accepting, let in-flight publishes settle until the drain
deadline, cancel what is left, tear the plugins down (in reverse order) and
close the hub.

This module assembles the runtime's rooms, each a module of its own:

* :mod:`~gateway.runtime.state`: what listeners and connections share;
* :mod:`~gateway.runtime.listener`: bind, accept, admit or refuse;
* :mod:`~gateway.runtime.connection`: one connection, handshake to close
  (an error in one connection is logged with the peer address and closes
  that connection only);
* :mod:`~gateway.runtime.upstreams`: connect and keep each upstream running;
* :mod:`~gateway.runtime.drain`: let work finish at shutdown or for a removed
  listener;
* :mod:`~gateway.runtime.plugins`: set the protocol plugins up and down;
* :mod:`~gateway.runtime.endpoints`: the metrics and admin HTTP endpoints;
* :mod:`~gateway.runtime.snapshot`: the gateway read into the plain data
  operations see (:mod:`gateway.ops.view`).

Protections (docs/limits.md): connections per listener and per peer address,
an accept loop that survives running out of descriptors, a
:class:`~gateway.protocol.guard.Guard` on
every connection's stream (idle timeout on useful progress, partial input
charged to the gateway's memory budget, departed peers' work settled
as failed), and warnings rate-limited per listener and reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from gateway import __version__
from gateway.config.loader import Config, load
from gateway.core.budget import MemoryBudget
from gateway.core.destination import DestinationProvider
from gateway.core.facade import HubFacade
from gateway.core.hub import Hub
from gateway.core.peers import Peers
from gateway.core.remote import RemoteProvider
from gateway.core.routing import Router
from gateway.core.topic import TopicLimits
from gateway.ops.admin import Admin
from gateway.ops.loglines import line_guard
from gateway.ops.metrics import Metrics
from gateway.ops.reload import Plan, ReloadRefused
from gateway.ops.reload import plan as plan_reload
from gateway.ops.view import GatewaySnapshot
from gateway.protocol.plugin import (
    ListenerSettings,
    PluginEnv,
    PrefixLogger,
    ProtocolPlugin,
    UpstreamContext,
)
from gateway.runtime import plugins as plugin_life
from gateway.runtime import snapshot as read
from gateway.runtime.catalog import Catalog
from gateway.runtime.drain import drain, retire
from gateway.runtime.endpoints import serve_admin_endpoint, serve_metrics_endpoint
from gateway.runtime.listener import serve_listener
from gateway.runtime.peerlinks import serve_peers
from gateway.runtime.registry import Registry, default_registry
from gateway.runtime.state import ListenerState, Shared
from gateway.runtime.upstreams import Upstreams
from gateway.runtime.worker import take_peers

if TYPE_CHECKING:
    from gateway.store import Store

__all__ = ["Gateway"]

log = logging.getLogger("gateway.runtime")


class Gateway:
    """A configured gateway; ``await run()`` serves until :meth:`shutdown`.

    It is also what operations reach it through: a
    :class:`~gateway.ops.view.GatewayView` (:meth:`snapshot`) and a
    :class:`~gateway.ops.reload.Reloadable` (:meth:`reload`).
    """

    def __init__(self, config: Config, registry: Registry | None = None) -> None:
        self.config = config
        self.registry = registry or default_registry()
        limits = config.gateway.limits
        #: Bytes held across destinations and connections ([gateway] memory_budget).
        self.budget = MemoryBudget(limits.memory_budget)
        #: With ``--workers N``: this worker's index and every worker's link path.
        self._linked = take_peers()
        #: The ``[[destinations]]`` table, and the hub whose destinations it makes.
        self.catalog, self.hub = _hub(config, self.budget, self._linked)
        #: The hub as protocols see it.
        self.facade = HubFacade(self.hub)
        #: This gateway's own instance of every protocol its config uses, by name.
        self.plugins: dict[str, ProtocolPlugin] = {
            name: self.registry.protocol(name)()
            for name in sorted(
                {ls.protocol for ls in config.listeners} | {up.protocol for up in config.upstreams}
            )
        }
        self.metrics = Metrics()
        self._watch(self.metrics)
        #: What listeners and connections share (the hub, metrics, budget, drain events).
        self._shared = Shared(self.hub, self.metrics, self.budget, limits.connection_memory)
        self._upstreams = Upstreams(self._shared, self.registry, self.plugins)
        #: Set when draining starts; protocols stop taking new work.
        self.draining = self._shared.draining
        self._shutdown_requested = trio.Event()
        #: Where listeners and upstreams run (a reload starts new ones there).
        self._work: trio.Nursery | None = None
        #: One reload at a time: a second SIGHUP waits for the first.
        self._reload_lock = trio.Lock()
        self._listeners: dict[str, ListenerState] = {}
        #: True once every in-flight publish settled within the drain deadline.
        self.drained_cleanly: bool | None = None
        #: Publishes abandoned at shutdown (unsettled when the drain deadline passed).
        self.abandoned = 0
        #: Where ``GET /metrics`` is served (real ports), once running.
        self.metrics_addresses: list[str] = []
        #: Where the admin API and the status page are served (real ports), once running.
        self.admin_addresses: list[str] = []
        #: When :meth:`run` started (wall clock), for the uptime.
        self.started_at: float | None = None
        #: When every listener was bound and the gateway served (wall clock).
        self.serving_since: float | None = None
        #: The embedded segment store while running, if the config needs one.
        self.store: Store | None = None

    def _watch(self, metrics: Metrics) -> None:
        """Export the budget and the hub's figures on ``metrics``."""
        line_guard.suppressed = metrics.log_lines_suppressed
        metrics.memory_budget.set(self.budget.limit)
        budget = self.budget
        metrics.memory_used.set_function(lambda: budget.used)
        metrics.watch_hub(self.hub, lambda: [u.name for u in self.config.upstreams])

    # -- public ----------------------------------------------------------------
    @property
    def addresses(self) -> dict[str, list[str]]:
        """Listener name → the addresses it is bound to (real ports)."""
        return {name: list(s.addresses) for name, s in self._listeners.items()}

    def connections(self, listener: str) -> int:
        return self._listeners[listener].connections

    @property
    def upstream_contexts(self) -> dict[str, UpstreamContext]:
        """Each upstream's context (state, last error) by name, once running."""
        return self._upstreams.contexts

    @property
    def config_path(self) -> Path | None:
        """The file the running config came from (None: the embedded default)."""
        return self.config.path

    def read_config(self, path: Path) -> Config:
        """Read and check ``path`` with this gateway's registry (for a reload)."""
        return load(path, registry=self.registry)

    def snapshot(self) -> GatewaySnapshot:
        """The gateway now, as plain data (see :mod:`gateway.ops.view`); changes nothing."""
        return GatewaySnapshot(
            version=__version__,
            time=time.time(),
            started_at=self.started_at,
            draining=self.draining.is_set(),
            inflight=self.hub.inflight,
            listeners=read.listener_views(self.config.listeners, self._listeners, self.metrics),
            upstreams=read.upstream_views(
                self.config.upstreams, self.upstream_contexts, self.metrics
            ),
            destinations=read.destination_views(self.hub.destinations()),
            budget=read.budget_view(self.budget),
            store=read.store_view(self.store),
            config_path=str(self.config.path) if self.config.path is not None else None,
        )

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
        """A durable destination is configured, or a listener's protocol stores segments;
        only worker 0 of several opens the store (durable destinations live there)."""
        if self._linked is not None and self._linked[0] != 0:
            return False
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
                await self._link_workers(background)
                for name in self.catalog.names():
                    self.hub.destination(name)
                for up in self.config.upstreams:
                    self._upstreams.declare(up)
                ready = await plugin_life.set_up(
                    self.plugins, self._plugin_env(background), self.config.gateway.drain_timeout
                )
                try:
                    await self._serve(task_status)
                finally:
                    with trio.CancelScope(shield=True):
                        timeout = self.config.gateway.drain_timeout
                        await plugin_life.tear_down(self.plugins, ready, timeout)
                    background.cancel_scope.cancel()
        finally:
            if self.drained_cleanly is None and self.hub.inflight:
                # Stopped without a drain (a second signal, a crash): abandoned too.
                self.drained_cleanly = False
                self.abandoned = self.hub.inflight
            self.hub.close()

    async def _link_workers(self, nursery: trio.Nursery) -> None:
        """A worker of several: in-memory topics forward to the other workers, and
        stateful destinations are reached at their homes."""
        if self._linked is None or self.hub.peers is None:
            return
        await nursery.start(serve_peers, self.hub.peers, self._linked[1])

    def _plugin_env(self, nursery: trio.Nursery) -> Callable[[str], PluginEnv]:
        """What each plugin's ``setup`` gets, by plugin name."""

        def env(name: str) -> PluginEnv:
            return PluginEnv(
                hub=self.facade,
                metrics=self.metrics,
                nursery=nursery,
                listeners=[ls for ls in self.config.listeners if ls.protocol == name],
                upstreams=dict(self._shared.upstreams.get(name, {})),
                shutdown=self.draining,
                data_dir=self.config.gateway.data_dir,
                store=self.store,
                log=PrefixLogger(logging.getLogger(f"gateway.plugin.{name}"), f"plugin {name}"),
            )

        return env

    async def _serve(self, task_status: trio.TaskStatus[Gateway]) -> None:
        async with trio.open_nursery() as work:
            self._work = work
            for up in self.config.upstreams:
                self._upstreams.start(work, self._upstreams.endpoint(up))
            await self._start_endpoints(work)
            for ls in self.config.listeners:
                await self._start_listener(work, ls)
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
            self.abandoned = await drain(
                self._listeners.values(), self._shared, self.config.gateway.drain_timeout
            )
            self.drained_cleanly = not self.abandoned
            work.cancel_scope.cancel()

    async def _start_endpoints(self, work: trio.Nursery) -> None:
        """Bind and serve ``[metrics]`` and ``[admin]``, where configured."""
        config = self.config
        if config.metrics_bind is not None:
            self.metrics_addresses = await work.start(
                functools.partial(
                    serve_metrics_endpoint,
                    self.registry,
                    config.metrics_bind,
                    self.metrics,
                    max_connections=config.metrics_max_connections,
                    idle_timeout=config.metrics_idle_timeout,
                )
            )
        if config.admin_bind is not None:
            self.admin_addresses = await work.start(
                functools.partial(
                    serve_admin_endpoint,
                    self.registry,
                    config.admin_bind,
                    Admin(view=self, reloader=self, taps=self.hub),
                    self.metrics,
                    max_connections=config.admin_max_connections,
                    idle_timeout=config.admin_idle_timeout,
                )
            )

    async def _start_listener(self, work: trio.Nursery, ls: ListenerSettings) -> None:
        plugin = self.plugins[ls.protocol]
        await work.start(
            serve_listener,
            ls,
            plugin,
            self.registry,
            self._shared,
            self._listeners,
            name=f"listener {ls.name}",
        )

    # -- reload ----------------------------------------------------------------------
    async def reload(self, config: Config) -> Plan:
        """Apply ``config`` to the running gateway without dropping what it keeps.

        Raises :class:`~gateway.ops.reload.ReloadRefused` (nothing changed) when the
        new config cannot be applied without a restart or a certificate cannot
        be read; see :mod:`gateway.ops.reload` for what is kept, added and removed.
        A second reload waits for the first.
        """
        async with self._reload_lock:
            work = self._work
            if work is None or self.draining.is_set():
                raise ReloadRefused("the gateway is not serving")
            if self.serving_since is None:
                # The admin endpoint serves before the listeners are all started.
                raise ReloadRefused("the gateway is still starting its listeners")
            change = plan_reload(self.config, config, set(self.plugins))
            # Everything that can fail is prepared before anything changes.
            contexts = self._tls_contexts(change)
            for ls in change.keep_listeners:
                state = self._listeners[ls.name]
                state.settings = ls
                state.tls_context = contexts[ls.name]
            removed = [self._listeners[name] for name in change.remove_listeners]
            for state in removed:
                self._stop_accepting(state)
            for name in change.remove_upstreams:
                self._upstreams.remove(name)
            self._replace_config(config)
            for state in removed:
                # Its connections get the new config's drain_timeout to finish.
                work.start_soon(retire, state, self._shared, config.gateway.drain_timeout)
            for up in change.add_upstreams:
                self._upstreams.start(work, self._upstreams.declare(up, new=True))
            for ls in change.add_listeners:
                previous = self._listeners.get(ls.name)
                if previous is not None:  # changed: its sockets close before the new bind
                    await previous.closed.wait()
                await self._start_listener(work, ls)
            log.info("reloaded %s: %s", config.path or "the config", change.summary())
            return change

    def _tls_contexts(self, change: Plan) -> dict[str, ssl.SSLContext | None]:
        """The kept listeners' TLS contexts, their certificates read again."""
        contexts: dict[str, ssl.SSLContext | None] = {}
        for ls in change.keep_listeners:
            layer = self.registry.layer_for("tls") if ls.tls else None
            try:
                contexts[ls.name] = layer.server_context(ls.tls) if layer and ls.tls else None
            except (OSError, ValueError, ssl.SSLError) as e:
                raise ReloadRefused(f"listener {ls.name!r}: cannot load TLS: {e}") from e
        return contexts

    @staticmethod
    def _stop_accepting(state: ListenerState) -> None:
        """A removed listener stops accepting; its connections drain, then it is forgotten."""
        state.removed = True
        state.accept_scope.cancel()
        state.draining.set()

    def _replace_config(self, config: Config) -> None:
        """Routes, destination declarations, the drain timeout and the running config."""
        self.hub.router = Router(config.routes)
        self.catalog.replace(config.destinations)
        self.config.gateway.drain_timeout = config.gateway.drain_timeout
        self.config = dataclasses.replace(
            self.config,
            listeners=config.listeners,
            upstreams=config.upstreams,
            routes=config.routes,
            destinations=config.destinations,
            path=config.path,
        )

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run ``fn(*args)`` as a task of the serving gateway (a reload on SIGHUP)."""
        if self._work is None:
            raise RuntimeError("the gateway is not serving")
        self._work.start_soon(fn, *args)


def _hub(
    config: Config, budget: MemoryBudget, linked: tuple[int, list[str]] | None = None
) -> tuple[Catalog, Hub]:
    """The catalog of ``config``'s destinations and the hub it provides them to; a
    worker of several (``linked``: its index, every worker's link path) joins its
    peers, and reaches the stateful destinations homed elsewhere through proxies."""
    limits = config.gateway.limits
    catalog = Catalog(
        config.destinations, TopicLimits(limits.buffer_bytes, limits.buffer_messages, budget)
    )
    providers: list[DestinationProvider] = [catalog]
    peers = None
    if linked is not None:
        index, paths = linked
        peers = Peers(index, incarnation=os.getpid())
        workers = len(paths)
        providers.insert(
            0, RemoteProvider(peers, lambda name: catalog.home(name, workers), catalog.info)
        )
    hub = Hub(
        Router(config.routes),
        limits,
        providers=providers,
        upstreams=[u.name for u in config.upstreams],
        budget=budget,
    )
    if peers is not None:
        hub.join(peers)
    return catalog, hub
