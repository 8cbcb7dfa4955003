"""The ndjson codecs: one JSON object per line, parsed without doing any I/O.

:class:`ServerCodec` is the gateway's side of a connection, :class:`ClientCodec`
a client's. Both stand on the toolkit's
:class:`~gateway.protocol.lifecycle.Lifecycle` (see ``docs/codecs.md``): feed
received bytes to ``receive_data`` (``b""`` means the peer closed), then call
``next_event`` until it returns :data:`~gateway.sdk.NEED_DATA`; a
:class:`~gateway.sdk.ConnectionClosed` follows the last line once the
peer closed, and every call after. ``send`` turns an event into the bytes to
write. Lines are found in the lifecycle's
:class:`~gateway.sdk.ReceiveBuffer`, which remembers how far it
searched, so a long line arriving in small pieces is scanned once; each line
is turned into an event by :mod:`.frames`, and back.

A line longer than ``max_line`` bytes, invalid JSON, or an event the peer's
role may not send is a :class:`~gateway.core.errors.RemoteProtocolError`; the
codec is then in ``ERROR`` for good and the driver answers with an ``error``
line (the one thing a server codec still sends) and closes. Sending an event
this role may not send, one its state does not allow, or one the peer would
refuse (an empty batch, a call timeout out of range) is a
:class:`~gateway.core.errors.LocalProtocolError`.

The state, in the manner of h11, is what each side may still send:

* a client may ``ack``/``nack`` only a delivery it received and has not
  settled, and ``reply`` only to such a delivery that is a call; it may send
  ``credit``/``unsub`` only for a destination it subscribed (and that has not
  ended), and ``sub`` only for one it has not;
* a server may send ``msg``/``end`` only for a destination the client
  subscribed, and ``ack``/``reply`` only while a publish or call awaits its
  answer (counted, since ids may repeat or be null).

What it remembers is bounded by the protocol: per subscription, at most its
``window`` unsettled deliveries (a server that delivers more has broken the
protocol), plus the window of an earlier subscription to the same
destination whose last deliveries may still be on the way after ``unsub``.
A delivery for a destination not subscribed (after ``unsub``) is returned but
not remembered: the server has forgotten it too, so it cannot be settled.

The role picks the parser, which is how ``ack`` and ``reply`` mean different
things in each direction: from a client they answer a delivery by ``tag``,
from the server they answer a publish or a call by ``id``.
"""

from __future__ import annotations

import enum
from typing import ClassVar, Final

from gateway.sdk import (
    NEED_DATA,
    CodecState,
    ConnectionClosed,
    Lifecycle,
    LocalProtocolError,
    NeedData,
    RemoteProtocolError,
)

from .events import (
    Ack,
    Call,
    Credit,
    Deliver,
    End,
    Error,
    Event,
    Nack,
    Ping,
    Pong,
    Publish,
    Published,
    PublishMany,
    Replied,
    ReplyTo,
    Subscribe,
    Unsubscribe,
)
from .frames import encode, parse_client_line, parse_server_line

__all__ = [
    "CLIENT",
    "DEFAULT_MAX_LINE",
    "NEED_DATA",
    "SERVER",
    "ClientCodec",
    "CodecState",
    "Role",
    "ServerCodec",
]


class Role(enum.Enum):
    """Which side a codec speaks for."""

    CLIENT = "client"
    SERVER = "server"


CLIENT: Final = Role.CLIENT
SERVER: Final = Role.SERVER

#: 1 MiB: one debug message per line is rarely bigger; raise it per listener.
DEFAULT_MAX_LINE = 1024 * 1024

_OPEN: Final = CodecState.OPEN
_ERROR: Final = CodecState.ERROR

_CLIENT_SENDS = (
    Publish,
    PublishMany,
    Call,
    ReplyTo,
    Subscribe,
    Unsubscribe,
    Credit,
    Ack,
    Nack,
    Ping,
)
_SERVER_SENDS = (Published, Replied, Deliver, End, Pong, Error)
#: Tuples, not unions: ``isinstance`` with a union is several times slower.
_SETTLES = (Ack, Nack, ReplyTo)
_BY_DESTINATION = (Credit, Unsubscribe, Deliver, End)


class _Subscription:
    """A subscription a client sent: its deliveries not settled yet, and how many may be."""

    __slots__ = ("limit", "unsettled")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.unsettled = 0


class _NdjsonCodec(Lifecycle):
    """What both roles share: lines in, events out, events to lines."""

    #: The side this codec speaks for, and the events it may send.
    role: ClassVar[Role]
    _allowed: ClassVar[tuple[type[Event], ...]]

    def __init__(self, *, max_line: int = DEFAULT_MAX_LINE) -> None:
        super().__init__()
        self.max_line = max_line

    # -- input ----------------------------------------------------------------
    # (held_bytes is the lifecycle's: the receive buffer as allocated, the parsed
    # lines it has not dropped yet, at most as many bytes, included.)

    def next_event(self) -> Event | ConnectionClosed | NeedData:
        """The next event, :data:`NEED_DATA`, or :class:`ConnectionClosed` (every time
        once the peer closed and every line was returned)."""
        if self._state is not _OPEN:
            return self._not_open()
        buf = self._buffer
        while True:
            start = buf.pos
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > self.max_line:
                    self._fail(f"line longer than {self.max_line} bytes")
                if buf.eof:
                    if buf.data[start:].strip():
                        self._fail("connection closed in the middle of a line")
                    return self._closed()
                return NEED_DATA
            if nl - start > self.max_line:
                self._fail(f"line longer than {self.max_line} bytes")
            line = bytes(buf.data[start:nl]).rstrip(b"\r")
            buf.advance(nl + 1)
            if not line.strip():
                continue
            try:
                event = self._parse(line)
                self._received(event)
            except RemoteProtocolError as e:
                self._fail(e)
            return event

    @staticmethod
    def _parse(line: bytes) -> Event:
        """The event a line from the peer says (the peer's role decides)."""
        raise NotImplementedError

    def _received(self, event: Event) -> None:
        """Check a received event against the state, and update it."""

    # -- output ---------------------------------------------------------------
    def send(self, event: Event) -> bytes:
        """The bytes for ``event``, which this role and the state must allow (in
        ``ERROR``, only an :class:`Error` line, which a server sends before closing)."""
        if not isinstance(event, self._allowed):
            raise LocalProtocolError(f"a {self.role.value} cannot send {type(event).__name__}")
        if self._state is _ERROR and not isinstance(event, Error):
            self._refuse(f"send {type(event).__name__}")
        data = encode(event)
        self._sending(event)  # last: a refused event changes nothing
        if isinstance(event, Error):
            self._enter_error()
        return data

    def _sending(self, event: Event) -> None:
        """Check an event about to be sent against the state, and update it."""


class ClientCodec(_NdjsonCodec):
    """A client's side of an ndjson connection."""

    role = CLIENT
    _allowed = _CLIENT_SENDS
    _parse = staticmethod(parse_server_line)

    def __init__(self, *, max_line: int = DEFAULT_MAX_LINE) -> None:
        super().__init__(max_line=max_line)
        # Subscriptions by destination, unsettled deliveries by tag (those that are
        # calls in _calls), and the windows of subscriptions left by unsub.
        self._subs: dict[str, _Subscription] = {}
        self._tags: dict[int, _Subscription] = {}
        self._calls: set[int] = set()
        self._left: dict[str, int] = {}

    def _received(self, event: Event) -> None:
        if type(event) is Deliver:
            sub = self._subs.get(event.destination)
            if sub is None:
                return  # not subscribed (left with unsub): the server forgot it too
            if sub.unsettled >= sub.limit:
                raise RemoteProtocolError(
                    f"more unsettled deliveries for {event.destination!r} than its window"
                )
            tags = self._tags
            known = len(tags)
            tags[event.tag] = sub
            if len(tags) == known:
                raise RemoteProtocolError(f"tag {event.tag} delivered again before it was settled")
            sub.unsettled += 1
            if event.call:
                self._calls.add(event.tag)
        elif type(event) is End:
            # Its deliveries may still be settled; the destination may be subscribed again.
            self._subs.pop(event.destination, None)

    def _sending(self, event: Event) -> None:
        if isinstance(event, _SETTLES):
            tag = event.tag
            if isinstance(event, ReplyTo) and tag not in self._calls:
                raise LocalProtocolError(
                    f"the delivery {tag} is not a call"
                    if tag in self._tags
                    else f"no unsettled delivery has the tag {tag}"
                )
            sub = self._tags.pop(tag, None)
            if sub is None:
                raise LocalProtocolError(f"no unsettled delivery has the tag {tag}")
            sub.unsettled -= 1
            if self._calls:
                self._calls.discard(tag)
        elif isinstance(event, Subscribe):
            if event.destination in self._subs:
                raise LocalProtocolError(f"already subscribed to {event.destination!r}")
            self._subs[event.destination] = _Subscription(
                event.window + self._left.pop(event.destination, 0)
            )
        elif isinstance(event, _BY_DESTINATION):
            sub = self._subs.get(event.destination)
            if sub is None:
                raise LocalProtocolError(f"not subscribed to {event.destination!r}")
            if isinstance(event, Unsubscribe):
                # The server forgets its deliveries; more may still arrive (not kept).
                del self._subs[event.destination]
                self._left[event.destination] = sub.limit
                self._tags = {t: s for t, s in self._tags.items() if s is not sub}
                self._calls.intersection_update(self._tags)


class ServerCodec(_NdjsonCodec):
    """The gateway's side of an ndjson connection."""

    role = SERVER
    _allowed = _SERVER_SENDS
    _parse = staticmethod(parse_client_line)

    def __init__(self, *, max_line: int = DEFAULT_MAX_LINE) -> None:
        super().__init__(max_line=max_line)
        # Destinations the client subscribed; publishes and calls unanswered.
        self._subscribed: set[str] = set()
        self._publishes = 0
        self._callers = 0

    def _received(self, event: Event) -> None:
        kind = type(event)
        if kind is Publish or kind is PublishMany:
            self._publishes += 1
        elif kind is Call:
            self._callers += 1
        elif isinstance(event, Subscribe):
            self._subscribed.add(event.destination)
        elif isinstance(event, Unsubscribe):
            self._subscribed.discard(event.destination)

    def _sending(self, event: Event) -> None:
        if isinstance(event, Published):
            # A call without a reply is answered by an ``ack`` too: take publishes first,
            # so a ``reply`` is never refused while a call awaits its answer.
            if self._publishes:
                self._publishes -= 1
            elif self._callers:
                self._callers -= 1
            else:
                raise LocalProtocolError("no publish or call awaits an answer")
        elif isinstance(event, _BY_DESTINATION):
            if event.destination not in self._subscribed:
                raise LocalProtocolError(f"the client is not subscribed to {event.destination!r}")
            if isinstance(event, End):
                self._subscribed.remove(event.destination)
        elif isinstance(event, Replied):
            if not self._callers:
                raise LocalProtocolError("no call awaits a reply")
            self._callers -= 1
