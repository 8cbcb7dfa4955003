"""The running gateway as operations see it: a read-only view and its plain-data snapshot.

Status, the admin API, ``gateway top`` and the rates never hold the runtime's
objects. They read a :class:`GatewaySnapshot`: frozen dataclasses of strings,
numbers, booleans and tuples, taken at one moment, that change nothing in the
gateway and survive a trip through JSON (:meth:`GatewaySnapshot.to_json`,
:meth:`GatewaySnapshot.from_json`). A control plane in another process (the
workers of ``gateway run --workers N``) can therefore receive one per worker
and compute the same status from it.

What produces a snapshot is a :class:`GatewayView`: anything with a
``snapshot()`` method. The runtime's :class:`~gateway.runtime.gateway.Gateway`
is one; a test, or a control plane holding a snapshot it was sent, can
supply its own (:class:`Fixed`).

Acting on the gateway goes through interfaces as narrow: a reload through
:class:`gateway.ops.reload.Reloadable`, a tap through
:class:`gateway.ops.tap.Tappable`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol

from gateway.core.destination import DestinationFigures, GroupFigures, LogFigures

__all__ = [
    "BudgetView",
    "DestinationView",
    "Fixed",
    "GatewaySnapshot",
    "GatewayView",
    "ListenerView",
    "StoreView",
    "UpstreamView",
]


@dataclass(frozen=True)
class ListenerView:
    """One configured listener: where it is bound, its connections, its counters."""

    name: str
    protocol: str
    #: The destination its messages go to (``[[listeners]] destination``).
    destination: str
    #: Bound addresses (real ports); empty while not bound.
    addresses: tuple[str, ...]
    #: Connections open now.
    connections: int
    max_connections: int
    #: Counters since the start: messages and bytes, received and sent.
    messages_in: float = 0.0
    messages_out: float = 0.0
    bytes_in: float = 0.0
    bytes_out: float = 0.0
    #: TLS handshakes refused since the start, and the last one: the peer, the
    #: client certificate's subject if any, why; when (wall clock).
    tls_refusals: int = 0
    last_tls_refusal: str | None = None
    last_tls_refusal_at: float | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ListenerView:
        return cls(**{**data, "addresses": tuple(data["addresses"])})


@dataclass(frozen=True)
class UpstreamView:
    """One configured upstream: its state, its last error, what it received."""

    name: str
    protocol: str
    connect: tuple[str, ...]
    #: ``connecting``, ``connected`` or ``backoff`` (waiting to retry).
    state: str = "connecting"
    last_error: str | None = None
    #: Wall-clock times.
    last_error_at: float | None = None
    connected_since: float | None = None
    #: Messages received from the peer since the start.
    messages_in: float = 0.0

    @property
    def destination(self) -> str:
        """Where messages routed to this upstream wait."""
        return f"upstream:{self.name}"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UpstreamView:
        return cls(**{**data, "connect": tuple(data["connect"])})


@dataclass(frozen=True)
class DestinationView:
    """One destination by name, with its figures as the destination gave them.

    The figures (:class:`~gateway.core.destination.DestinationFigures`: kind,
    backlog, groups, bounds, counts, the log it keeps) come through the
    ``Destination`` interface, so nothing here depends on which class keeps
    the messages.
    """

    name: str
    figures: DestinationFigures

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> DestinationView:
        f = data["figures"]
        log = f.get("log")
        figures = DestinationFigures(
            **{
                **f,
                "groups": tuple(GroupFigures(**g) for g in f.get("groups", ())),
                "log": LogFigures(**log) if log is not None else None,
            }
        )
        return cls(name=data["name"], figures=figures)


@dataclass(frozen=True)
class BudgetView:
    """The gateway's memory budget (``[gateway] memory_budget``), in bytes."""

    limit: int
    used: int
    peak: int
    exhausted: bool


@dataclass(frozen=True)
class StoreView:
    """The embedded store's disk: full or not, and, when full, what it needs."""

    full: bool
    #: Bytes free (None: cannot be asked).
    free: int | None
    path: str | None = None
    #: The largest write that failed since the disk became full, in bytes.
    needed: int | None = None
    error: str | None = None
    what: str | None = None
    #: Writes refused since (each waits and is retried).
    held: int | None = None
    full_for_s: float | None = None


@dataclass(frozen=True)
class GatewaySnapshot:
    """The whole gateway at one moment, as plain data (see the module docstring)."""

    version: str
    #: When it was taken (wall clock).
    time: float
    #: When the gateway started (wall clock); None before it ran.
    started_at: float | None
    draining: bool
    #: Publishes not settled yet.
    inflight: int
    listeners: tuple[ListenerView, ...]
    upstreams: tuple[UpstreamView, ...]
    destinations: tuple[DestinationView, ...]
    budget: BudgetView
    store: StoreView | None = None
    #: The config file it runs (None: the embedded default).
    config_path: str | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able data: dicts, lists, strings, numbers, booleans, None."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GatewaySnapshot:
        """The snapshot :meth:`to_json` gave (its tuples may have become lists)."""
        store = data.get("store")
        return cls(
            **{
                **data,
                "listeners": tuple(ListenerView.from_json(x) for x in data["listeners"]),
                "upstreams": tuple(UpstreamView.from_json(x) for x in data["upstreams"]),
                "destinations": tuple(DestinationView.from_json(x) for x in data["destinations"]),
                "budget": BudgetView(**data["budget"]),
                "store": StoreView(**store) if store is not None else None,
            }
        )


class GatewayView(Protocol):
    """Anything that can say how a gateway is now (the runtime's ``Gateway`` can)."""

    def snapshot(self) -> GatewaySnapshot:
        """The gateway now; taking it changes nothing."""
        ...


@dataclass(frozen=True)
class Fixed:
    """A view of a snapshot one already has (sent by another process, built by a test)."""

    taken: GatewaySnapshot

    def snapshot(self) -> GatewaySnapshot:
        return self.taken
