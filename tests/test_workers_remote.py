"""Stateful destinations across workers: a home worker, and proxies in the others.

Hub-level: two or three hubs joined as workers are (each with its
:class:`~gateway.core.peers.Peers` and a :class:`~gateway.core.remote.RemoteProvider`
first among its providers), over trio memory streams driven by the driver
the workers run over unix sockets. A destination's home is what the
catalog computes (:meth:`~gateway.runtime.catalog.Catalog.home`), so the
tests pick names by their home. Also the frames the proxies add to the link.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
import trio.testing
from harness import receive_now, settle, start

from gateway.config.loader import parse
from gateway.core.destination import Delivery, Subscription
from gateway.core.filters import Filter
from gateway.core.hub import Hub
from gateway.core.model import Message, Outcome, Position, Positions, Reply, Source
from gateway.core.peers import Peers
from gateway.core.peerwire import (
    Acks,
    Answer,
    Batch,
    Committed,
    Deliveries,
    Ended,
    Failure,
    Frame,
    Grant,
    Nack,
    PeerWire,
    Respond,
    Subscribe,
    Unsubscribe,
)
from gateway.core.reasons import Reason
from gateway.core.remote import LINK_WAIT, RemoteDestination, RemoteProvider
from gateway.core.topic import TopicLimits
from gateway.runtime.catalog import Catalog, DestinationSpec, home_worker
from gateway.runtime.peerlinks import drive_incoming, drive_outgoing
from gateway.store import Store

# -- the frames -------------------------------------------------------------------------


def test_the_proxy_frames_have_fixed_bytes() -> None:
    wire = PeerWire()
    assert wire.encode(Grant(3, 10)) == b"\x00\x00\x00\x04\x93\x11\x03\x0a"
    assert wire.encode(Acks(3, (1, 2))) == b"\x00\x00\x00\x06\x93\x12\x03\x92\x01\x02"
    assert wire.encode(Unsubscribe(3)) == b"\x00\x00\x00\x03\x92\x15\x03"
    assert wire.encode(Deliveries(3, "q", (Delivery(1, Message("q", b"hi")),))) == (
        b"\x00\x00\x00\x0f\x94\x16\x03\xa1q\x91\x95\x01\xc4\x02hi\xc2\xc0\xc0"
    )
    assert wire.encode(Ended(3, 2, "bad")) == b"\x00\x00\x00\x08\x94\x17\x03\x02\xa3bad"
    assert wire.encode(Batch(7, "q", (Message("q", b"hi"),), 1.5)) == (
        b"\x00\x00\x00\x13\x95\x02\x07\xa1q\x91\xc4\x02hi\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"
    )
    assert wire.encode(Answer(7, (), Reply(b"ok"))) == (
        b"\x00\x00\x00\x0d\x94\x03\x07\x90\x95\xc4\x02ok\xc0\xc0\x00\xa0"
    )


def test_the_proxy_frames_fed_byte_by_byte_decode_to_what_was_sent() -> None:
    source = Source("ndjson", "nd", "127.0.0.1:5", received_at=1.5, upstream="")
    frames: list[Frame] = [
        Subscribe(1, "q", "g", 10, 5, 1000, "earliest", Positions({0: 3, 2: 7})),
        Subscribe(2, "log", None, None, 1024, None, Position(4, 1), 9, Filter.equals(k="v"), False),
        Grant(1, 7),
        Acks(1, (4, 5, 6)),
        Nack(1, 4, False, Outcome.REJECTED, "bad"),
        Respond(1, 5, Reply(b"pong", {"h": "1"}, "text/plain", 3, "why")),
        Unsubscribe(1),
        Deliveries(
            1,
            "q",
            (
                Delivery(4, Message("q", b"a")),
                Delivery(
                    5, Message("q", b"b", {"k": "v"}, None, source), True, Position(3, 2), 2.5
                ),
            ),
        ),
        Ended(1, 1, "end of the read"),
        Committed(1, Position(9, 0)),
        Committed(1, None),
        Batch(3, "q", (Message("q", b"call"),), 0.25),
        Answer(3, (), Reply(b"r")),
        Answer(
            4,
            (Failure(1, Outcome.REJECTED, "too large", Reason.TOO_LARGE),),
            None,
            (Position(7, 1), None, Position(8, 1)),
        ),
    ]
    sender, receiver = PeerWire(), PeerWire()
    data = b"".join(sender.encode(f) for f in frames)
    got: list[Frame] = []
    for i in range(len(data)):
        got += receiver.receive_data(data[i : i + 1])
    assert got == frames
    assert receiver.pending == 0


def test_homes_are_crc32_of_the_name_and_durable_ones_are_worker_0() -> None:
    catalog = Catalog(
        [
            DestinationSpec("q.*", kind="queue"),
            DestinationSpec("audit", retain=1 << 20),
            DestinationSpec("billing", groups=("g",)),
            DestinationSpec("stored", store="embedded", retain=1 << 20),
            DestinationSpec("plain", buffer_messages=5),
        ],
        TopicLimits(1 << 20, 1000),
    )
    assert home_worker("q.jobs", 3) == 2  # zlib.crc32(b"q.jobs") == 3733301249
    assert catalog.home("q.jobs", 3) == 2
    assert catalog.home("audit", 4) == home_worker("audit", 4)
    assert catalog.home("billing", 4) == home_worker("billing", 4)
    assert catalog.home("stored", 4) == 0
    assert catalog.home("plain", 4) is None
    assert catalog.home("news", 4) is None
    assert catalog.info("q.jobs").queue_group == "queue"
    assert catalog.info("stored").kind == "log"
    assert catalog.info("stored").positions


def test_stateful_destinations_are_accepted_with_workers() -> None:
    config = {
        "gateway": {"workers": 2},
        "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
        "destinations": [
            {"name": "jobs", "kind": "queue"},
            {"name": "audit", "retain": "1MiB"},
            {"name": "billing", "groups": ["g"]},
            {"name": "kept", "store": "embedded"},
        ],
    }
    assert parse(config, source="gw.toml").gateway.workers == 2


# -- two or three hubs, as workers ------------------------------------------------------


SPECS = [
    DestinationSpec("q.*", kind="queue"),
    DestinationSpec("g.*", groups=("g",)),
    DestinationSpec("d.*", store="embedded", retain=1 << 20),
]


def homed_at(home: int, workers: int, prefix: str) -> str:
    """A name ``prefix``… whose home, of ``workers``, is ``home``."""
    for n in range(1000):
        name = f"{prefix}{n}"
        if home_worker(name, workers) == home:
            return name
    raise AssertionError("no such name")


@dataclass
class Mesh:
    hubs: list[Hub]
    peers: list[Peers]
    #: The cancel scope of the link from worker i to worker j, by (i, j).
    links: dict[tuple[int, int], trio.CancelScope]

    def cut(self, a: int, b: int) -> None:
        """Break the links between workers ``a`` and ``b`` both ways."""
        self.links[a, b].cancel()
        self.links[b, a].cancel()


@asynccontextmanager
async def mesh(n: int, store: Store | None = None) -> AsyncIterator[Mesh]:
    hubs, peers = [], []
    for i in range(n):
        catalog = Catalog(SPECS, TopicLimits(1 << 20, 1000))
        if i == 0:
            catalog.store = store
        p = Peers(i, 1 << 20)
        provider = RemoteProvider(p, lambda name, c=catalog: c.home(name, n), catalog.info)
        hub = Hub(providers=[provider, catalog])
        hub.join(p)
        hubs.append(hub)
        peers.append(p)
    links: dict[tuple[int, int], trio.CancelScope] = {}
    async with trio.open_nursery() as nursery:

        async def link(a: int, b: int, scope: trio.CancelScope) -> None:
            with scope:
                async with trio.open_nursery() as inner:
                    dialled, accepted = trio.testing.memory_stream_pair()
                    inner.start_soon(drive_outgoing, peers[a], b, dialled)
                    inner.start_soon(drive_incoming, peers[b], accepted)

        for hub in hubs:
            await nursery.start(hub.run)
        for a in range(n):
            for b in range(n):
                if a != b:
                    links[a, b] = trio.CancelScope()
                    nursery.start_soon(link, a, b, links[a, b])
        await settle()
        yield Mesh(hubs, peers, links)
        for hub in hubs:
            hub.close()
        nursery.cancel_scope.cancel()


async def test_a_queue_homed_elsewhere_delivers_and_settles_on_the_ack() -> None:
    q = homed_at(1, 2, "q.")
    async with mesh(2) as w, trio.open_nursery() as nursery:
        a, b = w.hubs
        assert isinstance(a.destination(q), RemoteDestination)
        assert not isinstance(b.destination(q), RemoteDestination)
        consumer = a.subscribe(q)
        await settle()
        receipt = await a.publish([Message(q, b"one"), Message(q, b"two")])
        await settle()
        deliveries = await receive_now(consumer)
        assert [d.message.body for d in deliveries] == [b"one", b"two"]
        assert deliveries[0].message.destination == q
        assert consumer.unacked == 2
        assert not receipt.done(), "settled before the consumer acked"
        consumer.ack(deliveries[0].tag)
        await settle()
        assert not receipt.done()
        consumer.ack_many([deliveries[1].tag])
        waited = start(nursery, receipt.wait)
        await settle()
        assert waited.result is Outcome.DELIVERED
        assert consumer.unacked == 0
        # The home reports the queue; the proxy is not among a's destinations.
        assert q in b.destinations()
        assert q not in a.destinations()
        assert b.destinations()[q].figures().acked == 2


async def test_a_consumer_that_closes_unacked_has_its_deliveries_redelivered_elsewhere() -> None:
    q = homed_at(1, 3, "q.")
    async with mesh(3) as w:
        a, _b, c = w.hubs
        first = a.subscribe(q, credit=1)
        await settle()
        receipt = await c.publish([Message(q, b"job")])
        await settle()
        (_got,) = await receive_now(first)
        second = c.subscribe(q)
        await settle()
        assert await receive_now(second) == [], "the queue handed one copy to two consumers"
        first.close()
        await settle()
        (again,) = await receive_now(second)
        assert again.message.body == b"job"
        assert again.redelivered
        assert not receipt.done()
        second.ack(again.tag)
        await settle()
        assert receipt.outcome is Outcome.DELIVERED


async def test_credit_bounds_what_the_home_pushes() -> None:
    q = homed_at(0, 2, "q.")
    async with mesh(2) as w:
        a, b = w.hubs
        consumer = b.subscribe(q, credit=2)
        await settle()
        await a.publish([Message(q, b"%d" % i) for i in range(5)])
        await settle()
        incoming = w.peers[0].incoming[0]
        (home,) = incoming.homes.values()
        assert home.sub.unacked == 2, "the home pushed beyond the credit granted"
        got = await receive_now(consumer)
        assert len(got) == 2
        assert consumer.credit == 0
        assert await receive_now(consumer) == []
        consumer.grant(3)
        await settle()
        assert [d.message.body for d in await receive_now(consumer)] == [b"2", b"3", b"4"]


async def test_a_broken_link_fails_the_publishers_legs_and_closes_the_home_subscription(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q = homed_at(1, 3, "q.")
    async with mesh(3) as w:
        a, b, c = w.hubs
        remote = c.subscribe(q)
        local = b.subscribe(q, credit=0)
        await settle()
        receipt = await a.publish([Message(q, b"x")])
        await settle()
        (_got,) = await receive_now(remote)
        w.cut(0, 1)  # the publisher's worker loses its link to the home
        await settle()
        assert receipt.outcome is Outcome.FAILED
        assert "broke" in receipt.result(0).reason
        w.cut(2, 1)  # the consumer's worker too: the home closes its subscription
        await settle()
        with pytest.raises(trio.ClosedResourceError, match="broke"):
            await remote.receive()
        local.grant(1)
        await settle()
        (again,) = await receive_now(local)
        assert again.message.body == b"x"
        assert again.redelivered
        # No link to the home: a publish waits LINK_WAIT seconds for one, then fails.
        began = trio.current_time()
        failed = await a.publish([Message(q, b"y")])
        assert failed.outcome is Outcome.FAILED
        assert "within 5s" in failed.result(0).reason
        assert trio.current_time() - began == pytest.approx(LINK_WAIT)
        # A subscription waits as long for a link, then ends.
        late = a.subscribe(q)
        assert await receive_now(late) == [], "it ended before waiting for a link"
        began = trio.current_time()
        with pytest.raises(trio.ClosedResourceError, match=r"no link to worker 1.*within 5s"):
            await late.receive()
        assert trio.current_time() - began == pytest.approx(LINK_WAIT)


async def test_a_publish_before_the_link_is_up_waits_for_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q = homed_at(1, 2, "q.")
    async with mesh(2) as w, trio.open_nursery() as nursery:
        a, b = w.hubs
        consumer = b.subscribe(q)
        w.cut(0, 1)
        await settle()
        assert w.peers[0].link(1) is None
        published = start(nursery, a.publish, [Message(q, b"early")])
        await trio.sleep(LINK_WAIT / 2)
        assert not published.done, "the publish did not wait for the link"
        w.links[0, 1] = trio.CancelScope()
        dialled, accepted = trio.testing.memory_stream_pair()
        nursery.start_soon(drive_outgoing, w.peers[0], 1, dialled)
        nursery.start_soon(drive_incoming, w.peers[1], accepted)
        await settle()
        assert published.done
        (got,) = await receive_now(consumer)
        assert got.message.body == b"early"
        consumer.ack(got.tag)
        await settle()
        assert published.result.outcome is Outcome.DELIVERED
        nursery.cancel_scope.cancel()


async def test_a_subscription_made_before_the_link_is_up_opens_once_it_is(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q = homed_at(1, 2, "q.")
    async with mesh(2) as w, trio.open_nursery() as nursery:
        a, b = w.hubs
        w.cut(0, 1)
        await settle()
        consumer = a.subscribe(q, credit=0)
        consumer.grant(2)  # credit granted while waiting counts once it opens
        await trio.sleep(LINK_WAIT / 2)
        dialled, accepted = trio.testing.memory_stream_pair()
        nursery.start_soon(drive_outgoing, w.peers[0], 1, dialled)
        nursery.start_soon(drive_incoming, w.peers[1], accepted)
        await settle()
        receipt = await b.publish([Message(q, b"%d" % i) for i in range(3)])
        await settle()
        got = await receive_now(consumer)
        assert [d.message.body for d in got] == [b"0", b"1"]
        consumer.ack_many(d.tag for d in got)
        consumer.grant(1)
        await settle()
        (last,) = await receive_now(consumer)
        consumer.ack(last.tag)
        await settle()
        assert receipt.outcome is Outcome.DELIVERED
        nursery.cancel_scope.cancel()


async def test_a_named_group_with_members_on_two_workers_gets_one_copy_of_each() -> None:
    t = homed_at(1, 3, "g.")
    async with mesh(3) as w:
        a, b, c = w.hubs
        members = [a.subscribe(t, "g", max_unacked=4), c.subscribe(t, "g", max_unacked=4)]
        await settle()
        receipt = await b.publish([Message(t, b"%d" % i) for i in range(20)])
        seen: list[bytes] = []
        for _ in range(20):
            await settle()
            for m in members:
                got = await receive_now(m)
                m.ack_many(d.tag for d in got)
                seen += _bodies(got)
        await settle()
        assert sorted(seen) == sorted(b"%d" % i for i in range(20)), "not one copy of each"
        assert receipt.outcome is Outcome.DELIVERED
        (group,) = [g for g in b.destinations()[t].figures().groups if g.name == "g"]
        assert group.members == 2


async def test_a_call_to_a_queue_homed_elsewhere_gets_its_reply(
    autojump_clock: trio.testing.MockClock,
) -> None:
    q = homed_at(1, 3, "q.")
    async with mesh(3) as w, trio.open_nursery() as nursery:
        a, _b, c = w.hubs
        service = c.subscribe(q)
        await settle()

        async def serve() -> None:
            (call,) = await service.receive()
            assert call.reply_by is not None
            assert 4 < call.reply_by - trio.current_time() <= 5
            service.reply(call.tag, Reply(call.message.body.upper()))

        nursery.start_soon(serve)
        receipt = await a.call(Message(q, b"ping"), timeout=5)
        assert await receipt.wait() is Outcome.DELIVERED
        assert receipt.reply is not None
        assert receipt.reply.body == b"PING"
        # Nobody answers: the call fails at its deadline, not later.
        receipt = await a.call(Message(q, b"again"), timeout=2)
        before = trio.current_time()
        assert await receipt.wait() is Outcome.FAILED
        assert trio.current_time() - before == pytest.approx(2, abs=0.01)


async def test_a_call_to_a_plain_topic_reaches_a_subscriber_on_another_worker(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with mesh(2) as w, trio.open_nursery() as nursery:
        a, b = w.hubs
        service = b.subscribe("svc")
        await settle()

        async def serve() -> None:
            (call,) = await service.receive()
            service.reply(call.tag, Reply(b"pong"))

        nursery.start_soon(serve)
        receipt = await a.call(Message("svc", b"ping"), timeout=5)
        assert await receipt.wait() is Outcome.DELIVERED
        assert receipt.reply is not None
        assert receipt.reply.body == b"pong"


async def test_a_bad_start_at_home_surfaces_at_the_proxys_receive() -> None:
    q = homed_at(1, 2, "q.")
    async with mesh(2) as w:
        sub = w.hubs[0].subscribe(q, start="earliest")
        await settle()
        with pytest.raises(ValueError):
            await sub.receive()


async def _read_all(sub: Subscription, count: int) -> list[bytes]:
    got: list[bytes] = []
    with trio.fail_after(5):
        while len(got) < count:
            deliveries = await sub.receive()
            sub.ack_many(d.tag for d in deliveries)
            got += [d.message.body for d in deliveries]
    return got


async def test_a_durable_log_at_worker_0_written_through_proxies_reads_back_whole(
    tmp_path: Path,
) -> None:
    name = "d.kept"
    bodies = [b"w%d-%d" % (w, i) for w in (1, 2) for i in range(50)]
    async with Store.open(tmp_path / "store", fsync="never") as store, mesh(3, store) as w:
        _x, one, two = w.hubs
        assert isinstance(one.destination(name), RemoteDestination)
        r1 = await one.publish([Message(name, b) for b in bodies[:50]])
        r2 = await two.publish([Message(name, b) for b in bodies[50:]])
        with trio.fail_after(5):
            assert await r1.wait() is Outcome.DELIVERED
            assert await r2.wait() is Outcome.DELIVERED
        # The home answered where it stored them: the publishers get the positions.
        stored = [r.result(i).positions[name].offset for r in (r1, r2) for i in range(50)]
        assert sorted(stored) == list(range(100))
        reader = one.subscribe(name, start="earliest", end="latest")
        got = await _read_all(reader, 100)
        assert sorted(got) == sorted(bodies)
        with pytest.raises(trio.EndOfChannel):
            await reader.receive()
        await settle()  # the last acks reach the home, and its committed position comes back
        assert reader.committed == Position(100)
    async with Store.open(tmp_path / "store", fsync="never") as store:
        catalog = Catalog(SPECS, TopicLimits(1 << 20, 1000))
        catalog.store = store
        hub = Hub(providers=[catalog])
        again = hub.subscribe(name, start="earliest", end="latest")
        assert sorted(await _read_all(again, 100)) == sorted(bodies)
        hub.close()


def _bodies(deliveries: Sequence[Delivery]) -> list[bytes]:
    return [d.message.body for d in deliveries]
