"""Liveness of reactive-streams connections on the mock clock: the gateway pings a silent
peer and closes a dead one; an open subscription with zero demand is not idle."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway
from toy_line import registered

from gateway.config.loader import parse
from gateway.core.facade import HubFacade
from gateway.core.hub import Hub
from gateway.core.model import Message
from gateway.core.routing import Router
from gateway.core.topic import TopicLimits
from gateway.ops.metrics import Metrics
from gateway.protocol.plugin import ConnectionInfo, ServerConnection
from gateway.runtime.catalog import Catalog
from gateway.sdk import ConnectionClosed
from protocols.reactive import Accepted, Elements, OnNext, Pong, Request, Subscribe, Subscribed
from protocols.reactive.events import Pinged
from protocols.reactive.plugin import ReactivePlugin

from .test_listener import Peer, config

REGISTRY = registered(ReactivePlugin)


@asynccontextmanager
async def served(**options: Any) -> AsyncIterator[tuple[Peer, Metrics]]:
    """The listener's session on a memory stream (as the runtime runs it, without the
    runtime's sockets), and a peer past the hellos."""
    parsed = parse(config(**options), source="<t>", registry=REGISTRY)
    limits = parsed.gateway.limits
    catalog = Catalog(
        parsed.destinations, TopicLimits(limits.buffer_bytes, limits.buffer_messages, None)
    )
    hub = Hub(Router(parsed.routes), limits, providers=[catalog])
    near, far = trio.testing.memory_stream_pair()
    metrics = Metrics()
    info = ConnectionInfo("reactive", "rs", "peer")
    conn = ServerConnection(
        far, info, parsed.listeners[0], HubFacade(hub), trio.Event(), metrics=metrics
    )

    async def serve() -> None:
        async with far:
            await ReactivePlugin().serve(conn)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        peer = Peer(near)
        await near.send_all(peer.codec.hello())
        await peer.event(timeout=60)  # the server's hello
        yield peer, metrics
        nursery.cancel_scope.cancel()


def count(metrics: Metrics, name: str) -> float | None:
    return metrics.value(name, {"listener": "rs"})


async def test_a_silent_peer_is_pinged_then_closed(autojump_clock: Any) -> None:
    async with served(keepalive="20s", keepalive_timeout="5s") as (peer, metrics):
        start = trio.current_time()
        ping = await peer.event(timeout=600)
        assert isinstance(ping, Pinged)
        assert trio.current_time() - start == pytest.approx(20.0)
        assert isinstance(await peer.event(timeout=600), ConnectionClosed)
        assert trio.current_time() - start == pytest.approx(25.0)
        assert count(metrics, "reactive_pings_total") == 1
        assert count(metrics, "reactive_keepalive_timeouts_total") == 1


async def test_a_peer_that_answers_stays(autojump_clock: Any) -> None:
    async with served(keepalive="20s", keepalive_timeout="5s") as (peer, metrics):
        start = trio.current_time()
        for _ in range(5):
            ping = await peer.event(timeout=600)
            assert isinstance(ping, Pinged)
            await peer.send(Pong(ping.payload))
        # Each ping came 20 s after the last thing heard: the pong before it.
        assert trio.current_time() - start == pytest.approx(100.0)
        assert count(metrics, "reactive_keepalive_timeouts_total") in (None, 0)


async def test_keepalive_zero_never_pings(autojump_clock: Any) -> None:
    async with served(keepalive="0s") as (peer, _metrics):
        with trio.move_on_after(3600):
            event = await peer.event(timeout=7200)
            pytest.fail(f"nothing should arrive, got {event}")


async def test_zero_demand_survives_the_idle_timeout(autojump_clock: Any) -> None:
    """The runtime's idle watchdog leaves a connection with an open subscription alone,
    however long its subscriber waits before requesting."""
    data = config(keepalive="0s")
    data["listeners"][0]["idle_timeout"] = "10s"
    async with running_gateway(data, registry=REGISTRY) as gw:
        host, port = host_port(gw.addresses["rs"][0])
        async with await trio.open_tcp_stream(host, port) as stream:
            peer = Peer(stream)
            await stream.send_all(peer.codec.hello())
            await peer.event(timeout=60)
            await peer.send(Subscribe("logs", 1, 0))
            assert await peer.event(timeout=60) == Accepted(1, 0)
            await trio.sleep(3600)  # an hour of zero demand: never idle
            await gw.hub.publish([Message("logs", b"at last")])
            await peer.send(Request(1, 1))
            assert await peer.elements(1, 1) == [b"at last"]


async def test_a_connection_without_subscriptions_is_idle(autojump_clock: Any) -> None:
    """The same watchdog closes a connection with nothing open (the control case)."""
    data = config(keepalive="0s")
    data["listeners"][0]["idle_timeout"] = "10s"
    async with running_gateway(data, registry=REGISTRY) as gw:
        host, port = host_port(gw.addresses["rs"][0])
        async with await trio.open_tcp_stream(host, port) as stream:
            peer = Peer(stream)
            await stream.send_all(peer.codec.hello())
            await peer.event(timeout=60)
            start = trio.current_time()
            assert isinstance(await peer.event(timeout=600), ConnectionClosed)
            assert trio.current_time() - start == pytest.approx(10.0, abs=0.5)


async def test_the_metric_families_count_streams_and_elements(autojump_clock: Any) -> None:
    async with served(keepalive="0s", subscriptions=[{"publisher": "in", "demand": 3}]) as (
        peer,
        metrics,
    ):
        request = await peer.event(timeout=60)  # the listener's subscribe to us
        sid = request.subscriber
        await peer.send(Subscribe("logs", 1, 10), Subscribe("hidden", 2, 1))
        assert await peer.event(timeout=60) == Accepted(1, 0)
        await peer.event(timeout=60)  # onError: not exposed
        await peer.send(Subscribed(sid, 0), OnNext(sid, b"a"), OnNext(sid, b"b"))
        got: list[bytes] = []
        while len(got) < 2:  # into logs, and out to us (among the listener's requests)
            event = await peer.event(timeout=60)
            got += event.elements if isinstance(event, Elements) else []
        assert got == [b"a", b"b"]
        assert count(metrics, "reactive_served_subscriptions_total") == 1
        assert count(metrics, "reactive_refused_subscriptions_total") == 1
        assert count(metrics, "reactive_subscriptions_total") == 1
        assert count(metrics, "reactive_elements_received_total") == 2
        assert count(metrics, "reactive_elements_sent_total") == 2
