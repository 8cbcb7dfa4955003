"""ttrpc's wire layer: frame bytes, the frame reader (split anywhere, oversize
frames skipped without buffering), and the protobuf messages against the bytes
observed from containerd's Go server (research ttrpc.md §1-§3)."""

from __future__ import annotations

import pytest
from google.protobuf import any_pb2, wrappers_pb2
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.errors import LocalProtocolError
from gateway.sdk import NEED_DATA, ConnectionClosed
from protocols.ttrpc import (
    MAX_DATA,
    Code,
    Flags,
    Frame,
    FrameReader,
    MessageType,
    Oversize,
    Status,
    TtrpcError,
    encode_frame,
    status_of,
    ttrpc_pb2,
)
from protocols.ttrpc import status as statuses


def feed(reader: FrameReader, data: bytes) -> None:
    """Receive ``data`` (``b""`` would mean the end of input: not fed)."""
    if data:
        reader.receive_data(data)


def drain(reader: FrameReader) -> list[object]:
    out: list[object] = []
    while (event := reader.next_event()) is not NEED_DATA:
        out.append(event)
        if isinstance(event, ConnectionClosed):
            break
    return out


def test_a_frame_header_is_length_id_type_flags_big_endian() -> None:
    assert encode_frame(1, MessageType.REQUEST, 0, b"abc") == bytes.fromhex(
        "00000003000000010100616263"
    )
    # A server-streaming close: Data, remote closed | no data, no bytes.
    assert encode_frame(7, MessageType.DATA, Flags.REMOTE_CLOSED | Flags.NO_DATA) == bytes.fromhex(
        "00000000000000070305"
    )


def test_sends_over_4_mib_are_refused_locally_with_go_s_text() -> None:
    encode_frame(1, MessageType.REQUEST, 0, bytes(MAX_DATA))  # exactly the limit is fine
    with pytest.raises(LocalProtocolError, match="message length 4194305 exceed maximum"):
        encode_frame(1, MessageType.REQUEST, 0, bytes(MAX_DATA + 1))
    with pytest.raises(LocalProtocolError):
        encode_frame(2**32, MessageType.REQUEST, 0)


STREAM = b"".join(
    [
        encode_frame(1, MessageType.REQUEST, 0, b"request"),
        encode_frame(3, MessageType.REQUEST, Flags.REMOTE_OPEN),
        encode_frame(3, MessageType.DATA, 0),  # zero bytes without NO_DATA: a message
        encode_frame(3, MessageType.DATA, Flags.REMOTE_CLOSED | Flags.NO_DATA),
        encode_frame(5, 0x07, 0x80, b"?"),  # an unknown type is the caller's to ignore
        encode_frame(1, MessageType.RESPONSE, 0, bytes.fromhex("12040a026869")),
    ]
)
EXPECTED = [
    Frame(1, MessageType.REQUEST, 0, b"request"),
    Frame(3, MessageType.REQUEST, Flags.REMOTE_OPEN, b""),
    Frame(3, MessageType.DATA, 0, b""),
    Frame(3, MessageType.DATA, Flags.REMOTE_CLOSED | Flags.NO_DATA, b""),
    Frame(5, 0x07, 0x80, b"?"),
    Frame(1, MessageType.RESPONSE, 0, bytes.fromhex("12040a026869")),
]


def test_frames_split_at_every_byte() -> None:
    for cut in range(len(STREAM) + 1):
        reader = FrameReader()
        feed(reader, STREAM[:cut])
        events = drain(reader)
        feed(reader, STREAM[cut:])
        events += drain(reader)
        assert events == EXPECTED, cut
    reader = FrameReader()
    events = []
    for i in range(len(STREAM)):
        reader.receive_data(STREAM[i : i + 1])
        events += drain(reader)
    assert events == EXPECTED


def test_the_end_of_input_drops_a_partial_frame() -> None:
    reader = FrameReader()
    reader.receive_data(STREAM[:-3])
    reader.receive_data(b"")
    assert drain(reader) == [*EXPECTED[:-1], ConnectionClosed()]
    assert reader.next_event() == ConnectionClosed()


def test_an_oversize_frame_is_reported_and_skipped_without_buffering_it() -> None:
    length = MAX_DATA + 1
    wire = (
        encode_frame(1, MessageType.REQUEST, 0, b"a")
        + (length).to_bytes(4, "big")
        + (3).to_bytes(4, "big")
        + bytes([MessageType.REQUEST, 0])
        + bytes(length)
        + encode_frame(5, MessageType.REQUEST, 0, bytes(MAX_DATA))  # exactly the limit
    )
    reader = FrameReader()
    events: list[object] = []
    held = 0
    for i in range(0, len(wire), 65536):
        reader.receive_data(wire[i : i + 65536])
        events += drain(reader)
        if not reader.skipping:
            continue
        held = max(held, reader.held_bytes)
    assert held == 0  # skipped data is dropped as it arrives
    assert events[0] == Frame(1, MessageType.REQUEST, 0, b"a")
    assert events[1] == Oversize(3, MessageType.REQUEST, 0, length)
    assert events[2] == Frame(5, MessageType.REQUEST, 0, bytes(MAX_DATA))
    assert len(events) == 3


frames = st.builds(
    Frame,
    st.integers(0, 2**32 - 1),
    st.integers(0, 255),
    st.integers(0, 255),
    st.binary(max_size=64),
)


@settings(max_examples=200)
@given(st.lists(frames, max_size=8), st.lists(st.integers(1, 40), max_size=30))
def test_any_frames_cut_anyhow_come_back(sent: list[Frame], cuts: list[int]) -> None:
    wire = b"".join(encode_frame(f.stream_id, f.type, f.flags, f.data) for f in sent)
    reader = FrameReader()
    got: list[object] = []
    pos = 0
    for size in [*cuts, len(wire)]:
        feed(reader, wire[pos : pos + size])
        pos += size
        got += drain(reader)
    assert got == sent
    assert reader.held_bytes == 0


# -- messages and status --------------------------------------------------------------


def test_an_ok_response_omits_the_status() -> None:
    # Echo("hi") answered by the Go server: payload only (StringValue "hi").
    payload = wrappers_pb2.StringValue(value="hi").SerializeToString()
    assert ttrpc_pb2.Response(payload=payload).SerializeToString() == bytes.fromhex("12040a026869")
    assert status_of(ttrpc_pb2.Response.FromString(bytes.fromhex("12040a026869"))).ok
    assert status_of(ttrpc_pb2.Response()).ok  # a zero-length Response frame
    # ttrpc-rust says OK explicitly: Status{code: 0} ("0a 00").
    assert status_of(ttrpc_pb2.Response.FromString(bytes.fromhex("0a00"))).ok


def test_the_go_server_s_unknown_service_reply_byte_for_byte() -> None:
    response = ttrpc_pb2.Response(status=statuses.unknown_service("nope.Svc").to_pb())
    assert response.SerializeToString() == bytes.fromhex("0a14080c1210") + b"service nope.Svc"
    status = status_of(ttrpc_pb2.Response.FromString(response.SerializeToString()))
    assert status == Status(Code.UNIMPLEMENTED, "service nope.Svc")


def test_a_request_encodes_with_ttrpc_s_field_numbers() -> None:
    request = ttrpc_pb2.Request(
        service="a.B",
        method="M",
        payload=b"hi",
        timeout_nano=5,
        metadata=[ttrpc_pb2.KeyValue(key="k", value="v")],
    )
    # Tags 0a service, 12 method, 1a payload, 20 timeout, 2a KeyValue{0a key, 12 value}.
    assert request.SerializeToString() == bytes.fromhex(
        "0a03612e4212014d1a02686920052a060a016b120176"
    )


def test_errors_carry_code_message_and_details() -> None:
    detail = any_pb2.Any(type_url="type.googleapis.com/x.Y", value=b"\x08\x01")
    status = Status(Code.NOT_FOUND, "no such thing", (detail,))
    back = Status.from_pb(ttrpc_pb2.Status.FromString(status.to_pb().SerializeToString()))
    assert back == status
    error = back.error()
    assert isinstance(error, TtrpcError)
    assert (error.code, error.message, error.details) == (
        Code.NOT_FOUND,
        "no such thing",
        (detail,),
    )
    assert str(error) == "NOT_FOUND: no such thing"
    assert str(TtrpcError(99, "odd")) == "code 99: odd"  # a code this side does not know


def test_the_go_server_s_texts_for_bad_input() -> None:
    assert statuses.oversize(4194305) == Status(
        Code.RESOURCE_EXHAUSTED, "message length 4194305 exceed maximum message size of 4194304"
    )
    assert statuses.id_not_odd().message == "StreamID must be odd for client initiated streams"
    assert statuses.id_reused().message == "StreamID cannot be re-used and must increment"
    assert statuses.stream_inactive().message == "StreamID is no longer active"
    assert statuses.stream_closed() == Status(
        Code.INVALID_ARGUMENT, "data handling error: ttrpc: stream closed"
    )
    assert statuses.unknown_method("Nope") == Status(Code.UNIMPLEMENTED, "method Nope")
    assert statuses.deadline_exceeded() == Status(
        Code.DEADLINE_EXCEEDED, "context deadline exceeded"
    )


def test_held_bytes_is_what_a_partial_frame_really_takes() -> None:
    """A frame arriving in small reads grows the receive buffer with spare room; the
    memory budget is charged that, not only the bytes received."""
    reader = FrameReader()
    wire = encode_frame(1, 1, 0, b"x" * 150_000)[:120_000]
    for i in range(0, len(wire), 1000):
        reader.receive_data(wire[i : i + 1000])
    assert reader.frames() == []
    assert len(wire) < reader.held_bytes <= 2 * len(wire)
