"""Micromessage2's codecs in the conformance suite: each role fresh (the handshake's
vectors) and past the handshake (the frames' vectors, from the C# implementation and
the corrected draft; see ``tests/micromessage/test_codec.py``).

A codec past the handshake is made by driving a client and a server codec through it
in memory (ids: json 1, dotnet 2, batch-ack 3, pubsub 4) and sending four MESSAGE
frames, so that the ``batch_ack_seq4`` vector settles them. Each golden holds at most
one MESSAGE between other frames: consecutive ones come out as one ``Messages`` batch
per read, so how many share a batch depends on where the input is cut.
"""

from __future__ import annotations

from gateway.sdk import CodecCase, Golden
from protocols.micromessage.codec import ClientCodec, Limits, ServerCodec, Settings
from protocols.micromessage.events import (
    Ack,
    Answered,
    Command,
    Error,
    Extension,
    Message,
    Messages,
    Offered,
)
from protocols.micromessage.frames import encode_frame
from protocols.micromessage.handshake import ExtensionSpec, Handshake, encode_handshake
from tests.micromessage.test_codec import (
    ANSWER,
    BATCH,
    DOTNET,
    GRANTED,
    IMPL,
    JSON,
    OFFER,
    SUBSCRIBE,
    TYPE_NAME,
    TYPED,
    V,
    client_past_handshake,
    server_past_handshake,
)

#: Small frames, so that a flood of fragments is refused early.
LIMITS = Limits(max_fragment=4096, max_payload=16384)
MAX_HELD = 64 * 1024
#: CONTINUED fragments of one MESSAGE, past ``max_payload`` in all.
FRAGMENTS = b"".join(
    bytes((0x18,)) + b"\x00\x01\x00\x00\x00" + (4096).to_bytes(4, "big") + bytes(4096)
    for _ in range(8)
)
#: A handshake of almost MAX_HANDSHAKE bytes, held until its last byte.
BIG_OFFER = bytes((1, 0, 0, 0)) + (4000).to_bytes(2, "big") + b"a" * 4000 + b"\x00\x00"

ZSTD = ExtensionSpec("zstd")
SERVER_SETTINGS = Settings(identity="server", optional=(BATCH,))
ERROR_HELP = Golden("error_help", V["error_help"], [Error("Help!")])


def _frames_server() -> ServerCodec:
    return server_past_handshake(LIMITS)


def _frames_client() -> ClientCodec:
    return client_past_handshake(LIMITS)


def _fresh_client() -> ClientCodec:
    client = ClientCodec(Settings(identity="hulk", required=(JSON, DOTNET)), LIMITS)
    client.send(client.offer)
    return client


def _window_overrun() -> bytes:
    return b"".join(encode_frame(Message(seq, "q")) for seq in range(1, 12))


#: Frames either role refuses past the handshake.
BAD_FRAMES = [
    bytes.fromhex("02 00 02 0004"),  # extension id 0
    bytes.fromhex("03 01 41"),  # two type bits
    bytes.fromhex("20 0001 00 0000 00"),  # reserved bits
    bytes.fromhex("80 0001 00 0000 00"),
    bytes((0x08,)) + b"\x00\x01\x01q\x00\x00" + ((16 << 20) + 1).to_bytes(4, "big"),
    V["msg_impl_test"],  # seq 2 first: a gap
    _window_overrun(),  # 11 MESSAGE frames in a window of 10
    bytes.fromhex("02 03 03 000400"),  # an ack of three bytes
    bytes.fromhex("02 02 01 ff"),  # a dotnet type name not UTF-8
    V["msg_typed_props"][:-1],  # cut inside a frame
]

FRAMES_SERVER = CodecCase(
    name="micromessage-server",
    make=_frames_server,
    goldens=[
        Golden("msg_typed_props", V["msg_typed_props"], [Messages((TYPED,))]),
        Golden("batch_ack_seq4", V["batch_ack_seq4"], [Ack(4, 4)]),
        Golden("dotnet_ext", V["dotnet_ext"], [TYPE_NAME]),
        Golden("subscribe_cmd", V["subscribe_cmd"], [SUBSCRIBE]),
        ERROR_HELP,
        Golden(
            "mixed",
            V["msg_typed_props"] + V["dotnet_ext"] + V["msg_impl_test"] + V["subscribe_cmd"],
            [Messages((TYPED,)), TYPE_NAME, Messages((IMPL,)), SUBSCRIBE],
        ),
        Golden(
            "a resend before its ack is dropped",
            V["msg_typed_props"] * 2 + V["batch_ack_seq4"],
            [Messages((TYPED,)), Ack(4, 4)],
        ),
        Golden(
            "an ack of nothing outstanding and an unknown extension",
            encode_frame(Extension(3, b"\x00\x09")) + encode_frame(Extension(9, b"?")),
            [Ack(9, 0), Extension(9, b"?")],
        ),
    ],
    bad=[
        *BAD_FRAMES,
        encode_frame(Command(b"publish;destination=q")),  # an unknown command
        encode_frame(Command(b"subscribe;filter=x")),  # no destination
    ],
    refused=[
        lambda codec: codec.send(SUBSCRIBE),  # a client's command
        lambda codec: codec.send(Message(9, "q")),  # the next seq is 5
        lambda codec: codec.send(Handshake(1, 0)),  # the handshake is over
        lambda codec: codec.send(Extension(3, b"\x00\x01")),  # not an event a codec sends
    ],
    refused_after_error=[
        lambda codec: codec.send(TYPE_NAME),
        lambda codec: codec.send(Message(5, "q")),
    ],
    flood=FRAGMENTS,
    flood_step=1000,
    max_held=MAX_HELD,
)

FRAMES_CLIENT = CodecCase(
    name="micromessage-client",
    make=_frames_client,
    goldens=[
        Golden(
            "a delivery and an ack",
            V["msg_typed_props"] + V["batch_ack_seq4"],
            [Messages((TYPED,)), Ack(4, 4)],
        ),
        Golden("dotnet_ext", V["dotnet_ext"], [TYPE_NAME]),
        ERROR_HELP,
        Golden(
            "deliveries between type names",
            V["dotnet_ext"] + V["msg_typed_props"] + V["dotnet_ext"] + V["msg_impl_test"],
            [TYPE_NAME, Messages((TYPED,)), TYPE_NAME, Messages((IMPL,))],
        ),
    ],
    bad=[*BAD_FRAMES, V["subscribe_cmd"]],  # a server sends no COMMAND frames
    refused=[
        lambda codec: codec.send(Message(1, "q")),  # the next seq is 5
        lambda codec: codec.send(Handshake(1, 0)),
    ],
    refused_after_error=[
        lambda codec: codec.send(SUBSCRIBE),
        lambda codec: codec.send(TYPE_NAME),
    ],
    flood=FRAGMENTS,
    flood_step=1000,
    max_held=MAX_HELD,
)

HANDSHAKE_SERVER = CodecCase(
    name="micromessage-server-handshake",
    make=lambda: ServerCodec(SERVER_SETTINGS, LIMITS),
    goldens=[
        Golden(
            "client_hs1",
            V["client_hs1"],
            [Offered(OFFER, Handshake(1, 0, "server", (), (GRANTED,)))],
        ),
        ERROR_HELP,
    ],
    bad=[
        bytes.fromhex("02000004 68756c6b 0000 0000"),  # major 2
        encode_handshake(Handshake(1, 0, "x", (JSON, ZSTD))),  # a required unknown
        bytes.fromhex("24 01 41"),  # neither a handshake nor an ERROR
        bytes((1, 0, 0, 0)) + b"\x00\x00" + (4096).to_bytes(2, "big"),  # over the cap
        V["error_help"] + b"\x01",  # bytes after the peer's ERROR
    ],
    refused=[
        lambda codec: codec.send(Message(1, "q")),  # the handshake is not done
        lambda codec: codec.send(Handshake(1, 0, "server")),  # no offer to answer yet
    ],
    refused_after_error=[lambda codec: codec.send(Handshake(1, 0))],
    flood=BIG_OFFER,
    flood_step=100,
    max_held=2 * 4096,
)

HANDSHAKE_CLIENT = CodecCase(
    name="micromessage-client-handshake",
    make=_fresh_client,
    goldens=[
        Golden(
            "server_hs",
            V["server_hs"],
            [Answered(ANSWER, Handshake(1, 0, "hulk", (JSON, DOTNET), (GRANTED,)))],
        ),
        ERROR_HELP,
    ],
    bad=[
        bytes.fromhex("02000006 736572766572 0000 0000"),  # major 2
        encode_handshake(Handshake(1, 0, "s", (ZSTD,))),  # a required unknown
    ],
    refused=[
        lambda codec: codec.send(Message(1, "q")),
        lambda codec: codec.send(codec.offer),  # sent already
        lambda codec: codec.send(SUBSCRIBE),
    ],
    refused_after_error=[lambda codec: codec.send(Handshake(1, 0))],
    flood=bytes((1, 0, 0, 0)) + (4000).to_bytes(2, "big") + b"a" * 4000 + b"\x00\x00",
    flood_step=100,
    max_held=2 * 4096,
)

CASES = [FRAMES_SERVER, FRAMES_CLIENT, HANDSHAKE_SERVER, HANDSHAKE_CLIENT]
