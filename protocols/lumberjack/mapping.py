"""Lumberjack events ⇄ gateway messages (DECISIONS §1, "Mapping").

Inbound, a ``J`` event is a message whose body is the JSON bytes, unchanged,
with content type ``application/json``; a ``D`` event becomes headers with an
empty body. Outbound, a message is sent as one ``J`` frame: a JSON object body
goes as it is, anything else is wrapped as ``{"message": <text>, …headers}``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from itertools import repeat
from types import MappingProxyType
from typing import Any, cast

import orjson

from gateway.errors import RemoteProtocolError
from gateway.model import Message, PeerIdentity, Source

__all__ = ["JSON", "enrichment", "field_value", "parse_event", "to_messages", "to_payload"]

JSON = "application/json"
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def parse_event(seq: int, payload: bytes) -> dict[str, Any]:
    """A ``J`` payload as a JSON object; anything else is the sender's protocol error."""
    try:
        value = orjson.loads(payload)
    except orjson.JSONDecodeError as e:
        raise RemoteProtocolError(f"event seq {seq} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise RemoteProtocolError(f"event seq {seq} is not a JSON object")
    return value


def field_value(event: dict[str, Any], field: str) -> str | None:
    """The value at dotted path ``field`` (e.g. ``fields.topic``) if it is a non-empty string.

    A ``D`` event is flat: there the whole dotted name is the key.
    """
    value: Any = event.get(field)
    if value is None and "." in field:
        value = event
        for part in field.split("."):
            if not isinstance(value, dict):
                return None
            value = value.get(part)
    return value if isinstance(value, str) and value else None


def enrichment(source: Source) -> dict[str, str]:
    """Headers naming the sender: its address and, over mutual TLS, its certificate."""
    headers = {"lumberjack.peer": source.peer}
    identity: PeerIdentity | None = source.identity
    if identity is not None:
        headers["lumberjack.tls_subject"] = identity.subject
        headers["lumberjack.tls_fingerprint"] = identity.fingerprint
    return headers


def to_messages(
    events: list[tuple[int, bytes | dict[str, str]]],
    source: Source,
    destination: str,
    *,
    destination_field: str = "",
    validate: bool = True,
    extra_headers: Mapping[str, str] | None = None,
) -> list[Message]:
    """The messages of one window, in order.

    With ``validate`` (or a ``destination_field``, which needs the parsed event)
    every ``J`` payload must be a JSON object, else :class:`RemoteProtocolError`:
    a window with a malformed event is never acked.
    """
    headers = MappingProxyType(dict(extra_headers)) if extra_headers else _NO_HEADERS
    if not destination_field and not headers:
        fast = _json_window(events, source, destination, validate)
        if fast is not None:
            return fast
    parse = validate or bool(destination_field)
    out = []
    for seq, event in events:
        dest = destination
        if parse:
            parsed = event if isinstance(event, dict) else parse_event(seq, event)
            if destination_field:
                dest = field_value(parsed, destination_field) or destination
        if isinstance(event, dict):
            kv = {**event, **headers} if headers else event
            out.append(Message(dest, b"", MappingProxyType(kv), None, source))
        else:
            out.append(Message(dest, event, headers, JSON, source))
    return out


def _json_window(
    events: list[tuple[int, bytes | dict[str, str]]],
    source: Source,
    destination: str,
    validate: bool,
) -> list[Message] | None:
    """The common case, a window of ``J`` events all for one destination, in C-level loops.

    Returns None when the window holds ``D`` events (the general path takes it).
    """
    mixed = [event for _, event in events]
    if not all(type(p) is bytes for p in mixed):
        return None
    payloads = cast("list[bytes]", mixed)
    if validate:
        loads = orjson.loads
        try:
            ok = all(type(loads(p)) is dict for p in payloads)
        except orjson.JSONDecodeError:
            ok = False
        if not ok:
            for seq, payload in events:  # find and name the offending event
                parse_event(seq, cast(bytes, payload))
    fields = zip(repeat(destination), payloads, repeat(_NO_HEADERS), repeat(JSON), repeat(source))
    return list(map(_new_message, fields))


#: Builds a Message from a 5-tuple without the named tuple's Python-level __new__.
_new_message = functools.partial(tuple.__new__, Message)


def to_payload(message: Message) -> bytes:
    """The JSON object to send for ``message`` in a ``J`` frame."""
    body = message.body
    if body.lstrip()[:1] == b"{":
        try:
            if isinstance(orjson.loads(body), dict):
                return body
        except orjson.JSONDecodeError:
            pass
    obj: dict[str, Any] = {}
    if body or not message.headers:
        obj["message"] = body.decode("utf-8", "replace")
    for key, value in message.headers.items():
        obj.setdefault(key, value)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
