"""The status of a running gateway, as plain JSON-able data.

:func:`snapshot` is what ``GET /api/status`` answers, what the status page
and ``gateway top`` render: listeners, upstreams, destinations with their
backlogs, the memory budget, rates, and *hints*, short sentences that
answer "why is my sender not acked?" from the same figures. It only reads:
taking a snapshot changes nothing in the gateway.

Rates come from a :class:`StatusTracker`, which samples counters (of the
gateway's :class:`~gateway.ops.metrics.Metrics`, and every destination's
backlog and message counts) into a small ring whenever a snapshot is asked
for, and divides the change over the last few seconds by the time it took.
A counter that does not exist (yet) counts as 0.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import trio

from gateway import __version__
from gateway.core.destination import Destination
from gateway.core.log import LogDestination
from gateway.core.topic import Topic
from gateway.durable.partitioned import PartitionedLog

if TYPE_CHECKING:
    from gateway.runtime.gateway import Gateway

__all__ = ["RATE_COUNTERS", "StatusTracker", "readiness", "snapshot"]

#: Counter families of :class:`~gateway.ops.metrics.Metrics` turned into rates:
#: (section, label, attribute, key in ``rates``). A family the gateway's
#: metrics do not have (yet) counts as 0.
RATE_COUNTERS: tuple[tuple[str, str, str, str], ...] = (
    ("listeners", "listener", "messages_received", "messages_in"),
    ("listeners", "listener", "messages_sent", "messages_out"),
    ("listeners", "listener", "bytes_received", "bytes_in"),
    ("listeners", "listener", "bytes_sent", "bytes_out"),
    ("upstreams", "upstream", "upstream_messages_received", "messages_in"),
)
#: Destinations a snapshot lists at most: those with the largest backlogs.
MAX_DESTINATIONS = 200

#: One sample: (section, name, key) → value.
_Sample = dict[tuple[str, str, str], float]


class StatusTracker:
    """A ring of counter samples of one gateway, for rates over the last ``window`` seconds.

    Samples are taken when a snapshot is asked for (at most every
    ``min_interval`` seconds), so a gateway nobody watches pays nothing.
    """

    def __init__(
        self,
        gateway: Gateway,
        *,
        window: float = 5.0,
        min_interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gateway = gateway
        self.window = window
        self.min_interval = min_interval
        self._clock = clock
        self._samples: deque[tuple[float, _Sample]] = deque(maxlen=32)

    def sample(self) -> None:
        """Read every counter and backlog now and keep the values."""
        self._samples.append((self._clock(), _read_counters(self.gateway)))

    def fresh(self) -> None:
        """Sample unless the last sample is younger than ``min_interval``."""
        if not self._samples or self._clock() - self._samples[-1][0] >= self.min_interval:
            self.sample()

    def rates(self) -> dict[str, dict[str, dict[str, float]]]:
        """Per second: section → name → key → rate.

        Over the samples of the last ``window`` seconds, or since the sample
        before the last when the window holds one only (nobody looked for a
        while). Counters never go down (a reset reads as 0); a backlog may,
        so its rate (change in messages waiting) may be negative.
        """
        out: dict[str, dict[str, dict[str, float]]] = {
            "listeners": {},
            "upstreams": {},
            "destinations": {},
        }
        if not self._samples:
            return out
        t1, last = self._samples[-1]
        t0, first = t1, last
        for t, values in reversed(self._samples):
            if t < t1 and (t >= t1 - self.window or t0 == t1):
                t0, first = t, values
        elapsed = t1 - t0
        for (section, name, key), value in last.items():
            rate = 0.0
            if elapsed > 0:
                rate = (value - first.get((section, name, key), value)) / elapsed
                if key != "backlog":
                    rate = max(0.0, rate)
            out.setdefault(section, {}).setdefault(name, {})[key] = round(rate, 3)
        return out


def _read_counters(gateway: Gateway) -> _Sample:
    """The counters of :data:`RATE_COUNTERS` (absent ones read 0), and every destination's
    backlog and message counts."""
    values: _Sample = {}
    names = {
        "listeners": [ls.name for ls in gateway.config.listeners],
        "upstreams": [up.name for up in gateway.config.upstreams],
    }
    for section, label, attribute, key in RATE_COUNTERS:
        for name in names[section]:
            values[(section, name, key)] = 0.0
        family = getattr(gateway.metrics, attribute, None)
        if family is None:
            continue
        for metric in family.collect():
            for s in metric.samples:
                name = s.labels.get(label)
                if s.name.endswith("_total") and name is not None:
                    values[(section, name, key)] = float(s.value)
    for name, dest in gateway.hub.destinations().items():
        stats: dict[str, Any] = dest.stats()
        values[("destinations", name, "backlog")] = float(_backlog(dest, stats)[0])
        counts = _counts(dest, stats)
        for key, count in (("messages_in", "received"), ("messages_out", "delivered")):
            if count in counts:
                values[("destinations", name, key)] = float(counts[count])
        if "acked" in counts:
            values[("destinations", name, "acked")] = float(counts["acked"])
            upstream = name.removeprefix("upstream:")
            if upstream != name:
                # What the peer acknowledged: the upstream's throughput.
                values[("upstreams", upstream, "messages_out")] = float(counts["acked"])
    return values


def _counts(dest: Destination, stats: dict[str, Any]) -> dict[str, int]:
    """The messages a destination took, handed out and got acked, where it counts them
    (in its stats or as attributes; a log took everything up to its tail)."""
    out = {}
    for key in ("received", "delivered", "acked"):
        value = stats.get(key, getattr(dest, key, None))
        if isinstance(value, int):
            out[key] = value
    if "received" not in out and isinstance(dest, LogDestination):
        out["received"] = dest.tail
    return out


def _log_parts(dest: Destination) -> list[LogDestination] | None:
    """The logs a destination keeps: itself, each partition of a partitioned log, or
    None for a destination that keeps no log."""
    if isinstance(dest, LogDestination):
        return [dest]
    if isinstance(dest, PartitionedLog):
        return list(dest.parts)
    return None


def readiness(gateway: Gateway) -> list[str]:
    """Why the gateway is not ready to take traffic; empty when it is.

    Ready: running, not draining, every listener bound and every upstream connected.
    """
    reasons = []
    if gateway.started_at is None:
        reasons.append("the gateway has not started")
    if gateway.draining.is_set():
        reasons.append("the gateway is draining (shutting down)")
    bound = gateway.addresses
    for ls in gateway.config.listeners:
        if not bound.get(ls.name):
            reasons.append(f"listener {ls.name} is not bound")
    for up in gateway.config.upstreams:
        ctx = gateway.upstream_contexts.get(up.name)
        state = ctx.state if ctx is not None else "connecting"
        if state != "connected":
            error = ctx.last_error if ctx is not None else None
            reasons.append(f"upstream {up.name} is {state}" + (f": {error}" if error else ""))
    store = _store(gateway)
    if store is not None and store["full"]:
        reasons.append(
            f"the store's disk is full ({store['path']}): a write of {store['needed']} bytes"
            f" failed with {store['error']}; {store['free']} bytes free"
        )
    return reasons


def _store(gateway: Gateway) -> dict[str, Any] | None:
    """The embedded store's disk: full or not, and what a full one needs."""
    store = gateway.store
    if store is None:
        return None
    space = store.space
    shortage = space.shortage
    out: dict[str, Any] = {"full": shortage is not None, "free": space.free_bytes()}
    if shortage is not None:
        out.update(
            path=shortage.path,
            needed=shortage.needed,
            error=shortage.error,
            what=shortage.what,
            held=shortage.refused,
            full_for_s=round(trio.current_time() - shortage.since, 3),
        )
    return out


def snapshot(gateway: Gateway, tracker: StatusTracker | None = None) -> dict[str, Any]:
    """The status of ``gateway`` now, as JSON-able data (see docs/operations.md)."""
    now = time.time()
    if tracker is not None:
        tracker.fresh()
    rates = tracker.rates() if tracker is not None else {}
    budget = gateway.budget
    destinations, destinations_total = _destinations(gateway)
    status: dict[str, Any] = {
        "version": __version__,
        "time": now,
        "uptime_s": round(now - gateway.started_at, 3) if gateway.started_at else 0.0,
        "draining": gateway.draining.is_set(),
        "ready": False,
        "not_ready": readiness(gateway),
        "inflight": gateway.hub.inflight,
        "listeners": [_listener(gateway, ls.name) for ls in gateway.config.listeners],
        "upstreams": [_upstream(gateway, up.name, now) for up in gateway.config.upstreams],
        "destinations": destinations,
        "destinations_total": destinations_total,
        "store": _store(gateway),
        "memory": {
            "limit": budget.limit,
            "used": budget.used,
            "peak": budget.peak,
            "exhausted": budget.exhausted,
        },
        "rates": {
            "window_s": tracker.window if tracker is not None else 0.0,
            **{k: rates.get(k, {}) for k in ("listeners", "upstreams", "destinations")},
        },
    }
    status["ready"] = not status["not_ready"]
    status["hints"] = hints(status)
    return status


def _listener(gateway: Gateway, name: str) -> dict[str, Any]:
    settings = next(ls for ls in gateway.config.listeners if ls.name == name)
    addresses = gateway.addresses.get(name, [])
    return {
        "name": name,
        "protocol": settings.protocol,
        "destination": settings.destination,
        "addresses": addresses,
        "bound": bool(addresses),
        "connections": gateway.connections(name) if addresses else 0,
        "max_connections": settings.max_connections,
    }


def _upstream(gateway: Gateway, name: str, now: float) -> dict[str, Any]:
    settings = next(up for up in gateway.config.upstreams if up.name == name)
    ctx = gateway.upstream_contexts.get(name)
    since = ctx.connected_since if ctx is not None else None
    return {
        "name": name,
        "protocol": settings.protocol,
        "connect": list(settings.connect),
        "destination": f"upstream:{name}",
        "state": ctx.state if ctx is not None else "connecting",
        "last_error": ctx.last_error if ctx is not None else None,
        "last_error_at": ctx.last_error_at if ctx is not None else None,
        "connected_since": since,
        "connected_for_s": round(now - since, 3) if since is not None else None,
    }


def _backlog(dest: Destination, stats: dict[str, Any]) -> tuple[int, int | None]:
    """Messages (and bytes, when known) a destination holds that are not settled yet.

    A topic's or queue's: every group's held copies (queued plus unacked), plus
    the copies departed anonymous subscribers left behind. A log's: the most
    that any group has not committed.
    """
    groups: dict[str, dict[str, Any]] = stats.get("groups", {})
    if isinstance(dest, Topic):
        messages = sum(g["held"] for g in groups.values()) + stats.get("backlog", 0)
        orphaned = stats.get("backlog_bytes", getattr(dest, "backlog_bytes", 0))
        nbytes = sum(g["held_bytes"] for g in groups.values()) + orphaned
        return messages, nbytes
    if isinstance(dest, LogDestination):
        messages = max((dest.tail - g["committed"] for g in groups.values()), default=0)
        sizes = [g["backlog_bytes"] for g in groups.values() if "backlog_bytes" in g]
        return messages, max(sizes, default=0) if sizes or not groups else None
    if isinstance(dest, PartitionedLog):
        # The partitioned log's stats sum each group's "behind" over the partitions.
        return max((g["behind"] for g in groups.values()), default=0), None
    return 0, None


def _destinations(gateway: Gateway) -> tuple[list[dict[str, Any]], int]:
    """Every destination's status by name, or the :data:`MAX_DESTINATIONS` with the
    largest backlogs; and how many exist."""
    found = [
        _destination(name, dest, dest.stats()) for name, dest in gateway.hub.destinations().items()
    ]
    if len(found) > MAX_DESTINATIONS:
        found.sort(key=lambda d: -d["backlog"]["messages"])
        del found[MAX_DESTINATIONS:]
    return sorted(found, key=lambda d: d["name"]), len(gateway.hub.destinations())


def _destination(name: str, dest: Destination, stats: dict[str, Any]) -> dict[str, Any]:
    messages, nbytes = _backlog(dest, stats)
    out: dict[str, Any] = {
        "name": name,
        "kind": dest.info.kind,
        "backlog": {"messages": messages, "bytes": nbytes},
        "groups": [],
    }
    groups: dict[str, dict[str, Any]] = stats.get("groups", {})
    if isinstance(dest, Topic):
        max_bytes = stats.get("buffer_bytes", dest.limits.max_bytes)
        max_messages = stats.get("buffer_messages", dest.limits.max_messages)
        out["kind"] = dest.kind
        out["limits"] = {"bytes": max_bytes, "messages": max_messages}
        out["discarded"] = stats.get("discarded", 0)
        out["filtered"] = stats.get("filtered", 0)
        out["orphaned"] = stats.get("backlog", 0)
        for gname, g in groups.items():
            out["groups"].append(
                {
                    "name": gname,
                    "anonymous": gname.startswith("~"),
                    "queued": g["queued"],
                    "unacked": g.get("unacked", g["held"] - g["queued"]),
                    "held": g["held"],
                    "held_bytes": g["held_bytes"],
                    "members": g["members"],
                    "full": g["held"] >= max_messages or g["held_bytes"] >= max_bytes,
                    **({"filter": g["filter"]} if "filter" in g else {}),
                }
            )
    elif (parts := _log_parts(dest)) is not None:
        # A partitioned log shows its partitions summed (offsets count messages
        # over all of them); "full" when any partition is.
        out["kind"] = "log"
        first = parts[0]
        out["log"] = {
            "first": sum(p.first for p in parts),
            "next": sum(p.tail for p in parts),
            "bytes": sum(p.retained_bytes for p in parts),
            "retain": first.retain_bytes,
            "overflow": first.overflow,
            "full": any(p.full for p in parts),
            "blocked": sum(p.blocked for p in parts),
            **({"partitions": len(parts)} if len(parts) > 1 else {}),
        }
        part_groups: list[tuple[int, dict[str, dict[str, Any]]]] = (
            [(first.tail, groups)]
            if len(parts) == 1
            else [(p.tail, cast("dict[str, dict[str, Any]]", p.stats()["groups"])) for p in parts]
        )
        for gname in dict.fromkeys(g for _, gs in part_groups for g in gs):
            states = [(tail, gs[gname]) for tail, gs in part_groups if gname in gs]
            out["groups"].append(
                {
                    "name": gname,
                    "anonymous": gname.startswith("~"),
                    "queued": sum(max(0, tail - g["next"]) for tail, g in states),
                    "unacked": sum(g["unacked"] for _, g in states),
                    "behind": sum(tail - g["committed"] for tail, g in states),
                    "committed": sum(g["committed"] for _, g in states),
                    "members": max(g["members"] for _, g in states),
                    "dropped": sum(g["dropped"] for _, g in states),
                }
            )
    out.update(_counts(dest, stats))
    return out


def hints(status: dict[str, Any]) -> list[dict[str, str]]:
    """Short answers to "why is my sender not acked?", read from a snapshot.

    Each is ``{"level": "warning" | "info", "subject": …, "text": …}``.
    """
    out: list[dict[str, str]] = []

    def hint(level: str, subject: str, text: str) -> None:
        out.append({"level": level, "subject": subject, "text": text})

    if status["draining"]:
        hint("warning", "gateway", "draining: no new connections; in-flight work is settling")
    memory = status["memory"]
    if memory["exhausted"]:
        hint(
            "warning",
            "memory",
            f"the memory budget is exhausted ({memory['used']} of {memory['limit']} bytes):"
            " publishes wait until consumers ack and free room",
        )
    store = status.get("store")
    if store and store["full"]:
        hint(
            "warning",
            "store",
            f"the disk under the store is full ({store['path']}; {store['free']} bytes free,"
            f" a write of {store['needed']} bytes failed): publishers to durable destinations"
            " are held and not acked until space is freed; readers go on",
        )
    for ls in status["listeners"]:
        if not ls["bound"]:
            hint("warning", f"listener {ls['name']}", "not bound: senders cannot connect")
        elif ls["connections"] >= ls["max_connections"]:
            hint(
                "warning",
                f"listener {ls['name']}",
                f"at max_connections ({ls['max_connections']}): new connections are refused",
            )
    upstreams = {f"upstream:{u['name']}": u for u in status["upstreams"]}
    for up in status["upstreams"]:
        if up["state"] != "connected":
            error = f" (last error: {up['last_error']})" if up["last_error"] else ""
            hint(
                "warning",
                f"upstream {up['name']}",
                f"{up['state']}{error}: messages routed to it wait in {up['destination']}"
                " and their senders are not acked until it delivers them",
            )
    for d in status["destinations"]:
        subject = f"destination {d['name']}"
        waiting = d["backlog"]["messages"]
        if d["name"] in upstreams:
            continue  # said with the upstream
        if d["kind"] == "log":
            log = d["log"]
            if log["full"] and log["overflow"] == "block" and d["groups"]:
                slowest = max(d["groups"], key=lambda g: g["behind"])
                waiting = log.get("blocked", 0)
                hint(
                    "warning",
                    subject,
                    f"the log is full (retain {log['retain']} bytes) and group"
                    f" {slowest['name']} has not committed {slowest['behind']} messages:"
                    + (
                        f" {_count(waiting, 'publish waits', 'publishes wait')} for room"
                        if waiting
                        else " publishers wait"
                    ),
                )
            continue
        for g in d["groups"]:
            if g["held"] and not g["members"]:
                hint(
                    "warning",
                    subject,
                    f"{_count(g['held'], 'message waits', 'messages wait')} in group {g['name']},"
                    " which has no subscriber:"
                    " their senders are acked only once a consumer acks them",
                )
            elif g["unacked"] and not g["queued"]:
                hint(
                    "info",
                    subject,
                    f"{_count(g['unacked'], 'message is', 'messages are')} delivered to group"
                    f" {g['name']} and not acked"
                    " yet: their senders wait for the consumers' acks",
                )
            elif g["queued"] and g["members"]:
                hint(
                    "info",
                    subject,
                    f"{_count(g['queued'], 'message', 'messages')} queued in group {g['name']}: its"
                    f" {_count(g['members'], 'subscriber has', 'subscribers have')} no credit"
                    " or window left",
                )
            if g["full"]:
                hint(
                    "warning",
                    subject,
                    f"group {g['name']} is full (buffer_bytes or buffer_messages): publishers wait",
                )
        if d.get("orphaned"):
            hint(
                "info",
                subject,
                f"{_count(d['orphaned'], 'message', 'messages')} left by a departed subscriber"
                f" {'waits' if d['orphaned'] == 1 else 'wait'} for a group",
            )
        if d.get("discarded") and not d["groups"] and not waiting:
            hint(
                "info",
                subject,
                f"{_count(d['discarded'], 'message was', 'messages were')} discarded: a topic with"
                " no subscriber keeps"
                " nothing (their senders were acked); make it a queue to keep them",
            )
    if status["inflight"] and not out:
        hint(
            "info",
            "gateway",
            f"{_count(status['inflight'], 'publish is', 'publishes are')} not settled yet"
            " (their senders wait for acks)",
        )
    return out


def _count(n: int, one: str, many: str) -> str:
    """``1 message waits``, ``2 messages wait``: a count with its words in agreement."""
    return f"{n} {one if n == 1 else many}"
