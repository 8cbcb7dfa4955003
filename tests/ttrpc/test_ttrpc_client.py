"""The trio ttrpc client against our server over real sockets: the four call kinds,
metadata on every kind, typed errors, deadlines (local and sent as ``timeout_nano``),
concurrent calls answered out of order, bounded inbound queues, and a lost connection
failing only the calls that were on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
import trio.testing

from protocols.ttrpc import Code, TtrpcError
from protocols.ttrpc.client import CallKind, Client, open_client
from protocols.ttrpc.server import CallContext, MessageStream, Service, TtrpcSession

SVC = "test.v1.Echo"


def services(seen_timeouts: list[float]) -> dict[str, Service]:
    svc = Service(SVC)

    async def echo(ctx: CallContext, payload: bytes) -> bytes:
        return payload

    async def meta(ctx: CallContext, payload: bytes) -> bytes:
        return ";".join(f"{k}={v}" for k, v in ctx.metadata).encode()

    async def sleep(ctx: CallContext, payload: bytes) -> bytes:
        seen_timeouts.append(ctx.deadline - trio.current_time())
        await trio.sleep(float(payload))  # the service's Sleep: holds the call as long as asked
        return b"slept"

    async def count(ctx: CallContext, payload: bytes, out: MessageStream) -> None:
        for i in range(int(payload)):
            await out.send(str(i).encode())
        if ctx.get("fail-after"):
            raise TtrpcError(Code.ABORTED, "stopped", ())

    async def total(ctx: CallContext, messages: AsyncIterator[bytes]) -> bytes:
        return str(sum([int(m) async for m in messages])).encode() + b"|" + meta_of(ctx)

    async def chat(ctx: CallContext, messages: AsyncIterator[bytes], out: MessageStream) -> None:
        await out.send(meta_of(ctx))
        async for m in messages:
            await out.send(m.upper())

    async def fail(ctx: CallContext, payload: bytes) -> bytes:
        from google.protobuf import any_pb2, wrappers_pb2

        detail = any_pb2.Any()
        detail.Pack(wrappers_pb2.StringValue(value="why"))
        raise TtrpcError(Code.PERMISSION_DENIED, payload.decode(), [detail])

    def meta_of(ctx: CallContext) -> bytes:
        return ",".join(ctx.get("x-id")).encode()

    svc.unary("Echo", echo)
    svc.unary("Meta", meta)
    svc.unary("Sleep", sleep)
    svc.unary("Fail", fail)
    svc.server_streaming("Count", count)
    svc.client_streaming("Total", total)
    svc.bidi("Chat", chat)
    return {svc.name: svc}


@pytest.fixture
def seen_timeouts() -> list[float]:
    return []


@pytest.fixture
async def client(nursery: trio.Nursery, seen_timeouts: list[float]) -> AsyncIterator[Client]:
    table = services(seen_timeouts)

    async def serve(stream: trio.SocketStream) -> None:
        await TtrpcSession(stream, table).run()

    listeners = await nursery.start(trio.serve_tcp, serve, 0)
    stream = await trio.testing.open_stream_to_socket_listener(listeners[0])
    async with open_client(stream) as c:
        yield c


async def test_unary_and_metadata(client: Client) -> None:
    assert await client.call(SVC, "Echo", b"hello") == b"hello"
    assert await client.call(SVC, "Echo") == b""
    meta = await client.call(SVC, "Meta", metadata={"a": "1", "b": ["2", "3"]})
    assert meta == b"a=1;b=2;b=3"
    assert await client.call(SVC, "Meta", metadata=[("z", "1"), ("a", "2")]) == b"z=1;a=2"


async def test_errors_are_typed(client: Client) -> None:
    with pytest.raises(TtrpcError) as info:
        await client.call(SVC, "Fail", b"not you")
    error = info.value
    assert (error.code, error.message) == (Code.PERMISSION_DENIED, "not you")
    assert error.details[0].TypeName() == "google.protobuf.StringValue"
    with pytest.raises(TtrpcError) as info:
        await client.call("no.Such", "M")
    assert info.value.code == Code.UNIMPLEMENTED
    assert info.value.message == "service no.Such"


async def test_server_streaming(client: Client) -> None:
    async with client.stream(SVC, "Count", CallKind.SERVER_STREAMING, b"3") as call:
        assert [m async for m in call] == [b"0", b"1", b"2"]
        assert call.status is not None
        assert call.status.ok
    async with client.stream(SVC, "Count", CallKind.SERVER_STREAMING, b"0") as call:
        assert [m async for m in call] == []
    meta = {"fail-after": "yes"}
    async with client.stream(SVC, "Count", CallKind.SERVER_STREAMING, b"2", metadata=meta) as call:
        assert await call.receive() == b"0"
        assert await call.receive() == b"1"
        with pytest.raises(TtrpcError) as info:
            await call.receive()
        assert (info.value.code, info.value.message) == (Code.ABORTED, "stopped")


async def test_client_streaming_with_metadata(client: Client) -> None:
    kind = CallKind.CLIENT_STREAMING
    async with client.stream(SVC, "Total", kind, metadata={"x-id": "7"}) as call:
        for n in (b"1", b"2", b"39"):
            await call.send(n)
        await call.close_send()
        assert await call.response() == b"42|7"
    async with client.stream(SVC, "Total", kind) as call:
        await call.close_send()
        assert await call.response() == b"0|"


async def test_bidi(client: Client) -> None:
    async with client.stream(SVC, "Chat", CallKind.BIDI, metadata={"x-id": "me"}) as call:
        assert await call.receive() == b"me"
        await call.send(b"abc")
        assert await call.receive() == b"ABC"
        await call.send(b"")
        assert await call.receive() == b""
        await call.close_send()
        with pytest.raises(trio.EndOfChannel):
            await call.receive()
        with pytest.raises(TtrpcError):
            await call.send(b"late")


async def test_concurrent_calls_reply_in_completion_order(
    client: Client, autojump_clock: trio.testing.MockClock
) -> None:
    finished: list[bytes] = []

    async def sleep(seconds: str) -> None:
        await client.call(SVC, "Sleep", seconds.encode())
        finished.append(seconds.encode())

    async with trio.open_nursery() as nursery:
        for seconds in ("3", "1", "2"):
            nursery.start_soon(sleep, seconds)
    assert finished == [b"1", b"2", b"3"]


async def test_deadline_is_sent_and_kept(
    client: Client, seen_timeouts: list[float], autojump_clock: trio.testing.MockClock
) -> None:
    with pytest.raises(TtrpcError) as info:
        await client.call(SVC, "Sleep", b"10", timeout=2)
    assert (info.value.code, info.value.message) == (
        Code.DEADLINE_EXCEEDED,
        "context deadline exceeded",
    )
    assert seen_timeouts[-1] == pytest.approx(2, abs=0.01)
    # The caller's own trio deadline counts too.
    with trio.move_on_after(5):
        with pytest.raises(TtrpcError):
            await client.call(SVC, "Sleep", b"10")
    assert seen_timeouts[-1] == pytest.approx(5, abs=0.01)
    assert await client.call(SVC, "Sleep", b"1", timeout=2) == b"slept"
    assert client.active_calls == 0


async def test_local_deadline_holds_against_a_server_that_ignores_it(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    _server_side, client_side = trio.testing.memory_stream_pair()
    async with open_client(client_side) as client:
        with pytest.raises(TtrpcError) as info:
            await client.call(SVC, "Echo", b"x", timeout=1)
        assert info.value.code == Code.DEADLINE_EXCEEDED
        async with client.stream(SVC, "Count", CallKind.SERVER_STREAMING, b"1", timeout=1) as call:
            with pytest.raises(TtrpcError):
                await call.receive()
        assert client.active_calls == 0


async def test_a_call_that_cannot_be_sent_fails_by_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A server that does not read: the connection's output stays over its high water,
    and a call waiting for room there still ends by its deadline."""
    _server_side, client_side = trio.testing.lockstep_stream_pair()
    with trio.fail_after(60):  # without the bound, the calls would wait forever
        await _calls_over_a_full_connection(client_side)


async def _calls_over_a_full_connection(client_side: trio.abc.Stream) -> None:
    async with open_client(client_side) as client, trio.open_nursery() as nursery:
        # The writer blocks on the first; the second stays queued, over the high water.
        for _ in range(2):
            nursery.start_soon(client.call, SVC, "Echo", bytes(2 << 20))
        await trio.testing.wait_all_tasks_blocked()
        started = trio.current_time()
        with pytest.raises(TtrpcError) as info:
            await client.call(SVC, "Echo", b"x", timeout=1)
        assert info.value.code == Code.DEADLINE_EXCEEDED
        assert trio.current_time() == started + 1
        with pytest.raises(TtrpcError) as info:
            async with client.stream(SVC, "Total", CallKind.CLIENT_STREAMING, timeout=5):
                pass  # never reached: the Request itself cannot go
        assert info.value.code == Code.DEADLINE_EXCEEDED
        assert trio.current_time() == started + 6
        nursery.cancel_scope.cancel()


async def test_a_message_that_cannot_be_sent_fails_its_call_by_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _server_side, client_side = trio.testing.lockstep_stream_pair()
    with trio.fail_after(60):  # without the bound, the send would wait forever
        await _a_message_over_a_full_connection(client_side)


async def _a_message_over_a_full_connection(client_side: trio.abc.Stream) -> None:
    async with open_client(client_side) as client:
        async with client.stream(SVC, "Total", CallKind.CLIENT_STREAMING, timeout=3) as call:
            await trio.testing.wait_all_tasks_blocked()  # the writer holds the Request
            await call.send(bytes(2 << 20))  # queued: over the high water now
            with pytest.raises(TtrpcError) as info:
                await call.send(b"x")
            assert info.value.code == Code.DEADLINE_EXCEEDED
            assert trio.current_time() == 3
        assert client.active_calls == 0


async def test_cancelled_call_is_forgotten(
    client: Client, autojump_clock: trio.testing.MockClock
) -> None:
    with trio.move_on_after(0.5) as scope:
        # A cancel scope without a deadline of its own: nothing is sent as timeout_nano.
        scope.deadline = float("inf")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.call, SVC, "Sleep", b"5")
            await trio.sleep(0.1)
            scope.cancel()
    assert client.active_calls == 0
    assert await client.call(SVC, "Echo", b"still fine") == b"still fine"


async def test_overfull_inbound_queue_fails_only_its_call(
    nursery: trio.Nursery, seen_timeouts: list[float], autojump_clock: trio.testing.MockClock
) -> None:
    table = services(seen_timeouts)

    async def serve(stream: trio.SocketStream) -> None:
        await TtrpcSession(stream, table).run()

    listeners = await nursery.start(trio.serve_tcp, serve, 0)
    stream = await trio.testing.open_stream_to_socket_listener(listeners[0])
    async with open_client(stream, max_inbound=4) as client:
        async with client.stream(SVC, "Count", CallKind.SERVER_STREAMING, b"10") as call:
            # Not read while the server sends 10: the 5th finds no room for a second.
            await trio.sleep(2)
            assert await client.call(SVC, "Echo", b"after") == b"after"
            got = [await call.receive() for _ in range(4)]
            assert got == [b"0", b"1", b"2", b"3"]
            with pytest.raises(TtrpcError) as info:
                await call.receive()
            assert info.value.code == Code.RESOURCE_EXHAUSTED
        assert await client.call(SVC, "Echo", b"ok") == b"ok"


async def test_a_burst_larger_than_the_queue_reaches_a_reader_that_keeps_up(
    client: Client,
) -> None:
    async with client.stream(SVC, "Count", CallKind.SERVER_STREAMING, b"2000") as call:
        got = [m async for m in call]
    assert got == [str(i).encode() for i in range(2000)]


async def test_lost_connection_fails_its_calls(autojump_clock: trio.testing.MockClock) -> None:
    server_side, client_side = trio.testing.memory_stream_pair()
    async with open_client(client_side) as client:
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                with pytest.raises(TtrpcError) as info:
                    await client.call(SVC, "Echo", b"x")
                assert (info.value.code, info.value.message) == (Code.UNAVAILABLE, "ttrpc: closed")

            nursery.start_soon(call)
            nursery.start_soon(call)
            await trio.sleep(1)
            assert client.active_calls == 2
            await server_side.aclose()
        assert client.is_closed
        with pytest.raises(TtrpcError) as info:
            await client.call(SVC, "Echo", b"x")
        assert info.value.code == Code.UNAVAILABLE


async def test_unix_socket_address(
    nursery: trio.Nursery, tmp_path: Path, seen_timeouts: list[float]
) -> None:
    table = services(seen_timeouts)
    path = str(tmp_path / "ttrpc.sock")
    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen()
    listener = trio.SocketListener(sock)

    async def serve(stream: trio.abc.Stream) -> None:
        await TtrpcSession(stream, table).run()

    nursery.start_soon(trio.serve_listeners, serve, [listener])
    async with open_client(f"unix:{path}") as client:
        assert await client.call(SVC, "Echo", b"over unix") == b"over unix"
