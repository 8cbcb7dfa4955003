"""The WebSocket stream and handshakes over in-memory stream pairs, with a raw wsproto peer."""

from __future__ import annotations

import contextlib

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st
from interchange_websocket.address import parse_ws_address
from interchange_websocket.handshake import client_handshake, server_handshake
from interchange_websocket.stream import CLOSE_TIMEOUT, WebSocketStream
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    Pong,
    RejectConnection,
    RejectData,
    Request,
)

from gateway.sdk import RemoteProtocolError

Stream = trio.abc.Stream


class Peer:
    """An independent end written with wsproto alone, to drive and observe ours."""

    def __init__(self, stream: Stream, kind: ConnectionType) -> None:
        self.stream = stream
        self.ws = WSConnection(kind)

    async def send(self, *events: Event) -> None:
        await self.stream.send_all(b"".join(self.ws.send(e) for e in events))

    async def next(self) -> Event:
        while True:
            for event in self.ws.events():
                return event
            data = await self.stream.receive_some()
            if not data:
                raise EOFError
            self.ws.receive_data(bytes(data))

    async def raw(self) -> bytes:
        data = b""
        while chunk := await self.stream.receive_some():
            data += chunk
        return data


async def opened(
    address: str = "ws://h:1/p", request: Request | None = None
) -> tuple[WebSocketStream, Peer]:
    """Our server stream and the raw client, handshake done."""
    ours, theirs = trio.testing.memory_stream_pair()
    peer = Peer(theirs, ConnectionType.CLIENT)
    await peer.send(request or Request(host="h:1", target="/p"))
    stream = await server_handshake(ours, parse_ws_address(address))
    assert isinstance(await peer.next(), AcceptConnection)
    return stream, peer


async def test_server_handshake_then_bytes_both_ways() -> None:
    stream, peer = await opened()
    await peer.send(Message(data=b"hello "), Message(data=b"world"))
    got = b""
    while len(got) < 11:
        got += await stream.receive_some()
    assert got == b"hello world"
    await stream.send_all(b"one message")
    event = await peer.next()
    assert isinstance(event, BytesMessage)
    assert (event.data, event.message_finished) == (b"one message", True)


async def test_client_handshake_sends_host_path_subprotocols_and_origin() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    peer = Peer(theirs, ConnectionType.SERVER)
    address = parse_ws_address(
        "ws://gw.example:8080/rs?subprotocol=a.v2&subprotocol=a.v1&origin=https://app.example"
    )
    async with trio.open_nursery() as nursery:
        result: list[WebSocketStream] = []

        async def client() -> None:
            result.append(await client_handshake(ours, address))

        nursery.start_soon(client)
        request = await peer.next()
        assert isinstance(request, Request)
        assert (request.host, request.target) == ("gw.example:8080", "/rs")
        assert request.subprotocols == ["a.v2", "a.v1"]
        assert (b"origin", b"https://app.example") in request.extra_headers
        await peer.send(AcceptConnection(subprotocol="a.v1"))
    assert result[0].subprotocol == "a.v1"


async def test_our_client_and_server_agree_on_the_servers_preferred_subprotocol() -> None:
    a, b = trio.testing.memory_stream_pair()
    server_at = parse_ws_address("ws://h:1/?subprotocol=x.v2&subprotocol=x.v1")
    client_at = parse_ws_address("ws://h:1/?subprotocol=x.v1&subprotocol=x.v2")
    async with trio.open_nursery() as nursery:
        got: dict[str, WebSocketStream] = {}

        async def run_server() -> None:
            got["server"] = await server_handshake(a, server_at)

        nursery.start_soon(run_server)
        got["client"] = await client_handshake(b, client_at)
    assert got["server"].subprotocol == got["client"].subprotocol == "x.v2"
    await got["client"].send_all(b"up")
    assert await got["server"].receive_some() == b"up"


def upgrade_then_frame() -> tuple[bytes, bytes]:
    """A client's upgrade request, and its first (masked) message for after the 101."""
    client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    request = client.send(Request(host="h:1", target="/p", subprotocols=["s"]))
    server.receive_data(request)
    list(server.events())
    client.receive_data(server.send(AcceptConnection(subprotocol="s")))
    list(client.events())
    return request, client.send(Message(data=b"after"))


async def feed(stream: Stream, pieces: list[bytes]) -> None:
    for piece in pieces:
        await stream.send_all(piece)
        await trio.sleep(0)


async def read(stream: Stream, n: int) -> bytes:
    got = b""
    while len(got) < n:
        got += await stream.receive_some()
    return got


def splits(raw: bytes) -> list[list[bytes]]:
    """``raw`` in two pieces at every split point, and one byte at a time."""
    return [[raw[:i], raw[i:]] for i in range(1, len(raw))] + [
        [raw[i : i + 1] for i in range(len(raw))]
    ]


async def test_the_upgrade_request_split_at_every_byte() -> None:
    request, frame = upgrade_then_frame()
    for pieces in splits(request):
        ours, theirs = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed, theirs, pieces)
            stream = await server_handshake(ours, parse_ws_address("ws://h:1/p?subprotocol=s"))
        assert stream.subprotocol == "s"
        await theirs.send_all(frame)
        assert await read(stream, 5) == b"after"


async def answer_in_pieces(stream: Stream, split: int) -> int:
    """Answer an upgrade (101 and a first message) in the ``split``-th way; how many ways."""
    ws = WSConnection(ConnectionType.SERVER)
    while not any(isinstance(e, Request) for e in ws.events()):
        ws.receive_data(bytes(await stream.receive_some()))
    ways = splits(ws.send(AcceptConnection()) + ws.send(Message(data=b"after")))
    await feed(stream, ways[split])
    return len(ways)


async def answer_in_pieces_into(stream: Stream, split: int, ways: list[int]) -> None:
    ways.append(await answer_in_pieces(stream, split))


async def test_the_upgrade_answer_split_at_every_byte() -> None:
    split, ways = 0, 1
    answered: list[int] = []
    while split < ways:
        ours, theirs = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(answer_in_pieces_into, theirs, split, answered)
            stream = await client_handshake(ours, parse_ws_address("ws://h:1/p"))
            assert await read(stream, 5) == b"after"  # the message that came with the 101
        ways = answered[-1]
        split += 1
    assert ways > 100


async def test_a_fragmented_message_arrives_as_its_bytes() -> None:
    stream, peer = await opened()
    await peer.send(
        Message(data=b"frag", message_finished=False),
        Ping(payload=b"between"),
        Message(data=b"mented", message_finished=True),
    )
    assert await read(stream, 10) == b"fragmented"
    pong = await peer.next()
    assert isinstance(pong, Pong)
    assert pong.payload == b"between"


async def test_receive_some_respects_max_bytes() -> None:
    stream, peer = await opened()
    await peer.send(Message(data=b"abcdef"))
    assert [await stream.receive_some(4), await stream.receive_some(4)] == [b"abcd", b"ef"]


async def test_text_messages_are_taken_as_their_utf8_bytes() -> None:
    stream, peer = await opened()
    await peer.send(Message(data='{"op":"ping","x":"é"}'))
    assert await read(stream, 22) == '{"op":"ping","x":"é"}'.encode()


def masked_frame(first: int, payload: bytes) -> bytes:
    """A client frame with a zero mask (so the payload reads as it is)."""
    return bytes([first, 0x80 | len(payload)]) + b"\0\0\0\0" + payload


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (masked_frame(0x81, b"\xff\xfe"), 1007),  # text that is not UTF-8
        (bytes([0x82, 0x02]) + b"hi", 1002),  # a client frame without a mask
        (masked_frame(0x83, b"x"), 1002),  # a reserved opcode
    ],
)
async def test_bytes_that_break_the_protocol_close_with_wsprotos_code(
    frame: bytes, code: int
) -> None:
    stream, peer = await opened()
    await peer.stream.send_all(frame)
    with pytest.raises(RemoteProtocolError, match=f"closed with {code}"):
        await stream.receive_some()
    close = await peer.next()
    assert isinstance(close, CloseConnection)
    assert close.code == code


async def test_a_message_over_max_message_closes_1009() -> None:
    stream, peer = await opened("ws://h:1/p?max_message=10")
    await peer.send(Message(data=b"0123456789"))  # exactly the limit: fine
    assert await read(stream, 10) == b"0123456789"
    await peer.send(Message(data=b"01234", message_finished=False))
    await peer.send(Message(data=b"567890", message_finished=True))
    with pytest.raises(RemoteProtocolError, match=r"larger than max_message \(10 bytes\)"):
        await read(stream, 11)
    close = await peer.next()
    assert isinstance(close, CloseConnection)
    assert (close.code, close.reason) == (1009, "message too big")


async def test_pings_are_answered_inline() -> None:
    stream, peer = await opened()
    await peer.send(Ping(payload=b"p1"), Message(data=b"x"))
    assert await stream.receive_some() == b"x"
    pong = await peer.next()
    assert isinstance(pong, Pong)
    assert pong.payload == b"p1"


async def test_a_peers_close_is_answered_and_reads_as_eof() -> None:
    stream, peer = await opened()
    await peer.send(Message(data=b"last"), CloseConnection(code=1001, reason="bye"))
    assert await read(stream, 4) == b"last"
    assert await stream.receive_some() == b""
    assert stream.close_code == 1001
    answer = await peer.next()
    assert isinstance(answer, CloseConnection)
    assert answer.code == 1001
    with pytest.raises(trio.BrokenResourceError):
        await stream.send_all(b"too late")
    await stream.aclose()


async def test_our_close_sends_1000_and_waits_for_the_peers() -> None:
    stream, peer = await opened()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.aclose)
        close = await peer.next()
        assert isinstance(close, CloseConnection)
        assert close.code == 1000
        await peer.send(close.response())
    assert await peer.stream.receive_some() == b""  # the socket closed after the answer
    with pytest.raises(trio.ClosedResourceError):
        await stream.send_all(b"x")


async def test_our_close_gives_up_on_a_silent_peer(autojump_clock: trio.abc.Clock) -> None:
    stream, peer = await opened()
    start = trio.current_time()
    await stream.aclose()
    assert trio.current_time() - start == pytest.approx(CLOSE_TIMEOUT)
    assert isinstance(await peer.next(), CloseConnection)


async def test_close_while_another_task_reads(autojump_clock: trio.abc.Clock) -> None:
    stream, peer = await opened()
    async with trio.open_nursery() as nursery:
        got: list[bytes] = []

        async def reader() -> None:
            got.append(await stream.receive_some())

        nursery.start_soon(reader)
        await trio.sleep(1)
        nursery.start_soon(stream.aclose)
        close = await peer.next()
        assert isinstance(close, CloseConnection)
        start = trio.current_time()
        await peer.send(close.response())
    assert got == [b""]
    assert trio.current_time() - start < CLOSE_TIMEOUT


async def test_a_hang_up_without_a_close_frame_reads_as_eof() -> None:
    stream, peer = await opened()
    await peer.stream.aclose()
    assert await stream.receive_some() == b""


# -- refusals ---------------------------------------------------------------------------


async def refused(address: str, raw: bytes) -> tuple[bytes, str]:
    """What our server answers to ``raw``, and the handshake error's text."""
    ours, theirs = trio.testing.memory_stream_pair()
    await theirs.send_all(raw)
    with pytest.raises(RemoteProtocolError) as info:
        await server_handshake(ours, parse_ws_address(address))
    await ours.aclose()
    return await Peer(theirs, ConnectionType.CLIENT).raw(), str(info.value)


def upgrade(target: str = "/p", *, subprotocols: tuple[str, ...] = (), origin: str = "") -> bytes:
    extra = [(b"Origin", origin.encode())] if origin else []
    request = Request(host="h:1", target=target, subprotocols=list(subprotocols))
    return WSConnection(ConnectionType.CLIENT).send(
        Request(
            host=request.host,
            target=request.target,
            subprotocols=request.subprotocols,
            extra_headers=extra,
        )
    )


@pytest.mark.parametrize(
    ("address", "raw", "status", "reason"),
    [
        ("ws://h:1/p", b"GET /p HTTP/1.1\r\nHost: h\r\n\r\n", 426, "websocket endpoint"),
        ("ws://h:1/p", b"NOT HTTP AT ALL\r\n\r\n", 400, "Bad HTTP message"),
        ("ws://h:1/p", b"POST /p HTTP/1.1\r\nHost: h\r\n\r\n", 400, "must be GET"),
        ("ws://h:1/p", upgrade("/other"), 404, "no websocket at /other; try /p"),
        ("ws://h:1/p?subprotocol=a&subprotocol=b", upgrade(), 400, "subprotocols a, b"),
        ("ws://h:1/p?subprotocol=a", upgrade(subprotocols=("z",)), 400, "subprotocols a"),
        (
            "ws://h:1/p?origin=https://app.example",
            upgrade(origin="https://evil.example"),
            403,
            "origin https://evil.example is not allowed",
        ),
    ],
)
async def test_bad_upgrades_get_an_http_error_with_a_reason(
    address: str, raw: bytes, status: int, reason: str
) -> None:
    answer, error = await refused(address, raw)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode())
    assert reason.encode() in body
    assert f"refused with {status}" in error
    if status == 426:
        assert b"Upgrade: websocket" in head


async def test_allowed_origins_and_requests_without_one_are_accepted() -> None:
    address = "ws://h:1/p?origin=https://app.example&origin=http://localhost:8000"
    for origin in ("https://APP.example", "http://localhost:8000", ""):
        stream, _ = await opened(
            address,
            Request(
                host="h:1",
                target="/p?x=1",
                extra_headers=[(b"Origin", origin.encode())] if origin else [],
            ),
        )
        assert stream.subprotocol is None


async def test_a_client_refused_by_the_server_fails_with_the_status() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    peer = Peer(theirs, ConnectionType.SERVER)
    async with trio.open_nursery() as nursery:

        async def server() -> None:
            assert isinstance(await peer.next(), Request)
            await peer.send(RejectConnection(status_code=403, has_body=True), RejectData(b"no"))

        nursery.start_soon(server)
        with pytest.raises(RemoteProtocolError, match="answered HTTP 403"):
            await client_handshake(ours, parse_ws_address("ws://h:1/"))


async def test_a_client_whose_subprotocols_the_server_ignores_fails() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    peer = Peer(theirs, ConnectionType.SERVER)
    async with trio.open_nursery() as nursery:

        async def server() -> None:
            assert isinstance(await peer.next(), Request)
            await peer.send(AcceptConnection())

        nursery.start_soon(server)
        with pytest.raises(RemoteProtocolError, match="chose none of the subprotocols a"):
            await client_handshake(ours, parse_ws_address("ws://h:1/?subprotocol=a"))


async def test_a_hang_up_during_the_handshake_fails_it() -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    await theirs.send_all(upgrade()[:20])
    await theirs.aclose()
    with pytest.raises(RemoteProtocolError, match="closed during the opening handshake"):
        await server_handshake(ours, parse_ws_address("ws://h:1/p"))


# -- whatever the peer sends ------------------------------------------------------------


async def drain(stream: WebSocketStream) -> None:
    """Read to the end; only the end of the stream or RemoteProtocolError may come out."""
    with contextlib.suppress(RemoteProtocolError):
        while await stream.receive_some(7):
            pass


@settings(max_examples=200, deadline=None)
@given(junk=st.binary(max_size=300), limit=st.integers(1, 64))
def test_random_bytes_after_the_handshake_only_raise_remote_protocol_error(
    junk: bytes, limit: int
) -> None:
    async def main() -> None:
        stream, peer = await opened(f"ws://h:1/p?max_message={limit}")
        await peer.stream.send_all(junk)
        await peer.stream.aclose()
        await drain(stream)
        await stream.aclose()

    trio.run(main)


@settings(max_examples=200, deadline=None)
@given(junk=st.binary(max_size=300))
def test_random_requests_are_answered_or_refused_never_crash(junk: bytes) -> None:
    async def main() -> None:
        ours, theirs = trio.testing.memory_stream_pair()
        await theirs.send_all(junk)
        await theirs.aclose()
        with contextlib.suppress(RemoteProtocolError):
            await server_handshake(ours, parse_ws_address("ws://h:1/p"))

    trio.run(main)
