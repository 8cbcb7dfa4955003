"""Micromessage2 subscribe filters: the expression syntax, parsed and written, and the core filter.

A ``subscribe`` COMMAND carries ``filter=<urlencoded expression>``; this module
works on the expression once that outer layer of URL encoding is removed::

    expression = condition *(";" condition) [";"]
    condition  = name operator value
    value      = "N" integer | "D" seconds | "T" urlencoded-text

for example ``age>=N18;last-name<Tgauf``. Conditions are ANDed. The name runs
up to the first operator character, so it is URL-decoded once (a header name
outside the protocol's ``[a-z0-9-]`` field syntax is written percent-encoded);
the operator is the longest of ``<= >= != = < > & ~`` that matches there.

What each operator means depends on the value's type, and the pairs the
protocol leaves meaningless are refused rather than guessed:

====  ===================  ===========================
op    ``N`` and ``D``      ``T`` (case-sensitive)
====  ===================  ===========================
=     equal                equal
!=    not equal            not equal
<     less than            starts with
<=    less or equal        refused
>     greater than         ends with
>=    greater or equal     refused
&     refused              contains
~     refused              does not contain
====  ===================  ===========================

``N`` is a signed 64-bit decimal integer; ``D`` is seconds since the epoch
(UTC) with an optional decimal fraction, kept to the microsecond; ``T`` is
URL-encoded UTF-8, decoded once.

Evaluation belongs to the core: :func:`to_filter` maps the conditions onto the
gateway's :class:`Filter`, which reads each message header as the condition's
type. So an absent header never matches, for ``!=`` and ``~`` too; an ``N``
condition never matches a header that is not a plain number, nor a ``D``
condition one that is neither a time nor a number of seconds; a ``T``
condition compares the header's text, whatever the header held.

Pure functions, no I/O: a malformed expression from a peer raises
:class:`RemoteProtocolError` (the codec answers with an ERROR frame), a
condition we could not write raises :class:`LocalProtocolError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Final, Literal, TypeAlias
from urllib.parse import quote, unquote_to_bytes

from gateway.sdk import Filter, FilterError, LocalProtocolError, RemoteProtocolError

__all__ = [
    "OPERATORS",
    "Condition",
    "Kind",
    "decode_text",
    "encode_name",
    "encode_text",
    "format_filter",
    "parse_conditions",
    "parse_filter",
    "to_filter",
]

Kind: TypeAlias = Literal["N", "D", "T"]

#: The wire operators, longest first so that the first match is the longest.
OPERATORS: Final = ("<=", ">=", "!=", "=", "<", ">", "&", "~")

#: Wire operator -> the core's operator name, per value type; a missing pair is refused.
_NUMERIC_OPS: Final = {"=": "=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_TEXT_OPS: Final = {
    "=": "=",
    "!=": "!=",
    "<": "prefix",
    ">": "suffix",
    "&": "contains",
    "~": "!contains",
}
_CORE_OPS: Final[dict[str, dict[str, str]]] = {"N": _NUMERIC_OPS, "D": _NUMERIC_OPS, "T": _TEXT_OPS}

_OP_CHARS: Final = re.compile(r"[<>=!&~]")
_RAW_NAME: Final = re.compile(r"(?:[A-Za-z0-9._-]|%[0-9A-Fa-f]{2})+\Z")
_BAD_ESCAPE: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")
_INTEGER: Final = re.compile(r"-?[0-9]+\Z")
_SECONDS: Final = re.compile(r"-?[0-9]+(?:\.[0-9]+)?\Z")
_INT64: Final = range(-(2**63), 2**63)
#: Characters a name keeps as is when written: the protocol's field syntax.
_NAME_SAFE: Final = re.compile(r"[a-z0-9-]")

#: How much of untrusted input an error message repeats.
_ECHO = 40


@dataclass(frozen=True, slots=True)
class Condition:
    """One condition as the wire states it: ``name``, operator ``op``, typed ``value``.

    ``value`` is an ``int`` for ``N``, the exact ``Decimal`` seconds for ``D``
    and the decoded ``str`` for ``T``; ``name`` is decoded too.
    """

    name: str
    op: str
    kind: Kind
    value: int | Decimal | str


def _echo(text: str) -> str:
    return repr(text if len(text) <= _ECHO else text[: _ECHO - 3] + "...")


def decode_text(text: str, what: str) -> str:
    """``text`` with its %XX escapes decoded once, as UTF-8; ``+`` stays a plus.

    Raises :class:`RemoteProtocolError` naming ``what`` for a bad escape or bytes
    that are not UTF-8, rather than guessing what the peer meant.
    """
    if "%" not in text:
        return text
    if _BAD_ESCAPE.search(text):
        raise RemoteProtocolError(f"{what} {_echo(text)}: '%' must start a %XX escape")
    try:
        return unquote_to_bytes(text).decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError(f"{what} {_echo(text)}: escapes are not UTF-8") from None


def encode_text(text: str) -> str:
    """``text`` URL-encoded as ``T`` values are: all but ``A-Za-z0-9-._~`` as %XX of UTF-8."""
    return quote(text, safe="")


def encode_name(name: str) -> str:
    """``name`` with every character outside ``[a-z0-9-]`` written as %XX of its UTF-8."""
    return "".join(
        c if _NAME_SAFE.match(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in name
    )


def _split_condition(text: str) -> tuple[str, str, str]:
    """``text`` as (raw name, operator, raw typed value), the operator by longest match."""
    m = _OP_CHARS.search(text)
    if m is None:
        raise RemoteProtocolError(f"filter condition {_echo(text)} has no operator")
    at = m.start()
    if at == 0:
        raise RemoteProtocolError(f"filter condition {_echo(text)} has no property name")
    for op in OPERATORS:
        if text.startswith(op, at):
            return text[:at], op, text[at + len(op) :]
    raise RemoteProtocolError(
        f"filter condition {_echo(text)}: unknown operator at {_echo(text[at : at + 2])}"
    )


def _parse_value(raw: str, name: str) -> tuple[Kind, int | Decimal | str]:
    """The typed value ``raw`` (``N…``, ``D…`` or ``T…``) for the condition on ``name``."""
    kind, body = raw[:1], raw[1:]
    if kind == "N":
        if len(body) > 20 or not _INTEGER.match(body) or int(body) not in _INT64:
            raise RemoteProtocolError(
                f"filter on {name!r}: N value {_echo(body)} is not a 64-bit integer"
            )
        return "N", int(body)
    if kind == "D":
        if not _SECONDS.match(body):
            raise RemoteProtocolError(
                f"filter on {name!r}: D value {_echo(body)} is not seconds since the epoch"
            )
        return "D", Decimal(body)
    if kind == "T":
        return "T", decode_text(body, f"filter on {name!r}: T value")
    raise RemoteProtocolError(f"filter on {name!r}: value {_echo(raw)} must start with N, D or T")


def _parse_condition(text: str) -> Condition:
    raw_name, op, raw_value = _split_condition(text)
    if not _RAW_NAME.match(raw_name):
        raise RemoteProtocolError(
            f"filter property name {_echo(raw_name)}: only [A-Za-z0-9._-] and %XX escapes"
        )
    name = decode_text(raw_name, "filter property name")
    kind, value = _parse_value(raw_value, name)
    if op not in _CORE_OPS[kind]:
        raise RemoteProtocolError(f"filter on {name!r}: operator {op!r} is not defined for {kind}")
    return Condition(name, op, kind, value)


def parse_conditions(expression: str) -> tuple[Condition, ...]:
    """The conditions of ``expression`` (outer URL encoding already removed), in order.

    An empty expression has none. One trailing ``;`` is tolerated, an empty
    condition anywhere else is not. Raises :class:`RemoteProtocolError`.
    """
    if not expression:
        return ()
    parts = expression.split(";")
    if parts[-1] == "":
        parts.pop()
    out = []
    for i, part in enumerate(parts, 1):
        if not part:
            raise RemoteProtocolError(f"filter condition {i} is empty")
        out.append(_parse_condition(part))
    return tuple(out)


def _core_value(condition: Condition) -> object:
    if condition.kind == "D":
        return {"date": str(condition.value)}
    return condition.value


def to_filter(conditions: Iterable[Condition]) -> Filter:
    """The core :class:`Filter` that evaluates ``conditions`` on message headers.

    Raises :class:`RemoteProtocolError` for what the core refuses (a date out
    of range, too many conditions, an over-long name or text).
    """
    spec = [[c.name, _CORE_OPS[c.kind][c.op], _core_value(c)] for c in conditions]
    try:
        return Filter.from_json(spec)
    except (FilterError, ArithmeticError) as e:
        raise RemoteProtocolError(f"filter: {e}") from None


def parse_filter(expression: str) -> Filter:
    """The core :class:`Filter` for a subscribe command's decoded ``filter`` expression."""
    return to_filter(parse_conditions(expression))


def _format_value(condition: Condition) -> str:
    kind, value = condition.kind, condition.value
    if kind == "N" and type(value) is int and value in _INT64:
        return f"N{value}"
    if kind == "D" and isinstance(value, Decimal) and value.is_finite():
        return f"D{value:f}"
    if kind == "T" and isinstance(value, str):
        return "T" + encode_text(value)
    raise LocalProtocolError(f"filter on {condition.name!r}: {value!r} is not a {kind} value")


def format_filter(conditions: Iterable[Condition]) -> str:
    """The expression for ``conditions``, which :func:`parse_conditions` reads back equal.

    Raises :class:`LocalProtocolError` for a condition the wire cannot carry.
    """
    out = []
    for c in conditions:
        if not c.name:
            raise LocalProtocolError("a filter condition needs a property name")
        if c.kind not in _CORE_OPS or c.op not in _CORE_OPS[c.kind]:
            raise LocalProtocolError(f"filter on {c.name!r}: operator {c.op!r} with {c.kind!r}")
        try:
            out.append(encode_name(c.name) + c.op + _format_value(c))
        except UnicodeEncodeError:
            raise LocalProtocolError(f"filter on {c.name!r}: not encodable as UTF-8") from None
    return ";".join(out)
