"""Metrics: counters, gauges and histograms of one gateway, in Prometheus' model.

Each :class:`~gateway.runtime.gateway.Gateway` has a :class:`Metrics` with a registry
of its own (so that several gateways in one process, as in tests, never mix
their figures). The runtime counts connections and bytes per listener and
connections per upstream; a protocol adds its own families through
:meth:`Metrics.counter` and friends, asking for the same name again to get
the same family. The figures are served over HTTP by
:mod:`gateway.ops.metrics_http` when ``[metrics] bind`` is configured.

Updates of ``prometheus_client`` families cost a lock and a few attribute
lookups (about 0.4 µs), so protocols count per window or per batch, never per
event. Counters the gateway updates per publish or per read (messages and
bytes per listener, messages per upstream) are tallies instead
(:meth:`Metrics.tally`): plain numbers, since a gateway runs on one trio
thread, exported as counters at scrape time (about 0.08 µs an update). What
the hub and its destinations count (messages in, out and acked per
destination, backlogs, publish outcomes) they keep as plain integers;
:class:`HubCollector` reads them at scrape time too: every destination through
:meth:`~gateway.core.destination.Destination.figures`, whatever its class, and
the hub's settled publishes by :class:`~gateway.core.reasons.Reason` code, each
exported under the code's label (:attr:`Reason.label`). The hub knows nothing of
metrics; no reason's text is ever read.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase

from gateway import __version__
from gateway.core.destination import DestinationFigures

# The ``reason`` labels of ``interchange_publishes_total``: the hub counts settled
# publishes by code (gateway.core.reasons.Reason), and a scrape labels each by
# ``Reason.label``; no text is ever matched.
from gateway.core.reasons import PUBLISH_REASONS

if TYPE_CHECKING:
    from gateway.core.hub import Hub
    from gateway.core.peers import Peers
    from gateway.store import Store

__all__ = [
    "LATENCY_BUCKETS",
    "MAX_EXPORTED_DESTINATIONS",
    "MAX_EXPORTED_GROUPS",
    "PUBLISH_REASONS",
    "HubCollector",
    "Metrics",
    "StoreCollector",
    "Tally",
    "TallyFamily",
]

#: Seconds: from a millisecond to a minute, for ack latencies.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

#: Destinations whose figures a scrape exports at most (the oldest first: the
#: configured ones and upstream queues are created at start).
MAX_EXPORTED_DESTINATIONS = 1000
#: Groups of one destination exported at most (anonymous groups count as one).
MAX_EXPORTED_GROUPS = 100
#: The ``group`` label of every anonymous subscriber's group of one, summed.
ANONYMOUS_GROUP = "~anonymous"

_OUTCOME_NAMES = {0: "delivered", 1: "failed", 2: "rejected"}

#: One group's row: group, backlog messages, backlog bytes and fill ratio (None:
#: not known per group), subscribers (None: no group, the destination's own
#: store), unacked deliveries.
_Row = tuple[str, int, int | None, float | None, int | None, int]

_M = TypeVar("_M", bound=MetricWrapperBase)
_F = TypeVar("_F", bound="MetricWrapperBase | TallyFamily")


class Metrics:
    """One gateway's metric families, by name."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._families: dict[str, MetricWrapperBase | TallyFamily] = {}
        self._connection_families()
        self._traffic_families()
        self._gateway_families()
        self._upstream_families()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._hub_collector: HubCollector | None = None

    def _connection_families(self) -> None:
        """Per listener: connections, and what refused or closed them."""
        self.connections_open = self.gauge(
            "interchange_connections_open", "Connections open now.", ["listener"]
        )
        self.connections = self.counter(
            "interchange_connections", "Connections accepted.", ["listener"]
        )
        self.connection_errors = self.counter(
            "interchange_connection_errors",
            "Connections closed by a fault their protocol did not handle itself"
            " (a TLS handshake timeout, a crash); protocols count their own errors.",
            ["listener"],
        )
        self.refused_connections = self.counter(
            "interchange_refused_connections",
            "Connections refused or closed by a protection, by reason (max_connections,"
            " max_connections_per_address, idle, memory, unit_timeout, write_timeout).",
            ["listener", "reason"],
        )
        self.accept_errors = self.counter(
            "interchange_accept_errors",
            "accept() failures for lack of resources (EMFILE, ENFILE, ENOMEM, ENOBUFS).",
            ["listener", "error"],
        )
        self.tls_handshake_failures = self.counter(
            "interchange_tls_handshake_failures",
            "Server-side TLS handshakes that failed, by reason (unknown_ca, bad_certificate,"
            " certificate_required, expired, protocol_version, no_shared_cipher, not_tls,"
            " timeout, eof, other).",
            ["listener", "reason"],
        )

    def _traffic_families(self) -> None:
        """Per listener: bytes and messages in and out, and publishes abandoned."""
        self.bytes_received = self.tally(
            "interchange_received_bytes", "Bytes received from clients.", ["listener"]
        )
        self.bytes_sent = self.tally(
            "interchange_sent_bytes", "Bytes sent to clients.", ["listener"]
        )
        self.messages_received = self.tally(
            "interchange_messages_received",
            "Messages published by the listener's connections (counted per publish).",
            ["listener"],
        )
        self.messages_sent = self.tally(
            "interchange_messages_sent",
            "Deliveries handed to the listener's subscriber connections to write"
            " (redeliveries included).",
            ["listener"],
        )
        self.abandoned_publishes = self.counter(
            "interchange_abandoned_publishes",
            "Publishes whose sender left (or shutdown gave up) before they settled:"
            " settled as failed, never acked.",
            ["listener"],
        )

    def _gateway_families(self) -> None:
        """The gateway's own: memory budget, suppressed log lines, build information."""
        self.log_lines_suppressed = self.counter(
            "interchange_log_lines_suppressed",
            "Warnings not logged because the same reason was logged within the interval.",
            ["reason"],
        )
        self.memory_budget = self.gauge(
            "interchange_memory_budget_bytes",
            "The gateway-wide memory budget ([gateway] memory_budget).",
        )
        self.memory_used = self.gauge(
            "interchange_memory_used_bytes",
            "Bytes counted against the memory budget: destination buffers and partly"
            " received input of connections.",
        )
        self.build_info = self.gauge(
            "interchange_build_info",
            "Always 1: the gateway's version and the Python running it.",
            ["version", "python"],
        )
        self.build_info.labels(version=__version__, python=platform.python_version()).set(1)

    def _upstream_families(self) -> None:
        """Per upstream: its connections and the messages it received."""
        self.upstream_connects = self.counter(
            "interchange_upstream_connects", "Connections an upstream made.", ["upstream"]
        )
        self.upstream_failures = self.counter(
            "interchange_upstream_failures",
            "Upstream connections that failed to open or were lost.",
            ["upstream"],
        )
        self.upstream_connected = self.gauge(
            "interchange_upstream_connected", "1 while an upstream is connected.", ["upstream"]
        )
        self.upstream_messages_received = self.tally(
            "interchange_upstream_messages_received",
            "Messages an upstream received from its peer and published locally.",
            ["upstream"],
        )

    def watch_hub(
        self, hub: Hub, upstreams: Iterable[str] | Callable[[], Iterable[str]] = ()
    ) -> HubCollector:
        """Export ``hub``'s figures (destinations, groups, publish outcomes) at scrape time.

        ``upstreams``: the configured upstreams' names, or a function returning
        them now (they change when the config is reloaded).
        """
        if self._hub_collector is not None:
            self.registry.unregister(self._hub_collector)
        self._hub_collector = HubCollector(hub, upstreams)
        self.registry.register(self._hub_collector)
        return self._hub_collector

    def watch_store(self, store: Store) -> None:
        """Export the embedded segment store's figures (``Store.stats``) at scrape time."""
        self.registry.register(StoreCollector(store))

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        """The counter family ``name`` (exposed as ``name_total``), created on first use."""
        return self._family(Counter, name, documentation, labels)

    def tally(self, name: str, documentation: str, labels: Sequence[str] = ()) -> TallyFamily:
        """The tally family ``name``: a counter (``name_total``) cheap enough to update
        per message, for code on the gateway's trio thread only."""
        family = self._families.get(name)
        if family is None:
            family = TallyFamily(name, documentation, labels)
            self.registry.register(family)
            self._families[name] = family
        return self._check(TallyFamily, name, family)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return self._family(Gauge, name, documentation, labels)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        buckets: Sequence[float] = LATENCY_BUCKETS,
    ) -> Histogram:
        family = self._families.get(name)
        if family is None:
            family = Histogram(name, documentation, labels, registry=self.registry, buckets=buckets)
            self._families[name] = family
        return self._check(Histogram, name, family)

    def _family(self, kind: type[_M], name: str, documentation: str, labels: Sequence[str]) -> _M:
        family = self._families.get(name)
        if family is None:
            family = kind(name, documentation, labels, registry=self.registry)
            self._families[name] = family
        return self._check(kind, name, family)

    @staticmethod
    def _check(kind: type[_F], name: str, family: MetricWrapperBase | TallyFamily) -> _F:
        if not isinstance(family, kind):
            raise ValueError(f"metric {name!r} is a {type(family).__name__}, not a {kind.__name__}")
        return family

    def exposition(self) -> bytes:
        """Every family in Prometheus' text format."""
        return generate_latest(self.registry)

    def value(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        """The current value of sample ``name`` (for example ``x_total``), or None."""
        value = self.registry.get_sample_value(name, labels or {})
        return None if value is None else float(value)


class Tally:
    """One counter of a :class:`TallyFamily`: a plain number (no lock), read at scrape time."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class TallyFamily:
    """Counters with labels, for hot paths: ``labels(...)`` returns a :class:`Tally`
    to keep, and a scrape exports every one as ``name_total``."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], Tally] = {}
        if not self.labelnames:
            self._children[()] = Tally()

    def labels(self, *values: str, **named: str) -> Tally:
        """The tally of one label set (created at 0 on first use), by position or name."""
        if named:
            if values or set(named) != set(self.labelnames):
                raise ValueError(f"{self.name}: labels must be exactly {self.labelnames}")
            values = tuple(named[n] for n in self.labelnames)
        elif len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: labels must be exactly {self.labelnames}")
        key = tuple(str(v) for v in values)
        tally = self._children.get(key)
        if tally is None:
            tally = self._children[key] = Tally()
        return tally

    def inc(self, amount: float = 1) -> None:
        """Count on the family without labels."""
        self._children[()].inc(amount)

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, tally in self._children.items():
            family.add_metric(list(key), tally.value)
        yield family


class StoreCollector:
    """Reads the embedded store's counters when scraped (docs/store.md, "Metrics")."""

    #: (stats key, metric name, kind, help, scale).
    FIGURES: tuple[tuple[str, str, str, str, float], ...] = (
        ("segments", "interchange_store_segments", "gauge", "Segments in the store.", 1),
        ("bytes", "interchange_store_bytes", "gauge", "Bytes the segments retain.", 1),
        ("events", "interchange_store_events", "gauge", "Events the segments retain.", 1),
        (
            "appended_bytes",
            "interchange_store_appended_bytes",
            "counter",
            "Bytes appended since the store opened.",
            1,
        ),
        (
            "commits",
            "interchange_store_commits",
            "counter",
            "Group commits: each made everything written before it durable.",
            1,
        ),
        ("fsyncs", "interchange_store_fsyncs", "counter", "fdatasync calls of the commits.", 1),
        (
            "fsync_us",
            "interchange_store_fsync_seconds",
            "counter",
            "Seconds spent in those fdatasync calls.",
            1e-6,
        ),
        (
            "bytes_deleted",
            "interchange_store_deleted_bytes",
            "counter",
            "Bytes retention deleted (whole chunk files).",
            1,
        ),
        (
            "corrupt_records",
            "interchange_store_corrupt_records",
            "gauge",
            "Records known to fail their checksum (never delivered; see gateway store verify).",
            1,
        ),
        (
            "disk_full",
            "interchange_store_disk_full",
            "gauge",
            "1 while the disk under the store is full: publishers to durable destinations are"
            " held until space is freed.",
            1,
        ),
        (
            "disk_full_episodes",
            "interchange_store_disk_full_episodes",
            "counter",
            "Times the disk under the store became full since it opened.",
            1,
        ),
        (
            "disk_free_bytes",
            "interchange_store_disk_free_bytes",
            "gauge",
            "Bytes free for the gateway on the file system of the store.",
            1,
        ),
        (
            "recovery_truncated_bytes",
            "interchange_store_recovery_truncated_bytes",
            "gauge",
            "Bytes of torn tails cut away when the store was opened (0 after a clean stop).",
            1,
        ),
    )

    def __init__(self, store: Store) -> None:
        self.store = store

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        stats = self.store.stats()
        for key, name, kind, documentation, scale in self.FIGURES:
            value = stats.get(key, 0) * scale
            if kind == "counter":
                yield CounterMetricFamily(name, documentation, value=value)
            else:
                yield GaugeMetricFamily(name, documentation, value=value)


class HubCollector:
    """Reads a hub's figures when scraped: nothing is counted for it on the hot path.

    Per destination (at most :data:`MAX_EXPORTED_DESTINATIONS`, the oldest
    first) the messages put, handed out and acked, and per group (at most
    :data:`MAX_EXPORTED_GROUPS` per destination; anonymous subscribers'
    groups of one summed as ``~anonymous``) the backlog, how full its buffer
    is, its subscribers and their unacked deliveries. Group ``""`` is the
    destination's own store: a topic's copies left by departed anonymous
    groups, a log's retention. Per upstream, its queue's deliveries and acks;
    and the hub's publishes by outcome and reason. In a worker of ``gateway run
    --workers N``, what it forwarded to the other workers.
    """

    def __init__(
        self,
        hub: Hub,
        upstreams: Iterable[str] | Callable[[], Iterable[str]] = (),
        *,
        max_destinations: int = MAX_EXPORTED_DESTINATIONS,
        max_groups: int = MAX_EXPORTED_GROUPS,
    ) -> None:
        self.hub = hub
        if callable(upstreams):
            self._upstreams = upstreams
        else:
            names = list(upstreams)
            self._upstreams = lambda: names
        self.max_destinations = max_destinations
        self.max_groups = max_groups

    def describe(self) -> list[Metric]:
        # Nothing to check for clashes up front, and no scrape at registration.
        return []

    def collect(self) -> Iterator[Metric]:
        yield self._publishes()
        destinations = self.hub.destinations()
        yield GaugeMetricFamily(
            "interchange_destinations",
            f"Destinations that exist; at most {self.max_destinations} are exported.",
            value=len(destinations),
        )
        families = _DestinationFamilies()
        exported: dict[str, DestinationFigures] = {}
        for i, (name, dest) in enumerate(destinations.items()):
            if i >= self.max_destinations and not name.startswith("upstream:"):
                continue
            figures = exported[name] = dest.figures()
            families.add(name, figures, self._bounded(_group_rows(figures)))
        yield from families.all()
        yield from self._upstream_queues(exported)
        if self.hub.peers is not None:
            yield from self._forwarding(self.hub.peers)

    @staticmethod
    def _forwarding(peers: Peers) -> Iterator[Metric]:
        """A worker's topic forwarding (``gateway run --workers N``): what it sent to the
        other workers, its links, the topics it has subscribers for."""
        yield CounterMetricFamily(
            "interchange_worker_forwarded_messages",
            "Messages forwarded to other workers' subscribers (once per worker).",
            value=peers.messages_sent,
        )
        yield CounterMetricFamily(
            "interchange_worker_forwarded_batches",
            "Batches forwarded to other workers.",
            value=peers.batches_sent,
        )
        yield GaugeMetricFamily(
            "interchange_worker_links",
            "Links to other workers that are connected.",
            value=len(peers.outgoing),
        )
        yield GaugeMetricFamily(
            "interchange_worker_interest",
            "In-memory topics this worker has subscribers on (announced to the others).",
            value=len(peers.interest),
        )

    def _publishes(self) -> Metric:
        """Settled publishes by outcome and the label of their reason code."""
        hub = self.hub
        family = CounterMetricFamily(
            "interchange_publishes",
            "Publishes (and calls) whose receipt settled, by outcome (delivered, failed,"
            " rejected) and the label of their reason code (see docs/operations.md).",
            labels=["outcome", "reason"],
        )
        family.add_metric(["delivered", ""], hub.delivered)
        # Several codes share a label: one sample per label.
        counts: dict[tuple[str, str], int] = {}
        for (outcome, code), count in hub.not_delivered.items():
            key = (_OUTCOME_NAMES.get(int(outcome), str(outcome)), code.label)
            counts[key] = counts.get(key, 0) + count
        for (outcome_name, label), count in sorted(counts.items()):
            family.add_metric([outcome_name, label], count)
        return family

    def _upstream_queues(self, exported: dict[str, DestinationFigures]) -> Iterator[Metric]:
        """Per configured upstream, its queue's deliveries and acks (0 before it exists)."""
        up_sent = CounterMetricFamily(
            "interchange_upstream_messages_sent",
            "Deliveries the upstream's connections took from its queue to send"
            " (resends after a reconnect included).",
            labels=["upstream"],
        )
        up_acked = CounterMetricFamily(
            "interchange_upstream_messages_acked",
            "Messages the upstream's peer acknowledged (acked in its queue).",
            labels=["upstream"],
        )
        for upstream in self._upstreams():
            queue = exported.get(f"upstream:{upstream}")
            up_sent.add_metric([upstream], queue.delivered if queue is not None else 0)
            up_acked.add_metric([upstream], queue.acked if queue is not None else 0)
        yield up_sent
        yield up_acked

    def _bounded(self, rows: Iterable[_Row]) -> Iterator[_Row]:
        """At most ``max_groups`` named groups, then every anonymous one summed."""
        shown = 0
        held = members = held_unacked = 0
        nbytes: int | None = None
        ratio: float | None = None
        anonymous = False
        for row in rows:
            group = row[0]
            if group.startswith("~"):
                anonymous = True
                held += row[1]
                if row[2] is not None:
                    nbytes = (nbytes or 0) + row[2]
                if row[3] is not None:
                    ratio = max(ratio or 0.0, row[3])
                members += row[4] or 0
                held_unacked += row[5]
            elif shown < self.max_groups:
                shown += 1
                yield row
        if anonymous:
            yield ANONYMOUS_GROUP, held, nbytes, ratio, members, held_unacked


def _group_rows(figures: DestinationFigures) -> Iterator[_Row]:
    """Each group's row, from a destination's figures."""
    for g in figures.groups:
        yield g.name, g.backlog, g.backlog_bytes, g.fill, g.members, g.unacked


class _DestinationFamilies:
    """The per-destination and per-group families of one scrape, filled destination
    by destination."""

    def __init__(self) -> None:
        dl, gl = ["destination"], ["destination", "group"]
        self.put = CounterMetricFamily(
            "interchange_destination_messages_in",
            "Messages a destination took (stored, or discarded by a topic without groups).",
            labels=dl,
        )
        self.out = CounterMetricFamily(
            "interchange_destination_messages_out",
            "Deliveries a destination handed to subscribers (redeliveries included).",
            labels=dl,
        )
        self.acked = CounterMetricFamily(
            "interchange_destination_messages_acked",
            "Deliveries subscribers acked (or answered).",
            labels=dl,
        )
        self.discarded = CounterMetricFamily(
            "interchange_destination_messages_discarded",
            "Messages published to a topic while no group subscribed to it.",
            labels=dl,
        )
        self.backlog = GaugeMetricFamily(
            "interchange_destination_backlog_messages",
            "Messages a group has not acked yet (queued plus delivered and unacked; a log:"
            " from its committed position to the tail).",
            labels=gl,
        )
        self.backlog_bytes = GaugeMetricFamily(
            "interchange_destination_backlog_bytes",
            "Bytes of the group's backlog, as charged to its buffer.",
            labels=gl,
        )
        self.fill = GaugeMetricFamily(
            "interchange_destination_buffer_fill_ratio",
            "How full the group's buffer is (the larger of bytes and messages); at 1"
            " publishers wait (a drop_oldest log evicts).",
            labels=gl,
        )
        self.subscribers = GaugeMetricFamily(
            "interchange_group_subscribers", "Subscribers in the group now.", labels=gl
        )
        self.unacked = GaugeMetricFamily(
            "interchange_group_unacked_messages",
            "Deliveries the group's subscribers hold unacked.",
            labels=gl,
        )
        self.unmatched = GaugeMetricFamily(
            "interchange_queue_unmatched_messages",
            "Messages waiting in a queue that no present consumer's selector matches.",
            labels=dl,
        )

    def add(self, name: str, figures: DestinationFigures, groups: Iterable[_Row]) -> None:
        """One destination: its counts, its own store (group ``""``), then ``groups``."""
        self.put.add_metric([name], figures.received)
        self.out.add_metric([name], figures.delivered)
        self.acked.add_metric([name], figures.acked)
        if figures.discarded is not None:
            self.discarded.add_metric([name], figures.discarded)
        if figures.unmatched is not None:
            self.unmatched.add_metric([name], figures.unmatched)
        own: _Row = ("", figures.kept, figures.kept_bytes, figures.kept_fill, None, 0)
        for group, held, nbytes, ratio, members, held_unacked in (own, *groups):
            labels = [name, group]
            self.backlog.add_metric(labels, held)
            if nbytes is not None:
                self.backlog_bytes.add_metric(labels, nbytes)
            if ratio is not None:
                self.fill.add_metric(labels, ratio)
            if members is not None:
                self.subscribers.add_metric(labels, members)
                self.unacked.add_metric(labels, held_unacked)

    def all(self) -> tuple[Metric, ...]:
        return (
            self.put,
            self.out,
            self.acked,
            self.discarded,
            self.backlog,
            self.backlog_bytes,
            self.fill,
            self.subscribers,
            self.unacked,
            self.unmatched,
        )
