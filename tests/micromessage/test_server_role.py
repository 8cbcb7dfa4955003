"""The Micromessage2 listener's session (:class:`~protocols.micromessage.server.ServerSession`)
in its server role, driven in-process against a raw :class:`ClientCodec`.

Each test builds a hub from a config's destinations, serves one
:class:`ServerSession` per in-memory stream pair, and plays the client with
the codec by hand (acks, resends and subscriptions are all explicit), under
trio's :class:`~trio.testing.MockClock` (``autojump_clock``): the expiry and
resend times are exact, and "nothing arrives" is checked over mock seconds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing

from gateway.config.loader import parse
from gateway.core.facade import HubFacade
from gateway.core.hub import Hub
from gateway.core.routing import Router
from gateway.core.topic import TopicLimits
from gateway.protocol.plugin import ConnectionInfo, ListenerSettings, ServerConnection
from gateway.runtime.catalog import Catalog
from gateway.sdk import NEED_DATA, ConnectionClosed, Delivery, Message, Receipt, Subscription
from protocols.micromessage.codec import ClientCodec
from protocols.micromessage.commands import Subscribe, Unsubscribe, encode_command
from protocols.micromessage.events import (
    SEQUENCE,
    Ack,
    Answered,
    Command,
    Duplicate,
    Error,
    Established,
    Extension,
    Messages,
)
from protocols.micromessage.events import Message as Frame
from protocols.micromessage.frames import FrameDecoder, encode_frame
from protocols.micromessage.handshake import (
    ExtensionSpec,
    Handshake,
    decode_handshake,
    encode_handshake,
)
from protocols.micromessage.plugin import MicromessagePlugin, client_settings

EXPIRE = 0.5  # the listener's ack_expire (s): what the client below asks for too
GUARD = 30.0  # mock seconds any expected event may take


# -- the rig: a hub, a listener, sessions on memory streams ------------------------------------


def listener(**options: Any) -> dict[str, Any]:
    base = {"name": "mm", "protocol": "micromessage", "bind": "127.0.0.1:0", "destination": "logs"}
    return base | options


@dataclass
class Rig:
    """A hub built from a config's destinations, and the listener's settings."""

    hub: Hub
    settings: ListenerSettings
    nursery: trio.Nursery
    shutdown: trio.Event = field(default_factory=trio.Event)
    served: int = 0

    async def connect(
        self,
        *,
        window: int = 100,
        subscribes: bool = True,
        expire: float = EXPIRE,
    ) -> Peer:
        """A client connection, its handshake done (``window``: the max-count asked,
        ``expire``: the expire-ms asked, in seconds)."""
        near, far = trio.testing.memory_stream_pair()
        self.served += 1
        info = ConnectionInfo("micromessage", "mm", f"peer{self.served}")
        conn = ServerConnection(far, info, self.settings, HubFacade(self.hub), self.shutdown)
        peer = Peer(near, window=window, subscribes=subscribes, expire=expire)
        self.nursery.start_soon(peer.serve, conn)
        await peer.handshake()
        return peer


@asynccontextmanager
async def rig(*destinations: dict[str, Any], **options: Any) -> AsyncIterator[Rig]:
    """A hub with ``destinations`` and the listener with ``options``."""
    config = parse(
        {"listeners": [listener(**options)], "destinations": list(destinations)}, source="<t>"
    )
    limits = config.gateway.limits
    catalog = Catalog(
        config.destinations, TopicLimits(limits.buffer_bytes, limits.buffer_messages, None)
    )
    hub = Hub(Router(config.routes), limits, providers=[catalog])
    async with trio.open_nursery() as nursery:
        yield Rig(hub, config.listeners[0], nursery)
        nursery.cancel_scope.cancel()


class Peer:
    """The client end: a raw ClientCodec over a memory stream, driven by hand."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        window: int,
        subscribes: bool,
        expire: float = EXPIRE,
    ) -> None:
        self.stream = stream
        opts = {"identity": "cl", "ack_expire": expire, "window": window, "max_payload": 1 << 24}
        self.codec = ClientCodec(client_settings(opts, subscribes), clock=trio.current_time)
        self.events: list[Any] = []  # received and not yet taken, in order
        self.raw = bytearray()  # every byte received since the handshake
        self.wire = b""  # the bytes of our last publish
        self.ended = trio.Event()  # the server's session returned

    async def serve(self, conn: ServerConnection) -> None:
        """The listener's plugin serving ``conn`` (the server end of our stream). As in
        the runtime, a lost connection ends it quietly (the session logs what the
        peer's side ends it with); anything else fails the test."""
        try:
            await MicromessagePlugin().serve(conn)
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self.ended.set()
            await trio.aclose_forcefully(conn.stream)  # as the runtime does

    async def handshake(self) -> None:
        codec = self.codec
        await self.stream.send_all(codec.send(codec.offer))
        with trio.fail_after(GUARD):
            while codec.negotiated is None:
                codec.receive_data(await self.stream.receive_some(65536))
                while (e := codec.next_event()) is not NEED_DATA:
                    if isinstance(e, Answered):
                        await self.stream.send_all(codec.send(e.final))
                    else:
                        assert isinstance(e, Established), e

    async def send(self, *events: Any) -> None:
        await self.stream.send_all(b"".join(self.codec.send(e) for e in events))

    async def publish(self, destination: str, *bodies: bytes, properties: str = "") -> list[int]:
        """MESSAGE frames to ``destination`` in one write; their sequence numbers."""
        codec, seqs = self.codec, []
        frames: list[Frame] = []
        for body in bodies:
            seqs.append(codec.next_seq if not frames else SEQUENCE.after(frames[-1].seq))
            frames.append(Frame(seqs[-1], destination, properties, body))
        self.wire = codec.send_messages(frames)
        await self.stream.send_all(self.wire)
        return seqs

    async def resend_due(self) -> bytes:
        """What our codec says is due for a resend now, sent."""
        wire = self.codec.due()
        if wire:
            await self.stream.send_all(wire)
        return wire

    async def ack(self, seq: int) -> None:
        await self.send(Ack(seq))

    async def _read(self) -> bool:
        """One read into the codec; False once the server closed."""
        try:
            data = await self.stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        self.raw += data
        self.codec.receive_data(data)
        while (e := self.codec.next_event()) is not NEED_DATA:
            self.events.append(e)
            if isinstance(e, ConnectionClosed):
                return False
        return bool(data)

    async def pump(self, seconds: float) -> None:
        """Read whatever arrives for ``seconds`` (mock time)."""
        with trio.move_on_after(seconds):
            while await self._read():
                pass

    async def until(self, done: Any, seconds: float = GUARD) -> None:
        with trio.fail_after(seconds):
            while not done():
                if not await self._read() and not done():
                    raise EOFError(f"closed; events {self.events[-5:]}")

    def take(self, kind: type) -> list[Any]:
        """The received events of ``kind``, removed from :attr:`events`."""
        got = [e for e in self.events if isinstance(e, kind)]
        self.events = [e for e in self.events if not isinstance(e, kind)]
        return got

    async def frames(self, n: int, seconds: float = GUARD) -> list[Frame]:
        """The next ``n`` MESSAGE frames delivered to us (not acked)."""
        out: list[Frame] = []

        def have() -> bool:
            out.extend(f for batch in self.take(Messages) for f in batch.frames)
            return len(out) >= n

        await self.until(have, seconds)
        return out

    async def quiet(self, seconds: float) -> list[Frame]:
        """MESSAGE frames arriving within ``seconds`` (mock time)."""
        await self.pump(seconds)
        return [f for batch in self.take(Messages) for f in batch.frames]

    async def closed(self) -> list[Any]:
        """Everything until the server closes; its events."""
        with trio.fail_after(GUARD):
            while await self._read():
                pass
        await self.ended.wait()
        return self.events

    async def acks(self, n: int = 1) -> list[Ack]:
        got: list[Ack] = []

        def have() -> bool:
            got.extend(self.take(Ack))
            return len(got) >= n

        await self.until(have)
        return got


async def subscribe(peer: Peer, destination: str, **kwargs: Any) -> None:
    await peer.send(Subscribe(destination, **kwargs))
    await trio.testing.wait_all_tasks_blocked()


async def publish_local(hub: Hub, destination: str, bodies: Sequence[bytes]) -> Receipt:
    """A publish of another protocol, straight into the hub: one receipt for the batch."""
    return await hub.publish([Message(destination, b) for b in bodies])


async def take(sub: Subscription, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    with trio.fail_after(GUARD):
        while len(got) < n:
            got += await sub.receive(n - len(got))
    return got


def bodies(frames: Sequence[Frame]) -> list[bytes]:
    return [f.payload for f in frames]


# -- the gateway as sender: the window, expiry, resends ----------------------------------------


async def test_a_client_that_does_not_ack_gets_exactly_the_window(autojump_clock: Any) -> None:
    async with rig() as r:
        sub = await r.connect(window=5)
        await subscribe(sub, "news")
        await publish_local(r.hub, "news", [b"m%d" % i for i in range(12)])
        got = await sub.frames(5)
        assert [f.seq for f in got] == [1, 2, 3, 4, 5]
        # Nothing new while unacked: only resends of the same five (dropped by the codec).
        assert await sub.quiet(EXPIRE / 2) == []
        assert sub.take(Duplicate) == []
        await sub.ack(5)
        more = await sub.frames(5)
        assert [f.seq for f in more] == [6, 7, 8, 9, 10]
        assert bodies(got + more) == [b"m%d" % i for i in range(10)]


async def test_the_window_is_the_listeners_max_window_when_the_client_asks_more(
    autojump_clock: Any,
) -> None:
    async with rig(max_window=3) as r:
        sub = await r.connect(window=10)
        assert sub.codec.window_room == 3  # granted the lower
        await subscribe(sub, "news")
        await publish_local(r.hub, "news", [b"m%d" % i for i in range(5)])
        assert [f.seq for f in await sub.frames(3)] == [1, 2, 3]
        assert await sub.quiet(EXPIRE * 3) == []


async def test_a_publisher_overrunning_the_window_gets_an_error_frame(
    autojump_clock: Any,
) -> None:
    async with rig(max_window=2) as r:
        pub = await r.connect()
        frames = [encode_frame(Frame(seq, "news", "", b"x")) for seq in (1, 2, 3)]
        await pub.stream.send_all(b"".join(frames))  # three, past the codec's window
        events = await pub.closed()
        errors = [e for e in events if isinstance(e, Error)]
        assert len(errors) == 1
        assert "window" in errors[0].message


async def test_unacked_frames_are_resent_after_the_expiry_then_no_more_once_acked(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        sub = await r.connect(window=3)
        await subscribe(sub, "news")
        await publish_local(r.hub, "news", [b"a", b"b", b"c"])
        got = await sub.frames(3)
        sent_at = trio.current_time()
        first = bytes(sub.raw)
        # Nothing before the expiry; then the same bytes, the same sequence numbers.
        await sub.pump(EXPIRE * 0.99)
        assert bytes(sub.raw) == first
        await sub.until(lambda: len(sub.raw) >= 2 * len(first))
        assert trio.current_time() - sent_at == pytest.approx(EXPIRE)
        assert bytes(sub.raw) == first * 2
        assert [f.seq for f in got] == [1, 2, 3]
        assert await sub.quiet(0) == []  # the codec dropped the resends (their ack is ours)
        # Acked: no resend however long we wait.
        await sub.ack(3)
        await sub.pump(EXPIRE * 10)
        assert len(sub.raw) == 2 * len(first)


async def test_resends_follow_the_expiry_the_client_asked_for(autojump_clock: Any) -> None:
    async with rig() as r:
        sub = await r.connect(window=3, expire=2.0)  # the listener's own is 0.5 s
        await subscribe(sub, "news")
        await publish_local(r.hub, "news", [b"a"])
        await sub.frames(1)
        sent_at, first = trio.current_time(), bytes(sub.raw)
        await sub.until(lambda: len(sub.raw) > len(first))
        assert trio.current_time() - sent_at == pytest.approx(2.0)
        assert bytes(sub.raw) == first * 2


async def test_a_partial_ack_stops_the_resends_of_what_it_covers(autojump_clock: Any) -> None:
    async with rig() as r:
        sub = await r.connect(window=3)
        await subscribe(sub, "news")
        await publish_local(r.hub, "news", [b"a", b"b", b"c"])
        await sub.frames(3)
        before = len(sub.raw)
        await sub.ack(2)
        await sub.pump(EXPIRE * 1.5)
        assert bytes(sub.raw[before:]) == encode_frame(Frame(3, "news", "", b"c"))
        await sub.ack(3)
        await sub.pump(EXPIRE * 3)
        assert len(sub.raw) == before + len(encode_frame(Frame(3, "news", "", b"c")))


async def test_an_ack_for_a_frame_never_sent_is_ignored(autojump_clock: Any) -> None:
    async with rig() as r:
        sub = await r.connect(window=5)
        await subscribe(sub, "news")
        receipt = await publish_local(r.hub, "news", [b"a", b"b"])
        await sub.frames(2)
        assert sub.codec.negotiated is not None
        assert sub.codec.negotiated.agreement.extension_id("batch-ack") == 1
        for stray in (40, 65535):  # ahead of what was sent; behind the first
            await sub.stream.send_all(encode_frame(Extension(1, stray.to_bytes(2, "big"))))
        await sub.pump(EXPIRE / 10)
        assert not receipt.done()
        assert not sub.ended.is_set()
        await sub.ack(2)
        await sub.pump(EXPIRE / 10)
        assert receipt.done()


async def test_a_publisher_resend_inside_the_window_is_dropped_and_published_once(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        reader = r.hub.subscribe("news", "reader")  # a topic: settles when it acks
        pub = await r.connect()
        await pub.publish("news", b"one", b"two", b"three")
        got = await take(reader, 3)
        # Our ack is still coming (the reader has not acked): the resend is dropped.
        await trio.sleep(EXPIRE)
        assert await pub.resend_due()
        await pub.pump(EXPIRE / 10)
        assert pub.take(Ack) == []
        reader.ack_many(d.tag for d in got)
        assert [a.seq for a in await pub.acks()] == [3]
        assert [d.message.body for d in got] == [b"one", b"two", b"three"]
        assert reader.take() == []  # published once
        assert r.hub.delivered == 1  # one publish, one receipt


async def test_a_publisher_resend_after_the_ack_is_acked_again(autojump_clock: Any) -> None:
    async with rig({"name": "store", "retain": "1MiB"}) as r:
        pub = await r.connect()
        await pub.publish("store", b"one", b"two")
        assert [a.seq for a in await pub.acks()] == [2]
        await pub.stream.send_all(pub.wire)  # as if our ack had been lost
        again = await pub.acks()
        await pub.pump(EXPIRE / 10)
        assert {a.seq for a in again + pub.take(Ack)} == {2}  # acked again at once


async def test_a_resent_batch_is_acked_again_with_one_ack(autojump_clock: Any) -> None:
    async with rig({"name": "store", "retain": "1MiB"}) as r:
        pub = await r.connect()
        await pub.publish("store", *[b"x"] * 50)
        assert [a.seq for a in await pub.acks()] == [50]
        await pub.stream.send_all(pub.wire)  # one read of 50 resent frames
        await pub.pump(EXPIRE / 10)
        assert [a.seq for a in pub.take(Ack)] == [50]


async def test_a_publisher_resend_after_the_ack_is_dropped(autojump_clock: Any) -> None:
    async with rig({"name": "store", "retain": "1MiB"}) as r:
        pub = await r.connect()
        await pub.publish("store", b"one", b"two")
        assert [a.seq for a in await pub.acks()] == [2]
        await pub.stream.send_all(pub.wire)  # as if our ack had been lost
        await pub.pump(EXPIRE)
        assert not pub.ended.is_set()
        reader = r.hub.subscribe("store", "reader", start="earliest")
        assert [d.message.body for d in reader.take()] == [b"one", b"two"]  # stored once
        assert r.hub.delivered == 1


async def test_two_subscriptions_share_one_window(autojump_clock: Any) -> None:
    async with rig() as r:
        sub = await r.connect(window=4)
        await subscribe(sub, "a")
        await subscribe(sub, "b")
        await publish_local(r.hub, "a", [b"a%d" % i for i in range(6)])
        await publish_local(r.hub, "b", [b"b%d" % i for i in range(6)])
        got = await sub.frames(4)
        assert await sub.quiet(EXPIRE * 3) == []  # never more than 4 unacked together
        seen = list(got)
        while len(seen) < 12:
            await sub.ack(seen[-1].seq)
            batch = await sub.frames(1)
            batch += await sub.quiet(0)
            unacked = SEQUENCE.distance(seen[-1].seq, batch[-1].seq)
            assert len(batch) <= 4
            assert unacked <= 4
            seen += batch
        assert [f.seq for f in seen] == list(range(1, 13))
        by = {d: [f.payload for f in seen if f.destination == d] for d in "ab"}
        assert by == {d: [b"%s%d" % (d.encode(), i) for i in range(6)] for d in "ab"}


# -- the gateway as receiver: acks once the receipt settled -----------------------------------


async def test_a_batch_is_acked_once_with_one_ack_after_the_topic_subscriber_acked(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        reader = r.hub.subscribe("news", "reader")
        pub = await r.connect()
        await pub.publish("news", b"1", b"2", b"3")
        got = await take(reader, 3)
        await pub.pump(EXPIRE / 10)
        assert pub.take(Ack) == []  # not before the subscriber acked
        reader.ack_many(d.tag for d in got[:2])
        await pub.pump(EXPIRE / 10)
        assert pub.take(Ack) == []  # not while one copy is unacked
        reader.ack(got[2].tag)
        assert [a.seq for a in await pub.acks()] == [3]
        await pub.pump(EXPIRE * 2)
        assert pub.take(Ack) == []  # one cumulative ack for the batch
        assert pub.codec.window_room == 100


async def test_batches_are_acked_in_order(autojump_clock: Any) -> None:
    async with rig() as r:
        reader = r.hub.subscribe("news", "reader")
        pub = await r.connect()
        await pub.publish("news", b"1", b"2")
        first = await take(reader, 2)
        await pub.publish("news", b"3")
        (second,) = await take(reader, 1)
        reader.ack(second.tag)  # the later batch settles first: no ack yet
        await pub.pump(EXPIRE / 10)
        assert pub.take(Ack) == []
        reader.ack_many(d.tag for d in first)
        acks = await pub.acks()
        await pub.pump(EXPIRE / 10)
        acks += pub.take(Ack)
        assert [a.seq for a in acks] in ([2, 3], [3])


async def test_a_failed_receipt_is_not_acked_and_the_resend_is_published(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        reader = r.hub.subscribe("news", "reader")
        pub = await r.connect()
        await pub.publish("news", b"x", b"y")
        got = await take(reader, 2)
        reader.ack(got[0].tag)
        reader.nack(got[1].tag, requeue=False)  # the subscriber refuses its copy: failed
        await pub.pump(EXPIRE * 0.9)
        assert pub.take(Ack) == []
        await trio.sleep(EXPIRE * 0.1)
        assert await pub.resend_due() == pub.wire  # the client resends both
        again = await take(reader, 2)
        assert [d.message.body for d in again] == [b"x", b"y"]  # published again
        assert not any(d.redelivered for d in again)
        reader.ack_many(d.tag for d in again)
        assert [a.seq for a in await pub.acks()] == [2]


async def test_a_failed_batch_is_resent_with_the_batches_after_it(autojump_clock: Any) -> None:
    async with rig() as r:
        reader = r.hub.subscribe("news", "reader")
        pub = await r.connect()
        await pub.publish("news", b"x")
        (x,) = await take(reader, 1)
        await pub.publish("news", b"y")
        (y,) = await take(reader, 1)
        reader.ack(y.tag)  # the later batch is kept...
        reader.nack(x.tag, requeue=False)  # ...the earlier one fails
        await pub.pump(EXPIRE * 0.9)
        assert pub.take(Ack) == []  # no ack covers y either: acks are cumulative
        await trio.sleep(EXPIRE * 0.1)
        assert await pub.resend_due()  # x and y again, both taken as new
        again = await take(reader, 2)
        assert [d.message.body for d in again] == [b"x", b"y"]  # y at least once
        reader.ack_many(d.tag for d in again)
        acks = await pub.acks()
        await pub.pump(EXPIRE / 10)
        assert [a.seq for a in acks + pub.take(Ack)][-1] == 2


async def test_a_message_over_the_destinations_buffer_is_rejected_by_an_error_frame(
    autojump_clock: Any,
) -> None:
    async with rig({"name": "small", "buffer_bytes": "4KiB"}) as r:
        pub = await r.connect()
        await pub.publish("small", b"fine", b"x" * 8192, b"after")
        events = await pub.closed()
        errors = [e for e in events if isinstance(e, Error)]
        assert len(errors) == 1
        assert errors[0].message.startswith("MESSAGE 2 rejected: ")
        assert not [e for e in events if isinstance(e, Ack)]  # the batch is not acked
        assert isinstance(events[-1], ConnectionClosed)


# -- queues ----------------------------------------------------------------------------------


async def consume(peers: Sequence[Peer], total: int) -> dict[int, list[bytes]]:
    """Receive and ack on every peer until ``total`` messages came; each peer's bodies."""
    got: dict[int, list[bytes]] = {i: [] for i in range(len(peers))}
    with trio.fail_after(GUARD):
        while sum(map(len, got.values())) < total:
            for i, peer in enumerate(peers):
                frames = await peer.quiet(0.01)
                if frames:
                    got[i] += bodies(frames)
                    await peer.ack(frames[-1].seq)
    return got


async def test_queue_consumers_each_get_each_message_once(autojump_clock: Any) -> None:
    async with rig({"name": "jobs", "kind": "queue"}) as r:
        consumers = [await r.connect(window=4) for _ in range(3)]
        for c in consumers:
            await subscribe(c, "jobs")
        pub = await r.connect()
        jobs = [b"job %d" % i for i in range(30)]
        for i in range(0, 30, 5):
            await pub.publish("jobs", *jobs[i : i + 5])
        got = await consume(consumers, 30)
        assert sorted(b for each in got.values() for b in each) == sorted(jobs)  # each exactly once
        assert all(got.values())  # windows of 4: every consumer took some
        for c in consumers:
            assert await c.quiet(EXPIRE * 3) == []
        acks = await pub.acks()
        await pub.pump(EXPIRE / 10)
        assert (acks + pub.take(Ack))[-1].seq == 30  # every job settled


async def test_queue_consumers_with_selectors_get_only_what_they_match(
    autojump_clock: Any,
) -> None:
    async with rig({"name": "jobs", "kind": "queue"}) as r:
        a, b = await r.connect(window=3), await r.connect(window=3)
        await subscribe(a, "jobs", filter="kind=Ta")
        await subscribe(b, "jobs", filter="kind=Tb")
        pub = await r.connect()
        for i in range(10):
            kind = "ab"[i % 2]
            await pub.publish("jobs", b"%s%d" % (kind.encode(), i), properties=f"kind:T{kind};")
        got = await consume([a, b], 10)
        assert got[0] == [b"a%d" % i for i in range(0, 10, 2)]
        assert got[1] == [b"b%d" % i for i in range(1, 10, 2)]


async def test_a_queue_consumer_leaving_with_unacked_messages_hands_them_over(
    autojump_clock: Any,
) -> None:
    async with rig({"name": "jobs", "kind": "queue"}) as r:
        a = await r.connect(window=3)
        await subscribe(a, "jobs")
        await publish_local(r.hub, "jobs", [b"j%d" % i for i in range(3)])
        got = await a.frames(3)
        await a.ack(got[0].seq)
        b = await r.connect(window=3)
        await subscribe(b, "jobs")
        assert await b.quiet(EXPIRE) == []  # a holds them
        await a.stream.aclose()  # leaves with j1 and j2 unacked
        again = await b.frames(2)
        assert bodies(again) == [b"j1", b"j2"]
        await b.ack(again[-1].seq)
        assert await b.quiet(EXPIRE * 3) == []


# -- the handshake, subscriptions ---------------------------------------------------------


async def test_no_handshake_within_the_timeout_closes(autojump_clock: Any) -> None:
    async with rig(handshake_timeout="3s") as r:
        near, far = trio.testing.memory_stream_pair()
        info = ConnectionInfo("micromessage", "mm", "silent")
        conn = ServerConnection(far, info, r.settings, HubFacade(r.hub), r.shutdown)
        peer = Peer(near, window=1, subscribes=False)
        r.nursery.start_soon(peer.serve, conn)
        start = trio.current_time()
        await near.send_all(peer.codec.send(peer.codec.offer)[:5])  # a part of the offer
        with trio.fail_after(GUARD):
            assert await near.receive_some() == b""
        assert trio.current_time() - start == pytest.approx(3.0)


async def test_a_bad_filter_is_an_error_frame_naming_it_then_close(autojump_clock: Any) -> None:
    async with rig() as r:
        sub = await r.connect()
        await sub.send(Subscribe("news", "age>=X18"))
        events = await sub.closed()
        errors = [e for e in events if isinstance(e, Error)]
        assert len(errors) == 1
        assert "'age'" in errors[0].message  # the condition at fault
        assert "'X18'" in errors[0].message
        assert isinstance(events[-1], ConnectionClosed)


async def test_unsubscribe_stops_deliveries_and_what_stays_unacked_goes_back(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        sub = await r.connect(window=5)
        await subscribe(sub, "news", group="g")
        await publish_local(r.hub, "news", [b"n%d" % i for i in range(3)])
        got = await sub.frames(3)
        await sub.ack(got[0].seq)
        await sub.send(Unsubscribe("news"))
        await trio.testing.wait_all_tasks_blocked()
        before = len(sub.raw)
        await publish_local(r.hub, "news", [b"later"])
        assert await sub.quiet(EXPIRE * 2.5) == []  # no new deliveries
        # The frames we left unacked keep their sequence numbers: they are resent (the
        # window still counts them), and are nothing new.
        resend = b"".join(encode_frame(f) for f in got[1:])
        assert bytes(sub.raw[before:]) == resend * 2
        assert not sub.ended.is_set()
        await sub.stream.aclose()  # we leave without acking them
        with trio.fail_after(GUARD):
            await sub.ended.wait()
        other = r.hub.subscribe("news", "g")
        back = await take(other, 3)
        assert [(d.message.body, d.redelivered) for d in back] == [
            (b"n1", True),
            (b"n2", True),
            (b"later", False),
        ]


async def test_after_unsubscribe_the_clients_acks_still_settle_what_was_delivered(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        sub = await r.connect(window=5)
        await subscribe(sub, "news", group="g")
        receipt = await publish_local(r.hub, "news", [b"n0", b"n1"])
        got = await sub.frames(2)
        await sub.send(Unsubscribe("news"))
        await trio.testing.wait_all_tasks_blocked()
        await sub.ack(got[-1].seq)
        await sub.pump(EXPIRE / 10)
        assert receipt.done()  # settled by our ack: not handed to anyone else
        await publish_local(r.hub, "news", [b"later"])
        assert await sub.quiet(EXPIRE * 3) == []
        other = r.hub.subscribe("news", "g")
        assert [(d.message.body, d.redelivered) for d in await take(other, 1)] == [
            (b"later", False)
        ]


# -- the sequence wraps ---------------------------------------------------------------------


async def fill(r: Rig, peer: Peer, destination: str, count: int, batch: int = 8192) -> None:
    """``count`` deliveries of ``destination`` to ``peer``, acked batch by batch."""
    done = 0
    while done < count:
        n = min(batch, count - done)
        await publish_local(r.hub, destination, [b"f"] * n)
        got = await peer.frames(n)
        await peer.ack(got[-1].seq)
        done += n


async def test_the_sequence_wraps_with_two_subscriptions_interleaving(
    autojump_clock: Any,
) -> None:
    async with rig(max_window=32767) as r:
        sub = await r.connect(window=32767)
        await subscribe(sub, "a")
        await subscribe(sub, "b")
        await fill(r, sub, "a", 65530)  # the next outgoing seq is 65531
        for i in range(10):  # one at a time, alternating: the frames interleave
            await publish_local(r.hub, "a", [b"a%d" % i])
            await publish_local(r.hub, "b", [b"b%d" % i])
            await trio.testing.wait_all_tasks_blocked()
        got = await sub.frames(20)
        assert [f.seq for f in got] == [*range(65531, 65536), *range(1, 16)]
        before_wrap, after_wrap = got[:5], got[5:]
        assert (
            {f.destination for f in before_wrap}
            == {f.destination for f in after_wrap}
            == {
                "a",
                "b",
            }
        )  # the two subscriptions interleave on both sides of the wrap
        for d in "ab":
            assert [f.payload for f in got if f.destination == d] == [
                b"%s%d" % (d.encode(), i) for i in range(10)
            ]
        # One ack across the wrap settles 65531..3: only 4..15 come again.
        await sub.ack(3)
        before = len(sub.raw)
        await sub.pump(EXPIRE * 1.5)
        resent = b"".join(encode_frame(f) for f in got[8:])
        assert bytes(sub.raw[before:]) == resent
        await sub.ack(15)
        await sub.pump(EXPIRE * 3)
        assert len(sub.raw) == before + len(resent)  # all acked: nothing more
        await publish_local(r.hub, "b", [b"next"])
        (nxt,) = await sub.frames(1)
        assert (nxt.seq, nxt.payload) == (16, b"next")


async def test_an_ack_across_an_unsubscribed_subscriptions_frames_settles_the_others(
    autojump_clock: Any,
) -> None:
    async with rig() as r:
        sub = await r.connect(window=10)
        await subscribe(sub, "a")
        await subscribe(sub, "b")
        await publish_local(r.hub, "a", [b"a1", b"a2"])
        assert [f.seq for f in await sub.frames(2)] == [1, 2]
        receipt = await publish_local(r.hub, "b", [b"b1"])
        assert [f.seq for f in await sub.frames(1)] == [3]
        await sub.send(Unsubscribe("a"))  # 1 and 2 go back to the hub unacked
        await trio.testing.wait_all_tasks_blocked()
        await sub.ack(3)  # covers 1 and 2 (gone) and 3 (b's)
        await sub.pump(EXPIRE / 10)
        assert receipt.done()  # b's delivery is acked at the hub
        assert not sub.ended.is_set()


async def test_while_draining_acks_still_count_and_new_messages_are_not_taken(
    autojump_clock: Any,
) -> None:
    async with rig({"name": "store", "retain": "1MiB"}) as r:
        reader = r.hub.subscribe("topic", "reader")
        sub = await r.connect()
        await subscribe(sub, "news")
        pub = await r.connect()
        await pub.publish("topic", b"owed")  # its ack waits for the reader
        (owed,) = await take(reader, 1)
        receipt = await publish_local(r.hub, "news", [b"before"])
        (frame,) = await sub.frames(1)
        r.shutdown.set()  # the gateway drains
        await trio.testing.wait_all_tasks_blocked()
        await pub.publish("store", b"late")
        await pub.pump(EXPIRE / 10)
        assert pub.take(Ack) == []
        reader.ack(owed.tag)
        assert [a.seq for a in await pub.acks()] == [1]  # what was owed, not the late one
        with trio.fail_after(GUARD):
            await pub.ended.wait()
        stored = r.hub.subscribe("store", "r", start="earliest").take()
        assert stored == []  # not taken: the client sends it again on its next connection
        await publish_local(r.hub, "news", [b"during"])
        assert await sub.quiet(EXPIRE / 10) == []  # no new deliveries
        await sub.ack(frame.seq)  # the subscriber's ack still settles its delivery
        await sub.pump(EXPIRE / 10)
        assert receipt.done()
        with trio.fail_after(GUARD):
            await sub.ended.wait()  # nothing owed: the connection ends


# -- without an ack extension: at most once ------------------------------------------------------


async def _handshake_without_acks(stream: trio.abc.Stream) -> FrameDecoder:
    """A client that takes none of the listener's optional extensions but ``pubsub``: its
    final message leaves ``batch-ack`` out, as the protocol lets it."""
    offer = Handshake(1, 0, "no-acks", optional=(ExtensionSpec("pubsub"),))
    await stream.send_all(encode_handshake(offer))
    received = bytearray()
    while (parsed := decode_handshake(received)) is None:
        received += await stream.receive_some(65536)
    answer, end = parsed
    assert isinstance(answer, Handshake)
    assert "batch-ack" in answer.names  # offered, and declined below
    await stream.send_all(
        encode_handshake(Handshake(1, 0, "no-acks", (), (ExtensionSpec("pubsub"),)))
    )
    decoder = FrameDecoder()
    decoder.feed(bytes(received[end:]))
    return decoder


async def _frames(stream: trio.abc.Stream, decoder: FrameDecoder, n: int) -> list[Any]:
    got: list[Any] = []
    with trio.fail_after(GUARD):
        while len(got) < n:
            frame = decoder.next_frame()
            if frame is None:
                decoder.feed(await stream.receive_some(65536))
            else:
                got.append(frame)
    return got


async def test_without_an_ack_extension_messages_go_at_most_once(autojump_clock: Any) -> None:
    """No window, no acks: a publish is not acked (there is nothing to ack with), and a
    delivery is acked to the hub once written, so it is settled without the peer."""
    async with rig() as r:
        near, far = trio.testing.memory_stream_pair()
        info = ConnectionInfo("micromessage", "mm", "peer")
        conn = ServerConnection(far, info, r.settings, HubFacade(r.hub), r.shutdown)
        r.nursery.start_soon(MicromessagePlugin().serve, conn)
        decoder = await _handshake_without_acks(near)
        command = Command(encode_command(Subscribe("news")))
        await near.send_all(encode_frame(command))
        await trio.sleep(1)
        receipt = await r.hub.publish([Message("news", b"one"), Message("news", b"two")])
        got = await _frames(near, decoder, 2)
        assert [(f.seq, f.destination, f.payload) for f in got] == [
            (1, "news", b"one"),
            (2, "news", b"two"),
        ]
        with trio.fail_after(GUARD):
            await receipt.wait()  # settled by the write, no ack frame from us
        await near.send_all(encode_frame(Frame(1, "logs", "", b"mine")))
        sub = r.hub.subscribe("logs")
        await trio.sleep(1)
        sub_got = sub.take()
        assert [d.message.body for d in sub_got] == [b"mine"]
        await trio.sleep(5)
        assert decoder.next_frame() is None  # and no ack comes back for it
