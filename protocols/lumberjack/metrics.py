"""Where each role of Lumberjack counts its work, without depending on a metrics library.

The drivers call ``inc``/``observe`` on what they are given; the gateway's
plugin passes ``prometheus_client`` children labelled with the listener or
upstream name, the library API passes nothing and nothing is counted. Counts
are per window, never per event.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.sdk import NOTHING, Count, Observe

__all__ = ["ClientMetrics", "Count", "Observe", "ServerMetrics"]


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """Where a connection counts its work; ``prometheus_client`` children fit."""

    windows: Count = NOTHING
    events: Count = NOTHING
    #: Keepalive ``A 0`` frames sent while a window waited.
    keepalives: Count = NOTHING
    #: Bytes inflated from ``C`` frames.
    inflated_bytes: Count = NOTHING
    #: Connections closed for breaking the protocol or timing out a window.
    protocol_errors: Count = NOTHING
    #: Windows whose receipt was not "delivered" (closed without an ack).
    refused_windows: Count = NOTHING
    #: Seconds from a window's last byte to its ack being written.
    ack_latency: Observe = NOTHING


@dataclass(frozen=True, slots=True)
class ClientMetrics:
    """Where an upstream connection counts its work; ``prometheus_client`` children fit."""

    windows: Count = NOTHING
    #: Events the server acked (partial acks count what they cover).
    events_acked: Count = NOTHING
    #: Events sent again after a connection failed with them unacked.
    events_resent: Count = NOTHING
    #: Events in flight when a connection failed (they go back to the queue).
    events_failed: Count = NOTHING
    #: Events per window sent.
    window_events: Observe = NOTHING
    #: Seconds from a window's bytes going out to the ack covering all of it.
    ack_latency: Observe = NOTHING
