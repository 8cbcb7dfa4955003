"""The Micromessage2 client library (:mod:`protocols.micromessage.api`) against an
in-process gateway over real sockets: acks, filters, queues, groups, the window,
resends and the server's ERROR frames.

Real sockets need the real clock, so every wait is guarded by a short
``trio.fail_after``; "nothing arrives" is checked over a short real interval.
"""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from documented import python_examples
from harness import host_port, running_gateway

from gateway.sdk import NEED_DATA
from protocols.micromessage import Client, ConnectionLost, Received, ServerError
from protocols.micromessage.codec import ServerCodec
from protocols.micromessage.events import Established, Offered
from protocols.micromessage.frames import FrameDecoder
from protocols.micromessage.plugin import server_settings

GUARD = 5.0  # seconds any one expected event may take
QUIET = 0.3  # seconds in which an unexpected message would have arrived
AT = "2014-10-13T11:00:00.250000Z"  # a header the library sends as a D property


def config(*destinations: dict[str, Any]) -> dict[str, Any]:
    listener = {
        "name": "mm",
        "protocol": "micromessage",
        "bind": "127.0.0.1:0",
        "destination": "logs",
    }
    return {
        "gateway": {"drain_timeout": "1s"},
        "listeners": [listener],
        "destinations": list(destinations),
    }


@asynccontextmanager
async def gateway(*destinations: dict[str, Any]) -> AsyncIterator[tuple[str, int]]:
    async with running_gateway(config(*destinations)) as gw:
        yield host_port(gw.addresses["mm"][0])


async def receive_now(client: Client, seconds: float = QUIET) -> list[Received]:
    """What arrives within ``seconds``."""
    out: list[Received] = []
    with trio.move_on_after(seconds):
        while True:
            out.append(await client.receive())
    return out


async def receive(client: Client, count: int) -> list[Received]:
    with trio.fail_after(GUARD):
        return [await client.receive() for _ in range(count)]


async def subscribed(client: Client, destination: str, **kwargs: Any) -> None:
    """Subscribe, and give the gateway a moment to take the command (it has no reply)."""
    await client.subscribe(destination, **kwargs)
    await trio.sleep(0.05)


async def test_publish_is_acked() -> None:
    async with gateway() as (host, port), await Client.connect(host, port) as client:
        seqs = [await client.publish("logs", b"line %d" % i, {"n": str(i)}) for i in range(5)]
        assert seqs == [1, 2, 3, 4, 5]
        with trio.fail_after(GUARD):
            await client.wait_acked()
        assert client.unacked == 0


async def test_filtered_subscriber_gets_matching_messages_with_typed_headers() -> None:
    async with (
        gateway() as (host, port),
        await Client.connect(host, port, identity="sub") as sub,
        await Client.connect(host, port, identity="pub") as pub,
    ):
        await subscribed(sub, "news", filter="age>=N18")
        for age in (10, 20, 30):
            headers = {"age": str(age), "who": "x y", "at": AT}
            await pub.publish("news", b"hello %d" % age, headers)
        got = await receive(sub, 2)
        assert [m.payload for m in got] == [b"hello 20", b"hello 30"]
        assert got[0].headers == {"age": "20", "who": "x y", "at": AT}  # N, T, D and back
        assert got[0].destination == "news"
        assert await receive_now(sub) == []  # age 10 did not match
        # Those delivered settle only when the subscriber acks its copies (age 10,
        # filtered out, settles at once when it came in a read of its own).
        assert pub.unacked >= 2
        assert sub.ack(got[-1].seq)
        with trio.fail_after(GUARD):
            await pub.wait_acked()


async def test_queue_consumers_share_messages_and_take_over_unacked_ones() -> None:
    async with (
        gateway({"name": "jobs", "kind": "queue"}) as (host, port),
        await Client.connect(host, port) as pub,
        await Client.connect(host, port, window=5) as a,
    ):
        # Windows of 5: the 10 jobs fill both, so each consumer surely gets some.
        await subscribed(a, "jobs")
        async with await Client.connect(host, port, window=5) as b:
            await subscribed(b, "jobs")
            for i in range(10):
                await pub.publish("jobs", b"job %d" % i)
            await trio.sleep(QUIET)
            got_a, got_b = await receive_now(a, 0.05), await receive_now(b, 0.05)
            bodies = sorted(m.payload for m in got_a + got_b)
            assert bodies == sorted(b"job %d" % i for i in range(10))  # each once
            assert len(got_a) == len(got_b) == 5
            a.ack(got_a[-1].seq)
            # b leaves without acking: its messages go to a.
        again = await receive(a, len(got_b))
        assert sorted(m.payload for m in again) == sorted(m.payload for m in got_b)
        a.ack(again[-1].seq)
        with trio.fail_after(GUARD):
            await pub.wait_acked()


async def test_named_group_keeps_messages_while_no_member_is_connected() -> None:
    async with gateway() as (host, port), await Client.connect(host, port) as pub:
        async with await Client.connect(host, port) as first:
            await subscribed(first, "news", group="g")
            await pub.publish("news", b"one")
            (one,) = await receive(first, 1)
            first.ack(one.seq)
        await trio.sleep(0.05)
        for body in (b"two", b"three"):
            await pub.publish("news", body)
        await trio.sleep(0.05)
        async with await Client.connect(host, port) as second:
            await subscribed(second, "news", group="g")
            got = await receive(second, 2)
            assert [m.payload for m in got] == [b"two", b"three"]
            second.ack(got[-1].seq)
            with trio.fail_after(GUARD):
                await pub.wait_acked()


async def test_window_bounds_unacked_publishes() -> None:
    async with (
        gateway() as (host, port),
        await Client.connect(host, port) as sub,
        await Client.connect(host, port, window=3) as pub,
    ):
        await subscribed(sub, "news")
        for i in range(3):
            await pub.publish("news", b"%d" % i)
        fourth_done = trio.Event()

        async def fourth() -> None:
            await pub.publish("news", b"3")
            fourth_done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fourth)
            got = await receive(sub, 3)
            await trio.sleep(QUIET)
            assert not fourth_done.is_set()  # the window of 3 is full
            # The gateway acks a read's batch of publishes once all were acked.
            sub.ack(got[-1].seq)
            with trio.fail_after(GUARD):
                await fourth_done.wait()
        (last,) = await receive(sub, 1)
        sub.ack(last.seq)
        with trio.fail_after(GUARD):
            await pub.wait_acked()


def spy(client: Client) -> list[bytes]:
    """Every read the client's codec is fed, recorded (resends the codec drops included)."""
    reads: list[bytes] = []
    feed = client.codec.receive_data

    def receive_data(data: bytes | bytearray | memoryview) -> None:
        reads.append(bytes(data))
        feed(data)

    client.codec.receive_data = receive_data  # type: ignore[method-assign]
    return reads


async def test_unacked_messages_are_resent_until_acked() -> None:
    async with (
        gateway() as (host, port),
        await Client.connect(host, port, expire=0.2) as sub,
        await Client.connect(host, port) as pub,
    ):
        reads = spy(sub)
        await subscribed(sub, "news")
        await pub.publish("news", b"resend-me")
        (msg,) = await receive(sub, 1)
        # Unacked, the gateway sends the same seq again after each 0.2s; the codec
        # drops a resend it returned and has not acked, so receive() gives it once.
        assert await receive_now(sub, 0.5) == []
        assert b"".join(reads).count(b"resend-me") >= 2
        assert sub.ack(msg.seq)
        assert not sub.ack(msg.seq)  # acked already: nothing to send
        with trio.fail_after(GUARD):
            await pub.wait_acked()
        await trio.sleep(0.1)  # a resend already on its way may still arrive
        seen = b"".join(reads).count(b"resend-me")
        assert await receive_now(sub, 0.5) == []
        assert b"".join(reads).count(b"resend-me") == seen  # no more resends


async def test_unsubscribe_stops_deliveries_and_type_names_arrive() -> None:
    async with (
        gateway() as (host, port),
        await Client.connect(host, port, dotnet=True) as sub,
        await Client.connect(host, port, dotnet=True) as pub,
    ):
        assert sub.has("dotnet")
        await subscribed(sub, "news")
        await pub.publish("news", b"{}", type_name="Shop.Order")
        (msg,) = await receive(sub, 1)
        assert msg.type_name == "Shop.Order"
        sub.ack(msg.seq)
        await sub.unsubscribe("news")
        await trio.sleep(0.05)
        await pub.publish("news", b"unseen")
        assert await receive_now(sub) == []


async def test_server_error_frame_raises_server_error() -> None:
    async with gateway() as (host, port), await Client.connect(host, port) as client:
        await client.subscribe("news", filter="age>>N1")
        with trio.fail_after(GUARD), pytest.raises(ServerError) as caught:
            await client.receive()
        assert "filter on 'age'" in caught.value.message
        with pytest.raises(ServerError):
            await client.publish("news", b"after")  # every later call too


async def test_acks_are_flushed_when_the_client_closes() -> None:
    async with (
        gateway({"name": "jobs", "kind": "queue"}) as (host, port),
        await Client.connect(host, port) as pub,
    ):
        async with await Client.connect(host, port) as first:
            await subscribed(first, "jobs")
            await pub.publish("jobs", b"job")
            (job,) = await receive(first, 1)
            first.ack(job.seq)  # queued, written on the way out
        with trio.fail_after(GUARD):
            await pub.wait_acked()
        async with await Client.connect(host, port) as second:
            await subscribed(second, "jobs")
            assert await receive_now(second) == []  # not delivered again


async def test_an_error_in_the_body_propagates_unwrapped() -> None:
    async with gateway() as (host, port):
        client = await Client.connect(host, port)

        async def fail_in_body() -> None:
            async with client:
                await client.publish("logs", b"x")
                raise KeyError("mine")

        with pytest.raises(KeyError):  # not an ExceptionGroup
            await fail_in_body()
        with pytest.raises(trio.ClosedResourceError):
            await client.publish("logs", b"after close")


async def test_closed_connection_raises_connection_lost() -> None:
    listener = trio.open_tcp_listeners(0, host="127.0.0.1")
    (server,) = await listener
    port = server.socket.getsockname()[1]

    async def close_at_once() -> None:
        stream = await server.accept()
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(close_at_once)
        with trio.fail_after(GUARD), pytest.raises(ConnectionLost):
            await Client.connect("127.0.0.1", port)
    await server.aclose()


async def test_gateway_going_away_raises_connection_lost() -> None:
    async with running_gateway(config()) as gw:
        client = await Client.connect(*host_port(gw.addresses["mm"][0]))
        async with client:
            await client.subscribe("news")
            gw.shutdown()
            with trio.fail_after(GUARD), pytest.raises(ConnectionLost):
                await client.receive()
            with pytest.raises(ConnectionLost):
                client.ack(1)


async def test_what_was_delivered_is_still_acked_after_unsubscribe() -> None:
    async with (
        gateway({"name": "jobs", "kind": "queue"}) as (host, port),
        await Client.connect(host, port) as pub,
        await Client.connect(host, port) as first,
        await Client.connect(host, port) as second,
    ):
        await subscribed(first, "jobs")
        await pub.publish("jobs", b"job")
        (job,) = await receive(first, 1)
        await first.unsubscribe("jobs")
        await trio.sleep(0.05)
        await subscribed(second, "jobs")
        first.ack(job.seq)  # handled: acked as the protocol says
        with trio.fail_after(1.0):
            await pub.wait_acked()
        assert await receive_now(second) == []  # not delivered twice


async def test_the_docs_example_runs() -> None:
    """docs/protocols/micromessage2.md's example, against a gateway on a free port."""
    (example,) = [
        e
        for e in python_examples()
        if e.where.startswith("docs/protocols/micromessage2.md")
        and e.tested_by == "tests/micromessage/test_api.py"
    ]
    async with gateway() as (host, port):
        code = example.code.replace('"localhost", 7072', f"{host!r}, {port}")
        assert code != example.code
        flags = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
        with trio.fail_after(GUARD):
            await eval(compile(code, example.where, "exec", flags=flags), {})


async def serve_handshake(stream: trio.SocketStream) -> None:
    """A server's side of the handshake, with the listener's settings."""
    options = {"identity": "fake", "max_window": 10, "ack_expire": 0.5, "require": []}
    codec = ServerCodec(server_settings(options))
    while True:
        event = codec.next_event()
        if event is NEED_DATA:
            codec.receive_data(await stream.receive_some())
        elif isinstance(event, Offered):
            await stream.send_all(codec.send(event.answer))
        elif isinstance(event, Established):
            return


async def test_a_server_breaking_the_protocol_gets_an_error_frame() -> None:
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    replies: list[object] = []

    async def broken_server() -> None:
        stream = await listener.accept()
        await serve_handshake(stream)
        await stream.send_all(b"\xe0")  # reserved flag bits
        decoder = FrameDecoder()
        while (data := await stream.receive_some()) and not replies:
            decoder.feed(data)
            while (frame := decoder.next_frame()) is not None:
                replies.append(frame)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(broken_server)
        async with await Client.connect("127.0.0.1", port) as client:
            with trio.fail_after(GUARD), pytest.raises(ConnectionLost, match="protocol error"):
                await client.receive()
    await listener.aclose()
    (error,) = replies
    assert "reserved" in error.message  # type: ignore[attr-defined]
