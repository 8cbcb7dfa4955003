"""Newline-delimited JSON for Interchange: a sans-IO codec and its trio driver.

The codecs (:class:`ServerCodec`, :class:`ClientCodec` and the events in
:mod:`interchange_ndjson.events`; lines to events and back in
:mod:`interchange_ndjson.frames`) import no I/O library; their ``NEED_DATA``,
``ConnectionClosed`` and ``CodecState`` are those of :mod:`gateway.protocol`,
shared by every protocol. The plugin in :mod:`interchange_ndjson.plugin` drives it over a
stream for the gateway as :class:`gateway.sdk.Session` subclasses.
"""

from .codec import CLIENT, NEED_DATA, SERVER, ClientCodec, CodecState, ServerCodec
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
    "ClientCodec",
    "CodecState",
    "ConnectionClosed",
    "Credit",
    "Deliver",
    "End",
    "Error",
    "Event",
    "ItemResult",
    "Nack",
    "Ping",
    "Pong",
    "Publish",
    "PublishMany",
    "Published",
    "Replied",
    "ReplyTo",
    "ServerCodec",
    "Subscribe",
    "Unsubscribe",
]
