"""The sans-IO server connection: the four call kinds as Go's client puts them on the
wire (research ttrpc.md §4.2), and every bad-input case of §3 answered on its stream
with the Go server's status while the connection goes on."""

from __future__ import annotations

import pytest

from gateway.core.errors import LocalProtocolError
from gateway.sdk import NEED_DATA, ConnectionClosed
from protocols.ttrpc import (
    Code,
    Flags,
    Frame,
    FrameReader,
    MessageType,
    encode_frame,
    status_of,
    ttrpc_pb2,
)
from protocols.ttrpc import status as statuses
from protocols.ttrpc.codec import ServerCodec, StreamState
from protocols.ttrpc.events import BadInput, Call, HalfClosed, Message

RC, RO, ND = Flags.REMOTE_CLOSED, Flags.REMOTE_OPEN, Flags.NO_DATA
REQ, RESP, DATA = MessageType.REQUEST, MessageType.RESPONSE, MessageType.DATA


def request(sid: int, flags: int = 0, payload: bytes = b"", method: str = "M") -> bytes:
    body = ttrpc_pb2.Request(service="svc.S", method=method, payload=payload)
    return encode_frame(sid, REQ, flags, body.SerializeToString())


def events(conn: ServerCodec, data: bytes) -> list[object]:
    if data:
        conn.receive_data(data)
    out: list[object] = []
    while (event := conn.next_event()) is not NEED_DATA:
        out.append(event)
        if isinstance(event, ConnectionClosed):
            break
    return out


def frames(data: bytes) -> list[Frame]:
    reader = FrameReader()
    reader.receive_data(data)
    out: list[Frame] = []
    while isinstance(frame := reader.next_event(), Frame):
        out.append(frame)
    return out


def answer(data: bytes) -> tuple[int, ttrpc_pb2.Response]:
    (frame,) = frames(data)
    assert (frame.type, frame.flags) == (RESP, 0)
    return frame.stream_id, ttrpc_pb2.Response.FromString(frame.data)


def test_unary_a_request_and_one_response_without_status() -> None:
    conn = ServerCodec()
    (call,) = events(conn, request(1, 0, b"hi"))
    assert isinstance(call, Call)
    assert (call.stream_id, call.request.payload, call.client_streams) == (1, b"hi", False)
    assert conn.stream_state(1) is StreamState.REMOTE_CLOSED
    wire = conn.respond(1, b"\x0a\x02hi")
    assert wire == encode_frame(1, RESP, 0, bytes.fromhex("12040a026869"))
    assert conn.stream_state(1) is None
    with pytest.raises(LocalProtocolError):
        conn.respond(1)  # one Response per stream
    # Data for the finished stream is answered, not forwarded or fatal.
    assert events(conn, encode_frame(1, DATA, 0, b"late")) == [
        BadInput(1, statuses.stream_inactive())
    ]


def test_a_unary_stream_takes_no_data_either_way() -> None:
    conn = ServerCodec()
    events(conn, request(1))
    with pytest.raises(LocalProtocolError):
        conn.send_data(1, b"x")
    assert events(conn, encode_frame(1, DATA, 0, b"x")) == [BadInput(1, statuses.stream_inactive())]


def test_server_streaming_ends_with_data_remote_closed_no_data() -> None:
    conn = ServerCodec()
    (call,) = events(conn, request(3, RC, b""))  # an empty request is still the message
    assert isinstance(call, Call)
    assert not call.client_streams
    assert call.request.payload == b""
    assert conn.send_data(3, b"") == encode_frame(3, DATA, 0)  # 0 bytes: a message
    assert conn.send_data(3, b"two") == encode_frame(3, DATA, 0, b"two")
    assert conn.send_data(3, None, close=True) == bytes.fromhex("00000000000000030305")
    assert conn.stream_state(3) is None
    with pytest.raises(LocalProtocolError):
        conn.send_data(3, b"more")


def test_server_streaming_fails_with_a_response_carrying_the_status() -> None:
    conn = ServerCodec()
    events(conn, request(1, RC))
    conn.send_data(1, b"one")
    sid, response = answer(conn.respond(1, status=statuses.Status(Code.NOT_FOUND, "gone")))
    assert sid == 1
    assert status_of(response) == statuses.Status(Code.NOT_FOUND, "gone")
    assert response.payload == b""


def test_client_streaming_messages_then_close_then_one_response() -> None:
    conn = ServerCodec()
    wire = (
        request(5, RO)
        + encode_frame(5, DATA, 0, b"a")
        + encode_frame(5, DATA, 0)  # a zero-length message, not "no data"
        + encode_frame(5, DATA, RC | ND)
    )
    got = events(conn, wire)
    assert isinstance(got[0], Call)
    assert got[0].client_streams
    assert got[1:] == [Message(5, b"a"), Message(5, b""), HalfClosed(5)]
    assert conn.stream_state(5) is StreamState.REMOTE_CLOSED
    sid, response = answer(conn.respond(5, b"sum"))
    assert (sid, response.payload, response.HasField("status")) == (5, b"sum", False)


def test_ttrpc_rust_s_client_streaming_request_with_no_data_flag() -> None:
    conn = ServerCodec()
    (call,) = events(conn, request(1, RO | ND))
    assert isinstance(call, Call)
    assert call.client_streams


def test_bidi_both_sides_stream_and_close() -> None:
    conn = ServerCodec()
    events(conn, request(1, RO))
    assert events(conn, encode_frame(1, DATA, 0, b"ping")) == [Message(1, b"ping")]
    assert conn.send_data(1, b"pong") == encode_frame(1, DATA, 0, b"pong")
    assert events(conn, encode_frame(1, DATA, RC | ND)) == [HalfClosed(1)]
    conn.send_data(1, None, close=True)
    assert conn.active_streams == 0


def test_a_close_carrying_a_message_delivers_it_then_closes() -> None:
    conn = ServerCodec()
    events(conn, request(1, RO))
    assert events(conn, encode_frame(1, DATA, RC, b"last")) == [
        Message(1, b"last"),
        HalfClosed(1),
    ]
    assert events(conn, encode_frame(1, DATA, 0, b"after")) == [
        BadInput(1, statuses.stream_inactive())
    ]


def test_no_data_without_close_says_nothing() -> None:
    conn = ServerCodec()
    events(conn, request(1, RO))
    assert events(conn, encode_frame(1, DATA, ND)) == []
    assert conn.stream_state(1) is StreamState.OPEN


@pytest.mark.parametrize(
    ("wire", "expected"),
    [
        (request(2), BadInput(2, statuses.id_not_odd())),
        (encode_frame(4, DATA, 0, b"x"), BadInput(4, statuses.id_not_odd())),
        (encode_frame(9, DATA, 0, b"x"), BadInput(9, statuses.stream_inactive())),
    ],
)
def test_bad_ids_are_answered_on_their_stream(wire: bytes, expected: BadInput) -> None:
    conn = ServerCodec()
    assert events(conn, wire) == [expected]
    (call,) = events(conn, request(11))  # and the connection goes on
    assert isinstance(call, Call)


def test_ids_rise_with_gaps_allowed_and_are_never_reused() -> None:
    conn = ServerCodec()
    events(conn, request(1) + request(7))
    assert events(conn, request(5)) == [BadInput(5, statuses.id_reused())]
    assert events(conn, request(7)) == [BadInput(7, statuses.id_reused())]
    assert [type(e) for e in events(conn, request(9))] == [Call]


def test_an_undecodable_request_and_an_empty_one() -> None:
    conn = ServerCodec()
    (bad,) = events(conn, encode_frame(1, REQ, 0, b"\xff\xff\xff"))
    assert isinstance(bad, BadInput)
    assert bad.status.code == Code.INVALID_ARGUMENT
    assert bad.status.message.startswith("unmarshal request error: ")
    # An empty Request decodes to an empty service name: routing answers it.
    (call,) = events(conn, encode_frame(3, REQ, 0))
    assert isinstance(call, Call)
    assert call.request.service == ""


def test_unknown_frame_types_and_a_client_response_are_ignored() -> None:
    conn = ServerCodec()
    wire = encode_frame(1, 0x07, 0, b"future") + encode_frame(1, RESP, 0) + request(3)
    assert [type(e) for e in events(conn, wire)] == [Call]


def test_oversize_frames_are_refused_on_their_stream_and_the_connection_goes_on() -> None:
    conn = ServerCodec(max_data=16)
    events(conn, request(1, RO))
    big = (17).to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes([DATA, 0]) + bytes(17)
    (bad,) = events(conn, big)
    assert bad == BadInput(1, statuses.oversize(17), ends_stream=True)
    assert conn.stream_state(1) is None  # its Response is the reply
    sid, response = answer(conn.reply(bad))
    assert sid == 1
    assert status_of(response).code == Code.RESOURCE_EXHAUSTED
    # An oversize Request opens nothing; the next one is served.
    too_big_request = (17).to_bytes(4, "big") + (3).to_bytes(4, "big") + bytes([REQ, 0])
    assert events(conn, too_big_request + bytes(17) + request(5)) == [
        BadInput(3, statuses.oversize(17)),
        events_call(5),
    ]


def events_call(sid: int) -> Call:
    return Call(sid, ttrpc_pb2.Request(service="svc.S", method="M"), 0, False)


def test_a_conversation_split_at_every_byte() -> None:
    wire = (
        request(1, 0, b"u")
        + request(3, RO)
        + encode_frame(3, DATA, 0, b"m")
        + encode_frame(3, DATA, RC | ND)
        + request(2)
        + encode_frame(3, DATA, 0, b"late")
    )
    expected = events(ServerCodec(), wire)
    assert len(expected) == 6
    for cut in range(1, len(wire)):
        conn = ServerCodec()
        assert events(conn, wire[:cut]) + events(conn, wire[cut:]) == expected, cut


def test_the_end_of_input_is_reported() -> None:
    conn = ServerCodec()
    conn.receive_data(request(1)[:-1])
    conn.receive_data(b"")
    assert conn.next_event() == ConnectionClosed()
