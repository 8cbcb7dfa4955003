"""The message envelope: how a hub :class:`~gateway.core.model.Message` is kept as
the payload of one stored event (records of format ``ENVELOPE``).

An envelope is one msgpack map with short string keys; absent optional keys
mean "none", and a reader ignores keys it does not know, so later versions of
the gateway may add keys without a new version number:

======  ==========================  ===========================================
key     msgpack type                meaning
======  ==========================  ===========================================
``v``   int, required               layout version: 1. A larger one is refused.
``b``   bin, required               the body, byte for byte
``h``   map str → str               headers (absent: none)
``c``   str                         content type (absent: none)
``s``   int, required               stored: ms since the epoch, when the
                                    gateway appended it
``p``   int                         published: ms since the epoch, when the
                                    gateway received it (``Source.received_at``;
                                    absent: unknown)
``o``   map                         source (absent: none), below
======  ==========================  ===========================================

The source map: ``p`` protocol (str, required), ``l`` listener (str,
required), ``a`` peer address (str), ``u`` upstream (str), and ``i`` the
verified TLS identity (map: ``s`` subject str, required; ``n`` SANs, array of
str; ``f`` SHA-256 fingerprint, str). Absent strings are empty.

The destination is not stored (the segment is the destination) and the
receive time comes back rounded to the millisecond. A payload that is not an
envelope, has a key of the wrong type, or a newer version raises ValueError
saying which. The body is ``bin`` and every text ``str`` (UTF-8), as
msgpack's ``use_bin_type`` writes them; one C-level ``pack`` per message.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import Any

import msgpack

from gateway.core.model import Message, PeerIdentity, Source

__all__ = ["VERSION", "decode", "decode_many", "encode", "encode_many", "message_size"]

#: The layout version written, and the newest one read.
VERSION = 1

_unpack = msgpack.unpackb
#: Builds a Message from a 5-tuple without the named tuple's Python-level ``__new__``.
_new_message = functools.partial(tuple.__new__, Message)
_NO_HEADERS: Mapping[str, str] = Message._field_defaults["headers"]


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _source_doc(source: Source) -> dict[str, Any]:
    doc: dict[str, Any] = {"p": source.protocol, "l": source.listener}
    if source.peer:
        doc["a"] = source.peer
    if source.upstream:
        doc["u"] = source.upstream
    identity = source.identity
    if identity is not None:
        ident: dict[str, Any] = {"s": identity.subject}
        if identity.sans:
            ident["n"] = list(identity.sans)
        if identity.fingerprint:
            ident["f"] = identity.fingerprint
        doc["i"] = ident
    return doc


def encode_many(messages: Sequence[Message], stored_at: float | None = None) -> list[bytes]:
    """The envelope of each message, all stored at ``stored_at`` (seconds since the
    epoch; None: now). Messages of one publish usually share their :class:`Source`:
    its map is built once."""
    pack = msgpack.Packer(use_bin_type=True).pack
    stored = _ms(time.time() if stored_at is None else stored_at)
    out: list[bytes] = []
    last_source: Source | None = None
    source_doc: dict[str, Any] | None = None
    for m in messages:
        doc: dict[str, Any] = {"v": VERSION, "b": m.body, "s": stored}
        if m.headers:
            doc["h"] = dict(m.headers)
        if m.content_type is not None:
            doc["c"] = m.content_type
        source = m.source
        if source is not None:
            if source is not last_source:
                last_source, source_doc = source, _source_doc(source)
            doc["o"] = source_doc
            if source.received_at:
                doc["p"] = _ms(source.received_at)
        out.append(pack(doc))
    return out


def encode(message: Message, stored_at: float | None = None) -> bytes:
    """The envelope of ``message``, stored at ``stored_at`` (seconds since the epoch;
    None: now)."""
    return encode_many((message,), stored_at)[0]


def _bad(what: str, value: object) -> ValueError:
    return ValueError(f"bad envelope: {what}, not {type(value).__name__}")


def _text(doc: Mapping[str, Any], key: str, what: str) -> str | None:
    """The optional string at ``key`` (None when absent)."""
    if key not in doc:
        return None
    value = doc[key]
    if type(value) is not str:
        raise _bad(f"{what} ({key!r}) must be a string", value)
    return value


def _identity(doc: object) -> PeerIdentity:
    if type(doc) is not dict:
        raise _bad("the identity ('o'.'i') must be a map", doc)
    subject = doc.get("s")
    if type(subject) is not str:
        raise _bad("the identity's subject ('s') must be a string", subject)
    sans = doc.get("n", [])
    if type(sans) is not list or any(type(s) is not str for s in sans):
        raise _bad("the identity's SANs ('n') must be an array of strings", sans)
    fingerprint = _text(doc, "f", "the identity's fingerprint") or ""
    return PeerIdentity(subject, tuple(sans), fingerprint)


def _source(doc: object, published: int | None) -> Source:
    if type(doc) is not dict:
        raise _bad("the source ('o') must be a map", doc)
    protocol = doc.get("p")
    listener = doc.get("l")
    if type(protocol) is not str or type(listener) is not str:
        bad = protocol if type(protocol) is not str else listener
        raise _bad("the source's protocol ('p') and listener ('l') must be strings", bad)
    peer = _text(doc, "a", "the source's peer") or ""
    upstream = _text(doc, "u", "the source's upstream") or ""
    identity = _identity(doc["i"]) if "i" in doc else None
    received = published / 1000 if published is not None else 0.0
    return Source(protocol, listener, peer, identity, received, upstream)


def decode(payload: bytes | memoryview, destination: str) -> Message:
    """The message an envelope holds, for ``destination``; ValueError if ``payload``
    is not a well-formed envelope this version reads."""
    return _decode(payload, destination, [None, None, None])


def decode_many(payloads: Iterable[bytes | memoryview], destination: str) -> list[Message]:
    """:func:`decode` of each payload; consecutive messages with the same source
    share one :class:`Source` object, built once."""
    memo: list[Any] = [None, None, None]
    return [_decode(payload, destination, memo) for payload in payloads]


def message_size(payload: bytes | memoryview) -> int:
    """``Message.size`` of the message an envelope holds, without building the message
    (nor its source): what sizing a stored log costs. ValueError for a payload that is
    not an envelope, as :func:`decode` says; of the optional keys only the headers
    are checked."""
    doc = _document(payload)
    return _new_message(("", doc["b"], _headers(doc), None, None)).size


def _document(payload: bytes | memoryview) -> dict[str, Any]:
    """The envelope's map, its version, body and stored time checked."""
    try:
        doc = _unpack(payload, raw=False)
    except Exception as e:  # msgpack raises ValueError subclasses, and TypeError for keys
        raise ValueError(f"bad envelope: not msgpack ({e})") from None
    if type(doc) is not dict:
        raise _bad("an envelope is a map", doc)
    version = doc.get("v")
    if type(version) is not int:
        raise _bad("the version ('v') must be an integer", version)
    if not 1 <= version <= VERSION:
        raise ValueError(f"bad envelope: version {version}, this gateway reads 1 to {VERSION}")
    body = doc.get("b")
    if type(body) is not bytes:
        raise _bad("the body ('b') must be bin", body)
    if type(doc.get("s")) is not int:
        raise _bad("the stored time ('s') must be an integer", doc.get("s"))
    return doc


def _headers(doc: dict[str, Any]) -> Mapping[str, str]:
    headers = doc.get("h", _NO_HEADERS)
    if headers is not _NO_HEADERS and (
        type(headers) is not dict
        or not all(map(isinstance, headers, repeat(str)))
        or not all(map(isinstance, headers.values(), repeat(str)))
    ):
        raise _bad("the headers ('h') must be a map of strings to strings", headers)
    return headers


def _decode(payload: bytes | memoryview, destination: str, memo: list[Any]) -> Message:
    """:func:`decode`; ``memo`` is the last ``[source map, published, Source]``."""
    doc = _document(payload)
    body = doc["b"]
    if len(doc) == 3:
        # Only the required keys: the common plain message.
        return _new_message((destination, body, _NO_HEADERS, None, None))
    published = doc.get("p")
    if published is not None and type(published) is not int:
        raise _bad("the published time ('p') must be an integer", published)
    content_type = _text(doc, "c", "the content type")
    source = None
    if "o" in doc:
        source_doc = doc["o"]
        if source_doc == memo[0] and published == memo[1]:
            source = memo[2]
        else:
            source = _source(source_doc, published)
            memo[:] = source_doc, published, source
    return _new_message((destination, body, _headers(doc), content_type, source))
