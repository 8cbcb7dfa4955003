"""The status of a running gateway, as plain JSON-able data.

:func:`status` is what ``GET /api/status`` answers, what the status page and
``gateway top`` render: listeners, upstreams, destinations with their
backlogs, the memory budget, rates, and *hints*, short sentences that answer
"why is my sender not acked?" from the same figures. It is computed from a
:class:`~gateway.ops.view.GatewaySnapshot` alone, so it needs no running
gateway in the same process: :func:`snapshot` takes one from a
:class:`~gateway.ops.view.GatewayView` and computes the status of it.

Rates come from a :class:`StatusTracker`, which keeps the counters of recent
snapshots (every listener's messages and bytes, every upstream's messages,
every destination's backlog and message counts) in a small ring and divides
the change over the last few seconds by the time it took.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from gateway.core.destination import GroupFigures, LogFigures
from gateway.ops.view import (
    DestinationView,
    GatewaySnapshot,
    GatewayView,
    ListenerView,
    StoreView,
    UpstreamView,
)

__all__ = ["StatusTracker", "hints", "readiness", "snapshot", "status"]

#: Destinations a status lists at most: those with the largest backlogs.
MAX_DESTINATIONS = 200
#: Seconds a listener's last refused TLS handshake stays a hint.
TLS_HINT_WINDOW = 900.0
#: The listener counters turned into rates, by their key in ``rates``.
_LISTENER_COUNTERS = ("messages_in", "messages_out", "bytes_in", "bytes_out")

#: One sample: (section, name, key) → value.
_Sample = dict[tuple[str, str, str], float]


class StatusTracker:
    """A ring of counter samples of one gateway, for rates over the last ``window`` seconds.

    Samples are taken when a status is asked for (at most every
    ``min_interval`` seconds), so a gateway nobody watches pays nothing. A
    sample is read from a snapshot: the one a status is computed from, or
    else a new one of ``view``.
    """

    def __init__(
        self,
        view: GatewayView | None = None,
        *,
        window: float = 5.0,
        min_interval: float = 0.25,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.view = view
        self.window = window
        self.min_interval = min_interval
        self._clock = clock
        self._samples: deque[tuple[float, _Sample]] = deque(maxlen=32)

    def sample(self, taken: GatewaySnapshot | None = None) -> None:
        """Keep the counters and backlogs of ``taken`` (default: the view now)."""
        if taken is None:
            if self.view is None:
                raise ValueError("a tracker without a view samples only snapshots it is given")
            taken = self.view.snapshot()
        self._samples.append((self._clock(), _read_counters(taken)))

    def fresh(self, taken: GatewaySnapshot | None = None) -> None:
        """Sample unless the last sample is younger than ``min_interval``."""
        if not self._samples or self._clock() - self._samples[-1][0] >= self.min_interval:
            self.sample(taken)

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


def _read_counters(taken: GatewaySnapshot) -> _Sample:
    """Every listener's and upstream's counters, and every destination's backlog and
    message counts."""
    values: _Sample = {}
    for ls in taken.listeners:
        for key in _LISTENER_COUNTERS:
            values[("listeners", ls.name, key)] = float(getattr(ls, key))
    for up in taken.upstreams:
        values[("upstreams", up.name, "messages_in")] = up.messages_in
    for d in taken.destinations:
        f = d.figures
        values[("destinations", d.name, "backlog")] = float(f.backlog)
        values[("destinations", d.name, "messages_in")] = float(f.received)
        values[("destinations", d.name, "messages_out")] = float(f.delivered)
        values[("destinations", d.name, "acked")] = float(f.acked)
        upstream = d.name.removeprefix("upstream:")
        if upstream != d.name:
            # What the peer acknowledged: the upstream's throughput.
            values[("upstreams", upstream, "messages_out")] = float(f.acked)
    return values


def readiness(taken: GatewaySnapshot) -> list[str]:
    """Why the gateway is not ready to take traffic; empty when it is.

    Ready: running, not draining, every listener bound and every upstream connected.
    """
    reasons = []
    if taken.started_at is None:
        reasons.append("the gateway has not started")
    if taken.draining:
        reasons.append("the gateway is draining (shutting down)")
    for ls in taken.listeners:
        if not ls.addresses:
            reasons.append(f"listener {ls.name} is not bound")
    for up in taken.upstreams:
        if up.state != "connected":
            error = f": {up.last_error}" if up.last_error else ""
            reasons.append(f"upstream {up.name} is {up.state}{error}")
    store = taken.store
    if store is not None and store.full:
        reasons.append(
            f"the store's disk is full ({store.path}): a write of {store.needed} bytes"
            f" failed with {store.error}; {store.free} bytes free"
        )
    return reasons


def snapshot(view: GatewayView, tracker: StatusTracker | None = None) -> dict[str, Any]:
    """The status of the gateway ``view`` shows, now (see docs/operations.md)."""
    return status(view.snapshot(), tracker)


def status(taken: GatewaySnapshot, tracker: StatusTracker | None = None) -> dict[str, Any]:
    """The status of the gateway as ``taken`` shows it, as JSON-able data.

    With a ``tracker``, ``taken`` is sampled into it (unless it sampled very
    recently) and the rates are its rates; without one, there are none.
    """
    if tracker is not None:
        tracker.fresh(taken)
    rates = tracker.rates() if tracker is not None else {}
    now = taken.time
    destinations = [_destination(d) for d in taken.destinations]
    if len(destinations) > MAX_DESTINATIONS:
        destinations.sort(key=lambda d: -d["backlog"]["messages"])  # the largest stay
        del destinations[MAX_DESTINATIONS:]
    budget = taken.budget
    out: dict[str, Any] = {
        "version": taken.version,
        "time": now,
        "uptime_s": round(now - taken.started_at, 3) if taken.started_at else 0.0,
        "draining": taken.draining,
        "ready": False,
        "not_ready": readiness(taken),
        "inflight": taken.inflight,
        "listeners": [_listener(ls) for ls in taken.listeners],
        "upstreams": [_upstream(up, now) for up in taken.upstreams],
        "destinations": sorted(destinations, key=lambda d: d["name"]),
        "destinations_total": len(taken.destinations),
        "store": _store(taken.store),
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
    out["ready"] = not out["not_ready"]
    out["hints"] = hints(out)
    return out


def _store(store: StoreView | None) -> dict[str, Any] | None:
    """The embedded store's disk: full or not, and what a full one needs."""
    if store is None:
        return None
    out: dict[str, Any] = {"full": store.full, "free": store.free}
    if store.full:
        out.update(
            path=store.path,
            needed=store.needed,
            error=store.error,
            what=store.what,
            held=store.held,
            full_for_s=store.full_for_s,
        )
    return out


def _listener(ls: ListenerView) -> dict[str, Any]:
    return {
        "name": ls.name,
        "protocol": ls.protocol,
        "destination": ls.destination,
        "addresses": list(ls.addresses),
        "bound": bool(ls.addresses),
        "connections": ls.connections if ls.addresses else 0,
        "max_connections": ls.max_connections,
        "tls_refusals": ls.tls_refusals,
        "last_tls_refusal": ls.last_tls_refusal,
        "last_tls_refusal_at": ls.last_tls_refusal_at,
    }


def _upstream(up: UpstreamView, now: float) -> dict[str, Any]:
    since = up.connected_since
    return {
        "name": up.name,
        "protocol": up.protocol,
        "connect": list(up.connect),
        "destination": up.destination,
        "state": up.state,
        "last_error": up.last_error,
        "last_error_at": up.last_error_at,
        "connected_since": since,
        "connected_for_s": round(now - since, 3) if since is not None else None,
    }


def _destination(d: DestinationView) -> dict[str, Any]:
    """One destination's status: its backlog and groups, and its buffers' bounds or the
    log it keeps."""
    f = d.figures
    out: dict[str, Any] = {
        "name": d.name,
        "kind": f.kind,
        "backlog": {"messages": f.backlog, "bytes": f.backlog_bytes},
    }
    if f.log is None:
        # Groups with buffers of their own (a topic, a queue).
        out["groups"] = [_buffered_group(g) for g in f.groups]
        out["limits"] = {"bytes": f.limit_bytes, "messages": f.limit_messages}
        out["discarded"] = f.discarded or 0
        out["filtered"] = f.filtered
        out["orphaned"] = f.kept
    else:
        out["groups"] = [_log_group(g) for g in f.groups]
        out["log"] = _log(f.log, f.full)
    if f.unmatched is not None:
        # A queue: messages no present consumer's selector matches.
        out["unmatched"] = f.unmatched
    out.update(received=f.received, delivered=f.delivered, acked=f.acked)
    return out


def _buffered_group(g: GroupFigures) -> dict[str, Any]:
    """A topic's or queue's group: what it holds, and whether that is at its bounds."""
    return {
        "name": g.name,
        "anonymous": g.anonymous,
        "queued": g.queued,
        "unacked": g.unacked,
        "held": g.backlog,
        "held_bytes": g.backlog_bytes,
        "members": g.members,
        "full": g.full,
        **({"filter": g.filter} if g.filter is not None else {}),
        **({"unmatched": g.unmatched} if g.unmatched is not None else {}),
    }


def _log_group(g: GroupFigures) -> dict[str, Any]:
    """A log's group: how far behind the tail, its committed position, what it lost."""
    return {
        "name": g.name,
        "anonymous": g.anonymous,
        "queued": g.queued,
        "unacked": g.unacked,
        "behind": g.backlog,
        "committed": g.committed,
        "members": g.members,
        "dropped": g.dropped,
        **({"unmatched": g.unmatched} if g.unmatched is not None else {}),
    }


def _log(log: LogFigures, full: bool) -> dict[str, Any]:
    """What a log keeps (a partitioned log: summed over its partitions)."""
    return {
        "first": log.first,
        "next": log.next,
        "bytes": log.retained_bytes,
        "retain": log.retain_bytes,
        "overflow": log.overflow,
        "full": full,
        "blocked": log.blocked,
        **({"partitions": log.partitions} if log.partitions > 1 else {}),
    }


def hints(status: dict[str, Any]) -> list[dict[str, str]]:
    """Short answers to "why is my sender not acked?", read from a status.

    Each is ``{"level": "warning" | "info", "subject": …, "text": …}``.
    """
    out: list[dict[str, str]] = []
    out += _gateway_hints(status)
    for ls in status["listeners"]:
        out += _listener_hints(ls)
        out += _tls_hints(ls, status["time"])
    upstreams = {f"upstream:{u['name']}" for u in status["upstreams"]}
    for up in status["upstreams"]:
        out += _upstream_hints(up)
    for d in status["destinations"]:
        if d["name"] in upstreams:
            continue  # said with the upstream
        out += _log_hints(d) if d["kind"] == "log" else _destination_hints(d)
        out += _unmatched_hints(d)
    if status["inflight"] and not out:
        out.append(
            _hint(
                "info",
                "gateway",
                f"{_count(status['inflight'], 'publish is', 'publishes are')} not settled yet"
                " (their senders wait for acks)",
            )
        )
    return out


def _hint(level: str, subject: str, text: str) -> dict[str, str]:
    return {"level": level, "subject": subject, "text": text}


def _gateway_hints(status: dict[str, Any]) -> list[dict[str, str]]:
    """Draining, the memory budget, the store's disk."""
    out = []
    if status["draining"]:
        out.append(
            _hint("warning", "gateway", "draining: no new connections; in-flight work is settling")
        )
    memory = status["memory"]
    if memory["exhausted"]:
        out.append(
            _hint(
                "warning",
                "memory",
                f"the memory budget is exhausted ({memory['used']} of {memory['limit']} bytes):"
                " publishes wait until consumers ack and free room",
            )
        )
    store = status.get("store")
    if store and store["full"]:
        out.append(
            _hint(
                "warning",
                "store",
                f"the disk under the store is full ({store['path']}; {store['free']} bytes free,"
                f" a write of {store['needed']} bytes failed): publishers to durable destinations"
                " are held and not acked until space is freed; readers go on",
            )
        )
    return out


def _listener_hints(ls: dict[str, Any]) -> list[dict[str, str]]:
    subject = f"listener {ls['name']}"
    if not ls["bound"]:
        return [_hint("warning", subject, "not bound: senders cannot connect")]
    if ls["connections"] >= ls["max_connections"]:
        return [
            _hint(
                "warning",
                subject,
                f"at max_connections ({ls['max_connections']}): new connections are refused",
            )
        ]
    return []


def _tls_hints(ls: dict[str, Any], now: float) -> list[dict[str, str]]:
    """Refused TLS handshakes, while the last one is recent (:data:`TLS_HINT_WINDOW`)."""
    at = ls.get("last_tls_refusal_at")
    if not ls.get("tls_refusals") or at is None or now - at > TLS_HINT_WINDOW:
        return []
    ago = max(0, round(now - at))
    return [
        _hint(
            "warning",
            f"listener {ls['name']}",
            f"{_count(ls['tls_refusals'], 'TLS handshake', 'TLS handshakes')} refused"
            f" since the start; the last {ago}s ago: {ls['last_tls_refusal']}",
        )
    ]


def _upstream_hints(up: dict[str, Any]) -> list[dict[str, str]]:
    if up["state"] == "connected":
        return []
    error = f" (last error: {up['last_error']})" if up["last_error"] else ""
    return [
        _hint(
            "warning",
            f"upstream {up['name']}",
            f"{up['state']}{error}: messages routed to it wait in {up['destination']}"
            " and their senders are not acked until it delivers them",
        )
    ]


def _log_hints(d: dict[str, Any]) -> list[dict[str, str]]:
    """A full log that blocks its publishers, and the group that holds it back."""
    log = d["log"]
    if not (log["full"] and log["overflow"] == "block" and d["groups"]):
        return []
    slowest = max(d["groups"], key=lambda g: g["behind"])
    waiting = log.get("blocked", 0)
    return [
        _hint(
            "warning",
            f"destination {d['name']}",
            f"the log is full (retain {log['retain']} bytes) and group"
            f" {slowest['name']} has not committed {slowest['behind']} messages:"
            + (
                f" {_count(waiting, 'publish waits', 'publishes wait')} for room"
                if waiting
                else " publishers wait"
            ),
        )
    ]


def _destination_hints(d: dict[str, Any]) -> list[dict[str, str]]:
    """A topic's or queue's groups, what departed subscribers left, what nobody took."""
    subject = f"destination {d['name']}"
    out = [hint for g in d["groups"] for hint in _group_hints(subject, g)]
    if d.get("orphaned"):
        out.append(
            _hint(
                "info",
                subject,
                f"{_count(d['orphaned'], 'message', 'messages')} left by a departed subscriber"
                f" {'waits' if d['orphaned'] == 1 else 'wait'} for a group",
            )
        )
    if d.get("discarded") and not d["groups"] and not d["backlog"]["messages"]:
        out.append(
            _hint(
                "info",
                subject,
                f"{_count(d['discarded'], 'message was', 'messages were')} discarded: a topic"
                " with no subscriber keeps nothing (their senders were acked); make it a queue"
                " to keep them",
            )
        )
    return out


def _unmatched_hints(d: dict[str, Any]) -> list[dict[str, str]]:
    """A queue's messages that wait because no present consumer's selector matches them."""
    n = d.get("unmatched")
    if not n:
        return []
    return [
        _hint(
            "info",
            f"destination {d['name']}",
            f"{_count(n, 'message waits', 'messages wait')} for a consumer whose selector"
            " matches: no present consumer's selector does (their senders are not acked yet)",
        )
    ]


def _group_hints(subject: str, g: dict[str, Any]) -> list[dict[str, str]]:
    """Why a group's messages wait: no subscriber, no acks yet, no credit; or it is full."""
    out = []
    # Queued messages no selector matches wait for a consumer, not for credit.
    queued = g["queued"] - g.get("unmatched", 0)
    if g["held"] and not g["members"]:
        out.append(
            _hint(
                "warning",
                subject,
                f"{_count(g['held'], 'message waits', 'messages wait')} in group {g['name']},"
                " which has no subscriber: their senders are acked only once a consumer acks them",
            )
        )
    elif g["unacked"] and not queued:
        out.append(
            _hint(
                "info",
                subject,
                f"{_count(g['unacked'], 'message is', 'messages are')} delivered to group"
                f" {g['name']} and not acked yet: their senders wait for the consumers' acks",
            )
        )
    elif queued and g["members"]:
        out.append(
            _hint(
                "info",
                subject,
                f"{_count(queued, 'message', 'messages')} queued in group {g['name']}: its"
                f" {_count(g['members'], 'subscriber has', 'subscribers have')} no credit"
                " or window left",
            )
        )
    if g["full"]:
        out.append(
            _hint(
                "warning",
                subject,
                f"group {g['name']} is full (buffer_bytes or buffer_messages): publishers wait",
            )
        )
    return out


def _count(n: int, one: str, many: str) -> str:
    """``1 message waits``, ``2 messages wait``: a count with its words in agreement."""
    return f"{n} {one if n == 1 else many}"
