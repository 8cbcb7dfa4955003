"""ttrpc (containerd's lightweight RPC over one connection) for Interchange.

The sans-IO layers, in the order they build on each other:

* :mod:`.frames`: the 10-byte frame header, the 4 MiB limit, and a
  :class:`FrameReader` that skips oversize data without buffering it;
* :mod:`.ttrpc_pb2`: Request, Response, KeyValue and Status, compiled from
  ``ttrpc.proto`` by protoc (``generate.py`` regenerates it);
* :mod:`.status`: gRPC codes, the Status of a Response, the Go server's exact
  replies to bad input;
* :mod:`.codec` (events in :mod:`.events`): :class:`~.codec.ServerCodec`
  and :class:`~.codec.ClientCodec`, one state machine per stream for each
  role, the four call kinds as Go's implementation puts them on the wire;
  and the proxy pair, :class:`~.codec.ProxyServerCodec` and
  :class:`~.codec.ProxyClientCodec`: many clients' streams on one upstream
  connection, ids remapped, frames relayed untouched.

Over trio:

* :mod:`.server`: :class:`~.server.Service` handlers of the four call kinds
  (one task per call, bounded inbound queues, ``timeout_nano`` as the
  deadline) served by :class:`~.server.TtrpcSession`;
* :mod:`.client`: :func:`~.client.open_client`, concurrent calls of the four
  kinds on one connection, deadlines, metadata, typed errors;
* :mod:`.proxy`: :class:`~.proxy.ProxySession` relaying routed services to
  pooled upstream connections;
* :mod:`.messaging`: ``interchange.v1.Messaging`` (``messaging.proto``), the
  hub for ttrpc clients;
* :mod:`.plugin` and :mod:`.upstream`: the gateway protocol ``ttrpc``
  (listener: messaging + proxy; upstream: proxy target and client role).
"""

from .frames import HEADER, MAX_DATA, Flags, Frame, FrameReader, MessageType, Oversize, encode_frame
from .status import Code, Status, TtrpcError, status_of

__all__ = [
    "HEADER",
    "MAX_DATA",
    "Code",
    "Flags",
    "Frame",
    "FrameReader",
    "MessageType",
    "Oversize",
    "Status",
    "TtrpcError",
    "encode_frame",
    "status_of",
]
