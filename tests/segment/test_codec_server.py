"""The segment-store side of the codec: blocks reassembled and checked, writers tracked.

Client bytes come from the research vectors (and from a block builder written
here with ``struct``, for the malformed ones), so the server is checked
against bytes its own encoder did not make; the Hypothesis properties then
run the client's block writer against it, chunked anywhere.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable
from typing import Any
from uuid import UUID

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from segment_vectors import EV1, EV2, SEGMENT, VECTORS, WRITER

from gateway.core.errors import LocalProtocolError
from gateway.protocol.conformance import splits
from protocols.segment import (
    NEED_DATA,
    NULL_EVENT_NUMBER,
    Append,
    AppendBlock,
    AppendSetup,
    ClientCodec,
    CodecState,
    ConnectionClosed,
    DataAppended,
    ErrorMessage,
    Event,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    Limits,
    NoSuchSegment,
    ReadSegment,
    SegmentProtocolError,
    SegmentRead,
    ServerCodec,
    SetupAppend,
    WrongHost,
    encode,
)

OTHER = UUID("ffeeddcc-bbaa-9988-7766-554433221100")


# -- an independent builder and feeding helpers ------------------------------------------


def header(code: int, length: int) -> bytes:
    return struct.pack(">ii", code, length)


def ev(payload: bytes) -> bytes:
    return header(0, len(payload)) + payload


def block(writer: UUID, body: bytes, length: int | None = None) -> bytes:
    """An AppendBlock whose header says ``length`` (default: the writer id and ``body``)."""
    return header(3, 16 + len(body) if length is None else length) + writer.bytes + body


def block_end(
    writer: UUID,
    whole: int,
    data: bytes,
    num: int,
    last: int,
    request_id: int | None = 1,
) -> bytes:
    body = writer.bytes + struct.pack(">ii", whole, len(data)) + data
    body += struct.pack(">iq", num, last)
    if request_id is not None:
        body += struct.pack(">q", request_id)
    return header(4, len(body)) + body


def setup(writer: UUID = WRITER, request_id: int = 1, segment: str = SEGMENT) -> bytes:
    return encode(SetupAppend(request_id, writer, segment, ""))


def drain(conn: ServerCodec) -> list[Any]:
    events: list[Any] = []
    while (event := conn.next_event()) is not NEED_DATA:
        events.append(event)
        if isinstance(event, ConnectionClosed):
            break
    return events


def server_for(*writers: UUID, last: int = NULL_EVENT_NUMBER, limits: Limits | None = None):
    """A server connection on which ``writers`` are set up (new writers by default)."""
    conn = ServerCodec(limits)
    for i, writer in enumerate(writers or (WRITER,)):
        conn.receive_data(setup(writer, i + 1))
        (event,) = drain(conn)
        assert event == SetupAppend(i + 1, writer, SEGMENT, "")
        conn.send(AppendSetup(i + 1, SEGMENT, writer, last))
    return conn


class Store:
    """What a driver does with the events: answer each the way a segment store would."""

    def __init__(self, conn: ServerCodec) -> None:
        self.conn = conn
        self.out = bytearray()
        self.events: list[Any] = []
        self.segment = bytearray()

    def feed(self, chunks: Iterable[bytes], eof: bool = True) -> list[Any]:
        for chunk in chunks:
            if chunk:
                self.conn.receive_data(chunk)
                self._handle()
        if eof:
            self.conn.receive_data(b"")
            self._handle()
        return self.events

    def _handle(self) -> None:
        """Each event is answered before the next is parsed, as a driver does."""
        conn = self.conn
        while (event := conn.next_event()) is not NEED_DATA:
            self.events.append(event)
            if isinstance(event, ConnectionClosed):
                break
            if isinstance(event, Hello):
                self.out += conn.send(Hello())
            elif isinstance(event, KeepAlive):
                self.out += conn.send(KeepAlive())
            elif isinstance(event, SetupAppend):
                self.out += conn.send(
                    AppendSetup(event.request_id, event.segment, event.writer_id, NULL_EVENT_NUMBER)
                )
            elif isinstance(event, Append):
                self.segment += event.data
                self.out += conn.acknowledge(event, len(self.segment))


# -- the vectors --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "event"),
    [
        ("hello", Hello(17, 5)),
        ("keepalive", KeepAlive()),
        ("setup_append", SetupAppend(1, WRITER, SEGMENT, "")),
        ("read_segment", ReadSegment(SEGMENT, 0, 1024, "", 2)),
    ],
)
def test_request_vectors_split_at_every_byte(name: str, event: Any) -> None:
    for chunks in splits(VECTORS[name]):
        conn = ServerCodec()
        events = []
        for chunk in chunks:
            if chunk:
                conn.receive_data(chunk)
                events += drain(conn)
        assert events == [event]
        assert conn.held_bytes == 0
        conn.receive_data(b"")
        assert drain(conn) == [ConnectionClosed()]
        assert conn.state is CodecState.CLOSED


#: (client bytes, the Append they hold) for the three block vectors.
BLOCKS = {
    "single": (
        VECTORS["append_block_single"] + VECTORS["append_block_end_single"],
        Append(WRITER, 1, EV1, 1, 1, SEGMENT),
    ),
    "batched": (
        VECTORS["batched_block"] + VECTORS["batched_block_end"],
        Append(WRITER, 1, EV1 + EV2, 2, 2, SEGMENT),
    ),
    "padded": (
        VECTORS["padded_block"] + VECTORS["padded_block_end"],
        Append(WRITER, 1, EV1, 1, 1, SEGMENT),
    ),
}


@pytest.mark.parametrize("name", list(BLOCKS))
def test_block_vectors_split_at_every_byte(name: str) -> None:
    wire, append = BLOCKS[name]
    for chunks in splits(wire):
        conn = server_for()
        events = []
        for chunk in chunks:
            if chunk:
                conn.receive_data(chunk)
                new = drain(conn)
                if conn.held_bytes:  # nothing of a block is returned before it is whole
                    assert new == []
                events += new
        assert events == [append]
        assert conn.held_bytes == 0


def test_a_stream_of_vectors_is_answered_with_vectors() -> None:
    stream = (
        b"".join(
            VECTORS[name]
            for name in ("hello", "setup_append", "batched_block", "batched_block_end", "keepalive")
        )
        + VECTORS["read_segment"]
    )
    expected_out = b"".join(
        VECTORS[name] for name in ("hello", "append_setup_new_writer", "data_appended", "keepalive")
    )
    expected = [
        Hello(17, 5),
        SetupAppend(1, WRITER, SEGMENT, ""),
        Append(WRITER, 1, EV1 + EV2, 2, 2, SEGMENT),
        KeepAlive(),
        ReadSegment(SEGMENT, 0, 1024, "", 2),
        ConnectionClosed(),
    ]
    for chunks in splits(stream):
        store = Store(ServerCodec())
        assert store.feed(chunks) == expected
        assert bytes(store.out) == expected_out
        assert bytes(store.segment) == EV1 + EV2


@pytest.mark.parametrize(
    ("name", "reply"),
    [
        ("hello", Hello()),
        ("keepalive", KeepAlive()),
        ("segment_read", SegmentRead(SEGMENT, 0, True, False, EV1 + EV2, 2)),
        ("wrong_host", WrongHost(1, SEGMENT, "10.0.0.2:12345", "")),
        ("no_such_segment", NoSuchSegment(1, SEGMENT, "", -1)),
        ("invalid_event_number", InvalidEventNumber(WRITER, 1, "", 7)),
    ],
)
def test_replies_encode_to_their_vectors(name: str, reply: Any) -> None:
    assert ServerCodec().send(reply) == VECTORS[name]


def test_append_setup_and_data_appended_vectors() -> None:
    conn = ServerCodec()
    conn.receive_data(VECTORS["setup_append"])
    drain(conn)
    assert (
        conn.send(AppendSetup(1, SEGMENT, WRITER, NULL_EVENT_NUMBER))
        == VECTORS["append_setup_new_writer"]
    )
    assert conn.writers == 1
    conn.receive_data(BLOCKS["batched"][0])
    (append,) = drain(conn)
    assert conn.acknowledge(append, 41) == VECTORS["data_appended"]
    assert conn.send(KeepAlive()) == VECTORS["keepalive"]


# -- the block rules (research §A.2 "Server-side checks") and other bad input -------------


def refused(conn: ServerCodec, data: bytes, match: str) -> SegmentProtocolError:
    conn.receive_data(data)
    with pytest.raises(SegmentProtocolError, match=match) as info:
        drain(conn)
    assert conn.state is CodecState.ERROR
    with pytest.raises(LocalProtocolError):
        conn.next_event()
    conn.receive_data(b"more bytes are dropped")
    assert conn.held_bytes == 0
    return info.value


def test_stale_event_number_gets_invalid_event_number() -> None:
    conn = server_for()
    conn.receive_data(block(WRITER, EV1 + EV1) + block_end(WRITER, 26, b"", 2, 5, request_id=9))
    (append,) = drain(conn)
    assert append.last_event_number == 5
    # The next block ends at 4: below the last one received.
    error = refused(conn, block(WRITER, EV1) + block_end(WRITER, 13, b"", 1, 4, 7), "not above 5")
    assert error.reply == InvalidEventNumber(WRITER, 7, "", 4)
    assert encode(error.reply) == bytes.fromhex(
        "0000003700000022" + WRITER.hex + "0000000000000007" + "0000" + "0000000000000004"
    )
    # Writers are forgotten: a client must set up again on a new connection.
    with pytest.raises(LocalProtocolError, match="not set up"):
        conn.send(DataAppended(WRITER, 5, NULL_EVENT_NUMBER))


def test_an_equal_event_number_is_stale_too() -> None:
    conn = server_for()
    conn.receive_data(BLOCKS["single"][0])
    drain(conn)
    error = refused(conn, BLOCKS["single"][0], "event number 1 is not above 1")
    assert isinstance(error.reply, InvalidEventNumber)


def test_stale_after_reconnect_is_checked_against_append_setup() -> None:
    # The store said events up to 7 are stored: a resent block ending at 7 is stale.
    conn = server_for(last=7)
    error = refused(conn, block(WRITER, EV1) + block_end(WRITER, 13, b"", 1, 7, 3), "not above 7")
    assert error.reply == InvalidEventNumber(WRITER, 3, "", 7)
    conn = server_for(last=7)
    conn.receive_data(block(WRITER, EV1) + block_end(WRITER, 13, b"", 1, 8, 3))
    assert [e.last_event_number for e in drain(conn)] == [8]


@pytest.mark.parametrize("none", [NULL_EVENT_NUMBER, 0])
def test_a_new_writer_may_start_anywhere_above_none(none: int) -> None:
    conn = server_for(last=none)
    conn.receive_data(BLOCKS["single"][0])
    assert [a.last_event_number for a in drain(conn)] == [1]
    # DataAppended's previous says "none" either way.
    assert conn.send(DataAppended(WRITER, 1, 0 if none else NULL_EVENT_NUMBER, 1, 13))
    conn.receive_data(block(WRITER, EV1) + block_end(WRITER, 13, b"", 1, 2))
    drain(conn)
    assert conn.send(DataAppended(WRITER, 2, 1, 1, 26))
    # An event number at or below "none" is stale even so.
    conn = server_for(last=none)
    error = refused(
        conn, block(WRITER, EV1) + block_end(WRITER, 13, b"", 1, NULL_EVENT_NUMBER), "not above"
    )
    assert isinstance(error.reply, InvalidEventNumber)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (header(100, 0x01000000), "length 16777216"),
        (header(1, -1), "length -1"),
        (EV1, "EVENT outside an append block"),
        (header(-2, 3) + b"abc", "PARTIAL_EVENT outside an append block"),
        (header(-1, 3) + bytes(3), "PADDING outside an append block"),
        (VECTORS["append_block_end_single"], "a client may not send APPEND_BLOCK_END"),
        (VECTORS["data_appended"], "a client may not send DATA_APPENDED"),
        (VECTORS["append_setup_new_writer"], "a client may not send APPEND_SETUP"),
        (header(43, 0), "unknown command type 43"),
        (header(20, 0), "unknown command type 20"),
        (header(3, 15) + bytes(15), "cannot hold a writer id"),
        (block(OTHER, EV1) + block_end(OTHER, 13, b"", 1, 1), f"writer {OTHER}, which is not"),
        (block(WRITER, EV1) + VECTORS["keepalive"], "KEEP_ALIVE following an append block"),
        (block(WRITER, EV1) + header(77, 0), "type 77 following an append block"),
        (block(WRITER, EV1) + header(4, 0x01000000), "length 16777216"),
        (block(WRITER, EV1) + block_end(OTHER, 13, b"", 1, 1), "names another writer"),
        (block(WRITER, EV1) + header(4, 35) + WRITER.bytes + bytes(19), "ends inside"),
        (block(WRITER, EV1) + block_end(WRITER, 14, b"", 1, 1), "sizeOfWholeEvents 14"),
        (block(WRITER, EV1) + block_end(WRITER, -1, b"", 1, 1), "sizeOfWholeEvents -1"),
        (block(WRITER, EV1) + block_end(WRITER, 13, b"", 0, 1), "0 events"),
        (block(WRITER, EV1) + block_end(WRITER, 13, b"", -3, 1), "-3 events"),
        (block(WRITER, EV1) + block_end(WRITER, 13, b"", 2, 2), "says it holds 2"),
        (block(WRITER, EV1 + EV1) + block_end(WRITER, 26, b"", 1, 1), "2 events says it holds 1"),
        # The rest of the block is neither a PartialEvent nor a Padding.
        (
            block(WRITER, EV1 + VECTORS["keepalive"]) + block_end(WRITER, 13, b"", 1, 1),
            "KEEP_ALIVE after the whole events",
        ),
        (
            block(WRITER, EV1 + EV1) + block_end(WRITER, 13, b"", 1, 1),
            "EVENT after the whole events",
        ),
        (block(WRITER, EV1 + b"\xff" * 5) + block_end(WRITER, 13, b"", 1, 1), "5 bytes after"),
        # A PartialEvent or Padding whose length is not the rest of the block.
        (
            block(WRITER, EV1 + header(-2, 4) + b"abcde") + block_end(WRITER, 13, b"", 1, 1),
            "PARTIAL_EVENT of 4 bytes in the 5",
        ),
        (
            block(WRITER, EV1 + header(-1, 6) + bytes(5)) + block_end(WRITER, 13, b"", 1, 1),
            "PADDING of 6 bytes in the 5",
        ),
        # A Padding requires an empty end.
        (
            VECTORS["padded_block"] + block_end(WRITER, 13, b"x", 1, 1),
            "padded block's end carries 1 bytes",
        ),
        # The reassembled data must be event frames.
        (
            block(WRITER, header(-1, 0) + bytes(5), 16 + 13) + block_end(WRITER, 13, b"", 1, 1),
            "PADDING where an event frame was expected",
        ),
        (block(WRITER, EV1[:-1]) + block_end(WRITER, 12, b"", 1, 1), "frame at byte 0 is cut"),
        (block(WRITER, EV1) + block_end(WRITER, 13, b"tail", 2, 2), "frame at byte 13 is cut"),
        (block(WRITER, header(0, -5)) + block_end(WRITER, 8, b"", 1, 1), "event of -5 bytes"),
        (
            block(WRITER, ev(b"a") + header(-2, 8) + header(0, 2))
            + block_end(WRITER, 9, b"xyz", 2, 2),
            "frame at byte 19 is cut",
        ),
    ],
)
def test_bad_input_is_refused(data: bytes, match: str) -> None:
    error = refused(server_for(), data, match)
    assert isinstance(error.reply, ErrorMessage)
    assert error.reply.message  # it says why


def test_refused_before_the_rest_of_a_block_arrives() -> None:
    # An unknown writer: the block header is enough.
    conn = server_for()
    refused(conn, header(3, 1000) + OTHER.bytes, "not set up")
    # A block followed by anything but its end: that header is enough.
    conn = server_for()
    refused(conn, block(WRITER, EV1) + VECTORS["keepalive"][:8], "following an append block")
    # A length over the limit: the header is enough.
    conn = server_for()
    refused(conn, header(9, 2**24), "READ_SEGMENT of length 16777216")


def test_a_block_before_append_setup_is_refused() -> None:
    conn = ServerCodec()
    conn.receive_data(setup())
    drain(conn)  # SetupAppend returned, not answered yet
    refused(conn, BLOCKS["single"][0], "not set up")


def test_limits_are_checked() -> None:
    small = Limits(max_command=100, max_event=8 + 4, max_writers=2)
    conn = server_for(limits=small)
    conn.receive_data(block(WRITER, ev(b"abcd")) + block_end(WRITER, 12, b"", 1, 1))
    assert len(drain(conn)) == 1
    refused(
        conn, block(WRITER, ev(b"abcde")) + block_end(WRITER, 13, b"", 1, 2), "event of 5 bytes"
    )
    refused(server_for(limits=small), block(WRITER, bytes(85)), "length 101")
    conn = server_for(WRITER, OTHER, limits=small)
    error = refused(conn, setup(UUID(int=3), 9, "third"), "more than 2 writers")
    assert error.reply == ErrorMessage(9, "third", "too many writers")
    # Setting a writer up again does not count twice.
    conn = server_for(WRITER, OTHER, limits=small)
    conn.receive_data(setup(WRITER, 5))
    assert drain(conn) == [SetupAppend(5, WRITER, SEGMENT, "")]
    with pytest.raises(ValueError, match="may not exceed"):
        Limits(max_command=2**24)
    with pytest.raises(ValueError, match="non-negative"):
        Limits(max_writers=-1)


@pytest.mark.parametrize(
    ("hello", "compatible"),
    [
        (Hello(17, 5), True),
        (Hello(5, 5), True),
        (Hello(30, 17), True),
        (Hello(99, 1), True),
        (Hello(4, 1), False),  # client.high < 5
        (Hello(30, 18), False),  # client.low > 17
    ],
)
def test_hello_version_ranges(hello: Hello, compatible: bool) -> None:
    assert hello.compatible is compatible
    conn = ServerCodec()
    if compatible:
        conn.receive_data(encode(hello))
        assert drain(conn) == [hello]
        assert conn.send(Hello()) == VECTORS["hello"]
        return
    error = refused(conn, encode(hello), "not compatible")
    assert error.reply == Hello(17, 5)  # the driver answers with our range, then closes


def test_end_of_input_drops_a_partial_block() -> None:
    wire = BLOCKS["batched"][0]
    for cut in range(1, len(wire)):
        conn = server_for()
        conn.receive_data(wire[:cut])
        assert drain(conn) == []
        # What the receive buffer really takes: the bytes and the bytearray's spare room.
        assert cut <= conn.held_bytes <= 2 * cut + 64
        conn.receive_data(b"")
        assert drain(conn) == [ConnectionClosed()]
        assert conn.state is CodecState.CLOSED
        assert conn.next_event() == ConnectionClosed()
        assert conn.held_bytes == 0


# -- what send refuses --------------------------------------------------------------------


def test_append_setup_must_answer_a_setup_append() -> None:
    conn = ServerCodec()
    with pytest.raises(LocalProtocolError, match="sent no SetupAppend"):
        conn.send(AppendSetup(1, SEGMENT, WRITER, NULL_EVENT_NUMBER))
    conn.receive_data(setup(WRITER, 4))
    drain(conn)
    with pytest.raises(LocalProtocolError, match="does not answer"):
        conn.send(AppendSetup(4, "another", WRITER, NULL_EVENT_NUMBER))
    with pytest.raises(LocalProtocolError, match="does not answer"):
        conn.send(AppendSetup(5, SEGMENT, WRITER, NULL_EVENT_NUMBER))
    conn.send(AppendSetup(4, SEGMENT, WRITER, NULL_EVENT_NUMBER))
    with pytest.raises(LocalProtocolError, match="sent no SetupAppend"):  # answered once
        conn.send(AppendSetup(4, SEGMENT, WRITER, NULL_EVENT_NUMBER))


def test_an_error_reply_drops_the_pending_setup() -> None:
    conn = ServerCodec()
    conn.receive_data(setup(WRITER, 4))
    drain(conn)
    assert conn.send(NoSuchSegment(4, SEGMENT)) == encode(NoSuchSegment(4, SEGMENT))
    with pytest.raises(LocalProtocolError, match="sent no SetupAppend"):
        conn.send(AppendSetup(4, SEGMENT, WRITER, NULL_EVENT_NUMBER))
    refused(conn, BLOCKS["single"][0], "not set up")


def test_data_appended_is_checked() -> None:
    conn = server_for()
    with pytest.raises(LocalProtocolError, match="not set up"):
        conn.send(DataAppended(OTHER, 1, NULL_EVENT_NUMBER))
    with pytest.raises(LocalProtocolError, match="not pass"):  # nothing received yet
        conn.send(DataAppended(WRITER, 1, NULL_EVENT_NUMBER))
    conn.receive_data(block(WRITER, EV1 * 3) + block_end(WRITER, 39, b"", 3, 3))
    drain(conn)
    with pytest.raises(LocalProtocolError, match="not pass 3"):
        conn.send(DataAppended(WRITER, 4, NULL_EVENT_NUMBER))
    with pytest.raises(LocalProtocolError, match="the last ack was"):
        conn.send(DataAppended(WRITER, 2, 1))
    conn.send(DataAppended(WRITER, 2, NULL_EVENT_NUMBER))  # acks may cover part of a block
    with pytest.raises(LocalProtocolError, match="must rise above 2"):
        conn.send(DataAppended(WRITER, 2, 2))
    with pytest.raises(LocalProtocolError, match="the last ack was 2"):
        conn.send(DataAppended(WRITER, 3, NULL_EVENT_NUMBER))
    conn.send(DataAppended(WRITER, 3, 2))


@pytest.mark.parametrize(
    "command",
    [
        SetupAppend(1, WRITER, SEGMENT),
        ReadSegment(SEGMENT, 0, 10),
        AppendBlock(WRITER, EV1),
        Event(b"x"),
    ],
)
def test_a_server_does_not_send_requests(command: Any) -> None:
    with pytest.raises(LocalProtocolError, match="a server does not send"):
        ServerCodec().send(command)


def test_invalid_event_number_forgets_the_writer() -> None:
    conn = server_for()
    conn.send(InvalidEventNumber(WRITER, 1, "", 1))
    refused(conn, BLOCKS["single"][0], "not set up")


# -- properties: whatever the client writer does, the server gets exactly its events ------


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 200), min_size=1, max_size=40),
    block_size=st.one_of(st.just(0), st.integers(1, 400)),
    cuts=st.lists(st.integers(1, 10), max_size=10),
    closes=st.lists(st.booleans(), max_size=10),
    chunking=st.lists(st.integers(1, 300), max_size=30),
)
def test_the_server_reassembles_what_the_client_wrote(
    sizes: list[int],
    block_size: int,
    cuts: list[int],
    closes: list[bool],
    chunking: list[int],
) -> None:
    payloads = [bytes([i % 251]) * size for i, size in enumerate(sizes)]
    client = ClientCodec(block_size=block_size)
    store = Store(ServerCodec())
    store.feed([client.send(SetupAppend(1, WRITER, SEGMENT))], eof=False)
    client.receive_data(bytes(store.out))
    assert isinstance(client.next_event(), AppendSetup)
    del store.out[:]
    wire = bytearray()
    # Append in groups of the drawn sizes, closing the open block now and then.
    done = 0
    for i, cut in enumerate([*cuts, len(payloads)]):
        group = payloads[done : done + cut]
        if not group:
            break
        done += len(group)
        wire += client.append(WRITER, group, done)
        if i < len(closes) and closes[i]:
            wire += client.close_block()
    wire += client.send(KeepAlive())  # closes a block still open
    assert not client.block_open
    # Feed it to the server in the drawn chunks.
    chunks, p = [], 0
    for n in chunking:
        chunks.append(bytes(wire[p : p + n]))
        p += n
    chunks.append(bytes(wire[p:]))
    events = store.feed(chunks)
    appends = [e for e in events if isinstance(e, Append)]
    assert bytes(store.segment) == b"".join(ev(p) for p in payloads)
    assert sum(a.event_count for a in appends) == len(payloads)
    following = 0
    for a in appends:
        assert a.last_event_number - a.event_count == following  # contiguous numbers
        following = a.last_event_number
    assert following == len(payloads)
    assert events[-2:] == [KeepAlive(), ConnectionClosed()]
    # And the acks the store sent are what the client expects.
    client.receive_data(bytes(store.out))
    replies = []
    while (reply := client.next_event()) is not NEED_DATA:
        replies.append(reply)
    acks = [r.event_number for r in replies if isinstance(r, DataAppended)]
    assert acks == [a.last_event_number for a in appends]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 60)), min_size=1, max_size=30))
def test_writers_interleave_on_one_connection(plan: list[tuple[bool, int]]) -> None:
    client = ClientCodec(block_size=100)
    wire = bytearray()
    for i, writer in enumerate((WRITER, OTHER)):
        wire += client.send(SetupAppend(i + 1, writer, f"segment-{i}"))
        client.receive_data(encode(AppendSetup(i + 1, f"segment-{i}", writer, NULL_EVENT_NUMBER)))
        client.next_event()
    numbers = {WRITER: 0, OTHER: 0}
    written: dict[UUID, bytearray] = {WRITER: bytearray(), OTHER: bytearray()}
    for other, size in plan:
        writer = OTHER if other else WRITER
        numbers[writer] += 1
        wire += client.append(writer, [bytes(size)], numbers[writer])
        written[writer] += ev(bytes(size))
    wire += client.close_block()
    store = Store(ServerCodec())
    events = store.feed([bytes(wire)])
    got: dict[UUID, bytearray] = {WRITER: bytearray(), OTHER: bytearray()}
    for event in events:
        if isinstance(event, Append):
            got[event.writer_id] += event.data
            assert event.segment == ("segment-1" if event.writer_id == OTHER else "segment-0")
    assert got == written


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_garbage_only_ever_raises_protocol_errors(garbage: bytes) -> None:
    conn = server_for()
    conn.receive_data(garbage)
    error: SegmentProtocolError | None = None
    try:
        drain(conn)
    except SegmentProtocolError as e:
        error = e
    if error is not None:
        assert error.reply is not None
        assert conn.state is CodecState.ERROR


# -- performance --------------------------------------------------------------------------


def test_a_256_kib_block_of_1_kib_events_parses_well_under_a_millisecond() -> None:
    payload = bytes(1024 - 8)
    client = ClientCodec(block_size=256 * 1024)
    client.send(SetupAppend(1, WRITER, SEGMENT))
    client.receive_data(encode(AppendSetup(1, SEGMENT, WRITER, NULL_EVENT_NUMBER)))
    client.next_event()
    conn = server_for()
    best = float("inf")
    for i in range(20):
        wire = client.append(WRITER, [payload] * 256, 256 * (i + 1)) + client.close_block()
        conn.receive_data(wire)
        start = time.perf_counter()
        append = conn.next_event()
        best = min(best, time.perf_counter() - start)
        assert isinstance(append, Append)
        assert append.event_count == 256
        assert len(append.data) == 256 * 1024
    assert best < 1e-3, f"{best * 1e6:.0f} µs per block"


def test_held_bytes_is_what_a_partial_command_really_takes() -> None:
    """A command arriving in small reads grows the receive buffer with spare room; the
    memory budget is charged that, not only the bytes received."""
    conn = ServerCodec()
    wire = encode(SetupAppend(1, WRITER, "n" * 60_000))[:59_000]
    for i in range(0, len(wire), 1000):
        conn.receive_data(wire[i : i + 1000])
    assert drain(conn) == []
    assert len(wire) < conn.held_bytes <= 2 * len(wire)
