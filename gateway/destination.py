"""The seam between the hub and whatever keeps messages: in-memory topics now,
durable segment-store streams later.

A destination takes copies of messages (each a *leg* of the publisher's
receipt) and hands them to subscriptions that pull with credit and ack. An
implementation decides when a leg settles: an in-memory topic when every
group that got a copy acked it, a durable stream when the copy is on disk.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

from .model import Message, Outcome
from .receipts import Receipt

__all__ = ["Delivery", "Destination", "DestinationProvider", "Subscription"]


class Delivery(NamedTuple):
    """One message handed to a subscriber; ack or nack it by ``tag``."""

    tag: int
    message: Message
    #: True when an earlier delivery of this copy was not acked.
    redelivered: bool = False


class Subscription(ABC):
    """A consumer's handle: pull with credit, then ack or nack each delivery.

    ``credit`` is demand in messages (``None``: unlimited), consumed by each
    delivery; ``max_unacked``/``max_unacked_bytes`` bound what may be delivered
    and not yet acked. Closing hands unacked deliveries back for redelivery.
    """

    destination: str
    group: str | None

    @property
    @abstractmethod
    def credit(self) -> int | None:
        """Messages this subscriber may still receive (``None`` = unlimited)."""

    @property
    @abstractmethod
    def unacked(self) -> int:
        """Deliveries not yet acked or nacked."""

    @abstractmethod
    def grant(self, n: int) -> None:
        """Add ``n`` messages of credit (Reactive Streams ``request(n)``)."""

    @abstractmethod
    async def receive(self, max_count: int | None = None) -> list[Delivery]:
        """Wait for at least one delivery and return up to ``max_count`` of them.

        Raises ``trio.ClosedResourceError`` once the subscription or hub closed.
        """

    @abstractmethod
    def ack(self, tag: int) -> None:
        """The delivery is safe at the subscriber: settle its leg as delivered."""

    def ack_many(self, tags: Iterable[int]) -> None:
        """Ack several deliveries (one call per window instead of one per event)."""
        for tag in tags:
            self.ack(tag)

    @abstractmethod
    def nack(
        self, tag: int, *, requeue: bool = True, outcome: Outcome = Outcome.FAILED, reason: str = ""
    ) -> None:
        """Give a delivery back: redeliver it, or settle it with ``outcome``."""

    @abstractmethod
    def close(self) -> None:
        """Leave: unacked deliveries are redelivered to the group (idempotent)."""

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Destination(ABC):
    """Something a message can be published to and subscribed from."""

    name: str

    @abstractmethod
    def check(self, message: Message) -> str | None:
        """Why ``message`` can never be taken (e.g. larger than the buffer), or None."""

    @abstractmethod
    async def put(self, message: Message, receipt: Receipt) -> None:
        """Take a copy, adding its legs to ``receipt``; wait while the buffer is full."""

    async def put_many(self, messages: Sequence[Message], receipt: Receipt) -> None:
        """Take copies of ``messages`` in order (a fast path where a destination has one)."""
        for message in messages:
            problem = self.check(message)
            if problem is not None:
                receipt.add_legs()
                receipt.settle_leg(Outcome.REJECTED, problem)
            else:
                await self.put(message, receipt)

    @abstractmethod
    def subscribe(
        self,
        group: str | None = None,
        *,
        credit: int | None = None,
        max_unacked: int = 1024,
        max_unacked_bytes: int | None = None,
    ) -> Subscription:
        """Join ``group`` (competing consumers), or a group of one when ``None``."""

    @abstractmethod
    def declare_group(self, group: str) -> None:
        """Create a named group now, so it collects messages before a member joins."""

    @abstractmethod
    def close(self) -> None:
        """Wake every waiter with ``trio.ClosedResourceError``; called at shutdown."""

    def stats(self) -> dict[str, object]:
        """Counters for operators (queue depth, bytes); empty by default."""
        return {}


class DestinationProvider(Protocol):
    """Supplies destinations of another kind (the durable store) by name."""

    def open(self, name: str) -> Destination | None:
        """Return the destination for ``name``, or None to let the hub use a topic."""
