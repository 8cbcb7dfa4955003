"""The one import surface for protocol plugins.

A protocol (the built-in ones in ``protocols/``, the bundled ``plugins/``, a
third party's package) imports from here and nowhere else in ``gateway``: the
modules behind these names are the gateway's own business and may move.

Every name is loaded on first use (PEP 562), so importing this module imports
neither trio nor a socket: a sans-IO codec imports its vocabulary (``NEED_DATA``,
``ConnectionClosed``, ``ReceiveBuffer``, the protocol errors) from here and
stays free of I/O, while its driver imports ``Session`` from the same place.

The names, by what they are for:

* the model: ``Message``, ``Source``, ``PeerIdentity``, ``Outcome``,
  ``Position``, ``Positions`` (one in every partition), ``Reply``,
  ``Receipt``, and ``Reason``, the code of a failed receipt
  (``receipt.reason_code``), for a protocol that maps failures to its own error
  codes;
* the hub as a protocol sees it: ``HubFacade``, ``Subscription``,
  ``Delivery``, ``StartAt``, ``StopAt``, ``EndOfStream``, ``Filter``,
  ``FilterError``;
* a codec's vocabulary: ``NEED_DATA``, ``NeedData``, ``ConnectionClosed``,
  ``ReceiveBuffer``, ``ProtocolError``, ``RemoteProtocolError``,
  ``LocalProtocolError``, ``StorageFull``, ``first_leaf``;
* a codec's lifecycle and its conformance suite (see ``docs/codecs.md``):
  ``Lifecycle``, ``CodecState``, ``WrongState``; ``CodecCase``, ``Golden``,
  ``conformance`` (the checks), ``splits``;
* a driver's toolkit: ``Session``, ``NotKept``;
* the subscriber toolkit (pumps, peer tags, acks back to the hub):
  ``Subscriber``, ``Feed``, ``FeedStop``, ``Demand``, ``MAX_DEMAND``,
  ``SerialSpace``, ``UnknownTag``, ``NotACall``;
* the plugin interface: ``ProtocolPlugin``, ``PluginEnv``, ``PluginError``,
  ``ServerConnection``, ``ConnectionInfo``, ``ListenerSettings``,
  ``Upstream``, ``UpstreamContext``, ``Backoff``, ``Option``, ``REQUIRED``,
  ``describe_error``, ``Metrics``, ``Count``, ``Observe``, ``NOTHING``;
* transports a client dials with: ``TcpTransport``, ``tcp_transport``,
  ``UnixTransport``, ``unix_transport``, ``peer_credentials``,
  ``address_host``, ``identity_from_der``, ``start_tls`` (a client's TLS
  handshake over a stream it opened);
* the interface of a transport plugin (entry-point group
  ``interchange.transports``): ``Transport``, ``StreamLayer``, ``TlsLayer``;
* the storage engine, for a protocol that speaks it natively (segment
  append): ``Store``, ``Segment``, ``SegmentTruncated``, ``SegmentDamaged``,
  ``RecordFormat``, and ``envelope``, how the hub's messages are stored.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.core.destination import Delivery, EndOfStream, StartAt, StopAt, Subscription
    from gateway.core.errors import (
        LocalProtocolError,
        ProtocolError,
        RemoteProtocolError,
        StorageFull,
        first_leaf,
    )
    from gateway.core.facade import HubFacade
    from gateway.core.filters import Filter, FilterError
    from gateway.core.model import (
        Message,
        Outcome,
        PeerIdentity,
        Position,
        Positions,
        Reply,
        Source,
    )
    from gateway.core.reasons import Reason
    from gateway.core.receipts import Receipt
    from gateway.durable import envelope
    from gateway.ops.metrics import Metrics
    from gateway.protocol import conformance
    from gateway.protocol.buffer import ReceiveBuffer
    from gateway.protocol.conformance import CodecCase, Golden, splits
    from gateway.protocol.counts import NOTHING, Count, Observe
    from gateway.protocol.events import NEED_DATA, ConnectionClosed, NeedData
    from gateway.protocol.lifecycle import CodecState, Lifecycle, WrongState
    from gateway.protocol.options import REQUIRED, Option
    from gateway.protocol.plugin import (
        Backoff,
        ConnectionInfo,
        ListenerSettings,
        PluginEnv,
        PluginError,
        ProtocolPlugin,
        ServerConnection,
        Upstream,
        UpstreamContext,
        describe_error,
    )
    from gateway.protocol.session import NotKept, Session
    from gateway.protocol.subscriber import MAX_DEMAND, Demand, Feed, FeedStop, Subscriber
    from gateway.protocol.tags import NotACall, SerialSpace, UnknownTag
    from gateway.store import RecordFormat, Segment, SegmentTruncated, Store
    from gateway.store.segment import SegmentDamaged
    from gateway.transports.base import StreamLayer, Transport, address_host
    from gateway.transports.tcp import TcpTransport
    from gateway.transports.tcp import transport as tcp_transport
    from gateway.transports.tls import TlsLayer, identity_from_der, start_tls
    from gateway.transports.unix import UnixTransport, peer_credentials
    from gateway.transports.unix import transport as unix_transport

#: Each public name: the module it comes from, and its name there.
_WHERE: dict[str, tuple[str, str]] = {
    **{
        n: ("gateway.core.destination", n)
        for n in ("Delivery", "EndOfStream", "StartAt", "StopAt", "Subscription")
    },
    **{
        n: ("gateway.core.errors", n)
        for n in (
            "LocalProtocolError",
            "ProtocolError",
            "RemoteProtocolError",
            "StorageFull",
            "first_leaf",
        )
    },
    "HubFacade": ("gateway.core.facade", "HubFacade"),
    "Filter": ("gateway.core.filters", "Filter"),
    "FilterError": ("gateway.core.filters", "FilterError"),
    **{
        n: ("gateway.core.model", n)
        for n in ("Message", "Outcome", "PeerIdentity", "Position", "Positions", "Reply", "Source")
    },
    "Reason": ("gateway.core.reasons", "Reason"),
    "Receipt": ("gateway.core.receipts", "Receipt"),
    "envelope": ("gateway.durable.envelope", ""),
    "Metrics": ("gateway.ops.metrics", "Metrics"),
    "ReceiveBuffer": ("gateway.protocol.buffer", "ReceiveBuffer"),
    **{n: ("gateway.protocol.counts", n) for n in ("NOTHING", "Count", "Observe")},
    "conformance": ("gateway.protocol.conformance", ""),
    **{n: ("gateway.protocol.conformance", n) for n in ("CodecCase", "Golden", "splits")},
    **{n: ("gateway.protocol.events", n) for n in ("NEED_DATA", "ConnectionClosed", "NeedData")},
    **{n: ("gateway.protocol.lifecycle", n) for n in ("CodecState", "Lifecycle", "WrongState")},
    "REQUIRED": ("gateway.protocol.options", "REQUIRED"),
    "Option": ("gateway.protocol.options", "Option"),
    **{
        n: ("gateway.protocol.plugin", n)
        for n in (
            "Backoff",
            "ConnectionInfo",
            "ListenerSettings",
            "PluginEnv",
            "PluginError",
            "ProtocolPlugin",
            "ServerConnection",
            "Upstream",
            "UpstreamContext",
            "describe_error",
        )
    },
    "NotKept": ("gateway.protocol.session", "NotKept"),
    "Session": ("gateway.protocol.session", "Session"),
    **{
        n: ("gateway.protocol.subscriber", n)
        for n in ("MAX_DEMAND", "Demand", "Feed", "FeedStop", "Subscriber")
    },
    **{n: ("gateway.protocol.tags", n) for n in ("NotACall", "SerialSpace", "UnknownTag")},
    **{n: ("gateway.store", n) for n in ("RecordFormat", "Segment", "SegmentTruncated", "Store")},
    "SegmentDamaged": ("gateway.store.segment", "SegmentDamaged"),
    "address_host": ("gateway.transports.base", "address_host"),
    "StreamLayer": ("gateway.transports.base", "StreamLayer"),
    "Transport": ("gateway.transports.base", "Transport"),
    "TlsLayer": ("gateway.transports.tls", "TlsLayer"),
    "TcpTransport": ("gateway.transports.tcp", "TcpTransport"),
    "tcp_transport": ("gateway.transports.tcp", "transport"),
    "identity_from_der": ("gateway.transports.tls", "identity_from_der"),
    "start_tls": ("gateway.transports.tls", "start_tls"),
    "UnixTransport": ("gateway.transports.unix", "UnixTransport"),
    "peer_credentials": ("gateway.transports.unix", "peer_credentials"),
    "unix_transport": ("gateway.transports.unix", "transport"),
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, attribute = _WHERE[name]
    found = importlib.import_module(module)
    value = getattr(found, attribute) if attribute else found
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(_WHERE)


__all__ = [
    "MAX_DEMAND",
    "NEED_DATA",
    "NOTHING",
    "REQUIRED",
    "Backoff",
    "CodecCase",
    "CodecState",
    "ConnectionClosed",
    "ConnectionInfo",
    "Count",
    "Delivery",
    "Demand",
    "EndOfStream",
    "Feed",
    "FeedStop",
    "Filter",
    "FilterError",
    "Golden",
    "HubFacade",
    "Lifecycle",
    "ListenerSettings",
    "LocalProtocolError",
    "Message",
    "Metrics",
    "NeedData",
    "NotACall",
    "NotKept",
    "Observe",
    "Option",
    "Outcome",
    "PeerIdentity",
    "PluginEnv",
    "PluginError",
    "Position",
    "Positions",
    "ProtocolError",
    "ProtocolPlugin",
    "Reason",
    "Receipt",
    "ReceiveBuffer",
    "RecordFormat",
    "RemoteProtocolError",
    "Reply",
    "Segment",
    "SegmentDamaged",
    "SegmentTruncated",
    "SerialSpace",
    "ServerConnection",
    "Session",
    "Source",
    "StartAt",
    "StopAt",
    "StorageFull",
    "Store",
    "StreamLayer",
    "Subscriber",
    "Subscription",
    "TcpTransport",
    "TlsLayer",
    "Transport",
    "UnixTransport",
    "UnknownTag",
    "Upstream",
    "UpstreamContext",
    "WrongState",
    "address_host",
    "conformance",
    "describe_error",
    "envelope",
    "first_leaf",
    "identity_from_der",
    "peer_credentials",
    "splits",
    "start_tls",
    "tcp_transport",
    "unix_transport",
]
