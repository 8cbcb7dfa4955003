"""The seam between the hub and whatever keeps messages: in-memory topics,
queues and logs now, durable segment-store streams later.

A destination takes copies of messages (each a *leg* of the publisher's
receipt) and hands them to subscriptions that pull with credit and ack. An
implementation decides when a leg settles: a topic or queue when the group
that got a copy acked (or answered) it, a log when the copy is stored.

Destinations that keep a log give every delivery a :class:`Position`, let a
subscription start at ``"earliest"``, ``"latest"`` or a position, keep a
committed position per named group, and end a finite read with
:class:`EndOfStream`.
"""

from __future__ import annotations

import functools
import itertools
import operator
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

import trio

from gateway.core.model import MESSAGE_OVERHEAD, Message, Outcome, Position, Positions, Reply
from gateway.core.reasons import Reason, Refusal
from gateway.core.receipts import Receipt

if TYPE_CHECKING:
    from gateway.core.filters import Filter

__all__ = [
    "QUEUE_GROUP",
    "Delivery",
    "Destination",
    "DestinationFigures",
    "DestinationInfo",
    "DestinationProvider",
    "EndOfStream",
    "GroupFigures",
    "Kind",
    "LogFigures",
    "StartAt",
    "StopAt",
    "Subscription",
]

#: The one group of a queue, which every subscriber joins.
QUEUE_GROUP = "queue"
#: What a destination does with messages (see docs/architecture.md).
Kind = Literal["topic", "queue", "log"]
#: Where a subscription starts reading a log. A ``Position`` of a partition the
#: destination does not have is a ValueError; ``Positions`` name one position in
#: each of several partitions (a log of one partition takes only its own).
StartAt = Literal["earliest", "latest"] | Position | Positions | int
#: Where a finite read of a log ends (exclusive); ``"latest"``: the tail when
#: subscribing. Partitions as for :data:`StartAt`.
StopAt = Literal["latest"] | Position | Positions | int


class EndOfStream(trio.EndOfChannel):
    """A finite read reached its end: every delivery before it was handed out."""


class Delivery(NamedTuple):
    """One message handed to a subscriber; ack, nack or reply to it by ``tag``."""

    tag: int
    message: Message
    #: True when an earlier delivery of this copy was not acked.
    redelivered: bool = False
    #: Where the message sits, for destinations that keep a log; else None.
    position: Position | None = None
    #: For a call: the trio time by which the caller wants a reply; else None.
    reply_by: float | None = None


@dataclass(frozen=True, slots=True)
class DestinationInfo:
    """What a protocol may need to know about a destination before using it."""

    name: str
    kind: Kind
    #: Every body is exactly this many bytes (fixed-size elements), or None.
    element_size: int | None = None
    #: Subscriptions may start at a position, and deliveries carry one.
    positions: bool = False
    #: The name of the one group every subscriber of a queue joins.
    queue_group: str | None = None


@dataclass(frozen=True, slots=True)
class GroupFigures:
    """One group of a destination, as operators see it (status, metrics).

    A partitioned log's group is summed over its partitions (``members``: the
    most of any partition).
    """

    name: str
    #: Subscribers in the group now.
    members: int
    #: Messages waiting to be handed out: a topic's queued copies; a log's
    #: offsets from the group's cursor to the tail, plus those a queue's
    #: selectors passed over (never delivered, held for another consumer).
    queued: int
    #: Deliveries the group's subscribers hold, not yet acked or nacked.
    unacked: int
    #: Messages the group has not settled yet: a topic's queued plus unacked
    #: copies; a log's, from the group's committed position to the tail.
    backlog: int
    #: Bytes of ``backlog`` as charged to the group's buffer; None where groups
    #: share one store and have no buffer of their own (logs).
    backlog_bytes: int | None = None
    #: How full the group's buffer is, the larger of its bytes and messages
    #: over their bounds (at 1 publishers wait); None for logs.
    fill: float | None = None
    #: The first offset the group has not settled (logs; summed over
    #: partitions), else None.
    committed: int | None = None
    #: Messages retention dropped before the group settled them (logs).
    dropped: int = 0
    #: Messages the group's subscribers rejected with a nack without requeue (logs).
    rejected: int = 0
    #: The group's filter as text, or None.
    filter: str | None = None
    #: A queue's group: queued messages that no present consumer's selector
    #: matches (0 while a consumer without a selector, or none at all, is
    #: present); None for a group of a topic or log that is no queue.
    unmatched: int | None = None

    @property
    def anonymous(self) -> bool:
        """A group of one, made by a subscriber that named no group."""
        return self.name.startswith("~")

    @property
    def full(self) -> bool:
        """Its buffer is full: publishers to the destination wait for it."""
        return self.fill is not None and self.fill >= 1


@dataclass(frozen=True, slots=True)
class LogFigures:
    """What a destination that keeps a log retains (summed over its partitions)."""

    #: The offset of the oldest retained message (summed over partitions).
    first: int
    #: The offset the next message gets, the tail (summed over partitions).
    next: int
    #: Bytes retained now.
    retained_bytes: int
    #: The bound of retention (``retain``), of each partition.
    retain_bytes: int
    #: ``"block"`` (publishers wait for groups to commit) or ``"drop_oldest"``.
    overflow: str
    #: Publishes waiting now for room in the log.
    blocked: int = 0
    #: Publishes waiting now for the disk under the log to have room.
    held_by_storage: int = 0
    #: Partitions the destination has.
    partitions: int = 1


@dataclass(frozen=True, slots=True)
class DestinationFigures:
    """A destination's figures, read through :meth:`Destination.figures` so that
    status pages and metrics need not know which class keeps the messages.

    "Kept" is the destination's own store beside its groups: a topic's copies
    that departed anonymous groups left behind (the next group adopts them), a
    log's retention.
    """

    #: ``"topic"``, ``"queue"`` or ``"log"``, as :attr:`DestinationInfo.kind`.
    kind: Kind
    #: Messages it took (stored, or discarded by a topic without groups).
    received: int
    #: Deliveries it handed to subscribers (redeliveries included).
    delivered: int
    #: Deliveries subscribers acked (or answered).
    acked: int
    #: Messages not settled yet: a topic's copies held by every group plus the
    #: kept ones; a log's, what the group furthest behind has not committed.
    backlog: int
    #: Bytes of ``backlog``, or None when not known (a log with groups).
    backlog_bytes: int | None
    #: Messages and bytes of the destination's own store, and how full it is
    #: (0 to 1; a partitioned log: its fullest partition).
    kept: int
    kept_bytes: int
    kept_fill: float
    #: A publisher waits for room now (a topic: some group's buffer is full).
    full: bool
    #: Every group, in the order they came.
    groups: tuple[GroupFigures, ...] = ()
    #: The bound in bytes: a topic's per group (``buffer_bytes``), a log's
    #: retention (per partition).
    limit_bytes: int = 0
    #: A topic's bound in messages per group (``buffer_messages``); None for logs.
    limit_messages: int | None = None
    #: Messages a topic took while no group subscribed (None: not a topic).
    discarded: int | None = None
    #: Messages a topic stored for no group, since no group's filter matched.
    filtered: int = 0
    #: A queue's messages that no present consumer's selector matches: they wait
    #: for one that does (see :attr:`GroupFigures.unmatched`); None: no queue.
    unmatched: int | None = None
    #: What a log retains (None: it keeps no log).
    log: LogFigures | None = None


class Subscription(ABC):
    """A consumer's handle: pull with credit, then ack or nack each delivery.

    ``credit`` is demand in messages (``None``: unlimited), consumed by each
    delivery; ``max_unacked``/``max_unacked_bytes`` bound what may be delivered
    and not yet acked. Closing hands unacked deliveries back for redelivery.
    """

    destination: str
    group: str | None
    #: Only messages whose headers match are delivered (None: every message).
    filter: Filter | None = None

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
    def take(self, max_count: int | None = None) -> list[Delivery]:
        """What :meth:`receive` would return now, without waiting: ``[]`` where it would
        wait (and for ``max_count=0``).

        With :meth:`watch`, one task can serve several subscriptions under one
        window: it takes from each no more than the window has room for, and
        waits on all of them at once. Raises as :meth:`receive` does:
        ``trio.ClosedResourceError`` once closed, :class:`EndOfStream` once a
        finite read ended.
        """

    @abstractmethod
    def watch(self, lot: trio.lowlevel.ParkingLot) -> None:
        """Unpark every task in ``lot`` whenever this subscription may have something
        new to take (whenever a waiting :meth:`receive` would wake: a message
        arrived, credit or room came back, the subscription closed), until it
        closes. A wake-up is a hint, to be checked with :meth:`take`."""

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

    def reply(self, tag: int, reply: Reply) -> None:
        """Answer a call (a delivery with ``reply_by`` set): settles it like an ack and
        hands ``reply`` to the caller. Raises ValueError for a delivery that is no call."""
        raise ValueError(f"destination {self.destination!r} takes no calls")

    @property
    def committed(self) -> Position | None:
        """The group's committed position: every message before it was settled for
        the group (acked, skipped by its filter, rejected with a nack without
        requeue, or dropped by retention).

        None where the destination keeps no log.
        """
        return None

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
    def check(self, message: Message) -> Refusal | None:
        """Why ``message`` can never be taken (e.g. larger than the buffer), or None."""

    @abstractmethod
    async def put(self, message: Message, receipt: Receipt, index: int = 0) -> None:
        """Take a copy, adding its legs to ``receipt``; wait while the buffer is full.

        ``index`` is the message's place in the publish, for the receipt's
        per-message results.
        """

    async def put_many(self, messages: Sequence[Message], receipt: Receipt, base: int = 0) -> None:
        """Take copies of ``messages`` (indexes ``base``… of the publish) in order."""
        for i, message in enumerate(messages, base):
            problem = self.check(message)
            if problem is not None:
                receipt.add_legs()
                receipt.settle(i, Outcome.REJECTED, problem.text, reason_code=problem.code)
            else:
                await self.put(message, receipt, i)

    @property
    @abstractmethod
    def info(self) -> DestinationInfo:
        """Its kind and what subscribers and publishers must know about it."""

    @abstractmethod
    def subscribe(
        self,
        group: str | None = None,
        *,
        credit: int | None = None,
        max_unacked: int = 1024,
        max_unacked_bytes: int | None = None,
        start: StartAt | None = None,
        end: StopAt | None = None,
        filter: Filter | None = None,
        positions: bool = True,
    ) -> Subscription:
        """Join ``group`` (competing consumers), or a group of one when ``None``.

        ``start`` and ``end`` need a destination with positions (a log); a topic
        or queue takes only ``"latest"`` (what it does anyway) and raises
        ValueError for anything else. ``start`` applies to a new group; a named
        group that exists resumes where it stopped. ``filter`` belongs to the
        group: members of one named group must agree on it. On a queue it is the
        member's own *selector* instead: the member takes only the messages it
        matches, and the others wait for a consumer that wants them.
        ``positions=False`` says the subscriber never reads
        :attr:`Delivery.position`: a log then leaves it None instead of making one
        per delivery (for protocols that carry no positions).
        """

    @abstractmethod
    def declare_group(self, group: str) -> None:
        """Create a named group now, so it collects messages before a member joins."""

    @abstractmethod
    def close(self) -> None:
        """Wake every waiter with ``trio.ClosedResourceError``; called at shutdown."""

    @abstractmethod
    def figures(self) -> DestinationFigures:
        """Its figures now (backlog, groups, fill, counts) for status and metrics."""

    def stats(self) -> dict[str, object]:
        """Counters for operators (queue depth, bytes); empty by default."""
        return {}


class DestinationProvider(Protocol):
    """Supplies destinations of another kind (the durable store) by name."""

    def open(self, name: str) -> Destination | None:
        """Return the destination for ``name``, or None to let the hub use a topic."""


def refusal(
    destination: str, message: Message, max_bytes: int, element_size: int | None = None
) -> Refusal | None:
    """Why ``destination`` can never take ``message`` (too large for its buffer, or
    not one fixed-size element), or None: every destination's :meth:`Destination.check`."""
    if element_size is not None and len(message.body) != element_size:
        return Refusal(
            Reason.WRONG_SIZE,
            f"destination {destination!r} takes elements of exactly {element_size} bytes, "
            f"not {len(message.body)}",
        )
    if message.size > max_bytes:
        return Refusal(
            Reason.TOO_LARGE,
            f"message of {message.size} bytes exceeds the buffer of destination "
            f"{destination!r} ({max_bytes} bytes)",
        )
    return None


#: Builds a Delivery from a plain 5-tuple without the named tuple's Python-level
#: ``__new__`` (destinations make one per message handed out).
new_delivery = functools.partial(tuple.__new__, Delivery)

_anonymous_ids = itertools.count(1)
_HEADERS = operator.attrgetter("headers")
_BODY = operator.attrgetter("body")


def anonymous_group() -> str:
    """A fresh name for the group of one an anonymous subscriber makes."""
    return f"~{next(_anonymous_ids)}"


def message_sizes(messages: Sequence[Message]) -> list[int]:
    """``Message.size`` of each message; C-level loops when none has headers."""
    if any(map(_HEADERS, messages)):
        return [m.size for m in messages]
    return list(map(MESSAGE_OVERHEAD.__add__, map(len, map(_BODY, messages))))
