"""The Micromessage2 handshake: the corrected draft's byte vectors, every split,
the three-step negotiation, bad input as protocol errors, and round trips."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sdk import LocalProtocolError, ReceiveBuffer, RemoteProtocolError
from protocols.micromessage.events import Error, Message
from protocols.micromessage.frames import FrameDecoder, encode_frame
from protocols.micromessage.handshake import (
    MAX_HANDSHAKE,
    Agreement,
    ExtensionSpec,
    Handshake,
    Refusal,
    agree_version,
    client_final,
    decode_handshake,
    encode_handshake,
    server_answer,
    server_confirm,
)

JSON, DOTNET, BATCH = ExtensionSpec("json"), ExtensionSpec("dotnet"), ExtensionSpec("batch-ack")
OFFER = Handshake(1, 0, "hulk", (JSON, DOTNET))
ANSWER = Handshake(1, 0, "server", (), (BATCH,))
FINAL = Handshake(1, 0, "hulk", (JSON, DOTNET), (BATCH,))
WITH_PROPS = Handshake(1, 0, "hulk", (ExtensionSpec("batch-ack", (("max-count", "10"),)), JSON))

GOLDEN: list[tuple[str, str, Handshake | Error]] = [
    ("client_offer", "01000004 68756c6b 000b 6a736f6e3b646f746e6574 0000", OFFER),
    ("server_answer", "01000006 736572766572 0000 0009 62617463682d61636b", ANSWER),
    (
        "client_final",
        "01000004 68756c6b 000b 6a736f6e3b646f746e6574 0009 62617463682d61636b",
        FINAL,
    ),
    (
        "with_properties",
        "01000004 68756c6b 001b 62617463682d61636b3a6d61782d636f756e743d31303b6a736f6e 0000",
        WITH_PROPS,
    ),
    ("error", "04 05 48656c7021", Error("Help!")),
]
SUPPORTED = {"json", "dotnet", "batch-ack", "ack", "pubsub"}


@pytest.mark.parametrize(("name", "hexed", "message"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_decode(name: str, hexed: str, message: Handshake | Error) -> None:
    data = bytes.fromhex(hexed)
    assert decode_handshake(data) == (message, len(data))
    assert decode_handshake(b"\xee" + data + b"\x00", 1) == (message, len(data) + 1)
    if isinstance(message, Handshake):
        assert encode_handshake(message) == data
    else:
        assert encode_frame(message) == data


def test_golden_lengths() -> None:
    assert [len(bytes.fromhex(h)) for _, h, _ in GOLDEN[:3]] == [23, 23, 32]


@pytest.mark.parametrize(("name", "hexed", "message"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_every_prefix_is_incomplete(name: str, hexed: str, message: Handshake | Error) -> None:
    data = bytes.fromhex(hexed)
    for i in range(len(data)):
        assert decode_handshake(data[:i]) is None, i


@pytest.mark.parametrize("cut", [1, 3, 6, 9, 12, 15, 17])
def test_csharp_split_points_through_a_receive_buffer(cut: int) -> None:
    """The C# tests' split points; then the frame decoder continues in the same buffer."""
    data = bytes.fromhex(GOLDEN[2][1]) + encode_frame(Message(1, "q", "", b"hi"))
    buffer = ReceiveBuffer()
    buffer.feed(data[:cut])
    assert decode_handshake(buffer.data, buffer.pos) is None
    buffer.feed(data[cut:])
    parsed = decode_handshake(buffer.data, buffer.pos)
    assert parsed == (FINAL, 32)
    buffer.advance(parsed[1])
    decoder = FrameDecoder(buffer=buffer, offset=32)
    assert decoder.next_frame() == Message(1, "q", "", b"hi")


def test_trailing_semicolon_accepted() -> None:
    data = encode_handshake(Handshake(1, 0, "", ()))[:4] + b"\x00\x05json;\x00\x00"
    assert decode_handshake(data) == (Handshake(1, 0, "", (JSON,)), len(data))


def test_property_values_are_url_encoded() -> None:
    spec = ExtensionSpec("x-a", (("greet", "Hello % mother!"), ("empty", "")))
    assert spec.encode() == "x-a:greet=Hello%20%25%20mother%21,empty="
    assert ExtensionSpec.decode(spec.encode()) == spec
    assert ExtensionSpec.decode("x-a:k=a%2Cb%3Bc") == ExtensionSpec("x-a", (("k", "a,b;c"),))


NEGATIVE = [
    ("property_without_eq", "01000000 0005 6a3a6b6579 0000", "no '='"),
    ("empty_item", "01000000 0009 6a736f6e3b3b61636b 0000", "extension name ''"),
    ("non_ascii_identity", "01000001 ff 0000 0000", "identity"),
    ("non_ascii_list", "01000000 0001 ff 0000", "not ASCII"),
    ("bad_url_encoding", "01000000 0007 613a6b3d256666 0000", "URL encoding"),
    ("two_type_bits", "05 01 41", "neither"),
    ("reserved_bit", "24 01 41", "neither"),
    ("error_not_utf8", "04 01 ff", "UTF-8"),
]


def test_short_required_list_waits() -> None:
    """``reqLen = 0x0101`` with fewer bytes is incomplete, not a message."""
    data = bytes.fromhex("01000000 0101 6a736f6e")
    assert decode_handshake(data) is None
    assert decode_handshake(data + bytes(0x0101 - 4 + 1)) is None  # optLen not whole yet


@pytest.mark.parametrize(("name", "hexed", "text"), NEGATIVE, ids=[n[0] for n in NEGATIVE])
def test_negative(name: str, hexed: str, text: str) -> None:
    with pytest.raises(RemoteProtocolError, match=text):
        decode_handshake(bytes.fromhex(hexed))


def test_cap_refused_from_length_fields() -> None:
    head = bytes((1, 0, 0, 0)) + b"\x00\x00" + (MAX_HANDSHAKE).to_bytes(2, "big")
    with pytest.raises(RemoteProtocolError, match="announces"):
        decode_handshake(head)  # refused before the list arrives
    with pytest.raises(RemoteProtocolError, match="announces"):
        decode_handshake(bytes.fromhex("0c00002000"))  # LARGE ERROR of 8 KiB
    assert decode_handshake(head, limit=1 << 20) is None


def test_encode_refuses_bad_messages() -> None:
    for bad in [
        Handshake(2, 0),
        Handshake(1, 0, "é"),
        Handshake(1, 0, "x" * 256),
        Handshake(1, 0, "", (ExtensionSpec("a;b"),)),
        Handshake(1, 0, "", (ExtensionSpec("a", (("k=", "v"),)),)),
        Handshake(1, 0, "", tuple(ExtensionSpec(f"x-{i:04}") for i in range(700))),
    ]:
        with pytest.raises(LocalProtocolError):
            encode_handshake(bad)


# negotiation


def test_the_drafts_three_steps() -> None:
    answer = server_answer(OFFER, SUPPORTED, identity="server", optional=(BATCH,))
    assert answer == ANSWER
    final = client_final(OFFER, ANSWER, SUPPORTED)
    assert final == FINAL
    agreement = server_confirm(OFFER, ANSWER, FINAL, SUPPORTED)
    assert isinstance(agreement, Agreement)
    assert [agreement.extension_id(n) for n in ("json", "dotnet", "batch-ack", "ack")] == [
        1,
        2,
        3,
        None,
    ]
    assert agreement.by_id(3) == BATCH
    assert agreement.by_id(0) is None
    assert agreement.by_id(4) is None


def test_required_unsupported_is_refused() -> None:
    offer = Handshake(1, 0, "c", (JSON, ExtensionSpec("x-secret")))
    refusal = server_answer(offer, SUPPORTED)
    assert isinstance(refusal, Refusal)
    assert "x-secret" in refusal.reason
    answer = Handshake(1, 0, "s", (ExtensionSpec("pubsub"),))
    refusal = client_final(OFFER, answer, {"json", "dotnet"})
    assert isinstance(refusal, Refusal)
    assert "pubsub" in refusal.reason


def test_optional_unsupported_is_dropped() -> None:
    offer = Handshake(1, 0, "c", (JSON,), (ExtensionSpec("x-zip"), BATCH))
    answer = server_answer(offer, SUPPORTED, required=(ExtensionSpec("pubsub"),))
    assert answer == Handshake(1, 0, "", (ExtensionSpec("pubsub"),), (BATCH,))
    final = client_final(
        offer, Handshake(1, 0, "", (), (BATCH, ExtensionSpec("x-srv"))), {"json", "batch-ack"}
    )
    assert final == Handshake(1, 0, "c", (JSON,), (BATCH,))


def test_server_required_joins_the_final_required_list() -> None:
    offer = Handshake(1, 0, "c", (JSON,), (ExtensionSpec("pubsub"),))
    answer = server_answer(offer, SUPPORTED, required=(ExtensionSpec("pubsub"), JSON))
    assert isinstance(answer, Handshake)
    assert answer.required == (ExtensionSpec("pubsub"),)
    assert answer.optional == ()
    final = client_final(offer, answer, SUPPORTED)
    assert isinstance(final, Handshake)
    assert final.names == ("json", "pubsub")
    agreement = server_confirm(offer, answer, final, SUPPORTED)
    assert isinstance(agreement, Agreement)
    assert agreement.extension_id("pubsub") == 2


def test_versions() -> None:
    assert agree_version((1, 0), (1, 1)) == (1, 0)
    assert agree_version((1, 1), (1, 0)) == (1, 0)
    assert agree_version((1, 1), (1, 1)) == (1, 1)
    assert isinstance(agree_version((1, 0), (2, 0)), Refusal)
    sharp = Handshake(1, 1, "sharp", (JSON,))
    answer = server_answer(sharp, SUPPORTED, version=(1, 1))
    assert isinstance(answer, Handshake)
    assert (answer.major, answer.minor) == (1, 1)
    answer = server_answer(sharp, SUPPORTED)
    assert isinstance(answer, Handshake)
    assert (answer.major, answer.minor) == (1, 0)
    final = client_final(sharp, answer, SUPPORTED, version=(1, 1))
    assert isinstance(final, Handshake)
    assert (final.major, final.minor) == (1, 0)
    refusal = server_answer(Handshake(2, 0, "future"), SUPPORTED)
    assert isinstance(refusal, Refusal)
    assert "major" in refusal.reason


@pytest.mark.parametrize(
    ("final", "reason"),
    [
        (Handshake(1, 1, "hulk", (JSON, DOTNET), (BATCH,)), "version"),
        (Handshake(1, 0, "hulk", (JSON,), (BATCH,)), "dotnet"),
        (Handshake(1, 0, "hulk", (JSON, DOTNET), (ExtensionSpec("pubsub"),)), "pubsub"),
        (Handshake(1, 0, "hulk", (JSON, DOTNET, JSON)), "twice"),
    ],
)
def test_server_confirm_refuses(final: Handshake, reason: str) -> None:
    refusal = server_confirm(OFFER, ANSWER, final, SUPPORTED)
    assert isinstance(refusal, Refusal)
    assert reason in refusal.reason


# round trips

_token = st.from_regex(r"[A-Za-z0-9_.\-]{1,8}", fullmatch=True)
_spec = st.builds(
    ExtensionSpec, _token, st.lists(st.tuples(_token, st.text(max_size=8)), max_size=3).map(tuple)
)
_message = st.builds(
    Handshake,
    st.just(1),
    st.integers(0, 255),
    st.text(st.characters(max_codepoint=127), max_size=20),
    st.lists(_spec, max_size=4).map(tuple),
    st.lists(_spec, max_size=4).map(tuple),
    st.integers(0, 255),
)


@given(_message, st.data())
def test_round_trip_at_any_split(message: Handshake, data: st.DataObject) -> None:
    raw = encode_handshake(message)
    cut = data.draw(st.integers(0, len(raw) - 1))
    assert decode_handshake(raw[:cut]) is None
    assert decode_handshake(raw) == (message, len(raw))
