"""What a protocol may do with the hub: publish, call, subscribe, look a destination up.

Protocols get a :class:`HubFacade`, never the :class:`~gateway.hub.Hub`
itself: closing the hub, creating destinations behind the catalog's back or
waiting for it to drain are the runtime's business. Listeners use it for what
their peers publish and subscribe to (egress towards the peer, ingress from
it), and client roles the same way: an upstream that subscribes to something
remote publishes what it receives into local destinations with
:meth:`HubFacade.publish`, and gets receipts and backpressure like any
listener.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .hub import Hub

__all__ = ["HubFacade"]


class HubFacade:
    """The hub as protocols see it; each method is the hub's own, bound (no extra call).

    * ``await publish(messages) -> Receipt``: route messages; waits while a
      target is full; the receipt settles when every target has them;
    * ``await call(message, timeout) -> Receipt``: a request; ``receipt.reply``
      holds the subscriber's answer;
    * ``subscribe(destination, group=None, *, credit, max_unacked, …) -> Subscription``;
    * ``info(destination) -> DestinationInfo``: kind, positions, element size.
    """

    __slots__ = ("call", "info", "publish", "subscribe")

    def __init__(self, hub: Hub) -> None:
        self.publish = hub.publish
        self.call = hub.call
        self.subscribe = hub.subscribe
        self.info = hub.info
