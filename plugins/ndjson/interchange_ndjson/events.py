"""The ndjson protocol's events: one per kind of line, as frozen data.

Client to server: :class:`Publish`, :class:`PublishMany`, :class:`Call`,
:class:`ReplyTo`, :class:`Subscribe`, :class:`Unsubscribe`, :class:`Credit`,
:class:`Ack`, :class:`Nack`, :class:`Ping`.
Server to client: :class:`Published` (with an :class:`ItemResult` per message
when it answers a :class:`PublishMany`), :class:`Replied`, :class:`Deliver`,
:class:`End`, :class:`Pong`, :class:`Error`. The end of input is the
:class:`~gateway.sdk.ConnectionClosed` every codec shares, re-exported here.

Two ops name a line in both directions, with different fields: ``ack``
(:class:`Ack` by ``tag`` from a client, :class:`Published` by ``id`` from the
server) and ``reply`` (:class:`ReplyTo` by ``tag`` from a client,
:class:`Replied` by ``id`` from the server). The codec's role decides which.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gateway.sdk import ConnectionClosed, Filter

__all__ = [
    "Ack",
    "Call",
    "ConnectionClosed",
    "Credit",
    "Deliver",
    "End",
    "Error",
    "Event",
    "ItemResult",
    "Nack",
    "Ping",
    "Pong",
    "Publish",
    "PublishMany",
    "Published",
    "Replied",
    "ReplyTo",
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
class PublishMany(Event):
    """``{"op":"pub","messages":[…]}``: publish 1 to ``MAX_BATCH`` messages at once.

    Each item is a :class:`Publish` whose ``id`` is None; the one
    :class:`Published` answer, by ``id``, has a ``results`` entry per item.
    """

    messages: tuple[Publish, ...]
    id: str | int | None = None


@dataclass(frozen=True, slots=True)
class Call(Event):
    """``{"op":"call"}``: send a request and wait for one reply.

    Answered by :class:`Replied` with the same ``id``, or by a
    :class:`Published` (``failed``/``rejected``, with a reason) when no reply
    came within ``timeout`` seconds or nobody could take the call.
    """

    body: bytes
    #: None: the listener's configured destination.
    destination: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None
    id: str | int | None = None
    #: Seconds to wait for the reply: more than 0, at most ``MAX_CALL_TIMEOUT``.
    timeout: float = 30.0


@dataclass(frozen=True, slots=True)
class ReplyTo(Event):
    """``{"op":"reply","tag":…}`` from a subscriber: the answer to the delivered call ``tag``."""

    tag: int
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None
    #: 0: success; otherwise an error, numbered as gRPC status codes (0..2**31-1).
    code: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class ItemResult:
    """How one message of a :class:`PublishMany` settled (an entry of ``results``)."""

    #: ``delivered``, ``failed`` (retry may succeed) or ``rejected``.
    status: str
    reason: str = ""
    #: The offset the message got in each stored destination, by name.
    positions: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Published(Event):
    """``{"op":"ack"}`` from the server: how the publish with ``id`` settled."""

    id: str | int | None
    #: ``delivered``, ``failed`` (retry may succeed) or ``rejected``.
    status: str
    reason: str = ""
    #: The offset the message got in each stored destination (``"pos"``).
    positions: Mapping[str, int] | None = None
    #: One per message when answering a :class:`PublishMany`, in order.
    results: tuple[ItemResult, ...] | None = None


@dataclass(frozen=True, slots=True)
class Replied(Event):
    """``{"op":"reply","id":…}`` from the server: the reply to the :class:`Call` ``id``."""

    id: str | int | None
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    content_type: str | None = None
    #: 0: success; otherwise an error, numbered as gRPC status codes (0..2**31-1).
    code: int = 0
    error: str = ""


@dataclass(frozen=True, slots=True)
class Subscribe(Event):
    """``{"op":"sub"}``: start receiving ``destination``."""

    destination: str
    group: str | None = None
    #: Initial credit in messages; None: unlimited, bounded by ``window``.
    credit: int | None = None
    #: Deliveries that may be outstanding (not acked) at once.
    window: int = 100
    #: Only messages whose headers match; None: every message.
    filter: Filter | None = None
    #: Where to start reading a stored destination: ``"earliest"``, ``"latest"``
    #: or an offset; None: the destination's default.
    start: str | int | None = None
    #: Where a finite read stops (``"latest"``: the end when subscribing, or an
    #: offset); None: never. An :class:`End` follows the last message.
    end: str | int | None = None


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
    #: The message's offset in a stored destination (``"pos"``).
    position: int | None = None
    #: A :class:`Call`: answer it with :class:`ReplyTo` by ``tag``.
    call: bool = False
    #: Seconds left to reply to a call.
    reply_within: float | None = None


@dataclass(frozen=True, slots=True)
class End(Event):
    """``{"op":"end"}``: a finite subscription delivered everything up to its end and is gone."""

    destination: str


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
