"""The running gateway's objects read into a :class:`~gateway.ops.view.GatewaySnapshot`.

Each function reads one part (listeners, upstreams, destinations, the
budget, the store) into the plain data of :mod:`gateway.ops.view`, and
changes nothing. :meth:`Gateway.snapshot <gateway.runtime.gateway.Gateway.snapshot>`
puts them together.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import trio

from gateway.core.budget import MemoryBudget
from gateway.core.destination import Destination
from gateway.ops.metrics import Metrics
from gateway.ops.view import (
    BudgetView,
    DestinationView,
    ListenerView,
    StoreView,
    UpstreamView,
)
from gateway.protocol.plugin import ListenerSettings, UpstreamContext, UpstreamSettings
from gateway.runtime.state import ListenerState

if TYPE_CHECKING:
    from gateway.store import Store

__all__ = ["budget_view", "destination_views", "listener_views", "store_view", "upstream_views"]

#: The listener counters of a snapshot: its field → the metrics family that counts it.
_LISTENER_COUNTERS = {
    "messages_in": "messages_received",
    "messages_out": "messages_sent",
    "bytes_in": "bytes_received",
    "bytes_out": "bytes_sent",
}


def _counter_values(metrics: Metrics, attribute: str, label: str) -> dict[str, float]:
    """A counter family's totals by the value of ``label`` (a family that does not
    exist reads as empty)."""
    family = getattr(metrics, attribute, None)
    if family is None:
        return {}
    out = {}
    for metric in family.collect():
        for s in metric.samples:
            name = s.labels.get(label)
            if s.name.endswith("_total") and name is not None:
                out[name] = float(s.value)
    return out


def listener_views(
    configured: Iterable[ListenerSettings],
    running: Mapping[str, ListenerState],
    metrics: Metrics,
) -> tuple[ListenerView, ...]:
    """Every configured listener: bound addresses, open connections, counters."""
    counters = {
        key: _counter_values(metrics, family, "listener")
        for key, family in _LISTENER_COUNTERS.items()
    }
    out = []
    for ls in configured:
        state = running.get(ls.name)
        out.append(
            ListenerView(
                name=ls.name,
                protocol=ls.protocol,
                destination=ls.destination,
                addresses=tuple(state.addresses) if state is not None else (),
                connections=state.connections if state is not None else 0,
                max_connections=ls.max_connections,
                tls_refusals=state.tls_refusals if state is not None else 0,
                last_tls_refusal=state.last_tls_refusal if state is not None else None,
                last_tls_refusal_at=state.last_tls_refusal_at if state is not None else None,
                **{key: values.get(ls.name, 0.0) for key, values in counters.items()},
            )
        )
    return tuple(out)


def upstream_views(
    configured: Iterable[UpstreamSettings],
    contexts: Mapping[str, UpstreamContext],
    metrics: Metrics,
) -> tuple[UpstreamView, ...]:
    """Every configured upstream: its state and last error, what it received."""
    received = _counter_values(metrics, "upstream_messages_received", "upstream")
    out = []
    for up in configured:
        ctx = contexts.get(up.name)
        out.append(
            UpstreamView(
                name=up.name,
                protocol=up.protocol,
                connect=tuple(up.connect),
                state=ctx.state if ctx is not None else "connecting",
                last_error=ctx.last_error if ctx is not None else None,
                last_error_at=ctx.last_error_at if ctx is not None else None,
                connected_since=ctx.connected_since if ctx is not None else None,
                messages_in=received.get(up.name, 0.0),
            )
        )
    return tuple(out)


def budget_view(budget: MemoryBudget) -> BudgetView:
    return BudgetView(
        limit=budget.limit, used=budget.used, peak=budget.peak, exhausted=budget.exhausted
    )


def store_view(store: Store | None) -> StoreView | None:
    """The embedded store's disk: full or not, and what a full one needs."""
    if store is None:
        return None
    space = store.space
    shortage = space.shortage
    if shortage is None:
        return StoreView(full=False, free=space.free_bytes())
    return StoreView(
        full=True,
        free=space.free_bytes(),
        path=shortage.path,
        needed=shortage.needed,
        error=shortage.error,
        what=shortage.what,
        held=shortage.refused,
        full_for_s=round(trio.current_time() - shortage.since, 3),
    )


def destination_views(destinations: Mapping[str, Destination]) -> tuple[DestinationView, ...]:
    """Every destination's figures, by name (see :meth:`Destination.figures`)."""
    return tuple(
        DestinationView(name, dest.figures()) for name, dest in sorted(destinations.items())
    )
