"""The gateway as a reactive-streams *subscriber*: a listener's ``subscriptions`` and an
upstream, both roles on one connection, over real sockets.

The peer is the codec's own role driven by hand (:class:`Peer` of the listener
tests, or a server peer accepting the upstream), so each test sees exactly
what the gateway requests and when.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.plugin import NdjsonPlugin
from toy_line import registered
from waits import subscribed

from gateway.core.model import Message
from gateway.runtime.gateway import Gateway
from gateway.sdk import ConnectionClosed
from protocols.reactive import (
    Accepted,
    Cancel,
    Elements,
    GoodbyeReceived,
    Hello,
    OnComplete,
    OnError,
    OnNext,
    Request,
    Role,
    Subscribe,
    Subscribed,
    SubscribeRequested,
)
from protocols.reactive.codec import Connection
from protocols.reactive.events import Cancelled, DemandAdded
from protocols.reactive.plugin import ReactivePlugin

from .test_listener import GUARD, Peer, config

REGISTRY = registered(ReactivePlugin, NdjsonPlugin)


async def take(sub: Any, count: int, ack: bool = True) -> list[bytes]:
    """``count`` bodies from a hub subscription (acked unless ``ack`` is False)."""
    got: list[bytes] = []
    with trio.fail_after(GUARD):
        while len(got) < count:
            for d in await sub.receive():
                got.append(d.message.body)
                if ack:
                    sub.ack(d.tag)
    return got


async def until_closed(peer: Peer) -> list[Any]:
    """Every event up to the gateway closing the connection."""
    events = [await peer.event()]
    while not isinstance(events[-1], ConnectionClosed):
        events.append(await peer.event())
    return events


@asynccontextmanager
async def offered(**options: Any) -> AsyncIterator[tuple[Gateway, Peer, SubscribeRequested]]:
    """A gateway whose listener subscribes to its peers' publisher ``in``; a peer whose
    hello went out, and the gateway's subscribe it got."""
    data = config(subscriptions=[{"publisher": "in", **options}])
    data["listeners"].append({"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"})
    data["destinations"] += [
        {"name": "topic", "kind": "topic"},
        {"name": "fixed4", "retain": "1MiB", "element_size": 4},
    ]
    async with running_gateway(data, registry=REGISTRY) as gw:
        host, port = host_port(gw.addresses["rs"][0])
        async with await trio.open_tcp_stream(host, port) as stream:
            peer = Peer(stream)
            await stream.send_all(peer.codec.hello())
            assert isinstance(await peer.event(), Hello)
            request = await peer.event()  # sent once our hello arrived
            assert isinstance(request, SubscribeRequested), request
            yield gw, peer, request


async def test_the_listener_subscribes_and_publishes_what_arrives() -> None:
    async with offered(demand=5) as (gw, peer, request):
        assert request.publisher == "in"
        assert request.initial_demand == 5
        sid = request.subscriber
        sub = gw.hub.subscribe("logs", start="earliest")
        await peer.send(Subscribed(sid, 0), *(OnNext(sid, b"e%d" % i) for i in range(5)))
        assert await take(sub, 5) == [b"e%d" % i for i in range(5)]
        # Each element is requested again once stored: demand comes back in full.
        demand = 0
        while demand < 5:
            event = await peer.event()
            assert isinstance(event, DemandAdded), event
            demand += event.demand
        assert demand == 5


async def test_more_is_requested_only_as_receipts_settle() -> None:
    """A topic settles a publish once its subscriber acked: the gateway's demand
    follows the local subscriber's acks, never running ahead."""
    async with offered(destination="topic", demand=3) as (gw, peer, request):
        sid = request.subscriber
        local = gw.hub.subscribe("topic")
        await peer.send(Subscribed(sid, 0), *(OnNext(sid, b"%d" % i) for i in range(3)))
        deliveries: list[Any] = []
        with trio.fail_after(GUARD):
            while len(deliveries) < 3:
                deliveries += await local.receive()
        assert await peer.quiet() == []  # nothing settled: no more demand
        # Demand comes back per read's publish, as its receipt settles: never more than
        # what was acked here.
        total = 0
        for acked, d in enumerate(deliveries, 1):
            local.ack(d.tag)
            for event in await peer.quiet():
                assert isinstance(event, DemandAdded), event
                total += event.demand
            assert total <= acked
        assert total == 3


async def test_an_ndjson_subscriber_that_never_acks_bounds_the_gateways_demand() -> None:
    """RS publisher -> gateway -> topic -> ndjson subscriber (window 100, no acks): the
    gateway asks the RS peer for nothing beyond its demand of 8, however long it waits;
    the subscriber's acks release more."""
    async with offered(destination="topic", demand=8) as (gw, peer, request):
        sid = request.subscriber
        async with await NdjsonClient.connect(*host_port(gw.addresses["nd"][0])) as nd:
            await nd.subscribe("topic")
            await subscribed(gw, "topic")
            await peer.send(Subscribed(sid, 0), *(OnNext(sid, b"%d" % i) for i in range(8)))
            got = [await nd.receive() for _ in range(8)]
            assert [d.body for d in got] == [b"%d" % i for i in range(8)]
            assert await peer.quiet() == []  # unsettled: no demand at all
            await nd.ack(*(d.tag for d in got))
            total = 0
            with trio.fail_after(GUARD):
                while total < 8:
                    event = await peer.event()
                    assert isinstance(event, DemandAdded), event
                    total += event.demand
            assert await peer.quiet() == []


async def test_over_demand_is_a_protocol_error() -> None:
    async with offered(destination="topic", demand=1) as (gw, peer, request):
        local = gw.hub.subscribe("topic")  # never acks: nothing settles
        sid = request.subscriber
        await peer.send(Subscribed(sid, 0), OnNext(sid, b"ok"))
        assert await take(local, 1, ack=False) == [b"ok"]
        await peer.stream.send_all(_raw(OnNext(sid, b"too many")))
        events = await until_closed(peer)
        goodbye = next(e for e in events if isinstance(e, GoodbyeReceived))
        assert goodbye.reason.startswith("protocol-error:")


def _raw(message: Any) -> bytes:
    from protocols.reactive.messages import encode

    return encode(message)


async def test_a_rejected_element_cancels_with_a_logged_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with offered(destination="fixed4", demand=4) as (_gw, peer, request):
        sid = request.subscriber
        await peer.send(Subscribed(sid, 0), OnNext(sid, b"good"), OnNext(sid, b"wrong!"))
        # One publish for the read: rejected as a whole, so nothing is requested again.
        assert await peer.event() == Cancelled(sid)
        # Sent after the cancel crossed: parsed and dropped, the connection goes on.
        await peer.stream.send_all(_raw(OnNext(sid, b"late")))
        assert await peer.quiet() == []
    assert "takes elements of exactly 4 bytes, not 6" in caplog.text
    assert "subscription cancelled" in caplog.text


async def test_the_peer_ending_the_stream_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with offered() as (_gw, peer, request):
        await peer.send(OnError(request.subscriber, "no publisher 'in'"))
        assert await peer.quiet() == []
    assert "no publisher 'in'" in caplog.text


async def test_both_roles_on_one_listener_connection() -> None:
    async with offered(demand=2) as (gw, peer, request):
        sid = request.subscriber
        await peer.send(Subscribed(sid, 0), OnComplete(sid))
        await gw.hub.publish([Message("logs", b"stored")])
        await peer.send(Subscribe("logs?from=earliest", 1, 10))
        assert await peer.event() == Accepted(1, 0)
        assert await peer.elements(1, 1) == [b"stored"]


# -- the upstream --------------------------------------------------------------------------
class Remote:
    """The remote end of a reactive upstream: a server codec on an accepted socket."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.codec = Connection(Role.SERVER)

    async def send(self, *messages: Any) -> None:
        await self.stream.send_all(b"".join(self.codec.send(x) for x in messages))

    event = Peer.event
    quiet = Peer.quiet
    elements = Peer.elements


@asynccontextmanager
async def upstream(**options: Any) -> AsyncIterator[tuple[Gateway, Remote]]:
    """A gateway with a reactive upstream to a socket of ours; the accepted peer after
    its hello."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    data = {
        "gateway": {"drain_timeout": "1s"},
        "upstreams": [
            {
                "name": "far",
                "protocol": "reactive",
                "connect": f"127.0.0.1:{port}",
                "destination": "from-far",
                **options,
            }
        ],
        "routes": [{"from": "out", "to": ["upstream:far"]}],
        "destinations": [{"name": "from-far", "retain": "1MiB"}, {"name": "out"}],
    }
    async with running_gateway(data, registry=REGISTRY) as gw:
        with trio.fail_after(GUARD):
            stream = await listeners[0].accept()
        async with stream:
            remote = Remote(stream)
            await stream.send_all(remote.codec.hello())
            assert isinstance(await remote.event(), Hello)
            yield gw, remote
    await listeners[0].aclose()


async def test_the_upstream_subscribes_right_after_its_hello() -> None:
    subs = [{"publisher": "a?from=earliest", "demand": 2}, {"publisher": "b"}]
    async with upstream(subscriptions=subs) as (gw, remote):
        first, second = await remote.event(), await remote.event()
        assert (first.publisher, first.initial_demand) == ("a?from=earliest", 2)
        assert (second.publisher, second.initial_demand) == ("b", 256)
        assert first.subscriber != second.subscriber
        sid = first.subscriber
        await remote.send(Subscribed(sid, 0), OnNext(sid, b"x"), OnNext(sid, b"y"))
        sub = gw.hub.subscribe("from-far", start="earliest")
        assert await take(sub, 2) == [b"x", b"y"]
        assert isinstance(await remote.event(), DemandAdded)


async def test_the_peer_subscribes_to_what_routes_send_the_upstream() -> None:
    async with upstream() as (gw, remote):
        await remote.send(Subscribe("far", 1, 2))
        assert await remote.event() == Accepted(1, 0)
        receipt = await gw.hub.publish([Message("out", b"%d" % i) for i in range(3)])
        assert await remote.elements(1, 2) == [b"0", b"1"]
        assert await remote.quiet() == []  # demand 2
        await remote.send(Request(1, 5))
        assert await remote.elements(1, 1) == [b"2"]
        with trio.fail_after(GUARD):
            await receipt.wait()
        assert receipt.outcome.name == "DELIVERED"


async def test_any_other_publisher_name_gets_on_error() -> None:
    async with upstream(publisher="egress") as (_gw, remote):
        await remote.send(Subscribe("far", 1, 1))
        event = await remote.event()
        assert not isinstance(event, Accepted | Elements)
        assert "no publisher 'far'" in event.error
        await remote.send(Subscribe("egress", 2, 1))
        assert await remote.event() == Accepted(2, 0)


async def test_a_cancelled_egress_stream_hands_its_messages_back() -> None:
    async with upstream() as (gw, remote):
        await remote.send(Subscribe("far", 1, 1))
        assert await remote.event() == Accepted(1, 0)
        await gw.hub.publish([Message("out", b"m")])
        assert await remote.elements(1, 1) == [b"m"]
        await remote.send(Cancel(1), Subscribe("far", 2, 1))
        assert await remote.event() == Accepted(2, 0)
        assert await remote.elements(2, 1) == [b"m"]  # not processed: sent again
