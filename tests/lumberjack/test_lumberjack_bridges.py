"""Lumberjack bridged to other protocols and to itself, over real sockets.

Each test runs one or two in-process gateways on loopback and checks the end-
to-end promise of every protocol ack: a sender is acked only once every target
acked (an ndjson subscriber, a Lumberjack server behind an upstream, the
consumer of a second gateway). Senders are the library ``LumberjackClient``
and the third-party ``pylogbeat``; receivers are ``NdjsonClient``, the library
``open_server`` and hub subscriptions.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pylogbeat
import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from waits import subscribed, until

from gateway.config.certs import init_dir
from gateway.config.loader import parse
from gateway.core.destination import Delivery, Subscription
from gateway.runtime.gateway import Gateway
from protocols.lumberjack.client import ClientSettings, LumberjackClient
from protocols.lumberjack.server import ServerSettings
from protocols.lumberjack.standalone import Batch, open_server

VERSION = importlib.metadata.version("interchange-gateway")


def lj_listener(name: str = "lj", **options: Any) -> dict[str, Any]:
    return {
        "name": name,
        "protocol": "lumberjack",
        "bind": "127.0.0.1:0",
        "destination": "logs",
    } | options


def nd_listener() -> dict[str, Any]:
    # Two listeners may not both bind "127.0.0.1:0" (the config refuses a duplicate bind).
    return {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.2:0", "destination": "logs"}


def lj_upstream(connect: str, **options: Any) -> dict[str, Any]:
    return {
        "name": "next",
        "protocol": "lumberjack",
        "connect": connect,
        "backoff_initial": "50ms",
        "backoff_max": "100ms",
    } | options


def relay_config(connect: str, listener: dict[str, Any], **upstream: Any) -> dict[str, Any]:
    return {
        "gateway": {"drain_timeout": "100ms"},
        "listeners": [listener],
        "upstreams": [lj_upstream(connect, **upstream)],
        "routes": [{"from": "logs", "to": ["upstream:next"]}],
    }


def relayed(body: bytes) -> dict[str, Any]:
    """A relayed event without the ``@metadata`` the upstream added (checked here)."""
    event: dict[str, Any] = json.loads(body)
    assert event.pop("@metadata") == {"beat": "interchange", "type": "_doc", "version": VERSION}
    return event


def upstream_failures(gw: Gateway) -> float:
    """Connections of the ``next`` upstream that failed (to connect, or later)."""
    return gw.metrics.value("interchange_upstream_failures_total", {"upstream": "next"}) or 0


def plain(*listeners: dict[str, Any]) -> dict[str, Any]:
    return {"gateway": {"drain_timeout": "100ms"}, "listeners": list(listeners)}


async def lj_client(gw: Gateway, listener: str = "lj", **settings: Any) -> LumberjackClient:
    return await LumberjackClient.connect(
        *host_port(gw.addresses[listener][0]), settings=ClientSettings(**settings)
    )


async def take(sub: Subscription, n: int, *, ack: bool = False, timeout: float = 5.0) -> list[Any]:
    got: list[Delivery] = []
    with trio.fail_after(timeout):
        while len(got) < n:
            batch = await sub.receive(n - len(got))
            got.extend(batch)
            if ack:
                sub.ack_many(x.tag for x in batch)
    return got


class Sending:
    """A send running in the background; ``done`` is set when it returned."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Any = None

    async def run(self, fn: Any, *args: Any) -> None:
        self.result = await fn(*args)
        self.done.set()

    async def not_done_within(self, seconds: float) -> bool:
        with trio.move_on_after(seconds):
            await self.done.wait()
        return not self.done.is_set()

    async def wait(self, timeout: float = 5.0) -> Any:
        with trio.fail_after(timeout):
            await self.done.wait()
        return self.result


# -- lumberjack -> ndjson -----------------------------------------------------------------------


async def test_lumberjack_to_an_ndjson_subscriber_acks_after_the_subscriber() -> None:
    async with running_gateway(plain(lj_listener(), nd_listener())) as gw:
        sub = await NdjsonClient.connect(*host_port(gw.addresses["nd"][0]))
        await sub.subscribe("logs")
        await subscribed(gw, "logs")
        events = [{"message": "one", "n": 1}, {"message": "two", "n": 2}, {"message": "3"}]
        async with await lj_client(gw) as sender, trio.open_nursery() as nursery:
            sending = Sending()
            nursery.start_soon(sending.run, sender.send, events)
            got = [await sub.receive() for _ in events]
            assert [json.loads(x.body) for x in got] == events
            assert {x.content_type for x in got} == {"application/json"}
            assert {x.destination for x in got} == {"logs"}
            await sub.ack(got[0].tag, got[1].tag)
            assert await sending.not_done_within(0.3), "acked before the subscriber acked"
            await sub.ack(got[2].tag)
            assert await sending.wait() == 3
        await sub.aclose()


async def test_lumberjack_v1_events_reach_ndjson_as_headers() -> None:
    async with running_gateway(plain(lj_listener(), nd_listener())) as gw:
        sub = await NdjsonClient.connect(*host_port(gw.addresses["nd"][0]))
        await sub.subscribe("logs")
        await subscribed(gw, "logs")
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["lj"][0]))
        # A v1 window by hand: LumberjackClient only writes J frames.
        await stream.send_all(
            b"1W\x00\x00\x00\x01"
            b"1D\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x04line\x00\x00\x00\x02hi"
        )
        got = await sub.receive()
        assert (got.body, dict(got.headers)) == (b"", {"line": "hi"})
        await sub.ack(got.tag)
        with trio.fail_after(5):
            assert await stream.receive_some(6) == b"1A\x00\x00\x00\x01"
        await stream.aclose()
        await sub.aclose()


# -- ndjson -> lumberjack upstream ------------------------------------------------------------


@asynccontextmanager
async def lumberjack_server(port: int = 0) -> AsyncIterator[Any]:
    async with open_server("127.0.0.1", port, settings=ServerSettings(keepalive=0.1)) as server:
        yield server


async def receive_batch(server: Any, timeout: float = 5.0) -> Batch:
    with trio.fail_after(timeout):
        batch: Batch = await server.receive()
        return batch


async def test_ndjson_publisher_to_a_lumberjack_upstream_acks_after_the_server() -> None:
    async with lumberjack_server() as server:
        config = relay_config(f"127.0.0.1:{server.port}", nd_listener())
        async with running_gateway(config) as gw:
            pub = await NdjsonClient.connect(*host_port(gw.addresses["nd"][0]))
            [text_id] = await pub.publish_nowait([b"plain text"], headers={"k": "v"})
            [json_id] = await pub.publish_nowait([b'{"a": 1}'], content_type="application/json")
            events: list[bytes] = []
            batches = []
            while len(events) < 2:
                batch = await receive_batch(server)
                batches.append(batch)
                events += [p for _, p in batch.events]  # type: ignore[misc]
            metadata = {"beat": "interchange", "type": "_doc", "version": VERSION}
            assert [json.loads(e) for e in events] == [
                {"@metadata": metadata, "message": "plain text", "k": "v"},
                {"@metadata": metadata, "a": 1},
            ]
            with trio.move_on_after(0.3):
                await pub.wait_answers([text_id])
                pytest.fail("the publisher was acked before the Lumberjack server acked")
            for batch in batches:
                batch.ack()
            answers = await pub.wait_answers([text_id, json_id])
            assert [x.status for x in answers] == ["delivered", "delivered"]
            await pub.aclose()


async def test_a_body_labelled_json_that_is_not_an_object_is_wrapped_not_sent_raw() -> None:
    """A broken "JSON" body must not become a J frame every Logstash refuses.

    Sent raw, the downstream listener closes the connection without an ack; the
    upstream resends the same window for ever and nothing behind it gets through.
    """
    async with running_gateway(plain(lj_listener("b"))) as b:
        tap = b.hub.subscribe("logs")
        config = relay_config(b.addresses["b"][0], nd_listener())
        async with running_gateway(config) as a:
            pub = await NdjsonClient.connect(*host_port(a.addresses["nd"][0]))
            [bad] = await pub.publish_nowait([b'{"truncated": '], content_type="application/json")
            [good] = await pub.publish_nowait([b'{"fine": true}'], content_type="application/json")
            got = await take(tap, 2, ack=True, timeout=2)
            assert [relayed(x.message.body) for x in got] == [
                {"message": '{"truncated": '},
                {"fine": True},
            ]
            answers = await pub.wait_answers([bad, good])
            assert [x.status for x in answers] == ["delivered", "delivered"]
            await pub.aclose()


# -- lumberjack -> lumberjack relay -------------------------------------------------------------


@asynccontextmanager
async def relay(
    b_listener: dict[str, Any] | None = None,
    a_listener: dict[str, Any] | None = None,
    **upstream: Any,
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    """Gateway A (listener ``lj``) relays ``logs`` to gateway B's listener ``b``."""
    async with running_gateway(plain(b_listener or lj_listener("b"))) as b:
        config = relay_config(b.addresses["b"][0], a_listener or lj_listener(), **upstream)
        async with running_gateway(config) as a:
            yield a, b


def pylogbeat_send(host: str, port: int, windows: list[list[dict[str, Any]]]) -> int:
    """Several windows on one pylogbeat connection; returns its last sequence number."""
    with pylogbeat.PyLogBeatClient(host, port, timeout=10) as client:
        for window in windows:
            client.send(window)
        return int(client._sequence)


async def test_relay_acks_pylogbeat_only_after_the_final_consumer_acked() -> None:
    async with relay() as (a, b):
        tap = b.hub.subscribe("logs")
        host, port = host_port(a.addresses["lj"][0])
        windows = [[{"w": w, "i": i} for i in range(size)] for w, size in enumerate((3, 5, 2))]
        sending = Sending()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                sending.run, trio.to_thread.run_sync, pylogbeat_send, host, port, windows
            )
            first = await take(tap, 3)
            assert await sending.not_done_within(0.3)
            tap.ack_many(x.tag for x in first)
            rest = await take(tap, 7, ack=True)
            assert await sending.wait() == 10  # pylogbeat's sequence ran on across windows
        received = [relayed(x.message.body) for x in first + rest]
        assert received == [event for window in windows for event in window]
        source = first[0].message.source
        assert source is not None
        assert (source.protocol, source.listener) == ("lumberjack", "b")


async def test_relay_end_to_end_with_the_library_client() -> None:
    async with relay() as (a, b):
        tap = b.hub.subscribe("logs")
        async with await lj_client(a) as sender, trio.open_nursery() as nursery:
            for round_ in range(3):
                events = [{"round": round_, "i": i} for i in range(4)]
                sending = Sending()
                nursery.start_soon(sending.run, sender.send, events)
                got = await take(tap, 4)
                assert [relayed(x.message.body) for x in got] == events
                assert await sending.not_done_within(0.2)
                tap.ack_many(x.tag for x in got)
                assert await sending.wait() == 4
        with trio.move_on_after(0.2):
            pytest.fail(f"duplicate delivery: {await tap.receive()}")


async def test_relay_through_a_slow_consumer_survives_on_keepalives(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Timeouts of 0.5 s on both hops, a consumer that takes 2 s: nothing resent."""
    keepalive = {"keepalive": "100ms"}
    async with relay(lj_listener("b", **keepalive), lj_listener(**keepalive), timeout="500ms") as (
        a,
        b,
    ):
        tap = b.hub.subscribe("logs")
        events = [{"i": i} for i in range(50)]
        async with await lj_client(a, timeout=0.5) as sender, trio.open_nursery() as nursery:

            async def slow_consumer() -> None:
                got = await take(tap, 50)
                await trio.sleep(2.0)
                tap.ack_many(x.tag for x in got)

            nursery.start_soon(slow_consumer)
            start = trio.current_time()
            assert await sender.send(events) == 50
            assert trio.current_time() - start >= 1.9
        # Had either hop timed out, the window would have been sent again.
        with trio.move_on_after(0.3):
            pytest.fail(f"resent after a timeout: {await tap.receive()}")


async def test_relay_loses_nothing_acked_when_the_last_gateway_restarts() -> None:
    """B dies holding a window; a new B on the same port gets everything acked to the sender."""
    b1 = Gateway(parse(plain(lj_listener("b"))))
    b1_stopped = trio.Event()

    async def run_b1(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await b1.run(task_status=task_status)
        b1_stopped.set()

    acked_by_sender: list[int] = []
    received: list[int] = []
    async with trio.open_nursery() as outer:
        await outer.start(run_b1)
        address = b1.addresses["b"][0]
        tap1 = b1.hub.subscribe("logs")
        async with running_gateway(relay_config(address, lj_listener(), bulk_max_size=10)) as a:
            sender = await lj_client(a, timeout=10)
            sent = Sending()

            async def send_windows() -> None:
                for w in range(6):
                    events = [{"n": w * 10 + i} for i in range(10)]
                    await sender.send(events)
                    acked_by_sender.extend(e["n"] for e in events)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sent.run, send_windows)
                # B1 acks the first window and half of the second, then dies.
                first = await take(tap1, 10, ack=True)
                second = await take(tap1, 10)
                tap1.ack_many(x.tag for x in second[:5])
                received += [json.loads(x.message.body)["n"] for x in first + second[:5]]
                b1.shutdown()
                with trio.fail_after(5):
                    await b1_stopped.wait()
                assert acked_by_sender == list(range(10))
                # B is down: A's upstream fails to reconnect, and keeps retrying.
                await until(lambda: upstream_failures(a) >= 1)
                async with running_gateway(plain(lj_listener("b", bind=address))) as b2:
                    tap2 = b2.hub.subscribe("logs")

                    async def consume() -> None:
                        while True:
                            for x in await tap2.receive():
                                received.append(json.loads(x.message.body)["n"])
                                tap2.ack(x.tag)

                    nursery.start_soon(consume)
                    await sent.wait(timeout=10)
                    nursery.cancel_scope.cancel()
            await sender.aclose()
    assert acked_by_sender == list(range(60))
    assert set(acked_by_sender) <= set(received), "an event acked to the sender was lost"
    # 10-14 were acked at B1 but their window was not: resent, so seen twice.
    assert [received.count(n) for n in (5, 12, 17, 25)] == [1, 2, 1, 1]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return init_dir(tmp_path_factory.mktemp("lj-bridge-certs"))


async def test_relay_over_mutual_tls_carries_the_upstream_identity(certs: dict[str, Path]) -> None:
    b_listener = lj_listener(
        "b",
        enrich="headers",
        tls={
            "cert": str(certs["server_cert"]),
            "key": str(certs["server_key"]),
            "client_ca": str(certs["ca_cert"]),
            "client_auth": "required",
        },
    )
    tls = {
        "ca": str(certs["ca_cert"]),
        "cert": str(certs["client_cert"]),
        "key": str(certs["client_key"]),
        "server_name": "localhost",
    }
    async with relay(b_listener, tls=tls) as (a, b):
        tap = b.hub.subscribe("logs")
        async with await lj_client(a) as sender, trio.open_nursery() as nursery:
            sending = Sending()
            nursery.start_soon(sending.run, sender.send, [{"over": "mtls"}])
            [got] = await take(tap, 1)
            assert await sending.not_done_within(0.2)
            tap.ack(got.tag)
            assert await sending.wait() == 1
        assert relayed(got.message.body) == {"over": "mtls"}
        assert "CN=interchange-client" in got.message.headers["lumberjack.tls_subject"]
