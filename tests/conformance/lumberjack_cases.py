"""Lumberjack's codecs in the conformance suite, with the golden vectors of
``tests/lumberjack/test_lumberjack_codec.py``."""

from __future__ import annotations

import struct

from gateway.sdk import CodecCase, Golden
from protocols.lumberjack import Ack, ClientCodec, Limits, Progress, ServerCodec, Window
from tests.lumberjack.test_lumberjack_codec import GOLDEN

#: Small limits, so that the flood meets them quickly (the vectors fit well within).
LIMITS = Limits(max_window=100, max_frame=4096, max_window_bytes=16 * 1024)


def _j(seq: int, payload: bytes) -> bytes:
    return struct.pack(">BBII", 0x32, ord("J"), seq, len(payload)) + payload


def _server() -> ServerCodec:
    return ServerCodec(LIMITS)


def _client() -> ClientCodec:
    client = ClientCodec(version=2)
    client.window_sent(5)  # the acks of the vectors answer these two windows
    client.window_sent(5)
    return client


SERVER = CodecCase(
    name="lumberjack-server",
    make=_server,
    goldens=[Golden(name, data, windows) for name, (data, windows) in GOLDEN.items()],
    bad=[
        b"3W\x00\x00\x00\x01",  # an unknown version
        b"2A\x00\x00\x00\x01",  # a writer may not ack
        b"2J\x00\x00\x00\x01\x00\x00\x00\x02{}",  # a data frame before any W
        b"2W\x00\x00\x03\xe8",  # a window over max_window
    ],
    refused=[
        lambda codec: codec.send(Ack(2, 1)),  # no window awaits an ack
        lambda codec: codec.send(Window(2, 1, [], 1, True)),  # not an Ack
    ],
    # (acks stay allowed in ERROR: a window returned before the error may still be acked)
    flood=b"2W\x00\x00\x00\x64" + b"".join(_j(i, b"x" * 100) for i in range(1, 101)),
    flood_step=512,
    max_held=64 * 1024,
)

CLIENT = CodecCase(
    name="lumberjack-client",
    make=_client,
    goldens=[
        Golden("ack whole", b"2A\x00\x00\x00\x05", [Progress(5, 5, True)]),
        Golden(
            "ack in parts, then keepalive",
            b"2A\x00\x00\x00\x02" + b"2A\x00\x00\x00\x05" + b"2A\x00\x00\x00\x00",
            [Progress(2, 2, False), Progress(5, 3, True), Progress(0, 0, False)],
        ),
    ],
    bad=[
        b"1A\x00\x00\x00\x01",  # a v1 ack on a v2 connection
        b"2W\x00\x00\x00\x01",  # a reader only sends acks
        b"2A\x00\x00\x00\x06",  # beyond the window in flight
    ],
    refused_after_error=[lambda codec: codec.window_sent(1)],
    flood=b"2A\x00\x00\x00\x00" * 4096,  # keepalives: nothing accumulates
    max_held=16 * 1024,
)

CASES = [SERVER, CLIENT]
