"""The Micromessage2 codecs: the C# implementation's and the corrected draft's vectors
through both roles, the handshake split anywhere, negative vectors, the ack window at
codec level, version and extension rules, and two hypothesis properties (random traffic
survives any chunking; mutated bytes only ever raise RemoteProtocolError).

The helpers at the top (:func:`establish`, :func:`csharp_server`, ...) also build the
codecs of ``tests/conformance/micromessage_cases.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sdk import (
    NEED_DATA,
    CodecState,
    ConnectionClosed,
    LocalProtocolError,
    RemoteProtocolError,
)
from protocols.micromessage.codec import ClientCodec, Limits, Phase, ServerCodec, Settings
from protocols.micromessage.commands import Subscribe, Unsubscribe
from protocols.micromessage.events import (
    Ack,
    Answered,
    Command,
    Duplicate,
    Error,
    Established,
    Extension,
    Message,
    Messages,
    Offered,
    TypeName,
)
from protocols.micromessage.frames import encode_frame
from protocols.micromessage.handshake import ExtensionSpec, Handshake, encode_handshake
from protocols.micromessage.windows import AckSettings

V: dict[str, bytes] = {
    name: bytes.fromhex(text)
    for name, text in {
        "client_hs1": "0100000468756c6b000b6a736f6e3b646f746e65740000",
        "server_hs": "010000067365727665720000000962617463682d61636b",
        "client_hs2": "0100000468756c6b000b6a736f6e3b646f746e6574000962617463682d61636b",
        "client_hs_with_props": "0100000468756c6b001b62617463682d61636b3a6d61782d636f756e74"
        "3d31303b6a736f6e0000",
        "batch_ack_seq4": "0203020004",
        "msg_impl_test": "000002024d5100106c6173745f6e616d653a6b616c6c653b066d6f74686572",
        "msg_typed_props": "00000113746f7069632f646f6d61696e2d6576656e7473001a66697273742d6e"
        "616d653a546a6f6e61733b6167653a4e34323b087b226964223a317d",
        "dotnet_ext": "02021753797374656d2e537472696e672c206d73636f726c6962",
        "error_help": "040548656c7021",
        "subscribe_cmd": "01537375627363726962653b64657374696e6174696f6e3d746f70696325"
        "3246646f6d61696e2d6576656e74732c66696c7465723d6167652533452533444e31382533426c61"
        "73742d6e616d652533435467617566",
    }.items()
}
LENGTHS = {
    "client_hs1": 23,
    "server_hs": 23,
    "client_hs2": 32,
    "client_hs_with_props": 39,
    "batch_ack_seq4": 5,
    "msg_impl_test": 31,
    "msg_typed_props": 60,
    "dotnet_ext": 26,
    "error_help": 7,
    "subscribe_cmd": 85,
}
CSHARP_SPLITS = [1, 3, 6, 9, 12, 15, 17]

JSON, DOTNET = ExtensionSpec("json"), ExtensionSpec("dotnet")
BATCH, PUBSUB = ExtensionSpec("batch-ack"), ExtensionSpec("pubsub")
OFFER = Handshake(1, 0, "hulk", (JSON, DOTNET))
ANSWER = Handshake(1, 0, "server", (), (BATCH,))
FINAL = Handshake(1, 0, "hulk", (JSON, DOTNET), (BATCH,))
#: Our batch-ack answer: the default window stated in full.
GRANTED = ExtensionSpec("batch-ack", (("max-count", "10"), ("expire-ms", "500")))

#: The MESSAGE vectors, decoded.
TYPED = Message(1, "topic/domain-events", "first-name:Tjonas;age:N42;", b'{"id":1}')
IMPL = Message(2, "MQ", "last_name:kalle;", b"mother")
TYPE_NAME = TypeName("System.String, mscorlib")
SUBSCRIBE = Subscribe("topic/domain-events", "age>=N18;last-name<Tgauf")

#: What the in-memory client offers: the C# client's list, then batch-ack and pubsub.
CLIENT_SETTINGS = Settings(identity="hulk", required=(JSON, DOTNET), optional=(BATCH, PUBSUB))


class FakeClock:
    """A clock a test moves by hand (``clock=`` of a codec)."""

    def __init__(self) -> None:
        self.now = [0.0]

    def __call__(self) -> float:
        return self.now[-1]

    def advance(self, seconds: float) -> None:
        self.now.append(self.now[-1] + seconds)


def drain(codec: ServerCodec | ClientCodec) -> list[Any]:
    """Every event up to NEED_DATA or ConnectionClosed (included)."""
    events: list[Any] = []
    while True:
        event = codec.next_event()
        if event is NEED_DATA:
            return events
        events.append(event)
        if isinstance(event, ConnectionClosed):
            return events


def establish(client: ClientCodec, server: ServerCodec) -> tuple[ClientCodec, ServerCodec]:
    """Both codecs through the handshake in memory, each having returned Established."""
    server.receive_data(client.send(client.offer))
    (offered,) = drain(server)
    client.receive_data(server.send(offered.answer))
    (answered,) = drain(client)
    server.receive_data(client.send(answered.final))
    server_events, client_events = drain(server), drain(client)
    assert server_events == client_events, (server_events, client_events)
    assert [type(e) for e in server_events] == [Established]
    return client, server


def pair(
    client_settings: Settings = CLIENT_SETTINGS,
    server_settings: Settings | None = None,
    *,
    clock: Callable[[], float] | None = None,
    limits: Limits | None = None,
) -> tuple[ClientCodec, ServerCodec]:
    """An established client and server (ids: json 1, dotnet 2, batch-ack 3, pubsub 4
    with the default settings)."""
    kwargs: dict[str, Any] = {} if clock is None else {"clock": clock}
    client = ClientCodec(client_settings, limits, **kwargs)
    server = ServerCodec(server_settings, limits, **kwargs)
    return establish(client, server)


def server_past_handshake(limits: Limits | None = None, sent: int = 4) -> ServerCodec:
    """A server codec past the handshake that has delivered ``sent`` MESSAGE frames."""
    _, server = pair(limits=limits)
    for seq in range(1, sent + 1):
        server.send(Message(seq, "q", "", b"%d" % seq))
    return server


def client_past_handshake(limits: Limits | None = None, sent: int = 4) -> ClientCodec:
    """A client codec past the handshake that has published ``sent`` MESSAGE frames."""
    client, _ = pair(limits=limits)
    for seq in range(1, sent + 1):
        client.send(Message(seq, "q", "", b"%d" % seq))
    return client


def csharp_server() -> ServerCodec:
    """A server codec that saw the C# client's first and final messages (ids: json 1,
    dotnet 2, batch-ack 3)."""
    server = ServerCodec(Settings(identity="server", optional=(BATCH,)))
    server.receive_data(V["client_hs1"])
    (offered,) = drain(server)
    server.send(offered.answer)
    server.receive_data(V["client_hs2"])
    assert [type(e) for e in drain(server)] == [Established]
    return server


def csharp_client() -> ClientCodec:
    """A client codec built like the C# client, answered with the C# server's message."""
    client = ClientCodec(Settings(identity="hulk", required=(JSON, DOTNET)))
    client.send(client.offer)
    client.receive_data(V["server_hs"])
    (answered,) = drain(client)
    client.send(answered.final)
    assert [type(e) for e in drain(client)] == [Established]
    return client


def feed(codec: ServerCodec | ClientCodec, data: bytes, eof: bool = False) -> list[Any]:
    codec.receive_data(data)
    events = drain(codec)
    if eof:
        codec.receive_data(b"")
        events += drain(codec)
    return events


# -- the vectors --------------------------------------------------------------------------
def test_vector_lengths() -> None:
    assert {name: len(data) for name, data in V.items()} == LENGTHS


def test_a_server_answers_the_csharp_client_per_our_negotiation() -> None:
    server = ServerCodec(Settings(identity="server", optional=(BATCH,)))
    assert feed(server, V["client_hs1"]) == [
        Offered(OFFER, Handshake(1, 0, "server", (), (GRANTED,)))
    ]
    assert server.phase is Phase.ANSWER
    answer = server.send(Handshake(1, 0, "server", (), (GRANTED,)))
    # Ours states the window in full where the C# server wrote the bare name.
    assert answer != V["server_hs"]
    assert answer == encode_handshake(Handshake(1, 0, "server", (), (GRANTED,)))
    events = feed(server, V["client_hs2"])  # the C# final echoes the bare name
    assert [type(e) for e in events] == [Established]
    assert events[0].agreement.extensions == (JSON, DOTNET, BATCH)
    assert server.negotiated is not None
    assert server.negotiated.ack == AckSettings(10, 500)


def test_a_default_server_answers_only_what_it_shares() -> None:
    server = ServerCodec(Settings(identity="server"))
    (offered,) = feed(server, V["client_hs1"])
    assert offered == Offered(OFFER, Handshake(1, 0, "server"))


def test_a_client_built_like_the_csharp_one_sends_its_bytes() -> None:
    client = ClientCodec(Settings(identity="hulk", required=(JSON, DOTNET)))
    assert client.send(client.offer) == V["client_hs1"]
    events = feed(client, V["server_hs"])
    assert events == [
        Answered(ANSWER, Handshake(1, 0, "hulk", (JSON, DOTNET), (GRANTED,))),
    ]
    final = client.send(events[0].final)
    assert final != V["client_hs2"]  # ours states the window it agreed to
    assert final == encode_handshake(Handshake(1, 0, "hulk", (JSON, DOTNET), (GRANTED,)))
    assert [type(e) for e in drain(client)] == [Established]
    assert client.window_room == 10


def test_the_offer_with_properties_is_answered_with_its_count() -> None:
    server = ServerCodec(Settings(identity="server"))
    (offered,) = feed(server, V["client_hs_with_props"])
    assert offered.offer == Handshake(
        1, 0, "hulk", (ExtensionSpec("batch-ack", (("max-count", "10"),)), JSON)
    )
    assert offered.answer.required == (GRANTED,)  # a required ack extension is answered


@pytest.mark.parametrize("make", [csharp_server, csharp_client])
def test_the_frame_vectors_through_both_roles(make: Callable[[], Any]) -> None:
    codec = make()
    for seq in range(1, 5):
        codec.send(Message(seq, "q", "", b"x"))
    assert feed(codec, V["batch_ack_seq4"]) == [Ack(4, 4)]
    assert feed(codec, V["dotnet_ext"]) == [TYPE_NAME]
    assert feed(codec, V["msg_typed_props"] + V["msg_impl_test"]) == [Messages((TYPED, IMPL))]
    assert feed(codec, V["error_help"]) == [Error("Help!")]


def test_without_an_ack_window_any_seq_is_new() -> None:
    """msg_impl_test as the C# test feeds it: seq 2 first, nothing to check it against."""
    client, server = pair(Settings(optional=(JSON,)))
    assert server.receive_window is None
    assert feed(server, V["msg_impl_test"] + V["msg_typed_props"]) == [Messages((IMPL, TYPED))]
    assert feed(client, V["msg_impl_test"]) == [Messages((IMPL,))]


def test_our_frames_are_the_vectors() -> None:
    server = csharp_server()
    assert server.send(TYPED) == V["msg_typed_props"]
    assert server.send(TYPE_NAME) == V["dotnet_ext"]
    assert server.send(Ack(0)) == b""  # nothing received: nothing to ack
    server.receive_data(V["msg_typed_props"] + V["msg_impl_test"])
    drain(server)
    assert server.send(Ack(2)) == encode_frame(Extension(3, b"\x00\x02"))
    assert server.send(Error("Help!")) == V["error_help"]
    assert server.state is CodecState.ERROR
    client, _ = pair()
    assert client.send(SUBSCRIBE) == V["subscribe_cmd"]


def test_the_subscribe_vector_reaches_a_pubsub_server() -> None:
    _, server = pair()
    assert feed(server, V["subscribe_cmd"]) == [SUBSCRIBE]
    unsubscribe = encode_frame(Command(b"UNSUBSCRIBE;destination=q"))
    assert feed(server, unsubscribe) == [Unsubscribe("q")]


def test_one_read_of_messages_is_one_batch_and_other_frames_cut_it() -> None:
    _, server = pair()
    wire = V["msg_typed_props"] + V["dotnet_ext"] + V["msg_impl_test"] + V["subscribe_cmd"]
    assert feed(server, wire) == [
        Messages((TYPED,)),
        TYPE_NAME,
        Messages((IMPL,)),
        SUBSCRIBE,
    ]


# -- the handshake split ------------------------------------------------------------------
def _handshake_through(pieces: list[bytes]) -> tuple[list[Any], ServerCodec]:
    server = ServerCodec(Settings(identity="server", optional=(BATCH,)))
    events: list[Any] = []
    for piece in pieces:
        if piece:
            server.receive_data(piece)
            events += drain_answering(server)
    return events, server


def drain_answering(server: ServerCodec) -> list[Any]:
    """:func:`drain`, sending the answer of an Offered event (as the driver does) and
    going on."""
    events = drain(server)
    for event in events:
        if isinstance(event, Offered):
            server.send(event.answer)
            return events + drain(server)
    return events


def _split_points(data: bytes) -> list[list[bytes]]:
    return [[data[:i], data[i:]] for i in range(len(data) + 1)] + [
        [data[i : i + 1] for i in range(len(data))]
    ]


def test_the_handshake_split_at_every_byte() -> None:
    wire = V["client_hs1"] + V["client_hs2"] + V["msg_typed_props"]
    expected, _ = _handshake_through([wire])
    assert [type(e) for e in expected] == [Offered, Established, Messages]
    for pieces in _split_points(wire):
        events, server = _handshake_through(pieces)
        assert events == expected, [len(p) for p in pieces]
        assert server.held_bytes == 0


@pytest.mark.parametrize("cut", CSHARP_SPLITS)
def test_the_csharp_split_points(cut: int) -> None:
    for data in (V["server_hs"], V["server_hs"] + V["dotnet_ext"]):
        client = ClientCodec(Settings(identity="hulk", required=(JSON, DOTNET)))
        client.send(client.offer)
        assert feed(client, data[:cut]) == []
        events = feed(client, data[cut:])
        assert [type(e) for e in events] == [Answered]  # what follows waits for the final
    events, _ = _handshake_through([V["client_hs1"][:cut], V["client_hs1"][cut:]])
    assert [type(e) for e in events] == [Offered]


# -- negative vectors ---------------------------------------------------------------------
def _refused(codec: ServerCodec | ClientCodec, data: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        feed(codec, data, eof=True)
    assert codec.state is CodecState.ERROR
    assert codec.held_bytes == 0


def test_a_cut_required_list_is_the_end_of_input_not_a_message() -> None:
    server = ServerCodec()
    cut = bytes.fromhex("01000004 68756c6b 0101 6a736f6e")  # reqLen 0x0101, 4 bytes of it
    assert feed(server, cut) == []
    assert feed(server, b"", eof=False) == [ConnectionClosed()]
    assert server.held_bytes == 0


def _large(n: int) -> bytes:
    return bytes((0x08,)) + b"\x00\x01\x01q\x00\x00" + n.to_bytes(4, "big")


NEGATIVE = [
    ("extension id 0", bytes.fromhex("02 00 02 0004"), "extension ids start at 1"),
    ("two type bits", bytes.fromhex("03 01 41"), "more than one"),
    ("reserved 0x20", bytes.fromhex("20 0001 00 0000 00"), "reserved bits 0x20"),
    ("reserved 0x40", bytes.fromhex("40 0001 00 0000 00"), "reserved bits 0x40"),
    ("reserved 0x80", bytes.fromhex("80 0001 00 0000 00"), "reserved bits 0x80"),
    ("a LARGE length over 16 MiB", _large((16 << 20) + 1), "at most"),
    ("a seq gap", V["msg_impl_test"], "MESSAGE seq 2: expected 1"),
    ("an ack of three bytes", bytes.fromhex("02 03 03 000400"), "2-byte sequence number"),
    ("a dotnet name not UTF-8", bytes.fromhex("02 02 01 ff"), "UTF-8"),
    ("a frame of pubsub", bytes.fromhex("02 04 00"), "has no frames"),
    ("an unknown command", encode_frame(Command(b"publish;destination=q")), "unknown command"),
    ("a command not ASCII", encode_frame(Command(b"subscribe;\xff")), "ASCII"),
    ("cut inside a frame", V["msg_typed_props"][:-1], "inside a frame"),
]


@pytest.mark.parametrize(("name", "data", "match"), NEGATIVE, ids=[n[0] for n in NEGATIVE])
def test_negative_frames(name: str, data: bytes, match: str) -> None:
    _refused(server_past_handshake(), data, match)


def test_an_ack_of_no_outstanding_seq_is_ignored() -> None:
    server = server_past_handshake(sent=2)
    assert feed(server, encode_frame(Extension(3, b"\x00\x07"))) == [Ack(7, 0)]
    assert feed(server, encode_frame(Extension(3, b"\x00\x00"))) == [Ack(0, 0)]
    assert server.send_window is not None
    assert server.send_window.outstanding() == [1, 2]
    assert feed(server, encode_frame(Extension(3, b"\x00\x01"))) == [Ack(1, 1)]


def test_a_message_before_the_handshake_is_refused_at_once() -> None:
    """msg_impl_test sent first: its first bytes (00 00) are no handshake of major 1."""
    _refused(ServerCodec(), V["msg_impl_test"][:2], r"version 0\.0 is not supported")
    server = ServerCodec()
    feed(server, V["client_hs1"])
    # Bytes before the answer is sent wait; then they are read as the final message.
    assert feed(server, V["msg_typed_props"]) == []
    server.send(Handshake(1, 0, "interchange"))
    _refused(server, b"", r"version 0\.0 is not supported")


def test_a_peer_exceeding_the_window() -> None:
    _, server = pair()
    wire = b"".join(encode_frame(Message(seq, "q")) for seq in range(1, 12))
    _refused(server, wire, "ack window of 10 is full")


def test_a_command_without_pubsub() -> None:
    _refused(csharp_server(), V["subscribe_cmd"], "pubsub was not negotiated")


def test_a_client_receives_no_commands() -> None:
    _refused(client_past_handshake(), V["subscribe_cmd"], "a server sends no COMMAND")


def test_bytes_after_an_error_in_place_of_the_answer() -> None:
    client = ClientCodec()
    client.send(client.offer)
    assert feed(client, V["error_help"]) == [Error("Help!")]
    _refused(client, b"\x01", "after the peer's ERROR")


def test_frames_after_an_error_frame_are_refused() -> None:
    server = server_past_handshake()
    assert feed(server, V["error_help"]) == [Error("Help!")]
    _refused(server, V["msg_typed_props"], "after the peer's ERROR")


def test_unnegotiated_extensions_are_skipped_by_length() -> None:
    _, server = pair()
    wire = encode_frame(Extension(9, b"zstd?")) + V["msg_typed_props"]
    assert feed(server, wire) == [Extension(9, b"zstd?"), Messages((TYPED,))]


# -- sends refused ------------------------------------------------------------------------
def test_sends_refused_by_phase_and_negotiation() -> None:
    server = ServerCodec()
    with pytest.raises(LocalProtocolError, match="handshake is not done"):
        server.send(Message(1))
    with pytest.raises(LocalProtocolError, match="only the answer"):
        server.send(Handshake(1, 0))
    client = csharp_client()
    with pytest.raises(LocalProtocolError, match="pubsub was not negotiated"):
        client.send(SUBSCRIBE)
    with pytest.raises(LocalProtocolError, match="does not send"):
        server_past_handshake().send(SUBSCRIBE)
    no_dotnet, _ = pair(Settings(optional=(BATCH,)))
    with pytest.raises(LocalProtocolError, match="dotnet was not negotiated"):
        no_dotnet.send(TYPE_NAME)
    no_ack, _ = pair(Settings(optional=(JSON,)))
    with pytest.raises(LocalProtocolError, match="no ack extension"):
        no_ack.send(Ack(1))
    assert no_ack.window_room is None
    assert no_ack.send(Message(1, "q")) == encode_frame(Message(1, "q"))
    assert no_ack.next_seq == 2


# -- the window at codec level ------------------------------------------------------------
def test_a_client_refuses_a_message_beyond_the_window() -> None:
    client, server = pair(Settings(optional=(BATCH,)), Settings(ack=AckSettings(3, 500)))
    for seq in (1, 2, 3):
        server.receive_data(client.send(Message(seq, "q")))
    assert client.window_room == 0
    with pytest.raises(LocalProtocolError, match="window of 3 full"):
        client.send(Message(4, "q"))
    assert client.state is CodecState.OPEN
    assert drain(server) == [Messages(tuple(Message(s, "q") for s in (1, 2, 3)))]
    client.receive_data(server.send(Ack(2)))
    assert drain(client) == [Ack(2, 2)]
    assert client.window_room == 2
    assert client.next_seq == 4


def test_a_client_offers_the_window_its_settings_want() -> None:
    client, _server = pair(
        Settings(optional=(BATCH,), ack=AckSettings(64, 250)), Settings(ack=AckSettings(100, 500))
    )
    assert client.negotiated is not None
    assert client.negotiated.ack == AckSettings(64, 250)


def test_a_client_states_its_window_in_the_spec() -> None:
    """Today a client wanting more than 10 states it twice: in the spec it offers and in
    ``Settings.ack`` (its final message takes the lower of its wish and the answer)."""
    batch = ExtensionSpec("batch-ack", (("max-count", "64"), ("expire-ms", "250")))
    client, server = pair(
        Settings(optional=(batch,), ack=AckSettings(64, 250)), Settings(ack=AckSettings(100, 500))
    )
    assert client.negotiated is not None
    assert server.negotiated is not None
    assert client.negotiated.ack == server.negotiated.ack == AckSettings(64, 250)
    assert client.window_room == server.window_room == 64


def test_resends_come_from_due_after_the_expiry() -> None:
    clock = FakeClock()
    client, _server = pair(clock=clock)
    first, second = Message(1, "q", "", b"a"), Message(2, "q", "", b"b")
    wire = client.send(first) + client.send(second)
    assert client.due() == b""
    assert client.next_due == pytest.approx(0.5)
    clock.advance(0.499)
    assert client.due() == b""
    clock.advance(0.001)
    assert client.due() == wire  # the same bytes, in seq order
    assert client.next_due == pytest.approx(1.0)
    client.receive_data(encode_frame(Extension(3, b"\x00\x02")))
    assert drain(client) == [Ack(2, 2)]
    clock.advance(10)
    assert client.due() == b""
    assert client.next_due is None


def test_duplicates_pending_dropped_acked_reported() -> None:
    client, server = pair()
    one = client.send(Message(1, "q", "", b"1"))
    assert feed(server, one + one) == [Messages((Message(1, "q", "", b"1"),))]
    assert feed(server, one) == []  # its ack is still to come: dropped
    ack = server.send(Ack(1))
    assert ack == encode_frame(Extension(3, b"\x00\x01"))
    assert feed(server, one) == [Duplicate(1, True, 1)]  # the driver re-acks it
    two = client.send(Message(2, "q"))
    assert feed(server, two + one) == [Messages((Message(2, "q"),)), Duplicate(1, True, 1)]


def test_a_rewind_makes_the_resends_new_again() -> None:
    client, server = pair()
    wire = [client.send(Message(seq, "q")) for seq in (1, 2, 3)]
    assert feed(server, b"".join(wire)) == [Messages(tuple(Message(s, "q") for s in (1, 2, 3)))]
    server.rewind(2)
    assert server.send(Ack(2)) == b""  # 2 was not kept
    assert feed(server, wire[1] + wire[2]) == [Messages((Message(2, "q"), Message(3, "q")))]


# -- versions and extensions --------------------------------------------------------------
def test_major_2_is_refused_with_an_error_reply() -> None:
    server = ServerCodec()
    with pytest.raises(RemoteProtocolError, match=r"version 2\.0 is not supported") as caught:
        feed(server, bytes.fromhex("02000004 68756c6b 0000 0000"))
    reply = server.send(Error(str(caught.value)))
    assert reply[0] == 0x04
    assert reply[2:].decode() == str(caught.value)


def test_minor_1_is_accepted_and_agreed_down_to_0() -> None:
    client, server = pair(Settings(identity="sharp", version=(1, 1), optional=(BATCH,)))
    assert client.negotiated is not None
    assert server.negotiated is not None
    assert (client.negotiated.agreement.major, client.negotiated.agreement.minor) == (1, 0)
    assert server.negotiated.agreement == client.negotiated.agreement


def test_a_required_unknown_extension_is_refused() -> None:
    offer = encode_handshake(Handshake(1, 0, "x", (JSON, ExtensionSpec("zstd"))))
    _refused(ServerCodec(), offer, "does not support the required extensions: zstd")


def test_a_client_refuses_a_server_requiring_the_unknown() -> None:
    client = ClientCodec()
    client.send(client.offer)
    answer = encode_handshake(Handshake(1, 0, "s", (ExtensionSpec("zstd"),)))
    _refused(client, answer, "client does not support the required extensions: zstd")


def test_sharpmessaging_ack_aliases_give_the_window() -> None:
    ack = ExtensionSpec("ack", (("MessagesPerAck", "10"), ("AckExpireTime", "500")))
    offer = Handshake(1, 1, "sharp", (ack,))
    server = ServerCodec(Settings(ack=AckSettings(100, 2000)))
    (offered,) = feed(server, encode_handshake(offer))
    granted = ExtensionSpec("ack", (("max-count", "10"), ("expire-ms", "500")))
    assert offered.answer.required == (granted,)
    server.send(offered.answer)
    final = Handshake(1, 0, "sharp", (ack,))  # echoes its own spec
    assert [type(e) for e in feed(server, encode_handshake(final))] == [Established]
    assert server.negotiated is not None
    assert server.negotiated.ack == AckSettings(10, 500)
    assert server.window_room == 10
    assert server.send_window is not None
    assert server.send_window.settings.expire == 0.5


# -- hypothesis ---------------------------------------------------------------------------
FRAMES = st.one_of(
    st.builds(
        lambda dest, props, payload: ("message", dest, props, payload),
        st.text("abcq/.-", max_size=12),
        st.text("abk:;N1", max_size=20),
        st.binary(max_size=300),
    ),
    st.builds(lambda name: ("type", name), st.text(max_size=30)),
    st.builds(lambda dest: ("subscribe", dest), st.text("xyz/é", min_size=1, max_size=8)),
)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pairs = zip([0, *points], [*points, len(data)], strict=True)
    return [data[a:b] for a, b in pairs if b > a]


def _publish(
    sender: ServerCodec | ClientCodec, items: list[tuple[Any, ...]]
) -> tuple[bytes, list[Any]]:
    """The sender's bytes for ``items`` and the events the receiver must make of them
    (a server sends no commands: it skips those)."""
    wire = bytearray()
    expected: list[Any] = []
    for item in items:
        event: Any
        if item[0] == "message":
            event = Message(sender.next_seq, *item[1:])
        elif item[0] == "type":
            event = TypeName(item[1])
        elif isinstance(sender, ClientCodec):
            event = Subscribe(item[1])
        else:
            continue
        wire += sender.send(event)
        expected.append(event)
    return bytes(wire), expected


def _flatten(events: list[Any]) -> list[Any]:
    out: list[Any] = []
    for event in events:
        out += event.frames if isinstance(event, Messages) else [event]
    return out


@settings(max_examples=150, deadline=None)
@given(
    st.booleans(),
    st.lists(FRAMES, max_size=30),
    st.lists(st.integers(0, 100_000), max_size=12),
)
def test_random_traffic_survives_any_chunking(
    from_client: bool, items: list[Any], cuts: list[int]
) -> None:
    batch = ExtensionSpec("batch-ack", (("max-count", "64"),))
    client, server = pair(
        Settings(optional=(batch, PUBSUB, DOTNET), ack=AckSettings(64, 500)),
        Settings(ack=AckSettings(64, 500)),
        limits=Limits(max_fragment=128),  # payloads over 128 bytes go as fragments
    )
    sender, receiver = (client, server) if from_client else (server, client)
    wire, expected = _publish(sender, items)
    events: list[Any] = []
    for chunk in _chunks(wire, cuts):
        events += feed(receiver, chunk)
    assert _flatten(events) == expected
    assert all(e.frames for e in events if isinstance(e, Messages))
    assert receiver.held_bytes == 0
    sent = [e.seq for e in expected if isinstance(e, Message)]
    if sent:  # one ack settles them all
        sender.receive_data(receiver.send(Ack(sent[-1])))
        assert drain(sender) == [Ack(sent[-1], len(sent))]
    assert sender.window_room == 64


def _streams() -> dict[str, bytes]:
    """What each role receives of one valid connection: the client's bytes (for a
    server) and the server's (for a client), handshake and frames of every kind."""
    client = ClientCodec(CLIENT_SETTINGS)
    server = ServerCodec()
    to_server = client.send(client.offer)
    server.receive_data(to_server)
    (offered,) = drain(server)
    to_client = server.send(offered.answer)
    client.receive_data(to_client)
    (answered,) = drain(client)
    final = client.send(answered.final)
    to_server += final
    drain(client)
    server.receive_data(final)
    drain(server)
    big = Message(2, "q", "", b"x" * 300)
    to_server += client.send(TYPED) + client.send(TYPE_NAME) + client.send(SUBSCRIBE)
    to_client += server.send(TYPED) + server.send(TYPE_NAME) + server.send(big)
    to_server += client.send(big)
    ack = encode_frame(Extension(3, b"\x00\x01"))
    return {
        "server": to_server + ack + V["error_help"],
        "client": to_client + ack + V["dotnet_ext"] + V["error_help"],
    }


STREAMS = _streams()
MAX_STREAM = max(len(data) for data in STREAMS.values())


def _fresh(role: str) -> ServerCodec | ClientCodec:
    limits = Limits(max_fragment=1024, max_payload=4096)
    if role == "server":
        return ServerCodec(limits=limits)
    client = ClientCodec(CLIENT_SETTINGS, limits)
    client.send(client.offer)
    return client


def _answering(codec: ServerCodec | ClientCodec) -> None:
    """Drain ``codec``, sending the handshake steps its events hand over."""
    if isinstance(codec, ServerCodec):
        drain_answering(codec)
        return
    for event in drain(codec):
        if isinstance(event, Answered):
            codec.send(event.final)
            drain(codec)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(STREAMS)),
    st.lists(st.tuples(st.integers(0, MAX_STREAM), st.integers(0, 255)), max_size=6),
    st.lists(st.integers(0, MAX_STREAM), max_size=6),
    st.integers(1, MAX_STREAM),
)
def test_mutated_bytes_raise_only_protocol_errors(
    role: str, edits: list[tuple[int, int]], cuts: list[int], keep: int
) -> None:
    data = bytearray(STREAMS[role])
    for at, value in edits:
        data[at % len(data)] = value
    codec = _fresh(role)
    try:
        for chunk in _chunks(bytes(data[:keep]), cuts):
            codec.receive_data(chunk)
            _answering(codec)
            assert codec.held_bytes <= 4 * MAX_STREAM + 64
        codec.receive_data(b"")
        drain(codec)
    except RemoteProtocolError:
        assert codec.state is CodecState.ERROR
        assert codec.held_bytes == 0
    else:
        assert codec.state is CodecState.CLOSED
        assert codec.held_bytes == 0
