"""The trio ttrpc server over real TCP sockets, driven by the client codec: the four call
kinds, routing errors, handler errors, deadlines, concurrency in completion order, and a
call whose inbound queue overflows failing alone."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
import trio.testing

from gateway.sdk import NEED_DATA
from protocols.ttrpc import Code, Status, TtrpcError
from protocols.ttrpc import status as statuses
from protocols.ttrpc.codec import CallKind, ClientCodec
from protocols.ttrpc.events import Reply, StreamMessage
from protocols.ttrpc.server import (
    INBOUND_MESSAGES,
    INBOUND_WAIT,
    CallContext,
    MessageStream,
    Service,
    TtrpcSession,
)

OK = Status(Code.OK)


def services() -> dict[str, Service]:
    svc = Service("test.v1.Echo")

    async def echo(ctx: CallContext, payload: bytes) -> bytes:
        return payload + b"|" + ",".join(ctx.get("X-Tag")).encode()

    async def count(ctx: CallContext, payload: bytes, out: MessageStream) -> None:
        for i in range(int(payload)):
            await out.send(str(i).encode())

    async def total(ctx: CallContext, messages: AsyncIterator[bytes]) -> bytes:
        return str(sum([int(m) async for m in messages])).encode()

    async def chat(ctx: CallContext, messages: AsyncIterator[bytes], out: MessageStream) -> None:
        async for m in messages:
            await out.send(m.upper())

    async def fail(ctx: CallContext, payload: bytes) -> bytes:
        if payload == b"status":
            raise TtrpcError(Code.NOT_FOUND, "no such thing")
        raise ValueError("boom")

    async def hang(ctx: CallContext, payload: bytes) -> bytes:
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    async def deaf(ctx: CallContext, messages: AsyncIterator[bytes]) -> bytes:
        await trio.sleep_forever()
        raise AssertionError  # pragma: no cover

    svc.unary("Echo", echo)
    svc.server_streaming("Count", count)
    svc.client_streaming("Total", total)
    svc.bidi("Chat", chat)
    svc.unary("Fail", fail)
    svc.unary("Hang", hang)
    svc.client_streaming("Deaf", deaf)
    return {svc.name: svc}


class Client:
    """A test client: the client codec over one TCP stream."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.codec = ClientCodec()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def events(self, until: int) -> list[object]:
        """Events until the Reply of stream ``until``."""
        out: list[object] = []
        while True:
            event = self.codec.next_event()
            if event is NEED_DATA:
                self.codec.receive_data(await self.stream.receive_some(65536))
                continue
            out.append(event)
            if isinstance(event, Reply) and event.stream_id == until:
                return out

    async def unary(self, method: str, payload: bytes, **kw: Any) -> Reply:
        sid, wire = self.codec.start(CallKind.UNARY, "test.v1.Echo", method, payload, **kw)
        await self.send(wire)
        *_, reply = await self.events(sid)
        assert isinstance(reply, Reply)
        return reply


@pytest.fixture
async def client(nursery: trio.Nursery) -> AsyncIterator[Client]:
    table = services()

    async def serve(stream: trio.SocketStream) -> None:
        await TtrpcSession(stream, table).run()

    listeners = await nursery.start(trio.serve_tcp, serve, 0)
    stream = await trio.testing.open_stream_to_socket_listener(listeners[0])
    async with stream:
        yield Client(stream)


async def test_unary_with_metadata(client: Client) -> None:
    reply = await client.unary("Echo", b"hi", metadata=[("x-tag", "a"), ("X-Tag", "b")])
    assert reply.status == OK
    assert reply.payload == b"hi|a,b"


async def test_unknown_service_and_method(client: Client) -> None:
    sid, wire = client.codec.start(CallKind.UNARY, "nope.Svc", "M")
    await client.send(wire)
    (reply,) = await client.events(sid)
    assert reply == Reply(sid, statuses.unknown_service("nope.Svc"), b"")
    assert (await client.unary("Nope", b"")).status == statuses.unknown_method("Nope")


async def test_handler_errors(client: Client) -> None:
    assert (await client.unary("Fail", b"status")).status == Status(Code.NOT_FOUND, "no such thing")
    assert (await client.unary("Fail", b"other")).status == Status(Code.UNKNOWN, "boom")


async def test_server_streaming(client: Client) -> None:
    sid, wire = client.codec.start(CallKind.SERVER_STREAMING, "test.v1.Echo", "Count", b"3")
    await client.send(wire)
    assert await client.events(sid) == [
        StreamMessage(sid, b"0"),
        StreamMessage(sid, b"1"),
        StreamMessage(sid, b"2"),
        Reply(sid, OK, None),
    ]


async def test_client_streaming_and_bidi(client: Client) -> None:
    sid, wire = client.codec.start(CallKind.CLIENT_STREAMING, "test.v1.Echo", "Total")
    for n in (b"1", b"2", b"39"):
        wire += client.codec.send(sid, n)
    await client.send(wire + client.codec.close_send(sid))
    assert await client.events(sid) == [Reply(sid, OK, b"42")]
    sid, wire = client.codec.start(CallKind.BIDI, "test.v1.Echo", "Chat")
    await client.send(wire + client.codec.send(sid, b"ping"))
    assert client.codec.next_event() is NEED_DATA
    client.codec.receive_data(await client.stream.receive_some(65536))
    assert client.codec.next_event() == StreamMessage(sid, b"PING")
    await client.send(client.codec.send(sid, b"") + client.codec.close_send(sid))
    assert await client.events(sid) == [StreamMessage(sid, b""), Reply(sid, OK, None)]


async def test_calls_run_concurrently_and_reply_in_completion_order(
    client: Client, autojump_clock: trio.testing.MockClock
) -> None:
    slow, wire = client.codec.start(CallKind.UNARY, "test.v1.Echo", "Hang", timeout_nano=10**9)
    fast, wire2 = client.codec.start(CallKind.UNARY, "test.v1.Echo", "Echo", b"quick")
    await client.send(wire + wire2)
    got = await client.events(slow)
    assert got == [Reply(fast, OK, b"quick|"), Reply(slow, statuses.deadline_exceeded(), b"")]


async def test_a_deadline_ends_the_handler(
    client: Client, autojump_clock: trio.testing.MockClock
) -> None:
    before = trio.current_time()
    reply = await client.unary("Hang", b"", timeout_nano=5 * 10**9)
    assert reply.status == Status(Code.DEADLINE_EXCEEDED, "context deadline exceeded")
    assert trio.current_time() - before == pytest.approx(5, abs=0.5)


async def test_an_overfull_inbound_queue_fails_only_its_call(
    client: Client, autojump_clock: trio.testing.MockClock
) -> None:
    sid, wire = client.codec.start(CallKind.CLIENT_STREAMING, "test.v1.Echo", "Deaf")
    for _ in range(INBOUND_MESSAGES + 1):
        wire += client.codec.send(sid, b"x")
    before = trio.current_time()
    await client.send(wire)
    (reply,) = await client.events(sid)
    assert isinstance(reply, Reply)
    assert reply.status.code == Code.RESOURCE_EXHAUSTED
    assert trio.current_time() - before == pytest.approx(INBOUND_WAIT, abs=0.1)
    assert (await client.unary("Echo", b"still")).payload == b"still|"


async def test_a_burst_larger_than_the_queue_reaches_a_handler_that_keeps_up(
    client: Client,
) -> None:
    sid, wire = client.codec.start(CallKind.CLIENT_STREAMING, "test.v1.Echo", "Total")
    for _ in range(INBOUND_MESSAGES * 4):
        wire += client.codec.send(sid, b"1")
    wire += client.codec.close_send(sid)
    await client.send(wire)
    (reply,) = await client.events(sid)
    assert reply == Reply(sid, OK, str(INBOUND_MESSAGES * 4).encode())
