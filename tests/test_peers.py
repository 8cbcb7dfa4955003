"""In-memory topics across workers: the link's framing, and two hubs joined by links.

The hub-level tests join two hubs as two workers would, each with its
:class:`~gateway.core.peers.Peers`, over trio memory streams driven by the same
driver the workers run over unix sockets (one stream pair each way).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest
import trio
import trio.testing
from harness import receive_now, settle, start

from gateway.core.hub import Hub
from gateway.core.model import Message, Outcome, Source
from gateway.core.peers import Peers
from gateway.core.peerwire import (
    Answer,
    Batch,
    Failure,
    Frame,
    Hello,
    Interest,
    PeerWire,
    WireError,
)
from gateway.core.reasons import Reason
from gateway.runtime.peerlinks import drive_incoming, drive_outgoing

# -- the framing ----------------------------------------------------------------------


def test_frames_have_fixed_bytes() -> None:
    wire = PeerWire()
    assert wire.encode(Hello(1, 0)) == b"\x00\x00\x00\x04\x93\x00\x01\x00"
    assert wire.encode(Hello(1, 2, 300)) == b"\x00\x00\x00\x07\x94\x00\x01\x02\xcd\x01\x2c"
    assert wire.encode(Batch(7, "t", (Message("t", b"hi"),))) == (
        b"\x00\x00\x00\x0a\x94\x02\x07\xa1t\x91\xc4\x02hi"
    )
    assert wire.encode(Interest(("a",), ())) == b"\x00\x00\x00\x06\x93\x01\x91\xa1a\x90"
    assert wire.encode(Answer(7)) == b"\x00\x00\x00\x04\x93\x03\x07\x90"


def test_frames_fed_byte_by_byte_decode_to_what_was_sent() -> None:
    source = Source("ndjson", "nd", "127.0.0.1:5", received_at=1.5, upstream="")
    frames: list[Frame] = [
        Hello(1, 3),
        Hello(1, 3, 4242),
        Interest(("a", "b"), ("c",)),
        Batch(
            1,
            "t",
            (
                Message("t", b"plain"),
                Message("t", b"rich", {"k": "v"}, "text/plain", source),
            ),
        ),
        Answer(1, (Failure(1, Outcome.FAILED, "nacked", Reason.REFUSED_BY_TARGET),)),
    ]
    sender, receiver = PeerWire(), PeerWire()
    data = b"".join(sender.encode(f) for f in frames)
    got = []
    for i in range(len(data)):
        got += receiver.receive_data(data[i : i + 1])
    assert got == frames
    assert receiver.pending == 0


def test_a_frame_over_the_bound_or_not_a_frame_is_refused() -> None:
    with pytest.raises(WireError, match="exceeds the bound"):
        PeerWire(max_frame=8).receive_data(PeerWire().encode(Interest(("a-long-name",))))
    with pytest.raises(WireError, match="unknown frame type"):
        PeerWire().receive_data(b"\x00\x00\x00\x02\x91\x09")


# -- two hubs, two workers ------------------------------------------------------------


@dataclass
class Pair:
    a: Hub
    b: Hub
    peers_a: Peers
    peers_b: Peers
    #: Cancels the links (as a worker that dies does).
    links: trio.CancelScope


@asynccontextmanager
async def two_workers(max_link_bytes: int = 1024 * 1024) -> AsyncIterator[Pair]:
    a, b = Hub(), Hub()
    peers_a, peers_b = Peers(0, max_link_bytes), Peers(1, max_link_bytes)
    a.join(peers_a)
    b.join(peers_b)
    async with trio.open_nursery() as nursery:
        links = trio.CancelScope()

        async def run_links() -> None:
            with links:
                async with trio.open_nursery() as inner:
                    for me, other, index in ((peers_a, peers_b, 1), (peers_b, peers_a, 0)):
                        dialled, accepted = trio.testing.memory_stream_pair()
                        inner.start_soon(drive_outgoing, me, index, dialled)
                        inner.start_soon(drive_incoming, other, accepted)

        nursery.start_soon(run_links)
        await settle()
        yield Pair(a, b, peers_a, peers_b, links)
        nursery.cancel_scope.cancel()


async def test_a_publish_reaches_the_other_workers_subscriber_and_settles_on_its_ack() -> None:
    async with two_workers() as w, trio.open_nursery() as nursery:
        sub = w.b.subscribe("t")
        await settle()
        assert w.peers_a.outgoing[1].interest == {"t"}
        receipt = await w.a.publish([Message("t", b"one"), Message("t", b"two")])
        await settle()
        deliveries = await receive_now(sub)
        assert [d.message.body for d in deliveries] == [b"one", b"two"]
        assert not receipt.done(), "settled before the remote subscriber acked"
        sub.ack(deliveries[0].tag)
        await settle()
        assert not receipt.done()
        sub.ack(deliveries[1].tag)
        waited = start(nursery, receipt.wait)
        await settle()
        assert waited.result is Outcome.DELIVERED
        assert w.peers_a.messages_sent == 2


async def test_both_workers_subscribers_must_ack() -> None:
    async with two_workers() as w:
        local, remote = w.a.subscribe("t"), w.b.subscribe("t")
        await settle()
        receipt = await w.a.publish([Message("t", b"x")])
        await settle()
        (mine,) = await receive_now(local)
        local.ack(mine.tag)
        await settle()
        assert not receipt.done()
        (theirs,) = await receive_now(remote)
        remote.nack(theirs.tag, requeue=False, reason="no thanks")
        await settle()
        assert receipt.outcome is Outcome.FAILED
        assert receipt.result(0).reason == "no thanks"


async def test_no_interest_no_crossing() -> None:
    async with two_workers() as w:
        sub = w.b.subscribe("other")
        await settle()
        receipt = await w.a.publish([Message("t", b"x")])
        assert receipt.outcome is Outcome.DELIVERED  # nobody listens anywhere
        assert w.peers_a.messages_sent == 0
        sub.close()
        await settle()
        assert w.peers_a.outgoing[1].interest == set()
        receipt = await w.a.publish([Message("other", b"x")])
        assert receipt.outcome is Outcome.DELIVERED
        assert w.peers_a.messages_sent == 0


async def test_a_broken_link_fails_what_it_had_not_answered() -> None:
    async with two_workers() as w:
        sub = w.b.subscribe("t")
        await settle()
        receipt = await w.a.publish([Message("t", b"x")])
        await settle()
        assert len(await receive_now(sub)) == 1
        w.links.cancel()  # worker 1 died
        await settle()
        assert receipt.outcome is Outcome.FAILED
        assert "link to worker 1 broke" in receipt.reason
        assert w.peers_a.outgoing == {}
        again = await w.a.publish([Message("t", b"y")])
        assert again.outcome is Outcome.DELIVERED  # no link, no interest: nobody listens


async def test_a_full_link_makes_the_publisher_wait() -> None:
    async with two_workers(max_link_bytes=600) as w, trio.open_nursery() as nursery:
        sub = w.b.subscribe("t")
        await settle()
        first = await w.a.publish([Message("t", b"a" * 400)])
        second = start(nursery, w.a.publish, [Message("t", b"b" * 400)])
        await settle()
        assert not second.done, "a second batch went over the link's bound"
        (d,) = await receive_now(sub)
        sub.ack(d.tag)
        await settle()
        assert first.outcome is Outcome.DELIVERED
        assert second.done


async def test_the_forwarding_is_in_the_workers_metrics() -> None:
    from gateway.ops.metrics import HubCollector

    async with two_workers() as w:
        w.b.subscribe("t")
        await settle()
        await w.a.publish([Message("t", b"x")] * 3)
        await settle()
        samples = {
            s.name: s.value
            for family in HubCollector(w.a).collect()
            for s in family.samples
            if s.name.startswith("interchange_worker_")
        }
    assert samples == {
        "interchange_worker_forwarded_messages_total": 3,
        "interchange_worker_forwarded_batches_total": 1,
        "interchange_worker_links": 1,
        "interchange_worker_interest": 0,
    }
    assert not any(
        s.name.startswith("interchange_worker_")
        for family in HubCollector(Hub()).collect()
        for s in family.samples
    )


# -- a worker replaced ------------------------------------------------------------------


async def test_a_new_incarnation_of_a_worker_ends_the_link_to_its_predecessor() -> None:
    """A replacement links to the others while its predecessor drains; their
    links to the predecessor end, so that they dial again and reach the new one."""
    peers = Peers(0, incarnation=100)
    link = peers.connected(1)
    link.received(PeerWire().encode(Hello(1, 1, 200)))  # the worker it reached
    assert link.incarnation == 200
    same = peers.accepted()
    await same.received(PeerWire().encode(Hello(1, 1, 200)))
    assert not link.closed, "its own link back made it dial again"
    receipt_of_old = peers.accepted()
    await receipt_of_old.received(PeerWire().encode(Hello(1, 1, 0)))
    assert not link.closed, "a hello that names no incarnation ended the link"
    replacement = peers.accepted()
    await replacement.received(PeerWire().encode(Hello(1, 1, 201)))
    assert link.closed
    assert peers.link(1) is None
