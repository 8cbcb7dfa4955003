"""ndjson's frames: one JSON object per line, to an event and back; no state, no I/O.

:func:`parse_client_line` and :func:`parse_server_line` turn one line (without
its newline) into the event it says, checking every field (a
:class:`~gateway.core.errors.RemoteProtocolError` names what is wrong);
:func:`encode` turns an event into its line, newline included, refusing with
:class:`~gateway.core.errors.LocalProtocolError` what the peer would refuse
(an empty batch, a call timeout out of range). Which events a side may send
in which state is the codec's business (:mod:`.codec`).

Two ops name a line in both directions with different fields: ``ack`` and
``reply`` answer a delivery by ``tag`` from a client, a publish or a call by
``id`` from the server; the parser of the receiving side decides which.
"""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from gateway.sdk import Filter, LocalProtocolError, RemoteProtocolError

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
    "DEFAULT_CALL_TIMEOUT",
    "ENDS",
    "MAX_BATCH",
    "MAX_CALL_TIMEOUT",
    "MAX_CODE",
    "MAX_WINDOW",
    "STARTS",
    "STATUSES",
    "encode",
    "parse_client_line",
    "parse_server_line",
]

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


def parse_client_line(line: bytes) -> Event:
    """The event a client's line says (a bare JSON object, without ``op``, is a publish
    of the line itself, byte for byte)."""
    obj = _object(line)
    if "op" not in obj:
        return Publish(body=line, content_type="application/json")
    return _op(_CLIENT_OPS, obj)(obj)


def parse_server_line(line: bytes) -> Event:
    """The event a server's line says."""
    return _op(_SERVER_OPS, (obj := _object(line)))(obj)


def _object(line: bytes) -> dict[str, Any]:
    obj = _load(line)
    if not isinstance(obj, dict):
        raise RemoteProtocolError("each line must be a JSON object")
    return obj


def _op(ops: Mapping[str, Callable[[Mapping[str, Any]], Event]], obj: Mapping[str, Any]) -> Any:
    """The parser of ``obj``'s op among ``ops``."""
    op = obj.get("op")
    parse = ops.get(op) if isinstance(op, str) else None
    if parse is None:
        raise RemoteProtocolError(f"unknown op {op!r}")
    return parse


# -- a client's ops --
def _pub(obj: Mapping[str, Any]) -> Event:
    ident = _field(obj, "id", (str, int), None)
    if obj.get("messages") is not None:
        return _publish_many(obj, ident)
    return _message(obj, ident)


def _call(obj: Mapping[str, Any]) -> Event:
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


def _reply_to(obj: Mapping[str, Any]) -> Event:
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


def _subscribe(obj: Mapping[str, Any]) -> Event:
    return Subscribe(
        destination=_field(obj, "dest", str),
        group=_field(obj, "group", str, None),
        credit=_int_field(obj, "credit", 0, _MAX_CREDIT, None),
        window=_int_field(obj, "window", 1, MAX_WINDOW, 100),
        filter=_filter(obj),
        start=_where(obj, "start", STARTS),
        end=_where(obj, "end", ENDS),
    )


_CLIENT_OPS: dict[str, Callable[[Mapping[str, Any]], Event]] = {
    "pub": _pub,
    "call": _call,
    "reply": _reply_to,
    "sub": _subscribe,
    "unsub": lambda obj: Unsubscribe(_field(obj, "dest", str)),
    "credit": lambda obj: Credit(_field(obj, "dest", str), _int_field(obj, "n", 0, _MAX_CREDIT)),
    "ack": lambda obj: Ack(_int_field(obj, "tag", 1, _MAX_CREDIT)),
    "nack": lambda obj: Nack(
        _int_field(obj, "tag", 1, _MAX_CREDIT), _field(obj, "requeue", bool, True)
    ),
    "ping": lambda obj: Ping(),
}


# -- the server's ops --
def _published(obj: Mapping[str, Any]) -> Event:
    return Published(
        _field(obj, "id", (str, int), None),
        _status(obj),
        _field(obj, "reason", str, ""),
        positions=_positions(obj),
        results=_results(obj),
    )


def _replied(obj: Mapping[str, Any]) -> Event:
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


def _deliver(obj: Mapping[str, Any]) -> Event:
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


_SERVER_OPS: dict[str, Callable[[Mapping[str, Any]], Event]] = {
    "ack": _published,
    "reply": _replied,
    "msg": _deliver,
    "end": lambda obj: End(_field(obj, "dest", str)),
    "pong": lambda obj: Pong(),
    "error": lambda obj: Error(_field(obj, "error", str)),
}


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


def _publish_object(event: Publish) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "pub"}
    if event.id is not None:
        out["id"] = event.id
    if event.destination is not None:
        out["dest"] = event.destination
    _body_fields(out, event.body)
    _message_fields(out, event)
    return out


def _publish_many_object(event: PublishMany) -> dict[str, Any]:
    if not 1 <= len(event.messages) <= MAX_BATCH:
        raise LocalProtocolError(f"a PublishMany holds 1 to {MAX_BATCH} messages")
    out: dict[str, Any] = {"op": "pub"}
    if event.id is not None:
        out["id"] = event.id
    out["messages"] = [_item_object(m) for m in event.messages]
    return out


def _call_object(event: Call) -> dict[str, Any]:
    timeout = _seconds(event.timeout, _call_timeout_ok, "a call's timeout", _TIMEOUT_RULE)
    out: dict[str, Any] = {"op": "call"}
    if event.id is not None:
        out["id"] = event.id
    if event.destination is not None:
        out["dest"] = event.destination
    _body_fields(out, event.body)
    _message_fields(out, event)
    out["timeout"] = timeout
    return out


def _reply_to_object(event: ReplyTo) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "reply", "tag": event.tag}
    if event.body:
        _body_fields(out, event.body)
    _message_fields(out, event)
    if _code(event.code):
        out["code"] = event.code
    if event.error:
        out["error"] = event.error
    return out


def _replied_object(event: Replied) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "reply", "id": event.id, "code": _code(event.code)}
    if event.body:
        _body_fields(out, event.body)
    _message_fields(out, event)
    if event.error:
        out["error"] = event.error
    return out


def _deliver_object(event: Deliver) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "msg", "tag": event.tag, "dest": event.destination}
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
    _message_fields(out, event)
    return out


def _published_object(event: Published) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "ack", "id": event.id, "status": event.status}
    if event.reason:
        out["reason"] = event.reason
    if event.positions:
        out["pos"] = dict(event.positions)
    if event.results is not None:
        if len(event.results) > MAX_BATCH:
            raise LocalProtocolError(f"more than {MAX_BATCH} results")
        out["results"] = [_item_result(r) for r in event.results]
    return out


def _subscribe_object(event: Subscribe) -> dict[str, Any]:
    out: dict[str, Any] = {"op": "sub", "dest": event.destination, "window": event.window}
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


#: The JSON object of each kind of event (by exact type: events are final).
_OBJECTS: dict[type[Event], Callable[[Any], dict[str, Any]]] = {
    Publish: _publish_object,
    PublishMany: _publish_many_object,
    Call: _call_object,
    ReplyTo: _reply_to_object,
    Replied: _replied_object,
    Deliver: _deliver_object,
    Published: _published_object,
    End: lambda event: {"op": "end", "dest": event.destination},
    Subscribe: _subscribe_object,
    Unsubscribe: lambda event: {"op": "unsub", "dest": event.destination},
    Credit: lambda event: {"op": "credit", "dest": event.destination, "n": event.n},
    Ack: lambda event: {"op": "ack", "tag": event.tag},
    Nack: lambda event: {"op": "nack", "tag": event.tag, "requeue": event.requeue},
    Ping: lambda event: {"op": "ping"},
    Pong: lambda event: {"op": "pong"},
    Error: lambda event: {"op": "error", "error": event.message},
}


def _to_object(event: Event) -> dict[str, Any]:
    to_object = _OBJECTS.get(type(event))
    if to_object is None:
        raise LocalProtocolError(f"cannot send {event!r}")
    return to_object(event)


#: Built once: ``json.dumps`` with non-default arguments builds an encoder per call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _dump_compact(value: Any) -> bytes:
    return _ENCODER.encode(value).encode("utf-8")


def encode(event: Event) -> bytes:
    """The line of ``event``, newline included."""
    return _dump_compact(_to_object(event)) + b"\n"
