"""Lumberjack v1/v2 (Beats ⇄ Logstash) for Interchange.

The sans-IO codec (:class:`ServerCodec`, :class:`ClientCodec` and the events
in :mod:`protocols.lumberjack.events`) imports no I/O library and speaks the
protocol toolkit's vocabulary (:data:`NEED_DATA`, :class:`ConnectionClosed`,
re-exported here); the wire format and its encoders are in
:mod:`protocols.lumberjack.frames`. The trio drivers that run the codec over
a stream live beside it.
"""

from gateway.sdk import NEED_DATA, ConnectionClosed

from .codec import ClientCodec, CodecState, Limits, ServerCodec
from .events import Ack, Event, Inflate, Progress, Window
from .frames import encode_ack, encode_window

__all__ = [
    "NEED_DATA",
    "Ack",
    "ClientCodec",
    "CodecState",
    "ConnectionClosed",
    "Event",
    "Inflate",
    "Limits",
    "Progress",
    "ServerCodec",
    "Window",
    "encode_ack",
    "encode_window",
]
