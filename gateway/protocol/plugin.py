"""What a protocol plugin implements, and what the runtime hands it.

A protocol registers its :class:`ProtocolPlugin` subclass in the
``interchange.protocols`` entry-point group. Each gateway makes its own
instance (two gateways in one process share nothing) and, before it binds
anything, awaits :meth:`ProtocolPlugin.setup` with a :class:`PluginEnv`: the
place to build connection pools, caches and background tasks, torn down by
:meth:`ProtocolPlugin.teardown` after the drain. The runtime then accepts
connections and calls :meth:`ProtocolPlugin.serve` once per connection with a
:class:`ServerConnection`; for each configured upstream it calls
:meth:`ProtocolPlugin.run_upstream` once with an :class:`UpstreamContext`,
which it expects to run (reconnecting as needed) until cancelled. Every
upstream is also an :class:`Upstream` endpoint that listeners of the same
protocol can connect to directly (a transparent proxy's pool).
"""

from __future__ import annotations

import errno
import logging
import os
import ssl
import time
from abc import ABC
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import trio

from gateway.core.destination import Subscription
from gateway.core.errors import ProtocolError, first_leaf
from gateway.core.facade import HubFacade
from gateway.core.model import PeerIdentity, Source
from gateway.core.routing import UPSTREAM_PREFIX
from gateway.ops.loglines import TEMPLATE
from gateway.ops.metrics import Metrics
from gateway.protocol.guard import guard_of
from gateway.protocol.options import Option

if TYPE_CHECKING:
    from gateway.store import Store

__all__ = [
    "Backoff",
    "ConnectionInfo",
    "Option",
    "PluginEnv",
    "PluginError",
    "ProtocolPlugin",
    "Role",
    "ServerConnection",
    "Upstream",
    "UpstreamContext",
]

Role = Literal["server", "client"]


class PrefixLogger(logging.LoggerAdapter):
    """Prefixes every record with where it happened (listener and peer address)."""

    def __init__(self, logger: logging.Logger, prefix: str) -> None:
        super().__init__(logger, {"prefix": prefix})
        self.prefix = prefix

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        # The template without the prefix: the log's rate limit counts lines of one
        # template together, whichever peer they are about (gateway.ops.loglines.LineGuard).
        kwargs["extra"] = {**(kwargs.get("extra") or {}), TEMPLATE: msg}
        return f"[{self.prefix}] {msg}", kwargs


class ProtocolPlugin(ABC):
    """A wire protocol: its codec driven over a stream, in one or both roles.

    Each gateway creates its own instance, with no arguments, for every
    protocol its configuration uses; state kept on ``self`` (pools, caches)
    belongs to that gateway alone.
    """

    #: The ``protocol = "…"`` name in config.
    name: ClassVar[str]
    #: Which roles it implements: ``server`` (listeners) and/or ``client`` (upstreams).
    roles: ClassVar[frozenset[Role]]
    #: The port the embedded default configuration listens on.
    default_port: ClassVar[int | None] = None
    #: One line for ``gateway plugins``.
    summary: ClassVar[str] = ""
    listener_options: ClassVar[Mapping[str, Option]] = {}
    upstream_options: ClassVar[Mapping[str, Option]] = {}
    #: True if its listeners use the embedded segment store (``PluginEnv.store``),
    #: which the gateway then opens (with such a listener) even without a durable
    #: destination.
    needs_store: ClassVar[bool] = False

    @classmethod
    def default_listener(cls) -> dict[str, Any]:
        """Extra keys for this protocol's listener in the embedded default config."""
        return {}

    @classmethod
    def upstream_receives(cls, options: dict[str, Any]) -> str | None:
        """The option (its key) with which an upstream of these ``options`` takes
        messages from its peer and publishes them locally, or None if it does not.

        With ``gateway run --workers N`` only worker 0 takes from the peer: the
        other workers run the upstream with this option at its default (they
        relay, and do not publish the same messages once more).
        """
        return None

    async def setup(self, env: PluginEnv) -> None:  # noqa: B027 (optional hook)
        """Prepare this gateway's instance before any listener binds (optional).

        Start background tasks in ``env.nursery``; they are cancelled after
        :meth:`teardown`. An exception here stops the gateway from starting,
        with the plugin named.
        """

    async def teardown(self) -> None:  # noqa: B027 (optional hook)
        """Release what :meth:`setup` built, once listeners and upstreams stopped (optional)."""

    async def serve(self, conn: ServerConnection) -> None:
        """Drive one accepted connection until it ends (server role)."""
        raise NotImplementedError(f"protocol {self.name!r} has no server role")

    async def run_upstream(self, ctx: UpstreamContext) -> None:
        """Run one configured upstream until cancelled (client role).

        Typically: forward what is routed to ``upstream:NAME`` to the peer
        (:meth:`UpstreamContext.subscribe`), and/or publish what the peer sends
        into local destinations (:attr:`UpstreamContext.hub`).
        """
        raise NotImplementedError(f"protocol {self.name!r} has no client role")


class PluginError(Exception):
    """A plugin failed to set up (or is unusable); the message names it."""


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Facts about one connection, for logs, metadata and authorization."""

    protocol: str
    #: The listener or upstream name.
    endpoint: str
    peer: str
    local: str = ""
    identity: PeerIdentity | None = None
    tls: bool = False


@dataclass(slots=True)
class ListenerSettings:
    name: str
    protocol: str
    bind: str
    destination: str
    max_connections: int = 1024
    #: Connections one peer address may hold at once (0: no limit; unix sockets: none).
    max_connections_per_address: int = 256
    handshake_timeout: float = 10.0
    #: Close a connection that made no progress (nothing received whole, nothing
    #: answered) and has nothing pending for this long (0: never).
    idle_timeout: float = 60.0
    tls: Any = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class UpstreamSettings:
    name: str
    protocol: str
    connect: list[str]
    connect_timeout: float = 10.0
    handshake_timeout: float = 10.0
    backoff_initial: float = 0.5
    backoff_max: float = 5.0
    tls: Any = None
    #: Where messages received from the peer are published (client roles that
    #: subscribe remotely); defaults to the upstream's name.
    destination: str = ""
    options: dict[str, Any] = field(default_factory=dict)


class ServerConnection:
    """One accepted connection, as a protocol's ``serve`` sees it."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        info: ConnectionInfo,
        listener: ListenerSettings,
        hub: HubFacade,
        shutdown: trio.Event,
        metrics: Metrics | None = None,
        upstreams: Mapping[str, Upstream] | None = None,
    ) -> None:
        self.stream = stream
        self.info = info
        self.listener = listener
        #: Publish, call, subscribe, destination info (see :class:`HubFacade`).
        self.hub = hub
        #: The gateway's metrics; a protocol adds its families here, labelled by listener.
        self.metrics = metrics or Metrics()
        #: Set when the gateway starts draining: finish in-flight work, take no new.
        self.shutdown = shutdown
        self.log = PrefixLogger(
            logging.getLogger(f"gateway.protocol.{info.protocol}"),
            f"{listener.name} {info.peer}",
        )
        #: Asked by the idle watchdog: True while the protocol has work pending
        #: (unacked publishes, open subscriptions), so the connection is kept. A
        #: :class:`~gateway.sdk.Session` reports its own through the stream's
        #: guard: set this only when driving the stream by hand.
        self.pending: Callable[[], bool] = _never
        self.last_activity = trio.current_time()
        self._upstreams = upstreams or {}

    @property
    def options(self) -> dict[str, Any]:
        """The listener's protocol-specific options, validated and defaulted."""
        return self.listener.options

    def upstream(self, name: str) -> Upstream:
        """The configured upstream ``name`` of this protocol, to connect to directly.

        The seam a transparent proxy uses: frames go to the upstream without
        the hub. Pool its connections in the plugin (built in
        :meth:`ProtocolPlugin.setup`), not per client connection.
        """
        try:
            return self._upstreams[name]
        except KeyError:
            known = ", ".join(sorted(self._upstreams)) or "none"
            raise LookupError(
                f"no {self.info.protocol} upstream named {name!r} (configured: {known})"
            ) from None

    def source(self) -> Source:
        """Source metadata for messages received now on this connection."""
        return Source(
            protocol=self.info.protocol,
            listener=self.listener.name,
            peer=self.info.peer,
            identity=self.info.identity,
            received_at=time.time(),
        )

    def touch(self) -> None:
        """Record useful progress: postpones the idle timeout.

        A :class:`~gateway.sdk.Session` reports progress by itself; a
        protocol driving its stream by hand calls this (until it does, every
        byte transferred counts, as before).
        """
        self.last_activity = trio.current_time()

    @property
    def busy(self) -> bool:
        """Whether the protocol has work pending: what its session reports, or
        :attr:`pending`."""
        if self.pending():
            return True
        guard = guard_of(self.stream)
        return guard is not None and guard.pending()


#: What ends one upstream connection but not the upstream.
_CONNECTION_LOST = (OSError, trio.BrokenResourceError, trio.TooSlowError, ProtocolError)

#: Opens a stream to one address of an upstream (transport, TLS and all).
Connector = Callable[[str], Awaitable[tuple[trio.abc.Stream, ConnectionInfo]]]


def _never() -> bool:
    return False


class Backoff:
    """Exponential reconnect delays: ``initial``, doubling up to ``maximum``."""

    def __init__(self, initial: float = 0.5, maximum: float = 5.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def reset(self) -> None:
        self._next = self.initial

    def next_delay(self) -> float:
        delay = self._next
        self._next = min(self.maximum, self._next * 2 if self._next > 0 else self.initial)
        return delay

    async def sleep(self) -> None:
        await trio.sleep(self.next_delay())


class Upstream:
    """A configured upstream as a place to connect to, with failover between its addresses.

    Its protocol's :meth:`~ProtocolPlugin.run_upstream` connects through it,
    and so can listeners of the same protocol (:meth:`ServerConnection.upstream`,
    :attr:`PluginEnv.upstreams`), e.g. to proxy frames to it from a pool.
    """

    def __init__(self, settings: UpstreamSettings, connector: Connector) -> None:
        self.settings = settings
        self.name = settings.name
        self._connector = connector
        self._next_address = 0

    @property
    def options(self) -> dict[str, Any]:
        """The upstream's protocol-specific options, validated and defaulted."""
        return self.settings.options

    async def connect(self) -> tuple[trio.abc.Stream, ConnectionInfo]:
        """Connect to the next address that answers, trying each once (failover).

        The stream has TLS (and any transport handshake) done; closing it is
        the caller's job. Raises ``OSError`` when no address answers.
        """
        addresses = self.settings.connect
        errors = []
        for i in range(len(addresses)):
            index = (self._next_address + i) % len(addresses)
            address = addresses[index]
            try:
                stream, info = await self._connector(address)
            except (OSError, trio.TooSlowError, trio.BrokenResourceError) as e:
                errors.append(f"{address}: {describe_error(e)}")
                continue
            self._next_address = index
            return stream, info
        # Next round starts after the one that failed first, spreading reconnects.
        self._next_address = (self._next_address + 1) % len(addresses)
        raise OSError("; ".join(errors) or "no address to connect to")


def describe_error(error: BaseException) -> str:
    """Name what went wrong with a connection, down to the socket error.

    trio's "all attempts to connect to … failed" keeps the reason (the
    ``ConnectionRefusedError``) in its cause; an operator needs the reason.
    """
    seen: list[BaseException] = []
    pending: list[BaseException] = [error]
    while pending and len(seen) < 16:
        e = pending.pop(0)
        seen.append(e)
        if isinstance(e, BaseExceptionGroup):
            pending.extend(e.exceptions)
        if e.__cause__ is not None:
            pending.append(e.__cause__)
    for e in seen:
        # An SSLError's errno is OpenSSL's SSL_ERROR_* code (1 is no EPERM).
        code = None if isinstance(e, ssl.SSLError) else getattr(e, "errno", None)
        if isinstance(code, int) and code in errno.errorcode:
            return f"{errno.errorcode[code]} ({os.strerror(code)})"
    if isinstance(error, trio.TooSlowError):
        return f"timed out{': ' + str(error) if str(error) else ''}"
    return str(error) or type(error).__name__


@dataclass(slots=True)
class PluginEnv:
    """What a plugin instance gets in :meth:`ProtocolPlugin.setup`."""

    #: The gateway's hub, as protocols see it.
    hub: HubFacade
    #: The gateway's metrics.
    metrics: Metrics
    #: For background tasks; cancelled after :meth:`ProtocolPlugin.teardown`.
    nursery: trio.Nursery
    #: This protocol's listeners in the config.
    listeners: Sequence[ListenerSettings]
    #: This protocol's upstreams by name, to connect to (pools, proxies).
    upstreams: Mapping[str, Upstream]
    #: Set when the gateway starts draining.
    shutdown: trio.Event
    #: The gateway's data directory (``[gateway] data_dir``).
    data_dir: Path
    log: logging.Logger | logging.LoggerAdapter[Any]
    #: The embedded segment store (``<data_dir>/store``), open while the gateway runs;
    #: None unless the config has a durable destination or a plugin ``needs_store``.
    store: Store | None = None


class UpstreamContext:
    """An upstream, as a protocol's ``run_upstream`` sees it.

    Egress: messages routed to ``upstream:NAME`` collect in :attr:`destination`
    under the group :attr:`group`; the protocol subscribes, sends them to the
    peer and acks each delivery only once the peer has acknowledged it.
    Ingress: a protocol whose client role subscribes to something remote
    publishes what arrives into :attr:`ingress` through :attr:`hub`, with
    :meth:`source` as its metadata, and acks the peer only once the receipt
    settles (the same rule as a listener).
    """

    group = "upstream"

    def __init__(
        self,
        upstream: Upstream,
        hub: HubFacade,
        metrics: Metrics | None = None,
    ) -> None:
        settings = upstream.settings
        self.settings = settings
        self.upstream = upstream
        #: Publish, call, subscribe, destination info (see :class:`HubFacade`).
        self.hub = hub
        #: The gateway's metrics; a protocol adds its families here, labelled by upstream.
        self.metrics = metrics or Metrics()
        labels = {"upstream": settings.name}
        self._connects = self.metrics.upstream_connects.labels(**labels)
        self._failures = self.metrics.upstream_failures.labels(**labels)
        self._connected = self.metrics.upstream_connected.labels(**labels)
        self.name = settings.name
        self.destination = UPSTREAM_PREFIX + settings.name
        #: The local destination for messages received from the peer.
        self.ingress = settings.destination or settings.name
        self.log = PrefixLogger(
            logging.getLogger(f"gateway.upstream.{settings.protocol}"), f"upstream {self.name}"
        )
        self.backoff = Backoff(settings.backoff_initial, settings.backoff_max)
        #: For the status page: "connecting", "connected" or "backoff" (waiting to retry).
        self.state = "connecting"
        #: The last failure to connect or lost connection, and when (wall clock), or None.
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        #: When the current connection was made (wall clock), or None.
        self.connected_since: float | None = None

    def failed(self, error: str) -> None:
        """Record a failure for the status page; the upstream now waits out its backoff."""
        self.state = "backoff"
        self.last_error = error
        self.last_error_at = time.time()

    @property
    def options(self) -> dict[str, Any]:
        return self.settings.options

    async def connect(self) -> tuple[trio.abc.Stream, ConnectionInfo]:
        """Connect to the next address that answers (see :meth:`Upstream.connect`)."""
        return await self.upstream.connect()

    def source(self, info: ConnectionInfo) -> Source:
        """Source metadata for messages received now from the peer on ``info``'s connection."""
        return Source(
            protocol=info.protocol,
            listener="",
            peer=info.peer,
            identity=info.identity,
            received_at=time.time(),
            upstream=self.name,
        )

    async def run_sessions(
        self, session: Callable[[trio.abc.Stream, ConnectionInfo], Awaitable[None]]
    ) -> None:
        """Connect (with failover), run ``session`` on the stream, repeat, forever.

        A session that returns ended cleanly (say, a connection TTL): reconnect
        at once. One that loses its connection, times out or meets a protocol
        error is logged, and the next connection waits out the backoff. The
        backoff starts over only after a connection that lasted
        ``backoff_max``: a peer that accepts and drops every connection is
        retried ever more slowly, not twice a second.
        """
        while True:
            self.state = "connecting"
            try:
                stream, info = await self.connect()
            except OSError as e:
                self._failures.inc()
                self.failed(describe_error(e))
                delay = self.backoff.next_delay()
                self.log.warning("cannot connect (%s); retrying in %gs", e, delay)
                await trio.sleep(delay)
                continue
            self.log.info("connected to %s", info.peer)
            self._connects.inc()
            self._connected.set(1)
            self.state, self.connected_since = "connected", time.time()
            connected_at = trio.current_time()
            lost = False
            try:
                async with stream:
                    await session(stream, info)
            except* _CONNECTION_LOST as eg:
                lost = True
                self._failures.inc()
                reason = describe_error(first_leaf(eg))
                self.failed(f"connection to {info.peer} lost: {reason}")
                self.log.warning("connection to %s lost: %s", info.peer, reason)
            finally:
                self._connected.set(0)
                self.connected_since = None
                if self.state == "connected":
                    self.state = "connecting"
            if not lost or trio.current_time() - connected_at >= self.backoff.maximum:
                self.backoff.reset()
            if lost:
                await self.backoff.sleep()

    def subscribe(
        self, *, max_unacked: int = 4096, max_unacked_bytes: int | None = None
    ) -> Subscription:
        """Join this upstream's group (every connection of the upstream competes).
        Its deliveries carry no positions: an upstream relays messages, not where a
        log keeps them."""
        return self.hub.subscribe(
            self.destination,
            self.group,
            max_unacked=max_unacked,
            max_unacked_bytes=max_unacked_bytes,
            positions=False,
        )
