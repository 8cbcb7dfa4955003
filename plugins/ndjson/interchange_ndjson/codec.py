"""The ndjson codec: one JSON object per line, parsed without doing any I/O.

Feed received bytes to :meth:`NdjsonConnection.receive_data` (``b""`` means
the peer closed), then call :meth:`NdjsonConnection.next_event` until it
returns :data:`~gateway.protocol.NEED_DATA`; a
:class:`~gateway.protocol.ConnectionClosed` follows the last line once the
peer closed. :meth:`NdjsonConnection.send` turns an event into the bytes to
write. Lines are found in a :class:`~gateway.protocol.ReceiveBuffer`, which
remembers how far it searched, so a long line arriving in small pieces is
scanned once.

A line longer than ``max_line`` bytes, invalid JSON, or an event the peer's
role may not send is a :class:`~gateway.core.errors.RemoteProtocolError`; the
connection is then in the ``ERROR`` state and the driver answers with an
``error`` line and closes. Sending an event this role may not send, one its
state does not allow, or one the peer would refuse (an empty batch, a call
timeout out of range) is a :class:`~gateway.core.errors.LocalProtocolError`.

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

import base64
import enum
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any, Final

from gateway.sdk import (
    NEED_DATA,
    ConnectionClosed,
    Filter,
    LocalProtocolError,
    NeedData,
    ReceiveBuffer,
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
    ItemResult,
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

__all__ = [
    "CLIENT",
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_MAX_LINE",
    "MAX_BATCH",
    "MAX_CALL_TIMEOUT",
    "NEED_DATA",
    "SERVER",
    "NdjsonConnection",
    "State",
]


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


CLIENT: Final = Role.CLIENT
SERVER: Final = Role.SERVER

#: 1 MiB: one debug message per line is rarely bigger; raise it per listener.
DEFAULT_MAX_LINE = 1024 * 1024
#: Most deliveries a subscriber may hold unacked (the ``window`` of ``sub``).
MAX_WINDOW = 10_000
STATUSES = ("delivered", "failed", "rejected")
#: Most messages in one ``pub`` with ``messages``.
MAX_BATCH = 1000
#: Seconds a ``call`` waits for its reply unless it says otherwise.
DEFAULT_CALL_TIMEOUT = 30.0
#: Longest ``timeout`` a ``call`` may ask for, in seconds.
MAX_CALL_TIMEOUT = 3600.0
#: Reply codes are gRPC status codes: a non-negative int32.
MAX_CODE = 2**31 - 1
#: Where a ``sub`` may start and end reading, besides an offset.
STARTS = ("earliest", "latest")
ENDS = ("latest",)
_TIMEOUT_RULE = f"a number of seconds more than 0 and at most {MAX_CALL_TIMEOUT:g}"


class State(enum.Enum):
    #: Lines flow both ways.
    OPEN = "open"
    #: The peer closed its side (input ended cleanly).
    CLOSED = "closed"
    #: A protocol error happened; nothing more is parsed or sent but an error line.
    ERROR = "error"


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


class NdjsonConnection:
    """One side of an ndjson connection."""

    def __init__(self, role: Role, *, max_line: int = DEFAULT_MAX_LINE) -> None:
        self.role = role
        self.max_line = max_line
        self.state = State.OPEN
        self._buf = ReceiveBuffer()
        server = role is SERVER
        self._parse = _parse_client_line if server else _parse_server_line
        self._received = self._server_received if server else self._client_received
        self._sending = self._server_sending if server else self._client_sending
        self._allowed = _SERVER_SENDS if server else _CLIENT_SENDS
        # Client: subscriptions by destination, unsettled deliveries by tag (those
        # that are calls in _calls), and the windows of subscriptions left by unsub.
        self._subs: dict[str, _Subscription] = {}
        self._tags: dict[int, _Subscription] = {}
        self._calls: set[int] = set()
        self._left: dict[str, int] = {}
        # Server: destinations the client subscribed; publishes and calls unanswered.
        self._subscribed: set[str] = set()
        self._publishes = 0
        self._callers = 0

    # -- input ----------------------------------------------------------------
    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes; ``b""`` means the peer closed its sending side."""
        self._buf.feed(data)

    @property
    def held_bytes(self) -> int:
        """Received bytes not yet returned as events (a partial line, and lines not read
        yet), as the receive buffer holds them: the parsed lines it has not dropped yet
        (at most as many bytes) included."""
        return self._buf.allocated

    def next_event(self) -> Event | ConnectionClosed | NeedData:
        """Parse and return the next event, or :data:`NEED_DATA`."""
        if self.state is not State.OPEN:
            if self.state is State.ERROR:
                raise LocalProtocolError("the connection is in the ERROR state")
            return NEED_DATA
        buf = self._buf
        while True:
            start = buf.pos
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > self.max_line:
                    return self._fail(f"line longer than {self.max_line} bytes")
                if buf.eof:
                    if buf.data[start:].strip():
                        return self._fail("connection closed in the middle of a line")
                    self.state = State.CLOSED
                    return ConnectionClosed()
                return NEED_DATA
            if nl - start > self.max_line:
                return self._fail(f"line longer than {self.max_line} bytes")
            line = bytes(buf.data[start:nl]).rstrip(b"\r")
            buf.advance(nl + 1)
            if not line.strip():
                continue
            try:
                event = self._parse(line)
                self._received(event)
            except RemoteProtocolError as e:
                return self._fail(str(e))
            return event

    def _fail(self, message: str) -> Event:
        self.state = State.ERROR
        self._buf.discard()
        raise RemoteProtocolError(message)

    # -- output ---------------------------------------------------------------
    def send(self, event: Event) -> bytes:
        """The bytes for ``event``, which this role and the state must allow."""
        if not isinstance(event, self._allowed):
            raise LocalProtocolError(f"a {self.role.value} cannot send {type(event).__name__}")
        if self.state is State.ERROR and not isinstance(event, Error):
            raise LocalProtocolError("the connection is in the ERROR state")
        data = _dump(_to_object(event))
        self._sending(event)  # last: a refused event changes nothing
        if isinstance(event, Error):
            self.state = State.ERROR
        return data

    # -- state: client ----------------------------------------------------------
    def _client_received(self, event: Event) -> None:
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

    def _client_sending(self, event: Event) -> None:
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

    # -- state: server ----------------------------------------------------------
    def _server_received(self, event: Event) -> None:
        kind = type(event)
        if kind is Publish or kind is PublishMany:
            self._publishes += 1
        elif kind is Call:
            self._callers += 1
        elif isinstance(event, Subscribe):
            self._subscribed.add(event.destination)
        elif isinstance(event, Unsubscribe):
            self._subscribed.discard(event.destination)

    def _server_sending(self, event: Event) -> None:
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


# -- parsing ------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


#: Built once: ``json.loads`` with a non-default argument builds a decoder per call.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _load(line: bytes) -> Any:
    """Strict JSON from one UTF-8 line (no UTF-16/32 sniffing, no NaN, bounded depth)."""
    try:
        return _DECODER.decode(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise RemoteProtocolError(f"invalid JSON: {e}") from None


def _text(value: str, key: str) -> str:
    """``value`` unless it holds a lone surrogate (valid JSON, invalid Unicode)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RemoteProtocolError(f"field {key!r} is not valid Unicode") from None
    return value


def _field(
    obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], default: Any = ...
) -> Any:
    if key not in obj or (obj[key] is None and default is not ...):
        if default is ...:
            raise RemoteProtocolError(f"{obj.get('op')!r} needs the field {key!r}")
        return default
    value = obj[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise RemoteProtocolError(f"field {key!r} has the wrong type")
    if not isinstance(value, kind):
        raise RemoteProtocolError(f"field {key!r} has the wrong type")
    if isinstance(value, str):
        _text(value, key)
    return value


def _int_field(obj: Mapping[str, Any], key: str, lo: int, hi: int, default: Any = ...) -> Any:
    value = _field(obj, key, int, default)
    if value is not default and not lo <= value <= hi:
        raise RemoteProtocolError(f"field {key!r} must be between {lo} and {hi}")
    return value


def _headers(obj: Mapping[str, Any]) -> dict[str, str]:
    headers = _field(obj, "headers", dict, {})
    if not all(isinstance(v, str) for v in headers.values()):
        raise RemoteProtocolError("header values must be strings")
    for k, v in headers.items():
        _text(k, "headers")
        _text(v, "headers")
    return headers


def _body(obj: Mapping[str, Any]) -> tuple[bytes, str | None]:
    """The body from exactly one of ``body`` (text), ``b64`` or ``json``."""
    present = [k for k in ("body", "b64", "json") if k in obj]
    if len(present) != 1:
        raise RemoteProtocolError("a message needs exactly one of 'body', 'b64' or 'json'")
    key = present[0]
    try:
        if key == "json":
            return _dump_compact(obj["json"]), "application/json"
        value = _field(obj, key, str)
        if key == "body":
            return value.encode("utf-8"), None
    except (UnicodeEncodeError, ValueError, RecursionError):
        raise RemoteProtocolError(f"field {key!r} is not valid JSON text") from None
    try:
        return base64.b64decode(value, validate=True), None
    except ValueError as e:  # binascii.Error, or non-ASCII text
        raise RemoteProtocolError(f"field 'b64' is not base64: {e}") from None


def _optional_body(obj: Mapping[str, Any]) -> tuple[bytes, str | None]:
    """Like :func:`_body`, but no body at all is the empty one."""
    if not any(k in obj for k in ("body", "b64", "json")):
        return b"", None
    return _body(obj)


_MAX_CREDIT = 2**63 - 1
#: Offsets in a stored destination (``pos``, ``start``, ``end``).
_MAX_OFFSET = 2**63 - 1


def _content_type(obj: Mapping[str, Any], implied: str | None) -> str | None:
    value = _field(obj, "content_type", str, None)
    return implied if value is None else value


def _in_range(value: Any, lo: float, hi: float, *, lo_open: bool) -> bool:
    """``value`` is a number (not a bool) in ``lo..hi`` (``lo`` excluded if ``lo_open``).

    Compared as it is: a huge int is out of range, not an ``OverflowError``.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return (lo < value if lo_open else lo <= value) and value <= hi


def _call_timeout_ok(value: Any) -> bool:
    return _in_range(value, 0, MAX_CALL_TIMEOUT, lo_open=True)


def _reply_within_ok(value: Any) -> bool:
    # Any finite number of seconds: a call may come from a protocol that allows
    # longer timeouts than ours.
    return _in_range(value, 0, sys.float_info.max, lo_open=False)


def _seconds_field(
    obj: Mapping[str, Any], key: str, default: Any, ok: Callable[[Any], bool], rule: str
) -> Any:
    """A JSON number of seconds, as a float; ``rule`` says what ``ok`` accepts."""
    value = _field(obj, key, (int, float), default)
    if value is default:
        return value
    if not ok(value):
        raise RemoteProtocolError(f"field {key!r} must be {rule}")
    return float(value)


def _positions(obj: Mapping[str, Any], key: str = "pos") -> dict[str, int] | None:
    """``{"dest": offset, …}``; None when absent, null or empty."""
    value = _field(obj, key, dict, None)
    if not value:
        return None
    for name, offset in value.items():
        _text(name, key)
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise RemoteProtocolError(f"field {key!r} must map names to integer offsets")
        if not 0 <= offset <= _MAX_OFFSET:
            raise RemoteProtocolError(f"field {key!r}: offset must be between 0 and {_MAX_OFFSET}")
    return value


def _where(obj: Mapping[str, Any], key: str, words: tuple[str, ...]) -> str | int | None:
    """``start``/``end`` of a ``sub``: one of ``words``, an offset, or None."""
    value = _field(obj, key, (str, int), None)
    if value is None or (isinstance(value, int) and 0 <= value <= _MAX_OFFSET):
        return value
    if value in words:
        return value
    choices = " or ".join(repr(w) for w in words)
    raise RemoteProtocolError(
        f"field {key!r} must be {choices} or an offset between 0 and {_MAX_OFFSET}"
    )


def _filter(obj: Mapping[str, Any]) -> Filter | None:
    if obj.get("filter") is None:
        return None
    try:
        result = Filter.from_json(obj["filter"])
    except (ValueError, ArithmeticError, RecursionError) as e:  # FilterError is a ValueError
        raise RemoteProtocolError(f"field 'filter': {e}") from None
    for condition in result.conditions:
        # Lone surrogates are valid JSON but could never be sent again.
        _text(condition.key, "filter")
        if isinstance(condition.value, str):
            _text(condition.value, "filter")
    return result


def _message(obj: Mapping[str, Any], ident: str | int | None) -> Publish:
    body, implied_type = _body(obj)
    return Publish(
        body=body,
        destination=_field(obj, "dest", str, None),
        headers=_headers(obj),
        content_type=_content_type(obj, implied_type),
        id=ident,
    )


def _publish_many(obj: Mapping[str, Any], ident: str | int | None) -> PublishMany:
    items = _field(obj, "messages", list)
    for key in ("body", "b64", "json"):
        if key in obj:
            raise RemoteProtocolError(f"a 'pub' with 'messages' cannot have {key!r} too")
    for key in ("dest", "headers", "content_type"):
        if obj.get(key) is not None:
            raise RemoteProtocolError(
                f"a 'pub' with 'messages' takes {key!r} in each message, not beside them"
            )
    if not 1 <= len(items) <= MAX_BATCH:
        raise RemoteProtocolError(f"'messages' must hold 1 to {MAX_BATCH} messages")
    messages = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RemoteProtocolError(f"messages[{i}] is not a JSON object")
        for key in ("op", "id"):
            if key in item:
                raise RemoteProtocolError(f"messages[{i}] cannot have {key!r}")
        try:
            messages.append(_message(item, None))
        except RemoteProtocolError as e:
            raise RemoteProtocolError(f"messages[{i}]: {e}") from None
    return PublishMany(tuple(messages), ident)


def _parse_client_line(line: bytes) -> Event:
    obj = _load(line)
    if not isinstance(obj, dict):
        raise RemoteProtocolError("each line must be a JSON object")
    if "op" not in obj:
        # A bare JSON object is published as it is, byte for byte.
        return Publish(body=line, content_type="application/json")
    op = obj["op"]
    if op == "pub":
        ident = _field(obj, "id", (str, int), None)
        if obj.get("messages") is not None:
            return _publish_many(obj, ident)
        return _message(obj, ident)
    if op == "call":
        body, implied_type = _body(obj)
        return Call(
            body=body,
            destination=_field(obj, "dest", str, None),
            headers=_headers(obj),
            content_type=_content_type(obj, implied_type),
            id=_field(obj, "id", (str, int), None),
            timeout=_seconds_field(
                obj, "timeout", DEFAULT_CALL_TIMEOUT, _call_timeout_ok, _TIMEOUT_RULE
            ),
        )
    if op == "reply":
        tag = _int_field(obj, "tag", 1, _MAX_CREDIT)
        body, implied_type = _optional_body(obj)
        return ReplyTo(
            tag=tag,
            body=body,
            headers=_headers(obj),
            content_type=_content_type(obj, implied_type),
            code=_int_field(obj, "code", 0, MAX_CODE, 0),
            error=_field(obj, "error", str, ""),
        )
    if op == "sub":
        return Subscribe(
            destination=_field(obj, "dest", str),
            group=_field(obj, "group", str, None),
            credit=_int_field(obj, "credit", 0, _MAX_CREDIT, None),
            window=_int_field(obj, "window", 1, MAX_WINDOW, 100),
            filter=_filter(obj),
            start=_where(obj, "start", STARTS),
            end=_where(obj, "end", ENDS),
        )
    if op == "unsub":
        return Unsubscribe(_field(obj, "dest", str))
    if op == "credit":
        return Credit(_field(obj, "dest", str), _int_field(obj, "n", 0, _MAX_CREDIT))
    if op == "ack":
        return Ack(_int_field(obj, "tag", 1, _MAX_CREDIT))
    if op == "nack":
        return Nack(_int_field(obj, "tag", 1, _MAX_CREDIT), _field(obj, "requeue", bool, True))
    if op == "ping":
        return Ping()
    raise RemoteProtocolError(f"unknown op {op!r}")


def _parse_server_line(line: bytes) -> Event:
    obj = _load(line)
    if not isinstance(obj, dict):
        raise RemoteProtocolError("each line must be a JSON object")
    op = obj.get("op")
    if op == "ack":
        return Published(
            _field(obj, "id", (str, int), None),
            _status(obj),
            _field(obj, "reason", str, ""),
            positions=_positions(obj),
            results=_results(obj),
        )
    if op == "reply":
        # The server always writes "id" (null for a call without one); a line
        # without it is a client's reply by tag sent the wrong way.
        if "id" not in obj:
            raise RemoteProtocolError("'reply' needs the field 'id'")
        ident = _field(obj, "id", (str, int), None)
        body, implied_type = _optional_body(obj)
        return Replied(
            id=ident,
            body=body,
            headers=_headers(obj),
            content_type=_content_type(obj, implied_type),
            code=_int_field(obj, "code", 0, MAX_CODE, 0),
            error=_field(obj, "error", str, ""),
        )
    if op == "msg":
        body, implied_type = _body(obj)
        return Deliver(
            tag=_int_field(obj, "tag", 1, _MAX_CREDIT),
            destination=_field(obj, "dest", str),
            body=body,
            headers=_headers(obj),
            content_type=_content_type(obj, implied_type),
            redelivered=_field(obj, "redelivered", bool, False),
            position=_int_field(obj, "pos", 0, _MAX_OFFSET, None),
            call=_field(obj, "call", bool, False),
            reply_within=_seconds_field(
                obj, "reply_within", None, _reply_within_ok, "a finite number of seconds >= 0"
            ),
        )
    if op == "end":
        return End(_field(obj, "dest", str))
    if op == "pong":
        return Pong()
    if op == "error":
        return Error(_field(obj, "error", str))
    raise RemoteProtocolError(f"unknown op {op!r}")


def _status(obj: Mapping[str, Any], where: str = "'ack'") -> str:
    if "status" not in obj:
        raise RemoteProtocolError(f"{where} needs the field 'status'")
    status = _field(obj, "status", str)
    if status not in STATUSES:
        raise RemoteProtocolError(f"unknown status {status!r}")
    return status


def _results(obj: Mapping[str, Any]) -> tuple[ItemResult, ...] | None:
    items = _field(obj, "results", list, None)
    if items is None:
        return None
    if len(items) > MAX_BATCH:
        raise RemoteProtocolError(f"'results' holds more than {MAX_BATCH} entries")
    results = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise RemoteProtocolError(f"results[{i}] is not a JSON object")
        try:
            results.append(
                ItemResult(
                    _status(item, f"results[{i}]"),
                    _field(item, "reason", str, ""),
                    _positions(item),
                )
            )
        except RemoteProtocolError as e:
            raise RemoteProtocolError(f"results[{i}]: {e}") from None
    return tuple(results)


# -- serializing -----------------------------------------------------------------------
def _body_fields(out: dict[str, Any], body: bytes) -> None:
    try:
        out["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        out["b64"] = base64.b64encode(body).decode("ascii")


def _message_fields(
    out: dict[str, Any], event: Publish | Call | ReplyTo | Replied | Deliver
) -> None:
    if event.headers:
        out["headers"] = dict(event.headers)
    if event.content_type is not None:
        out["content_type"] = event.content_type


def _item_object(message: Publish) -> dict[str, Any]:
    """One entry of a ``pub`` line's ``messages``."""
    if not isinstance(message, Publish):
        raise LocalProtocolError(f"a PublishMany holds Publish events, not {message!r}")
    if message.id is not None:
        raise LocalProtocolError("a message in a PublishMany has no id of its own")
    out: dict[str, Any] = {}
    if message.destination is not None:
        out["dest"] = message.destination
    _body_fields(out, message.body)
    _message_fields(out, message)
    return out


def _seconds(value: float, ok: Callable[[Any], bool], what: str, rule: str) -> int | float:
    """``value`` for the wire; an integral float is written as an int (``5``, not ``5.0``)."""
    if not ok(value):
        raise LocalProtocolError(f"{what} must be {rule}, not {value!r}")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _code(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CODE:
        raise LocalProtocolError(f"a reply code must be an int from 0 to {MAX_CODE}, not {value!r}")
    return value


def _item_result(result: ItemResult) -> dict[str, Any]:
    out: dict[str, Any] = {"status": result.status}
    if result.reason:
        out["reason"] = result.reason
    if result.positions:
        out["pos"] = dict(result.positions)
    return out


def _to_object(event: Event) -> dict[str, Any]:
    out: dict[str, Any]
    if isinstance(event, Publish):
        out = {"op": "pub"}
        if event.id is not None:
            out["id"] = event.id
        if event.destination is not None:
            out["dest"] = event.destination
        _body_fields(out, event.body)
    elif isinstance(event, PublishMany):
        if not 1 <= len(event.messages) <= MAX_BATCH:
            raise LocalProtocolError(f"a PublishMany holds 1 to {MAX_BATCH} messages")
        out = {"op": "pub"}
        if event.id is not None:
            out["id"] = event.id
        out["messages"] = [_item_object(m) for m in event.messages]
        return out
    elif isinstance(event, Call):
        timeout = _seconds(event.timeout, _call_timeout_ok, "a call's timeout", _TIMEOUT_RULE)
        out = {"op": "call"}
        if event.id is not None:
            out["id"] = event.id
        if event.destination is not None:
            out["dest"] = event.destination
        _body_fields(out, event.body)
        _message_fields(out, event)
        out["timeout"] = timeout
        return out
    elif isinstance(event, ReplyTo):
        out = {"op": "reply", "tag": event.tag}
        if event.body:
            _body_fields(out, event.body)
        _message_fields(out, event)
        if _code(event.code):
            out["code"] = event.code
        if event.error:
            out["error"] = event.error
        return out
    elif isinstance(event, Replied):
        out = {"op": "reply", "id": event.id, "code": _code(event.code)}
        if event.body:
            _body_fields(out, event.body)
        _message_fields(out, event)
        if event.error:
            out["error"] = event.error
        return out
    elif isinstance(event, Deliver):
        out = {"op": "msg", "tag": event.tag, "dest": event.destination}
        _body_fields(out, event.body)
        if event.redelivered:
            out["redelivered"] = True
        if event.position is not None:
            out["pos"] = event.position
        if event.call:
            out["call"] = True
        if event.reply_within is not None:
            out["reply_within"] = _seconds(
                event.reply_within, _reply_within_ok, "reply_within", "finite and >= 0"
            )
    elif isinstance(event, Published):
        out = {"op": "ack", "id": event.id, "status": event.status}
        if event.reason:
            out["reason"] = event.reason
        if event.positions:
            out["pos"] = dict(event.positions)
        if event.results is not None:
            if len(event.results) > MAX_BATCH:
                raise LocalProtocolError(f"more than {MAX_BATCH} results")
            out["results"] = [_item_result(r) for r in event.results]
        return out
    elif isinstance(event, End):
        return {"op": "end", "dest": event.destination}
    elif isinstance(event, Subscribe):
        out = {"op": "sub", "dest": event.destination, "window": event.window}
        if event.group is not None:
            out["group"] = event.group
        if event.credit is not None:
            out["credit"] = event.credit
        if event.filter is not None:
            out["filter"] = event.filter.to_json()
        if event.start is not None:
            out["start"] = event.start
        if event.end is not None:
            out["end"] = event.end
        return out
    elif isinstance(event, Unsubscribe):
        return {"op": "unsub", "dest": event.destination}
    elif isinstance(event, Credit):
        return {"op": "credit", "dest": event.destination, "n": event.n}
    elif isinstance(event, Ack):
        return {"op": "ack", "tag": event.tag}
    elif isinstance(event, Nack):
        return {"op": "nack", "tag": event.tag, "requeue": event.requeue}
    elif isinstance(event, Ping):
        return {"op": "ping"}
    elif isinstance(event, Pong):
        return {"op": "pong"}
    elif isinstance(event, Error):
        return {"op": "error", "error": event.message}
    else:  # pragma: no cover - guarded by the role check in send()
        raise LocalProtocolError(f"cannot send {event!r}")
    _message_fields(out, event)
    return out


#: Built once: ``json.dumps`` with non-default arguments builds an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dump_compact(value: Any) -> bytes:
    return _ENCODER.encode(value).encode("utf-8")


def _dump(obj: dict[str, Any]) -> bytes:
    return _dump_compact(obj) + b"\n"
