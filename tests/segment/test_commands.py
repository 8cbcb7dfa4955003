"""One segment-append command at a time: every vector both ways, optional and unknown
trailing fields, malformed bodies, encoder refusals, and Hypothesis round trips."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from segment_vectors import COMMANDS, EV1, HEX, LENGTHS, SEGMENT, VECTORS, WRITER

from gateway.core.errors import LocalProtocolError, RemoteProtocolError
from protocols.segment import (
    MAX_WIRECOMMAND_SIZE,
    NULL_EVENT_NUMBER,
    AppendBlockEnd,
    AuthTokenCheckFailed,
    Command,
    CommandType,
    DataAppended,
    ErrorMessage,
    Event,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    NoSuchSegment,
    OperationUnsupported,
    Padding,
    ReadSegment,
    SegmentAlreadyExists,
    SegmentIsSealed,
    SegmentIsTruncated,
    SegmentRead,
    SetupAppend,
    WrongHost,
    decode_command,
    encode,
    event_frame,
)
from protocols.segment.frames import EXTENSIONS, FIELDS

SEG = bytes.fromhex("0017") + SEGMENT.encode()  # writeUTF(SEGMENT)


def cmd(code: int, body: bytes) -> bytes:
    """A command with a correct header around ``body``, built independently of the codec."""
    return struct.pack(">ii", code, len(body)) + body


def i64(value: int) -> bytes:
    return struct.pack(">q", value)


def test_the_appendix_is_copied_whole() -> None:
    assert set(HEX) == set(LENGTHS)
    assert {name: len(data) for name, data in VECTORS.items()} == LENGTHS
    assert set(COMMANDS) == set(VECTORS) - {"jutf_tricky"}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_vector_encodes(name: str) -> None:
    assert encode(COMMANDS[name]) == VECTORS[name]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_vector_decodes(name: str) -> None:
    assert decode_command(VECTORS[name]) == (COMMANDS[name], len(VECTORS[name]))
    # At an offset in a larger buffer, too.
    data = bytearray(b"junk" + VECTORS[name] + b"more")
    assert decode_command(data, 4) == (COMMANDS[name], 4 + len(VECTORS[name]))


def test_type_codes_are_pravegas() -> None:
    assert {t.name: t.value for t in CommandType} == {
        "HELLO": -127,
        "PARTIAL_EVENT": -2,
        "PADDING": -1,
        "EVENT": 0,
        "SETUP_APPEND": 1,
        "APPEND_SETUP": 2,
        "APPEND_BLOCK": 3,
        "APPEND_BLOCK_END": 4,
        "DATA_APPENDED": 7,
        "READ_SEGMENT": 9,
        "SEGMENT_READ": 10,
        "GET_STREAM_SEGMENT_INFO": 11,
        "STREAM_SEGMENT_INFO": 12,
        "LOCATE_OFFSET": 41,
        "OFFSET_LOCATED": 42,
        "WRONG_HOST": 50,
        "SEGMENT_IS_SEALED": 51,
        "SEGMENT_ALREADY_EXISTS": 52,
        "NO_SUCH_SEGMENT": 53,
        "INVALID_EVENT_NUMBER": 55,
        "SEGMENT_IS_TRUNCATED": 56,
        "OPERATION_UNSUPPORTED": 57,
        "AUTH_TOKEN_CHECK_FAILED": 60,
        "ERROR_MESSAGE": 61,
        "KEEP_ALIVE": 100,
    }
    assert {cls.TYPE for cls in FIELDS} == set(CommandType)


def test_event_frame_is_the_event_command() -> None:
    assert event_frame(b"hello") == EV1 == encode(Event(b"hello"))
    assert event_frame(b"") == bytes(8)


# -- the error replies not in the vectors, written out by hand ---------------------------------


@pytest.mark.parametrize(
    ("command", "body"),
    [
        (SegmentIsSealed(1, SEGMENT, "st", 9), i64(1) + SEG + b"\x00\x02st" + i64(9)),
        (SegmentAlreadyExists(1, SEGMENT, ""), i64(1) + SEG + b"\x00\x00"),
        (
            SegmentIsTruncated(3, SEGMENT, 100, "", 7),
            i64(3) + SEG + i64(100) + b"\x00\x00" + i64(7),
        ),
        (OperationUnsupported(4, "createSegment", ""), i64(4) + b"\x00\x0dcreateSegment\x00\x00"),
        (AuthTokenCheckFailed(5, "", 1), i64(5) + b"\x00\x00" + b"\x00\x00\x00\x01"),
        (ErrorMessage(6, SEGMENT, "boom", 0), i64(6) + SEG + b"\x00\x04boom" + bytes(4)),
        (ErrorMessage(-1, "", "", -1), i64(-1) + b"\x00\x00\x00\x00" + b"\xff" * 4),
        (Padding(3), bytes(3)),
        (Padding(0), b""),
    ],
)
def test_more_commands_both_ways(command: Command, body: bytes) -> None:
    wire = cmd(command.TYPE, body)
    assert encode(command) == wire
    assert decode_command(wire) == (command, len(wire))


# -- optional trailing fields and unknown trailing bytes ------------------------------------


@pytest.mark.parametrize(
    ("body", "command"),
    [
        # The 24-byte DataAppended of a server from before previousEventNumber existed.
        (WRITER.bytes + i64(2), DataAppended(WRITER, 2, -1, -1, -1)),
        (WRITER.bytes + i64(2) + i64(1), DataAppended(WRITER, 2, 1, -1, -1)),
        (WRITER.bytes + i64(2) + i64(1) + i64(9), DataAppended(WRITER, 2, 1, 9, -1)),
        (WRITER.bytes + i64(2) + b"\x00" * 7, DataAppended(WRITER, 2, -1, -1, -1)),
        (i64(1) + SEG, NoSuchSegment(1, SEGMENT, "", -1)),
        (i64(1) + SEG + b"\x00\x01x", NoSuchSegment(1, SEGMENT, "x", -1)),
        (i64(1) + SEG + b"\x00\x00" + b"\x01" * 5, NoSuchSegment(1, SEGMENT, "", -1)),
        (i64(1) + SEG, SegmentIsSealed(1, SEGMENT, "", -1)),
        (i64(1) + SEG, SegmentAlreadyExists(1, SEGMENT, "")),
        (i64(1) + SEG + i64(5), SegmentIsTruncated(1, SEGMENT, 5, "", -1)),
        (i64(1) + SEG + b"\x00\x01h", WrongHost(1, SEGMENT, "h", "")),
        (WRITER.bytes + i64(1), InvalidEventNumber(WRITER, 1, "", -1)),
        (i64(1) + b"\x00\x02op", OperationUnsupported(1, "op", "")),
        (i64(1), AuthTokenCheckFailed(1, "", -1)),
        (i64(1) + b"\x00\x00\x00", AuthTokenCheckFailed(1, "", -1)),
        (SEG + i64(0) + b"\x00\x00\x04\x00" + b"\x00\x00", ReadSegment(SEGMENT, 0, 1024, "", -1)),
        (
            SEG + i64(0) + b"\x01\x01" + b"\x00\x00\x00\x00",
            SegmentRead(SEGMENT, 0, True, True, b"", -1),
        ),
        (
            WRITER.bytes + b"\x00\x00\x00\x0d" + bytes(4) + b"\x00\x00\x00\x01" + i64(1),
            AppendBlockEnd(WRITER, 13, b"", 1, 1, -1),
        ),
        (b"\x00\x00\x00\x11\x00\x00\x00\x05" + b"\xff" * 3, Hello(17, 5)),
        (b"anything", KeepAlive()),
    ],
)
def test_missing_optional_fields_default(body: bytes, command: Command) -> None:
    wire = cmd(command.TYPE, body)
    assert decode_command(wire) == (command, len(wire))


def test_a_boolean_is_any_non_zero_byte() -> None:
    body = SEG + i64(0) + b"\x7f\x00" + bytes(4) + i64(3)
    assert decode_command(cmd(10, body))[0] == SegmentRead(SEGMENT, 0, True, False, b"", 3)


#: The vectors whose every field is present and whose last field is not "the rest".
_WHOLE = [n for n in COMMANDS if n not in ("event_hello", "append_block_single")]
_WHOLE = [n for n in _WHOLE if n not in ("batched_block", "padded_block")]
# (Interchange's trailing fields follow these: tests/segment/test_info_locate.py
# checks the bytes after them are skipped.)
_WHOLE = [n for n in _WHOLE if type(COMMANDS[n]) not in EXTENSIONS]


@pytest.mark.parametrize("name", _WHOLE)
def test_unknown_trailing_bytes_are_skipped(name: str) -> None:
    code, length = struct.unpack_from(">ii", VECTORS[name])
    for extra in (b"\x00", b"\xff" * 7, b"a newer field"):
        wire = struct.pack(">ii", code, length + len(extra)) + VECTORS[name][8:] + extra
        assert decode_command(wire) == (COMMANDS[name], len(wire))


# -- malformed input ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        (bytes.fromhex("0000006401000000"), "length 16777216"),  # over 0x00FFFFFF
        (bytes.fromhex("00000064ffffffff"), "length -1"),
        (bytes.fromhex("0000002b00000000"), "unknown command type 43"),
        (bytes.fromhex("0000001400000000"), "unknown command type 20"),  # Pravega's, not ours
        (bytes.fromhex("0000006400"), "8 bytes"),
        (cmd(-127, b"\x00\x00\x00\x11"), "Hello ends inside its fields"),
        (cmd(1, i64(1) + WRITER.bytes + SEG), "SetupAppend ends inside"),  # no token
        (cmd(1, i64(1) + WRITER.bytes + SEG[:-1]), "SetupAppend ends inside"),
        (cmd(1, i64(1) + WRITER.bytes + b"\x00\x01\x00" + b"\x00\x00"), "raw zero byte"),
        (cmd(1, i64(1) + WRITER.bytes + b"\x00\x04\xf0\x9f\x98\x80\x00\x00"), "4-byte"),
        (cmd(10, SEG + i64(0) + b"\x01\x00" + b"\x00\x00\x00\x09" + EV1[:8]), "ends inside"),
        (cmd(10, SEG + i64(0) + b"\x01\x00" + b"\xff\xff\xff\xff"), "negative data length"),
        (cmd(4, WRITER.bytes + bytes(4) + b"\xff\xff\xff\xfe" + bytes(12)), "negative data"),
        (cmd(53, i64(1) + SEG + b"\x00"), "NoSuchSegment ends inside"),  # a cut stack trace
        (cmd(61, i64(1) + SEG + b"\x00\x00"), "ErrorMessage ends inside"),  # its code is required
        (cmd(7, WRITER.bytes), "DataAppended ends inside"),
        (VECTORS["setup_append"][:-1], "cut short"),
    ],
)
def test_malformed_commands_are_refused(wire: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        decode_command(wire)


@given(st.sampled_from(list(COMMANDS)), st.data())
def test_cut_or_corrupted_bodies_only_raise_protocol_errors(name: str, data: st.DataObject) -> None:
    wire = bytearray(VECTORS[name])
    cut = data.draw(st.integers(8, len(wire)))
    wire = wire[:cut]
    if len(wire) > 8 and data.draw(st.booleans()):
        at = data.draw(st.integers(8, len(wire) - 1))
        wire[at] = data.draw(st.integers(0, 255))
    wire[4:8] = struct.pack(">i", len(wire) - 8)
    try:
        command, end = decode_command(wire)
    except RemoteProtocolError:
        return
    assert end == len(wire)
    assert type(command) is type(COMMANDS[name])


# -- the encoder's refusals -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "match"),
    [
        (SetupAppend(2**63, WRITER, SEGMENT), "64-bit"),
        (DataAppended(WRITER, NULL_EVENT_NUMBER - 1), "64-bit"),
        (Hello(2**31, 5), "32-bit"),
        (ReadSegment(SEGMENT, 0, -(2**31) - 1), "32-bit"),
        (SetupAppend(1, WRITER, "x" * 65536), "over 65535"),
        (ErrorMessage(1, "", "\udc00"), "surrogate"),
        (Padding(-1), "non-negative"),
        (SegmentRead(SEGMENT, 0, False, False, bytes(MAX_WIRECOMMAND_SIZE)), "command limit"),
    ],
)
def test_encode_refuses(command: Command, match: str) -> None:
    with pytest.raises(LocalProtocolError, match=match):
        encode(command)


def test_encode_refuses_what_is_not_a_command() -> None:
    with pytest.raises(LocalProtocolError, match="not a segment-append command"):
        encode("hello")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        encode(SetupAppend(1, "not a uuid", SEGMENT))  # type: ignore[arg-type]


# -- Hypothesis round trips of every command ----------------------------------------------

_KINDS: dict[str, st.SearchStrategy[Any]] = {
    "i32": st.integers(-(2**31), 2**31 - 1),
    "i64": st.integers(-(2**63), 2**63 - 1),
    "uuid": st.uuids(),
    "bool": st.booleans(),
    "utf": st.text(max_size=40),
    "blob": st.binary(max_size=64),
    "rest": st.binary(max_size=64),
    "zeros": st.integers(0, 64),
}


def command_strategy(cls: type[Command]) -> st.SearchStrategy[Command]:
    fields = {name: _KINDS[kind.rstrip("?")] for name, kind in FIELDS[cls]}
    return st.builds(cls, **fields)


@pytest.mark.parametrize("cls", list(FIELDS), ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_every_command_round_trips(cls: type[Command], data: st.DataObject) -> None:
    command = data.draw(command_strategy(cls))
    wire = encode(command)
    code, length = struct.unpack_from(">ii", wire)
    assert (code, length) == (cls.TYPE, len(wire) - 8)
    assert decode_command(wire) == (command, len(wire))


def test_dataclass_fields_are_in_wire_order() -> None:
    for cls, spec in FIELDS.items():
        assert [f.name for f in dataclasses.fields(cls)] == [name for name, _ in spec]  # type: ignore[arg-type]
