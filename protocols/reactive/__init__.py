"""Reactive streams over the network (MessagePack framing), sans I/O.

* :mod:`.messages`: one protocol message, msgpack bytes to a frozen dataclass
  and back, and :class:`MessageReader` with its :class:`Limits`;
* :mod:`.streams`: the per-subscription state machines and the two id tables;
* :mod:`.events`: what a :class:`Connection` reports to its driver;
* :mod:`.codec`: :class:`Connection`, one class for both :class:`Role` s;
* :mod:`.api`: a trio library for Python programs (:class:`Peer`: subscribe
  with explicit demand, publish from an async iterator);
* the gateway's side: :mod:`.plugin` (listener and upstream), :mod:`.peer`
  with :mod:`.outgoing` and :mod:`.incoming` (the two sides of a connection).

``docs/protocols/reactive-streams.md`` describes the wire format and semantics.
"""

import importlib
from typing import TYPE_CHECKING, Any

from gateway.sdk import NEED_DATA, CodecState, ConnectionClosed

from .codec import (
    KEEPALIVE,
    NON_POSITIVE_REQUEST,
    VERSION,
    Connection,
    Phase,
    Role,
    UnsupportedVersion,
    goodbye_reason,
)
from .events import (
    Accepted,
    BadRequest,
    Cancelled,
    Completed,
    DemandAdded,
    Elements,
    Event,
    Failed,
    GoodbyeAnswered,
    GoodbyeReceived,
    Hello,
    Pinged,
    Ponged,
    Skipped,
    SubscribeRequested,
)
from .messages import (
    MAX_DEMAND,
    Cancel,
    ClientHello,
    Goodbye,
    GoodbyeAck,
    Limits,
    Message,
    OnComplete,
    OnError,
    OnNext,
    OnNextLastPart,
    OnNextPacked,
    OnNextPart,
    Ping,
    Pong,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
)

__all__ = [
    "FLUSH_TIMEOUT",
    "KEEPALIVE",
    "MAX_DEMAND",
    "NEED_DATA",
    "NON_POSITIVE_REQUEST",
    "PART_SIZE",
    "VERSION",
    "Accepted",
    "BadRequest",
    "Cancel",
    "Cancelled",
    "ClientHello",
    "CodecState",
    "Completed",
    "Connection",
    "ConnectionClosed",
    "ConnectionLost",
    "DemandAdded",
    "Elements",
    "Ending",
    "Event",
    "Failed",
    "Goodbye",
    "GoodbyeAck",
    "GoodbyeAnswered",
    "GoodbyeReceived",
    "Hello",
    "Limits",
    "Message",
    "OnComplete",
    "OnError",
    "OnNext",
    "OnNextLastPart",
    "OnNextPacked",
    "OnNextPart",
    "Peer",
    "Phase",
    "Ping",
    "Pinged",
    "Pong",
    "Ponged",
    "PublisherError",
    "Request",
    "Role",
    "ServerHello",
    "Skipped",
    "Subscribe",
    "SubscribeRequested",
    "Subscribed",
    "Subscription",
    "UnsupportedVersion",
    "goodbye_reason",
    "serve_tcp",
]

if TYPE_CHECKING:
    from .api import (
        FLUSH_TIMEOUT,
        PART_SIZE,
        ConnectionLost,
        Ending,
        Peer,
        PublisherError,
        Subscription,
        serve_tcp,
    )

#: The library's names (:mod:`.api`, on trio), imported on first use: the sans-IO
#: modules of this package (the codec) must import without trio.
_LIBRARY = frozenset(
    {
        "FLUSH_TIMEOUT",
        "PART_SIZE",
        "ConnectionLost",
        "Ending",
        "Peer",
        "PublisherError",
        "Subscription",
        "serve_tcp",
    }
)


def __getattr__(name: str) -> Any:
    if name in _LIBRARY:
        return getattr(importlib.import_module(".api", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
