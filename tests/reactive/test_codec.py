"""The connection: handshake, goodbye, keepalive, errors, batching, round trips."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sdk import (
    NEED_DATA,
    CodecState,
    ConnectionClosed,
    LocalProtocolError,
    RemoteProtocolError,
)
from protocols.reactive import (
    Accepted,
    Cancel,
    Cancelled,
    ClientHello,
    Completed,
    Connection,
    DemandAdded,
    Elements,
    Failed,
    Goodbye,
    GoodbyeAck,
    GoodbyeAnswered,
    GoodbyeReceived,
    Hello,
    Limits,
    Message,
    OnComplete,
    OnError,
    OnNext,
    OnNextLastPart,
    OnNextPart,
    Phase,
    Ping,
    Pinged,
    Pong,
    Ponged,
    Request,
    Role,
    ServerHello,
    Skipped,
    Subscribe,
    Subscribed,
    SubscribeRequested,
    UnsupportedVersion,
    goodbye_reason,
)

from .helpers import drain, feed, pair, subscribed


def test_hello_both_ways_negotiates_the_intersection() -> None:
    client = Connection(Role.CLIENT, extensions=frozenset({1, 2}))
    server = Connection(Role.SERVER, extensions=frozenset({1, 3}))
    assert client.hello() == bytes.fromhex("93 01 00 92 01 02")
    assert feed(server, bytes.fromhex("93 01 00 92 01 02")) == [Hello(0, frozenset({1}))]
    assert server.phase is Phase.HELLO  # its own hello not sent yet
    client.receive_data(server.hello())
    assert drain(client) == [Hello(0, frozenset({1}))]
    assert client.phase is Phase.OPEN
    assert server.phase is Phase.OPEN


def test_the_client_pipelines_core_messages_after_its_hello() -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    wire = client.hello() + client.send(Subscribe("pub", 1, 5))
    assert feed(server, wire) == [Hello(0, frozenset({1})), SubscribeRequested(1, "pub", 5)]


def test_the_server_may_send_its_hello_at_once_but_nothing_more_before_the_clients() -> None:
    server = Connection(Role.SERVER)
    server.hello()
    with pytest.raises(LocalProtocolError):
        server.send(Subscribe("pub", 1, 1))
    with pytest.raises(LocalProtocolError):
        Connection(Role.CLIENT).send(Subscribe("pub", 1, 1))  # the hello goes first


def test_one_hello_each_and_only_ones_own() -> None:
    client = Connection(Role.CLIENT)
    with pytest.raises(LocalProtocolError):
        client.send(ServerHello(0, ()))
    client.hello()
    with pytest.raises(LocalProtocolError):
        client.hello()


@pytest.mark.parametrize(
    ("role", "first"),
    [
        (Role.SERVER, Subscribe("pub", 1, 1)),
        (Role.SERVER, ServerHello(0, ())),
        (Role.CLIENT, ClientHello(0, ())),
        (Role.CLIENT, OnNext(1, b"x")),
    ],
)
def test_anything_before_the_peers_hello_is_a_protocol_error(role: Role, first: Message) -> None:
    conn = Connection(role)
    with pytest.raises(RemoteProtocolError):
        feed(conn, first)
    assert conn.state is CodecState.ERROR
    assert conn.held_bytes == 0


def test_a_second_hello_is_a_protocol_error() -> None:
    _client, server = pair()
    with pytest.raises(RemoteProtocolError):
        feed(server, ClientHello(0, ()))


def test_another_version_is_answered_with_unsupported_version() -> None:
    server = Connection(Role.SERVER)
    with pytest.raises(UnsupportedVersion) as raised:
        feed(server, ClientHello(3, (1,)))
    assert goodbye_reason(raised.value) == "unsupported-version: 3"
    assert server.send(Goodbye(goodbye_reason(raised.value))) == bytes.fromhex(
        "92 03 b6" + b"unsupported-version: 3".hex()
    )
    with pytest.raises(LocalProtocolError):
        server.hello()  # in ERROR only the goodbye goes


def test_a_protocol_error_goodbye_reason() -> None:
    conn = Connection(Role.SERVER)
    with pytest.raises(RemoteProtocolError) as raised:
        feed(conn, bytes.fromhex("c1"))
    assert goodbye_reason(raised.value).startswith("protocol-error: ")


def test_keepalive_ping_and_pong() -> None:
    client, server = pair()
    assert feed(server, client.send(Ping(b"\x00\x01"))) == [Pinged(b"\x00\x01")]
    assert feed(client, server.send(Pong(b"\x00\x01"))) == [Ponged(b"\x00\x01")]


def test_no_extension_messages_unless_negotiated() -> None:
    client = Connection(Role.CLIENT)
    hello = client.hello()
    with pytest.raises(LocalProtocolError):
        client.send(Ping(b""))  # the server's hello has not confirmed it
    server = Connection(Role.SERVER, extensions=frozenset())
    feed(client, server.hello())
    assert client.extensions == frozenset()
    with pytest.raises(LocalProtocolError):
        client.send(Ping(b""))
    # and the server skips a ping it did not negotiate (self-delimiting)
    assert feed(server, hello, Ping(b"x"), Subscribe("p", 1, 0)) == [
        Hello(0, frozenset()),
        Skipped(64),
        SubscribeRequested(1, "p", 0),
    ]


def test_unknown_extension_types_are_skipped() -> None:
    _client, server = pair()
    assert feed(server, bytes.fromhex("93 64 81 a1 61 01 c4 00"), bytes.fromhex("91 7f")) == [
        Skipped(100),
        Skipped(127),
    ]


def test_unknown_core_type_is_a_protocol_error() -> None:
    _client, server = pair()
    with pytest.raises(RemoteProtocolError):
        feed(server, bytes.fromhex("91 0f"))


def test_goodbye_is_answered_with_goodbye_and_closes_every_stream_both_ways() -> None:
    client, server = subscribed(demand=1)
    feed(client, server.send(Subscribe("back", 9, 0)))  # the server subscribes too
    events = feed(client, server.send(Goodbye("shutdown")))
    assert events == [
        GoodbyeReceived("shutdown", answers_ours=False),
        Failed(1, "goodbye: shutdown"),
        Cancelled(9, "goodbye: shutdown"),
    ]
    assert client.phase is Phase.GOODBYE_OWED
    assert server.phase is Phase.GOODBYE_SENT
    with pytest.raises(LocalProtocolError):
        client.send(Request(1, 1))  # nothing but the answer
    with pytest.raises(LocalProtocolError):
        server.send(Ping(b""))  # after sending goodbye: nothing
    answer = client.send(Goodbye("shutdown"))
    assert client.phase is Phase.DONE
    assert feed(server, answer) == [GoodbyeReceived("shutdown", answers_ours=True)]
    assert server.phase is Phase.DONE
    server.receive_data(b"")
    assert drain(server) == [ConnectionClosed()]


def test_goodbye_ack_counts_as_the_answer() -> None:
    client, server = pair()
    feed(server, client.send(Goodbye("bye")))
    assert feed(client, server.send(GoodbyeAck("ok"))) == [GoodbyeAnswered("ok")]
    assert client.phase is Phase.DONE


def test_messages_in_flight_after_our_goodbye_are_dropped() -> None:
    client, server = subscribed(demand=5)
    in_flight = server.send_elements(1, [b"a", b"b"])
    client.send(Goodbye("bye"))
    assert feed(client, in_flight, Goodbye("bye")) == [GoodbyeReceived("bye", answers_ours=True)]


def test_anything_after_the_peers_goodbye_is_a_protocol_error() -> None:
    _client, server = pair()
    with pytest.raises(RemoteProtocolError):
        feed(server, Goodbye("bye"), Subscribe("p", 1, 1))


def test_goodbye_ack_without_our_goodbye_is_a_protocol_error() -> None:
    client, server = pair()
    with pytest.raises(RemoteProtocolError):
        feed(server, GoodbyeAck("?"))
    with pytest.raises(LocalProtocolError):
        client.send(GoodbyeAck("?"))


def test_elements_of_one_read_come_as_one_event() -> None:
    client, server = subscribed(demand=10)
    wire = server.send_elements(1, [b"a", b"b"]) + server.send(OnNext(1, b"c"))
    assert feed(client, wire) == [Elements(1, (b"a", b"b", b"c"))]
    assert server.outstanding(1) == 7


def test_packed_elements_are_one_message_and_come_apart() -> None:
    client, server = subscribed(element_size=2, demand=3)
    wire = server.send_elements(1, [b"ab", b"cd", b"ef"])
    assert wire == bytes.fromhex("94 0c 01 03 c4 06 61 62 63 64 65 66")
    assert feed(client, wire) == [Elements(1, (b"ab", b"cd", b"ef"))]


def test_split_feeding_of_a_conversation_at_every_byte() -> None:
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    to_server = client.hello() + client.send(Subscribe("pub", 1, 3))
    feed(server, to_server)
    to_client = (
        server.hello()
        + server.send(Subscribed(1, 0))
        + server.send_elements(1, [b"one", b"two"])
        + server.send(OnNext(1, b"three"))
    )
    expected = [Hello(0, frozenset({1})), Accepted(1, 0)]
    for cut in range(len(to_client) + 1):
        conn = Connection(Role.CLIENT)
        conn.hello()
        conn.send(Subscribe("pub", 1, 3))
        events = feed(conn, to_client[:cut]) + feed(conn, to_client[cut:])
        elements = [e for ev in events if isinstance(ev, Elements) for e in ev.elements]
        assert [e for e in events if not isinstance(e, Elements)] == expected
        assert elements == [b"one", b"two", b"three"]
        assert conn.held_bytes == 0


def test_end_of_input_closes_and_drops_a_partial_message() -> None:
    _client, server = pair()
    server.receive_data(b"\x93\x09")
    server.receive_data(b"")
    assert drain(server) == [ConnectionClosed()]
    assert server.state is CodecState.CLOSED
    assert server.held_bytes == 0
    assert server.next_event() == ConnectionClosed()


def test_the_first_event_after_an_error_is_refused() -> None:
    _client, server = pair()
    with pytest.raises(RemoteProtocolError):
        feed(server, b"\xc1")
    with pytest.raises(LocalProtocolError):
        server.next_event()
    server.receive_data(b"more")  # dropped
    assert server.held_bytes == 0


@given(
    st.lists(
        st.one_of(
            st.binary(max_size=40).map(lambda b: ("elem", b)),
            st.integers(1, 5).map(lambda n: ("req", n)),
        ),
        max_size=20,
    ),
    st.integers(1, 9),
)
def test_round_trip_events(actions: list[tuple[str, object]], step: int) -> None:
    client, server = subscribed(demand=0)
    sent: list[bytes] = []
    to_client = b""
    for kind, value in actions:
        if kind == "req":
            assert isinstance(value, int)
            feed(server, client.send(Request(1, value)))
        elif server.outstanding(1) > 0:
            assert isinstance(value, bytes)
            to_client += server.send_elements(1, [value])
            sent.append(value)
    got: list[bytes] = []
    for i in range(0, len(to_client), step):
        for event in feed(client, to_client[i : i + step]):
            assert isinstance(event, Elements)
            assert event.subscriber == 1
            got += event.elements
    assert got == sent
    assert client.held_bytes == 0


@given(st.binary(max_size=300), st.integers(1, 50))
def test_random_bytes_after_the_hello_only_raise_remote_protocol_errors(
    data: bytes, step: int
) -> None:
    _client, server = pair()
    try:
        for i in range(0, len(data), step):
            feed(server, data[i : i + step])
            assert server.held_bytes <= len(data)
        server.receive_data(b"")
        drain(server)
    except RemoteProtocolError:
        assert server.state is CodecState.ERROR
        assert server.held_bytes == 0


def test_need_data_at_first() -> None:
    assert Connection(Role.SERVER).next_event() is NEED_DATA


_action = st.one_of(
    st.tuples(st.just("subscribe"), st.integers(0, 4)),
    st.tuples(st.just("request"), st.integers(1, 4)),
    st.tuples(st.just("cancel"), st.just(0)),
    st.tuples(st.just("accept"), st.sampled_from([0, 2])),
    st.tuples(st.just("elements"), st.integers(1, 3)),
    st.tuples(st.just("split"), st.integers(1, 3)),
    st.tuples(st.just("complete"), st.just(0)),
    st.tuples(st.just("reject"), st.just(0)),
    st.tuples(st.just("ping"), st.just(0)),
)


def _act(
    client: Connection, server: Connection, kind: str, n: int, sub: int
) -> tuple[bytes, bytes, list[object], list[object]]:
    """One action: (bytes to the server, bytes to the client, the events each expects)."""
    live = sub in server.theirs.live
    active = live and server.theirs.live[sub].stage.value == "active"
    room = server.outstanding(sub) if live else 0
    if kind == "subscribe" and sub not in client.mine.used:
        return client.send(Subscribe("p", sub, n)), b"", [SubscribeRequested(sub, "p", n)], []
    if kind == "request" and sub in client.mine.live:
        wire = client.send(Request(sub, n))
        return wire, b"", ([DemandAdded(sub, n, room + n)] if live else []), []
    if kind == "cancel" and sub in client.mine.live:
        return client.send(Cancel(sub)), b"", ([Cancelled(sub)] if live else []), []
    if kind == "accept" and live and not active:
        return b"", server.send(Subscribed(sub, n)), [], [Accepted(sub, n)]
    size = server.theirs.live[sub].element_size if active else 0
    mine = sub in client.mine.live
    if kind == "elements" and active and room:
        items = [bytes([65 + i]) * (size or i + 1) for i in range(min(n, room))]
        return (
            b"",
            server.send_elements(sub, items),
            [],
            ([Elements(sub, tuple(items))] if mine else []),
        )
    if kind == "split" and active and room and not size:
        wire = b"".join(server.send(OnNextPart(sub, 1, b"ab")) for _ in range(n - 1))
        wire += server.send(OnNextLastPart(sub, 1, b"z"))
        return b"", wire, [], ([Elements(sub, (b"ab" * (n - 1) + b"z",))] if mine else [])
    if kind == "complete" and active:
        return b"", server.send(OnComplete(sub)), [], ([Completed(sub)] if mine else [])
    if kind == "reject" and live:
        return b"", server.send(OnError(sub, "no")), [], ([Failed(sub, "no")] if mine else [])
    if kind == "ping":
        return client.send(Ping(b"k")), server.send(Pong(b"k")), [Pinged(b"k")], [Ponged(b"k")]
    return b"", b"", [], []


@given(st.lists(_action, max_size=25), st.integers(1, 12))
def test_events_bytes_events(actions: list[tuple[str, int]], step: int) -> None:
    """Every message sent comes out of the other side as the event it stands for, the
    bytes cut anywhere; each action is delivered before the next is chosen."""
    client, server = pair()
    sub = 1
    for kind, n in actions:
        if kind == "subscribe" and sub in client.mine.used:
            sub += 1
        up, down, on_server, on_client = _act(client, server, kind, n, sub)
        assert _feed_in_steps(server, up, step) == on_server
        assert _merge(_feed_in_steps(client, down, step)) == on_client
    assert client.held_bytes == server.held_bytes == 0


def _feed_in_steps(conn: Connection, data: bytes, step: int) -> list[object]:
    events: list[object] = []
    for i in range(0, len(data), step):
        events += feed(conn, data[i : i + step])
    return events


def _merge(events: list[object]) -> list[object]:
    """Elements events of one subscription in a row, as one (reads cut them apart)."""
    out: list[object] = []
    for event in events:
        last = out[-1] if out else None
        if (
            isinstance(event, Elements)
            and isinstance(last, Elements)
            and last.subscriber == event.subscriber
        ):
            out[-1] = Elements(event.subscriber, last.elements + event.elements)
            continue
        out.append(event)
    return out


def test_over_a_real_socket_pair() -> None:
    """Both roles over a connected socket pair: bytes as the kernel cuts them."""
    a, b = socket.socketpair()
    with a, b:
        a.settimeout(10)
        b.settimeout(10)
        client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
        a.sendall(client.hello() + client.send(Subscribe("pub", 1, 1000)))
        b.sendall(server.hello())
        seen = _until(server, b, lambda ev: isinstance(ev, SubscribeRequested))
        assert seen[-1] == SubscribeRequested(1, "pub", 1000)
        items = [i.to_bytes(4, "big") * 4 for i in range(1000)]  # well within the buffers
        b.sendall(server.send(Subscribed(1, 0)) + server.send_elements(1, items))
        b.sendall(server.send(OnComplete(1)))
        events = _until(client, a, lambda ev: isinstance(ev, Completed))
        got = [e for ev in events if isinstance(ev, Elements) for e in ev.elements]
        assert got == items
        assert events[-1] == Completed(1)


def _until(conn: Connection, sock: socket.socket, done: Callable[[object], bool]) -> list[object]:
    """``conn``'s events from what ``sock`` receives, until ``done`` says so."""
    events: list[object] = []
    while not (events and done(events[-1])):
        events += feed(conn, sock.recv(65536))
    return events


def test_sending_goodbye_ends_every_stream_on_our_side_too() -> None:
    client, server = subscribed(demand=2)
    feed(client, server.send(Subscribe("back", 4, 1)))
    client.send(Goodbye("leaving"))
    assert client.mine.live == {}
    assert client.theirs.live == {}
    with pytest.raises(LocalProtocolError):
        client.send_elements(4, [b"x"])


_CONVERSATION = bytes.fromhex("93 01 00 91 01") + b"".join(
    bytes.fromhex(h)
    for h in (
        "94 05 a3 70 75 62 01 03",
        "93 06 01 02",
        "92 40 c4 01 70",
        "94 05 a3 70 75 62 02 00",
        "92 07 01",
        "92 03 a3 62 79 65",
    )
)


@given(st.lists(st.tuples(st.integers(0, len(_CONVERSATION) - 1), st.integers(0, 255)), max_size=6))
def test_a_mutated_conversation_only_raises_remote_protocol_errors(
    mutations: list[tuple[int, int]],
) -> None:
    data = bytearray(_CONVERSATION)
    for where, value in mutations:
        data[where] = value
    server = Connection(Role.SERVER, Limits(max_message=256, max_str=16, max_array=8))
    try:
        for i in range(0, len(data), 3):
            feed(server, bytes(data[i : i + 3]))
            assert server.held_bytes <= 256
        server.receive_data(b"")
        assert drain(server)[-1:] == [ConnectionClosed()]
    except RemoteProtocolError:
        assert server.state is CodecState.ERROR
        assert server.held_bytes == 0
