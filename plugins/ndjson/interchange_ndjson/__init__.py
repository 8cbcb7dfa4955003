"""Newline-delimited JSON for Interchange: a sans-IO codec and its trio driver.

The codec (:class:`NdjsonConnection` and the events in
:mod:`interchange_ndjson.events`) imports no I/O library; its ``NEED_DATA``
and ``ConnectionClosed`` are those of :mod:`gateway.protocol`, shared by every
protocol. The plugin in :mod:`interchange_ndjson.plugin` drives it over a
stream for the gateway as :class:`gateway.protocol.Session` subclasses.
"""

from .codec import CLIENT, NEED_DATA, SERVER, NdjsonConnection
from .events import (
    Ack,
    Call,
    ConnectionClosed,
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
    "CLIENT",
    "NEED_DATA",
    "SERVER",
    "Ack",
    "Call",
    "ConnectionClosed",
    "Credit",
    "Deliver",
    "End",
    "Error",
    "Event",
    "ItemResult",
    "Nack",
    "NdjsonConnection",
    "Ping",
    "Pong",
    "Publish",
    "PublishMany",
    "Published",
    "Replied",
    "ReplyTo",
    "Subscribe",
    "Unsubscribe",
]
