"""The sans-IO client connection: what each call kind puts on the wire (as Go's client
does, research ttrpc.md §4.2), replies turned into events, late and oversize frames,
and both codecs talking to each other for every call kind."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.errors import LocalProtocolError
from gateway.sdk import NEED_DATA, ConnectionClosed
from protocols.ttrpc import (
    Code,
    Flags,
    Frame,
    FrameReader,
    MessageType,
    Status,
    encode_frame,
    ttrpc_pb2,
)
from protocols.ttrpc import status as statuses
from protocols.ttrpc.codec import CallKind, ClientCodec, ServerCodec
from protocols.ttrpc.events import Call, HalfClosed, Message, Reply, StreamMessage

RC, RO, ND = Flags.REMOTE_CLOSED, Flags.REMOTE_OPEN, Flags.NO_DATA
REQ, RESP, DATA = MessageType.REQUEST, MessageType.RESPONSE, MessageType.DATA
OK = Status(Code.OK)


def frame_of(wire: bytes) -> Frame:
    reader = FrameReader()
    reader.receive_data(wire)
    frame = reader.next_event()
    assert isinstance(frame, Frame)
    assert reader.next_event() is NEED_DATA
    return frame


def events(conn: ClientCodec | ServerCodec, data: bytes) -> list[object]:
    if data:
        conn.receive_data(data)
    out: list[object] = []
    while (event := conn.next_event()) is not NEED_DATA:
        out.append(event)
        if isinstance(event, ConnectionClosed):
            break
    return out


def response(payload: bytes = b"", status: Status | None = None) -> bytes:
    body = ttrpc_pb2.Response(payload=payload)
    if status is not None:
        body.status.CopyFrom(status.to_pb())
    return body.SerializeToString()


def test_ids_are_odd_and_rise_by_two() -> None:
    conn = ClientCodec()
    ids = [conn.start(CallKind.UNARY, "s.S", "M")[0] for _ in range(4)]
    assert ids == [1, 3, 5, 7]


def test_what_each_kind_sends_first() -> None:
    conn = ClientCodec()
    _sid, wire = conn.start(
        CallKind.UNARY, "svc.S", "Echo", b"hi", timeout_nano=10**8, metadata=[("k", "v")]
    )
    frame = frame_of(wire)
    assert (frame.stream_id, frame.type, frame.flags) == (1, REQ, 0)
    request = ttrpc_pb2.Request.FromString(frame.data)
    assert (request.service, request.method, request.payload) == ("svc.S", "Echo", b"hi")
    assert request.timeout_nano == 10**8
    assert [(kv.key, kv.value) for kv in request.metadata] == [("k", "v")]
    assert frame_of(conn.start(CallKind.SERVER_STREAMING, "s.S", "M", b"")[1]).flags == RC
    for kind in (CallKind.CLIENT_STREAMING, CallKind.BIDI):
        frame = frame_of(conn.start(kind, "s.S", "M")[1])
        assert frame.flags == RO
        assert ttrpc_pb2.Request.FromString(frame.data).payload == b""
        with pytest.raises(LocalProtocolError):
            conn.start(kind, "s.S", "M", b"inline")


def test_unary_reply_ok_and_error() -> None:
    conn = ClientCodec()
    conn.start(CallKind.UNARY, "s.S", "M")
    conn.start(CallKind.UNARY, "s.S", "M")
    wire = encode_frame(3, RESP, 0, response(b"r")) + encode_frame(
        1, RESP, 0, response(status=Status(Code.NOT_FOUND, "no"))
    )
    assert events(conn, wire) == [  # in completion order, not call order
        Reply(3, OK, b"r"),
        Reply(1, Status(Code.NOT_FOUND, "no"), b""),
    ]
    assert conn.active_streams == 0


def test_server_streaming_messages_then_the_close() -> None:
    conn = ClientCodec()
    sid, _ = conn.start(CallKind.SERVER_STREAMING, "s.S", "M", b"q")
    wire = (
        encode_frame(sid, DATA, 0, b"a")
        + encode_frame(sid, DATA, 0)  # a zero-length message
        + encode_frame(sid, DATA, RC | ND)
    )
    assert events(conn, wire) == [
        StreamMessage(sid, b"a"),
        StreamMessage(sid, b""),
        Reply(sid, OK, None),
    ]
    with pytest.raises(LocalProtocolError):
        conn.send(sid, b"x")  # a server-streaming call sends nothing after its Request


def test_client_streaming_sends_data_and_closes() -> None:
    conn = ClientCodec()
    sid, _ = conn.start(CallKind.CLIENT_STREAMING, "s.S", "M")
    assert conn.send(sid, b"a") == encode_frame(sid, DATA, 0, b"a")
    assert conn.close_send(sid) == bytes.fromhex("00000000000000010305")
    with pytest.raises(LocalProtocolError):
        conn.send(sid, b"b")
    assert events(conn, encode_frame(sid, RESP, 0, response(b"sum"))) == [Reply(sid, OK, b"sum")]


def test_a_server_that_answers_early_ends_the_call() -> None:
    conn = ClientCodec()
    sid, _ = conn.start(CallKind.BIDI, "s.S", "M")
    conn.send(sid, b"a")
    failed = Status(Code.INVALID_ARGUMENT, "enough")
    assert events(conn, encode_frame(sid, RESP, 0, response(status=failed))) == [
        Reply(sid, failed, b"")
    ]
    with pytest.raises(LocalProtocolError):
        conn.send(sid, b"b")  # never Data for a finished stream


def test_late_unknown_and_foreign_frames_are_dropped() -> None:
    conn = ClientCodec()
    sid, _ = conn.start(CallKind.UNARY, "s.S", "M")
    conn.abandon(sid)  # timed out locally
    wire = (
        encode_frame(sid, RESP, 0, response(b"late"))
        + encode_frame(99, RESP, 0)
        + encode_frame(3, 0x07, 0, b"?")
    )
    assert events(conn, wire) == []


def test_data_on_a_unary_call_and_an_oversize_frame_fail_their_call_only() -> None:
    conn = ClientCodec(max_data=8)
    a, _ = conn.start(CallKind.UNARY, "s.S", "M")
    b, _ = conn.start(CallKind.SERVER_STREAMING, "s.S", "M")
    c, _ = conn.start(CallKind.UNARY, "s.S", "M")
    big = (9).to_bytes(4, "big") + b.to_bytes(4, "big") + bytes([DATA, 0]) + bytes(9)
    got = events(conn, encode_frame(a, DATA, 0, b"x") + big + encode_frame(c, RESP, 0))
    assert [e.stream_id for e in got if isinstance(e, Reply)] == [a, b, c]
    assert got[0].status.code == Code.INTERNAL  # type: ignore[union-attr]
    assert got[1] == Reply(b, statuses.oversize(9), b"")
    assert got[2] == Reply(c, OK, b"")


def test_a_lost_connection_fails_every_active_call() -> None:
    conn = ClientCodec()
    ids = [conn.start(CallKind.UNARY, "s.S", "M")[0] for _ in range(3)]
    events(conn, encode_frame(ids[1], RESP, 0))
    conn.receive_data(b"")
    assert conn.next_event() == ConnectionClosed()
    assert conn.fail_all() == [ids[0], ids[2]]


def test_replies_split_at_every_byte() -> None:
    wire = (
        encode_frame(3, DATA, 0, b"m1")
        + encode_frame(1, RESP, 0, response(b"one"))
        + encode_frame(3, DATA, RC, b"m2")  # a close that carries a message
    )
    expected = [StreamMessage(3, b"m1"), Reply(1, OK, b"one"), StreamMessage(3, b"m2")]
    expected.append(Reply(3, OK, None))
    for cut in range(len(wire) + 1):
        conn = ClientCodec()
        conn.start(CallKind.UNARY, "s.S", "M")
        conn.start(CallKind.BIDI, "s.S", "M")
        assert events(conn, wire[:cut]) + events(conn, wire[cut:]) == expected, cut


@settings(max_examples=100)
@given(
    st.sampled_from(list(CallKind)),
    st.lists(st.binary(max_size=20), max_size=5),
    st.lists(st.binary(max_size=20), max_size=5),
    st.binary(max_size=20),
)
def test_both_codecs_agree_on_every_call_kind(
    kind: CallKind, ups: list[bytes], downs: list[bytes], request: bytes
) -> None:
    client, server = ClientCodec(), ServerCodec()
    payload = b"" if kind.client_streams else request
    sid, wire = client.start(kind, "svc.S", "M", payload)
    if kind.client_streams:
        wire += b"".join(client.send(sid, m) for m in ups) + client.close_send(sid)
    got = events(server, wire)
    call = got[0]
    assert isinstance(call, Call)
    assert call.request.payload == payload
    assert call.client_streams == kind.client_streams
    if kind.client_streams:
        assert got[1:] == [*(Message(sid, m) for m in ups), HalfClosed(sid)]
    if kind in (CallKind.UNARY, CallKind.CLIENT_STREAMING):
        back = server.respond(sid, b"result")
        assert events(client, back) == [Reply(sid, OK, b"result")]
    else:
        back = b"".join(server.send_data(sid, m) for m in downs) + server.send_data(
            sid, None, close=True
        )
        assert events(client, back) == [
            *(StreamMessage(sid, m) for m in downs),
            Reply(sid, OK, None),
        ]
    assert client.active_streams == 0
    assert server.active_streams == 0
