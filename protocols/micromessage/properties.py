"""Micromessage2 MESSAGE properties as gateway headers, and headers as properties.

A MESSAGE frame carries its properties as ASCII ``name:value;`` pairs, each
value typed by its first character: ``N`` a signed 64-bit integer, ``D``
seconds since the epoch (UTC, an optional decimal fraction), ``T`` URL-encoded
UTF-8 text. The gateway's messages carry string headers, and its filters read
a header as a number or a time when the filter's value is one. So the types
are written into the header's text:

* ``N42`` becomes ``"42"``, which number filters compare as a number;
* ``D1413198000.25`` becomes ``"2014-10-13T11:00:00.250000Z"`` (ISO 8601,
  UTC, microseconds), which date filters compare as a time and number filters
  never match;
* ``THello%20world`` becomes ``"Hello world"``.

The way back, for messages another protocol published: a header whose text is
a canonical integer in the 64-bit range (no sign but ``-``, no leading zero)
is written ``N``; one in exactly the ISO form above is written ``D``; anything
else is ``T`` text. Header text survives the trip unchanged either way; only a
``T`` property whose text looks like a number or such a time comes back as
``N`` or ``D``.

Names: a header name is written with every character outside the protocol's
field syntax ``[a-z0-9-]`` as ``%XX`` of its UTF-8 (``X-Level`` becomes
``%58-%4Cevel``), and a received name is URL-decoded; ``_``, capitals and
``.`` are accepted raw from peers that write them.

A value without a type prefix is refused unless ``untyped_as_text`` is set
(SharpMessaging writes plain URL-escaped values): then such a value, or an
``N``/``D`` one that does not parse, is taken as text, whole.

Pure functions, no I/O: bad properties from a peer raise
:class:`RemoteProtocolError`, headers we cannot write raise
:class:`LocalProtocolError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Final

from gateway.sdk import LocalProtocolError, RemoteProtocolError
from protocols.micromessage.filters import decode_text, encode_name, encode_text

__all__ = [
    "format_properties",
    "header_to_value",
    "parse_properties",
    "value_to_header",
]

_EPOCH: Final = datetime(1970, 1, 1, tzinfo=UTC)
_RAW_NAME: Final = re.compile(r"(?:[A-Za-z0-9._-]|%[0-9A-Fa-f]{2})+\Z")
_INTEGER: Final = re.compile(r"-?[0-9]{1,19}\Z")
_CANONICAL_INTEGER: Final = re.compile(r"(?:0|-?[1-9][0-9]{0,18})\Z")
_SECONDS: Final = re.compile(r"-?[0-9]+(?:\.[0-9]+)?\Z")
_ISO_UTC: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{6})?Z\Z"
)
_INT64: Final = range(-(2**63), 2**63)
_ECHO = 40


def _echo(text: str) -> str:
    return repr(text if len(text) <= _ECHO else text[: _ECHO - 3] + "...")


def _iso(micros: int) -> str | None:
    """Microseconds since the epoch as the canonical ISO text, or None out of range."""
    try:
        dt = _EPOCH + timedelta(microseconds=micros)
    except OverflowError:
        return None
    return dt.isoformat().removesuffix("+00:00") + "Z"


def _typed(kind: str, body: str) -> str | None:
    """The header text of an ``N`` or ``D`` value, or None when ``body`` does not parse."""
    if kind == "N":
        if _INTEGER.match(body) and int(body) in _INT64:
            return str(int(body))
        return None
    if _SECONDS.match(body):
        return _iso(int(Decimal(body).scaleb(6).to_integral_value()))
    return None


def value_to_header(value: str, name: str, *, untyped_as_text: bool = False) -> str:
    """The header text of the typed property ``value`` on ``name``.

    Raises :class:`RemoteProtocolError` for a malformed value, unless
    ``untyped_as_text`` lets it stand as (URL-decoded) text.
    """
    kind, body = value[:1], value[1:]
    if kind == "T":
        return decode_text(body, f"property {name!r}: T value")
    if kind in ("N", "D"):
        text = _typed(kind, body)
        if text is not None:
            return text
        if not untyped_as_text:
            what = "a 64-bit integer" if kind == "N" else "seconds since the epoch in range"
            raise RemoteProtocolError(
                f"property {name!r}: {kind} value {_echo(body)} is not {what}"
            )
    elif not untyped_as_text:
        raise RemoteProtocolError(
            f"property {name!r}: value {_echo(value)} must start with N, D or T"
        )
    return decode_text(value, f"property {name!r}: value")


def _seconds(iso: str) -> str | None:
    """The ``D`` body for canonical ISO text ``iso``, or None when it is not one."""
    try:
        dt = datetime.fromisoformat(iso)
    except ValueError:
        return None
    delta = dt - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if _iso(micros) != iso:
        return None
    text = f"{Decimal(micros).scaleb(-6):f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def header_to_value(text: str) -> str:
    """The typed property value (``N…``, ``D…`` or ``T…``) that writes header ``text``."""
    if _CANONICAL_INTEGER.match(text) and int(text) in _INT64:
        return "N" + text
    if _ISO_UTC.match(text):
        seconds = _seconds(text)
        if seconds is not None:
            return "D" + seconds
    return "T" + encode_text(text)


def _parse_pair(pair: str, untyped_as_text: bool) -> tuple[str, str]:
    raw_name, colon, value = pair.partition(":")
    if not colon:
        raise RemoteProtocolError(f"property {_echo(pair)} has no ':'")
    if not _RAW_NAME.match(raw_name):
        raise RemoteProtocolError(
            f"property name {_echo(raw_name)}: only [A-Za-z0-9._-] and %XX escapes"
        )
    name = decode_text(raw_name, "property name")
    return name, value_to_header(value, name, untyped_as_text=untyped_as_text)


def parse_properties(text: str, *, untyped_as_text: bool = False) -> dict[str, str]:
    """The headers a MESSAGE frame's ``name:value;`` property list stands for.

    The final ``;`` may be missing; an empty pair elsewhere, a pair without
    ``:``, a name given twice or a bad value raises :class:`RemoteProtocolError`.
    """
    pairs = text.split(";")
    if pairs[-1] == "":
        pairs.pop()
    headers: dict[str, str] = {}
    for i, pair in enumerate(pairs, 1):
        if not pair:
            raise RemoteProtocolError(f"property {i} is empty")
        name, value = _parse_pair(pair, untyped_as_text)
        if name in headers:
            raise RemoteProtocolError(f"property {name!r} is given twice")
        headers[name] = value
    return headers


def format_properties(headers: Mapping[str, str]) -> str:
    """The ASCII property list for ``headers``, each pair ending in ``;``.

    :func:`parse_properties` reads it back to equal headers. Raises
    :class:`LocalProtocolError` for an empty name or text that is not UTF-8.
    """
    out = []
    for name, text in headers.items():
        if not name:
            raise LocalProtocolError("a property needs a name")
        try:
            out.append(f"{encode_name(name)}:{header_to_value(text)};")
        except UnicodeEncodeError:
            raise LocalProtocolError(f"property {name!r}: not encodable as UTF-8") from None
    return "".join(out)
