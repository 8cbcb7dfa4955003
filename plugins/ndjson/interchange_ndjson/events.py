"""The ndjson protocol's events: one per kind of line, as frozen data.

Client to server: :class:`Publish`, :class:`Subscribe`, :class:`Unsubscribe`,
:class:`Credit`, :class:`Ack`, :class:`Nack`, :class:`Ping`.
Server to client: :class:`Published`, :class:`Deliver`, :class:`Pong`,
:class:`Error`. :class:`ConnectionClosed` marks the end of input.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "Ack",
    "ConnectionClosed",
    "Credit",
    "Deliver",
    "Error",
    "Event",
    "Nack",
    "Ping",
    "Pong",
    "Publish",
    "Published",
    "Subscribe",
    "Unsubscribe",
]


class Event:
    """Base of every ndjson event; never instantiated itself."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Publish(Event):
    """``{"op":"pub"}``, or any object without ``"op"``: publish one message."""

    body: bytes
    #: None: the listener's configured destination.
    destination: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None
    #: Echoed in the :class:`Published` answer; any JSON scalar.
    id: str | int | None = None


@dataclass(frozen=True, slots=True)
class Published(Event):
    """``{"op":"ack"}`` from the server: how the publish with ``id`` settled."""

    id: str | int | None
    #: ``delivered``, ``failed`` (retry may succeed) or ``rejected``.
    status: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Subscribe(Event):
    """``{"op":"sub"}``: start receiving ``destination``."""

    destination: str
    group: str | None = None
    #: Initial credit in messages; None: unlimited, bounded by ``window``.
    credit: int | None = None
    #: Deliveries that may be outstanding (not acked) at once.
    window: int = 100


@dataclass(frozen=True, slots=True)
class Unsubscribe(Event):
    destination: str


@dataclass(frozen=True, slots=True)
class Credit(Event):
    """``{"op":"credit"}``: ``n`` more messages for the subscription to ``destination``."""

    destination: str
    n: int


@dataclass(frozen=True, slots=True)
class Deliver(Event):
    """``{"op":"msg"}``: a message for a subscriber; ack or nack it by ``tag``."""

    tag: int
    destination: str
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None
    redelivered: bool = False


@dataclass(frozen=True, slots=True)
class Ack(Event):
    """A subscriber acknowledges the delivery ``tag``: it is safe on its side."""

    tag: int


@dataclass(frozen=True, slots=True)
class Nack(Event):
    """A subscriber gives delivery ``tag`` back: redeliver it, or reject it."""

    tag: int
    requeue: bool = True


@dataclass(frozen=True, slots=True)
class Ping(Event):
    pass


@dataclass(frozen=True, slots=True)
class Pong(Event):
    pass


@dataclass(frozen=True, slots=True)
class Error(Event):
    """``{"op":"error"}``: the sender found a protocol error and will close."""

    message: str


@dataclass(frozen=True, slots=True)
class ConnectionClosed(Event):
    """The peer closed its side; no event follows."""
