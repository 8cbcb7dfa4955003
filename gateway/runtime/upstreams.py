"""The gateway's upstreams: where they connect, and the task that keeps each one running.

An upstream is declared before anything runs: the destination
``upstream:NAME`` gets its group ``upstream`` at once, so messages routed to
it collect even while it is disconnected, and its endpoint (an
:class:`~gateway.protocol.plugin.Upstream`: addresses, failover, the
connector) is known to its protocol's listeners. Then its task runs the
protocol's ``run_upstream`` for ever, restarting it after its backoff when it
stops or fails, until a reload removes the upstream or the gateway stops.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from gateway.core.errors import ProtocolError, first_leaf
from gateway.core.facade import HubFacade
from gateway.ops.logsetup import log_context
from gateway.protocol.plugin import (
    ConnectionInfo,
    ProtocolPlugin,
    Upstream,
    UpstreamContext,
    UpstreamSettings,
)
from gateway.runtime.registry import Registry
from gateway.runtime.state import Shared
from gateway.transports.base import Transport

__all__ = ["Upstreams", "connector"]

Connector = Callable[[str], Awaitable[tuple[trio.abc.Stream, ConnectionInfo]]]


class Upstreams:
    """Every upstream of one gateway: endpoints, running tasks, contexts by name."""

    def __init__(
        self, shared: Shared, registry: Registry, plugins: dict[str, ProtocolPlugin]
    ) -> None:
        self._shared = shared
        self._registry = registry
        self._plugins = plugins
        self._scopes: dict[str, trio.CancelScope] = {}
        #: Each running upstream's context (state, last error) by name.
        self.contexts: dict[str, UpstreamContext] = {}

    def declare(self, up: UpstreamSettings, *, new: bool = False) -> Upstream:
        """Make ``up``'s destination collect, and its endpoint known; the endpoint.

        ``new``: an upstream a reload adds, which the hub does not know yet.
        """
        hub = self._shared.hub
        if new:
            hub.add_upstream(up.name)
        hub.destination(f"upstream:{up.name}").declare_group(UpstreamContext.group)
        endpoint = Upstream(up, connector(self._registry, up))
        self._shared.upstreams.setdefault(up.protocol, {})[up.name] = endpoint
        return endpoint

    def endpoint(self, up: UpstreamSettings) -> Upstream:
        return self._shared.upstreams[up.protocol][up.name]

    def start(self, nursery: trio.Nursery, endpoint: Upstream) -> None:
        """Run ``endpoint`` in ``nursery`` until :meth:`remove` or the nursery ends."""
        nursery.start_soon(self._run, endpoint, name=f"upstream {endpoint.name}")

    def remove(self, name: str) -> None:
        """Stop the upstream ``name`` (a reload removed or changed it)."""
        scope = self._scopes.pop(name, None)
        if scope is not None:
            scope.cancel()
        self.contexts.pop(name, None)

    async def _run(self, upstream: Upstream) -> None:
        with trio.CancelScope() as scope:
            self._scopes[upstream.name] = scope
            await self._forever(upstream)

    async def _forever(self, upstream: Upstream) -> None:
        """The protocol's ``run_upstream``, restarted after the backoff whenever it ends."""
        plugin = self._plugins[upstream.settings.protocol]
        log_context(upstream=upstream.name)
        metrics = self._shared.metrics
        received = metrics.upstream_messages_received.labels(upstream=upstream.name)
        ctx = UpstreamContext(upstream, HubFacade(self._shared.hub, received=received), metrics)
        self.contexts[upstream.name] = ctx
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


def connector(registry: Registry, up: UpstreamSettings) -> Connector:
    """How ``up`` opens a connection to one of its addresses.

    The transport connects (within ``connect_timeout``); then, within
    ``handshake_timeout``, the ``tls`` layer's handshake if configured and
    the transport's own (:meth:`~gateway.transports.Transport.connected`).
    A handshake that fails or times out is a failed attempt (``OSError`` or
    ``trio.TooSlowError``): the upstream tries its next address.
    """
    tls_layer = registry.layer_for("tls") if up.tls else None
    tls_context = tls_layer.client_context(up.tls) if tls_layer and up.tls else None

    async def connect(address: str) -> tuple[trio.abc.Stream, ConnectionInfo]:
        transport = registry.transport_for(address)
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


def _server_name(up: UpstreamSettings, transport: Transport, address: str) -> str | None:
    if up.tls is not None and up.tls.server_name:
        return up.tls.server_name
    return transport.server_name(address)
