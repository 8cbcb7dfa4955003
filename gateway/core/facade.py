"""What a protocol may do with the hub: publish, call, subscribe, look a destination up.

Protocols get a :class:`HubFacade`, never the :class:`~gateway.core.hub.Hub`
itself: closing the hub, creating destinations behind the catalog's back or
waiting for it to drain are the runtime's business. Listeners use it for what
their peers publish and subscribe to (egress towards the peer, ingress from
it), and client roles the same way: an upstream that subscribes to something
remote publishes what it receives into local destinations with
:meth:`HubFacade.publish`, and gets receipts and backpressure like any
listener.

The runtime gives each listener (and each upstream) a facade of its own that
counts what its connections publish (``received``) and the deliveries they
take to write (``sent``), once per publish or batch received, never per
message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gateway.core.destination import Delivery, Subscription
    from gateway.core.hub import Hub
    from gateway.core.model import Message
    from gateway.core.receipts import Receipt

__all__ = ["Count", "HubFacade"]


class Count(Protocol):
    """Something to count into: a ``prometheus_client`` counter child fits.

    The one definition: the facade counts messages into it, and protocol
    drivers their own work (they reach it as ``gateway.sdk.Count``, through
    :mod:`gateway.protocol.counts`). It lives in the core, which imports
    nothing from the protocol toolkit above it.
    """

    def inc(self, amount: float = 1) -> None: ...


class HubFacade:
    """The hub as protocols see it; each method is the hub's own, bound (no extra call)
    unless the facade counts for a listener or an upstream.

    * ``await publish(messages) -> Receipt``: route messages; waits while a
      target is full; the receipt settles when every target has them;
    * ``await call(message, timeout) -> Receipt``: a request; ``receipt.reply``
      holds the subscriber's answer;
    * ``subscribe(destination, group=None, *, credit, max_unacked, …) -> Subscription``;
    * ``info(destination) -> DestinationInfo``: kind, positions, element size.

    ``received`` counts the messages of every publish and call made through
    the facade (once the hub took them); ``sent`` the deliveries every
    subscription made through it receives.
    """

    __slots__ = ("call", "info", "publish", "subscribe")

    def __init__(
        self, hub: Hub, *, received: Count | None = None, sent: Count | None = None
    ) -> None:
        self.info = hub.info
        if received is None:
            self.publish = hub.publish
            self.call = hub.call
        else:
            self.publish = _counting_publish(hub, received)
            self.call = _counting_call(hub, received)
        self.subscribe = hub.subscribe if sent is None else _counting_subscribe(hub, sent)


def _counting_publish(hub: Hub, received: Count) -> Any:
    publish = hub.publish

    async def counted_publish(messages: Iterable[Message]) -> Receipt:
        receipt = await publish(messages)
        received.inc(receipt.count)
        return receipt

    return counted_publish


def _counting_call(hub: Hub, received: Count) -> Any:
    call = hub.call

    async def counted_call(message: Message, timeout: float) -> Receipt:
        receipt = await call(message, timeout)
        received.inc()
        return receipt

    return counted_call


def _counting_subscribe(hub: Hub, sent: Count) -> Any:
    subscribe = hub.subscribe

    def counted_subscribe(
        destination: str, group: str | None = None, **kwargs: Any
    ) -> Subscription:
        sub = subscribe(destination, group, **kwargs)
        receive = sub.receive
        take = sub.take

        async def counted_receive(max_count: int | None = None) -> list[Delivery]:
            deliveries = await receive(max_count)
            sent.inc(len(deliveries))
            return deliveries

        def counted_take(max_count: int | None = None) -> list[Delivery]:
            deliveries = take(max_count)
            if deliveries:
                sent.inc(len(deliveries))
            return deliveries

        # Only ``receive`` and ``take`` are wrapped (once per batch): acks stay the
        # subscription's own. (A ``receive`` that takes through ``take`` calls its
        # class's, not this wrapper: nothing is counted twice.)
        try:
            sub.receive = counted_receive  # type: ignore[method-assign]
            sub.take = counted_take  # type: ignore[method-assign]
        except AttributeError:  # a subscription class with __slots__: left uncounted
            pass
        return sub

    return counted_subscribe
