"""ttrpc (containerd's lightweight RPC over one connection) for Interchange.

The sans-IO layers, in the order they build on each other:

* :mod:`.frames`: the 10-byte frame header, the 4 MiB limit, and a
  :class:`FrameReader` that skips oversize data without buffering it;
* :mod:`.ttrpc_pb2`: Request, Response, KeyValue and Status, compiled from
  ``ttrpc.proto`` by protoc (``generate.py`` regenerates it);
* :mod:`.status`: gRPC codes, the Status of a Response, the Go server's exact
  replies to bad input;
* :mod:`.server_codec` (events in :mod:`.events`) and :mod:`.client_codec`:
  one state machine per stream for each role, the four call kinds as Go's
  implementation puts them on the wire.

Over trio, :mod:`.server` serves :class:`~.server.Service` handlers of the four
call kinds (one task per call, bounded inbound queues, ``timeout_nano`` as the
deadline). The client library, the proxy and the messaging service are still
to come (issue 12).
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
