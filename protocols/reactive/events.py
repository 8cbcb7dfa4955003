"""What a reactive-streams connection reports to its driver: one frozen dataclass each.

``subscriber`` is always an id of one of the connection's two tables (see
:mod:`.streams`): events about *my subscriptions* (:class:`Accepted`,
:class:`Elements`, :class:`Completed`, :class:`Failed`) carry the ids I chose;
events about *subscriptions to me* (:class:`SubscribeRequested`,
:class:`DemandAdded`, :class:`Cancelled`, :class:`BadRequest`) carry the ids
the peer chose. What arrives for a subscription I cancelled (elements, its
terminal signal) is parsed and dropped: no event. The end of input is the toolkit's
:class:`~gateway.sdk.ConnectionClosed`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.sdk import ConnectionClosed

__all__ = [
    "Accepted",
    "BadRequest",
    "Cancelled",
    "Completed",
    "ConnectionClosed",
    "DemandAdded",
    "Elements",
    "Event",
    "Failed",
    "GoodbyeAnswered",
    "GoodbyeReceived",
    "Hello",
    "Pinged",
    "Ponged",
    "Skipped",
    "SubscribeRequested",
]


class Event:
    """Base of every event; never instantiated itself."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Hello(Event):
    """The peer's hello: its version (ours) and the extensions both sides support."""

    version: int
    extensions: frozenset[int]


@dataclass(frozen=True, slots=True)
class SubscribeRequested(Event):
    """The peer subscribes to ``publisher`` (a new id in "subscriptions to me"). The
    driver answers ``Subscribed`` (then elements) or ``OnError`` (a rejection)."""

    subscriber: int
    publisher: str
    initial_demand: int


@dataclass(frozen=True, slots=True)
class DemandAdded(Event):
    """The peer requested ``demand`` more; ``outstanding`` is what may be sent now
    (:data:`~.messages.MAX_DEMAND`: unbounded)."""

    subscriber: int
    demand: int
    outstanding: int


@dataclass(frozen=True, slots=True)
class BadRequest(Event):
    """The peer requested a non-positive amount (RS §3.9): the stream is over, and
    the driver owes ``OnError(subscriber, error)``, the only send it still allows."""

    subscriber: int
    error: str


@dataclass(frozen=True, slots=True)
class Cancelled(Event):
    """A subscription to me ended by the peer: a cancel, or its goodbye (``reason``)."""

    subscriber: int
    reason: str = "cancel"


@dataclass(frozen=True, slots=True)
class Accepted(Event):
    """My subscription was accepted (``subscribed``); elements are ``element_size``
    bytes each (0: any size)."""

    subscriber: int
    element_size: int


@dataclass(frozen=True, slots=True)
class Elements(Event):
    """Elements for my subscription, all a read held in a row (packed and reassembled
    split elements included), in order."""

    subscriber: int
    elements: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Completed(Event):
    """My subscription ended normally."""

    subscriber: int


@dataclass(frozen=True, slots=True)
class Failed(Event):
    """My subscription ended with ``error`` (a rejection when before :class:`Accepted`;
    ``"goodbye: <reason>"`` when the peer's goodbye ended it)."""

    subscriber: int
    error: str


@dataclass(frozen=True, slots=True)
class GoodbyeReceived(Event):
    """The peer said goodbye and every stream ended: the events that follow are one
    :class:`Failed` (``"goodbye: <reason>"``) per subscription of mine and one
    :class:`Cancelled` (same reason) per subscription to me. Unless it answers ours
    (``answers_ours``), we owe ``Goodbye``."""

    reason: str
    answers_ours: bool


@dataclass(frozen=True, slots=True)
class GoodbyeAnswered(Event):
    """The peer answered our goodbye with a ``goodbyeAck``: the driver may close."""

    message: str


@dataclass(frozen=True, slots=True)
class Pinged(Event):
    """A keepalive ping: the driver sends ``Pong(payload)``."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Ponged(Event):
    """The answer to one of our pings."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Skipped(Event):
    """A message of an extension not negotiated (type 64-127), skipped: for counting."""

    type: int
