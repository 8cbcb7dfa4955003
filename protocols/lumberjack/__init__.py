"""Lumberjack v1/v2 (Beats ⇄ Logstash) for Interchange.

The sans-IO codec (:class:`ServerCodec`, :class:`ClientCodec` and the events
in :mod:`protocols.lumberjack.events`) imports no I/O library; the wire
format and its encoders are in :mod:`protocols.lumberjack.frames`. The trio
drivers that run the codec over a stream live beside it.
"""

from .codec import NEED_DATA, ClientCodec, Limits, ServerCodec, State
from .events import Ack, ConnectionClosed, Event, Window
from .frames import encode_ack, encode_window

__all__ = [
    "NEED_DATA",
    "Ack",
    "ClientCodec",
    "ConnectionClosed",
    "Event",
    "Limits",
    "ServerCodec",
    "State",
    "Window",
    "encode_ack",
    "encode_window",
]
