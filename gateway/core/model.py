"""The one message model every protocol maps onto.

A protocol's listener turns each frame it receives into a :class:`Message`; the
hub routes it; a subscriber (another protocol's connection, an upstream, the
store) turns it back into frames. Only bytes cross the hub: a body is never
decoded by the core, so a bridge keeps payloads byte for byte.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

__all__ = ["Message", "Outcome", "PeerIdentity", "Position", "Reply", "Source"]

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
