"""The link between two workers, as bytes: a sans-IO framing, no sockets here.

Workers of one gateway forward in-memory topic messages to each other
(:mod:`gateway.core.peers`). One link carries one direction of traffic: the
worker that dialled sends batches, the worker that accepted answers each
batch with its outcome and announces which topics it has subscribers for.

A frame is a 4-byte big-endian length, then one msgpack array whose first
item says what it is:

======================================  ==============================================
``[0, version, worker]``                 hello: the first frame each way
``[1, added, removed]``                  interest: topic names gained and lost
``[2, batch, destination, messages]``    a batch of one publish run for ``destination``
``[3, batch, failures]``                 the answer: the batch's messages not delivered
======================================  ==============================================

A batch that is a call carries a fifth item, the seconds left until its
deadline (each process has its own trio clock, so deadlines cross as time
left); its answer carries a fourth, the reply (or nil). The answer to a batch
a log stored carries a fifth: each message's position ``[offset, partition]``
(nil where it was not stored).

A stateful destination lives in one *home* worker; the others reach it through
a proxy (:mod:`gateway.core.remote`). Its publishes are batches as above; its
subscriptions are these frames, numbered by the subscribing worker (``sub``):

==========================================  ====================================
``[16, sub, destination, group, credit,``    subscribe (from the proxy's worker)
``max_unacked, max_bytes, start, end,``
``filter, positions]``
``[17, sub, n]``                             grant credit (proxy)
``[18, sub, tags]``                          ack (proxy)
``[19, sub, tag, requeue, outcome, reason]`` nack (proxy)
``[20, sub, tag, reply]``                    reply to a call (proxy)
``[21, sub]``                                unsubscribe (proxy)
``[22, sub, destination, deliveries]``       deliveries (home)
``[23, sub, why, reason]``                   it ended at the home (home)
``[24, sub, position]``                      the committed position moved (home)
==========================================  ====================================

A delivery is ``[tag, message, redelivered, position, reply_in]`` (``reply_in``:
seconds left for a call, else nil); a position ``[offset, partition]``; a
start or end a string, an integer, ``["p", offset, partition]`` or
``["ps", [[partition, offset], ...]]``; a filter its JSON form
(:meth:`~gateway.core.filters.Filter.to_json`); a reply ``[body, headers,
content_type, status, message]``. ``why`` is 0 closed, 1 a finite read's end,
2 a ValueError, 3 a LookupError opening it.

A message is its body alone (``bin``) when it has no headers, content type
or source, else ``[body, headers, content_type, source]`` with ``source`` as
``[protocol, listener, peer, received_at, upstream]`` or nil. A failure is
``[index, outcome, reason, reason_code]``; an answer without failures says
every message was delivered.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import trio

from gateway.core.destination import Delivery, EndOfStream, StartAt, StopAt
from gateway.core.filters import Filter
from gateway.core.model import Message, Outcome, Position, Positions, Reply, Source
from gateway.core.reasons import Reason

__all__ = [
    "VERSION",
    "Acks",
    "Answer",
    "Batch",
    "Committed",
    "Deliveries",
    "Ended",
    "Failure",
    "Frame",
    "Grant",
    "Hello",
    "Interest",
    "Nack",
    "PeerWire",
    "Respond",
    "Subscribe",
    "Unsubscribe",
    "WireError",
    "ending",
]

#: The framing's version, sent in the hello.
VERSION = 1
_LENGTH = struct.Struct(">I")
_HELLO, _INTEREST, _BATCH, _ANSWER = range(4)
#: The frames of proxied subscriptions are numbered from 16 on.
(
    _SUBSCRIBE,
    _GRANT,
    _ACKS,
    _NACK,
    _RESPOND,
    _UNSUBSCRIBE,
    _DELIVERIES,
    _ENDED,
    _COMMITTED,
) = range(16, 25)


class WireError(ValueError):
    """The peer sent something that is no frame of this link."""


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    #: The sending worker's index.
    worker: int
    #: Which process is that worker (its pid): a worker replaced or restarted says
    #: another, and the others dial it again (0: not said; encoded only when said).
    incarnation: int = 0


@dataclass(frozen=True, slots=True)
class Interest:
    #: Topics that gained their first local group, and those that lost their last.
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Batch:
    batch: int
    destination: str
    messages: tuple[Message, ...]
    #: A call: seconds left until its deadline (None: a plain publish).
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """One message of a batch that was not delivered, and why."""

    index: int
    outcome: Outcome
    reason: str
    reason_code: Reason


@dataclass(frozen=True, slots=True)
class Answer:
    batch: int
    failures: tuple[Failure, ...] = ()
    #: The reply to a call, if one came.
    reply: Reply | None = None
    #: Where a log stored each message of the batch (None: not stored), when
    #: the destination keeps one; empty otherwise.
    positions: tuple[Position | None, ...] = ()


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Open a subscription at the destination's home, with these arguments."""

    sub: int
    destination: str
    group: str | None = None
    credit: int | None = None
    max_unacked: int = 1024
    max_unacked_bytes: int | None = None
    start: StartAt | None = None
    end: StopAt | None = None
    filter: Filter | None = None
    positions: bool = True


@dataclass(frozen=True, slots=True)
class Grant:
    sub: int
    n: int


@dataclass(frozen=True, slots=True)
class Acks:
    sub: int
    tags: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Nack:
    sub: int
    tag: int
    requeue: bool = True
    outcome: Outcome = Outcome.FAILED
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Respond:
    """A reply to a call delivered on subscription ``sub``."""

    sub: int
    tag: int
    reply: Reply


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    sub: int


@dataclass(frozen=True, slots=True)
class Deliveries:
    """Deliveries of subscription ``sub``; ``reply_by`` is seconds left, not a time."""

    sub: int
    destination: str
    deliveries: tuple[Delivery, ...]


@dataclass(frozen=True, slots=True)
class Ended:
    """The home subscription ended: ``why`` as :data:`ENDINGS` numbers it."""

    sub: int
    why: int
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Committed:
    sub: int
    position: Position | None


#: What an :class:`Ended` frame's ``why`` raises at the proxy, by number.
ENDINGS: tuple[type[Exception], ...] = (
    trio.ClosedResourceError,
    EndOfStream,
    ValueError,
    LookupError,
)


def ending(error: BaseException) -> int:
    """The ``why`` of an :class:`Ended` frame for ``error`` (closed, by default)."""
    for why, kind in enumerate(ENDINGS):
        if type(error) is kind:
            return why
    for why, kind in reversed(list(enumerate(ENDINGS))):
        if isinstance(error, kind):
            return why
    return 0


Frame = (
    Hello
    | Interest
    | Batch
    | Answer
    | Subscribe
    | Grant
    | Acks
    | Nack
    | Respond
    | Unsubscribe
    | Deliveries
    | Ended
    | Committed
)


class PeerWire:
    """Encodes frames to bytes and decodes bytes, fed in any pieces, to frames."""

    def __init__(self, max_frame: int = 256 * 1024 * 1024) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    # -- sending ----------------------------------------------------------------
    def encode(self, frame: Frame) -> bytes:
        """The bytes of ``frame``, length prefix included."""
        payload = msgpack.packb(_to_wire(frame), use_bin_type=True)
        return _LENGTH.pack(len(payload)) + payload

    # -- receiving --------------------------------------------------------------
    def receive_data(self, data: bytes | bytearray) -> list[Frame]:
        """Take ``data`` and return the frames it completed (none: wait for more)."""
        buffer = self._buffer
        buffer += data
        frames: list[Frame] = []
        start = 0
        while len(buffer) - start >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(buffer, start)
            if size > self.max_frame:
                raise WireError(f"frame of {size} bytes exceeds the bound of {self.max_frame}")
            end = start + _LENGTH.size + size
            if len(buffer) < end:
                break
            frames.append(_decode(bytes(buffer[start + _LENGTH.size : end])))
            start = end
        del buffer[:start]
        return frames

    @property
    def pending(self) -> int:
        """Bytes received that do not make a whole frame yet."""
        return len(self._buffer)


def _to_wire(frame: Frame) -> list[Any]:
    if isinstance(frame, Batch):
        out = [_BATCH, frame.batch, frame.destination, [_message(m) for m in frame.messages]]
        if frame.timeout is not None:
            out.append(frame.timeout)
        return out
    if isinstance(frame, Answer):
        failures = [
            [f.index, int(f.outcome), f.reason, f.reason_code.value] for f in frame.failures
        ]
        out = [_ANSWER, frame.batch, failures]
        if frame.reply is not None or frame.positions:
            out.append(None if frame.reply is None else _reply(frame.reply))
        if frame.positions:
            out.append([None if p is None else [p.offset, p.partition] for p in frame.positions])
        return out
    if isinstance(frame, Interest):
        return [_INTEREST, list(frame.added), list(frame.removed)]
    if isinstance(frame, Hello):
        hello = [_HELLO, frame.version, frame.worker]
        return [*hello, frame.incarnation] if frame.incarnation else hello
    return _subscription_to_wire(frame)


def _subscription_to_wire(frame: Frame) -> list[Any]:
    """The frames of a proxied subscription."""
    if isinstance(frame, Deliveries):
        deliveries = [_delivery(d) for d in frame.deliveries]
        return [_DELIVERIES, frame.sub, frame.destination, deliveries]
    if isinstance(frame, Acks):
        return [_ACKS, frame.sub, list(frame.tags)]
    if isinstance(frame, Grant):
        return [_GRANT, frame.sub, frame.n]
    if isinstance(frame, Subscribe):
        f = frame
        return [
            _SUBSCRIBE,
            f.sub,
            f.destination,
            f.group,
            f.credit,
            f.max_unacked,
            f.max_unacked_bytes,
            _point(f.start),
            _point(f.end),
            f.filter.to_json() if f.filter is not None else None,
            f.positions,
        ]
    if isinstance(frame, Nack):
        return [_NACK, frame.sub, frame.tag, frame.requeue, int(frame.outcome), frame.reason]
    if isinstance(frame, Respond):
        return [_RESPOND, frame.sub, frame.tag, _reply(frame.reply)]
    if isinstance(frame, Unsubscribe):
        return [_UNSUBSCRIBE, frame.sub]
    if isinstance(frame, Ended):
        return [_ENDED, frame.sub, frame.why, frame.reason]
    if isinstance(frame, Committed):
        p = frame.position
        return [_COMMITTED, frame.sub, None if p is None else [p.offset, p.partition]]
    raise TypeError(f"not a frame: {frame!r}")


def _delivery(d: Delivery) -> list[Any]:
    p = d.position
    return [
        d.tag,
        _message(d.message),
        d.redelivered,
        None if p is None else [p.offset, p.partition],
        d.reply_by,
    ]


def _point(point: StartAt | StopAt | None) -> Any:
    if isinstance(point, Position):
        return ["p", point.offset, point.partition]
    if isinstance(point, Positions):
        return ["ps", [[p, o] for p, o in point.offsets.items()]]
    return point


def _reply(r: Reply) -> list[Any]:
    return [r.body, dict(r.headers) if r.headers else None, r.content_type, r.status, r.message]


def _message(m: Message) -> bytes | list[Any]:
    if not m.headers and m.content_type is None and m.source is None:
        return m.body
    source = None
    if m.source is not None:
        s = m.source
        source = [s.protocol, s.listener, s.peer, s.received_at, s.upstream]
    return [m.body, dict(m.headers) if m.headers else None, m.content_type, source]


def _decode(payload: bytes) -> Frame:
    try:
        item = msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=True)
        kind = item[0]
        if kind == _BATCH:
            batch, destination, messages = item[1:4]
            timeout = float(item[4]) if len(item) > 4 else None
            return Batch(
                int(batch), str(destination), _messages(str(destination), messages), timeout
            )
        if kind == _ANSWER:
            batch, failures = item[1:3]
            reply = _read_reply(item[3]) if len(item) > 3 and item[3] is not None else None
            positions = tuple(
                None if p is None else Position(int(p[0]), int(p[1]))
                for p in (item[4] if len(item) > 4 else ())
            )
            return Answer(int(batch), tuple(_failure(f) for f in failures), reply, positions)
        if kind == _INTEREST:
            _, added, removed = item
            return Interest(tuple(map(str, added)), tuple(map(str, removed)))
        if kind == _HELLO:
            _, version, worker, *incarnation = item
            return Hello(int(version), int(worker), int(incarnation[0]) if incarnation else 0)
        if _SUBSCRIBE <= kind <= _COMMITTED:
            return _read_subscription(kind, item)
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as e:
        raise WireError(f"not a frame: {e}") from None
    raise WireError(f"unknown frame type {kind!r}")


def _messages(destination: str, items: Sequence[Any]) -> tuple[Message, ...]:
    out = []
    for item in items:
        if isinstance(item, bytes):
            out.append(Message(destination, item))
            continue
        body, headers, content_type, source = item
        out.append(
            Message(
                destination,
                bytes(body),
                headers or Message._field_defaults["headers"],
                content_type,
                _source(source) if source is not None else None,
            )
        )
    return tuple(out)


def _read_subscription(kind: int, item: list[Any]) -> Frame:
    sub = int(item[1])
    if kind == _DELIVERIES:
        name = str(item[2])
        return Deliveries(sub, name, tuple(_read_delivery(name, d) for d in item[3]))
    if kind == _ACKS:
        return Acks(sub, tuple(map(int, item[2])))
    if kind == _GRANT:
        return Grant(sub, int(item[2]))
    if kind == _SUBSCRIBE:
        _, _, name, group, credit, unacked, unacked_bytes, start, end, filt, positions = item
        return Subscribe(
            sub,
            str(name),
            group,
            credit,
            int(unacked),
            unacked_bytes,
            _read_point(start),
            _read_point(end),
            Filter.from_json(filt) if filt is not None else None,
            bool(positions),
        )
    if kind == _NACK:
        _, _, tag, requeue, outcome, reason = item
        return Nack(sub, int(tag), bool(requeue), Outcome(outcome), str(reason))
    if kind == _RESPOND:
        return Respond(sub, int(item[2]), _read_reply(item[3]))
    if kind == _UNSUBSCRIBE:
        return Unsubscribe(sub)
    if kind == _ENDED:
        why = int(item[2])
        if not 0 <= why < len(ENDINGS):
            raise ValueError(f"unknown ending {why}")
        return Ended(sub, why, str(item[3]))
    p = item[2]
    return Committed(sub, None if p is None else Position(int(p[0]), int(p[1])))


def _read_delivery(destination: str, item: Sequence[Any]) -> Delivery:
    tag, message, redelivered, p, reply_by = item
    (m,) = _messages(destination, [message])
    return Delivery(
        int(tag),
        m,
        bool(redelivered),
        None if p is None else Position(int(p[0]), int(p[1])),
        None if reply_by is None else float(reply_by),
    )


def _read_point(item: Any) -> Any:
    if isinstance(item, list):
        if item[0] == "p":
            return Position(int(item[1]), int(item[2]))
        if item[0] == "ps":
            return Positions({int(p): int(o) for p, o in item[1]})
        raise ValueError(f"not a position: {item!r}")
    if item is None or isinstance(item, (str, int)):
        return item
    raise ValueError(f"not a position: {item!r}")


def _read_reply(item: Sequence[Any]) -> Reply:
    body, headers, content_type, status, message = item
    return Reply(bytes(body), headers or {}, content_type, int(status), str(message))


def _source(item: Sequence[Any]) -> Source:
    protocol, listener, peer, received_at, upstream = item
    return Source(protocol, listener, peer, received_at=float(received_at), upstream=str(upstream))


def _failure(item: Sequence[Any]) -> Failure:
    index, outcome, reason, code = item
    return Failure(int(index), Outcome(outcome), str(reason), Reason(code))
