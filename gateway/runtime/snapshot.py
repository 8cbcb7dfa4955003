"""The running gateway's objects read into a :class:`~gateway.ops.view.GatewaySnapshot`.

Each function reads one part (listeners, upstreams, destinations, the
budget, the store) into the plain data of :mod:`gateway.ops.view`, and
changes nothing. :meth:`Gateway.snapshot <gateway.runtime.gateway.Gateway.snapshot>`
puts them together.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import trio

from gateway.core.budget import MemoryBudget
from gateway.core.destination import Destination
from gateway.core.log import LogDestination
from gateway.core.topic import Topic
from gateway.durable.partitioned import PartitionedLog
from gateway.ops.metrics import Metrics
from gateway.ops.view import (
    BudgetView,
    DestinationView,
    GroupView,
    ListenerView,
    LogView,
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
    """Every destination's figures, by name."""
    return tuple(_destination(name, dest) for name, dest in sorted(destinations.items()))


def _destination(name: str, dest: Destination) -> DestinationView:
    stats: dict[str, Any] = dest.stats()
    parts = _log_parts(dest)
    if isinstance(dest, Topic):
        view = _topic(name, dest, stats)
    elif parts is not None:
        view = _log(name, dest, parts, stats)
    else:
        view = DestinationView(
            name=name, kind=dest.info.kind, backlog_messages=0, backlog_bytes=None
        )
    return _with_counts(view, dest, stats)


def _with_counts(
    view: DestinationView, dest: Destination, stats: dict[str, Any]
) -> DestinationView:
    """The messages a destination took, handed out and got acked, where it counts them
    (in its stats or as attributes; a log took everything up to its tail)."""
    counts: dict[str, int | None] = {}
    for key in ("received", "delivered", "acked"):
        value = stats.get(key, getattr(dest, key, None))
        counts[key] = value if isinstance(value, int) else None
    if counts["received"] is None and isinstance(dest, LogDestination):
        counts["received"] = dest.tail
    return dataclasses.replace(
        view, received=counts["received"], delivered=counts["delivered"], acked=counts["acked"]
    )


def _log_parts(dest: Destination) -> list[LogDestination] | None:
    """The logs a destination keeps: itself, each partition of a partitioned log, or
    None for a destination that keeps no log."""
    if isinstance(dest, LogDestination):
        return [dest]
    if isinstance(dest, PartitionedLog):
        return list(dest.parts)
    return None


def _topic(name: str, dest: Topic, stats: dict[str, Any]) -> DestinationView:
    """A topic or queue: every group's held copies, plus what departed anonymous
    subscribers left behind."""
    groups: dict[str, dict[str, Any]] = stats.get("groups", {})
    max_bytes = stats.get("buffer_bytes", dest.limits.max_bytes)
    max_messages = stats.get("buffer_messages", dest.limits.max_messages)
    orphaned_bytes = stats.get("backlog_bytes", getattr(dest, "backlog_bytes", 0))
    return DestinationView(
        name=name,
        kind=dest.kind,
        backlog_messages=sum(g["held"] for g in groups.values()) + stats.get("backlog", 0),
        backlog_bytes=sum(g["held_bytes"] for g in groups.values()) + orphaned_bytes,
        groups=tuple(
            GroupView(
                name=gname,
                members=g["members"],
                queued=g["queued"],
                unacked=g.get("unacked", g["held"] - g["queued"]),
                held=g["held"],
                held_bytes=g["held_bytes"],
                full=g["held"] >= max_messages or g["held_bytes"] >= max_bytes,
                filter=g.get("filter"),
            )
            for gname, g in groups.items()
        ),
        buffer_bytes=max_bytes,
        buffer_messages=max_messages,
        discarded=stats.get("discarded", 0),
        filtered=stats.get("filtered", 0),
        orphaned=stats.get("backlog", 0),
    )


def _log(
    name: str,
    dest: Destination,
    parts: list[LogDestination],
    stats: dict[str, Any],
) -> DestinationView:
    """A log, or a partitioned log summed over its partitions; "full" when any
    partition is. Its backlog: the most that any group has not committed."""
    groups: dict[str, dict[str, Any]] = stats.get("groups", {})
    first = parts[0]
    if isinstance(dest, LogDestination):
        backlog = max((dest.tail - g["committed"] for g in groups.values()), default=0)
        sizes = [g["backlog_bytes"] for g in groups.values() if "backlog_bytes" in g]
        backlog_bytes = max(sizes, default=0) if sizes or not groups else None
    else:
        # The partitioned log's stats sum each group's "behind" over the partitions.
        backlog = max((g["behind"] for g in groups.values()), default=0)
        backlog_bytes = None
    part_groups: list[tuple[int, dict[str, dict[str, Any]]]] = (
        [(first.tail, groups)]
        if len(parts) == 1
        else [(p.tail, cast("dict[str, dict[str, Any]]", p.stats()["groups"])) for p in parts]
    )
    return DestinationView(
        name=name,
        kind="log",
        backlog_messages=backlog,
        backlog_bytes=backlog_bytes,
        groups=tuple(_log_group(gname, part_groups) for gname in _group_names(part_groups)),
        log=LogView(
            first=sum(p.first for p in parts),
            next=sum(p.tail for p in parts),
            bytes=sum(p.retained_bytes for p in parts),
            retain=first.retain_bytes,
            overflow=first.overflow,
            full=any(p.full for p in parts),
            blocked=sum(p.blocked for p in parts),
            partitions=len(parts) if len(parts) > 1 else None,
        ),
    )


def _group_names(part_groups: list[tuple[int, dict[str, dict[str, Any]]]]) -> list[str]:
    return list(dict.fromkeys(g for _, gs in part_groups for g in gs))


def _log_group(name: str, part_groups: list[tuple[int, dict[str, dict[str, Any]]]]) -> GroupView:
    states = [(tail, gs[name]) for tail, gs in part_groups if name in gs]
    return GroupView(
        name=name,
        members=max(g["members"] for _, g in states),
        queued=sum(max(0, tail - g["next"]) for tail, g in states),
        unacked=sum(g["unacked"] for _, g in states),
        behind=sum(tail - g["committed"] for tail, g in states),
        committed=sum(g["committed"] for _, g in states),
        dropped=sum(g["dropped"] for _, g in states),
    )
