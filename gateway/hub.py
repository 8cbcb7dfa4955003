"""The hub: routes published messages to destinations and tracks receipts.

Publishing returns a :class:`~gateway.receipts.Receipt` that settles when every
copy of every message has been delivered (acked by a subscriber) or durably
stored; the worst outcome wins. Protocol listeners ack their senders only
from that receipt. Destinations are created on demand: by a provider (the
durable store) when one claims the name, else as an in-memory topic.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from collections.abc import Iterable, Sequence

import trio

from .destination import Destination, DestinationProvider, Subscription
from .model import Message, Outcome
from .receipts import Receipt
from .routing import UPSTREAM_PREFIX, Router
from .topic import Topic, TopicLimits

__all__ = ["Hub", "HubLimits"]

log = logging.getLogger(__name__)

_DESTINATION = operator.attrgetter("destination")


@dataclasses.dataclass(frozen=True, slots=True)
class HubLimits:
    #: Bytes one group of one destination may hold (queued plus unacked).
    buffer_bytes: int = 64 * 1024 * 1024
    #: Messages one group of one destination may hold.
    buffer_messages: int = 100_000
    #: Destinations the hub will create on demand.
    max_destinations: int = 10_000


class Hub:
    """Routes messages to destinations; owns every destination of a gateway."""

    def __init__(
        self,
        router: Router | None = None,
        limits: HubLimits | None = None,
        providers: Sequence[DestinationProvider] = (),
        upstreams: Iterable[str] = (),
    ) -> None:
        self.router = router or Router()
        self.limits = limits or HubLimits()
        self._topic_limits = TopicLimits(self.limits.buffer_bytes, self.limits.buffer_messages)
        self._providers = list(providers)
        self._destinations: dict[str, Destination] = {}
        self._upstreams = set(upstreams)
        self._inflight = 0
        self._idle = trio.lowlevel.ParkingLot()
        self._closed = False

    # -- destinations -----------------------------------------------------------
    def destination(self, name: str) -> Destination:
        """The destination called ``name``, created on first use."""
        d = self._destinations.get(name)
        if d is not None:
            return d
        if self._closed:
            raise trio.ClosedResourceError("the hub is closed")
        if len(self._destinations) >= self.limits.max_destinations:
            raise LookupError(
                f"too many destinations ({self.limits.max_destinations}); not creating {name!r}"
            )
        if name.startswith(UPSTREAM_PREFIX) and name[len(UPSTREAM_PREFIX) :] not in self._upstreams:
            raise LookupError(f"no upstream named {name[len(UPSTREAM_PREFIX) :]!r}")
        for provider in self._providers:
            d = provider.open(name)
            if d is not None:
                break
        else:
            d = Topic(name, self._topic_limits)
        self._destinations[name] = d
        return d

    def destinations(self) -> dict[str, Destination]:
        """A snapshot of the destinations that exist now."""
        return dict(self._destinations)

    def subscribe(
        self,
        destination: str,
        group: str | None = None,
        *,
        credit: int | None = None,
        max_unacked: int = 1024,
        max_unacked_bytes: int | None = None,
    ) -> Subscription:
        """Subscribe to ``destination`` (see :meth:`Destination.subscribe`)."""
        return self.destination(destination).subscribe(
            group, credit=credit, max_unacked=max_unacked, max_unacked_bytes=max_unacked_bytes
        )

    # -- publishing ---------------------------------------------------------------
    async def publish(self, messages: Iterable[Message]) -> Receipt:
        """Route ``messages`` to their targets; return one receipt for all of them.

        Waits while a target's buffer is full (backpressure). A message no
        target can ever take settles its leg as rejected instead of waiting.
        """
        if self._closed:
            raise trio.ClosedResourceError("the hub is closed")
        receipt = Receipt()
        self._inflight += 1
        receipt.add_done_callback(self._settled)
        try:
            if not isinstance(messages, list):
                messages = list(messages)
            names = list(map(_DESTINATION, messages))
            if names and names.count(names[0]) == len(names):
                # All for one destination (a protocol's window, typically).
                await self._route(messages, receipt)
                return receipt
            # Runs of messages for one destination are routed and put together.
            run: list[Message] = []
            for message in messages:
                if run and message.destination != run[0].destination:
                    await self._route(run, receipt)
                    run = []
                run.append(message)
            if run:
                await self._route(run, receipt)
        finally:
            # Legs already handed out still settle; the receipt settles after them.
            receipt.seal()
        return receipt

    async def _route(self, run: list[Message], receipt: Receipt) -> None:
        """Put ``run`` (messages for one destination) into each of its targets."""
        name = run[0].destination
        for target in self.router.targets(name):
            copies = run
            if target != name and not target.startswith(UPSTREAM_PREFIX):
                copies = [m._replace(destination=target) for m in run]
            try:
                dest = self.destination(target)
            except LookupError as e:
                receipt.add_legs(len(copies))
                receipt.settle_legs(len(copies), Outcome.REJECTED, str(e))
                continue
            await dest.put_many(copies, receipt)

    def _settled(self, _: Receipt) -> None:
        self._inflight -= 1
        if self._inflight == 0 and self._idle:
            self._idle.unpark_all()

    @property
    def inflight(self) -> int:
        """Publishes whose receipts have not settled yet."""
        return self._inflight

    async def wait_idle(self) -> None:
        """Wait until every receipt handed out so far has settled."""
        while self._inflight:
            await self._idle.park()

    def close(self) -> None:
        """Refuse new work and wake every waiting publisher and subscriber."""
        self._closed = True
        for d in self._destinations.values():
            d.close()
