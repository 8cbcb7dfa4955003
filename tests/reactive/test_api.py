"""The reactive-streams library (:mod:`protocols.reactive.api`): library against library
over memory stream pairs (trio's MockClock, ``autojump_clock``, where time matters) and
over real TCP, library against the bare codec (to send what the library would not),
and library against the gateway's reactive listener.

Real sockets need the real clock: every wait there is guarded by ``trio.fail_after``.
"""

from __future__ import annotations

import ast
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from documented import python_examples
from harness import host_port, running_gateway
from toy_line import registered

from gateway.config.certs import init_dir
from gateway.core.model import Message
from gateway.sdk import NEED_DATA
from protocols.reactive import (
    Accepted,
    ClientHello,
    Connection,
    Failed,
    Goodbye,
    GoodbyeReceived,
    Hello,
    Limits,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    Ping,
    Ponged,
    Request,
    Role,
    ServerHello,
    Subscribe,
    Subscribed,
    SubscribeRequested,
)
from protocols.reactive.api import (
    FLUSH_TIMEOUT,
    ConnectionLost,
    Ending,
    Peer,
    PublisherError,
    serve_tcp,
)
from protocols.reactive.messages import encode
from protocols.reactive.plugin import ReactivePlugin

GUARD = 5.0  # seconds any one real-socket wait may take


class Source:
    """An async iterator of ``count`` elements that counts how often it was pulled."""

    def __init__(self, count: int, element: Callable[[int], bytes] = lambda i: b"e%d" % i):
        self.count = count
        self.element = element
        self.pulled = 0
        self.closed = False

    def __aiter__(self) -> Source:
        return self

    async def __anext__(self) -> bytes:
        if self.pulled >= self.count:
            raise StopAsyncIteration
        self.pulled += 1
        return self.element(self.pulled - 1)

    async def aclose(self) -> None:
        self.closed = True


async def failing(*elements: bytes) -> AsyncIterator[bytes]:
    for element in elements:
        yield element
    raise ValueError("boom")


@asynccontextmanager
async def pair(**server: Any) -> AsyncIterator[tuple[Peer, Peer]]:
    """A client and a server peer over a memory stream pair."""
    a, b = trio.testing.memory_stream_pair()
    with trio.fail_after(GUARD):  # a test that deadlocks fails
        async with Peer(a) as client, Peer(b, Role.SERVER, **server) as server_peer:
            yield client, server_peer


class Raw:
    """The bare codec over a memory stream: the other end of a library peer."""

    def __init__(self, stream: trio.abc.Stream, role: Role) -> None:
        self.stream = stream
        self.codec = Connection(role)

    async def send(self, *messages: Any) -> None:
        await self.stream.send_all(b"".join(self.codec.send(x) for x in messages))

    async def hello(self) -> None:
        """Send our hello and read the peer's."""
        cls = ClientHello if self.codec.role is Role.CLIENT else ServerHello
        await self.send(cls(0, (1,)))
        assert isinstance(await self.event(), Hello)

    async def event(self) -> Any:
        while (event := self.codec.next_event()) is NEED_DATA:
            self.codec.receive_data(await self.stream.receive_some(65536))
        return event


@asynccontextmanager
async def against_raw(role: Role = Role.CLIENT) -> AsyncIterator[tuple[Peer, Raw]]:
    """A library peer in ``role`` and a bare codec peer, past the hellos."""
    a, b = trio.testing.memory_stream_pair()
    other = Role.SERVER if role is Role.CLIENT else Role.CLIENT
    raw = Raw(b, other)
    with trio.fail_after(GUARD):  # a test that deadlocks fails
        async with Peer(a, role) as peer:
            await raw.hello()
            yield peer, raw


async def collect(sub: AsyncIterator[bytes]) -> list[bytes]:
    return [element async for element in sub]


# -- library against library -------------------------------------------------------------------


async def test_both_peers_subscribe_and_publish_on_one_connection() -> None:
    async with pair() as (client, server), trio.open_nursery() as nursery:
        up, down = Source(3, lambda i: b"up%d" % i), Source(2, lambda i: b"down%d" % i)
        await nursery.start(client.publish, "up", up)
        await nursery.start(server.publish, "down", down)
        async with server.subscribe("up", demand=10) as from_client:
            async with client.subscribe("down", demand=10) as from_server:
                assert await collect(from_server) == [b"down0", b"down1"]
            assert await collect(from_client) == [b"up0", b"up1", b"up2"]
        assert from_client.element_size == 0


async def test_publish_returns_completed_when_the_source_ends() -> None:
    async with pair() as (client, server), trio.open_nursery() as nursery:
        ended: list[Ending] = []

        async def publish() -> None:
            ended.append(await server.publish("p", Source(2)))

        nursery.start_soon(publish)
        await trio.testing.wait_all_tasks_blocked()
        async with client.subscribe("p", 5) as sub:
            assert await collect(sub) == [b"e0", b"e1"]
        await trio.testing.wait_all_tasks_blocked()
        assert ended == [Ending.COMPLETED]


async def test_the_source_is_pulled_only_within_demand() -> None:
    source = Source(100)
    async with pair() as (client, server), trio.open_nursery() as nursery:
        await nursery.start(server.publish, "p", source)
        async with client.subscribe("p", demand=2) as sub:
            await trio.testing.wait_all_tasks_blocked()
            assert source.pulled == 2
            assert [await anext(sub), await anext(sub)] == [b"e0", b"e1"]
            await trio.testing.wait_all_tasks_blocked()
            assert source.pulled == 2  # read, but nothing more requested
            sub.request(3)
            await trio.testing.wait_all_tasks_blocked()
            assert source.pulled == 5
            assert [await anext(sub) for _ in range(3)] == [b"e2", b"e3", b"e4"]


async def test_demand_zero_then_requests_in_steps() -> None:
    source = Source(5)
    async with pair() as (client, server), trio.open_nursery() as nursery:
        await nursery.start(server.publish, "p", source)
        async with client.subscribe("p") as sub:
            await trio.testing.wait_all_tasks_blocked()
            assert source.pulled == 0
            got = []
            for _ in range(5):
                sub.request(1)
                got.append(await anext(sub))
            assert got == [b"e0", b"e1", b"e2", b"e3", b"e4"]
            sub.request(1)  # for the onComplete
            assert await collect(sub) == []


async def test_request_before_entering_adds_to_the_initial_demand() -> None:
    async with pair() as (client, server), trio.open_nursery() as nursery:
        await nursery.start(server.publish, "p", Source(3))
        sub = client.subscribe("p", 1)
        sub.request(3)  # 4 in all: the fourth pull finds the end
        async with sub:
            assert await collect(sub) == [b"e0", b"e1", b"e2"]


async def test_the_end_of_the_source_is_seen_when_demand_allows_a_pull() -> None:
    source = Source(2)
    async with pair() as (client, server), trio.open_nursery() as nursery:
        await nursery.start(server.publish, "p", source)
        async with client.subscribe("p", 2) as sub:
            assert [await anext(sub), await anext(sub)] == [b"e0", b"e1"]
            await trio.testing.wait_all_tasks_blocked()
            assert source.pulled == 2  # not pulled again: the end is not known yet
            sub.request(1)
            assert await collect(sub) == []  # onComplete


async def test_a_request_is_positive() -> None:
    async with pair() as (client, server), trio.open_nursery() as nursery:
        await nursery.start(server.publish, "p", Source(1))
        async with client.subscribe("p", 1) as sub:
            with pytest.raises(ValueError, match="1 or more"):
                sub.request(0)
    with pytest.raises(ValueError, match="0 or more"):
        client.subscribe("p", -1)


async def test_large_elements_go_in_parts_and_arrive_whole() -> None:
    big = bytes(range(256)) * 40  # 10240 bytes
    a, b = trio.testing.memory_stream_pair()
    # The subscriber refuses any message over 2 KiB: the element must come in parts.
    async with (
        Peer(a, limits=Limits(max_message=2048)) as client,
        Peer(b, Role.SERVER) as server,
        trio.open_nursery() as nursery,
    ):

        async def source() -> AsyncIterator[bytes]:
            yield b"small"
            yield big
            yield b""

        await nursery.start(
            lambda task_status: server.publish(
                "p", source(), part_size=1000, task_status=task_status
            )
        )
        async with client.subscribe("p", 5) as sub:
            assert await collect(sub) == [b"small", big, b""]


async def test_a_subscriber_leaving_early_cancels_and_closes_the_source() -> None:
    source = Source(100)
    ended: list[Ending] = []
    async with pair() as (client, server), trio.open_nursery() as nursery:

        async def publish() -> None:
            ended.append(await server.publish("p", source))

        nursery.start_soon(publish)
        await trio.testing.wait_all_tasks_blocked()
        async with client.subscribe("p", 10) as sub:
            async for element in sub:
                if element == b"e1":
                    break
        await trio.testing.wait_all_tasks_blocked()
        assert ended == [Ending.CANCELLED]
        assert source.closed
        assert source.pulled <= 10
        # The name is free again: a new publish serves a new subscriber.
        await nursery.start(server.publish, "p", Source(1))
        async with client.subscribe("p", 2) as again:
            assert await collect(again) == [b"e0"]


async def test_cancel_ends_iteration_at_once() -> None:
    async with pair() as (client, server), trio.open_nursery() as nursery:
        await nursery.start(server.publish, "p", Source(10))
        async with client.subscribe("p", 10) as sub:
            assert await anext(sub) == b"e0"
            sub.cancel()
            sub.cancel()  # idempotent
            assert await collect(sub) == []


async def test_cancel_drops_what_was_received_and_unread() -> None:
    async with pair() as (client, server), trio.open_nursery() as nursery:
        await nursery.start(server.publish, "p", Source(3))
        async with client.subscribe("p", 10) as sub:
            assert await anext(sub) == b"e0"
            await trio.testing.wait_all_tasks_blocked()  # e1, e2 and onComplete arrived
            sub.cancel()
            assert await collect(sub) == []


async def test_a_subscription_cancelled_before_it_started_never_subscribes() -> None:
    async with pair() as (client, server), trio.open_nursery() as nursery:
        source = Source(3)
        await nursery.start(server.publish, "p", source)
        sub = client.subscribe("p", 10)
        sub.cancel()
        assert await collect(sub) == []
        await trio.testing.wait_all_tasks_blocked()
        assert source.pulled == 0
        async with client.subscribe("p", 10) as other:  # so the name is still free
            assert await collect(other) == [b"e0", b"e1", b"e2"]


async def test_a_name_nobody_offers_is_refused() -> None:
    async with pair() as (client, _server):
        with pytest.raises(PublisherError) as caught:
            async with client.subscribe("nowhere", 1):
                pass  # pragma: no cover
        assert caught.value.reason == "no publisher nowhere"
        # The connection goes on.
        with pytest.raises(PublisherError):
            async with client.subscribe("nowhere", 1):
                pass  # pragma: no cover


async def test_a_second_subscriber_to_a_served_name_is_refused() -> None:
    async with pair() as (client, server), trio.open_nursery() as nursery:
        await nursery.start(server.publish, "p", Source(10))
        async with client.subscribe("p", 1) as first:
            with pytest.raises(PublisherError, match="has a subscriber"):
                async with client.subscribe("p", 1):
                    pass  # pragma: no cover
            assert await anext(first) == b"e0"


async def test_offering_a_name_twice_is_refused() -> None:
    async with pair() as (_client, server), trio.open_nursery() as nursery:
        await nursery.start(server.publish, "p", Source(1))
        with pytest.raises(ValueError, match="already offered"):
            await server.publish("p", Source(1))
        nursery.cancel_scope.cancel()


async def test_a_failing_source_sends_on_error_and_raises() -> None:
    async with pair() as (client, server), trio.open_nursery() as nursery:
        raised: list[BaseException] = []

        async def publish() -> None:
            try:
                await server.publish("p", failing(b"a", b"b"))
            except ValueError as e:
                raised.append(e)

        nursery.start_soon(publish)
        await trio.testing.wait_all_tasks_blocked()
        async with client.subscribe("p", 10) as sub:
            assert [await anext(sub), await anext(sub)] == [b"a", b"b"]
            with pytest.raises(PublisherError) as caught:
                await anext(sub)
        assert caught.value.reason == "ValueError: boom"
        await trio.testing.wait_all_tasks_blocked()
        assert [str(e) for e in raised] == ["boom"]


async def test_leaving_says_goodbye_and_ends_the_other_peers_streams(
    autojump_clock: Any,
) -> None:
    a, b = trio.testing.memory_stream_pair()
    async with Peer(b, Role.SERVER) as server, trio.open_nursery() as nursery:
        outcome: list[BaseException | Ending] = []

        async def publish() -> None:
            outcome.append(await server.publish("p", Source(100)))

        nursery.start_soon(publish)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        async with Peer(a) as client:
            sub = client.subscribe("p", 1)  # iterated bare: it outlives the peer
            assert await anext(sub) == b"e0"
        assert trio.current_time() - start < FLUSH_TIMEOUT  # answered, not timed out
        await trio.testing.wait_all_tasks_blocked()
        assert outcome == [Ending.CANCELLED]
        with pytest.raises(ConnectionLost, match="goodbye"):
            await server.publish("q", Source(1))
        with pytest.raises(trio.ClosedResourceError):
            sub.request(1)


async def test_leaving_waits_for_the_goodbye_answer_at_most_flush_timeout(
    autojump_clock: Any,
) -> None:
    a, b = trio.testing.memory_stream_pair()
    raw = Raw(b, Role.SERVER)
    start = trio.current_time()
    async with Peer(a):
        await raw.hello()
    assert trio.current_time() - start == pytest.approx(FLUSH_TIMEOUT)
    event = await raw.event()  # the goodbye that went unanswered
    assert isinstance(event, GoodbyeReceived)
    assert event.reason == "done"


async def test_calls_after_leaving_raise_closed() -> None:
    async with pair() as (client, _server):
        pass
    with pytest.raises(trio.ClosedResourceError):
        async with client.subscribe("p", 1):
            pass  # pragma: no cover
    with pytest.raises(trio.ClosedResourceError):
        await client.publish("p", Source(1))


# -- library against the bare codec -----------------------------------------------------------


async def test_packed_elements_are_yielded_one_by_one() -> None:
    async with against_raw() as (peer, raw), trio.open_nursery() as nursery:
        got: list[bytes] = []
        sizes: list[int | None] = []

        async def subscribe() -> None:
            async with peer.subscribe("fixed", 4) as sub:
                sizes.append(sub.element_size)
                got.extend(await collect(sub))

        nursery.start_soon(subscribe)
        assert await raw.event() == SubscribeRequested(1, "fixed", 4)
        await raw.send(Subscribed(1, 4), OnNextPacked(1, 3, b"aaaabbbbcccc"), OnNext(1, b"dddd"))
        await raw.send(OnComplete(1))
        await trio.testing.wait_all_tasks_blocked()
        assert sizes == [4]
        assert got == [b"aaaa", b"bbbb", b"cccc", b"dddd"]


async def test_on_error_after_elements_raises_publisher_error_after_them() -> None:
    async with against_raw() as (peer, raw), trio.open_nursery() as nursery:
        outcome: list[Any] = []

        async def subscribe() -> None:
            async with peer.subscribe("p", 5) as sub:
                try:
                    async for element in sub:
                        outcome.append(element)
                except PublisherError as e:
                    outcome.append(e.reason)

        nursery.start_soon(subscribe)
        await raw.event()
        await raw.send(Subscribed(1, 0), OnNext(1, b"x"), OnError(1, "disk on fire"))
        await trio.testing.wait_all_tasks_blocked()
        assert outcome == [b"x", "disk on fire"]


async def test_the_subscriber_never_holds_more_than_its_demand() -> None:
    async with against_raw() as (peer, raw), trio.open_nursery() as nursery:
        outcome: list[Any] = []

        async def subscribe() -> None:
            try:
                async with peer.subscribe("p", 1) as sub:
                    async for element in sub:
                        outcome.append(element)
            except ConnectionLost as e:
                outcome.append(str(e))

        nursery.start_soon(subscribe)
        await raw.event()
        await raw.send(Subscribed(1, 0), OnNext(1, b"ok"))
        await raw.stream.send_all(encode(OnNext(1, b"over")))  # beyond the demand of 1
        event = await raw.event()
        assert isinstance(event, GoodbyeReceived)
        assert event.reason.startswith("protocol-error:")
        assert "over its demand" in event.reason
        await trio.testing.wait_all_tasks_blocked()
        assert outcome[0] == b"ok"
        assert outcome[1].startswith("protocol error:")
        assert len(outcome) == 2


async def test_a_protocol_error_raises_connection_lost_from_pending_calls() -> None:
    async with against_raw() as (peer, raw), trio.open_nursery() as nursery:
        errors: list[BaseException] = []

        async def wait(call: Callable[[], Any]) -> None:
            try:
                await call()
            except ConnectionLost as e:
                errors.append(e)

        nursery.start_soon(wait, lambda: peer.publish("p", Source(1)))
        nursery.start_soon(wait, lambda: peer.subscribe("q", 1).__aenter__())
        await raw.event()
        await raw.stream.send_all(b"\xc1")  # never valid msgpack
        assert isinstance(await raw.event(), GoodbyeReceived)
        await trio.testing.wait_all_tasks_blocked()
        assert len(errors) == 2
        assert all("protocol error" in str(e) for e in errors)


async def test_connection_loss_raises_connection_lost(autojump_clock: Any) -> None:
    async with against_raw() as (peer, raw), trio.open_nursery() as nursery:
        errors: list[BaseException] = []

        async def subscribe() -> None:
            try:
                async with peer.subscribe("p", 5) as sub:
                    await collect(sub)
            except ConnectionLost as e:
                errors.append(e)

        nursery.start_soon(subscribe)
        await raw.event()
        await raw.send(Subscribed(1, 0), OnNext(1, b"x"))
        await raw.stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert [str(e) for e in errors] == ["the peer closed the connection"]
        with pytest.raises(ConnectionLost):
            await peer.publish("p", Source(1))


async def test_the_peers_goodbye_is_answered_and_ends_subscriptions() -> None:
    async with against_raw() as (peer, raw), trio.open_nursery() as nursery:
        errors: list[str] = []

        async def subscribe() -> None:
            async with peer.subscribe("p", 5) as sub:
                try:
                    await collect(sub)
                except PublisherError as e:
                    errors.append(e.reason)

        nursery.start_soon(subscribe)
        await raw.event()
        await raw.send(Subscribed(1, 0), Goodbye("maintenance"))
        event = await raw.event()
        assert event == GoodbyeReceived("maintenance", True)  # our goodbye, answered
        await trio.testing.wait_all_tasks_blocked()
        assert errors == ["goodbye: maintenance"]
        with pytest.raises(ConnectionLost, match="maintenance"):
            async with peer.subscribe("p", 1):
                pass  # pragma: no cover


async def test_a_ping_is_answered_with_a_pong() -> None:
    async with against_raw(Role.SERVER) as (_peer, raw):
        assert raw.codec.extensions == frozenset({1})
        await raw.send(Ping(b"are you there"))
        assert await raw.event() == Ponged(b"are you there")


async def test_a_bad_request_ends_the_published_stream() -> None:
    async with against_raw(Role.SERVER) as (peer, raw), trio.open_nursery() as nursery:
        ended: list[Ending] = []

        async def publish() -> None:
            ended.append(await peer.publish("p", Source(5)))

        nursery.start_soon(publish)
        await trio.testing.wait_all_tasks_blocked()
        await raw.send(Subscribe("p", 1, 0))
        assert await raw.event() == Accepted(1, 0)
        await raw.stream.send_all(encode(Request(1, 0)))  # the codec refuses to send it
        event = await raw.event()
        assert isinstance(event, Failed)
        assert "non-positive" in event.error
        await trio.testing.wait_all_tasks_blocked()
        assert ended == [Ending.CANCELLED]


async def test_a_server_peer_subscribes_once_the_clients_hello_arrived() -> None:
    a, b = trio.testing.memory_stream_pair()
    raw = Raw(b, Role.CLIENT)
    async with Peer(a, Role.SERVER) as peer, trio.open_nursery() as nursery:
        got: list[bytes] = []

        async def subscribe() -> None:
            async with peer.subscribe("p", 1) as sub:
                got.extend(await collect(sub))

        nursery.start_soon(subscribe)
        await trio.testing.wait_all_tasks_blocked()
        await raw.hello()
        assert await raw.event() == SubscribeRequested(1, "p", 1)
        await raw.send(Subscribed(1, 0), OnNext(1, b"only"), OnComplete(1))
        await trio.testing.wait_all_tasks_blocked()
        assert got == [b"only"]


# -- over real sockets --------------------------------------------------------------------------


async def test_over_tcp_both_directions_and_split() -> None:
    big = b"x" * 200_000  # above the default part size
    received: list[bytes] = []

    async def handler(peer: Peer) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.publish, "down", Source(3))
            async with peer.subscribe("up", 3) as sub:
                received.extend(await collect(sub))

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(serve_tcp, handler, 0, host="127.0.0.1"))
        host, port = listeners[0].socket.getsockname()[:2]
        with trio.fail_after(GUARD):
            async with await Peer.connect(host, port) as client, trio.open_nursery() as inner:
                await inner.start(client.publish, "up", Source(2, lambda i: big + b"%d" % i))
                async with client.subscribe("down", 4) as sub:
                    assert await collect(sub) == [b"e0", b"e1", b"e2"]
        assert received == [big + b"0", big + b"1"]
        nursery.cancel_scope.cancel()


async def test_over_a_unix_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "rs.sock")
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen()
    listener = trio.SocketListener(sock)

    async def serve_one() -> None:
        async with await listener.accept() as stream, Peer(stream, Role.SERVER) as peer:
            await peer.publish("p", Source(2))

    async with trio.open_nursery() as nursery, listener:
        nursery.start_soon(serve_one)
        with trio.fail_after(GUARD):
            async with (
                await Peer.connect_unix(path) as client,
                client.subscribe("p", 3) as sub,
            ):
                assert await collect(sub) == [b"e0", b"e1"]


async def test_over_tls(tmp_path: Path) -> None:
    certs = init_dir(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(certs["server_cert"]), str(certs["server_key"]))
    client_ctx = ssl.create_default_context(cafile=str(certs["ca_cert"]))
    (tcp,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    listener = trio.SSLListener(tcp, server_ctx)
    port = tcp.socket.getsockname()[1]

    async def serve_one() -> None:
        async with await listener.accept() as stream, Peer(stream, Role.SERVER) as peer:
            await peer.publish("p", Source(2))

    async with trio.open_nursery() as nursery, listener:
        nursery.start_soon(serve_one)
        with trio.fail_after(GUARD):
            async with (
                await Peer.connect("127.0.0.1", port, ssl_context=client_ctx) as client,
                client.subscribe("p", 3) as sub,
            ):
                assert await collect(sub) == [b"e0", b"e1"]


# -- against the gateway's reactive listener -------------------------------------------------------


def gateway_config() -> dict[str, Any]:
    listener = {
        "name": "rs",
        "protocol": "reactive",
        "bind": "127.0.0.1:0",
        "destination": "logs",
        "publishers": ["logs", "fixed"],
    }
    return {
        "gateway": {"drain_timeout": "1s"},
        "listeners": [listener],
        "destinations": [
            {"name": "logs", "retain": "1MiB"},
            {"name": "fixed", "retain": "1MiB", "element_size": 4},
        ],
    }


async def test_against_the_gateway_from_earliest_in_steps() -> None:
    config = gateway_config()
    async with running_gateway(config, registry=registered(ReactivePlugin)) as gw:
        await gw.hub.publish([Message("logs", b"m%d" % i) for i in range(10)])
        host, port = host_port(gw.addresses["rs"][0])
        with trio.fail_after(GUARD):
            async with await Peer.connect(host, port) as peer:
                async with peer.subscribe("logs?from=earliest", 3) as sub:
                    assert sub.element_size == 0
                    got = [await anext(sub) for _ in range(3)]
                    for step in (4, 3):
                        sub.request(step)
                        got += [await anext(sub) for _ in range(step)]
                assert got == [b"m%d" % i for i in range(10)]
                with pytest.raises(PublisherError, match="not exposed"):
                    async with peer.subscribe("hidden", 1):
                        pass  # pragma: no cover


async def test_against_the_gateway_a_finite_fixed_size_read() -> None:
    bodies = [b"%04d" % i for i in range(50)]
    async with running_gateway(gateway_config(), registry=registered(ReactivePlugin)) as gw:
        await gw.hub.publish([Message("fixed", b) for b in bodies])
        host, port = host_port(gw.addresses["rs"][0])
        with trio.fail_after(GUARD):
            async with (
                await Peer.connect(host, port) as peer,
                peer.subscribe("fixed?from=earliest&to=50", 100) as sub,
            ):
                assert sub.element_size == 4
                assert await collect(sub) == bodies


async def test_the_docs_gateway_example_runs_against_the_gateway() -> None:
    """docs/protocols/reactive-streams-library.md's example, against a gateway on a free port."""
    (example,) = [
        e
        for e in python_examples()
        if e.where.startswith("docs/protocols/reactive-streams-library.md")
        and e.tested_by == "tests/reactive/test_api.py"
    ]
    async with running_gateway(gateway_config(), registry=registered(ReactivePlugin)) as gw:
        bodies = [b"%d" % i for i in range(250)] + [b"last", b"after"]
        await gw.hub.publish([Message("logs", b) for b in bodies])
        host, port = host_port(gw.addresses["rs"][0])
        code = example.code.replace('"localhost", 7073', f"{host!r}, {port}")
        assert code != example.code
        namespace: dict[str, Any] = {}
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        with trio.fail_after(GUARD):
            await eval(compile(code, example.where, "exec", flags=flags), namespace)
        assert namespace["seen"] == 251  # past two requests, up to "last"
