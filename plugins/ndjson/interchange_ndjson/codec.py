"""The ndjson codec: one JSON object per line, parsed without doing any I/O.

Feed received bytes to :meth:`NdjsonConnection.receive_data` (``b""`` means
the peer closed), then call :meth:`NdjsonConnection.next_event` until it
returns :data:`NEED_DATA`. :meth:`NdjsonConnection.send` turns an event into
the bytes to write. Lines are found in one ``bytearray`` with a read offset
and a "searched up to" mark, so a long line arriving in small pieces is
scanned once; consumed bytes are dropped only when they are half the buffer.

A line longer than ``max_line`` bytes, invalid JSON, or an event the peer's
role may not send is a :class:`~gateway.errors.RemoteProtocolError`; the
connection is then in the ``ERROR`` state and the driver answers with an
``error`` line and closes.
"""

from __future__ import annotations

import base64
import enum
import json
from collections.abc import Mapping
from typing import Any, Final

from gateway.errors import LocalProtocolError, RemoteProtocolError

from .events import (
    Ack,
    ConnectionClosed,
    Credit,
    Deliver,
    Error,
    Event,
    Nack,
    Ping,
    Pong,
    Publish,
    Published,
    Subscribe,
    Unsubscribe,
)

__all__ = ["CLIENT", "DEFAULT_MAX_LINE", "NEED_DATA", "SERVER", "NdjsonConnection", "State"]


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


CLIENT: Final = Role.CLIENT
SERVER: Final = Role.SERVER


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by ``next_event`` when a whole line has not arrived yet.
NEED_DATA: Final = _NeedData()

#: 1 MiB: one debug message per line is rarely bigger; raise it per listener.
DEFAULT_MAX_LINE = 1024 * 1024
#: Most deliveries a subscriber may hold unacked (the ``window`` of ``sub``).
MAX_WINDOW = 10_000
STATUSES = ("delivered", "failed", "rejected")


class State(enum.Enum):
    #: Lines flow both ways.
    OPEN = "open"
    #: The peer closed its side (input ended cleanly).
    CLOSED = "closed"
    #: A protocol error happened; nothing more is parsed or sent but an error line.
    ERROR = "error"


_CLIENT_SENDS = (Publish, Subscribe, Unsubscribe, Credit, Ack, Nack, Ping)
_SERVER_SENDS = (Published, Deliver, Pong, Error)


class NdjsonConnection:
    """One side of an ndjson connection."""

    def __init__(self, role: Role, *, max_line: int = DEFAULT_MAX_LINE) -> None:
        self.role = role
        self.max_line = max_line
        self.state = State.OPEN
        self._buf = bytearray()
        self._start = 0
        self._searched = 0
        self._eof = False
        self._parse = _parse_client_line if role is SERVER else _parse_server_line

    # -- input ----------------------------------------------------------------
    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes; ``b""`` means the peer closed its sending side."""
        if self._eof and data:
            raise LocalProtocolError("data received after end of input")
        if data:
            self._buf += data
        else:
            self._eof = True

    def next_event(self) -> Event | _NeedData:
        """Parse and return the next event, or :data:`NEED_DATA`."""
        if self.state is State.ERROR:
            raise LocalProtocolError("the connection is in the ERROR state")
        if self.state is State.CLOSED:
            return NEED_DATA
        buf = self._buf
        while True:
            nl = buf.find(b"\n", max(self._start, self._searched))
            if nl < 0:
                pending = len(buf) - self._start
                if pending > self.max_line:
                    return self._fail(f"line longer than {self.max_line} bytes")
                self._searched = len(buf)
                if self._eof:
                    if pending and buf[self._start :].strip():
                        return self._fail("connection closed in the middle of a line")
                    self.state = State.CLOSED
                    return ConnectionClosed()
                return NEED_DATA
            if nl - self._start > self.max_line:
                return self._fail(f"line longer than {self.max_line} bytes")
            line = bytes(buf[self._start : nl]).rstrip(b"\r")
            self._start = nl + 1
            self._searched = self._start
            if self._start > len(buf) // 2:
                del buf[: self._start]
                self._start = self._searched = 0
            if not line.strip():
                continue
            try:
                return self._parse(line)
            except RemoteProtocolError as e:
                return self._fail(str(e))

    def _fail(self, message: str) -> Event:
        self.state = State.ERROR
        raise RemoteProtocolError(message)

    # -- output ---------------------------------------------------------------
    def send(self, event: Event) -> bytes:
        """The bytes for ``event``, which this role must be allowed to send."""
        allowed = _CLIENT_SENDS if self.role is CLIENT else _SERVER_SENDS
        if not isinstance(event, allowed):
            raise LocalProtocolError(f"a {self.role.value} cannot send {type(event).__name__}")
        if self.state is State.ERROR and not isinstance(event, Error):
            raise LocalProtocolError("the connection is in the ERROR state")
        if isinstance(event, Error):
            self.state = State.ERROR
        return _dump(_to_object(event))


# -- parsing ------------------------------------------------------------------------
def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _load(line: bytes) -> Any:
    """Strict JSON from one UTF-8 line (no UTF-16/32 sniffing, no NaN, bounded depth)."""
    try:
        return json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
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


_MAX_CREDIT = 2**63 - 1


def _content_type(obj: Mapping[str, Any], implied: str | None) -> str | None:
    value = _field(obj, "content_type", str, None)
    return implied if value is None else value


def _parse_client_line(line: bytes) -> Event:
    obj = _load(line)
    if not isinstance(obj, dict):
        raise RemoteProtocolError("each line must be a JSON object")
    if "op" not in obj:
        # A bare JSON object is published as it is, byte for byte.
        return Publish(body=line, content_type="application/json")
    op = obj["op"]
    if op == "pub":
        body, implied_type = _body(obj)
        ident = _field(obj, "id", (str, int), None)
        return Publish(
            body=body,
            destination=_field(obj, "dest", str, None),
            headers=_headers(obj),
            content_type=_content_type(obj, implied_type),
            id=ident,
        )
    if op == "sub":
        return Subscribe(
            destination=_field(obj, "dest", str),
            group=_field(obj, "group", str, None),
            credit=_int_field(obj, "credit", 0, _MAX_CREDIT, None),
            window=_int_field(obj, "window", 1, MAX_WINDOW, 100),
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
        status = _field(obj, "status", str)
        if status not in STATUSES:
            raise RemoteProtocolError(f"unknown status {status!r}")
        return Published(
            _field(obj, "id", (str, int), None), status, _field(obj, "reason", str, "")
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
        )
    if op == "pong":
        return Pong()
    if op == "error":
        return Error(_field(obj, "error", str))
    raise RemoteProtocolError(f"unknown op {op!r}")


# -- serializing -----------------------------------------------------------------------
def _body_fields(out: dict[str, Any], body: bytes) -> None:
    try:
        out["body"] = body.decode("utf-8")
    except UnicodeDecodeError:
        out["b64"] = base64.b64encode(body).decode("ascii")


def _to_object(event: Event) -> dict[str, Any]:
    out: dict[str, Any]
    if isinstance(event, Publish):
        out = {"op": "pub"}
        if event.id is not None:
            out["id"] = event.id
        if event.destination is not None:
            out["dest"] = event.destination
        _body_fields(out, event.body)
    elif isinstance(event, Deliver):
        out = {"op": "msg", "tag": event.tag, "dest": event.destination}
        _body_fields(out, event.body)
        if event.redelivered:
            out["redelivered"] = True
    elif isinstance(event, Published):
        out = {"op": "ack", "id": event.id, "status": event.status}
        if event.reason:
            out["reason"] = event.reason
        return out
    elif isinstance(event, Subscribe):
        out = {"op": "sub", "dest": event.destination, "window": event.window}
        if event.group is not None:
            out["group"] = event.group
        if event.credit is not None:
            out["credit"] = event.credit
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
    if event.headers:
        out["headers"] = dict(event.headers)
    if event.content_type is not None:
        out["content_type"] = event.content_type
    return out


#: Built once: ``json.dumps`` with non-default arguments builds an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dump_compact(value: Any) -> bytes:
    return _ENCODER.encode(value).encode("utf-8")


def _dump(obj: dict[str, Any]) -> bytes:
    return _dump_compact(obj) + b"\n"
