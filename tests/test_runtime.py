"""The runtime over real sockets, driven through the bundled ndjson protocol."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from waits import subscribed, until

from gateway.config.loader import parse
from gateway.core.model import Outcome
from gateway.protocol.plugin import ProtocolPlugin, ServerConnection
from gateway.runtime.gateway import Gateway
from gateway.runtime.registry import Registered, Registry, default_registry


def ndjson_listener(**extra: Any) -> dict[str, Any]:
    return {
        "name": "nd",
        "protocol": "ndjson",
        "bind": "127.0.0.1:0",
        "destination": "logs",
    } | extra


async def client_for(gw: Any, listener: str = "nd") -> NdjsonClient:
    return await NdjsonClient.connect(*host_port(gw.addresses[listener][0]))


async def test_publish_is_acked_only_after_the_subscriber_acks() -> None:
    async with running_gateway({"listeners": [ndjson_listener()]}) as gw:
        sub = await client_for(gw)
        await sub.subscribe("logs")
        await subscribed(gw, "logs")
        pub = await client_for(gw)
        [ident] = await pub.publish_nowait([b"hello"])
        delivery = await sub.receive()
        assert delivery.body == b"hello"
        assert delivery.destination == "logs"
        # The subscriber has not acked: the publisher must not have its answer.
        with trio.move_on_after(0.2):
            await pub.wait_answers([ident])
            pytest.fail("publish acked before the subscriber acked")
        await sub.ack(delivery.tag)
        [answer] = await pub.wait_answers([ident])
        assert answer.status == "delivered"
        await sub.aclose()
        await pub.aclose()


async def test_fan_out_and_groups_over_sockets() -> None:
    async with running_gateway({"listeners": [ndjson_listener()]}) as gw:
        a, b, c = [await client_for(gw) for _ in range(3)]
        await a.subscribe("t")  # its own group
        await b.subscribe("t", "workers")
        await c.subscribe("t", "workers")
        await subscribed(gw, "t", 3)
        pub = await client_for(gw)
        ids = await pub.publish_nowait([b"%d" % i for i in range(10)], "t")
        got_a = [await a.receive() for _ in range(10)]
        await a.ack(*(d.tag for d in got_a))
        workers: list[bytes] = []

        async def drain(client: NdjsonClient) -> None:
            while True:
                d = await client.receive()
                workers.append(d.body)
                await client.ack(d.tag)

        async with trio.open_nursery() as n:
            n.start_soon(drain, b)
            n.start_soon(drain, c)
            answers = await pub.wait_answers(ids)
            n.cancel_scope.cancel()
        assert [d.body for d in got_a] == [b"%d" % i for i in range(10)]
        assert sorted(workers) == sorted(b"%d" % i for i in range(10))  # each exactly once
        assert {x.status for x in answers} == {"delivered"}


async def test_relay_through_an_upstream_acks_end_to_end() -> None:
    """ndjson publisher → gateway A → ndjson upstream → gateway B → subscriber."""
    async with running_gateway({"listeners": [ndjson_listener()]}) as b:
        b_addr = b.addresses["nd"][0]
        config_a = {
            "listeners": [ndjson_listener()],
            "upstreams": [{"name": "b", "protocol": "ndjson", "connect": b_addr}],
            "routes": [{"from": "logs", "to": ["upstream:b"]}],
        }
        async with running_gateway(config_a) as a:
            sub = await client_for(b)
            await sub.subscribe("logs")
            await subscribed(b, "logs")
            pub = await client_for(a)
            [ident] = await pub.publish_nowait([b"relayed"], "logs", headers={"k": "v"})
            d = await sub.receive()
            assert (d.body, dict(d.headers), d.destination) == (b"relayed", {"k": "v"}, "logs")
            with trio.move_on_after(0.2):
                await pub.wait_answers([ident])
                pytest.fail("relay acked before the final subscriber acked")
            await sub.ack(d.tag)
            [answer] = await pub.wait_answers([ident])
            assert answer.status == "delivered"


async def test_upstream_resends_after_its_server_restarts() -> None:
    """Messages the upstream's server never acked are sent again after it restarts."""
    async with trio.open_nursery() as outer:
        # "logs" at B is a queue: it keeps what nobody consumes yet, so B holds both.
        queue = [{"name": "logs", "kind": "queue"}]
        b1 = Gateway(
            parse(
                {
                    "gateway": {"drain_timeout": "100ms"},
                    "listeners": [ndjson_listener()],
                    "destinations": queue,
                }
            )
        )
        async with trio.open_nursery() as nb:
            await nb.start(b1.run)
            addr = b1.addresses["nd"][0]
            upstream = {
                "name": "b",
                "protocol": "ndjson",
                "connect": addr,
                "backoff_initial": "50ms",
                "backoff_max": "100ms",
            }
            a = Gateway(
                parse(
                    {
                        "listeners": [ndjson_listener()],
                        "upstreams": [upstream],
                        "routes": [{"from": "logs", "to": ["upstream:b"]}],
                    }
                )
            )
            await outer.start(a.run)
            pub = await client_for(a)
            ids = await pub.publish_nowait([b"one", b"two"], "logs")
            # Nobody subscribes at B: B holds both and never acks the upstream.
            await until(lambda: b1.hub.destination("logs").figures().received == 2)
            b1.shutdown()
        # B is gone with both messages unacked; a new B comes up on the same port.
        async with running_gateway(
            {"listeners": [ndjson_listener(bind=addr)], "destinations": queue}
        ) as b2:
            sub = await client_for(b2)
            await sub.subscribe("logs")
            got = [await sub.receive() for _ in range(2)]
            assert sorted(d.body for d in got) == [b"one", b"two"]
            await sub.ack(*(d.tag for d in got))
            answers = await pub.wait_answers(ids)
            assert [x.status for x in answers] == ["delivered", "delivered"]
        a.shutdown()


async def test_upstream_resends_unacked_after_reconnect() -> None:
    async with running_gateway({"listeners": [ndjson_listener()]}) as b:
        addr = b.addresses["nd"][0]
        config_a = {
            "listeners": [ndjson_listener()],
            "upstreams": [
                {
                    "name": "b",
                    "protocol": "ndjson",
                    "connect": addr,
                    "backoff_initial": "50ms",
                    "backoff_max": "100ms",
                }
            ],
            "routes": [{"from": "logs", "to": ["upstream:b"]}],
        }
        async with running_gateway(config_a) as a:
            sub = await client_for(b)
            await sub.subscribe("logs")
            await subscribed(b, "logs")
            pub = await client_for(a)
            [ident] = await pub.publish_nowait([b"again"], "logs")
            first = await sub.receive()
            assert first.body == b"again"
            # The subscriber vanishes unacked: B redelivers to the next subscriber,
            # and A's publisher is still waiting (nothing was acked).
            await sub.aclose()
            sub2 = await client_for(b)
            await sub2.subscribe("logs")
            second = await sub2.receive()
            assert second.body == b"again"
            assert second.redelivered
            await sub2.ack(second.tag)
            [answer] = await pub.wait_answers([ident])
            assert answer.status == "delivered"


async def test_graceful_shutdown_settles_in_flight_messages() -> None:
    """Shutdown waits for in-flight publishes; every acked message was delivered."""
    config = {"gateway": {"drain_timeout": "5s"}, "listeners": [ndjson_listener()]}
    async with running_gateway(config) as gw:
        sub = await client_for(gw)
        await sub.subscribe("logs", window=1000)
        await subscribed(gw, "logs")
        pub = await client_for(gw)
        ids = await pub.publish_nowait([b"m%d" % i for i in range(50)])
        deliveries = [await sub.receive() for _ in range(50)]
        gw.shutdown()
        await gw.draining.wait()
        await trio.testing.wait_all_tasks_blocked()  # the cancelled accept loops closed
        # Draining: new connections are refused, in-flight work continues.
        with pytest.raises(OSError):
            await client_for(gw)
        await sub.ack(*(d.tag for d in deliveries))
        answers = await pub.wait_answers(ids)
        assert [a.status for a in answers] == ["delivered"] * 50
    assert gw.drained_cleanly is True


async def test_drain_deadline_closes_unsettled_work_without_acking() -> None:
    config = {
        "gateway": {"drain_timeout": "300ms"},
        "listeners": [ndjson_listener()],
        # A queue keeps what nobody consumes, so the publish stays unsettled.
        "destinations": [{"name": "logs", "kind": "queue"}],
    }
    with trio.fail_after(5):
        async with running_gateway(config) as gw:
            pub = await client_for(gw)
            [ident] = await pub.publish_nowait([b"nobody listens"])
            await until(lambda: gw.hub.inflight == 1)  # handed to the hub, unsettled
            gw.shutdown()
            with pytest.raises(trio.BrokenResourceError):
                await pub.wait_answers([ident])
    assert gw.drained_cleanly is False


async def test_max_connections_refuses_extra_connections(caplog: Any) -> None:
    caplog.set_level(logging.WARNING)
    async with running_gateway({"listeners": [ndjson_listener(max_connections=2)]}) as gw:
        c1, c2 = await client_for(gw), await client_for(gw)
        await trio.testing.wait_all_tasks_blocked()
        c3 = await client_for(gw)
        with pytest.raises(trio.BrokenResourceError):
            await c3.publish(b"x")
        assert "max_connections" in caplog.text
        # The first two still work.
        sub = c1
        await sub.subscribe("logs")
        await subscribed(gw, "logs")
        [ident] = await c2.publish_nowait([b"ok"])
        d = await sub.receive()
        await sub.ack(d.tag)
        assert (await c2.wait_answers([ident]))[0].status == "delivered"


async def test_idle_client_is_closed_after_idle_timeout() -> None:
    async with running_gateway({"listeners": [ndjson_listener(idle_timeout="200ms")]}) as gw:
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        with trio.fail_after(3):
            assert await stream.receive_some() == b""  # closed by the gateway


async def test_subscriber_is_not_idle_closed_while_subscribed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_gateway({"listeners": [ndjson_listener(idle_timeout="200ms")]}) as gw:
        sub = await client_for(gw)
        await sub.subscribe("logs")
        await subscribed(gw, "logs")
        await trio.sleep(0.6)  # three idle timeouts, on the mock clock
        pub = await client_for(gw)
        [ident] = await pub.publish_nowait([b"late"])
        d = await sub.receive()
        await sub.ack(d.tag)
        assert (await pub.wait_answers([ident]))[0].status == "delivered"


async def test_garbage_gets_an_error_and_closes_only_that_connection() -> None:
    async with running_gateway({"listeners": [ndjson_listener()]}) as gw:
        good = await client_for(gw)
        await good.subscribe("logs")
        await subscribed(gw, "logs")
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        await stream.send_all(b"\x16\x03\x01\x00garbage\xff\n")
        reply = b""
        with trio.fail_after(3):
            while chunk := await stream.receive_some():
                reply += chunk
        assert reply.startswith(b'{"op":"error","error":"invalid JSON')
        pub = await client_for(gw)
        [ident] = await pub.publish_nowait([b"still serving"])
        d = await good.receive()
        await good.ack(d.tag)
        assert (await pub.wait_answers([ident]))[0].status == "delivered"


async def test_half_open_client_is_answered_then_closed() -> None:
    """A client that sends and half-closes still gets its acks, then the close."""
    async with running_gateway({"listeners": [ndjson_listener()]}) as gw:
        sub = await client_for(gw)
        await sub.subscribe("logs")
        await subscribed(gw, "logs")
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        await stream.send_all(b'{"op":"pub","id":1,"body":"x"}\n')
        await stream.send_eof()
        d = await sub.receive()
        await sub.ack(d.tag)
        reply = b""
        with trio.fail_after(3):
            while chunk := await stream.receive_some():
                reply += chunk
        assert reply == b'{"op":"ack","id":1,"status":"delivered"}\n'


async def test_unix_socket_listener(tmp_path: Path) -> None:
    path = tmp_path / "gw.sock"
    async with running_gateway({"listeners": [ndjson_listener(bind=f"unix:{path}")]}) as gw:
        assert gw.addresses["nd"] == [f"unix:{path}"]
        sub = NdjsonClient(await trio.open_unix_socket(str(path)))
        await sub.subscribe("logs")
        await subscribed(gw, "logs")
        pub = NdjsonClient(await trio.open_unix_socket(str(path)))
        [ident] = await pub.publish_nowait([b"via unix"])
        d = await sub.receive()
        await sub.ack(d.tag)
        assert (await pub.wait_answers([ident]))[0].status == "delivered"
        garbage = await trio.open_unix_socket(str(path))
        await garbage.send_all(b"nope\n")
        assert b'"op":"error"' in await garbage.receive_some()


class _Exploding(ProtocolPlugin):
    """A protocol with a bug: it crashes on the byte ``!``."""

    name = "exploding"
    roles: ClassVar = frozenset({"server"})

    async def serve(self, conn: ServerConnection) -> None:
        while data := await conn.stream.receive_some():
            if b"!" in data:
                raise ZeroDivisionError("a bug in the protocol")
            await conn.stream.send_all(data)


async def test_a_bug_in_one_connection_closes_only_that_connection(caplog: Any) -> None:
    base = default_registry()
    registry = Registry(
        {"exploding": Registered("exploding", "tests", "tests", "0", plugin=_Exploding())},
        base.transports,
    )
    listener = {"name": "x", "protocol": "exploding", "bind": "127.0.0.1:0"}
    async with running_gateway({"listeners": [listener]}, registry=registry) as gw:
        addr = host_port(gw.addresses["x"][0])
        healthy = await trio.open_tcp_stream(*addr)
        broken = await trio.open_tcp_stream(*addr)
        await broken.send_all(b"!")
        with trio.fail_after(3):
            assert await broken.receive_some() == b""
        await healthy.send_all(b"ping")
        assert await healthy.receive_some() == b"ping"
        peer = broken.socket.getsockname()
        assert f"127.0.0.1:{peer[1]}" in caplog.text
        assert "ZeroDivisionError" in caplog.text
        # The toy echo plugin does not end its connections when the gateway drains:
        # leaving this one open would hold the shutdown for the whole drain_timeout.
        await healthy.aclose()


async def test_publish_reports_rejected_for_oversize_messages() -> None:
    config = {"gateway": {"buffer_bytes": "4KiB"}, "listeners": [ndjson_listener()]}
    async with running_gateway(config) as gw:
        pub = await client_for(gw)
        answer = await pub.publish(b"x" * 8192)
        assert answer.status == "rejected"
        assert "exceeds the buffer" in answer.reason
        assert Outcome.REJECTED.name.lower() == answer.status
