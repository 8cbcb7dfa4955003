"""The reactive-streams connection, in both roles, in the conformance suite.

Elements arriving in one read come out as one event, so each vector here holds
at most one element message per subscription in a row (or one split element,
which comes out when its last part arrives): then the events do not depend on
where the input is cut.
"""

from __future__ import annotations

from gateway.sdk import CodecCase, Golden
from protocols.reactive import (
    Accepted,
    Cancelled,
    Completed,
    Connection,
    DemandAdded,
    Elements,
    Failed,
    GoodbyeReceived,
    Hello,
    Limits,
    OnNext,
    Request,
    Role,
    Skipped,
    Subscribe,
    SubscribeRequested,
)

LIMITS = Limits(max_message=1024, max_str=64, max_element=4096, max_array=16)
KEEPALIVE = frozenset({1})


def _client() -> Connection:
    codec = Connection(Role.CLIENT, LIMITS)
    codec.hello()
    codec.send(Subscribe("pub", 1, 3))  # the vectors answer this subscription
    return codec


SERVER = CodecCase(
    name="reactive-server",
    make=lambda: Connection(Role.SERVER, LIMITS),
    goldens=[
        Golden(
            "hello, subscribe, request, cancel",
            bytes.fromhex("93 01 00 91 01  94 05 a3 70 75 62 01 03  93 06 01 02  92 07 01"),
            [
                Hello(0, KEEPALIVE),
                SubscribeRequested(1, "pub", 3),
                DemandAdded(1, 2, 5),
                Cancelled(1),
            ],
        ),
        Golden(
            "an unknown extension message, a goodbye",
            bytes.fromhex("93 01 00 90  92 64 c4 01 70  92 03 a3 62 79 65"),
            [Hello(0, frozenset()), Skipped(100), GoodbyeReceived("bye", answers_ours=False)],
        ),
    ],
    bad=[
        bytes.fromhex("94 05 a3 70 75 62 01 03"),  # subscribe before the hello
        bytes.fromhex("93 01 01 91 01"),  # version 1
        bytes.fromhex("93 01 00 91 01  91 0f"),  # unknown core type
        bytes.fromhex("93 01 00 91 01  93 09 01 c4 01 78"),  # an element for nobody
        bytes.fromhex("c1"),  # not msgpack
    ],
    refused=[
        lambda codec: codec.send(OnNext(1, b"x")),  # before any hello, for nobody
        lambda codec: codec.send(Subscribe("pub", 1, 1)),  # before the client's hello
    ],
    refused_after_error=[lambda codec: codec.hello()],
    flood=bytes.fromhex("93 01 00 91 01  93 09 01 c5 ff ff") + b"x" * 8192,
    flood_step=100,
    max_held=2 * LIMITS.max_message,
)

CLIENT = CodecCase(
    name="reactive-client",
    make=_client,
    goldens=[
        Golden(
            "hello, subscribed, one element, complete",
            bytes.fromhex("93 02 00 91 01  93 08 01 00  93 09 01 c4 05 68 65 6c 6c 6f  92 0a 01"),
            [Hello(0, KEEPALIVE), Accepted(1, 0), Elements(1, (b"hello",)), Completed(1)],
        ),
        Golden(
            "a split element, then an error",
            bytes.fromhex(
                "93 02 00 91 01  93 08 01 00  94 0d 01 07 c4 02 68 65"
                "  94 0e 01 07 c4 03 6c 6c 6f  93 0b 01 a4 62 6f 6f 6d"
            ),
            [Hello(0, KEEPALIVE), Accepted(1, 0), Elements(1, (b"hello",)), Failed(1, "boom")],
        ),
    ],
    bad=[
        bytes.fromhex("93 01 00 91 01"),  # a client's hello
        bytes.fromhex("93 02 00 91 01  93 08 01 00  94 0c 01 04 c4 04 61 62 63 64"),  # over demand
        bytes.fromhex("93 02 00 91 01  93 09 01 c4 01 78"),  # before subscribed
        bytes.fromhex("93 02 00 91 01  92 04 a2 6f 6b"),  # goodbyeAck, no goodbye sent
    ],
    refused=[
        lambda codec: codec.send(Request(1, 0)),  # request(0)
        lambda codec: codec.send(Subscribe("pub", 1, 1)),  # id 1 used
        lambda codec: codec.hello(),  # sent already
    ],
    refused_after_error=[lambda codec: codec.send(Request(1, 1))],
    flood=bytes.fromhex("93 02 00 91 01  93 08 01 00  94 0d 01 07 c4 ff") + b"x" * 8192,
    flood_step=100,
    max_held=2 * LIMITS.max_message,
)

CASES = [SERVER, CLIENT]
