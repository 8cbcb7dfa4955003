"""Subscription filters: which messages a subscriber wants, judged by their headers.

A filter is data, not syntax: a :class:`Filter` is the AND of
:class:`Condition` objects, each comparing one header with one value. Every
wire protocol compiles its own filter syntax to this form (the ndjson
protocol's ``"filter"`` key carries the JSON form of :meth:`Filter.from_json`),
and the topic evaluates it where it stores a message, so a subscriber never
receives, and never holds buffer space for, a message it would discard.

The condition's value decides how a header's string is read:

* a number (``int`` or ``float``): the header must be a plain decimal number
  (``-12``, ``0.5``, ``1e3``; no whitespace, ``+``, hex, underscores, NaN or
  infinity) and is compared numerically;
* a ``datetime``: the header must be ISO 8601 (a trailing ``Z`` and naive
  times, read as UTC, included) or a plain decimal number of seconds since the
  epoch, and is compared as an instant;
* a string: the header is compared as is, case-sensitively, in code-point order.

A header that is absent, or that cannot be read as the value's type, fails
every condition on it, ``!=`` and ``!contains`` included, as NULL does in SQL:
a filter ``size != 0`` asks for messages that have a size, and it is not zero.

Filters run for every stored message, so each condition compiles, once, to a
closure that does no more than read the header, parse it and compare.
"""

from __future__ import annotations

import enum
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from math import isfinite
from typing import Any

from gateway.core.model import Message

__all__ = ["Condition", "Filter", "FilterError", "Op"]

#: Limits that keep one subscription's filter from costing more per message
#: than the message itself.
MAX_CONDITIONS = 64
MAX_KEY_LENGTH = 256
MAX_STRING_LENGTH = 4096

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# ASCII digits only: ``\d`` would also accept other scripts' digits.
_NUMBER = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?\Z")

Predicate = Callable[[Mapping[str, str]], bool]


class FilterError(ValueError):
    """A filter that can never be valid: a bad operator for its value, a
    malformed JSON form, or one too big to evaluate per message."""


class Op(enum.Enum):
    """How a condition compares a header with its value."""

    EQ = "="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    PREFIX = "prefix"
    SUFFIX = "suffix"
    CONTAINS = "contains"
    NOT_CONTAINS = "!contains"


_COMPARE: dict[Op, Callable[[Any, Any], bool]] = {
    Op.EQ: operator.eq,
    Op.NE: operator.ne,
    Op.LT: operator.lt,
    Op.LE: operator.le,
    Op.GT: operator.gt,
    Op.GE: operator.ge,
}

#: Operators only strings have.
_TEXT_OPS = frozenset({Op.PREFIX, Op.SUFFIX, Op.CONTAINS, Op.NOT_CONTAINS})


def _read_epoch(text: str) -> int | Decimal | None:
    """``text`` as exact seconds since the epoch, or None when not a plain number."""
    m = _NUMBER.match(text)
    if m is None:
        return None
    if m.lastindex is None:
        try:
            return int(text)
        except ValueError:
            return Decimal(text)
    return Decimal(text)


def _read_iso(text: str) -> datetime | None:
    """``text`` as an aware ISO 8601 time (naive is UTC), or None."""
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


def _epoch_seconds(dt: datetime) -> Decimal:
    """The exact seconds since the epoch of an aware ``dt``."""
    delta = dt - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return Decimal(f"{micros}E-6")


def _compile(key: str, op: Op, value: int | float | str | datetime) -> Predicate:
    """The predicate one condition runs per message."""
    if isinstance(value, str):
        return _compile_text(key, op, value)
    cmp = _COMPARE[op]
    if isinstance(value, datetime):
        return _compile_date(key, cmp, value)

    match = _NUMBER.match

    def number(headers: Mapping[str, str]) -> bool:
        # Integers stay int so that large ones compare exactly; a fraction or an
        # exponent reads as the nearest float, so a header "0.1" equals 0.1.
        text = headers.get(key)
        if text is None:
            return False
        m = match(text)
        if m is None:
            return False
        if m.lastindex is None:
            try:
                return cmp(int(text), value)
            except ValueError:  # More digits than int() converts: still a number.
                pass
        return cmp(float(text), value)

    return number


def _compile_text(key: str, op: Op, value: str) -> Predicate:
    if op is Op.EQ:
        return lambda headers: headers.get(key) == value
    if op is Op.PREFIX:

        def prefix(headers: Mapping[str, str]) -> bool:
            text = headers.get(key)
            return text is not None and text.startswith(value)

        return prefix
    if op is Op.SUFFIX:

        def suffix(headers: Mapping[str, str]) -> bool:
            text = headers.get(key)
            return text is not None and text.endswith(value)

        return suffix
    if op is Op.CONTAINS:

        def contains(headers: Mapping[str, str]) -> bool:
            text = headers.get(key)
            return text is not None and value in text

        return contains
    if op is Op.NOT_CONTAINS:

        def not_contains(headers: Mapping[str, str]) -> bool:
            text = headers.get(key)
            return text is not None and value not in text

        return not_contains
    cmp = _COMPARE[op]

    def compare(headers: Mapping[str, str]) -> bool:
        text = headers.get(key)
        return text is not None and cmp(text, value)

    return compare


def _compile_date(key: str, cmp: Callable[[Any, Any], bool], value: datetime) -> Predicate:
    seconds = _epoch_seconds(value)

    def date(headers: Mapping[str, str]) -> bool:
        text = headers.get(key)
        if text is None:
            return False
        epoch = _read_epoch(text)
        if epoch is not None:
            return cmp(epoch, seconds)
        dt = _read_iso(text)
        return dt is not None and cmp(dt, value)

    return date


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _brief(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut short: error messages echo untrusted input."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, slots=True)
class Condition:
    """One header compared with one value; the value's type says how to read the header."""

    key: str
    op: Op
    value: int | float | str | datetime
    _match: Predicate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key, op, value = self.key, self.op, self.value
        if not isinstance(key, str) or not key:
            raise FilterError(f"a header name must be a non-empty string, not {_brief(key)}")
        if len(key) > MAX_KEY_LENGTH:
            raise FilterError(f"header name longer than {MAX_KEY_LENGTH} characters")
        if not isinstance(op, Op):
            raise FilterError(f"unknown operator {_brief(op)}")
        if isinstance(value, bool) or not isinstance(value, int | float | str | datetime):
            raise FilterError(
                f"{key!r}: a value must be a string, a number or a datetime, "
                f"not {_type_name(value)}"
            )
        if isinstance(value, str):
            if len(value) > MAX_STRING_LENGTH:
                raise FilterError(f"{key!r}: value longer than {MAX_STRING_LENGTH} characters")
        elif op in _TEXT_OPS:
            raise FilterError(
                f"{key!r}: operator {op.value!r} needs a string value, not {_type_name(value)}"
            )
        if isinstance(value, float) and not isfinite(value):
            raise FilterError(f"{key!r}: a number must be finite, not {value!r}")
        if isinstance(value, datetime) and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
            object.__setattr__(self, "value", value)
        object.__setattr__(self, "_match", _compile(key, op, value))

    def __reduce__(self) -> tuple[Any, ...]:
        # The compiled predicate is a closure, which pickle cannot carry.
        return (Condition, (self.key, self.op, self.value))

    def matches(self, headers: Mapping[str, str]) -> bool:
        """True when ``headers`` has this header, readable as the value's type, and it compares."""
        return self._match(headers)

    def __str__(self) -> str:
        return f"{_show_key(self.key)} {self.op.value} {_show_value(self.value)}"


_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_WORDS = frozenset({"and", "true", "date"} | {op.value for op in Op})


def _show_key(key: str) -> str:
    if _BARE_KEY.match(key) and key not in _WORDS:
        return key
    return json.dumps(key, ensure_ascii=False)


def _show_value(value: int | float | str | datetime) -> str:
    if isinstance(value, datetime):
        return f"date({json.dumps(value.isoformat())})"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def _match_all(predicates: tuple[Predicate, ...]) -> Predicate:
    """The AND of ``predicates``, with no call overhead for the common small cases."""
    if not predicates:
        return lambda headers: True
    if len(predicates) == 1:
        return predicates[0]
    if len(predicates) == 2:
        first, second = predicates
        return lambda headers: first(headers) and second(headers)

    def every(headers: Mapping[str, str]) -> bool:
        # A plain loop: all() over a generator costs a frame per message.
        for predicate in predicates:  # noqa: SIM110
            if not predicate(headers):
                return False
        return True

    return every


@dataclass(frozen=True, slots=True)
class Filter:
    """The AND of its conditions: what a subscription asks of a message's headers.

    ``Filter()`` has no conditions and matches every message, one without
    headers included.
    """

    conditions: tuple[Condition, ...] = ()
    _match: Predicate = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        conditions = self.conditions
        if not isinstance(conditions, tuple):
            if not isinstance(conditions, list):
                raise FilterError(
                    f"conditions must be a tuple of Condition, not {_type_name(conditions)}"
                )
            conditions = tuple(conditions)
            object.__setattr__(self, "conditions", conditions)
        if len(conditions) > MAX_CONDITIONS:
            raise FilterError(
                f"{len(conditions)} conditions; a filter has at most {MAX_CONDITIONS}"
            )
        for i, condition in enumerate(conditions, 1):
            if not isinstance(condition, Condition):
                raise FilterError(
                    f"condition {i}: expected a Condition, not {_type_name(condition)}"
                )
        object.__setattr__(self, "_match", _match_all(tuple(c._match for c in conditions)))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Filter, (self.conditions,))

    def matches(self, headers: Mapping[str, str]) -> bool:
        """True when every condition holds for ``headers``."""
        return self._match(headers)

    def select(self, messages: Sequence[Message]) -> list[int]:
        """Indices, in order, of the messages whose headers match."""
        if not self.conditions:
            return list(range(len(messages)))
        match = self._match
        return [i for i, message in enumerate(messages) if match(message.headers)]

    @classmethod
    def equals(cls, **headers: str) -> Filter:
        """A filter that asks for each header to equal the given string."""
        for key, value in headers.items():
            if not isinstance(value, str):
                raise FilterError(f"{key!r}: expected a string, not {_type_name(value)}")
        return cls(tuple(Condition(key, Op.EQ, value) for key, value in headers.items()))

    @classmethod
    def from_json(cls, obj: Any) -> Filter:
        """The filter a decoded JSON value describes.

        An object is shorthand for equality, ``{"level": "error", "code": 500}``;
        an array lists ``[key, op, value]`` conditions, a value being a string,
        a number or ``{"date": ISO 8601 string or epoch seconds}``. Raises
        :class:`FilterError` naming the condition (counted from 1) at fault.
        """
        if isinstance(obj, dict):
            if len(obj) > MAX_CONDITIONS:
                raise FilterError(f"{len(obj)} conditions; a filter has at most {MAX_CONDITIONS}")
            out = []
            for key, value in obj.items():
                if isinstance(value, bool) or not isinstance(value, str | int | float):
                    raise FilterError(
                        f"key {_brief(key)}: a shorthand value must be a string or a number, "
                        f"not {_type_name(value)}"
                    )
                try:
                    out.append(Condition(key, Op.EQ, value))
                except FilterError as e:
                    raise FilterError(f"key {_brief(key)}: {e}") from None
            return cls(tuple(out))
        if isinstance(obj, list | tuple):
            if len(obj) > MAX_CONDITIONS:
                raise FilterError(f"{len(obj)} conditions; a filter has at most {MAX_CONDITIONS}")
            conditions = []
            for i, item in enumerate(obj, 1):
                try:
                    conditions.append(_condition_from_json(item))
                except FilterError as e:
                    raise FilterError(f"condition {i}: {e}") from None
            return cls(tuple(conditions))
        raise FilterError(
            f"a filter must be an object or an array of conditions, not {_type_name(obj)}"
        )

    def to_json(self) -> list[list[Any]]:
        """The array form, which :meth:`from_json` reads back to an equal filter."""
        out: list[list[Any]] = []
        for c in self.conditions:
            value: Any = {"date": c.value.isoformat()} if isinstance(c.value, datetime) else c.value
            out.append([c.key, c.op.value, value])
        return out

    def __str__(self) -> str:
        if not self.conditions:
            return "true"
        return " and ".join(str(c) for c in self.conditions)


def _condition_from_json(item: Any) -> Condition:
    if not isinstance(item, list | tuple) or len(item) != 3:
        what = (
            f"an array of {len(item)} items" if isinstance(item, list | tuple) else _type_name(item)
        )
        raise FilterError(f"expected [key, op, value], not {what}")
    key, op_name, raw = item
    if not isinstance(key, str):
        raise FilterError(f"the key must be a string, not {_type_name(key)}")
    if not isinstance(op_name, str):
        raise FilterError(f"the operator must be a string, not {_type_name(op_name)}")
    try:
        op = Op(op_name)
    except ValueError:
        known = ", ".join(repr(o.value) for o in Op)
        raise FilterError(f"unknown operator {_brief(op_name)}; use one of {known}") from None
    value: int | float | str | datetime
    if isinstance(raw, dict):
        value = _date_from_json(raw)
    elif isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise FilterError(
            f'a value must be a string, a number or {{"date": ...}}, not {_type_name(raw)}'
        )
    else:
        value = raw
    return Condition(key, op, value)


def _date_from_json(raw: dict[Any, Any]) -> datetime:
    if set(raw) != {"date"}:
        keys = ", ".join(_brief(k, 20) for k in list(raw)[:4]) + (", ..." if len(raw) > 4 else "")
        raise FilterError(f'an object value must be {{"date": ...}}, not one with keys {keys}')
    original = when = raw["date"]
    if isinstance(when, str):
        seconds = _read_epoch(when)
        if seconds is None:
            dt = _read_iso(when)
            if dt is None:
                raise FilterError(
                    f"date {_brief(when)} is neither ISO 8601 nor seconds since the epoch"
                )
            return dt
        when = seconds
    elif isinstance(when, bool) or not isinstance(when, int | float):
        raise FilterError(
            f"a date must be an ISO 8601 string or seconds since the epoch, not {_type_name(when)}"
        )
    if isinstance(when, float) and not isfinite(when):
        raise FilterError(f"date {when!r} is not a finite number")
    try:
        if isinstance(when, Decimal):
            return _EPOCH + timedelta(microseconds=int(when.scaleb(6).to_integral_value()))
        return _EPOCH + timedelta(seconds=when)
    except (OverflowError, ValueError, ArithmeticError):
        raise FilterError(f"date {_brief(original)} is out of range") from None
