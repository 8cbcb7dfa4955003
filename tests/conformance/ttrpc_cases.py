"""ttrpc's codecs in the conformance suite: the server and client sides, and the proxy
pair, with the wire of ``tests/ttrpc/test_ttrpc_proxy_codec.py``.

ttrpc has no connection-level error (bad input is answered on its stream and
the connection goes on, as Go's server does), so these cases have no bad
input: their codecs never enter ``ERROR``.
"""

from __future__ import annotations

from gateway.sdk import CodecCase, Golden
from protocols.ttrpc import MAX_DATA, Code, Flags, MessageType, Status, encode_frame, ttrpc_pb2
from protocols.ttrpc.codec import (
    CallKind,
    ClientCodec,
    ProxyClientCodec,
    ProxyServerCodec,
    ServerCodec,
)
from protocols.ttrpc.events import Call, HalfClosed, Message, Reply, StreamMessage
from tests.ttrpc.test_ttrpc_proxy_codec import RELAYED, STREAMING, WIRE, request_body

REQ, RESP, DATA = MessageType.REQUEST, MessageType.RESPONSE, MessageType.DATA
RC, RO, ND = Flags.REMOTE_CLOSED, Flags.REMOTE_OPEN, Flags.NO_DATA
#: A frame declared over the 4 MiB limit: its data is skipped as it arrives, never held.
OVERSIZE = (
    (MAX_DATA + 1).to_bytes(4, "big")
    + (1).to_bytes(4, "big")
    + bytes([DATA, 0])
    + bytes(MAX_DATA + 1)
)


def _call(sid: int, flags: int, payload: bytes, service: str = RELAYED) -> Call:
    request = ttrpc_pb2.Request(service=service, method="M", payload=payload)
    return Call(sid, request, flags, bool(flags & RO))


def _response(payload: bytes) -> bytes:
    return ttrpc_pb2.Response(payload=payload).SerializeToString()


def _client() -> ClientCodec:
    codec = ClientCodec()
    codec.start(CallKind.UNARY, RELAYED, "M", b"u")  # stream 1
    codec.start(CallKind.SERVER_STREAMING, RELAYED, "M", b"s")  # stream 3
    return codec


def _proxy_server() -> ProxyServerCodec:
    upstream = ProxyClientCodec(client_streaming={STREAMING})
    return ProxyServerCodec(lambda service: upstream if service == RELAYED else None)


def _proxy_client() -> ProxyClientCodec:
    upstream = ProxyClientCodec(client_streaming={STREAMING})
    client = ProxyServerCodec(lambda service: upstream)
    client.receive_data(encode_frame(7, REQ, 0, request_body()))  # relayed as upstream's 1
    client.next_event()
    return upstream


SERVER = CodecCase(
    name="ttrpc-server",
    make=ServerCodec,
    goldens=[
        Golden(
            "calls and messages",
            WIRE,
            [
                _call(1, 0, b"one"),
                _call(3, RO, b""),
                Message(3, b"m"),
                _call(5, 0, b"local", service="local.v1.Svc"),
                HalfClosed(3),
            ],
        )
    ],
    refused=[
        lambda codec: codec.respond(1, b""),  # no such stream
        lambda codec: codec.send_data(1, b"x"),
    ],
    flood=OVERSIZE,
    flood_step=64 * 1024,
    max_held=128 * 1024,
)

CLIENT = CodecCase(
    name="ttrpc-client",
    make=_client,
    goldens=[
        Golden(
            "replies",
            encode_frame(3, DATA, 0, b"part")
            + encode_frame(1, RESP, 0, _response(b"answer"))
            + encode_frame(3, DATA, RC | ND),
            [
                StreamMessage(3, b"part"),
                Reply(1, Status(Code.OK), b"answer"),
                Reply(3, Status(Code.OK), None),
            ],
        )
    ],
    refused=[
        lambda codec: codec.send(1, b"x"),  # a unary call sends no messages
        lambda codec: codec.start(CallKind.CLIENT_STREAMING, RELAYED, "M", b"inline"),
    ],
    flood=OVERSIZE,
    flood_step=64 * 1024,
    max_held=128 * 1024,
)

PROXY_SERVER = CodecCase(
    name="ttrpc-proxy-server",
    make=_proxy_server,
    # The relayed streams go upstream without events; the local one comes out.
    goldens=[Golden("relayed and local", WIRE, [_call(5, 0, b"local", "local.v1.Svc")])],
    refused=[lambda codec: codec.respond(1, b"")],
    flood=OVERSIZE,
    flood_step=64 * 1024,
    max_held=128 * 1024,
)

PROXY_CLIENT = CodecCase(
    name="ttrpc-proxy-client",
    make=_proxy_client,
    # It makes no events: what the upstream sends goes to the client codecs.
    goldens=[Golden("a relayed reply", encode_frame(1, RESP, 0, _response(b"r")), [])],
    flood=OVERSIZE,
    flood_step=64 * 1024,
    max_held=128 * 1024,
)

CASES = [SERVER, CLIENT, PROXY_SERVER, PROXY_CLIENT]
