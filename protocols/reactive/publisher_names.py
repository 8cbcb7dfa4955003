"""What a remote ``subscribe(publisher, …)`` asks for, and whether a listener exposes it.

The protocol leaves the publisher string opaque. The gateway reads it as a
destination name with an optional query, URL-style::

    NAME
    NAME?group=G&from=earliest|latest|OFFSET|POSITIONS&to=latest|OFFSET|POSITIONS&filter=JSON

* ``group``: a named, resumable group (absent: a group of one);
* ``from``: where a new group starts reading a log (absent: the destination's
  default, ``latest``); ``to``: the exclusive end of a finite read, after which
  the stream completes (``onComplete``). An offset applies to every partition;
  POSITIONS names one per partition, ``0:17,1:4`` (the core's ``Positions``
  text form), which is what a subscriber that reconnects to a partitioned
  destination resumes from;
* ``filter``: a JSON filter as the core reads it (an object of header
  equalities, or a list of ``[key, op, value]`` conditions).

The name and each value are percent-decoded (``%3F`` for a ``?`` in a name).
A key may appear once; unknown keys are refused, so a typo is an ``onError``
rather than a silently different stream. Which names a listener serves is its
``publishers`` option: shell-style globs (``["logs", "metrics/*"]``); a name no
glob matches is refused, so a peer cannot create destinations by subscribing.

Pure functions: no I/O, no trio.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Literal
from urllib.parse import unquote

from gateway.sdk import Filter, FilterError, Positions

__all__ = ["PublisherName", "exposed", "parse_publisher"]

#: The keys a publisher query may have.
KEYS = frozenset({"group", "from", "to", "filter"})
#: The longest publisher string read (longer ones are refused before parsing).
MAX_NAME = 64 * 1024


@dataclass(frozen=True, slots=True)
class PublisherName:
    """A parsed publisher string: what to pass to ``hub.subscribe``."""

    destination: str
    group: str | None = None
    start: Literal["earliest", "latest"] | int | Positions | None = None
    end: Literal["latest"] | int | Positions | None = None
    filter: Filter | None = None


def parse_publisher(text: str) -> PublisherName:
    """``text`` as :class:`PublisherName`; ValueError naming what is wrong (the
    reason a refusing ``onError`` carries)."""
    if len(text) > MAX_NAME:
        raise ValueError(f"publisher name of {len(text)} characters; at most {MAX_NAME}")
    raw_name, _, query = text.partition("?")
    destination = unquote(raw_name, errors="strict")
    if not destination:
        raise ValueError("publisher name has no destination")
    fields = _query(query) if query else {}
    return PublisherName(
        destination,
        group=_group(fields.get("group")),
        start=_start(fields.get("from")),
        end=_end(fields.get("to")),
        filter=_filter(fields.get("filter")),
    )


def exposed(destination: str, publishers: Sequence[str]) -> bool:
    """Whether a listener whose ``publishers`` globs are ``publishers`` serves
    ``destination`` (case-sensitive, ``*`` and ``?`` and ``[…]`` as in the shell)."""
    return any(fnmatchcase(destination, pattern) for pattern in publishers)


def _query(query: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in query.split("&"):
        key, sep, value = part.partition("=")
        key = unquote(key, errors="strict")
        if not sep:
            raise ValueError(f"publisher query part {part!r} has no '='")
        if key not in KEYS:
            raise ValueError(
                f"unknown publisher query key {key!r} (known: {', '.join(sorted(KEYS))})"
            )
        if key in fields:
            raise ValueError(f"publisher query key {key!r} given twice")
        fields[key] = unquote(value, errors="strict")
    return fields


def _group(value: str | None) -> str | None:
    if value is None:
        return None
    if not value:
        raise ValueError("group must not be empty")
    return value


def _offset(value: str, key: str, words: str) -> int | Positions:
    if ":" in value:
        try:
            return Positions.parse(value)
        except ValueError as e:
            raise ValueError(f"{key}: {e}") from None
    if not value.isascii() or not value.isdigit():
        raise ValueError(
            f"{key} must be {words}, an offset (digits) or positions (0:17,1:4), not {value!r}"
        )
    return int(value)


def _start(value: str | None) -> Literal["earliest", "latest"] | int | Positions | None:
    if value is None:
        return None
    if value == "earliest":
        return "earliest"
    if value == "latest":
        return "latest"
    return _offset(value, "from", "earliest, latest")


def _end(value: str | None) -> Literal["latest"] | int | Positions | None:
    if value is None:
        return None
    if value == "latest":
        return "latest"
    return _offset(value, "to", "latest")


def _filter(value: str | None) -> Filter | None:
    if value is None:
        return None
    try:
        return Filter.from_json(json.loads(value))
    except json.JSONDecodeError as e:
        raise ValueError(f"filter is not JSON: {e.msg} at character {e.pos}") from None
    except FilterError as e:
        raise ValueError(f"filter: {e}") from None
