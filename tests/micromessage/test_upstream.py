"""The Micromessage2 upstream (:class:`~protocols.micromessage.client.ClientSession`): the
gateway as a client of a Micromessage2 server.

A small fake server, a :class:`ServerCodec` driven by hand over an in-memory
stream, answers the handshake, acks (or not), and delivers to the gateway's
subscriptions; the session runs in-process against a hub, as the plugin's
``run_upstream`` wires it (an egress subscription of the upstream's queue per
connection), under trio's :class:`~trio.testing.MockClock`. One last test runs
the real upstream in a gateway against the fake server on a loopback socket,
for what only the runtime does: reconnecting.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing
from harness import running_gateway

from gateway.config.loader import parse
from gateway.core.facade import HubFacade
from gateway.core.hub import Hub
from gateway.core.routing import Router
from gateway.core.topic import TopicLimits
from gateway.runtime.catalog import Catalog
from gateway.sdk import (
    NEED_DATA,
    ConnectionClosed,
    Delivery,
    Message,
    Receipt,
    RemoteProtocolError,
    Source,
)
from protocols.micromessage.client import ClientSession, RemoteSubscription
from protocols.micromessage.codec import Limits, ServerCodec
from protocols.micromessage.commands import Subscribe
from protocols.micromessage.events import Ack, Error, Established, Messages, Offered
from protocols.micromessage.events import Message as Frame
from protocols.micromessage.plugin import client_settings, server_settings

EXPIRE = 0.5  # the upstream's ack_expire (s)
GUARD = 30.0  # mock seconds any expected event may take
HANDSHAKE = 3.0  # the in-process upstream's handshake_timeout (s)
UPSTREAM = "upstream:hq"


class FakeServer:
    """A Micromessage2 server played by hand: a ServerCodec over one stream."""

    def __init__(self, stream: trio.abc.Stream, *, max_window: int = 1000) -> None:
        self.stream = stream
        opts = {"identity": "fake", "ack_expire": EXPIRE, "max_window": max_window, "require": []}
        self.codec = ServerCodec(server_settings(opts), clock=trio.current_time)
        self.events: list[Any] = []
        self.raw = bytearray()  # every byte received after the handshake
        self.wire = b""  # the bytes of our last delivery
        self.closed = False
        self.stopped = trio.Event()  # set by stop(): whoever serves the stream closes it
        #: In-process: the client session's end, and the error it ended with.
        self.session_ended = trio.Event()
        self.ended_by: BaseException | None = None

    async def _read(self) -> bool:
        try:
            data = await self.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if self.codec.negotiated is not None:
            self.raw += data
        self.codec.receive_data(data)
        while (e := self.codec.next_event()) is not NEED_DATA:
            if isinstance(e, Offered):
                await self.stream.send_all(self.codec.send(e.answer))
            elif isinstance(e, ConnectionClosed):
                self.closed = True
                return False
            else:
                self.events.append(e)
        return bool(data)

    def stop(self) -> None:
        self.stopped.set()

    async def until(self, done: Any, seconds: float = GUARD) -> None:
        with trio.fail_after(seconds):
            while not done():
                if not await self._read() and not done():
                    raise EOFError(f"closed; events {self.events[-5:]}")

    async def handshake(self) -> None:
        await self.until(lambda: any(isinstance(e, Established) for e in self.events))

    def take(self, kind: type) -> list[Any]:
        got = [e for e in self.events if isinstance(e, kind)]
        self.events = [e for e in self.events if not isinstance(e, kind)]
        return got

    async def frames(self, n: int, seconds: float = GUARD) -> list[Frame]:
        """The next ``n`` MESSAGE frames the gateway sent (not acked)."""
        out: list[Frame] = []

        def have() -> bool:
            out.extend(f for batch in self.take(Messages) for f in batch.frames)
            return len(out) >= n

        await self.until(have, seconds)
        return out

    async def pump(self, seconds: float) -> None:
        with trio.move_on_after(seconds):
            while await self._read():
                pass

    async def quiet(self, seconds: float) -> list[Frame]:
        """MESSAGE frames arriving within ``seconds`` (mock time)."""
        await self.pump(seconds)
        return [f for batch in self.take(Messages) for f in batch.frames]

    async def acks(self, seconds: float) -> list[int]:
        """The seqs the gateway acked within ``seconds``."""
        await self.pump(seconds)
        return [a.seq for a in self.take(Ack)]

    async def ack(self, seq: int) -> None:
        await self.stream.send_all(self.codec.send(Ack(seq)))

    async def deliver(self, destination: str, *bodies: bytes) -> list[int]:
        """MESSAGE frames from ``destination`` in one write; their seqs."""
        frames, seq = [], self.codec.next_seq
        for body in bodies:
            frames.append(Frame(seq, destination, "", body))
            seq = seq % 65535 + 1
        self.wire = self.codec.send_messages(frames)
        await self.stream.send_all(self.wire)
        return [f.seq for f in frames]


# -- the in-process rig ------------------------------------------------------------------------


@dataclass
class Rig:
    hub: Hub
    nursery: trio.Nursery

    async def connect(
        self,
        *,
        window: int = 100,
        max_window: int = 1000,
        subscriptions: Sequence[RemoteSubscription] = (),
        handshake: bool = True,
    ) -> FakeServer:
        """A connection of the upstream to a fresh fake server, its handshake done (unless
        ``handshake`` is False: then the server has read nothing yet)."""
        near, far = trio.testing.memory_stream_pair()
        server = FakeServer(far, max_window=max_window)
        opts = {"identity": "gw", "ack_expire": EXPIRE, "window": window}
        settings = client_settings(opts, bool(subscriptions))

        async def session() -> None:
            # As MicromessagePlugin.run_upstream: one egress subscription per connection.
            with self.hub.subscribe(UPSTREAM, max_unacked=window) as egress:
                try:
                    await ClientSession(
                        near,
                        HubFacade(self.hub),
                        lambda: Source("micromessage", "", upstream="hq"),
                        settings=settings,
                        limits=Limits(),
                        egress=egress,
                        subscriptions=subscriptions,
                        log=logging.getLogger("test.upstream"),
                        handshake_timeout=HANDSHAKE,
                    ).run()
                except* (trio.BrokenResourceError, RemoteProtocolError, trio.TooSlowError) as eg:
                    # The server went away, broke the protocol or was too slow: the
                    # runtime logs it and reconnects.
                    server.ended_by = eg.exceptions[0]
                finally:
                    server.session_ended.set()
                    await trio.aclose_forcefully(near)

        self.nursery.start_soon(session)
        if handshake:
            await server.handshake()
        return server


@asynccontextmanager
async def rig(*destinations: dict[str, Any]) -> AsyncIterator[Rig]:
    config = parse(
        {
            "destinations": list(destinations),
            "upstreams": [{"name": "hq", "protocol": "micromessage", "connect": "x:1"}],
        },
        source="<t>",
    )
    limits = config.gateway.limits
    catalog = Catalog(
        config.destinations, TopicLimits(limits.buffer_bytes, limits.buffer_messages, None)
    )
    hub = Hub(Router(config.routes), limits, providers=[catalog], upstreams=["hq"])
    async with trio.open_nursery() as nursery:
        yield Rig(hub, nursery)
        nursery.cancel_scope.cancel()


async def publish_each(hub: Any, destination: str, bodies: Sequence[bytes]) -> list[Receipt]:
    """One publish per body, so each has a receipt of its own."""
    return [await hub.publish([Message(destination, b)]) for b in bodies]


async def eventually(condition: Any) -> None:
    """Wait (mock time) until ``condition()`` holds."""
    with trio.fail_after(GUARD):
        while not condition():
            await trio.sleep(0.001)


def settled(receipts: Sequence[Receipt]) -> list[bool]:
    return [r.done() for r in receipts]


def bodies(frames: Sequence[Frame]) -> list[bytes]:
    return [f.payload for f in frames]


async def take(sub: Any, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    with trio.fail_after(GUARD):
        while len(got) < n:
            got += await sub.receive(n - len(got))
    return got


# -- egress ----------------------------------------------------------------------------------


async def test_egress_sends_within_the_window_and_acks_the_hub_on_the_servers_ack(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        server = await r.connect(window=5)
        receipts = await publish_each(r.hub, UPSTREAM, [b"m%d" % i for i in range(12)])
        got = await server.frames(5)
        assert [f.seq for f in got] == [1, 2, 3, 4, 5]
        assert bodies(got) == [b"m%d" % i for i in range(5)]
        assert await server.quiet(EXPIRE / 2) == []  # the window is full
        assert not any(settled(receipts))  # nothing acked to the hub yet
        await server.ack(3)
        more = await server.frames(3)
        assert [f.seq for f in more] == [6, 7, 8]  # room for three more
        assert settled(receipts) == [True] * 3 + [False] * 9
        await server.ack(8)
        await server.frames(4)
        assert settled(receipts) == [True] * 8 + [False] * 4


async def test_egress_resends_what_the_server_did_not_ack_after_the_expiry(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        server = await r.connect(window=5)
        await publish_each(r.hub, UPSTREAM, [b"a", b"b"])
        await server.frames(2)
        sent_at, first = trio.current_time(), bytes(server.raw)
        await server.until(lambda: len(server.raw) >= 2 * len(first))
        assert trio.current_time() - sent_at == pytest.approx(EXPIRE)
        assert bytes(server.raw) == first * 2  # same bytes, same seqs
        await server.ack(2)
        await server.pump(EXPIRE * 4)
        assert len(server.raw) == 2 * len(first)


async def test_egress_sends_again_what_was_unacked_when_the_connection_was_lost(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        server = await r.connect(window=4)
        receipts = await publish_each(r.hub, UPSTREAM, [b"m%d" % i for i in range(6)])
        await server.frames(4)
        await server.ack(2)
        await eventually(lambda: settled(receipts)[:2] == [True, True])
        await server.stream.aclose()  # the server goes away with m2 and m3 unacked
        await trio.testing.wait_all_tasks_blocked()
        again = await r.connect(window=4)  # what the runtime does: connect again
        got = await again.frames(4)
        assert bodies(got) == [b"m2", b"m3", b"m4", b"m5"]  # at least once, in order
        assert [f.seq for f in got] == [1, 2, 3, 4]  # a new connection counts from 1
        await again.ack(4)
        await eventually(lambda: all(settled(receipts)))


async def test_egress_acks_settle_the_right_messages_across_the_wrap(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        server = await r.connect(window=32767, max_window=32767)
        sent = 0
        while sent < 65530:  # fill: the next seq is 65531
            n = min(8192, 65530 - sent)
            await r.hub.publish([Message(UPSTREAM, b"f")] * n)
            got = await server.frames(n)
            await server.ack(got[-1].seq)
            sent += n
        receipts = await publish_each(r.hub, UPSTREAM, [b"w%d" % i for i in range(10)])
        got = await server.frames(10)
        assert [f.seq for f in got] == [*range(65531, 65536), *range(1, 6)]
        assert bodies(got) == [b"w%d" % i for i in range(10)]
        await server.ack(65535)
        await eventually(lambda: settled(receipts) == [True] * 5 + [False] * 5)
        await server.ack(2)  # cumulative across the wrap
        await eventually(lambda: settled(receipts) == [True] * 7 + [False] * 3)
        await server.ack(5)
        await eventually(lambda: all(settled(receipts)))


async def test_an_ack_for_nothing_outstanding_is_ignored(autojump_clock: Any) -> None:
    async with rig() as r:
        server = await r.connect(window=5)
        receipts = await publish_each(r.hub, UPSTREAM, [b"a", b"b"])
        await server.frames(2)
        await server.ack(40)  # never sent
        await server.pump(EXPIRE / 10)
        assert not any(settled(receipts))
        assert not server.session_ended.is_set()
        await server.ack(2)
        await eventually(lambda: all(settled(receipts)))


async def test_no_answer_within_the_handshake_timeout_ends_the_connection(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        server = await r.connect(handshake=False)
        start = trio.current_time()
        with trio.fail_after(GUARD):
            await server.session_ended.wait()
        assert trio.current_time() - start == pytest.approx(HANDSHAKE)
        assert isinstance(server.ended_by, trio.TooSlowError)


async def test_egress_and_ingress_share_the_connection_with_a_window_each_way(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        reader = r.hub.subscribe("local", "reader")
        server = await r.connect(window=3, subscriptions=[RemoteSubscription("alerts", "local")])
        receipts = await publish_each(r.hub, UPSTREAM, [b"out%d" % i for i in range(5)])
        await server.deliver("alerts", b"in0", b"in1", b"in2")
        assert bodies(await server.frames(3)) == [b"out0", b"out1", b"out2"]
        got = await take(reader, 3)
        reader.ack_many(d.tag for d in got)
        assert await server.acks(EXPIRE / 10) == [3]  # ingress acked; egress still full
        assert await server.quiet(EXPIRE / 10) == []
        await server.ack(3)
        assert bodies(await server.frames(2)) == [b"out3", b"out4"]
        assert settled(receipts) == [True] * 3 + [False] * 2


# -- ingress ---------------------------------------------------------------------------------


async def test_ingress_publishes_locally_and_acks_only_after_the_local_receipt(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        reader = r.hub.subscribe("local", "reader")  # a topic: settles when it acks
        sub = RemoteSubscription("alerts", "local", filter="severity>=N3")
        server = await r.connect(subscriptions=[sub])
        await server.until(lambda: any(isinstance(e, Subscribe) for e in server.events))
        assert server.take(Subscribe) == [Subscribe("alerts", "severity>=N3")]
        await server.deliver("alerts", b"one", b"two")
        got = await take(reader, 2)
        assert [(d.message.destination, d.message.body) for d in got] == [
            ("local", b"one"),
            ("local", b"two"),
        ]
        assert got[0].message.source is not None
        assert got[0].message.source.upstream == "hq"
        assert await server.acks(EXPIRE / 10) == []  # not before the local receipt
        reader.ack_many(d.tag for d in got)
        assert await server.acks(EXPIRE / 10) == [2]


async def test_ingress_into_a_full_local_queue_leaves_the_server_unacked(
    autojump_clock: Any,
) -> None:
    async with rig({"name": "local", "kind": "queue", "buffer_messages": 2}) as r:
        server = await r.connect(subscriptions=[RemoteSubscription("alerts", "local")])
        await server.deliver("alerts", b"a", b"b")
        assert await server.acks(EXPIRE / 10) == []  # a queue settles once consumed
        await server.deliver("alerts", b"c", b"d")  # the queue is full: publishing waits
        assert await server.acks(EXPIRE * 3) == []  # backpressure: the server sees no ack
        consumer = r.hub.subscribe("local")
        first = await take(consumer, 2)
        consumer.ack_many(d.tag for d in first)
        rest = await take(consumer, 2)
        assert [d.message.body for d in first + rest] == [b"a", b"b", b"c", b"d"]
        assert await server.acks(EXPIRE / 10) == [2]  # the first batch, once consumed
        consumer.ack_many(d.tag for d in rest)
        assert await server.acks(EXPIRE / 10) == [4]


async def test_ingress_a_message_the_local_destination_rejects_ends_the_connection(
    autojump_clock: Any,
) -> None:
    async with rig({"name": "local", "buffer_bytes": "4KiB"}) as r:
        server = await r.connect(subscriptions=[RemoteSubscription("alerts", "local")])
        await server.deliver("alerts", b"fine", b"x" * 8192)
        await server.pump(EXPIRE)
        errors = server.take(Error)
        assert len(errors) == 1
        assert errors[0].message.startswith("MESSAGE 2 rejected: ")
        assert server.take(Ack) == []  # the batch is not acked: the server keeps it
        assert server.closed
        assert server.session_ended.is_set()


async def test_the_upstream_requires_pubsub_when_it_subscribes(autojump_clock: Any) -> None:
    async with rig() as r:
        server = await r.connect(subscriptions=[RemoteSubscription("alerts", "local")])
        assert server.codec.has("pubsub")
        assert server.codec.negotiated is not None
        required = [e.name for e in server.codec.negotiated.agreement.extensions]
        assert required[:2] == ["batch-ack", "pubsub"]


async def test_ingress_from_a_destination_not_subscribed_is_a_protocol_error(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        server = await r.connect(subscriptions=[RemoteSubscription("alerts", "local")])
        await server.deliver("other", b"x")
        await server.pump(EXPIRE)
        errors = server.take(Error)
        assert len(errors) == 1
        assert "'other'" in errors[0].message
        assert server.closed
        assert await server.acks(0) == []


# -- the real upstream, reconnecting --------------------------------------------------------


async def test_the_upstream_reconnects_and_sends_again_what_was_unacked() -> None:
    """Real sockets and the real clock: the gateway's runtime reconnects."""
    connections: trio.MemorySendChannel[FakeServer]
    connections, accepted = trio.open_memory_channel[FakeServer](4)

    async def handler(stream: trio.SocketStream) -> None:
        server = FakeServer(stream)
        await connections.send(server)
        await server.stopped.wait()
        await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1")
        (listener,) = await nursery.start(serve)
        port = listener.socket.getsockname()[1]
        upstream = {
            "name": "hq",
            "protocol": "micromessage",
            "connect": f"127.0.0.1:{port}",
            "backoff_initial": "20ms",
            "window": 4,
        }
        config = {
            "gateway": {"drain_timeout": "200ms"},
            "upstreams": [upstream],
            "routes": [{"from": "orders", "to": ["upstream:hq"]}],
        }
        async with running_gateway(config) as gw:
            with trio.fail_after(5):
                first = await accepted.receive()
                await first.handshake()
                receipts = await publish_each(gw.hub, "orders", [b"o%d" % i for i in range(6)])
                got = await first.frames(4)
                assert bodies(got) == [b"o0", b"o1", b"o2", b"o3"]
                await first.ack(2)
                await eventually(lambda: settled(receipts)[:2] == [True, True])
                first.stop()  # the server goes away: o2 and o3 unacked
                second = await accepted.receive()
                await second.handshake()
                again = await second.frames(4)
                assert bodies(again) == [b"o2", b"o3", b"o4", b"o5"]
                await second.ack(again[-1].seq)
                await eventually(lambda: all(settled(receipts)))
                second.stop()
        nursery.cancel_scope.cancel()


async def test_ingress_acks_a_resend_of_what_it_acked_again(autojump_clock: Any) -> None:
    async with rig({"name": "local", "retain": "1MiB"}) as r:
        server = await r.connect(subscriptions=[RemoteSubscription("alerts", "local")])
        await server.deliver("alerts", b"a", b"b")
        assert await server.acks(EXPIRE / 10) == [2]
        await server.stream.send_all(server.wire)  # as if the gateway's ack was lost
        assert set(await server.acks(EXPIRE / 10)) == {2}


async def test_ingress_drops_a_resend_of_what_it_acked(autojump_clock: Any) -> None:
    async with rig({"name": "local", "retain": "1MiB"}) as r:
        server = await r.connect(subscriptions=[RemoteSubscription("alerts", "local")])
        await server.deliver("alerts", b"a", b"b")
        assert await server.acks(EXPIRE / 10) == [2]
        await server.stream.send_all(server.wire)  # as if the gateway's ack was lost
        await server.pump(EXPIRE)
        assert not server.closed
        reader = r.hub.subscribe("local", "reader", start="earliest")
        assert [d.message.body for d in reader.take()] == [b"a", b"b"]  # published once
