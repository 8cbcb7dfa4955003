"""The one message model every protocol maps onto.

A protocol's listener turns each frame it receives into a :class:`Message`; the
hub routes it; a subscriber (another protocol's connection, an upstream, the
store) turns it back into frames. Only bytes cross the hub: a body is never
decoded by the core, so a bridge keeps payloads byte for byte.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

__all__ = ["Message", "Outcome", "PeerIdentity", "Position", "Positions", "Reply", "Source"]

#: Bytes charged per message on top of body and headers, for buffer accounting:
#: roughly what the Python objects of one queued message cost.
MESSAGE_OVERHEAD = 200


@dataclass(frozen=True, slots=True)
class PeerIdentity:
    """Who a TLS peer proved to be with its certificate."""

    #: RFC 4514 string of the certificate subject, e.g. ``CN=beats-01,O=Example``.
    subject: str
    #: Subject alternative names as ``DNS:name``, ``IP:addr``, ``URI:…``, ``email:…``.
    sans: tuple[str, ...] = ()
    #: Hex SHA-256 of the DER certificate.
    fingerprint: str = ""

    @property
    def common_name(self) -> str | None:
        """The first CN of the subject, if any."""
        for part in self.subject.split(","):
            key, _, value = part.partition("=")
            if key.strip().upper() == "CN":
                return value.strip()
        return None


@dataclass(frozen=True, slots=True)
class Source:
    """Where a message came from: kept with it for routing, enrichment and audit."""

    protocol: str
    listener: str
    #: ``host:port`` (``[v6]:port``) or ``unix:/path``; empty when unknown.
    peer: str = ""
    identity: PeerIdentity | None = None
    #: Wall-clock receive time, seconds since the epoch.
    received_at: float = 0.0
    #: The upstream it came from, for messages a client role received (``listener`` is "").
    upstream: str = ""


_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class Message(NamedTuple):
    """One message: a destination, opaque body bytes and string headers.

    Immutable (a named tuple: cheap to create, which matters at hundreds of
    thousands of messages a second). ``headers`` must be treated as read-only
    once published: every copy a fan-out makes shares it.
    """

    destination: str
    body: bytes
    headers: Mapping[str, str] = _NO_HEADERS
    content_type: str | None = None
    source: Source | None = None

    @property
    def size(self) -> int:
        """Bytes this message is charged in bounded buffers."""
        n = len(self.body) + MESSAGE_OVERHEAD
        if self.headers:
            for key, value in self.headers.items():
                n += len(key) + len(value)
        return n


class Outcome(enum.IntEnum):
    """How a publish settled. Larger is worse; a fan-out reports the worst."""

    #: Every target delivered the message or stored it durably.
    DELIVERED = 0
    #: A target could not take it now; sending it again may succeed.
    FAILED = 1
    #: A target refused it for good (too large, not allowed, malformed).
    REJECTED = 2


class Position(NamedTuple):
    """Where a message sits in a destination that keeps an ordered log.

    ``offset`` grows with every message stored; positions are comparable within
    one destination and partition, and mean nothing across them. Plain topics
    and queues keep no log, so their deliveries have no position.
    """

    offset: int
    partition: int = 0


#: The largest partition and offset a :class:`Positions` holds: what a signed
#: 64-bit integer carries, so every protocol can carry one.
MAX_POSITION = 2**63 - 1

#: One ``PARTITION:OFFSET`` item of the text form: ASCII digits, no sign, no
#: leading zero (the form of each value is unique), at most 19 digits.
_ITEM = re.compile(r"(0|[1-9][0-9]{0,18}):(0|[1-9][0-9]{0,18})")


class Positions:
    """A position in each of several partitions of one log destination: where a
    subscription starts (or a finite read ends) in every partition it names.

    Immutable and hashable. ``offsets`` maps partition to offset, ascending by
    partition; it names at least one partition, each at most once, partitions
    and offsets ``0`` to :data:`MAX_POSITION`. A partition it does not name
    takes the subscription's default there (``"earliest"`` for a start,
    ``"latest"`` for an end), so a resume point taken before a log gained
    partitions still applies after.

    Text form (:meth:`format`, :meth:`parse`), small enough for a URL query or
    a header: ``PARTITION:OFFSET`` items joined by ``,``, ascending by
    partition, e.g. ``0:17,1:4,2:0``; decimal ASCII digits without sign or
    leading zero, no spaces. It uses only characters a URL query carries as
    they are (``,`` and ``:`` are allowed there unescaped).
    """

    __slots__ = ("_hash", "_items")

    _items: tuple[tuple[int, int], ...]
    _hash: int

    def __init__(self, offsets: Mapping[int, int]) -> None:
        items = sorted(offsets.items())
        if not items:
            raise ValueError("positions must name at least one partition")
        for partition, offset in items:
            _check_value("partition", partition)
            _check_value("offset", offset)
        object.__setattr__(self, "_items", tuple(items))
        object.__setattr__(self, "_hash", hash(self._items))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Positions is immutable")

    @classmethod
    def of(cls, positions: Iterable[Position]) -> Positions:
        """Positions from one :class:`Position` per partition (a partition twice:
        ValueError)."""
        offsets: dict[int, int] = {}
        for position in positions:
            if position.partition in offsets:
                raise ValueError(f"partition {position.partition} is named twice")
            offsets[position.partition] = position.offset
        return cls(offsets)

    @classmethod
    def parse(cls, text: str) -> Positions:
        """Read the text form (see the class docstring); anything else is a
        ValueError that says what is wrong and where."""
        if not text:
            raise ValueError("positions text is empty: expected PARTITION:OFFSET[,...]")
        offsets: dict[int, int] = {}
        previous = -1
        for i, item in enumerate(text.split(",")):
            match = _ITEM.fullmatch(item)
            if match is None:
                raise ValueError(
                    f"positions item {i} {item!r} is not PARTITION:OFFSET "
                    "(decimal digits, no sign, no leading zero, at most 19 digits)"
                )
            partition, offset = int(match[1]), int(match[2])
            if partition <= previous:
                raise ValueError(
                    f"positions item {i} {item!r}: partitions must ascend, each once "
                    f"(after partition {previous})"
                )
            previous = partition
            offsets[partition] = offset
        return cls(offsets)

    def format(self) -> str:
        """The text form, e.g. ``0:17,1:4,2:0``; :meth:`parse` reads it back."""
        return ",".join(f"{p}:{o}" for p, o in self._items)

    @property
    def offsets(self) -> Mapping[int, int]:
        """Offset by partition, ascending by partition (a read-only view)."""
        return MappingProxyType(dict(self._items))

    @property
    def partitions(self) -> tuple[int, ...]:
        """The partitions named, ascending."""
        return tuple(p for p, _ in self._items)

    def get(self, partition: int) -> Position | None:
        """The position in ``partition``, None if not named."""
        for p, offset in self._items:
            if p == partition:
                return Position(offset, p)
        return None

    def advanced(self, positions: Iterable[Position]) -> Positions:
        """These positions moved past each of ``positions`` (deliveries'): in each
        partition the greater of its offset here and the delivered offset + 1.

        Folding every delivery's position into the resume point taken when
        subscribing gives the resume point after them."""
        offsets = dict(self._items)
        for position in positions:
            after = position.offset + 1
            if offsets.get(position.partition, -1) < after:
                offsets[position.partition] = after
        return Positions(offsets)

    def __iter__(self) -> Iterator[Position]:
        """One :class:`Position` per partition named, ascending by partition."""
        return (Position(o, p) for p, o in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Positions):
            return NotImplemented
        return self._items == other._items

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Positions({self.format()!r})"

    def __str__(self) -> str:
        return self.format()


def _check_value(what: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"a {what} must be an int: {value!r}")
    if not 0 <= value <= MAX_POSITION:
        raise ValueError(f"a {what} must be 0 to {MAX_POSITION}: {value}")


@dataclass(frozen=True, slots=True)
class Reply:
    """A subscriber's answer to a delivery that asked for one (request/reply).

    ``status`` 0 is success; any other value is the service's error, numbered
    as gRPC status codes are (ttrpc and the other protocols map theirs onto
    them), with ``message`` saying why.
    """

    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=lambda: _NO_HEADERS)
    content_type: str | None = None
    status: int = 0
    message: str = ""
