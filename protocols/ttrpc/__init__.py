"""ttrpc (containerd's lightweight RPC over one connection) for Interchange.

So far the wire layer: :mod:`.frames` (the 10-byte frame header, the
4 MiB limit, a sans-IO :class:`FrameReader` that skips oversize data without
buffering it), :mod:`.ttrpc_pb2` (Request, Response, KeyValue and Status,
compiled from ``ttrpc.proto`` by protoc; ``generate.py`` regenerates it),
and :mod:`.status` (gRPC codes, the Status of a Response, and the Go
server's exact replies to bad input). The stream state machines, the server,
client and proxy build on these.
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
