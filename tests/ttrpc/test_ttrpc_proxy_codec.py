"""The proxy's two sans-IO sides: client connections' streams relayed onto a shared
upstream connection and back, frame bytes untouched, without any I/O; and every
sequence of a client's Data the upstream's state of the stream does not take, answered
as Go's server answers it and never relayed (Go 1.2.4 dies of most of them)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.errors import LocalProtocolError
from gateway.sdk import NEED_DATA
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
from protocols.ttrpc import status as statuses
from protocols.ttrpc.codec import (
    CLIENT_STEP,
    EMPTY,
    FORWARD,
    OPEN,
    OVER,
    U_CLOSE,
    U_DATA,
    U_FAIL,
    U_RESPONSE,
    UPSTREAM_STEP,
    ProxyClientCodec,
    ProxyServerCodec,
)
from protocols.ttrpc.events import BadInput, Call, HalfClosed, Message

RC, RO, ND = Flags.REMOTE_CLOSED, Flags.REMOTE_OPEN, Flags.NO_DATA
REQ, RESP, DATA = MessageType.REQUEST, MessageType.RESPONSE, MessageType.DATA
RELAYED = "relayed.v1.Svc"
#: The upstream's method that takes the client's messages ("M"); "U" (unary) does not.
STREAMING = f"{RELAYED}/M"


def request_body(payload: bytes = b"p", service: str = RELAYED, method: str = "M") -> bytes:
    return ttrpc_pb2.Request(service=service, method=method, payload=payload).SerializeToString()


def response_body(payload: bytes) -> bytes:
    return ttrpc_pb2.Response(payload=payload).SerializeToString()


def frames(data: bytes) -> list[Frame]:
    reader = FrameReader()
    if data:  # b"" would be the end of input
        reader.receive_data(data)
    out = reader.frames()
    assert reader.end() is NEED_DATA
    assert not reader.held_bytes
    assert all(isinstance(f, Frame) for f in out)
    return out  # type: ignore[return-value]


class Rig:
    """One upstream connection; clients made with :meth:`client` route ``RELAYED`` to it."""

    def __init__(self) -> None:
        self.upstream = ProxyClientCodec(client_streaming={STREAMING})
        self.ready = True

    def client(self) -> ProxyServerCodec:
        def router(service: str) -> ProxyClientCodec | None:
            return self.upstream if service == RELAYED and self.ready else None

        return ProxyServerCodec(router)

    def from_client(self, client: ProxyServerCodec, data: bytes) -> list[object]:
        """Feed a client's bytes: the events it makes (the relayed frames wait upstream)."""
        client.receive_data(data)
        out: list[object] = []
        while (event := client.next_event()) is not NEED_DATA:
            out.append(event)
        assert client.take_touched() in ([], [self.upstream])
        return out

    def sent_upstream(self) -> list[Frame]:
        return frames(self.upstream.data_to_send())

    def from_server(self, data: bytes) -> dict[ProxyServerCodec, list[Frame]]:
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
    client.relay(call, call.data, rig.upstream)
    assert rig.sent_upstream() == [Frame(1, REQ, RO, call.data)]
    # Relayed, the stream takes the client's messages (M is a streaming method).
    assert rig.from_client(client, encode_frame(3, DATA, 0, b"m")) == []
    assert rig.sent_upstream() == [Frame(1, DATA, 0, b"m")]
    with pytest.raises(LocalProtocolError):
        client.relay(Call(99, call.request, 0, False), call.data, rig.upstream)  # no such stream


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
    # Data from the client after its close is bad input, answered here as Go does,
    # never relayed.
    assert rig.from_client(client, encode_frame(5, DATA, 0, b"late")) == [
        BadInput(5, statuses.stream_closed())
    ]
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
    client = ProxyServerCodec(lambda service: rig.upstream, has_room=lambda up: room[0])
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


def test_the_server_closing_first_ends_the_stream_for_the_client_s_data_too() -> None:
    """Go forgets a stream once it sent Data ``remote closed``, whatever the client's
    side (and 1.2.4 dies of Data for it): the client's close is answered here."""
    rig = Rig()
    client = rig.client()
    rig.from_client(client, encode_frame(1, REQ, RO, request_body()))
    rig.sent_upstream()
    assert rig.from_server(encode_frame(1, DATA, RC | ND)) == {
        client: [Frame(1, DATA, RC | ND, b"")]
    }
    assert client.relayed_streams == 0
    assert rig.upstream.active_streams == 0
    assert rig.from_client(client, encode_frame(1, DATA, RC | ND)) == [
        BadInput(1, statuses.stream_inactive())
    ]
    assert rig.upstream.data_to_send() == b""


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
    upstream = ProxyClientCodec()
    client = ProxyServerCodec(lambda service: upstream)
    upstream._next_id = 2**31 - 1  # the last odd id a connection may use
    client.receive_data(encode_frame(1, REQ, 0, request_body()))
    assert client.next_event() is NEED_DATA
    assert frames(upstream.data_to_send())[0].stream_id == 2**31 - 1
    assert upstream.exhausted
    with pytest.raises(LocalProtocolError, match="every stream id"):
        upstream.open(client, 3, 0, request_body(), ttrpc_pb2.Request())


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


# -- a client's Data against the upstream's state of the stream ------------------------------

INACTIVE = statuses.stream_inactive()
CLOSED = statuses.stream_closed()
UNDECLARED = f"{RELAYED}/U"
OK_RESPONSE = encode_frame(1, RESP, 0, response_body(b"r"))


def opened(flags: int, method: str = "M") -> bytes:
    """The client's Request on its stream 1 (upstream stream 1), of method M (declared
    streaming) or U (unary: not declared)."""
    return encode_frame(1, REQ, flags, request_body(method=method))


def data(flags: int, message: bytes = b"") -> bytes:
    return encode_frame(1, DATA, flags, message)


def oversize_data() -> bytes:
    length = MAX_DATA + 1
    return length.to_bytes(4, "big") + (1).to_bytes(4, "big") + bytes([DATA, 0]) + bytes(length)


#: (what happened so far: ("client" | "server", bytes) in order; the client's next frame;
#: the events it makes; the frames that go upstream for it).
Sequence = tuple[list[tuple[str, bytes]], bytes, list[object], list[Frame]]

SEQUENCES: dict[str, Sequence] = {
    # A unary method called "remote open": the flag is the client's word, not the
    # method's kind; Go 1.2.4 dies of any Data for a unary method, answered or not.
    "unary method called remote open: a message": (
        [("client", opened(RO, "U"))],
        data(0, b"m"),
        [BadInput(1, INACTIVE, note=UNDECLARED)],
        [],
    ),
    "unary method called remote open: its close": (
        [("client", opened(RO, "U"))],
        data(RC | ND),
        [BadInput(1, INACTIVE, note=UNDECLARED)],
        [],
    ),
    "unary method called remote open: a message with the close": (
        [("client", opened(RO, "U"))],
        data(RC, b"m"),
        [BadInput(1, INACTIVE, note=UNDECLARED)],
        [],
    ),
    "unary method called remote open, refused once: a message": (
        [("client", opened(RO, "U")), ("client", data(0, b"m"))],
        data(0, b"m2"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "unary method called remote open, answered: a message": (
        [("client", opened(RO, "U")), ("server", OK_RESPONSE)],
        data(0, b"m"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "unary call (flags 0): a message": (
        [("client", opened(0, "U"))],
        data(0, b"m"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "unary call: a close": (
        [("client", opened(0, "U"))],
        data(RC | ND),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "unary call: a frame without data": (
        [("client", opened(0, "U"))],
        data(ND),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "unary call of a streaming method (flags 0): a message": (
        [("client", opened(0))],
        data(0, b"m"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "server-streaming call (remote closed): a message": (
        [("client", opened(RC))],
        data(0, b"m"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "streaming call the server closed (Data remote closed): a message": (
        [("client", opened(RO)), ("server", data(RC | ND))],
        data(0, b"m"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "streaming call the server closed: the client's close": (
        [("client", opened(RO)), ("server", data(RC | ND))],
        data(RC | ND),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "streaming call the server closed: a frame without data": (
        [("client", opened(RO)), ("server", data(RC | ND))],
        data(ND),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "streaming call the server closed with its last message: a message": (
        [("client", opened(RO)), ("server", data(0, b"r")), ("server", data(RC, b"last"))],
        data(0, b"m"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "streaming call the server answered (Response): a message": (
        [("client", opened(RO)), ("client", data(0, b"m")), ("server", OK_RESPONSE)],
        data(0, b"m"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "streaming call the client closed: a message": (
        [("client", opened(RO)), ("client", data(RC | ND))],
        data(0, b"m"),
        [BadInput(1, CLOSED)],
        [],
    ),
    "streaming call the client closed: a message with the close": (
        [("client", opened(RO)), ("client", data(RC, b"last"))],
        data(RC, b"m"),
        [BadInput(1, CLOSED)],
        [],
    ),
    "streaming call the client closed: its close again": (
        [("client", opened(RO)), ("client", data(RC | ND))],
        data(RC | ND),
        [],
        [],
    ),
    "streaming call the client closed: a frame without data": (
        [("client", opened(RO)), ("client", data(RC | ND))],
        data(ND),
        [],
        [],
    ),
    "streaming call the client closed, a message answered: another": (
        [("client", opened(RO)), ("client", data(RC | ND)), ("client", data(0, b"m"))],
        data(0, b"m2"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "streaming call the client closed, a message answered: its close again": (
        [("client", opened(RO)), ("client", data(RC | ND)), ("client", data(0, b"m"))],
        data(RC | ND),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "streaming call the client closed, the server answered: a message": (
        [("client", opened(RO)), ("client", data(RC | ND)), ("server", OK_RESPONSE)],
        data(0, b"m"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "streaming call whose oversize frame was answered here: a message": (
        [("client", opened(RO)), ("client", oversize_data())],
        data(0, b"m"),
        [BadInput(1, INACTIVE)],
        [],
    ),
    "a stream never opened: a message": ([], data(0, b"m"), [BadInput(1, INACTIVE)], []),
    "a stream never opened: a close": ([], data(RC | ND), [BadInput(1, INACTIVE)], []),
    # What does go up from an open streaming call goes as Go takes it.
    "open streaming call: a message with other flags set": (
        [("client", opened(RO))],
        encode_frame(1, DATA, RO | 0xF0, b"m"),
        [],
        [Frame(1, DATA, 0, b"m")],
    ),
    "open streaming call: a message with the close": (
        [("client", opened(RO))],
        data(RC, b"m"),
        [],
        [Frame(1, DATA, 0, b"m"), Frame(1, DATA, RC | ND, b"")],
    ),
    "open streaming call: a close carrying bytes and no data": (
        [("client", opened(RO))],
        encode_frame(1, DATA, RC | ND, b"junk"),
        [],
        [Frame(1, DATA, RC | ND, b"")],
    ),
    "open streaming call: a frame without data": (
        [("client", opened(RO))],
        encode_frame(1, DATA, ND, b"junk"),
        [],
        [],
    ),
    "open streaming call the server sent a message on: a message": (
        [("client", opened(RO)), ("server", data(0, b"r"))],
        data(0, b"m"),
        [],
        [Frame(1, DATA, 0, b"m")],
    ),
}


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_a_client_s_data_goes_up_only_if_the_upstream_s_state_of_the_stream_takes_it(
    name: str,
) -> None:
    before, frame, events, upstream = SEQUENCES[name]
    rig = Rig()
    client = rig.client()
    for side, wire in before:
        if side == "client":
            rig.from_client(client, wire)
        else:
            rig.from_server(wire)
    rig.upstream.data_to_send()  # what went up before
    assert rig.from_client(client, frame) == events
    assert frames(rig.upstream.data_to_send()) == upstream


def test_only_a_forwarding_state_forwards_and_the_upstream_s_end_is_everyone_s() -> None:
    """The tables themselves: a client's Data is relayed from OPEN only, and a Response or
    Data ``remote closed`` from the upstream ends the stream in every state."""
    for state, row in enumerate(CLIENT_STEP):
        for event, (_, action) in enumerate(row):
            assert (action == FORWARD) == (state == OPEN and event != EMPTY), (state, event)
    for state, upstream_row in enumerate(UPSTREAM_STEP):
        if state != OVER:
            assert upstream_row[U_DATA][0] is None
            assert {upstream_row[e][0] for e in (U_CLOSE, U_RESPONSE, U_FAIL)} == {OVER}


def test_a_second_request_on_a_live_id_is_answered_and_the_stream_goes_on() -> None:
    rig = Rig()
    client = rig.client()
    rig.from_client(client, opened(RO))
    rig.sent_upstream()
    (bad,) = rig.from_client(client, opened(RO))
    assert bad == BadInput(1, statuses.id_reused())
    assert rig.upstream.data_to_send() == b""  # nothing of it went up
    rig.from_client(client, data(RC, b"m"))
    assert rig.sent_upstream() == [Frame(1, DATA, 0, b"m"), Frame(1, DATA, RC | ND, b"")]
    assert rig.from_server(OK_RESPONSE) == {client: [Frame(1, RESP, 0, response_body(b"r"))]}


def test_a_gone_client_s_stream_drops_what_the_server_sends_until_the_server_ends_it() -> None:
    rig = Rig()
    gone = rig.client()
    rig.from_client(gone, opened(RO) + data(0, b"m"))
    rig.sent_upstream()
    gone.orphan_all()
    assert rig.upstream.active_streams == 1  # the call runs on upstream
    assert rig.from_server(data(0, b"r")) == {}
    assert rig.upstream.active_streams == 1
    assert rig.from_server(data(RC | ND)) == {}
    assert rig.upstream.active_streams == 0


def test_data_held_for_a_full_upstream_is_dropped_once_the_server_ended_the_stream() -> None:
    rig = Rig()
    room = [True]
    client = ProxyServerCodec(rig.client().router, has_room=lambda up: room[0])
    rig.from_client(client, opened(RO))
    rig.sent_upstream()
    room[0] = False
    assert rig.from_client(client, data(0, b"m")) == [Message(1, b"m")]
    rig.from_server(data(RC | ND))  # meanwhile, the server ended the stream
    client.relay_data(1, b"m", False)
    assert rig.upstream.data_to_send() == b""
    assert client.take_touched() == []


class GoServer:
    """What containerd's Go server 1.2.4 does with the frames of one connection, as far
    as the proxy must care: which Data would kill it (``server.go``: Data for a stream it
    does not hold, or for a unary method's nil handler). Method U is unary, M bidi."""

    def __init__(self) -> None:
        #: Held streams: id -> [method, client closed].
        self.streams: dict[int, list[Any]] = {}
        self.panics: list[str] = []

    def receive(self, data: bytes) -> None:
        for frame in frames(data):
            sid = frame.stream_id
            if frame.type == REQ:
                request = ttrpc_pb2.Request.FromString(frame.data)
                self.streams[sid] = [request.method, False]
                continue
            held = self.streams.get(sid)
            if held is None:
                self.panics.append(f"Data for stream {sid}, which it does not hold")
            elif held[0] == "U" and (frame.flags & RC or not frame.flags & ND):
                self.panics.append(f"Data for stream {sid} of a unary method")
            elif frame.flags & RC:
                held[1] = True
            elif not frame.flags & ND and held[1]:
                del self.streams[sid]  # "data handling error": answered and forgotten

    def ends(self, sid: int) -> bool:
        """Its handler ends the stream (a Response or Data remote closed): forgotten."""
        return self.streams.pop(sid, None) is not None


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(["M", "U"]),
    st.sampled_from([0, RO, RC, RO | RC, RO | ND]),
    st.lists(
        st.one_of(
            st.tuples(st.just("client"), st.integers(0, 255), st.binary(max_size=3)),
            st.tuples(st.just("server"), st.sampled_from(["data", "close", "response"])),
        ),
        max_size=12,
    ),
)
def test_whatever_a_client_sends_nothing_that_goes_up_kills_a_go_server(
    method: str, flags: int, steps: list[tuple[Any, ...]]
) -> None:
    rig = Rig()
    client = rig.client()
    go = GoServer()
    rig.from_client(client, encode_frame(1, REQ, flags, request_body(method=method)))
    go.receive(rig.upstream.data_to_send())
    for step in steps:
        if step[0] == "client":
            rig.from_client(client, encode_frame(1, DATA, step[1], step[2]))
            go.receive(rig.upstream.data_to_send())
        elif 1 in go.streams and (method == "M" or step[1] == "response"):
            # The handler sends only while Go holds the stream, and a unary one a Response.
            reply = {
                "data": data(0, b"r"),
                "close": data(RC | ND),
                "response": OK_RESPONSE,
            }[step[1]]
            if step[1] != "data":
                go.ends(1)
            rig.from_server(reply)
    assert go.panics == []
