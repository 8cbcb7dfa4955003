"""Lumberjack events ⇄ gateway messages.

Inbound, a ``J`` event is a message whose body is the JSON bytes, unchanged,
with content type ``application/json``; a ``D`` event becomes headers with an
empty body. Outbound, a message is sent as one ``J`` frame: a JSON object body
goes as it is, anything else is wrapped as ``{"message": <text>, …headers}``.

"A JSON object" means one RFC 8259 object in UTF-8. It is checked without
building the object: msgspec reads the payload as a raw JSON value (checking
its syntax and that nothing follows it), the value must start with ``{``, and
the bytes must be UTF-8. That costs a third of parsing with orjson and
throwing the result away, which matters at hundreds of thousands of events a
second; the object is only built where a field of it is needed.
"""

from __future__ import annotations

import functools
import json
import operator
from collections import deque
from collections.abc import Mapping, Sequence
from itertools import repeat
from types import MappingProxyType
from typing import Any, cast

import msgspec
import orjson

from gateway.sdk import Message, PeerIdentity, RemoteProtocolError, Source

__all__ = [
    "JSON",
    "beats_metadata",
    "enrichment",
    "field_value",
    "json_object_error",
    "parse_event",
    "to_messages",
    "to_payload",
    "to_payloads",
]

JSON = "application/json"
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


_RAW_JSON = msgspec.json.Decoder(msgspec.Raw)
_JSON_WHITESPACE = b" \t\n\r"


def json_object_error(payload: bytes) -> str | None:
    """Why ``payload`` is not one JSON object in UTF-8, or None when it is one."""
    try:
        _RAW_JSON.decode(payload)
    except msgspec.DecodeError as e:
        return f"is not valid JSON: {e}"
    except RecursionError:
        return "is not valid JSON: nested too deeply"
    if payload.lstrip(_JSON_WHITESPACE)[:1] != b"{":
        return "is not a JSON object"
    try:
        payload.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"is not UTF-8: {e}"
    return None


def check_event(seq: int, payload: bytes) -> None:
    """Raise the sender's protocol error unless the ``J`` payload is one JSON object."""
    problem = json_object_error(payload)
    if problem is not None:
        raise RemoteProtocolError(f"event seq {seq} {problem}")


def _all_json_objects(payloads: list[bytes]) -> bool:
    """True when every payload is one JSON object in UTF-8, checked in C-level loops.

    False also for a valid object with whitespace before its ``{``: the caller
    then checks each payload with :func:`json_object_error`.
    """
    try:
        deque(map(_RAW_JSON.decode, payloads), maxlen=0)
    except (msgspec.DecodeError, RecursionError):
        return False
    if not all(map(bytes.startswith, payloads, repeat(b"{"))):
        return False
    # Each payload now starts with "{" and ends with "}" or whitespace, so no
    # UTF-8 sequence can span two of them: the whole is UTF-8 if each part is.
    joined = b"".join(payloads)
    if not joined.isascii():
        try:
            joined.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return True


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
    every ``J`` payload must be one JSON object in UTF-8, else
    :class:`RemoteProtocolError`: a window with a malformed event is never acked.
    """
    headers = MappingProxyType(dict(extra_headers)) if extra_headers else _NO_HEADERS
    if not destination_field and not headers:
        fast = _json_window(events, source, destination, validate)
        if fast is not None:
            return fast
    out = []
    for seq, event in events:
        if isinstance(event, dict):
            dest = field_value(event, destination_field) if destination_field else None
            kv = {**event, **headers} if headers else event
            out.append(Message(dest or destination, b"", MappingProxyType(kv), None, source))
            continue
        dest = None
        if destination_field:  # parsing validates too
            dest = field_value(parse_event(seq, event), destination_field)
        elif validate:
            check_event(seq, event)
        out.append(Message(dest or destination, event, headers, JSON, source))
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
    mixed = list(map(_PAYLOAD, events))
    if set(map(type, mixed)) != _BYTES_ONLY:
        return None
    payloads = cast("list[bytes]", mixed)
    if validate and not _all_json_objects(payloads):
        for seq, payload in events:  # find and name the offending event, if any
            check_event(seq, cast(bytes, payload))
    fields = zip(repeat(destination), payloads, repeat(_NO_HEADERS), repeat(JSON), repeat(source))
    return list(map(_new_message, fields))


_PAYLOAD = operator.itemgetter(1)
_BYTES_ONLY = {bytes}

#: Builds a Message from a 5-tuple without the named tuple's Python-level __new__.
_new_message = functools.partial(tuple.__new__, Message)


class _MetadataProbe(msgspec.Struct):
    """Reads only whether an object has a top-level ``@metadata`` key."""

    metadata: msgspec.Raw | msgspec.UnsetType = msgspec.field(
        default=msgspec.UNSET, name="@metadata"
    )


_METADATA_PROBE = msgspec.json.Decoder(_MetadataProbe)


def beats_metadata(beat: str, type_: str, version: str) -> bytes:
    """The ``"@metadata":{…}`` member Logstash's beats input reads (index names, routing)."""
    value = {"beat": beat, "type": type_, "version": version}
    return b'"@metadata":' + json.dumps(value, separators=(",", ":")).encode()


_METADATA_PROBES = msgspec.json.Decoder(list[_MetadataProbe])
_METADATA = operator.attrgetter("metadata")
_BODY = operator.attrgetter("body")


def to_payloads(messages: Sequence[Message], metadata: bytes = b"") -> list[bytes]:
    """:func:`to_payload` of each message, in C-level loops when every body is a JSON object."""
    bodies = list(map(_BODY, messages))
    if not _all_json_objects(bodies):
        return [to_payload(m, metadata) for m in messages]
    if not metadata:
        return bodies
    # Each body is one whole JSON object, so joined they are an array of exactly
    # these objects, in order: one read finds which have a top-level @metadata.
    try:
        probes = _METADATA_PROBES.decode(b"[" + b",".join(bodies) + b"]")
    except RecursionError:  # an object at the nesting limit: one level deeper here
        return [to_payload(m, metadata) for m in messages]
    has = list(map(operator.is_not, map(_METADATA, probes), repeat(msgspec.UNSET)))
    if all(has):
        return bodies
    return [
        body if ok else _add_metadata(body, metadata) for body, ok in zip(bodies, has, strict=True)
    ]


def to_payload(message: Message, metadata: bytes = b"") -> bytes:
    """The JSON object to send for ``message`` in a ``J`` frame.

    With ``metadata`` (from :func:`beats_metadata`), an object without a
    top-level ``@metadata`` gets that member; one that has it (a Beats event
    relayed) goes unchanged.
    """
    body = message.body
    if metadata and (b'"@metadata"' in body or b"\\u" in body):  # the key, or an escaped spelling
        has_metadata = _has_metadata(body)
    else:
        has_metadata = False if json_object_error(body) is None else None
    if has_metadata is not None:  # a JSON object
        return _add_metadata(body, metadata) if metadata and not has_metadata else body
    obj: dict[str, Any] = {}
    if body or not message.headers:
        obj["message"] = body.decode("utf-8", "replace")
    for key, value in message.headers.items():
        obj.setdefault(key, value)
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    if metadata and "@metadata" not in obj:
        text = b"{" + metadata + b"," + text[1:]
    return text


def _add_metadata(body: bytes, metadata: bytes) -> bytes:
    """The JSON object ``body`` with the member ``metadata`` spliced in after its "{".

    The rest of the object stays byte for byte.
    """
    brace = len(body) - len(body.lstrip(_JSON_WHITESPACE))
    empty = body[brace + 1 :].lstrip(_JSON_WHITESPACE)[:1] == b"}"
    return body[: brace + 1] + metadata + (b"" if empty else b",") + body[brace + 1 :]


def _has_metadata(body: bytes) -> bool | None:
    """Whether ``body`` has a top-level ``@metadata`` key; None if it is not a JSON object."""
    try:
        probe = _METADATA_PROBE.decode(body)  # checks the syntax and that it is an object
        body.decode("utf-8")
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError):
        return None
    return probe.metadata is not msgspec.UNSET
