"""What the rooms of the runtime share: the gateway's services, each listener's state.

The runtime is split by what each part does (the gateway's life in
:mod:`~gateway.runtime.gateway`, listeners in :mod:`~gateway.runtime.listener`,
one connection in :mod:`~gateway.runtime.connection`, upstreams in
:mod:`~gateway.runtime.upstreams`, the drain in :mod:`~gateway.runtime.drain`).
They meet here: :class:`Shared` is what every listener and connection of
one gateway uses, :class:`ListenerState` what one listener and its
connections count and wait on. Neither holds the :class:`Gateway`, so no
part of the runtime imports the module that assembles them.
"""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass, field

import trio

from gateway.core.budget import MemoryBudget
from gateway.core.facade import HubFacade
from gateway.core.hub import Hub
from gateway.ops.loglines import Throttled
from gateway.ops.metrics import Metrics
from gateway.protocol.plugin import ListenerSettings, ProtocolPlugin, Upstream
from gateway.transports.base import StreamLayer, Transport

__all__ = ["ListenerState", "Shared"]


@dataclass
class Shared:
    """The gateway's services as its listeners and connections use them."""

    hub: Hub
    metrics: Metrics
    #: Bytes held across destinations and connections ([gateway] memory_budget).
    budget: MemoryBudget
    #: What one connection may hold partly received ([gateway] connection_memory).
    connection_memory: int
    #: Upstream endpoints by protocol, then name; a reload adds to it.
    upstreams: dict[str, dict[str, Upstream]] = field(default_factory=dict)
    #: Set when the gateway drains: protocols stop taking new work.
    draining: trio.Event = field(default_factory=trio.Event)
    #: Woken whenever a connection ends (a drain waits for all of them).
    connection_ended: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)


@dataclass
class ListenerState:
    """One listener: its settings, sockets, open connections and lifecycle events."""

    settings: ListenerSettings
    plugin: ProtocolPlugin
    transport: Transport
    tls_context: ssl.SSLContext | None
    #: The layer with the ``tls`` role, when the listener has a ``tls`` table.
    tls_layer: StreamLayer | None
    #: Warnings about this listener's connections, one per reason per interval.
    throttle: Throttled
    #: The hub as this listener's connections see it: it counts their messages.
    facade: HubFacade
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
    #: TLS handshakes refused since the start (counted here, not only in the
    #: metrics, so that the status shows them with or without ``[metrics]``).
    tls_refusals: int = 0
    #: The last refusal: the peer, the certificate's subject if any, why.
    last_tls_refusal: str | None = None
    #: When it happened (wall clock).
    last_tls_refusal_at: float | None = None

    @property
    def name(self) -> str:
        return self.settings.name

    def admit(self, host: str | None) -> str | None:
        """Count a new connection from ``host`` in, or say which limit refuses it.

        ``host`` is the peer's IP address (None: not an IP connection, or no
        per-address limit). The answer is the refusing limit's key, or None
        once the connection is counted (:meth:`release` counts it out).
        """
        ls = self.settings
        if self.connections >= ls.max_connections:
            return "max_connections"
        if host is not None:
            held = self.per_address.get(host, 0)
            if held >= ls.max_connections_per_address:
                return "max_connections_per_address"
            self.per_address[host] = held + 1
        self.connections += 1
        return None

    def tls_refused(self, what: str) -> None:
        """Count a refused TLS handshake; ``what`` says whose and why."""
        self.tls_refusals += 1
        self.last_tls_refusal = what
        self.last_tls_refusal_at = time.time()

    def release(self, host: str | None) -> None:
        """A connection :meth:`admit` counted in has ended."""
        self.connections -= 1
        if host is not None:
            left = self.per_address[host] - 1
            if left:
                self.per_address[host] = left
            else:
                del self.per_address[host]
