"""The reactive-streams listener against an in-process gateway over real sockets, the
codec's client role as the peer.

Real sockets need the real clock, so every wait is guarded by a short
``trio.fail_after``; "nothing more arrives" is checked over a short real interval.
"""

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
from gateway.protocol.plugin import ConnectionInfo, ServerConnection
from gateway.runtime.catalog import Catalog
from gateway.runtime.gateway import Gateway
from gateway.sdk import NEED_DATA, ConnectionClosed
from protocols.reactive import (
    MAX_DEMAND,
    Accepted,
    Cancel,
    Completed,
    Connection,
    Elements,
    Failed,
    Goodbye,
    GoodbyeAnswered,
    GoodbyeReceived,
    Hello,
    Ping,
    Ponged,
    Request,
    Role,
    Subscribe,
)
from protocols.reactive.messages import encode
from protocols.reactive.plugin import ReactivePlugin

GUARD = 5.0  # seconds any one expected event may take
QUIET = 0.2  # seconds in which an unexpected event would have arrived


def config(**options: Any) -> dict[str, Any]:
    listener = {
        "name": "rs",
        "protocol": "reactive",
        "bind": "127.0.0.1:0",
        "destination": "logs",
        "publishers": ["logs", "fixed", "metrics/*"],
        **options,
    }
    return {
        "gateway": {"drain_timeout": "1s"},
        "listeners": [listener],
        "destinations": [
            {"name": "logs", "retain": "1MiB"},
            {"name": "hidden", "retain": "1MiB"},
            {"name": "fixed", "retain": "1MiB", "element_size": 4},
        ],
    }


class Peer:
    """A reactive-streams client over a socket: the codec plus reads with guards."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.codec = Connection(Role.CLIENT)

    async def send(self, *messages: Any) -> None:
        await self.stream.send_all(b"".join(self.codec.send(x) for x in messages))

    async def event(self, timeout: float = GUARD) -> Any:
        """The next event (ConnectionClosed once the gateway closed)."""
        with trio.fail_after(timeout):
            while True:
                event = self.codec.next_event()
                if event is not NEED_DATA:
                    return event
                self.codec.receive_data(await self.stream.receive_some(65536))

    async def quiet(self) -> list[Any]:
        """Every event within :data:`QUIET`."""
        out: list[Any] = []
        with trio.move_on_after(QUIET):
            while True:
                out.append(await self.event())
        return out

    async def elements(self, sid: int, count: int) -> list[bytes]:
        """``count`` elements of ``sid``, nothing else arriving meanwhile."""
        got: list[bytes] = []
        while len(got) < count:
            event = await self.event()
            assert isinstance(event, Elements), event
            assert event.subscriber == sid
            got += event.elements
        return got


@asynccontextmanager
async def gateway(**options: Any) -> AsyncIterator[tuple[Gateway, Peer]]:
    async with running_gateway(config(**options), registry=registered(ReactivePlugin)) as gw:
        host, port = host_port(gw.addresses["rs"][0])
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            peer = Peer(stream)
            await stream.send_all(peer.codec.hello())
            assert isinstance(await peer.event(), Hello)
            yield gw, peer


async def publish(gw: Gateway, destination: str, *bodies: bytes) -> None:
    await gw.hub.publish([Message(destination, b) for b in bodies])


async def test_elements_within_demand_then_more_after_request() -> None:
    async with gateway() as (gw, peer):
        await publish(gw, "logs", *(b"m%d" % i for i in range(10)))
        await peer.send(Subscribe("logs?from=earliest", 1, 3))
        assert await peer.event() == Accepted(1, 0)
        assert await peer.elements(1, 3) == [b"m0", b"m1", b"m2"]
        assert await peer.quiet() == []  # never more than requested
        await peer.send(Request(1, 4))
        assert await peer.elements(1, 4) == [b"m3", b"m4", b"m5", b"m6"]
        assert await peer.quiet() == []
        await peer.send(Request(1, 100))
        assert await peer.elements(1, 3) == [b"m7", b"m8", b"m9"]
        await publish(gw, "logs", b"live")
        assert await peer.elements(1, 1) == [b"live"]


async def test_finite_read_completes() -> None:
    async with gateway() as (gw, peer):
        await publish(gw, "logs", b"a", b"b", b"c")
        await peer.send(Subscribe("logs?from=earliest&to=2", 7, 10))
        assert await peer.event() == Accepted(7, 0)
        assert await peer.elements(7, 2) == [b"a", b"b"]
        assert await peer.event() == Completed(7)


@pytest.mark.parametrize(
    ("publisher", "reason"),
    [
        ("hidden?from=earliest", "not exposed"),
        ("logs?frm=earliest", "unknown publisher query key"),
        ("logs?from=soon", "from must be"),
        ("", "no destination"),
    ],
)
async def test_refused_subscriptions_get_on_error(publisher: str, reason: str) -> None:
    async with gateway() as (gw, peer):
        await peer.send(Subscribe(publisher, 2, 5))
        event = await peer.event()
        assert isinstance(event, Failed)
        assert event.subscriber == 2
        assert reason in event.error
        # The connection goes on: a good subscription still works.
        await publish(gw, "logs", b"x")
        await peer.send(Subscribe("logs?from=earliest", 3, 5))
        assert await peer.event() == Accepted(3, 0)
        assert await peer.elements(3, 1) == [b"x"]


async def test_unexposed_name_is_not_created() -> None:
    async with gateway() as (gw, peer):
        await peer.send(Subscribe("nowhere", 1, 1))
        assert isinstance(await peer.event(), Failed)
        assert "nowhere" not in gw.hub.destinations()


async def test_cancel_stops_delivery() -> None:
    async with gateway() as (gw, peer):
        await peer.send(Subscribe("logs", 1, 100))
        assert await peer.event() == Accepted(1, 0)
        await publish(gw, "logs", b"one")
        assert await peer.elements(1, 1) == [b"one"]
        await peer.send(Cancel(1))
        await trio.sleep(QUIET)
        await publish(gw, "logs", b"two")
        assert await peer.quiet() == []


async def test_non_positive_request_gets_on_error() -> None:
    async with gateway() as (_gw, peer):
        await peer.send(Subscribe("logs", 1, 1))
        assert await peer.event() == Accepted(1, 0)
        await peer.stream.send_all(encode(Request(1, 0)))  # the client codec refuses it
        event = await peer.event()
        assert isinstance(event, Failed)
        assert "non-positive" in event.error


async def test_large_elements_arrive_whole_in_parts() -> None:
    big = bytes(range(256)) * 20  # 5120 bytes, above a part_size of 1024
    async with gateway(part_size=1024) as (gw, peer):
        await publish(gw, "logs", b"small", big, b"tail")
        await peer.send(Subscribe("logs?from=earliest", 1, 3))
        assert await peer.event() == Accepted(1, 0)
        assert await peer.elements(1, 3) == [b"small", big, b"tail"]


async def test_fixed_size_elements_are_packed_with_their_size() -> None:
    async with gateway(part_size=1024) as (gw, peer):
        bodies = [b"%04d" % i for i in range(600)]  # more than one part_size of them
        await publish(gw, "fixed", *bodies)
        await peer.send(Subscribe("fixed?from=earliest", 1, 600))
        assert await peer.event() == Accepted(1, 4)
        assert await peer.elements(1, 600) == bodies


async def test_ping_is_answered() -> None:
    async with gateway() as (_gw, peer):
        await peer.send(Ping(b"hi"))
        assert await peer.event() == Ponged(b"hi")


async def test_client_goodbye_is_answered_and_the_connection_closes() -> None:
    async with gateway() as (_gw, peer):
        await peer.send(Goodbye("done"))
        assert isinstance(await peer.event(), GoodbyeAnswered | GoodbyeReceived)
        assert isinstance(await peer.event(), ConnectionClosed)


@pytest.mark.parametrize("ack", ["written", "demand"])
async def test_gateway_says_goodbye_when_it_drains(ack: str) -> None:
    async with gateway(ack=ack) as (gw, peer):
        await peer.send(Subscribe("logs", 1, 5))
        assert await peer.event() == Accepted(1, 0)
        await publish(gw, "logs", b"unprocessed")
        assert await peer.elements(1, 1) == [b"unprocessed"]
        gw.shutdown()
        event = await peer.event()
        assert isinstance(event, GoodbyeReceived)
        assert "shutting down" in event.reason
        assert isinstance(await peer.event(), Failed)  # our subscription ended with it
        await peer.send(Goodbye("bye"))
        # At once, not after the drain timeout: nothing more can be acked.
        assert isinstance(await peer.event(timeout=0.5), ConnectionClosed)


async def test_protocol_error_gets_goodbye_protocol_error() -> None:
    async with gateway() as (_gw, peer):
        await peer.stream.send_all(b"\x92\x00\x00")  # a second hello
        event = await peer.event()
        assert isinstance(event, GoodbyeReceived)
        assert event.reason.startswith("protocol-error:")


@asynccontextmanager
async def connected(gw: Gateway) -> AsyncIterator[Peer]:
    """Another peer of the same gateway, past the hellos."""
    host, port = host_port(gw.addresses["rs"][0])
    async with await trio.open_tcp_stream(host, port) as stream:
        peer = Peer(stream)
        await stream.send_all(peer.codec.hello())
        assert isinstance(await peer.event(), Hello)
        yield peer


async def reconnect_to_group(ack: str) -> list[bytes]:
    """A group member takes two elements, requests one more, and leaves; what the next
    member of the group gets."""
    async with gateway(ack=ack) as (gw, peer):
        await publish(gw, "logs", b"a", b"b", b"c")
        await peer.send(Subscribe("logs?group=g&from=earliest", 1, 2))
        assert await peer.event() == Accepted(1, 0)
        assert await peer.elements(1, 2) == [b"a", b"b"]
        await peer.send(Request(1, 1))  # "a" processed
        assert await peer.elements(1, 1) == [b"c"]
        await peer.stream.aclose()
        async with connected(gw) as again:
            await again.send(Subscribe("logs?group=g", 1, 10))
            assert await again.event() == Accepted(1, 0)
            return [e for event in await again.quiet() for e in event.elements]


async def test_ack_demand_redelivers_what_the_peer_had_not_processed() -> None:
    assert await reconnect_to_group("demand") == [b"b", b"c"]


async def test_ack_written_is_at_most_once() -> None:
    assert await reconnect_to_group("written") == []


async def test_no_hello_within_the_handshake_timeout_closes(autojump_clock: Any) -> None:
    parsed = parse(
        config(handshake_timeout="3s"), source="<t>", registry=registered(ReactivePlugin)
    )
    limits = parsed.gateway.limits
    catalog = Catalog(
        parsed.destinations, TopicLimits(limits.buffer_bytes, limits.buffer_messages, None)
    )
    hub = Hub(Router(parsed.routes), limits, providers=[catalog])
    near, far = trio.testing.memory_stream_pair()
    info = ConnectionInfo("reactive", "rs", "silent")
    conn = ServerConnection(far, info, parsed.listeners[0], HubFacade(hub), trio.Event())

    async def serve() -> None:  # as the runtime does: close once served
        async with far:
            await ReactivePlugin().serve(conn)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        peer = Peer(near)
        start = trio.current_time()
        assert isinstance(await peer.event(timeout=60), Hello)  # the server's, at once
        assert trio.current_time() == start
        assert isinstance(await peer.event(timeout=60), ConnectionClosed)
        assert trio.current_time() - start == pytest.approx(3.0)


def test_the_embedded_default_exposes_its_queue_and_the_alerts_and_takes_logs() -> None:
    listener = ReactivePlugin.default_listener()
    assert listener["publishers"] == [listener["destination"], "alerts"]
    assert listener["subscriptions"] == [{"publisher": listener["destination"]}]
    assert ReactivePlugin.listener_options["publishers"].default == []
    assert ReactivePlugin.listener_options["subscriptions"].default == []


async def test_a_subscription_the_hub_refuses_gets_on_error() -> None:
    async with gateway() as (_gw, peer):
        await peer.send(Subscribe("metrics/cpu?from=earliest", 4, 1))  # a topic: no log
        event = await peer.event()
        assert isinstance(event, Failed)
        assert event.subscriber == 4


async def test_ack_demand_with_unbounded_demand_acks_as_sent() -> None:
    async with gateway(ack="demand", max_unacked=2) as (gw, peer):
        await publish(gw, "logs", *(b"%d" % i for i in range(5)))
        await peer.send(Subscribe("logs?from=earliest", 1, MAX_DEMAND))
        assert await peer.event() == Accepted(1, 0)
        assert await peer.elements(1, 5) == [b"0", b"1", b"2", b"3", b"4"]


async def test_ack_demand_window_moves_with_requests() -> None:
    async with gateway(ack="demand", max_unacked=2) as (gw, peer):
        await publish(gw, "logs", *(b"%d" % i for i in range(4)))
        await peer.send(Subscribe("logs?from=earliest", 1, 2))
        assert await peer.event() == Accepted(1, 0)
        assert await peer.elements(1, 2) == [b"0", b"1"]
        await peer.send(Request(1, 2))  # both processed: acked, room for two more
        assert await peer.elements(1, 2) == [b"2", b"3"]


async def test_filter_and_percent_encoding_in_the_publisher_string() -> None:
    async with gateway() as (gw, peer):
        await gw.hub.publish(
            [Message("logs", b"%d" % i, {"level": lvl}) for i, lvl in enumerate("ewew")]
        )
        await peer.send(Subscribe("logs?from=earliest&filter=%7B%22level%22%3A%22e%22%7D", 1, 9))
        assert await peer.event() == Accepted(1, 0)
        assert await peer.elements(1, 2) == [b"0", b"2"]
        assert await peer.quiet() == []


async def test_streams_of_one_connection_have_their_own_demand() -> None:
    async with gateway() as (gw, peer):
        await publish(gw, "logs", b"a", b"b", b"c")
        await peer.send(
            Subscribe("logs?from=earliest", 1, 1), Subscribe("logs?from=earliest", 2, 3)
        )
        events = await peer.quiet()
        assert [e for e in events if isinstance(e, Accepted)] == [Accepted(1, 0), Accepted(2, 0)]
        got: dict[int, list[bytes]] = {1: [], 2: []}
        for event in events:
            if isinstance(event, Elements):
                got[event.subscriber] += event.elements
        assert got == {1: [b"a"], 2: [b"a", b"b", b"c"]}


async def test_a_subscription_closed_under_the_stream_ends_it_with_on_error() -> None:
    async with gateway() as (gw, peer):
        await peer.send(Subscribe("metrics/cpu", 1, 5))
        assert await peer.event() == Accepted(1, 0)
        gw.hub.destinations()["metrics/cpu"].close()  # as when the hub closes
        event = await peer.event()
        assert isinstance(event, Failed)
        assert "closed" in event.error


async def test_cancel_hands_unprocessed_elements_back_to_the_group() -> None:
    async with gateway(ack="demand") as (gw, peer):
        await publish(gw, "logs", b"a", b"b")
        await peer.send(Subscribe("logs?group=g&from=earliest", 1, 2))
        assert await peer.event() == Accepted(1, 0)
        assert await peer.elements(1, 2) == [b"a", b"b"]
        await peer.send(Cancel(1), Subscribe("logs?group=g", 2, 5))
        assert await peer.event() == Accepted(2, 0)
        assert await peer.elements(2, 2) == [b"a", b"b"]


async def test_a_subscribe_pipelined_after_the_hello_is_served() -> None:
    async with running_gateway(config(), registry=registered(ReactivePlugin)) as gw:
        await publish(gw, "logs", b"early")
        host, port = host_port(gw.addresses["rs"][0])
        async with await trio.open_tcp_stream(host, port) as stream:
            peer = Peer(stream)
            hello = peer.codec.hello()
            await stream.send_all(hello + peer.codec.send(Subscribe("logs?from=earliest", 1, 1)))
            assert isinstance(await peer.event(), Hello)
            assert await peer.event() == Accepted(1, 0)
            assert await peer.elements(1, 1) == [b"early"]
