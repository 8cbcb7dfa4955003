"""One gateway's status and metrics from its workers' (``gateway run --workers N``).

Each worker of a supervisor is a whole gateway with its own counters. What
operators read is the gateway as one: :func:`merge` turns the workers'
:class:`~gateway.ops.view.GatewaySnapshot` into one snapshot, so that
:func:`gateway.ops.status.status` and readiness are computed as for a single
gateway, and :func:`merge_expositions` turns their Prometheus expositions
into one, each series labelled with its worker.

What :func:`merge` does with each figure:

- sums what counts or holds: connections, messages and bytes, in-flight
  publishes, the memory budget (limit, used, and peak: the sum of each
  worker's peak, an upper bound of the whole's), every destination's and
  group's counts and backlogs;
- keeps what identifies: names, protocols, bound addresses (the workers share
  the sockets), configured bounds (each worker's own: ``max_connections``,
  a destination's ``limit_bytes``);
- takes the worst of states: draining if any worker drains, an upstream
  connected only when every worker's is (else the state and last error of
  one that is not), a listener bound only when every worker serves it, a
  buffer as full as the fullest worker's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from gateway.core.destination import GroupFigures, LogFigures
from gateway.ops.view import (
    BudgetView,
    DestinationView,
    GatewaySnapshot,
    ListenerView,
    StoreView,
    UpstreamView,
)

__all__ = ["merge", "merge_expositions", "worker_summary"]

_T = TypeVar("_T")
#: Upstream states from the best to the worst.
_STATES = ("connected", "connecting", "backoff")


def merge(snapshots: Sequence[GatewaySnapshot]) -> GatewaySnapshot:
    """The gateway the workers' ``snapshots`` make together (see the module docstring)."""
    if not snapshots:
        raise ValueError("no snapshot to merge")
    first = snapshots[0]
    started = [s.started_at for s in snapshots]
    return GatewaySnapshot(
        version=first.version,
        time=max(s.time for s in snapshots),
        started_at=None if None in started else min(t for t in started if t is not None),
        draining=any(s.draining for s in snapshots),
        inflight=sum(s.inflight for s in snapshots),
        listeners=_by_name([s.listeners for s in snapshots], _listener),
        upstreams=_by_name([s.upstreams for s in snapshots], _upstream),
        destinations=_by_name([s.destinations for s in snapshots], _destination),
        budget=_budget([s.budget for s in snapshots]),
        store=_store([s.store for s in snapshots if s.store is not None]),
        config_path=first.config_path,
    )


def _by_name(groups: Sequence[Iterable[_T]], combine: Callable[[list[_T]], _T]) -> tuple[_T, ...]:
    """Items with the same ``name`` across ``groups`` combined, in first-seen order."""
    named: dict[str, list[_T]] = {}
    for items in groups:
        for item in items:
            named.setdefault(item.name, []).append(item)  # type: ignore[attr-defined]
    return tuple(combine(same) for same in named.values())


def _total(items: Sequence[Any], key: str) -> Any:
    return sum(getattr(item, key) for item in items)


def _total_or_none(items: Sequence[Any], key: str) -> Any:
    """The sum, or None when some item does not know it."""
    values = [getattr(item, key) for item in items]
    return None if None in values else sum(values)


def _listener(same: list[ListenerView]) -> ListenerView:
    sums = ("connections", "messages_in", "messages_out", "bytes_in", "bytes_out", "tls_refusals")
    last = max(same, key=lambda ls: ls.last_tls_refusal_at or 0.0)
    return replace(
        same[0],
        addresses=same[0].addresses if all(ls.addresses for ls in same) else (),
        last_tls_refusal=last.last_tls_refusal,
        last_tls_refusal_at=last.last_tls_refusal_at,
        **{key: _total(same, key) for key in sums},
    )


def _upstream(same: list[UpstreamView]) -> UpstreamView:
    worst = max(same, key=lambda up: _STATES.index(up.state) if up.state in _STATES else 0)
    errors = [up for up in same if up.last_error_at is not None]
    latest = max(errors, key=lambda up: up.last_error_at or 0.0) if errors else worst
    since = [up.connected_since for up in same]
    return replace(
        same[0],
        state=worst.state,
        last_error=latest.last_error,
        last_error_at=latest.last_error_at,
        connected_since=None if None in since else max(t for t in since if t is not None),
        messages_in=_total(same, "messages_in"),
    )


def _destination(same: list[DestinationView]) -> DestinationView:
    figures = [d.figures for d in same]
    first = figures[0]
    logs = [f.log for f in figures if f.log is not None]
    merged = replace(
        first,
        **{
            key: _total(figures, key)
            for key in (
                "received",
                "delivered",
                "acked",
                "backlog",
                "kept",
                "kept_bytes",
                "filtered",
            )
        },
        **{
            key: _total_or_none(figures, key) for key in ("backlog_bytes", "discarded", "unmatched")
        },
        kept_fill=max(f.kept_fill for f in figures),
        full=any(f.full for f in figures),
        groups=_by_name([f.groups for f in figures], _group),
        log=_log(logs) if logs else None,
    )
    return DestinationView(same[0].name, merged)


def _group(same: list[GroupFigures]) -> GroupFigures:
    fills = [g.fill for g in same if g.fill is not None]
    return replace(
        same[0],
        **{
            key: _total(same, key)
            for key in ("members", "queued", "unacked", "backlog", "dropped", "rejected")
        },
        **{key: _total_or_none(same, key) for key in ("backlog_bytes", "committed", "unmatched")},
        fill=max(fills) if fills else None,
    )


def _log(same: list[LogFigures]) -> LogFigures:
    sums = ("first", "next", "retained_bytes", "blocked", "held_by_storage")
    return replace(same[0], **{key: _total(same, key) for key in sums})


def _budget(same: list[BudgetView]) -> BudgetView:
    return BudgetView(
        limit=_total(same, "limit"),
        used=_total(same, "used"),
        peak=_total(same, "peak"),
        exhausted=any(b.exhausted for b in same),
    )


def _store(same: list[StoreView]) -> StoreView | None:
    """The first full store (it is what needs room), else the first one."""
    full = [s for s in same if s.full]
    return (full or same)[0] if same else None


def worker_summary(index: int, pid: int | None, taken: GatewaySnapshot | None) -> dict[str, Any]:
    """One worker's line of the status's ``workers`` breakdown (``running``: it answered)."""
    out: dict[str, Any] = {"index": index, "pid": pid, "running": taken is not None}
    if taken is None:
        return out
    return out | {
        "started_at": taken.started_at,
        "draining": taken.draining,
        "inflight": taken.inflight,
        "connections": sum(ls.connections for ls in taken.listeners),
        **{
            key: sum(getattr(ls, key) for ls in taken.listeners)
            for key in ("messages_in", "messages_out", "bytes_in", "bytes_out")
        },
        "memory_used": taken.budget.used,
    }


# -- metrics ---------------------------------------------------------------------------


class _Merged(Collector):
    """The families of several expositions, as one collector."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def merge_expositions(expositions: Mapping[str, bytes], label: str = "worker") -> bytes:
    """One Prometheus exposition of every series of ``expositions`` (key → its text),
    each series with ``label="KEY"`` added.

    The texts are parsed (prometheus_client's parser) and written again, so
    that a family every worker has appears once, with one HELP and TYPE line
    and every worker's samples. A family's help and type are the first
    exposition's that has it.
    """
    families: dict[str, Metric] = {}
    for key, text in expositions.items():
        for family in text_string_to_metric_families(text.decode("utf-8")):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for s in family.samples:
                merged.add_sample(
                    s.name, {**s.labels, label: key}, s.value, s.timestamp, s.exemplar
                )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(list(families.values())))
    return generate_latest(registry)
