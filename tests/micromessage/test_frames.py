"""The Micromessage2 frame layer: golden vectors of the SharpMessaging
implementation and the corrected draft, every split, round trips, CONTINUED
fragments, and bad input giving protocol errors with bounded memory."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sdk import LocalProtocolError, ReceiveBuffer, RemoteProtocolError
from protocols.micromessage.events import (
    MAX_FRAGMENT,
    MAX_HEADER,
    SEQUENCE,
    Command,
    Error,
    Extension,
    Flags,
    Frame,
    Message,
)
from protocols.micromessage.frames import (
    FrameDecoder,
    encode_frame,
    encode_messages,
)

_LARGE_4096 = Message(2, "MQ", "last_name:kalle;", b"a" * 4096)

#: name, bytes, frame. Hex from the real implementation's layout (C# tests and
#: the corrected draft examples).
GOLDEN: list[tuple[str, bytes, Frame]] = [
    ("error_help", bytes.fromhex("040548656c7021"), Error("Help!")),
    ("batch_ack_seq4", bytes.fromhex("0203020004"), Extension(3, b"\x00\x04")),
    (
        "msg_impl_test",
        bytes.fromhex("000002024d5100106c6173745f6e616d653a6b616c6c653b066d6f74686572"),
        Message(2, "MQ", "last_name:kalle;", b"mother"),
    ),
    (
        "msg_typed_props",
        bytes.fromhex(
            "00000113746f7069632f646f6d61696e2d6576656e7473001a66697273742d6e616d653a546a6f"
            "6e61733b6167653a4e34323b087b226964223a317d"
        ),
        Message(1, "topic/domain-events", "first-name:Tjonas;age:N42;", b'{"id":1}'),
    ),
    (
        "msg_large_300",
        bytes.fromhex("08ffff0000000000012c") + b"x" * 300,
        Message(65535, "", "", b"x" * 300),
    ),
    (
        "msg_large_4096",
        bytes.fromhex("080002024d5100106c6173745f6e616d653a6b616c6c653b00001000") + b"a" * 4096,
        _LARGE_4096,
    ),
    (
        "dotnet_ext",
        bytes.fromhex("02021753797374656d2e537472696e672c206d73636f726c6962"),
        Extension(2, b"System.String, mscorlib"),
    ),
    (
        "subscribe_cmd",
        bytes.fromhex(
            "01537375627363726962653b64657374696e6174696f6e3d746f706963253246646f6d61696e2d"
            "6576656e74732c66696c7465723d6167652533452533444e31382533426c6173742d6e616d6525"
            "33435467617566"
        ),
        Command(
            b"subscribe;destination=topic%2Fdomain-events,filter=age%3E%3DN18%3Blast-name%3CTgauf"
        ),
    ),
]
_IDS = [name for name, _, _ in GOLDEN]


def _drain(decoder: FrameDecoder) -> list[Frame]:
    out = []
    while (frame := decoder.next_frame()) is not None:
        out.append(frame)
    return out


def _decode(data: bytes) -> list[Frame]:
    decoder = FrameDecoder()
    decoder.feed(data)
    frames = _drain(decoder)
    decoder.check_eof()
    return frames


@pytest.mark.parametrize(("name", "wire", "frame"), GOLDEN, ids=_IDS)
def test_golden_encode(name: str, wire: bytes, frame: Frame) -> None:
    assert encode_frame(frame) == wire


@pytest.mark.parametrize(("name", "wire", "frame"), GOLDEN, ids=_IDS)
def test_golden_decode_at_every_split(name: str, wire: bytes, frame: Frame) -> None:
    for cut in range(len(wire) + 1):
        decoder = FrameDecoder()
        decoder.feed(wire[:cut])
        early = _drain(decoder)
        decoder.feed(wire[cut:])
        assert early + _drain(decoder) == [frame], cut
        assert decoder.held == 0


def test_golden_stream_byte_by_byte() -> None:
    stream = b"".join(wire for _, wire, _ in GOLDEN)
    decoder = FrameDecoder()
    got: list[Frame] = []
    for i in range(len(stream)):
        decoder.feed(stream[i : i + 1])
        got += _drain(decoder)
    assert got == [frame for _, _, frame in GOLDEN]
    decoder.check_eof()


def test_large_vector_header() -> None:
    """The 300-byte vector: LARGE set, 4-byte length 0x12c, 310 bytes in all."""
    wire = encode_frame(Message(65535, "", "", b"x" * 300))
    assert wire[:10] == bytes.fromhex("08ffff0000000000012c")
    assert len(wire) == 310


@pytest.mark.parametrize(
    "make",
    [
        lambda n: Message(1, "q", "", b"p" * n),
        lambda n: Command(b"c" * n),
        lambda n: Extension(1, b"e" * n),
        lambda n: Error("r" * n),
    ],
    ids=["message", "command", "extension", "error"],
)
def test_large_flag_iff_over_255_for_every_kind(make: Callable[[int], Frame]) -> None:
    small, large = encode_frame(make(255)), encode_frame(make(256))
    assert not small[0] & Flags.LARGE_PAYLOAD
    assert large[0] & Flags.LARGE_PAYLOAD
    assert len(large) == len(small) + 4
    assert _decode(small) == [make(255)]
    assert _decode(large) == [make(256)]


def test_large_flag_with_small_length_is_accepted() -> None:
    assert _decode(bytes.fromhex("0a03000000020004")) == [Extension(3, b"\x00\x04")]


def test_sequence_numbers_wrap_to_one() -> None:
    assert SEQUENCE.after(65535) == 1
    assert 0 not in SEQUENCE
    assert 65535 in SEQUENCE
    assert SEQUENCE.precedes(65535, 1)
    assert SEQUENCE.precedes(65534, 2)


# -- CONTINUED ---------------------------------------------------------------


def test_payload_over_1_mib_goes_out_as_continued_fragments() -> None:
    frame = Message(7, "q", "k:N1;", bytes(range(256)) * 4096 + b"tail")  # 1 MiB + 4
    wire = encode_frame(frame)
    first_len = 1 + 2 + 1 + 1 + 2 + 5 + 4 + MAX_FRAGMENT
    first, second = wire[:first_len], wire[first_len:]
    assert first[0] == Flags.LARGE_PAYLOAD | Flags.CONTINUED
    assert second == bytes.fromhex("00000700000004") + b"tail"
    assert _decode(wire) == [frame]


def test_fragments_share_seq_and_only_the_first_has_destination() -> None:
    wire = encode_frame(Message(9, "d", "p:T1;", b"abcdefg"), max_fragment=3)
    assert wire == bytes.fromhex(
        "10 0009 01 64 0005 703a54313b 03 616263"
        "10 0009 00 0000 03 646566"
        "00 0009 00 0000 01 67".replace(" ", "")
    )


def test_extension_frames_interleave_with_fragments() -> None:
    message = encode_frame(Message(1, "q", "", b"abcdef"), max_fragment=2)
    ack = encode_frame(Extension(3, b"\x00\x01"))
    first = message[:10]  # flags, seq, "q", no properties, length 2, "ab"
    assert first.endswith(b"\x02ab")
    assert first[0] & Flags.CONTINUED
    stream = first + ack + message[len(first) :]
    assert _decode(stream) == [Extension(3, b"\x00\x01"), Message(1, "q", "", b"abcdef")]


@pytest.mark.parametrize(
    "frame",
    [Command(b"x" * 10), Extension(4, b"y" * 10), Error("z" * 10)],
    ids=["command", "extension", "error"],
)
def test_other_kinds_fragment_too(frame: Frame) -> None:
    wire = encode_frame(frame, max_fragment=4)
    assert wire[0] & Flags.CONTINUED
    assert _decode(wire) == [frame]


# -- bad input -----------------------------------------------------------------

NEGATIVE: list[tuple[str, bytes, str]] = [
    ("two_kind_bits", bytes.fromhex("0300"), "byte 0 (flags 0x03)"),
    ("reserved_0x20", bytes.fromhex("2000010000000000"), "reserved bits 0x20"),
    ("reserved_0x40", bytes.fromhex("410100"), "reserved bits 0x40"),
    ("reserved_0x80", bytes.fromhex("840100"), "reserved bits 0x80"),
    ("extension_id_0", bytes.fromhex("0200020004"), "byte 1 (0x00): extension ids start at 1"),
    ("seq_0", bytes.fromhex("00000000000000"), "sequence number 0"),
    ("large_over_16_mib", bytes.fromhex("08000100000001000001"), "byte 6 (length 16777217)"),
    ("fragment_over_1_mib", bytes.fromhex("0a0100100001"), "byte 2 (length 1048577)"),
    ("non_ascii_destination", bytes.fromhex("00000101e9000000"), "byte 4 (0xe9)"),
    ("non_ascii_properties", bytes.fromhex("000001000001e900"), "byte 6 (0xe9)"),
    (
        "new_message_inside_fragments",
        bytes.fromhex("10000100000001610000020000000162"),
        "MESSAGE 2 starts before the last fragment of MESSAGE 1",
    ),
    (
        "later_fragment_with_destination",
        bytes.fromhex("100001000000016100000101710000000162"),
        "carries a destination",
    ),
]


@pytest.mark.parametrize(("name", "wire", "why"), NEGATIVE, ids=[n for n, _, _ in NEGATIVE])
def test_negative_vectors(name: str, wire: bytes, why: str) -> None:
    decoder = FrameDecoder()
    decoder.feed(wire)
    with pytest.raises(RemoteProtocolError, match=why.replace("(", r"\(").replace(")", r"\)")):
        _drain(decoder)


def test_extension_id_above_the_negotiated_count() -> None:
    decoder = FrameDecoder(extension_count=3)
    decoder.feed(bytes.fromhex("02030200040204020004"))
    assert decoder.next_frame() == Extension(3, b"\x00\x04")
    with pytest.raises(RemoteProtocolError, match=r"byte 6 \(0x04\): extension id 4, but 3"):
        decoder.next_frame()


def test_unknown_extension_frames_are_framed_by_their_length() -> None:
    """Without a count (a relay), any id 1..255 is framed whole and the next frame follows."""
    wire = bytes.fromhex("02ff03616263") + encode_frame(Command(b"go"))
    assert _decode(wire) == [Extension(255, b"abc"), Command(b"go")]


def test_joined_payload_is_capped() -> None:
    wire = encode_frame(Command(b"c" * 100), max_fragment=10)
    decoder = FrameDecoder(max_payload=50)
    decoder.feed(wire)
    with pytest.raises(RemoteProtocolError, match="pass 50 bytes"):
        _drain(decoder)
    assert decoder.held <= 60 + len(wire)


def test_large_length_is_refused_before_its_bytes_arrive() -> None:
    decoder = FrameDecoder()
    decoder.feed(bytes.fromhex("09") + (MAX_FRAGMENT + 1).to_bytes(4, "big"))
    with pytest.raises(RemoteProtocolError, match="CONTINUED"):
        decoder.next_frame()


def test_feeding_without_draining_is_the_callers_error() -> None:
    decoder = FrameDecoder(max_fragment=16)
    assert decoder.max_buffer == 2 * (MAX_HEADER + 16)
    decoder.feed(b"\x01\x00" * (decoder.max_buffer // 2))
    with pytest.raises(LocalProtocolError, match="drain"):
        decoder.feed(b"\x01\x00")
    assert len(_drain(decoder)) == decoder.max_buffer // 2


@pytest.mark.parametrize(
    "wire", [b"\x00\x00", encode_frame(Command(b"abcdef"), max_fragment=3)[:5]]
)
def test_eof_inside_a_frame_or_a_fragmented_payload(wire: bytes) -> None:
    decoder = FrameDecoder()
    decoder.feed(wire)
    _drain(decoder)
    with pytest.raises(RemoteProtocolError, match="closed"):
        decoder.check_eof()


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (Message(0), "sequence number 0"),
        (Message(65536), "sequence number 65536"),
        (Extension(0, b""), "extension id 0"),
        (Extension(256, b""), "extension id 256"),
        (Message(1, "é"), "destination must be ASCII"),
        (Message(1, "d" * 256), "destination is 256 bytes"),
        (Message(1, "", "p" * 65536), "properties is 65536 bytes"),
    ],
)
def test_encoding_refuses_frames_out_of_range(frame: Frame, why: str) -> None:
    with pytest.raises(LocalProtocolError, match=why):
        encode_frame(frame)


# -- properties ----------------------------------------------------------------

_ascii = st.text(st.characters(max_codepoint=127), max_size=40)
_messages = st.builds(Message, st.integers(1, 65535), _ascii, _ascii, st.binary(max_size=600))
_frames = st.one_of(
    _messages,
    st.builds(Command, st.binary(max_size=600)),
    st.builds(Extension, st.integers(1, 255), st.binary(max_size=600)),
    st.builds(Error, st.text(max_size=300)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_frames, max_size=6), st.integers(1, 700), st.data())
def test_round_trip_in_random_pieces(
    frames: list[Frame], fragment: int, data: st.DataObject
) -> None:
    wire = b"".join(encode_frame(f, max_fragment=fragment) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    decoder = FrameDecoder()
    got: list[Frame] = []
    for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        decoder.feed(wire[start:end])
        got += _drain(decoder)
    assert got == frames
    decoder.check_eof()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_frames, min_size=1, max_size=4),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=6),
)
def test_mutated_frames_give_only_protocol_errors(
    frames: list[Frame], flips: list[tuple[int, int]]
) -> None:
    wire = bytearray(b"".join(encode_frame(f, max_fragment=100) for f in frames))
    for where, value in flips:
        wire[where % len(wire)] = value
    decoder = FrameDecoder(max_fragment=1000, max_payload=3000, extension_count=8)
    try:
        for i in range(0, len(wire), 7):
            decoder.feed(bytes(wire[i : i + 7]))
            _drain(decoder)
            assert decoder.held <= 3000 + MAX_HEADER + 1000
    except RemoteProtocolError:
        pass


def test_the_docs_examples_are_these_frames() -> None:
    """Every complete example of docs/protocols/micromessage2.md decodes to a tested frame."""
    doc = Path(__file__).resolve().parents[2] / "docs" / "protocols" / "micromessage2.md"
    section = doc.read_text().split("### Examples")[1].split("###")[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and "then" not in r]
    known = [frame for _, _, frame in GOLDEN] + [Message(9, "d", "p:T1;", b"abcdefg")]
    decoded = []
    for row in rows[2:]:
        spans = re.findall(r"`([0-9a-f ]+)`", row.split("|")[2])
        decoded += _decode(bytes.fromhex("".join(spans).replace(" ", "")))
    assert len(decoded) == 6
    assert all(frame in known for frame in decoded)


def test_decoding_a_codecs_buffer_after_the_handshake() -> None:
    """The codec reads the handshake from its buffer, then frames follow in the same bytes."""
    handshake = bytes.fromhex("010000067365727665720000000962617463682d61636b")
    buffer = ReceiveBuffer()
    buffer.feed(handshake + bytes.fromhex("0201020004") + b"\x03")
    buffer.advance(len(handshake))
    decoder = FrameDecoder(buffer=buffer, offset=len(handshake), extension_count=1)
    assert decoder.next_frame() == Extension(1, b"\x00\x04")
    with pytest.raises(RemoteProtocolError, match=r"^byte 28 \(flags 0x03\)"):
        decoder.next_frame()


def test_error_offsets_count_bytes_already_dropped() -> None:
    decoder = FrameDecoder()
    for _ in range(100):
        decoder.feed(encode_frame(Extension(1, b"\x00\x04")))
        assert decoder.next_frame() == Extension(1, b"\x00\x04")
    decoder.feed(b"\x00\x00\x00\x00")
    with pytest.raises(RemoteProtocolError, match=r"^byte 501 \(0x0000\): sequence number 0"):
        decoder.next_frame()


def test_empty_fragments_hold_nothing() -> None:
    decoder = FrameDecoder()
    empty = bytes((Flags.COMMAND | Flags.CONTINUED, 0))
    for _ in range(1000):
        decoder.feed(empty)
        assert decoder.next_frame() is None
        assert decoder.held == 0
    with pytest.raises(RemoteProtocolError, match="closed"):
        decoder.check_eof()
    decoder.feed(encode_frame(Command(b"go")))
    assert decoder.next_frame() == Command(b"go")
    decoder.check_eof()


# -- the fast paths --------------------------------------------------------------


def _fast_then_slow(decoder: FrameDecoder, limit: int) -> list[Frame]:
    """Drain ``decoder`` as the codec does: runs of plain MESSAGE frames in one pass,
    anything else one frame at a time."""
    out: list[Frame] = []
    while True:
        run = decoder.next_messages(limit)
        if run:
            out += run
            continue
        frame = decoder.next_frame()
        if frame is None:
            return out
        out.append(frame)


@settings(max_examples=200, deadline=None)
@given(st.lists(_frames, max_size=8), st.integers(1, 700), st.integers(1, 5), st.data())
def test_the_one_pass_message_parser_agrees_with_next_frame(
    frames: list[Frame], fragment: int, limit: int, data: st.DataObject
) -> None:
    wire = b"".join(encode_frame(f, max_fragment=fragment) for f in frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    decoder = FrameDecoder()
    got: list[Frame] = []
    for start, end in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        decoder.feed(wire[start:end])
        got += _fast_then_slow(decoder, limit)
    assert got == frames
    decoder.check_eof()


def test_the_one_pass_parser_leaves_bad_frames_to_next_frame() -> None:
    decoder = FrameDecoder()
    decoder.feed(encode_frame(Message(1, "q", "", b"ok")) + bytes.fromhex("00 0000 01 71 0000 00"))
    assert decoder.next_messages(10) == [Message(1, "q", "", b"ok")]
    assert decoder.next_messages(10) == []  # seq 0: next_frame refuses it, naming the byte
    with pytest.raises(RemoteProtocolError, match=r"byte 11 .*sequence number 0"):
        decoder.next_frame()


@settings(max_examples=200, deadline=None)
@given(st.lists(_messages, max_size=6), st.integers(1, 65535), st.integers(1, 700))
def test_encode_messages_is_encode_frame_for_each(
    frames: list[Message], first: int, fragment: int
) -> None:
    items = [(f.destination, f.properties, f.payload) for f in frames]
    blob, ends = encode_messages(first, items, max_fragment=fragment)
    seqs = [SEQUENCE.after(first, i) for i in range(len(frames))]
    wires = [
        encode_frame(f._replace(seq=seq), max_fragment=fragment)
        for f, seq in zip(frames, seqs, strict=True)
    ]
    assert blob == b"".join(wires)
    assert ends == [sum(map(len, wires[: i + 1])) for i in range(len(wires))]
