"""One message's bytes: golden vectors, split feeding, limits, malformed and mutated input."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sdk import RemoteProtocolError
from protocols.reactive.messages import (
    MAX_DEMAND,
    Cancel,
    ClientHello,
    Goodbye,
    GoodbyeAck,
    Limits,
    Message,
    MessageReader,
    OnComplete,
    OnError,
    OnNext,
    OnNextLastPart,
    OnNextPacked,
    OnNextPart,
    Ping,
    Pong,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
    Unknown,
    decode,
    encode,
)

#: Every message type, its bytes written out (computed once with msgpack).
GOLDEN: list[tuple[Message, str]] = [
    (ClientHello(0, (1,)), "93 01 00 91 01"),
    (ServerHello(0, (1,)), "93 02 00 91 01"),
    (Goodbye("bye"), "92 03 a3 62 79 65"),
    (GoodbyeAck("ok"), "92 04 a2 6f 6b"),
    (Subscribe("pub", 1, 3), "94 05 a3 70 75 62 01 03"),
    (Request(1, MAX_DEMAND), "93 06 01 cf 7f ff ff ff ff ff ff ff"),
    (Cancel(1), "92 07 01"),
    (Subscribed(1, 0), "93 08 01 00"),
    (OnNext(1, b"hello"), "93 09 01 c4 05 68 65 6c 6c 6f"),
    (OnComplete(1), "92 0a 01"),
    (OnError(1, "boom"), "93 0b 01 a4 62 6f 6f 6d"),
    (OnNextPacked(1, 2, b"abcd"), "94 0c 01 02 c4 04 61 62 63 64"),
    (OnNextPart(1, 7, b"he"), "94 0d 01 07 c4 02 68 65"),
    (OnNextLastPart(1, 7, b"llo"), "94 0e 01 07 c4 03 6c 6c 6f"),
    (Ping(b"p"), "92 40 c4 01 70"),
    (Pong(b"p"), "92 41 c4 01 70"),
]
ALL = frozenset({1})


def _read_all(
    data: bytes, pieces: list[bytes] | None = None, limits: Limits | None = None
) -> list[Message]:
    reader = MessageReader(limits or Limits())
    out: list[Message] = []
    for piece in pieces if pieces is not None else [data]:
        reader.feed(piece)
        while (obj := reader.next()) is not None:
            out.append(decode(obj, ALL))
    assert reader.held == 0
    return out


def test_the_binding_vectors() -> None:
    assert encode(OnNext(1, b"hello")) == bytes.fromhex("93 09 01 c4 05 68 65 6c 6c 6f")
    assert encode(Request(1, 2**63 - 1)) == bytes.fromhex("93 06 01 cf 7f ff ff ff ff ff ff ff")


@pytest.mark.parametrize(("message", "wire"), GOLDEN, ids=lambda x: type(x).__name__)
def test_golden_vector_both_ways(message: Message, wire: str) -> None:
    data = bytes.fromhex(wire)
    assert encode(message) == data
    assert _read_all(data) == [message]


def test_every_type_has_a_golden_vector() -> None:
    assert sorted(m.TYPE for m, _ in GOLDEN) == [*range(1, 15), 64, 65]


def test_all_vectors_split_at_every_byte() -> None:
    data = b"".join(bytes.fromhex(w) for _, w in GOLDEN)
    expected = [m for m, _ in GOLDEN]
    for cut in range(len(data) + 1):
        assert _read_all(data, [data[:cut], data[cut:]]) == expected
    assert _read_all(data, [data[i : i + 1] for i in range(len(data))]) == expected


@pytest.mark.parametrize(
    "obj",
    [
        5,  # not an array
        [],
        ["x", 1],
        [15, 1],  # unknown core type
        [63],
        [128, 1],
        [9, 1],  # too few fields
        [9, 1, b"x", 2],  # too many
        [9, "1", b"x"],  # wrong types
        [9, 1, "x"],
        [9, -1, b"x"],
        [9, True, b"x"],
        [6, 1, 2**64],
        [1, 0, [1, "x"]],
        [1, 0, 1],
        [3, b"bye"],
        [11, 1, None],
    ],
)
def test_malformed_messages_are_the_peers_error(obj: Any) -> None:
    with pytest.raises(RemoteProtocolError):
        decode(obj, ALL)


def test_extension_types_not_negotiated_are_skipped() -> None:
    assert decode([64, b"p"]) == Unknown(64)
    assert decode([100, {"any": [1, 2]}, b"x"]) == Unknown(100)
    assert decode([127]) == Unknown(127)
    assert decode([64, b"p"], ALL) == Ping(b"p")
    with pytest.raises(RemoteProtocolError):
        decode([64, "not bin"], ALL)  # negotiated: its fields are checked


def test_a_message_over_the_limit_is_refused_once_the_limit_is_held() -> None:
    limits = Limits(max_message=1000)
    reader = MessageReader(limits)
    reader.feed(bytes.fromhex("93 09 01 c5 ff ff"))  # a bin of 65535 announced
    with pytest.raises(RemoteProtocolError):  # noqa: PT012
        for _ in range(100):
            reader.feed(b"x" * 100)
            assert reader.next() is None
            assert reader.held <= limits.max_message


def test_the_string_limit() -> None:
    limits = Limits(max_message=1000, max_str=10)
    reader = MessageReader(limits)
    reader.feed(encode(Goodbye("x" * 11)))
    with pytest.raises(RemoteProtocolError):
        reader.next()
    reader = MessageReader(limits)
    reader.feed(encode(Goodbye("x" * 10)))
    assert decode(reader.next()) == Goodbye("x" * 10)


def test_a_message_over_the_limit_arriving_slowly_is_refused_with_little_held() -> None:
    limits = Limits(max_message=1000)
    reader = MessageReader(limits)
    reader.feed(bytes.fromhex("dc ff ff"))  # an array of 65535 announced
    with pytest.raises(RemoteProtocolError):
        reader.next()
    reader = MessageReader(limits)
    reader.feed(b"\x92\x09")
    for _ in range(200):
        reader.feed(b"\x91\x91\x91\x91\x91")  # deep nesting, never ending
        try:
            assert reader.next() is None
        except RemoteProtocolError:
            break
        assert reader.held <= 2 * limits.max_message


def test_bad_utf8_is_the_peers_error() -> None:
    reader = MessageReader(Limits())
    reader.feed(bytes.fromhex("92 03 a2 ff fe"))
    with pytest.raises(RemoteProtocolError):
        reader.next()


_messages = st.one_of(
    st.builds(
        ClientHello,
        st.integers(0, 2**64 - 1),
        st.lists(st.integers(0, 2**64 - 1), max_size=5).map(tuple),
    ),
    st.builds(
        Subscribe, st.text(max_size=20), st.integers(0, 2**64 - 1), st.integers(0, MAX_DEMAND)
    ),
    st.builds(Request, st.integers(0, 2**64 - 1), st.integers(0, MAX_DEMAND)),
    st.builds(OnNext, st.integers(0, 2**64 - 1), st.binary(max_size=50)),
    st.builds(OnError, st.integers(0, 2**64 - 1), st.text(max_size=20)),
    st.builds(
        OnNextPart, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.binary(max_size=20)
    ),
    st.builds(Pong, st.binary(max_size=20)),
)


@given(st.lists(_messages, max_size=8), st.integers(1, 7))
def test_round_trip(messages: list[Message], step: int) -> None:
    data = b"".join(encode(m) for m in messages)
    pieces = [data[i : i + step] for i in range(0, len(data), step)]
    assert _read_all(data, pieces) == messages


@settings(max_examples=300)
@given(
    st.binary(max_size=200)
    | st.lists(_messages, min_size=1, max_size=4).map(lambda ms: b"".join(encode(m) for m in ms)),
    st.data(),
)
def test_mutated_input_only_raises_remote_protocol_error(data: bytes, draw: st.DataObject) -> None:
    mutated = bytearray(data)
    for _ in range(draw.draw(st.integers(0, 4))):
        if mutated:
            i = draw.draw(st.integers(0, len(mutated) - 1))
            mutated[i] = draw.draw(st.integers(0, 255))
    limits = Limits(max_message=4096, max_str=64, max_array=16)
    reader = MessageReader(limits)
    try:
        reader.feed(bytes(mutated))
        while (obj := reader.next()) is not None:
            decode(obj, ALL)
            assert reader.held <= len(mutated)
    except RemoteProtocolError:
        pass


def test_msgpack_packs_what_the_vectors_say() -> None:
    # The vectors are msgpack's own: one array, bin for bytes, str for text.
    assert msgpack.unpackb(bytes.fromhex(GOLDEN[8][1])) == [9, 1, b"hello"]
