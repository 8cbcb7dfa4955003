"""The protocol template's codecs in the conformance suite: how a new protocol joins.

A protocol joins by describing each codec in a :class:`~gateway.sdk.CodecCase`
(here, with vectors written out for it) and listing it in
``test_codec_conformance.py``; every check then runs on it.
"""

from __future__ import annotations

from gateway.sdk import CodecCase, Golden
from protocols._template import (
    ClientCodec,
    Error,
    Failed,
    Limits,
    Ok,
    Publish,
    ServerCodec,
)

LIMITS = Limits(max_line=1024)


def _client() -> ClientCodec:
    codec = ClientCodec(LIMITS)
    codec.send(Publish(b"one"))  # the answers of the vectors answer these
    codec.send(Publish(b"two"))
    return codec


SERVER = CodecCase(
    name="template-server",
    make=lambda: ServerCodec(LIMITS),
    goldens=[
        Golden("one publish", b"PUB hello\n", [Publish(b"hello")]),
        Golden("two, one empty", b"PUB a b\nPUB \n", [Publish(b"a b"), Publish(b"")]),
    ],
    bad=[b"GET /\n", b"OK\n"],
    refused=[
        lambda codec: codec.send(Ok()),  # no publish awaits it
        lambda codec: codec.send(Publish(b"x")),  # a client's frame
    ],
    refused_after_error=[lambda codec: codec.send(Failed("late"))],
    flood=b"PUB " + b"x" * 4096,  # a line without end
    flood_step=100,
    max_held=4 * LIMITS.max_line,
)

CLIENT = CodecCase(
    name="template-client",
    make=_client,
    goldens=[
        Golden("answers", b"OK\nFAIL full\n", [Ok(), Failed("full")]),
        Golden("an error", b"ERR bad line\n", [Error("bad line")]),
    ],
    bad=[b"OK\nOK\nOK\n", b"PUB x\n", b"FAIL \xff\n"],
    refused=[lambda codec: codec.send(Ok())],
    refused_after_error=[lambda codec: codec.send(Publish(b"x"))],
    flood=b"FAIL " + b"x" * 4096,
    flood_step=100,
    max_held=4 * LIMITS.max_line,
)

CASES = [SERVER, CLIENT]
