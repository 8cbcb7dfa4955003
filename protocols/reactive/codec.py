"""The reactive-streams connection, one class for both roles, sans I/O.

``Connection(Role.CLIENT)`` or ``Connection(Role.SERVER)``: ``receive_data``
takes bytes (``b""``: the peer closed), ``next_event`` returns the next
:mod:`.events` event, :data:`NEED_DATA` or ``ConnectionClosed``, ``send``
turns one :mod:`.messages` message into bytes after checking that the state
allows it (:class:`LocalProtocolError` otherwise, nothing changed), and
``send_elements`` encodes many elements of one subscription in one call
(``send_split`` one element in parts).
Errors of the peer are :class:`RemoteProtocolError` (the codec is then in
``ERROR``): the driver sends ``Goodbye(goodbye_reason(error))`` (still
allowed) and closes.

=============  ====================================================================
phase          what may happen
=============  ====================================================================
HELLO          we send our hello at once (``hello()``); a client may pipeline core
               messages after it; the peer's first message must be its hello
OPEN           both peers subscribe and publish; extension messages only if
               negotiated
GOODBYE_SENT   we said goodbye: we send nothing more; the peer's messages in flight
               are parsed and dropped until its goodbye or goodbyeAck
GOODBYE_OWED   the peer said goodbye (every stream ended): we owe ``Goodbye``
DONE           goodbye answered both ways: the driver closes
=============  ====================================================================
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from typing import Any, Final

import msgpack

from gateway.sdk import (
    NEED_DATA,
    CodecState,
    ConnectionClosed,
    Lifecycle,
    LocalProtocolError,
    NeedData,
    RemoteProtocolError,
)

from . import messages as m
from .events import (
    Accepted,
    BadRequest,
    Cancelled,
    Completed,
    DemandAdded,
    Elements,
    Event,
    Failed,
    GoodbyeAnswered,
    GoodbyeReceived,
    Hello,
    Pinged,
    Ponged,
    Skipped,
    SubscribeRequested,
)
from .messages import Limits, MessageReader
from .streams import MySubscriptions, Stage, SubscriptionsToMe, spend

__all__ = [
    "KEEPALIVE",
    "NON_POSITIVE_REQUEST",
    "VERSION",
    "Connection",
    "Phase",
    "Role",
    "UnsupportedVersion",
    "goodbye_reason",
]

_OPEN: Final = CodecState.OPEN
#: The protocol version this codec speaks.
VERSION: Final = 0
#: The keepalive extension's id (ping 64, pong 65).
KEEPALIVE: Final = 1
#: The onError a publisher owes after a request of 0 or less.
NON_POSITIVE_REQUEST: Final = "§3.9: non-positive request"
_ELEMENTS: Final = (m.OnNext, m.OnNextPacked, m.OnNextPart, m.OnNextLastPart)


class Role(enum.Enum):
    """Which hello a side sends."""

    CLIENT = "client"
    SERVER = "server"


class Phase(enum.Enum):
    """Where the connection stands (see the module's table)."""

    HELLO = "hello"
    OPEN = "open"
    GOODBYE_SENT = "goodbye-sent"
    GOODBYE_OWED = "goodbye-owed"
    DONE = "done"


class UnsupportedVersion(RemoteProtocolError):
    """The peer's hello has another version: goodbye ``unsupported-version: N``."""

    def __init__(self, version: int) -> None:
        super().__init__(f"unsupported-version: {version}")
        self.version = version


def goodbye_reason(error: RemoteProtocolError) -> str:
    """The goodbye reason a driver sends after ``error``."""
    if isinstance(error, UnsupportedVersion):
        return str(error)
    return f"protocol-error: {error}"


class Connection(Lifecycle):
    """One connection's protocol state, in either role (see the module's docstring)."""

    def __init__(
        self,
        role: Role,
        limits: Limits | None = None,
        *,
        extensions: frozenset[int] = frozenset({KEEPALIVE}),
    ) -> None:
        super().__init__()
        self.role = role
        self.limits = Limits() if limits is None else limits
        #: The extension ids our hello offers.
        self.offered = extensions
        #: Negotiated extensions (empty until the peer's hello).
        self.extensions: frozenset[int] = frozenset()
        self.phase = Phase.HELLO
        self.hello_sent = False
        self.peer_hello = False
        #: My subscriptions (ids I chose) and subscriptions to me (ids the peer chose).
        self.mine = MySubscriptions(self.limits.max_element)
        self.theirs = SubscriptionsToMe()
        self._reader = MessageReader(self.limits)
        self._queued: deque[Event] = deque()
        self._stashed: m.Message | None = None
        self._packer = msgpack.Packer(use_bin_type=True)
        self._element_id = 0

    # -- state ---------------------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        if self._state is not _OPEN:
            return 0
        return self._reader.held + self.mine.held

    def _release(self) -> None:
        self._reader.drop()
        self._stashed = None
        self.mine.close_all()
        self.theirs.close_all()
        super()._release()

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes; ``b""``: the peer closed its side (bytes after it are a
        LocalProtocolError; bytes received once not open are dropped)."""
        if not data:
            self._buffer.feed(b"")
        elif self._buffer.eof:
            raise LocalProtocolError("data received after end of input")
        elif self._state is _OPEN:
            self._reader.feed(data)

    def outstanding(self, subscriber: int) -> int:
        """The demand we may still fill for a subscription to me."""
        return self.theirs.get(subscriber, "outstanding").outstanding

    # -- receiving -------------------------------------------------------------------------
    def next_event(self) -> Event | ConnectionClosed | NeedData:
        """The next event, :data:`NEED_DATA` or ``ConnectionClosed``."""
        if self._state is not _OPEN:
            return self._not_open()
        if self._queued:
            return self._queued.popleft()
        try:
            return self._next()
        except RemoteProtocolError as e:
            self._fail(e)

    def _read(self) -> m.Message | None:
        if self._stashed is not None:
            message, self._stashed = self._stashed, None
            return message
        obj = self._reader.next()
        return None if obj is None else m.decode(obj, self.extensions)

    def _next(self) -> Event | ConnectionClosed | NeedData:
        while True:
            message = self._read()
            if message is None:
                return self._closed() if self._buffer.eof else NEED_DATA
            event = self._on(message)
            if event is not None:
                return event

    def _batch(self, first: Any) -> Elements | None:
        """The elements of ``first`` and of the element messages for the same
        subscription that follow it in what is held."""
        subscriber = first.subscriber
        elements = self._on_elements(first)
        if elements is None:
            return None
        while True:
            self._plain_on_next(subscriber, elements)
            message = self._read()
            if message is None:
                break
            if not (isinstance(message, _ELEMENTS) and message.subscriber == subscriber):
                self._stashed = message
                break
            more = self._on_elements(message)
            if more is None:  # cancelled meanwhile: cannot happen within one read
                break
            elements += more
        return Elements(subscriber, tuple(elements)) if elements else None

    def _plain_on_next(self, subscriber: int, elements: list[bytes]) -> None:
        """Take the ``onNext`` messages for ``subscriber`` that come next, within its
        demand, straight from msgpack's objects (the common case, without a message
        object each); the first message of any other kind, or one over demand or of
        the wrong size, is left to the general path, which reports it."""
        sub = self.mine.live.get(subscriber)
        if sub is None or sub.stage is not Stage.ACTIVE or sub.split_id is not None:
            return
        size, room, taken, other = sub.element_size, sub.outstanding, 0, None
        read = self._reader.next
        while taken < room:
            obj = read()
            if obj is None:
                break
            if (
                type(obj) is list
                and len(obj) == 3
                and obj[0] == 9
                and type(obj[0]) is int
                and obj[1] == subscriber
                and type(obj[1]) is int
                and type(obj[2]) is bytes
                and (not size or len(obj[2]) == size)
            ):
                elements.append(obj[2])
                taken += 1
            else:
                other = obj
                break
        sub.outstanding = spend(room, taken)
        if other is not None:
            self._stashed = m.decode(other, self.extensions)

    def _on_elements(self, message: Any) -> list[bytes] | None:
        mine, sub = self.mine, message.subscriber
        if isinstance(message, m.OnNext):
            if not mine.elements(sub, 1, len(message.element)):
                return None
            return [message.element]
        if isinstance(message, m.OnNextPacked):
            return self._unpack(message)
        last = isinstance(message, m.OnNextLastPart)
        whole = mine.part(sub, message.element_id, message.data, last)
        return [] if whole is None else [whole]

    def _unpack(self, message: m.OnNextPacked) -> list[bytes] | None:
        sub = self.mine.live.get(message.subscriber)
        size = sub.element_size if sub is not None else 0
        if sub is not None and not size:
            raise RemoteProtocolError("onNextPacked, but the subscription's elementSize is 0")
        if message.count < 1 or (size and len(message.elements) != message.count * size):
            raise RemoteProtocolError(
                f"onNextPacked of {message.count} elements in {len(message.elements)} bytes"
            )
        if not self.mine.elements(message.subscriber, message.count):
            return None
        data = message.elements
        return [data[i : i + size] for i in range(0, len(data), size)]

    def _on(self, message: m.Message) -> Event | None:
        """The event of one received message (None: nothing to report)."""
        phase = self.phase
        if phase is Phase.GOODBYE_OWED or phase is Phase.DONE:
            raise RemoteProtocolError(f"{type(message).__name__} after the peer's goodbye")
        if isinstance(message, m.Goodbye):
            return self._on_goodbye(message)
        if isinstance(message, m.GoodbyeAck):
            if phase is not Phase.GOODBYE_SENT:
                raise RemoteProtocolError("goodbyeAck, but we said no goodbye")
            self.phase = Phase.DONE
            return GoodbyeAnswered(message.message)
        if phase is Phase.GOODBYE_SENT:
            return None  # in flight when we said goodbye: parsed and dropped
        if not self.peer_hello:
            return self._on_hello(message)
        if isinstance(message, m.ClientHello | m.ServerHello):
            raise RemoteProtocolError("a second hello")
        if isinstance(message, _ELEMENTS):
            return self._batch(message)
        return self._on_signal(message)

    def _on_hello(self, message: m.Message) -> Hello:
        expected = m.ClientHello if self.role is Role.SERVER else m.ServerHello
        if not isinstance(message, expected):
            raise RemoteProtocolError(
                f"{type(message).__name__} before the peer's {expected.__name__}"
            )
        if message.version != VERSION:
            raise UnsupportedVersion(message.version)
        self.peer_hello = True
        self.extensions = self.offered & frozenset(message.extensions)
        if self.hello_sent:
            self.phase = Phase.OPEN
        return Hello(message.version, self.extensions)

    def _on_signal(self, message: m.Message) -> Event | None:
        if isinstance(message, m.Subscribe):
            self.theirs.subscribe(message.subscriber, message.initial_demand)
            return SubscribeRequested(message.subscriber, message.publisher, message.initial_demand)
        if isinstance(message, m.Request):
            outstanding = self.theirs.request(message.subscriber, message.demand)
            if outstanding is None:
                return BadRequest(message.subscriber, NON_POSITIVE_REQUEST)
            if outstanding < 0:
                return None
            return DemandAdded(message.subscriber, message.demand, outstanding)
        if isinstance(message, m.Cancel):
            return Cancelled(message.subscriber) if self.theirs.cancel(message.subscriber) else None
        if isinstance(message, m.Subscribed):
            if self.mine.subscribed(message.subscriber, message.element_size):
                return Accepted(message.subscriber, message.element_size)
            return None
        if isinstance(message, m.OnComplete):
            if self.mine.terminated(message.subscriber, "onComplete"):
                return Completed(message.subscriber)
            return None
        if isinstance(message, m.OnError):
            if self.mine.terminated(message.subscriber, "onError"):
                return Failed(message.subscriber, message.error)
            return None
        if isinstance(message, m.Ping):
            return Pinged(message.payload)
        if isinstance(message, m.Pong):
            return Ponged(message.payload)
        assert isinstance(message, m.Unknown)
        return Skipped(message.type)

    def _on_goodbye(self, message: m.Goodbye) -> GoodbyeReceived:
        answers = self.phase is Phase.GOODBYE_SENT
        self.phase = Phase.DONE if answers else Phase.GOODBYE_OWED
        reason = message.reason
        for sub in self.mine.close_all():
            self._queued.append(Failed(sub, f"goodbye: {reason}"))
        for sub in self.theirs.close_all():
            self._queued.append(Cancelled(sub, f"goodbye: {reason}"))
        return GoodbyeReceived(reason, answers)

    # -- sending ---------------------------------------------------------------------------
    def hello(self) -> bytes:
        """Our hello: version 0 and the extensions we offer."""
        cls = m.ClientHello if self.role is Role.CLIENT else m.ServerHello
        return self.send(cls(VERSION, tuple(sorted(self.offered))))

    def send(self, message: m.Message) -> bytes:
        """The bytes of ``message``, refused (LocalProtocolError, nothing changed) where
        the state does not allow it. ``Goodbye`` is allowed even in ``ERROR``."""
        if isinstance(message, m.Goodbye):
            return self._send_goodbye(message)
        self._check_send(f"send {type(message).__name__}")
        self._check_phase(message)
        if isinstance(message, m.Request | m.Cancel) and self.mine.ended(message.subscriber):
            return b""  # RS §3.6, §3.7: after cancel or a terminal signal, a no-op
        self._apply(message)
        return m.encode(message)

    def _send_goodbye(self, message: m.Goodbye) -> bytes:
        if self._state is CodecState.ERROR:
            return m.encode(message)
        if self.phase is Phase.GOODBYE_OWED:
            self.phase = Phase.DONE
        elif self.phase in (Phase.HELLO, Phase.OPEN):
            self.phase = Phase.GOODBYE_SENT
            self.mine.close_all()
            self.theirs.close_all()
        else:
            raise LocalProtocolError(f"send Goodbye: the connection is {self.phase.value}")
        return m.encode(message)

    def _check_phase(self, message: m.Message) -> None:
        name = type(message).__name__
        if isinstance(message, m.GoodbyeAck):
            if self.phase is not Phase.GOODBYE_OWED:
                raise LocalProtocolError("send GoodbyeAck: the peer said no goodbye")
            return
        if self.phase not in (Phase.HELLO, Phase.OPEN):
            raise LocalProtocolError(f"send {name}: the connection is {self.phase.value}")
        if isinstance(message, m.ClientHello | m.ServerHello):
            own = m.ClientHello if self.role is Role.CLIENT else m.ServerHello
            if self.hello_sent or not isinstance(message, own):
                raise LocalProtocolError(f"send {name}: we send one {own.__name__}")
            return
        if not self.hello_sent:
            raise LocalProtocolError(f"send {name}: our hello goes first")
        if isinstance(message, m.Ping | m.Pong):
            if not self.peer_hello or KEEPALIVE not in self.extensions:
                raise LocalProtocolError(f"send {name}: keepalive was not negotiated")
        elif self.role is Role.SERVER and not self.peer_hello:
            raise LocalProtocolError(f"send {name}: the client's hello has not arrived")
        elif isinstance(message, m.Unknown):
            raise LocalProtocolError("send Unknown: not a message")

    def _apply(self, message: m.Message) -> None:
        """Check ``message`` against the id tables, then record it."""
        if isinstance(message, m.ClientHello | m.ServerHello):
            self.hello_sent = True
            if self.peer_hello:
                self.phase = Phase.OPEN
        elif isinstance(message, m.GoodbyeAck):
            self.phase = Phase.DONE
        elif isinstance(message, m.Subscribe):
            self.mine.subscribe(message.subscriber, message.initial_demand)
        elif isinstance(message, m.Request):
            self.mine.request(message.subscriber, message.demand)
        elif isinstance(message, m.Cancel):
            self.mine.cancel(message.subscriber)
        elif isinstance(message, m.Subscribed):
            self.theirs.subscribed(message.subscriber, message.element_size)
        elif isinstance(message, m.OnNext):
            self.theirs.charge(message.subscriber, 1, [len(message.element)])
        elif isinstance(message, m.OnNextPacked):
            self._check_packed(message.subscriber, message.count, len(message.elements))
            self.theirs.charge(message.subscriber, message.count, None)
        elif isinstance(message, m.OnNextPart | m.OnNextLastPart):
            last = isinstance(message, m.OnNextLastPart)
            self.theirs.part(message.subscriber, message.element_id, last)
        elif isinstance(message, m.OnComplete | m.OnError):
            self.theirs.terminal(message.subscriber, isinstance(message, m.OnError))

    def _check_packed(self, subscriber: int, count: int, length: int) -> None:
        size = self.theirs.get(subscriber, "send OnNextPacked").element_size
        if not size or count < 1 or length != count * size:
            raise LocalProtocolError(
                f"send OnNextPacked: {count} elements in {length} bytes, elementSize {size}"
            )

    def send_elements(self, subscriber: int, elements: Sequence[bytes]) -> bytes:
        """The bytes of ``elements`` for a subscription to me, demand charged once: one
        ``onNextPacked`` when its elementSize is fixed, else one ``onNext`` each."""
        self._check_send("send elements")
        self._check_phase(m.OnNext(subscriber, b""))
        if not elements:
            return b""
        sizes = list(map(len, elements))
        sub = self.theirs.charge(subscriber, len(elements), sizes)
        if sub.element_size:
            return m.on_next_packed(subscriber, elements, sub.element_size * len(elements))
        return m.on_next_run(subscriber, elements, sizes)

    def send_split(self, subscriber: int, element: bytes, part_size: int) -> bytes:
        """One element for a subscription to me, in parts of ``part_size`` bytes
        (``onNextPart``..., ``onNextLastPart``; for elements too large for one message),
        charged one element of demand. Its element id is the connection's next."""
        if part_size < 1:
            raise LocalProtocolError(f"send_split: a part of {part_size} bytes")
        self._check_send("send a split element")
        self._check_phase(m.OnNext(subscriber, b""))
        sub = self.theirs.get(subscriber, "send_split")
        if sub.split_id is not None:
            raise LocalProtocolError(f"send_split: a split element of {subscriber} is open")
        self.theirs.part(subscriber, self._element_id, last=True)  # checks and charges
        element_id, self._element_id = self._element_id, self._element_id + 1
        pack = self._packer.pack
        cuts = range(0, max(len(element), 1), part_size)
        last = cuts[-1]
        return b"".join(
            [
                pack(
                    [14 if at == last else 13, subscriber, element_id, element[at : at + part_size]]
                )
                for at in cuts
            ]
        )
