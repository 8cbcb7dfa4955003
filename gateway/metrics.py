"""Metrics: counters, gauges and histograms of one gateway, in Prometheus' model.

Each :class:`~gateway.runtime.Gateway` has a :class:`Metrics` with a registry
of its own (so that several gateways in one process, as in tests, never mix
their figures). The runtime counts connections and bytes per listener and
connections per upstream; a protocol adds its own families through
:meth:`Metrics.counter` and friends, asking for the same name again to get
the same family. The figures are served over HTTP by
:mod:`gateway.metrics_http` when ``[metrics] bind`` is configured.

Updates cost a lock and a few attribute lookups (about 0.4 µs), so protocols
count per window or per batch, never per event.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase

__all__ = ["LATENCY_BUCKETS", "Metrics"]

#: Seconds: from a millisecond to a minute, for ack latencies.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

_M = TypeVar("_M", bound=MetricWrapperBase)


class Metrics:
    """One gateway's metric families, by name."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._families: dict[str, MetricWrapperBase] = {}
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
        self.bytes_received = self.counter(
            "interchange_received_bytes", "Bytes received from clients.", ["listener"]
        )
        self.bytes_sent = self.counter(
            "interchange_sent_bytes", "Bytes sent to clients.", ["listener"]
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
        self.abandoned_publishes = self.counter(
            "interchange_abandoned_publishes",
            "Publishes whose sender left (or shutdown gave up) before they settled:"
            " settled as failed, never acked.",
            ["listener"],
        )
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

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        """The counter family ``name`` (exposed as ``name_total``), created on first use."""
        return self._family(Counter, name, documentation, labels)

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
    def _check(kind: type[_M], name: str, family: MetricWrapperBase) -> _M:
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
