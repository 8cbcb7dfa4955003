"""ndjson's codecs in the conformance suite, with the golden and bad lines of
``plugins/ndjson/tests/test_codec.py``."""

from __future__ import annotations

from interchange_ndjson import (
    Ack,
    ClientCodec,
    Credit,
    Deliver,
    Ping,
    Pong,
    Published,
    ServerCodec,
)

from gateway.sdk import CodecCase, Golden
from plugins.ndjson.tests.test_codec import (
    CLIENT_GOLDEN,
    SERVER_GOLDEN,
    TO_CLIENT_BAD,
    TO_SERVER_BAD,
)

MAX_LINE = 4096


def _goldens(vectors: list[tuple[bytes, object]]) -> list[Golden]:
    return [
        Golden(f"{i}-{type(event).__name__}", line, [event])
        for i, (line, event) in enumerate(vectors)
    ]


SERVER = CodecCase(
    name="ndjson-server",
    make=lambda: ServerCodec(max_line=MAX_LINE),
    goldens=_goldens(CLIENT_GOLDEN),
    bad=[line + b"\n" for line in TO_SERVER_BAD],
    refused=[
        lambda codec: codec.send(Published(1, "delivered")),  # no publish awaits it
        lambda codec: codec.send(Deliver(1, "q", b"x")),  # not subscribed
        lambda codec: codec.send(Ping()),  # a client's op
    ],
    refused_after_error=[lambda codec: codec.send(Pong())],  # only an error line goes
    flood=b"x" * (4 * MAX_LINE),  # a line without end
    flood_step=256,
    max_held=2 * MAX_LINE,
)

CLIENT = CodecCase(
    name="ndjson-client",
    make=lambda: ClientCodec(max_line=MAX_LINE),
    goldens=_goldens(SERVER_GOLDEN),
    bad=[line + b"\n" for line in TO_CLIENT_BAD],
    refused=[
        lambda codec: codec.send(Ack(1)),  # never delivered
        lambda codec: codec.send(Credit("q", 1)),  # not subscribed
        lambda codec: codec.send(Pong()),  # the server's op
    ],
    refused_after_error=[lambda codec: codec.send(Ping())],
    flood=b"x" * (4 * MAX_LINE),
    flood_step=256,
    max_held=2 * MAX_LINE,
)

CASES = [SERVER, CLIENT]
