"""The transparent proxy over real sockets: our client → ProxySession → our server.

Calls of every kind come back as from the server itself; many clients share one
upstream connection; bad input is answered by the proxy and never reaches the
server (nor does Data for a finished stream); a lost upstream fails only its
calls; a client that leaves disturbs nobody; deadlines shrink by the time spent
in the proxy."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

import pytest
import trio
import trio.testing

from gateway.protocol.plugin import ConnectionInfo, Upstream, UpstreamSettings
from gateway.protocol.session import HIGH_WATER
from protocols.ttrpc import Code, TtrpcError
from protocols.ttrpc import status as statuses
from protocols.ttrpc.client import CallKind, Client, open_client
from protocols.ttrpc.codec import ClientCodec
from protocols.ttrpc.events import Call, Reply
from protocols.ttrpc.frames import Flags, MessageType, encode_frame
from protocols.ttrpc.proxy import Pool, ProxySession, Route, Routes
from protocols.ttrpc.server import CallContext, MessageStream, Service, TtrpcSession

SVC = "test.v1.Echo"
#: The upstream's methods that take the client's messages (the pools are told).
CLIENT_STREAMING = (f"{SVC}/Total", f"{SVC}/Chat")


@dataclass
class Backend:
    """Our server as the upstream, counting what reaches it."""

    name: str
    connections: int = 0
    calls: list[Call] = field(default_factory=list)
    frames: int = 0
    timeouts: list[int] = field(default_factory=list)
    sessions: list[TtrpcSession] = field(default_factory=list)
    streams: list[trio.abc.Stream] = field(default_factory=list)
    address: str = ""

    def services(self) -> dict[str, Service]:
        svc = Service(SVC)

        async def echo(ctx: CallContext, payload: bytes) -> bytes:
            return self.name.encode() + b":" + payload

        async def meta(ctx: CallContext, payload: bytes) -> bytes:
            return ";".join(f"{k}={v}" for k, v in ctx.metadata).encode()

        async def sleep(ctx: CallContext, payload: bytes) -> bytes:
            await trio.sleep(float(payload))  # the service's Sleep: holds the call as asked
            return b"slept " + payload

        async def count(ctx: CallContext, payload: bytes, out: MessageStream) -> None:
            for i in range(int(payload)):
                await out.send(str(i).encode())

        async def total(ctx: CallContext, messages: AsyncIterator[bytes]) -> bytes:
            return str(sum([int(m) async for m in messages])).encode()

        async def chat(
            ctx: CallContext, messages: AsyncIterator[bytes], out: MessageStream
        ) -> None:
            async for m in messages:
                await out.send(m.upper())

        async def fail(ctx: CallContext, payload: bytes) -> bytes:
            raise TtrpcError(Code.FAILED_PRECONDITION, payload.decode())

        svc.unary("Echo", echo)
        svc.unary("Meta", meta)
        svc.unary("Sleep", sleep)
        svc.unary("Fail", fail)
        svc.server_streaming("Count", count)
        svc.client_streaming("Total", total)
        svc.bidi("Chat", chat)
        return {SVC: svc}

    async def serve(self, stream: trio.SocketStream) -> None:
        backend = self
        self.connections += 1
        self.streams.append(stream)

        class Recording(TtrpcSession):
            async def handle(self, event: object) -> None:
                backend.frames += 1
                if isinstance(event, Call):
                    backend.calls.append(event)
                    backend.timeouts.append(event.request.timeout_nano)
                await super().handle(event)

        session = Recording(stream, self.services())
        self.sessions.append(session)
        try:
            await session.run()
        except* (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # the test cut this connection


def connector(
    delay: float = 0,
) -> Callable[[str], Awaitable[tuple[trio.abc.Stream, ConnectionInfo]]]:
    async def connect(address: str) -> tuple[trio.abc.Stream, ConnectionInfo]:
        await trio.sleep(delay)  # an upstream slow to connect, as the test asks
        host, _, port = address.rpartition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        return stream, ConnectionInfo("ttrpc", "up", address)

    return connect


@dataclass
class Rig:
    proxy_address: tuple[str, int]
    backends: dict[str, Backend]
    pools: dict[str, Pool]

    def client(self) -> Callable[[], object]:
        host, port = self.proxy_address
        return lambda: open_client(f"{host}:{port}")


async def rig(
    nursery: trio.Nursery,
    names: tuple[str, ...] = ("a",),
    *,
    connect_delay: float = 0,
    routes: tuple[Route, ...] = (Route("test.v1.*", "a"),),
    max_backlog: int = 16 * 1024 * 1024,
    services: dict[str, Service] | None = None,
    max_calls: int = 1024,
) -> Rig:
    backends: dict[str, Backend] = {}
    pools: dict[str, Pool] = {}
    for name in names:
        backend = Backend(name)
        listeners = await nursery.start(partial(trio.serve_tcp, backend.serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        backend.address = f"127.0.0.1:{port}"
        backends[name] = backend
        settings = UpstreamSettings(name=name, protocol="ttrpc", connect=[backend.address])
        pools[name] = Pool(
            Upstream(settings, connector(connect_delay)),
            nursery,
            client_streaming=CLIENT_STREAMING,
        )
    table = Routes(list(routes), pools)

    async def serve(stream: trio.SocketStream) -> None:
        try:
            await ProxySession(
                stream, services or {}, table, max_backlog=max_backlog, max_calls=max_calls
            ).serve()
        except* (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # a client that went away (the runtime logs it)

    listeners = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
    return Rig(listeners[0].socket.getsockname()[:2], backends, pools)


async def proxied(nursery: trio.Nursery, **kwargs: object) -> tuple[Rig, Client]:
    r = await rig(nursery, **kwargs)  # type: ignore[arg-type]
    return r, await nursery_client(nursery, r)


async def nursery_client(nursery: trio.Nursery, r: Rig) -> Client:
    """A client kept open until the test's nursery ends."""
    ready: list[Client] = []
    done = trio.Event()

    async def hold(task_status: trio.TaskStatus[None]) -> None:
        host, port = r.proxy_address
        async with open_client(f"{host}:{port}") as client:
            ready.append(client)
            task_status.started()
            await done.wait()

    await nursery.start(hold)
    return ready[0]


async def test_every_call_kind_passes_through(nursery: trio.Nursery) -> None:
    r, client = await proxied(nursery)
    assert await client.call(SVC, "Echo", b"hi") == b"a:hi"
    assert await client.call(SVC, "Echo", b"") == b"a:"
    meta = [("x-b", "1"), ("X-A", "2"), ("x-b", "3")]
    assert await client.call(SVC, "Meta", metadata=meta) == b"x-b=1;X-A=2;x-b=3"
    with pytest.raises(TtrpcError) as info:
        await client.call(SVC, "Fail", b"not now")
    assert (info.value.code, info.value.message) == (Code.FAILED_PRECONDITION, "not now")
    async with client.stream(SVC, "Count", CallKind.SERVER_STREAMING, b"3") as call:
        assert [m async for m in call] == [b"0", b"1", b"2"]
    async with client.stream(SVC, "Total", CallKind.CLIENT_STREAMING) as call:
        for n in (b"1", b"2", b"3"):
            await call.send(n)
        await call.close_send()
        assert await call.response() == b"6"
    async with client.stream(SVC, "Chat", CallKind.BIDI) as call:
        await call.send(b"x")
        assert await call.receive() == b"X"
        await call.send(b"")
        assert await call.receive() == b""
        await call.close_send()
        assert [m async for m in call] == []
    with pytest.raises(TtrpcError) as info:
        await client.call(SVC, "Nope")
    assert (info.value.code, info.value.message) == (Code.UNIMPLEMENTED, "method Nope")
    # Request bytes reach the server as the client sent them.
    sent = r.backends["a"].calls[0]
    assert sent.request.payload == b"hi"
    assert sent.request.timeout_nano == 0


async def test_many_clients_share_one_upstream_connection(nursery: trio.Nursery) -> None:
    r = await rig(nursery)
    results: dict[int, list[bytes]] = {}

    async def one_client(i: int) -> None:
        host, port = r.proxy_address
        async with open_client(f"{host}:{port}") as client:
            got: list[bytes] = []

            async def call(j: int) -> None:
                got.append(await client.call(SVC, "Echo", f"{i}.{j}".encode()))

            async with trio.open_nursery() as calls:
                for j in range(10):
                    calls.start_soon(call, j)
            results[i] = sorted(got)

    async with trio.open_nursery() as clients:
        for i in range(20):
            clients.start_soon(one_client, i)
    for i in range(20):
        assert results[i] == sorted(f"a:{i}.{j}".encode() for j in range(10))
    assert r.backends["a"].connections == 1
    assert len(r.backends["a"].calls) == 200


async def test_unrouted_services_are_answered_by_the_proxy(nursery: trio.Nursery) -> None:
    r, client = await proxied(nursery)
    with pytest.raises(TtrpcError) as info:
        await client.call("other.v1.Thing", "Do")
    assert (info.value.code, info.value.message) == (Code.UNIMPLEMENTED, "service other.v1.Thing")
    assert r.backends["a"].connections == 0


async def raw_connection(r: Rig) -> tuple[trio.SocketStream, ClientCodec]:
    host, port = r.proxy_address
    return await trio.open_tcp_stream(host, port), ClientCodec()


async def replies(stream: trio.SocketStream, codec: ClientCodec, n: int) -> list[Reply]:
    """The next ``n`` Responses on the raw connection (as replies to the codec's calls)."""
    from protocols.ttrpc import ttrpc_pb2
    from protocols.ttrpc.frames import FrameReader
    from protocols.ttrpc.status import status_of

    reader = FrameReader()
    out: list[Reply] = []
    while len(out) < n:
        event = reader.next_event()
        if isinstance(event, trio.Event) or event.__class__.__name__ in ("NeedData",):
            reader.receive_data(await stream.receive_some())
            continue
        frame = event
        assert frame.type == MessageType.RESPONSE  # type: ignore[union-attr]
        response = ttrpc_pb2.Response.FromString(frame.data)  # type: ignore[union-attr]
        out.append(Reply(frame.stream_id, status_of(response), response.payload))  # type: ignore[union-attr]
    return out


async def test_bad_input_is_answered_by_the_proxy_and_never_forwarded(
    nursery: trio.Nursery,
) -> None:
    r, client = await proxied(nursery)
    assert await client.call(SVC, "Echo", b"warm") == b"a:warm"
    backend = r.backends["a"]
    frames_before = backend.frames
    stream, codec = await raw_connection(r)
    from protocols.ttrpc import ttrpc_pb2

    request = ttrpc_pb2.Request(service=SVC, method="Echo", payload=b"x").SerializeToString()
    wire = (
        encode_frame(2, MessageType.REQUEST, 0, request)  # even id
        + encode_frame(5, MessageType.REQUEST, 0, request)  # fine
        + encode_frame(3, MessageType.REQUEST, 0, request)  # reused (3 < 5)
        + encode_frame(7, MessageType.REQUEST, 0, b"\xff\xff")  # not a Request
        + encode_frame(9, MessageType.DATA, 0, b"late")  # no such stream
        + encode_frame(11, 99, 0, b"unknown type: ignored")
    )
    await stream.send_all(wire)
    got = {reply.stream_id: reply.status for reply in await replies(stream, codec, 5)}
    assert got[2] == statuses.id_not_odd()
    assert got[5].ok
    assert got[3] == statuses.id_reused()
    assert got[7].code == Code.INVALID_ARGUMENT
    assert got[7].message.startswith("unmarshal request error")
    assert got[9] == statuses.stream_inactive()
    # Data after the stream finished: answered here, never forwarded.
    await stream.send_all(encode_frame(5, MessageType.DATA, 0, b"after the end"))
    (reply,) = await replies(stream, codec, 1)
    assert reply.status == statuses.stream_inactive()
    # An oversize frame: its data is skipped, the connection goes on.
    header = (4 * 1024 * 1024 + 1).to_bytes(4, "big") + (13).to_bytes(4, "big") + b"\x01\x00"
    await stream.send_all(header + b"\0" * (4 * 1024 * 1024 + 1))
    await stream.send_all(encode_frame(15, MessageType.REQUEST, 0, request))
    got = {reply.stream_id: reply.status for reply in await replies(stream, codec, 2)}
    assert got[13] == statuses.oversize(4 * 1024 * 1024 + 1)
    assert got[15].ok
    # Only the two good calls reached the server.
    assert backend.frames == frames_before + 2
    await stream.aclose()


async def test_messages_for_a_method_not_declared_client_streaming_never_reach_it(
    nursery: trio.Nursery, caplog: pytest.LogCaptureFixture
) -> None:
    """A unary method called "remote open": the flag is the client's word, and a Go
    upstream dies of Data for a unary method. Answered here, and logged once."""
    from protocols.ttrpc import ttrpc_pb2

    r, client = await proxied(nursery)
    assert await client.call(SVC, "Echo", b"warm") == b"a:warm"
    backend = r.backends["a"]
    frames_before = backend.frames
    stream, codec = await raw_connection(r)
    request = ttrpc_pb2.Request(service=SVC, method="Echo", payload=b"x").SerializeToString()
    ro = Flags.REMOTE_OPEN
    await stream.send_all(
        encode_frame(1, MessageType.REQUEST, ro, request)
        + encode_frame(1, MessageType.DATA, 0, b"m")
        + encode_frame(3, MessageType.REQUEST, ro, request)
        + encode_frame(3, MessageType.DATA, Flags.REMOTE_CLOSED | Flags.NO_DATA)
    )
    with trio.fail_after(10):
        got = sorted(
            (reply.stream_id, reply.status.message, reply.payload)
            for reply in await replies(stream, codec, 4)
        )
    assert got == [
        (1, "", b"a:x"),
        (1, "StreamID is no longer active", b""),
        (3, "", b"a:x"),
        (3, "StreamID is no longer active", b""),
    ]
    assert backend.frames == frames_before + 2  # the two Requests, no Data
    warnings = [rec.getMessage() for rec in caplog.records if "not relayed" in rec.getMessage()]
    assert warnings == [
        f"a client's messages for {SVC}/Echo are not relayed (answered INVALID_ARGUMENT):"
        " it is not among upstream a's client_streaming methods"
    ]
    await stream.aclose()


async def test_a_lost_upstream_fails_only_its_calls(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    routes = (Route("test.v1.Echo", "a"), Route("test.v2.*", "b"))
    r = await rig(nursery, ("a", "b"), routes=routes)
    client = await nursery_client(nursery, r)
    # test.v2.Echo is served by b under the same handlers, renamed.
    b = r.backends["b"]
    b_services = b.services()
    b_services["test.v2.Echo"] = b_services.pop(SVC)
    b_services["test.v2.Echo"].name = "test.v2.Echo"
    b.services = lambda: b_services  # type: ignore[method-assign]
    outcomes: dict[str, object] = {}

    async def call(key: str, service: str, seconds: str) -> None:
        try:
            outcomes[key] = await client.call(service, "Sleep", seconds.encode())
        except TtrpcError as e:
            outcomes[key] = (e.code, e.message)

    async with trio.open_nursery() as calls:
        calls.start_soon(call, "a1", SVC, "10")
        calls.start_soon(call, "a2", SVC, "10")
        calls.start_soon(call, "b1", "test.v2.Echo", "10")
        await trio.sleep(1)
        await r.backends["a"].streams[0].aclose()  # a's server loses its connection
    assert outcomes["b1"] == b"slept 10"
    for key in ("a1", "a2"):
        code, message = outcomes[key]  # type: ignore[misc]
        assert code == Code.UNAVAILABLE
        assert message.startswith("upstream a: connection lost")
    # The next call to a opens a new connection.
    assert await client.call(SVC, "Echo", b"again") == b"a:again"
    assert r.backends["a"].connections == 2


async def test_a_client_that_leaves_disturbs_no_one(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    r = await rig(nursery)
    stay = await nursery_client(nursery, r)

    async def leave_mid_call() -> None:
        host, port = r.proxy_address
        async with open_client(f"{host}:{port}") as client:
            with trio.move_on_after(1):
                await client.call(SVC, "Sleep", b"5")

    async with trio.open_nursery() as both:
        both.start_soon(leave_mid_call)
        result = await stay.call(SVC, "Sleep", b"8")
    assert result == b"slept 8"
    assert await stay.call(SVC, "Echo", b"x") == b"a:x"
    assert r.backends["a"].connections == 1
    await trio.sleep(10)  # the orphaned call ended upstream; its reply was dropped
    assert r.pools["a"].links[0].codec.active_streams == 0


async def test_deadlines_shrink_by_the_time_spent_in_the_proxy(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    r, client = await proxied(nursery, connect_delay=0.25)
    assert await client.call(SVC, "Echo", b"x", timeout=2) == b"a:x"
    (sent,) = r.backends["a"].timeouts
    assert 1.74e9 <= sent <= 1.76e9
    # A deadline that passes while the upstream is reached is answered here.
    for link in r.pools["a"].links:
        await link.stream.aclose()
    await trio.sleep(1)
    with pytest.raises(TtrpcError) as info:
        await client.call(SVC, "Echo", b"x", timeout=0.2)
    assert info.value.code == Code.DEADLINE_EXCEEDED
    assert r.backends["a"].timeouts == [sent]


async def test_an_unreachable_upstream_is_unavailable(nursery: trio.Nursery) -> None:
    r = await rig(nursery)
    r.pools["a"].upstream.settings.connect = ["127.0.0.1:1"]
    client = await nursery_client(nursery, r)
    with pytest.raises(TtrpcError) as info:
        await client.call(SVC, "Echo", b"x")
    assert info.value.code == Code.UNAVAILABLE
    assert "upstream a: cannot connect" in info.value.message


async def test_a_client_that_does_not_read_is_closed(nursery: trio.Nursery) -> None:
    r = await rig(nursery, max_backlog=64 * 1024)
    stream, codec = await raw_connection(r)
    # A server stream of 200 000 messages that this client never reads.
    sid, wire = codec.start(CallKind.SERVER_STREAMING, SVC, "Count", b"200000")
    await stream.send_all(wire)
    client = await nursery_client(nursery, r)
    with trio.fail_after(30):
        while True:
            try:
                await stream.send_all(encode_frame(sid + 2, MessageType.DATA, Flags.NO_DATA))
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
            await trio.sleep(0.05)  # poll until disconnected, while the backlog grows
    assert await client.call(SVC, "Echo", b"fine") == b"a:fine"


async def test_a_client_streaming_to_an_upstream_that_does_not_read_is_held_back(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    """The proxy stops reading the client while the upstream connection is over its high
    water: the client's sends wait, and what the proxy holds for the upstream is bounded."""
    # Jump only once nothing happened for a while of real time: bytes in flight between
    # real sockets wait for the kernel, which a jump at once would not wait for.
    mock_clock.autojump_threshold = 0.2
    held: list[trio.SocketStream] = []

    async def deaf(stream: trio.SocketStream) -> None:
        held.append(stream)  # accepted, never read
        await trio.sleep_forever()

    upstream = await nursery.start(partial(trio.serve_tcp, deaf, 0, host="127.0.0.1"))
    settings = UpstreamSettings(
        name="deaf", protocol="ttrpc", connect=[f"127.0.0.1:{upstream[0].socket.getsockname()[1]}"]
    )
    pool = Pool(Upstream(settings, connector()), nursery, client_streaming=CLIENT_STREAMING)
    table = Routes([Route("test.v1.*", "deaf")], {"deaf": pool})

    async def serve(stream: trio.SocketStream) -> None:
        with contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            await ProxySession(stream, {}, table).serve()

    proxy = await nursery.start(partial(trio.serve_tcp, serve, 0, host="127.0.0.1"))
    host, port = proxy[0].socket.getsockname()[:2]
    message = bytes(256 * 1024)
    sent = 0
    async with (
        open_client(f"{host}:{port}") as client,
        client.stream(SVC, "Total", CallKind.CLIENT_STREAMING) as call,
    ):
        with trio.move_on_after(10):
            while sent < 256 * 1024 * 1024:  # bounded, should the proxy never hold back
                await call.send(message)
                sent += len(message)
        (link,) = pool.links
        assert link.unsent < 2 * HIGH_WATER
        assert sent < 128 * 1024 * 1024  # the client was held back, not drained
        nursery.cancel_scope.cancel()


async def test_max_calls_bounds_local_and_relayed_calls_together(
    nursery: trio.Nursery, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 0.05  # calls in flight between real sockets land first
    local = Service("local.v1.Svc")

    async def wait(ctx: CallContext, payload: bytes) -> bytes:
        await trio.sleep(float(payload))
        return b"waited"

    local.unary("Wait", wait)
    r = await rig(nursery, services={local.name: local}, max_calls=1)
    client = await nursery_client(nursery, r)

    async def refused(service: str, method: str) -> None:
        with pytest.raises(TtrpcError) as info:
            await client.call(service, method, b"1")
        assert info.value.code == Code.RESOURCE_EXHAUSTED

    async with trio.open_nursery() as calls:
        calls.start_soon(client.call, SVC, "Sleep", b"5")  # relayed, open for 5 s
        await trio.sleep(1)
        await refused("local.v1.Svc", "Wait")
    async with trio.open_nursery() as calls:
        calls.start_soon(client.call, "local.v1.Svc", "Wait", b"5")  # local, open for 5 s
        await trio.sleep(1)
        await refused(SVC, "Sleep")
    assert await client.call("local.v1.Svc", "Wait", b"1") == b"waited"
    assert await client.call(SVC, "Sleep", b"1") == b"slept 1"
