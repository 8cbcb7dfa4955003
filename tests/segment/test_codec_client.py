"""The appender/reader side of the codec: the block writer byte for byte, replies
checked against what was sent, and EventReassembler over replies cut anywhere."""

from __future__ import annotations

import itertools
import struct
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from segment_vectors import COMMANDS, EV1, EV2, SEGMENT, VECTORS, WRITER

from gateway.core.errors import LocalProtocolError, RemoteProtocolError
from gateway.protocol.conformance import splits
from protocols.segment import (
    MAX_EVENT_PAYLOAD,
    NEED_DATA,
    NULL_EVENT_NUMBER,
    AppendBlockEnd,
    AppendSetup,
    AuthTokenCheckFailed,
    ClientCodec,
    CodecState,
    ConnectionClosed,
    DataAppended,
    ErrorMessage,
    EventReassembler,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    Limits,
    NoSuchSegment,
    ReadSegment,
    SegmentIsSealed,
    SegmentProtocolError,
    SegmentRead,
    SetupAppend,
    WrongHost,
    encode,
)

OTHER = UUID("ffeeddcc-bbaa-9988-7766-554433221100")


def drain(conn: ClientCodec) -> list[Any]:
    events: list[Any] = []
    while (event := conn.next_event()) is not NEED_DATA:
        events.append(event)
        if isinstance(event, ConnectionClosed):
            break
    return events


def ev(payload: bytes) -> bytes:
    return struct.pack(">ii", 0, len(payload)) + payload


def client_for(
    *writers: UUID, last: int = NULL_EVENT_NUMBER, block_size: int = 0, limits: Limits | None = None
) -> ClientCodec:
    """A client connection on which ``writers`` are set up (request ids 1, 2, ...)."""
    conn = ClientCodec(limits, block_size=block_size)
    for i, writer in enumerate(writers or (WRITER,)):
        conn.send(SetupAppend(i + 1, writer, SEGMENT, ""))
        conn.receive_data(encode(AppendSetup(i + 1, SEGMENT, writer, last)))
        assert drain(conn) == [AppendSetup(i + 1, SEGMENT, writer, last)]
    return conn


def refused(conn: ClientCodec, data: bytes, match: str) -> None:
    conn.receive_data(data)
    with pytest.raises(SegmentProtocolError, match=match) as info:
        drain(conn)
    assert info.value.reply is None  # a client answers nothing: it closes
    assert conn.state is CodecState.ERROR
    with pytest.raises(LocalProtocolError):
        conn.next_event()
    with pytest.raises(LocalProtocolError):
        conn.send(KeepAlive())


# -- requests: the vectors --------------------------------------------------------------


@pytest.mark.parametrize("name", ["hello", "keepalive", "setup_append", "read_segment"])
def test_requests_encode_to_their_vectors(name: str) -> None:
    assert ClientCodec().send(COMMANDS[name]) == VECTORS[name]


def test_vector_6_a_single_unbatched_append() -> None:
    conn = client_for()
    wire = conn.append(WRITER, [b"hello"], 1)
    assert wire == VECTORS["append_block_single"] + VECTORS["append_block_end_single"]
    assert not conn.block_open


def test_vector_7_a_batched_block_with_a_partial_event() -> None:
    conn = client_for(block_size=32)
    wire = conn.append(WRITER, [b"hello", b"0123456789abcdefghij"], 2)
    assert wire == VECTORS["batched_block"] + VECTORS["batched_block_end"]
    assert not conn.block_open
    # The same, one event at a time.
    conn = client_for(block_size=32)
    assert conn.append(WRITER, [b"hello"], 1) == VECTORS["batched_block"][:37]
    assert conn.block_open
    rest = conn.append(WRITER, [b"0123456789abcdefghij"], 2)
    assert rest == VECTORS["batched_block"][37:] + VECTORS["batched_block_end"]


def test_vector_8_a_padded_block() -> None:
    expected = VECTORS["padded_block"] + VECTORS["padded_block_end"]
    conn = client_for(block_size=32)
    assert conn.append(WRITER, [b"hello"], 1) + conn.close_block() == expected
    assert conn.close_block() == b""
    # Any other command closes the block first.
    for command in (KeepAlive(), Hello(), ReadSegment(SEGMENT, 0, 1024, "", 2)):
        conn = client_for(block_size=32)
        assert conn.append(WRITER, [b"hello"], 1) + conn.send(command) == expected + encode(command)
    conn = client_for(block_size=32)
    wire = conn.append(WRITER, [b"hello"], 1) + conn.send(SetupAppend(2, OTHER, SEGMENT))
    assert wire == expected + encode(SetupAppend(2, OTHER, SEGMENT))


def test_an_event_that_fits_exactly_is_still_a_partial_event() -> None:
    conn = client_for(block_size=26)
    wire = conn.append(WRITER, [b"hello", b"hello"], 2)
    block = struct.pack(">ii", 3, 16 + 26 + 8) + WRITER.bytes + EV1 + struct.pack(">ii", -2, 13)
    assert wire == block + EV1 + encode(AppendBlockEnd(WRITER, 13, b"", 2, 2, 1))


def test_an_event_not_smaller_than_the_block_goes_unbatched() -> None:
    conn = client_for(block_size=13)  # EV1 is 13 bytes: not smaller
    assert conn.append(WRITER, [b"hello"], 1) == (
        VECTORS["append_block_single"] + VECTORS["append_block_end_single"]
    )


def test_consecutive_unbatched_events_share_a_block_up_to_the_command_limit() -> None:
    conn = client_for()
    wire = conn.append(WRITER, [b"hello", b"0123456789abcdefghij"], 2, request_id=7)
    assert wire == (
        struct.pack(">ii", 3, 16 + 41)
        + WRITER.bytes
        + EV1
        + EV2
        + encode(AppendBlockEnd(WRITER, 41, b"", 2, 2, 7))
    )
    # Two 22-byte frames fill a 60-byte AppendBlock; the third goes into another.
    conn = client_for(limits=Limits(max_command=60))
    frame = ev(bytes(14))
    wire = conn.append(WRITER, [bytes(14)] * 3, 3)
    assert wire == (
        struct.pack(">ii", 3, 60)
        + WRITER.bytes
        + frame * 2
        + encode(AppendBlockEnd(WRITER, 44, b"", 2, 2, 1))
        + struct.pack(">ii", 3, 16 + 22)
        + WRITER.bytes
        + frame
        + encode(AppendBlockEnd(WRITER, 22, b"", 1, 3, 1))
    )


def test_writing_for_another_writer_closes_the_open_block() -> None:
    conn = client_for(WRITER, OTHER, block_size=32)
    wire = conn.append(WRITER, [b"hello"], 1) + conn.append(OTHER, [b"hello"], 1)
    padded = VECTORS["padded_block"] + VECTORS["padded_block_end"]
    assert wire.startswith(padded)
    assert wire[len(padded) :] == (
        struct.pack(">ii", 3, 16 + 32 + 8) + OTHER.bytes + EV1
    )  # the other writer's block is open now
    padding = struct.pack(">ii", -1, 19) + bytes(19)
    assert conn.close_block() == padding + encode(AppendBlockEnd(OTHER, 13, b"", 1, 1, 2))


# -- replies ----------------------------------------------------------------------------


def test_a_stream_of_reply_vectors_split_at_every_byte() -> None:
    stream = b"".join(
        VECTORS[name]
        for name in (
            "hello",
            "append_setup_new_writer",
            "data_appended",
            "keepalive",
            "segment_read",
            "wrong_host",
            "no_such_segment",
            "invalid_event_number",
        )
    )
    expected = [
        Hello(17, 5),
        AppendSetup(1, SEGMENT, WRITER, NULL_EVENT_NUMBER),
        DataAppended(WRITER, 2, NULL_EVENT_NUMBER, 1, 41),
        KeepAlive(),
        SegmentRead(SEGMENT, 0, True, False, EV1 + EV2, 2),
        WrongHost(1, SEGMENT, "10.0.0.2:12345", ""),
        NoSuchSegment(1, SEGMENT, "", -1),
        InvalidEventNumber(WRITER, 1, "", 7),
        ConnectionClosed(),
    ]
    for chunks in splits(stream):
        conn = ClientCodec(block_size=32)
        assert conn.send(SetupAppend(1, WRITER, SEGMENT)) == VECTORS["setup_append"]
        events: list[Any] = []
        for chunk in chunks:
            if chunk:
                conn.receive_data(chunk)
                while (event := conn.next_event()) is not NEED_DATA:
                    events.append(event)
                    if isinstance(event, AppendSetup):  # now the writer may append
                        conn.append(WRITER, [b"hello", b"0123456789abcdefghij"], 2)
        conn.receive_data(b"")
        events += drain(conn)
        assert events == expected
        assert conn.state is CodecState.CLOSED
        # InvalidEventNumber forgot the writer.
        with pytest.raises(LocalProtocolError, match="not set up"):
            conn.append(WRITER, [b"x"], 3)


def test_the_24_byte_data_appended_of_an_old_server() -> None:
    conn = client_for()
    conn.append(WRITER, [b"a", b"b"], 2)
    old = struct.pack(">ii", 7, 24) + WRITER.bytes + struct.pack(">q", 1)
    conn.receive_data(old)
    assert drain(conn) == [DataAppended(WRITER, 1, -1, -1, -1)]
    conn.receive_data(old[:24] + struct.pack(">q", 2))
    assert drain(conn) == [DataAppended(WRITER, 2, -1, -1, -1)]


def test_data_appended_acks_rise_and_follow_each_other() -> None:
    conn = client_for()
    conn.append(WRITER, [b"a", b"b", b"c"], 3)
    conn.receive_data(encode(DataAppended(WRITER, 1, NULL_EVENT_NUMBER, 1, 9)))
    conn.receive_data(encode(DataAppended(WRITER, 3, 1, 1, 27)))
    assert [e.event_number for e in drain(conn)] == [1, 3]
    refused(client_for(), encode(DataAppended(OTHER, 1, NULL_EVENT_NUMBER)), "not set up")
    conn = client_for()
    conn.append(WRITER, [b"a", b"b"], 2)
    refused(conn, encode(DataAppended(WRITER, 3, NULL_EVENT_NUMBER)), "sent up to 2")
    conn = client_for()
    conn.append(WRITER, [b"a", b"b"], 2)
    conn.receive_data(encode(DataAppended(WRITER, 2, NULL_EVENT_NUMBER)))
    drain(conn)
    refused(conn, encode(DataAppended(WRITER, 2, 2)), "acked up to 2")
    conn = client_for()
    conn.append(WRITER, [b"a", b"b"], 2)
    conn.receive_data(encode(DataAppended(WRITER, 1, NULL_EVENT_NUMBER)))
    drain(conn)
    refused(conn, encode(DataAppended(WRITER, 2, NULL_EVENT_NUMBER)), "the last ack was 1")


def test_after_a_reconnect_only_later_events_are_sent() -> None:
    conn = client_for(last=5)  # the store has events up to 5
    with pytest.raises(LocalProtocolError, match="event number 5 is not above 5"):
        conn.append(WRITER, [b"x", b"y"], 6)
    conn.append(WRITER, [b"y"], 6)
    conn.receive_data(encode(DataAppended(WRITER, 6, 5, 1, 100)))
    assert [e.event_number for e in drain(conn)] == [6]
    with pytest.raises(LocalProtocolError, match="not above 6"):
        conn.append(WRITER, [b"z"], 6)


@pytest.mark.parametrize("none", [NULL_EVENT_NUMBER, 0])
def test_a_draft_literal_zero_means_no_event_yet(none: int) -> None:
    for previous in (NULL_EVENT_NUMBER, 0):
        conn = client_for(last=none)
        conn.append(WRITER, [b"a"], 1)
        conn.receive_data(encode(DataAppended(WRITER, 1, previous, 1, 9)))
        assert [e.event_number for e in drain(conn)] == [1]


def test_append_setup_must_answer_our_setup() -> None:
    refused(ClientCodec(), VECTORS["append_setup_new_writer"], "answers no SetupAppend")
    conn = ClientCodec()
    conn.send(SetupAppend(1, WRITER, "another"))
    refused(conn, VECTORS["append_setup_new_writer"], "answers no SetupAppend")


def test_an_error_for_a_pending_setup_drops_it() -> None:
    conn = ClientCodec()
    conn.send(SetupAppend(4, WRITER, SEGMENT))
    with pytest.raises(LocalProtocolError, match="being set up"):
        conn.send(SetupAppend(5, WRITER, SEGMENT))
    conn.receive_data(encode(AuthTokenCheckFailed(4, "", 0)))
    assert drain(conn) == [AuthTokenCheckFailed(4, "", 0)]
    conn.send(SetupAppend(5, WRITER, SEGMENT))  # it may try again
    conn.receive_data(encode(NoSuchSegment(4, SEGMENT)))  # not for the pending request
    drain(conn)
    conn.receive_data(encode(AppendSetup(5, SEGMENT, WRITER, NULL_EVENT_NUMBER)))
    assert len(drain(conn)) == 1


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (VECTORS["setup_append"], "a server may not send SETUP_APPEND"),
        (VECTORS["read_segment"], "a server may not send READ_SEGMENT"),
        (VECTORS["append_block_single"], "a server may not send APPEND_BLOCK"),
        (VECTORS["event_hello"], "EVENT outside an append block"),
        (struct.pack(">ii", 8, 0), "unknown command type 8"),
        (struct.pack(">ii", 61, 0x01000000), "length 16777216"),
        (struct.pack(">ii", 10, 3) + b"\x00\x01", ""),  # cut: not an error yet
    ],
)
def test_bad_replies_are_refused(data: bytes, match: str) -> None:
    conn = client_for()
    if not match:
        conn.receive_data(data)
        assert drain(conn) == []
        # What the receive buffer really takes: the bytes and the bytearray's spare room.
        assert len(data) <= conn.held_bytes <= 2 * len(data) + 64
        conn.receive_data(b"")
        assert drain(conn) == [ConnectionClosed()]
        return
    refused(conn, data, match)


def test_error_replies_are_events() -> None:
    replies = [
        SegmentIsSealed(1, SEGMENT, "", 77),
        ErrorMessage(1, SEGMENT, "nope", 0),
        WrongHost(1, SEGMENT, "elsewhere:1"),
    ]
    conn = client_for()
    conn.receive_data(b"".join(encode(r) for r in replies))
    assert drain(conn) == replies


# -- what send and append refuse ------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        AppendSetup(1, SEGMENT, WRITER, 1),
        DataAppended(WRITER, 1),
        COMMANDS["append_block_single"],
        COMMANDS["append_block_end_single"],
        COMMANDS["event_hello"],
        SegmentRead(SEGMENT, 0, False, False, b""),
        NoSuchSegment(1, SEGMENT),
    ],
)
def test_a_client_does_not_send_replies_or_raw_blocks(command: Any) -> None:
    with pytest.raises(LocalProtocolError, match="a client does not send"):
        ClientCodec().send(command)


def test_append_refusals() -> None:
    conn = ClientCodec()
    with pytest.raises(LocalProtocolError, match="not set up"):
        conn.append(WRITER, [b"x"], 1)
    conn.send(SetupAppend(1, WRITER, SEGMENT))
    with pytest.raises(LocalProtocolError, match="not set up"):  # no AppendSetup yet
        conn.append(WRITER, [b"x"], 1)
    conn = client_for()
    with pytest.raises(LocalProtocolError, match="at least one event"):
        conn.append(WRITER, [], 1)
    with pytest.raises(LocalProtocolError, match="exceeds"):
        conn.append(WRITER, [bytes(MAX_EVENT_PAYLOAD + 1)], 1)
    with pytest.raises(LocalProtocolError, match="block size"):
        conn.append(WRITER, [b"x"], 1, block_size=2**24)
    with pytest.raises(LocalProtocolError, match="64 bits"):
        conn.append(WRITER, [b"x"], 2**63)
    with pytest.raises(LocalProtocolError, match="64 bits"):
        conn.append(WRITER, [b"x"], 1, request_id=-(2**63) - 1)
    conn.append(WRITER, [b"x"], 1)  # none of the refusals changed anything
    with pytest.raises(LocalProtocolError, match="not above 1"):
        conn.append(WRITER, [b"x"], 1)
    # Setting a writer up again: it appends once the new AppendSetup arrived.
    conn.send(SetupAppend(9, WRITER, SEGMENT))
    with pytest.raises(LocalProtocolError, match="not set up"):
        conn.append(WRITER, [b"x"], 2)


def test_a_largest_event_goes_through() -> None:
    conn = client_for()
    payload = bytes(MAX_EVENT_PAYLOAD)
    wire = conn.append(WRITER, [payload], 1)
    assert len(wire) == 8 + 16 + 8 + MAX_EVENT_PAYLOAD + 52


# -- EventReassembler ----------------------------------------------------------------------


def read(offset: int, data: bytes, *, end: bool = False, tail: bool = False) -> SegmentRead:
    return SegmentRead(SEGMENT, offset, tail, end, data, 2)


def test_segment_reader_over_the_vector_cut_anywhere() -> None:
    data = COMMANDS["segment_read"].data  # type: ignore[attr-defined]
    for i in range(len(data) + 1):
        for j in range(i, len(data) + 1):
            reader = EventReassembler()
            events = reader.feed(read(0, data[:i]))
            events += reader.feed(read(i, data[i:j]))
            assert reader.offset == j
            events += reader.feed(read(j, data[j:], end=True, tail=True))
            assert events == [(0, b"hello"), (13, b"0123456789abcdefghij")]
            assert reader.position == reader.offset == 41
            assert reader.held_bytes == 0
            assert reader.at_tail
            assert reader.end_of_segment


def test_segment_reader_from_an_offset() -> None:
    reader = EventReassembler(1000)
    assert reader.feed(read(1000, EV1[:10])) == []
    assert reader.held_bytes == 10
    assert reader.position == 1000
    assert reader.feed(read(1010, EV1[10:] + EV2)) == [(1000, b"hello"), (1013, EV2[8:])]


@pytest.mark.parametrize(
    ("reads", "match"),
    [
        ([read(5, EV1)], "at offset 5, where 0 was next"),
        ([read(0, EV1[:4]), read(0, EV1)], "at offset 0, where 4 was next"),
        ([read(0, struct.pack(">ii", 7, 0))], "DATA_APPENDED at segment offset 0"),
        ([read(0, EV1 + struct.pack(">ii", -1, 2))], "PADDING at segment offset 13"),
        ([read(0, struct.pack(">ii", 0, -1))], "an event of -1 bytes"),
        ([read(0, ev(bytes(11)))], "an event of 11 bytes"),
        ([read(0, EV1[:5], end=True)], "ends inside the event at offset 0"),
        ([read(0, EV1, end=True), read(13, b"x")], "after the end of the segment"),
    ],
)
def test_segment_reader_refuses(reads: list[SegmentRead], match: str) -> None:
    reader = EventReassembler(max_payload=10)
    for r in reads[:-1]:
        reader.feed(r)
    with pytest.raises(RemoteProtocolError, match=match):
        reader.feed(reads[-1])


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(st.binary(max_size=50), max_size=20),
    cuts=st.lists(st.integers(0, 400), max_size=15),
)
def test_segment_reader_returns_every_event_however_replies_are_cut(
    payloads: list[bytes], cuts: list[int]
) -> None:
    data = b"".join(ev(p) for p in payloads)
    offsets = []
    at = 0
    for p in payloads:
        offsets.append(at)
        at += 8 + len(p)
    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    reader = EventReassembler()
    events = []
    for a, b in itertools.pairwise(bounds):
        events += reader.feed(read(a, data[a:b], end=b == len(data)))
    assert events == list(zip(offsets, payloads, strict=True))
