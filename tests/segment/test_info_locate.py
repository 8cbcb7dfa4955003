"""Interchange's segment-append additions on the wire: the info and locate
commands, the payload format of a writer, the formats of a read.

The bytes are the hand-written vectors of ``extension_vectors.py``; the
conformance suite also feeds them to both codecs split at every byte.
"""

from __future__ import annotations

import struct
from uuid import UUID

import pytest
from extension_vectors import COMMANDS, SEG, VECTORS
from segment_vectors import VECTORS as PRAVEGA_VECTORS
from segment_vectors import WRITER

from gateway.core.errors import LocalProtocolError
from protocols.segment import (
    NEED_DATA,
    NULL_EVENT_NUMBER,
    READ_FORMATS,
    Append,
    AppendSetup,
    ClientCodec,
    GetStreamSegmentInfo,
    LocateOffset,
    OffsetLocated,
    PayloadFormat,
    ReadSegment,
    SegmentProtocolError,
    SegmentRead,
    ServerCodec,
    SetupAppend,
    StreamSegmentInfo,
    decode_command,
    encode,
    event_frame,
    unpack_format_runs,
)

OTHER = UUID("ffeeddcc-bbaa-9988-7766-554433221100")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_vector_encodes(name: str) -> None:
    assert encode(COMMANDS[name]) == VECTORS[name]


@pytest.mark.parametrize("name", list(COMMANDS))
def test_vector_decodes(name: str) -> None:
    assert decode_command(VECTORS[name]) == (COMMANDS[name], len(VECTORS[name]))


@pytest.mark.parametrize("name", list(COMMANDS))
def test_bytes_after_the_extensions_are_skipped(name: str) -> None:
    code, length = struct.unpack_from(">ii", VECTORS[name])
    extra = b"a newer field"
    wire = struct.pack(">ii", code, length + len(extra)) + VECTORS[name][8:] + extra
    command = COMMANDS[name]
    if isinstance(command, LocateOffset) and command.events == -1:
        return  # its absent trailing field would read the extra bytes
    if isinstance(command, StreamSegmentInfo) and command.first_event == -1:
        return
    assert decode_command(wire) == (command, len(wire))


@pytest.mark.parametrize(
    ("name", "defaults"),
    [
        ("setup_append", {"payload_format": 0}),
        ("append_setup_new_writer", {"payload_format": -1}),
        ("read_segment", {"flags": 0}),
        ("segment_read", {"formats": None}),
    ],
)
def test_a_pravega_peers_commands_decode_with_the_defaults(
    name: str, defaults: dict[str, object]
) -> None:
    command, _ = decode_command(PRAVEGA_VECTORS[name])
    for field, value in defaults.items():
        assert getattr(command, field) == value
    # ... and, holding the defaults, encode to the same bytes as before.
    assert encode(command) == PRAVEGA_VECTORS[name]


def test_a_missing_segment_from_a_pravega_server_has_no_event_indexes() -> None:
    info = COMMANDS["info_missing_pravega"]
    assert isinstance(info, StreamSegmentInfo)
    assert (info.exists, info.first_event, info.next_event) == (False, -1, -1)


def test_an_extension_before_a_set_one_is_written_at_its_default() -> None:
    wire = encode(StreamSegmentInfo(1, SEG, True, False, False, 0, 10, 0, -1, 5))
    assert wire[-16:] == struct.pack(">qq", -1, 5)
    assert decode_command(wire)[0] == StreamSegmentInfo(1, SEG, True, False, False, 0, 10, 0, -1, 5)


def test_format_runs() -> None:
    read = COMMANDS["segment_read_formats"]
    assert isinstance(read, SegmentRead)
    assert read.format_runs == [(0, PayloadFormat.RAW), (10, PayloadFormat.ENVELOPE)]
    assert SegmentRead.pack_formats(read.format_runs) == read.formats
    assert SegmentRead(SEG, 0, False, False, b"").format_runs == []
    with pytest.raises(ValueError, match="9-byte"):
        unpack_format_runs(b"\x00" * 10)


# -- the codecs ---------------------------------------------------------------------------


def _server_with_envelope_writer() -> ServerCodec:
    server = ServerCodec()
    server.receive_data(VECTORS["setup_envelopes"])
    assert server.next_event() == COMMANDS["setup_envelopes"]
    return server


def test_the_server_gets_info_and_locate_requests_and_answers_them() -> None:
    server = ServerCodec()
    server.receive_data(VECTORS["get_info"] + VECTORS["locate_events"])
    assert server.next_event() == GetStreamSegmentInfo(7, SEG)
    assert server.next_event() == LocateOffset(9, SEG, 150, "", 3)
    assert server.next_event() is NEED_DATA
    assert server.send(COMMANDS["info"]) == VECTORS["info"]
    assert server.send(COMMANDS["located"]) == VECTORS["located"]


def test_the_client_sends_info_and_locate_requests_and_reads_the_answers() -> None:
    client = ClientCodec()
    assert client.send(GetStreamSegmentInfo(7, SEG)) == VECTORS["get_info"]
    assert client.send(LocateOffset(9, SEG, 150)) == VECTORS["locate"]
    assert client.send(ReadSegment(SEG, 0, 1024, "", 5, READ_FORMATS)) == VECTORS["read_formats"]
    client.receive_data(VECTORS["info"] + VECTORS["located"] + VECTORS["segment_read_formats"])
    assert client.next_event() == COMMANDS["info"]
    assert client.next_event() == OffsetLocated(9, SEG, 133, 4)
    assert client.next_event() == COMMANDS["segment_read_formats"]


def test_neither_role_sends_the_others_commands() -> None:
    with pytest.raises(LocalProtocolError):
        ServerCodec().send(GetStreamSegmentInfo(1, SEG))
    with pytest.raises(LocalProtocolError):
        ClientCodec().send(OffsetLocated(1, SEG, 0))
    client = ClientCodec()
    client.receive_data(VECTORS["get_info"])  # a client's command, from the server
    with pytest.raises(SegmentProtocolError, match="may not send GET_STREAM_SEGMENT_INFO"):
        client.next_event()


def test_a_formats_blob_of_broken_entries_is_refused() -> None:
    client = ClientCodec()
    client.receive_data(encode(SegmentRead(SEG, 0, False, False, b"", -1, b"\x00" * 10)))
    with pytest.raises(SegmentProtocolError, match="not 9-byte entries"):
        client.next_event()


def test_an_envelope_writers_appends_carry_its_format() -> None:
    server = _server_with_envelope_writer()
    assert server.send(COMMANDS["envelopes_setup"]) == VECTORS["envelopes_setup"]
    client = ClientCodec()
    client.send(COMMANDS["setup_envelopes"])
    client.receive_data(VECTORS["envelopes_setup"])
    assert client.next_event() == COMMANDS["envelopes_setup"]
    server.receive_data(client.append(WRITER, [b"e"], 1))
    event = server.next_event()
    assert event == Append(WRITER, 1, event_frame(b"e"), 1, 1, SEG, PayloadFormat.ENVELOPE)


def test_a_server_may_accept_an_envelope_writer_as_raw_only() -> None:
    server = _server_with_envelope_writer()
    server.send(AppendSetup(1, SEG, WRITER, NULL_EVENT_NUMBER, PayloadFormat.RAW))
    client = ClientCodec()
    client.send(SetupAppend(1, WRITER, SEG))
    client.receive_data(encode(AppendSetup(1, SEG, WRITER, NULL_EVENT_NUMBER)))
    client.next_event()
    server.receive_data(client.append(WRITER, [b"r"], 1))
    event = server.next_event()
    assert isinstance(event, Append)
    assert event.payload_format == PayloadFormat.RAW


def test_the_server_never_accepts_a_format_the_writer_did_not_ask_for() -> None:
    server = ServerCodec()
    server.receive_data(PRAVEGA_VECTORS["setup_append"])  # raw
    setup = server.next_event()
    assert isinstance(setup, SetupAppend)
    with pytest.raises(LocalProtocolError, match="payload format 1"):
        server.send(AppendSetup(1, setup.segment, WRITER, NULL_EVENT_NUMBER, 1))
