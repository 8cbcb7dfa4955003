"""Where a reactive-streams connection counts its work, without depending on a metrics
library.

The gateway's plugin passes ``prometheus_client`` children labelled with the
listener or upstream name (:func:`peer_metrics`); a session made without them
counts nothing. Elements are counted per batch (``inc(n)``), never one call
per element.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.sdk import NOTHING, Count, Metrics

__all__ = ["PeerMetrics", "peer_metrics"]


@dataclass(frozen=True, slots=True)
class PeerMetrics:
    """Where a connection counts its work; ``prometheus_client`` children fit."""

    #: Subscriptions of the peer to us that we accepted (``subscribed`` sent).
    served: Count = NOTHING
    #: Subscriptions of the peer to us answered ``onError`` at once (refused).
    refused: Count = NOTHING
    #: Elements sent to the peer.
    elements_sent: Count = NOTHING
    #: Our subscriptions to the peer's publishers that it accepted.
    subscribed: Count = NOTHING
    #: Elements received from the peer and handed to the hub.
    elements_received: Count = NOTHING
    #: Our subscriptions cancelled because the hub rejected or did not keep elements.
    cancelled: Count = NOTHING
    #: Pings sent to a silent peer.
    pings: Count = NOTHING
    #: Connections closed because a ping went unanswered.
    keepalive_timeouts: Count = NOTHING


def peer_metrics(metrics: Metrics, label: str, name: str) -> PeerMetrics:
    """The families in the gateway's metrics (created on first use), labelled
    ``label=name`` (``listener`` or ``upstream``)."""
    labels = [label]

    def counter(family: str, text: str) -> Count:
        child: Count = metrics.counter(family, text, labels).labels(name)
        return child

    return PeerMetrics(
        served=counter("reactive_served_subscriptions", "Peer subscriptions accepted."),
        refused=counter("reactive_refused_subscriptions", "Peer subscriptions refused."),
        elements_sent=counter("reactive_elements_sent", "Elements sent to peers."),
        subscribed=counter(
            "reactive_subscriptions", "Our subscriptions to peers' publishers accepted."
        ),
        elements_received=counter(
            "reactive_elements_received", "Elements received from peers' publishers."
        ),
        cancelled=counter(
            "reactive_cancelled_subscriptions",
            "Our subscriptions cancelled: the hub rejected or did not keep an element.",
        ),
        pings=counter("reactive_pings", "Pings sent to silent peers."),
        keepalive_timeouts=counter(
            "reactive_keepalive_timeouts", "Connections closed: a ping went unanswered."
        ),
    )
