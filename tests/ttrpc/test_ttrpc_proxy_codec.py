"""The proxy's two sans-IO sides: client connections' streams relayed onto a shared
upstream connection and back, frame bytes untouched, without any I/O."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import LocalProtocolError
from gateway.protocol import NEED_DATA
from protocols.ttrpc import (
    MAX_DATA,
    Code,
    Flags,
    Frame,
    FrameReader,
    MessageType,
    Status,
    encode_frame,
    status_of,
    ttrpc_pb2,
)
from protocols.ttrpc.events import BadInput, Call, HalfClosed, Message
from protocols.ttrpc.proxy_codec import ProxyClientConnection, ProxyServerConnection

RC, RO, ND = Flags.REMOTE_CLOSED, Flags.REMOTE_OPEN, Flags.NO_DATA
REQ, RESP, DATA = MessageType.REQUEST, MessageType.RESPONSE, MessageType.DATA
RELAYED = "relayed.v1.Svc"


def request_body(payload: bytes = b"p", service: str = RELAYED) -> bytes:
    return ttrpc_pb2.Request(service=service, method="M", payload=payload).SerializeToString()


def response_body(payload: bytes) -> bytes:
    return ttrpc_pb2.Response(payload=payload).SerializeToString()


def frames(data: bytes) -> list[Frame]:
    reader = FrameReader()
    reader.receive_data(data)
    out = reader.frames()
    assert reader.end() is NEED_DATA
    assert not reader.held_bytes
    assert all(isinstance(f, Frame) for f in out)
    return out  # type: ignore[return-value]


class Rig:
    """One upstream connection; clients made with :meth:`client` route ``RELAYED`` to it."""

    def __init__(self) -> None:
        self.upstream = ProxyClientConnection()
        self.ready = True

    def client(self) -> ProxyServerConnection:
        def router(service: str) -> ProxyClientConnection | None:
            return self.upstream if service == RELAYED and self.ready else None

        return ProxyServerConnection(router)

    def from_client(self, client: ProxyServerConnection, data: bytes) -> list[object]:
        """Feed a client's bytes: the events it makes (the relayed frames wait upstream)."""
        client.receive_data(data)
        out: list[object] = []
        while (event := client.next_event()) is not NEED_DATA:
            out.append(event)
        assert client.take_touched() in ([], [self.upstream])
        return out

    def sent_upstream(self) -> list[Frame]:
        return frames(self.upstream.data_to_send())

    def from_server(self, data: bytes) -> dict[ProxyServerConnection, list[Frame]]:
        """Feed the server's bytes: the frames each client gets."""
        self.upstream.receive_data(data)
        assert self.upstream.next_event() is NEED_DATA  # it makes no events
        return {owner: frames(out) for owner, out in self.upstream.take_relayed()}


def test_a_unary_call_goes_up_under_an_id_of_the_upstream_and_comes_back_under_the_client_s() -> (
    None
):
    rig = Rig()
    client = rig.client()
    body = request_body()
    assert rig.from_client(client, encode_frame(7, REQ, 0, body)) == []
    assert rig.sent_upstream() == [Frame(1, REQ, 0, body)]
    assert client.relayed_streams == 1
    assert rig.upstream.active_streams == 1
    reply = response_body(b"answer")
    assert rig.from_server(encode_frame(1, RESP, 0, reply)) == {client: [Frame(7, RESP, 0, reply)]}
    assert client.relayed_streams == 0
    assert rig.upstream.active_streams == 0
    # The stream is over on both sides: a second Response from the server is dropped.
    assert rig.from_server(encode_frame(1, RESP, 0, reply)) == {}


def test_many_clients_share_the_upstream_ids_in_wire_order_replies_in_any_order() -> None:
    rig = Rig()
    a, b = rig.client(), rig.client()
    rig.from_client(a, encode_frame(1, REQ, 0, request_body(b"a1")))
    rig.from_client(b, encode_frame(1, REQ, 0, request_body(b"b1")))
    rig.from_client(a, encode_frame(3, REQ, 0, request_body(b"a3")))
    sent = rig.sent_upstream()
    assert [f.stream_id for f in sent] == [1, 3, 5]
    assert [ttrpc_pb2.Request.FromString(f.data).payload for f in sent] == [b"a1", b"b1", b"a3"]
    got = rig.from_server(
        encode_frame(5, RESP, 0, response_body(b"A3"))
        + encode_frame(3, RESP, 0, response_body(b"B1"))
        + encode_frame(1, RESP, 0, response_body(b"A1"))
    )
    assert [(f.stream_id, f.data) for f in got[a]] == [
        (3, response_body(b"A3")),
        (1, response_body(b"A1")),
    ]
    assert [(f.stream_id, f.data) for f in got[b]] == [(1, response_body(b"B1"))]


def test_a_service_the_router_declines_is_a_call_as_on_a_plain_server() -> None:
    rig = Rig()
    client = rig.client()
    local = request_body(service="local.v1.Svc")
    (call,) = rig.from_client(client, encode_frame(1, REQ, 0, local))
    assert isinstance(call, Call)
    assert call.request.service == "local.v1.Svc"
    assert rig.upstream.data_to_send() == b""
    # Not ready now: a Call too, which the driver relays once a connection is ready.
    rig.ready = False
    (call,) = rig.from_client(client, encode_frame(3, REQ, RO, request_body()))
    assert isinstance(call, Call)
    client.relay(call.stream_id, call.flags, call.data, rig.upstream)
    assert rig.sent_upstream() == [Frame(1, REQ, RO, call.data)]
    with pytest.raises(LocalProtocolError):
        client.relay(99, 0, call.data, rig.upstream)  # no such stream


def test_a_bidi_stream_both_ways_and_its_closes() -> None:
    rig = Rig()
    client = rig.client()
    body = request_body(b"")
    rig.from_client(
        client,
        encode_frame(5, REQ, RO, body)
        + encode_frame(5, DATA, 0, b"m1")
        + encode_frame(5, DATA, 0, b""),  # a 0-byte message is a message
    )
    assert rig.sent_upstream() == [
        Frame(1, REQ, RO, body),
        Frame(1, DATA, 0, b"m1"),
        Frame(1, DATA, 0, b""),
    ]
    assert rig.from_server(encode_frame(1, DATA, 0, b"r1")) == {client: [Frame(5, DATA, 0, b"r1")]}
    # The client's last message with its close goes up as a message, then the close
    # (Go servers mishandle Data that carries both).
    rig.from_client(client, encode_frame(5, DATA, RC, b"m2"))
    assert rig.sent_upstream() == [Frame(1, DATA, 0, b"m2"), Frame(1, DATA, RC | ND, b"")]
    assert client.relayed_streams == 1
    # Data from the client after its close is bad input, answered here, never relayed.
    (bad,) = rig.from_client(client, encode_frame(5, DATA, 0, b"late"))
    assert isinstance(bad, BadInput)
    assert not bad.ends_stream
    assert rig.upstream.data_to_send() == b""
    # The server's close ends the stream everywhere.
    assert rig.from_server(encode_frame(1, DATA, RC | ND)) == {
        client: [Frame(5, DATA, RC | ND, b"")]
    }
    assert client.relayed_streams == 0
    assert rig.upstream.active_streams == 0
    assert rig.from_server(encode_frame(1, DATA, 0, b"stray")) == {}


def test_data_for_a_full_upstream_comes_out_as_events_for_the_driver_to_relay() -> None:
    rig = Rig()
    room = [True]
    client = ProxyServerConnection(lambda service: rig.upstream, has_room=lambda up: room[0])
    rig.from_client(client, encode_frame(1, REQ, RO, request_body()))
    rig.sent_upstream()
    room[0] = False  # the upstream connection is over its high water
    events = rig.from_client(client, encode_frame(1, DATA, RC, b"last"))
    assert events == [Message(1, b"last"), HalfClosed(1)]
    assert rig.upstream.data_to_send() == b""
    assert client.upstream_of(1) is rig.upstream
    # Once there is room the driver relays them, in order, as two frames.
    client.relay_data(1, b"last", False)
    client.relay_data(1, None, True)
    assert client.take_touched() == [rig.upstream]
    assert rig.sent_upstream() == [Frame(1, DATA, 0, b"last"), Frame(1, DATA, RC | ND, b"")]
    # The server answers: the stream is over everywhere, and later relays do nothing.
    rig.from_server(encode_frame(1, RESP, 0, response_body(b"n")))
    assert client.upstream_of(1) is None
    client.relay_data(1, b"late", True)
    assert rig.upstream.data_to_send() == b""


def test_the_server_closing_first_leaves_the_client_s_side_open() -> None:
    rig = Rig()
    client = rig.client()
    rig.from_client(client, encode_frame(1, REQ, RO, request_body()))
    rig.sent_upstream()
    rig.from_server(encode_frame(1, DATA, RC | ND))
    assert client.relayed_streams == 1  # the client may still send
    rig.from_client(client, encode_frame(1, DATA, RC | ND))
    assert rig.sent_upstream() == [Frame(1, DATA, RC | ND, b"")]
    assert client.relayed_streams == 0
    assert rig.upstream.active_streams == 0


def test_an_oversize_frame_from_the_server_fails_its_stream_alone() -> None:
    rig = Rig()
    client = rig.client()
    rig.from_client(
        client, encode_frame(1, REQ, 0, request_body()) + encode_frame(3, REQ, 0, request_body())
    )
    rig.sent_upstream()
    length = MAX_DATA + 1
    header = length.to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes([RESP, 0])
    got = rig.from_server(header + bytes(length) + encode_frame(3, RESP, 0, response_body(b"ok")))
    failed, ok = got[client]
    assert failed.stream_id == 1
    assert status_of(ttrpc_pb2.Response.FromString(failed.data)).code == (Code.RESOURCE_EXHAUSTED)
    assert ok == Frame(3, RESP, 0, response_body(b"ok"))
    assert client.relayed_streams == 0
    assert rig.upstream.active_streams == 0


def test_a_client_s_oversize_frame_is_answered_here_and_its_upstream_reply_dropped() -> None:
    rig = Rig()
    client = rig.client()
    rig.from_client(client, encode_frame(1, REQ, RO, request_body()))
    rig.sent_upstream()
    length = MAX_DATA + 1
    header = length.to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes([DATA, 0])
    (bad,) = rig.from_client(client, header + bytes(length))
    assert isinstance(bad, BadInput)
    assert bad.ends_stream
    assert rig.upstream.data_to_send() == b""
    assert rig.from_server(encode_frame(1, RESP, 0, response_body(b"late"))) == {}
    assert rig.upstream.active_streams == 0


def test_a_client_that_goes_away_leaves_its_calls_running_their_replies_dropped() -> None:
    rig = Rig()
    gone, stays = rig.client(), rig.client()
    rig.from_client(gone, encode_frame(1, REQ, 0, request_body()))
    rig.from_client(stays, encode_frame(1, REQ, 0, request_body()))
    rig.sent_upstream()
    gone.orphan_all()
    assert gone.relayed_streams == 0
    got = rig.from_server(
        encode_frame(1, RESP, 0, response_body(b"x"))
        + encode_frame(3, RESP, 0, response_body(b"y"))
    )
    assert got == {stays: [Frame(1, RESP, 0, response_body(b"y"))]}
    assert rig.upstream.active_streams == 0


def test_a_lost_connection_fails_each_live_stream_with_the_status_given() -> None:
    rig = Rig()
    a, b = rig.client(), rig.client()
    rig.from_client(
        a, encode_frame(1, REQ, 0, request_body()) + encode_frame(3, REQ, RO, request_body())
    )
    rig.from_client(b, encode_frame(9, REQ, 0, request_body()))
    rig.sent_upstream()
    lost = Status(Code.UNAVAILABLE, "upstream u: connection lost")
    assert rig.upstream.fail_all(lost) == 3
    relayed = dict(rig.upstream.take_relayed())
    assert [f.stream_id for f in frames(relayed[a])] == [1, 3]
    (frame,) = frames(relayed[b])
    assert frame.stream_id == 9
    assert status_of(ttrpc_pb2.Response.FromString(frame.data)) == lost
    assert a.relayed_streams == b.relayed_streams == 0


def test_each_connection_uses_odd_ids_until_they_run_out() -> None:
    upstream = ProxyClientConnection()
    client = ProxyServerConnection(lambda service: upstream)
    upstream._next_id = 2**31 - 1  # the last odd id a connection may use
    client.receive_data(encode_frame(1, REQ, 0, request_body()))
    assert client.next_event() is NEED_DATA
    assert frames(upstream.data_to_send())[0].stream_id == 2**31 - 1
    assert upstream.exhausted
    with pytest.raises(LocalProtocolError, match="every stream id"):
        upstream.open(client, 3, 0, request_body())


WIRE = (
    encode_frame(1, REQ, 0, request_body(b"one"))
    + encode_frame(3, REQ, RO, request_body(b""))
    + encode_frame(3, DATA, 0, b"m")
    + encode_frame(5, REQ, 0, request_body(b"local", service="local.v1.Svc"))
    + encode_frame(3, DATA, RC | ND)
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, len(WIRE) - 1), unique=True, max_size=12))
def test_what_goes_upstream_does_not_depend_on_how_the_client_s_bytes_were_cut(
    cuts: list[int],
) -> None:
    def run(pieces: list[bytes]) -> tuple[bytes, list[object]]:
        rig = Rig()
        client = rig.client()
        events: list[object] = []
        for piece in pieces:
            events += rig.from_client(client, piece)
        return rig.upstream.data_to_send(), events

    bounds = [0, *sorted(cuts), len(WIRE)]
    pieces = [WIRE[a:b] for a, b in itertools.pairwise(bounds)]
    assert run(pieces) == run([WIRE])
