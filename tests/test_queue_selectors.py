"""Selectors on queues: each consumer of a queue may carry its own filter.

A message goes to one consumer whose selector matches (a consumer without one
matches everything); a message no present consumer matches stays queued,
counted as ``unmatched``, until one comes. The same suite runs against the
three queues: the in-memory :class:`~gateway.core.topic.Topic` queue, the
:class:`~gateway.core.memory_log.MemoryLog` queue and the
:class:`~gateway.durable.log.DurableLog` queue (which also survives a restart).
End to end: an ndjson ``sub`` with a filter, and a ttrpc ``Consume`` with one.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from harness import host_port, receive_now, running_gateway, settle, start
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver
from waits import subscribed

from gateway.core.destination import Delivery, Destination, EndOfStream, Subscription
from gateway.core.facade import HubFacade
from gateway.core.filters import Filter
from gateway.core.hub import Hub
from gateway.core.memory_log import MemoryLog
from gateway.core.model import Message, Source
from gateway.core.receipts import Receipt
from gateway.core.topic import Topic, TopicLimits
from gateway.durable.log import DurableLog
from gateway.durable.partitioned import PartitionedLog
from gateway.ops.status import snapshot
from gateway.runtime.catalog import Catalog, DestinationSpec
from gateway.store import Store
from protocols.ttrpc import messaging_pb2 as pb
from protocols.ttrpc.client import Client, ClientCall, open_client
from protocols.ttrpc.codec import CallKind
from protocols.ttrpc.messaging import SERVICE, messaging_service
from protocols.ttrpc.server import TtrpcSession

BIG = 10**9
A, B, C = (Filter.equals(k=k) for k in "abc")

#: ``(retain_bytes=…, overflow=…) -> Destination``: a queue named "q".
MakeQueue = Callable[..., Destination]


@pytest.fixture(params=["topic", "memory-log", "durable-log"])
async def make_queue(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MakeQueue]:
    """A factory of queues of one implementation (a durable one in a store of its own)."""
    async with contextlib.AsyncExitStack() as stack:
        store = None
        if request.param == "durable-log":
            store = await stack.enter_async_context(Store.open(tmp_path, fsync="never"))
        made: list[Destination] = []

        def make(**options: Any) -> Destination:
            queue: Destination
            if store is not None:
                segment = store.segment("q")
                assert segment is not None
                queue = DurableLog("q", segment, store, kind="queue", retain_bytes=BIG, **options)
            elif request.param == "memory-log":
                queue = MemoryLog("q", kind="queue", retain_bytes=BIG, **options)
            else:
                queue = Topic("q", kind="queue")
            made.append(queue)
            return queue

        try:
            yield make
        finally:
            for queue in made:
                queue.close()


def job(k: str, n: int) -> Message:
    """Job ``n`` of kind ``k`` (header ``k``), body ``b"<k><n>"``."""
    return Message("q", b"%s%d" % (k.encode(), n), {"k": k})


async def publish(queue: Destination, messages: Sequence[Message]) -> Receipt:
    receipt = Receipt(len(messages))
    await queue.put_many(messages, receipt)
    receipt.seal()
    return receipt


def bodies(deliveries: Sequence[Delivery]) -> list[bytes]:
    return [d.message.body for d in deliveries]


def ack_all(sub: Subscription, deliveries: Sequence[Delivery]) -> None:
    sub.ack_many([d.tag for d in deliveries])


def unmatched(queue: Destination) -> int | None:
    return queue.figures().unmatched


# -- every implementation -------------------------------------------------------------------


async def test_several_consumers_get_each_message_exactly_once(make_queue: MakeQueue) -> None:
    queue = make_queue()
    jobs = [job("abc"[i % 3], i) for i in range(30)]
    await publish(queue, jobs)
    only_a = queue.subscribe(filter=A, max_unacked=2)
    only_b = queue.subscribe("named", filter=B, max_unacked=3)
    anyone = queue.subscribe(max_unacked=4)
    assert {s.group for s in (only_a, only_b, anyone)} == {"queue"}
    assert (only_a.filter, anyone.filter) == (A, None)
    got: dict[str, list[Delivery]] = {"a": [], "b": [], "*": []}
    for _ in range(40):
        for key, sub in (("a", only_a), ("b", only_b), ("*", anyone)):
            taken = await receive_now(sub)
            got[key] += taken
            ack_all(sub, taken)
    everything = [b for taken in got.values() for b in bodies(taken)]
    assert sorted(everything) == sorted(m.body for m in jobs), "each exactly once"
    assert all(d.message.headers["k"] == "a" for d in got["a"])
    assert all(d.message.headers["k"] == "b" for d in got["b"])
    assert all(got.values()), "every consumer took a share"
    assert not any(d.redelivered for taken in got.values() for d in taken)
    assert unmatched(queue) == 0


async def test_unacked_messages_of_a_consumer_that_leaves_go_to_a_matching_one(
    make_queue: MakeQueue,
) -> None:
    queue = make_queue()
    await publish(queue, [job("a", 0), job("b", 1), job("a", 2), job("b", 3)])
    first = queue.subscribe(filter=A)
    other = queue.subscribe(filter=B, max_unacked=1)
    taken = await receive_now(first)
    assert bodies(taken) == [b"a0", b"a2"]
    (b1,) = await receive_now(other)
    assert b1.message.body == b"b1"
    later = queue.subscribe(filter=A)
    assert await receive_now(later) == [], "nothing for it while the first holds them"
    first.close()  # disconnects with both unacked
    assert await receive_now(other) == [], "the other selector does not match them"
    again = await receive_now(later)
    assert [(d.message.body, d.redelivered) for d in again] == [(b"a0", True), (b"a2", True)]
    ack_all(later, again)
    other.ack(b1.tag)
    (b3,) = await receive_now(other)
    assert (b3.message.body, b3.redelivered) == (b"b3", False)


async def test_selectors_route_and_unmatched_messages_wait(make_queue: MakeQueue) -> None:
    queue = make_queue()
    assert unmatched(queue) == 0
    only_a = queue.subscribe(filter=A)
    only_b = queue.subscribe(filter=B)
    await publish(queue, [job("a", 0), job("c", 1), job("b", 2), job("c", 3), job("a", 4)])
    assert bodies(await receive_now(only_a)) == [b"a0", b"a4"]
    assert bodies(await receive_now(only_b)) == [b"b2"]
    assert unmatched(queue) == 2, "c1 and c3: no present consumer matches them"
    (group,) = queue.figures().groups
    assert (group.unmatched, group.filter) == (2, None)
    assert queue.stats()["groups"]["queue"]["unmatched"] == 2  # type: ignore[index]
    only_c = queue.subscribe(filter=C, max_unacked=1)
    assert unmatched(queue) == 0
    (c1,) = await receive_now(only_c)
    assert (c1.message.body, c1.redelivered) == (b"c1", False), "never delivered before"
    only_c.close()  # gives c1 back
    assert unmatched(queue) == 2
    anyone = queue.subscribe()
    assert unmatched(queue) == 0, "a consumer without a selector takes anything"
    rest = await receive_now(anyone)
    assert [(d.message.body, d.redelivered) for d in rest] == [(b"c1", True), (b"c3", False)]


async def test_a_selective_consumer_keeps_to_its_credit_and_window(make_queue: MakeQueue) -> None:
    queue = make_queue()
    await publish(queue, [job("ab"[i % 2], i) for i in range(10)])
    sub = queue.subscribe(filter=B, credit=2, max_unacked=3)
    got = await receive_now(sub)
    assert bodies(got) == [b"b1", b"b3"]
    assert await receive_now(sub) == [], "no credit left"
    sub.grant(5)
    got += await receive_now(sub)
    assert bodies(got[2:]) == [b"b5"], "the window holds 3"
    ack_all(sub, got)
    assert bodies(await receive_now(sub)) == [b"b7", b"b9"]
    assert bodies(await receive_now(queue.subscribe())) == [b"a%d" % i for i in range(0, 10, 2)]


async def test_a_waiting_selective_consumer_wakes_for_a_match_only(make_queue: MakeQueue) -> None:
    queue = make_queue()
    sub = queue.subscribe(filter=A)
    async with trio.open_nursery() as nursery:
        waiting = start(nursery, sub.receive)
        await publish(queue, [job("b", 0)])
        await settle()
        assert not waiting.done
        await publish(queue, [job("a", 1)])
        got = await waiting.wait()
    assert bodies(got) == [b"a1"]


async def test_a_selective_consumer_that_nacks_gets_it_again(make_queue: MakeQueue) -> None:
    queue = make_queue()
    await publish(queue, [job("b", 0), job("a", 1)])
    sub = queue.subscribe(filter=A)
    (a1,) = await receive_now(sub)
    sub.nack(a1.tag)
    (again,) = await receive_now(sub)
    assert (again.message.body, again.redelivered) == (b"a1", True)
    assert unmatched(queue) == 1


# -- logs: retention --------------------------------------------------------------------------


@pytest.fixture
def memory_queue() -> MakeQueue:
    def make(*, retain_bytes: int = BIG, **options: Any) -> Destination:
        return MemoryLog("q", kind="queue", retain_bytes=retain_bytes, **options)

    return make


async def test_held_messages_hold_retention_like_unacked_ones(memory_queue: MakeQueue) -> None:
    size = job("b", 0).size
    queue = memory_queue(retain_bytes=3 * size)
    only_a = queue.subscribe(filter=A)
    await publish(queue, [job("b", i) for i in range(3)])
    assert await receive_now(only_a) == []
    assert unmatched(queue) == 3
    async with trio.open_nursery() as nursery:
        blocked = start(nursery, publish, queue, [job("a", 3)])
        await settle()
        assert not blocked.done, "the held messages fill the log: the publisher waits"
        assert queue.figures().full
        anyone = queue.subscribe()
        got = await receive_now(anyone)
        assert [(d.message.body, d.redelivered) for d in got] == [
            (b"b0", False),
            (b"b1", False),
            (b"b2", False),
        ]
        anyone.ack(got[0].tag)
        await blocked.wait()
    assert bodies(await receive_now(only_a)) == [b"a3"]


async def test_drop_oldest_drops_held_messages_and_counts_them(memory_queue: MakeQueue) -> None:
    size = job("b", 0).size
    queue = memory_queue(retain_bytes=3 * size, overflow="drop_oldest")
    only_a = queue.subscribe(filter=A)
    await publish(queue, [job("b", i) for i in range(3)])
    assert await receive_now(only_a) == []
    await publish(queue, [job("a", 3), job("a", 4)])
    (group,) = queue.figures().groups
    assert group.dropped == 2, "b0 and b1 were held for a consumer that never came"
    assert bodies(await receive_now(only_a)) == [b"a3", b"a4"]
    assert bodies(await receive_now(queue.subscribe())) == [b"b2"]


async def test_a_finite_read_with_a_selector_ends_past_what_it_does_not_match(
    memory_queue: MakeQueue,
) -> None:
    queue = memory_queue()
    await publish(queue, [job("a", 0), job("b", 1), job("a", 2), job("c", 3)])
    reader = queue.subscribe(filter=A, end="latest", credit=1)
    assert bodies(await receive_now(reader)) == [b"a0"]
    assert await receive_now(reader) == [], "a2 waits for credit: not the end yet"
    reader.grant(5)
    got = await receive_now(reader)
    assert bodies(got) == [b"a2"]
    with pytest.raises(EndOfStream):
        await receive_now(reader)  # b1 and c3 wait for other consumers
    assert unmatched(queue) == 2, "b1 and c3: still held, for consumers to come"


async def test_unmatched_looks_at_a_bounded_number_of_waiting_entries(
    memory_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = memory_queue()
    only_a = queue.subscribe(filter=A, max_unacked=1)
    await publish(queue, [job("c", i) for i in range(6)] + [job("a", 6), job("a", 7)])
    assert bodies(await receive_now(only_a)) == [b"a6"]  # c0-c5 passed over, a7 waits
    assert unmatched(queue) == 6
    monkeypatch.setattr("gateway.core.log.UNMATCHED_SCAN", 4)
    assert unmatched(queue) == 4, "a status poll never reads the whole log back"


async def test_a_partitioned_durable_queue_takes_selectors(tmp_path: Path) -> None:
    async with Store.open(tmp_path, fsync="never") as store:
        parts = []
        for p in range(2):
            segment = store.segment(f"q/{p}")
            assert segment is not None
            parts.append(
                DurableLog("q", segment, store, partition=p, retain_bytes=BIG, kind="queue")
            )
        queue = PartitionedLog("q", parts, partition_key="k")
        try:
            await publish(queue, [job("abc"[i % 3], i) for i in range(9)])
            only_b = queue.subscribe(filter=B)
            assert sorted(bodies(await receive_now(only_b))) == [b"b1", b"b4", b"b7"]
            assert unmatched(queue) == 6, "a and c, held in both partitions, summed"
            assert [g.unmatched for g in queue.figures().groups] == [6]
            rest = await receive_now(queue.subscribe())
            assert unmatched(queue) == 0
            assert sorted(bodies(rest)) == [b"a0", b"a3", b"a6", b"c2", b"c5", b"c8"]
        finally:
            queue.close()


# -- a durable queue across a restart -------------------------------------------------------------


@asynccontextmanager
async def durable_queue(directory: Path) -> AsyncIterator[DurableLog]:
    async with Store.open(directory, fsync="never") as store:
        segment = store.segment("q")
        assert segment is not None
        queue = DurableLog("q", segment, store, retain_bytes=BIG, kind="queue")
        try:
            yield queue
        finally:
            queue.close()


async def test_a_durable_queue_with_selectors_survives_a_restart(tmp_path: Path) -> None:
    async with durable_queue(tmp_path) as queue:
        await publish(queue, [job("a", 0), job("b", 1), job("a", 2), job("c", 3), job("a", 4)])
        only_a = queue.subscribe(filter=A)
        ack_all(only_a, await receive_now(only_a))
        only_b = queue.subscribe(filter=B)
        assert bodies(await receive_now(only_b)) == [b"b1"]  # not acked
        assert unmatched(queue) == 1  # c3
        (group,) = queue.figures().groups
        assert group.committed == 1, "b1 is unacked and c3 held: nothing past b1 commits"
    async with queue_reopened(tmp_path) as queue:
        only_c = queue.subscribe(filter=C)
        assert bodies(await receive_now(only_c)) == [b"c3"], "the held message is still there"
        only_b = queue.subscribe(filter=B)
        (b1,) = await receive_now(only_b)
        assert (b1.message.body, b1.redelivered) == (b"b1", False)
        ack_all(only_b, [b1])
        # At least once: acked above the committed position, a2 and a4 come again.
        anyone = queue.subscribe()
        assert bodies(await receive_now(anyone)) == [b"a2", b"a4"]


queue_reopened = durable_queue


# -- end to end -------------------------------------------------------------------------------


def ndjson_config() -> dict[str, Any]:
    return {
        "gateway": {"drain_timeout": "2s"},
        "listeners": [
            {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "jobs"}
        ],
        "destinations": [{"name": "jobs", "kind": "queue"}],
        "metrics": {"bind": "127.0.0.1:0"},
    }


async def next_deliver(c: NdjsonClient) -> Deliver:
    with trio.fail_after(5):
        event = await c.receive()
    assert isinstance(event, Deliver), event
    return event


async def test_an_ndjson_sub_with_a_filter_on_a_queue() -> None:
    async with running_gateway(ndjson_config()) as gw:
        host, port = host_port(gw.addresses["nd"][0])
        connect = NdjsonClient.connect
        async with await connect(host, port) as pub, await connect(host, port) as a:
            await a.subscribe("jobs", filter=Filter.from_json({"k": "a"}))
            await subscribed(gw, "jobs")
            ids = []
            for k in "bab":
                ids += await pub.publish_nowait([k.encode()], "jobs", headers={"k": k})
            d = await next_deliver(a)
            assert (d.body, d.headers) == (b"a", {"k": "a"})
            await a.ack(d.tag)
            with trio.fail_after(5):
                while gw.hub.destination("jobs").figures().unmatched != 2:
                    await trio.sleep(0.01)
            # The status page, its hints and the metrics say why the two b's wait.
            (jobs,) = snapshot(gw)["destinations"]
            assert (jobs["unmatched"], jobs["groups"][0]["unmatched"]) == (2, 2)
            texts = [h["text"] for h in snapshot(gw)["hints"]]
            assert any("2 messages wait for a consumer whose selector matches" in t for t in texts)
            assert not any("no credit" in t for t in texts), texts
            gauge = "interchange_queue_unmatched_messages"
            assert gw.metrics.value(gauge, {"destination": "jobs"}) == 2
            async with await connect(host, port) as b:
                await b.subscribe("jobs", filter=Filter.from_json({"k": "b"}))
                got = [await next_deliver(b), await next_deliver(b)]
                assert [x.body for x in got] == [b"b", b"b"]
                await b.ack(*(x.tag for x in got))
                with trio.fail_after(5):
                    answers = await pub.wait_answers(ids)
    assert [x.status for x in answers] == ["delivered"] * 3


@asynccontextmanager
async def ttrpc_gateway() -> AsyncIterator[tuple[Hub, trio.SocketListener]]:
    """A hub with the queue ``jobs``, and a TCP listener serving the messaging service."""
    hub = Hub(providers=[Catalog([DestinationSpec("jobs", kind="queue")], TopicLimits())])
    facade = HubFacade(hub)

    def source() -> Source:
        return Source("ttrpc", "messaging", "127.0.0.1:4242")

    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.run)

            async def serve(stream: trio.SocketStream) -> None:
                service = messaging_service(facade, source)
                async with stream:
                    with contextlib.suppress(trio.BrokenResourceError):
                        await TtrpcSession(stream, {SERVICE: service}).run()

            listeners = await nursery.start(trio.serve_tcp, serve, 0)
            yield hub, listeners[0]
            nursery.cancel_scope.cancel()
    finally:
        hub.close()


@asynccontextmanager
async def ttrpc_client(listener: trio.SocketListener) -> AsyncIterator[Client]:
    stream = await trio.testing.open_stream_to_socket_listener(listener)
    async with open_client(stream) as client:
        yield client


async def ttrpc_publish(client: Client, k: str) -> Any:
    m = pb.Message(destination="jobs", body=k.encode(), headers={"k": k})
    request = pb.PublishRequest(messages=[m]).SerializeToString()
    return pb.PublishResponse.FromString(await client.call(SERVICE, "Publish", request))


async def nothing_more(call: ClientCall, seconds: float = 1.0) -> bool:
    with trio.move_on_after(seconds):
        await call.receive()
        return False
    return True


async def test_a_ttrpc_consume_with_a_filter_on_a_queue(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async with ttrpc_gateway() as (hub, listener), ttrpc_client(listener) as c:
        subscribe = pb.SubscribeRequest(destination="jobs", filter='{"k": "a"}')
        async with c.stream(SERVICE, "Consume", CallKind.BIDI) as s:
            await s.send(pb.ConsumeRequest(subscribe=subscribe).SerializeToString())
            await settle()
            held = start(nursery, ttrpc_publish, c, "b")
            taken = start(nursery, ttrpc_publish, c, "a")
            d = pb.Delivery.FromString(await s.receive())
            assert d.message.body == b"a"
            assert await nothing_more(s), "b is not for this consumer"
            assert hub.destination("jobs").figures().unmatched == 1
            await s.send(pb.ConsumeRequest(acks=[d.tag]).SerializeToString())
            assert (await taken.wait()).outcome == pb.OUTCOME_DELIVERED
            assert not held.done
        consumer = hub.subscribe("jobs")
        (b,) = await receive_now(consumer)
        consumer.ack(b.tag)
        assert (await held.wait()).outcome == pb.OUTCOME_DELIVERED


# -- a random walk ------------------------------------------------------------------------------

_SELECTORS = {"a": A, "b": B, "c": C, None: None}
_op = st.one_of(
    st.tuples(st.just("pub"), st.sampled_from("abc")),
    st.tuples(st.just("sub"), st.sampled_from(["a", "b", "c", None]), st.integers(1, 3)),
    st.tuples(st.just("take"), st.integers(0, 5), st.integers(1, 4)),
    st.tuples(st.just("ack"), st.integers(0, 5)),
    st.tuples(st.just("nack"), st.integers(0, 5)),
    st.tuples(st.just("close"), st.integers(0, 5)),
)


class _Walk:
    """A queue driven by random operations, checked against what it must do."""

    def __init__(self, queue: Destination) -> None:
        self.queue = queue
        self.published: list[Message] = []
        self.members: list[tuple[Subscription, str | None, list[Delivery]]] = []
        self.delivered: set[bytes] = set()
        self.outstanding: set[bytes] = set()
        self.acked: set[bytes] = set()
        self.windows: dict[int, int] = {}

    async def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "pub":
            message = job(op[1], len(self.published))
            self.published.append(message)
            await publish(self.queue, [message])
        elif kind == "sub":
            sub = self.queue.subscribe(filter=_SELECTORS[op[1]], max_unacked=op[2])
            self.members.append((sub, op[1], []))
            self.windows[id(sub)] = op[2]
        elif self.members:
            sub, selector, held = self.members[op[1] % len(self.members)]
            if kind == "take":
                room = min(op[2], self.windows[id(sub)] - len(held))
                got = sub.take(op[2])
                self.took(selector, held, got)
                if len(got) < room:
                    self.check_none_left_for(selector)
            elif kind == "close":
                sub.close()
                self.outstanding.difference_update(d.message.body for d in held)
                self.members.remove((sub, selector, held))
            elif held:
                d = held.pop(0)
                self.outstanding.discard(d.message.body)
                if kind == "ack":
                    sub.ack(d.tag)
                    assert d.message.body not in self.acked, "acked twice"
                    self.acked.add(d.message.body)
                else:
                    sub.nack(d.tag)
        self.check_unmatched()

    def took(self, selector: str | None, held: list[Delivery], got: list[Delivery]) -> None:
        for d in got:
            body = d.message.body
            assert selector in (None, d.message.headers["k"]), "the selector does not match"
            assert body not in self.outstanding, "delivered to two consumers at once"
            assert body not in self.acked, "delivered again after it was acked"
            assert d.redelivered == (body in self.delivered), "redelivered is not honest"
            self.delivered.add(body)
            self.outstanding.add(body)
        held += got

    def check_none_left_for(self, selector: str | None) -> None:
        """A take that had room and stopped short left no waiting message it matches."""
        left = [
            m.body
            for m in self.published
            if m.body not in self.acked
            and m.body not in self.outstanding
            and selector in (None, m.headers["k"])
        ]
        assert not left, f"a consumer with room was not given {left}"

    def check_unmatched(self) -> None:
        selectors = [s for _, s, _ in self.members]
        waiting = [
            m for m in self.published if m.body not in self.acked and m.body not in self.outstanding
        ]
        expected = 0
        if selectors and None not in selectors:
            expected = sum(m.headers["k"] not in selectors for m in waiting)
        assert unmatched(self.queue) == expected

    def drain(self) -> None:
        """Ack what every consumer holds, then let a consumer without a selector take
        the rest: every message was acked exactly once."""
        for sub, _, held in self.members:
            for d in held:
                self.outstanding.discard(d.message.body)
                assert d.message.body not in self.acked, "acked twice"
                self.acked.add(d.message.body)
            sub.ack_many([d.tag for d in held])
            held.clear()
        anyone = self.queue.subscribe()
        while got := anyone.take():
            self.took(None, [], got)
            for d in got:
                self.outstanding.discard(d.message.body)
                assert d.message.body not in self.acked, "acked twice"
                self.acked.add(d.message.body)
            anyone.ack_many([d.tag for d in got])
        assert self.acked == {m.body for m in self.published}, "a message was lost"
        assert unmatched(self.queue) == 0


@contextlib.contextmanager
def _walk_queue(kind: str) -> Iterator[Destination]:
    """A fresh queue of ``kind`` for one example (a durable one in a temporary store)."""
    if kind == "topic":
        yield Topic("q", kind="queue")
        return
    if kind == "memory-log":
        yield MemoryLog("q", kind="queue", retain_bytes=BIG)
        return
    with tempfile.TemporaryDirectory() as directory:
        # Not Store.open: the walk is a sync test that runs trio itself (as in
        # tests/test_memlog.py); under fsync="never" nothing here needs the committer.
        store = Store(Path(directory), fsync="never")
        store._recover()
        segment = store.segment("q")
        assert segment is not None
        queue = DurableLog("q", segment, store, kind="queue", retain_bytes=BIG)
        try:
            yield queue
        finally:
            queue.close()
            for chunk in segment.chunks:
                chunk.close()


@pytest.mark.parametrize("kind", ["topic", "memory-log", "durable-log"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=40))
def test_random_operations_deliver_each_message_once_to_a_matching_consumer(
    kind: str, ops: list[tuple[Any, ...]]
) -> None:
    """Any interleaving of publish/subscribe/take/ack/nack/close: a delivery matches its
    consumer's selector, no message is held by two consumers or delivered after its
    ack, ``redelivered`` is set exactly for messages delivered before, ``unmatched``
    counts the waiting messages no present selector matches, and in the end every
    message was acked once."""

    async def main() -> None:
        with _walk_queue(kind) as queue:
            walk = _Walk(queue)
            for op in ops:
                await walk.apply(op)
            walk.drain()

    trio.run(main)
