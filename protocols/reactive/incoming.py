"""The subscriber side of a reactive-streams connection: the peer's publishers, published
locally.

Each configured :class:`RemoteSubscription` is a ``subscribe(publisher, id,
demand)`` sent once we may (a client: right after its hello; a server: once
the client's hello arrived). What the peer sends is published into the
subscription's local destination, one hub publish per read of elements, and
each element is requested again only once its receipt settled: the peer
never has more than ``demand`` elements on their way or unsettled here, so a
slow destination slows the peer down instead of filling memory.

A publish the hub rejects or does not keep cancels that subscription, with
the reason logged at warning: reactive streams have no redelivery, so what
the peer sent after it is dropped (parsed and discarded) rather than
published out of order. ``onComplete`` and ``onError`` from the peer end the
subscription and are logged. A subscription is made again only on the next
connection.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.sdk import LocalProtocolError, Message, Outcome, Receipt, Source

from . import messages as m
from .events import Accepted, Completed, Elements, Failed
from .metrics import PeerMetrics

if TYPE_CHECKING:
    from .peer import PeerSession

__all__ = ["DEFAULT_DEMAND", "Incoming", "RemoteSubscription"]

#: The demand of a subscription whose config names none.
DEFAULT_DEMAND = 256

Publish = Callable[[list[Message]], Awaitable[Receipt]]


@dataclass(frozen=True, slots=True)
class RemoteSubscription:
    """Subscribe to the peer's ``publisher``; publish what it sends into ``destination``,
    with at most ``demand`` elements unsettled."""

    publisher: str
    destination: str
    demand: int = DEFAULT_DEMAND


@dataclass(eq=False, slots=True)
class Inbound:
    """One of our subscriptions on this connection."""

    spec: RemoteSubscription
    id: int


class Incoming:
    """Our subscriptions to the peer's publishers (see the module docstring)."""

    def __init__(
        self,
        session: PeerSession,
        subscriptions: Sequence[RemoteSubscription],
        publish: Publish,
        source: Callable[[], Source],
        metrics: PeerMetrics,
    ) -> None:
        self.session = session
        self.metrics = metrics
        self.subscriptions = tuple(subscriptions)
        self.publish = publish
        self.source = source
        self.streams: dict[int, Inbound] = {}
        self._ids = itertools.count(1)  # ids are never reused on a connection
        self.started = False

    def start(self) -> None:
        """We may subscribe now: send every configured subscription's ``subscribe``."""
        if self.started:
            return
        self.started = True
        for spec in self.subscriptions:
            inbound = Inbound(spec, next(self._ids))
            self.streams[inbound.id] = inbound
            self.session.send_message(m.Subscribe(spec.publisher, inbound.id, spec.demand))

    async def handle(self, event: object) -> bool:
        """Act on ``event`` if it is about one of our subscriptions; whether it was."""
        if type(event) is Elements:
            await self._hand_off(event)
        elif isinstance(event, Accepted):
            inbound = self.streams.get(event.subscriber)
            if inbound is not None:
                self.metrics.subscribed.inc()
                self.session.log.info("subscribed to %r", inbound.spec.publisher)
        elif isinstance(event, Completed):
            self._ended(event.subscriber, "completed")
        elif isinstance(event, Failed):
            self._ended(event.subscriber, f"ended by the peer: {event.error}")
        else:
            return False
        return True

    def clear(self) -> None:
        self.streams.clear()

    def _ended(self, sid: int, how: str) -> None:
        inbound = self.streams.pop(sid, None)
        if inbound is not None:
            self.session.log.info("subscription to %r %s", inbound.spec.publisher, how)

    async def _hand_off(self, event: Elements) -> None:
        """Publish one read of elements; request as many again once the receipt settled."""
        inbound = self.streams.get(event.subscriber)
        if inbound is None:
            return  # cancelled by us: dropped, as the module docstring says
        source = self.source()
        into = inbound.spec.destination
        messages = [Message(into, body, source=source) for body in event.elements]
        publish = self.publish
        count = len(messages)
        self.metrics.elements_received.inc(count)
        await self.session.submit(
            lambda: publish(messages), lambda r: self._answer(r, inbound, count)
        )

    def _answer(self, receipt: Receipt, inbound: Inbound, count: int) -> bytes | None:
        """Request ``count`` more if the batch is safe; else cancel, saying why."""
        if self.streams.get(inbound.id) is not inbound:
            return None  # cancelled by us or ended by the peer meanwhile
        if receipt.outcome is Outcome.DELIVERED:
            return self._send(m.Request(inbound.id, count))
        del self.streams[inbound.id]
        self.metrics.cancelled.inc()
        self.session.log.warning(
            "elements from %r %s (%s): subscription cancelled",
            inbound.spec.publisher,
            "rejected" if receipt.outcome is Outcome.REJECTED else "not kept",
            _reason(receipt),
        )
        return self._send(m.Cancel(inbound.id))

    def _send(self, message: m.Message) -> bytes | None:
        try:
            return self.session.codec.send(message)
        except LocalProtocolError:
            return None  # the stream or connection ended meanwhile: nothing to say


def _reason(receipt: Receipt) -> str:
    """The first reason a result of ``receipt`` gives, else the receipt's own."""
    for result in receipt.results():
        if result.outcome is not Outcome.DELIVERED and result.reason:
            return result.reason
    return receipt.reason or "failed"
