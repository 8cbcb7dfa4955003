"""The ``interchange.v1.Messaging`` ttrpc service over real TCP sockets: a real hub (topics,
queues, memory and durable logs from a catalog), served by ``TtrpcSession`` and driven by
the trio ttrpc client. Publish results and positions, backpressure and refusals,
Subscribe (filters, bounds, its end), Consume (credit, window, ack, nack, redelivery,
replies), Call (answered by a hub subscriber or a ttrpc consumer, unanswered, timed out),
request errors and shutdown."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from harness import settle, start

from gateway.core.destination import Subscription
from gateway.core.facade import HubFacade
from gateway.core.hub import Hub
from gateway.core.model import Message, Outcome, PeerIdentity, Reply, Source
from gateway.core.topic import TopicLimits
from gateway.runtime.catalog import Catalog, DestinationSpec
from gateway.store import Store
from protocols.ttrpc import Code, TtrpcError
from protocols.ttrpc import messaging_pb2 as pb
from protocols.ttrpc.client import Client, ClientCall, open_client
from protocols.ttrpc.codec import CallKind
from protocols.ttrpc.messaging import SERVICE, messaging_service
from protocols.ttrpc.server import TtrpcSession

SPECS = [
    # A log kept in memory: positions, replay, finite reads.
    DestinationSpec("mlog", retain=1 << 20),
    # A durable log in the segment store (when the test opens one).
    DestinationSpec("durable", retain=10**9, store="embedded"),
    # A queue that holds one message: the second publisher waits for room.
    DestinationSpec("small", kind="queue", buffer_messages=1),
    # A topic whose buffer no message over 100 bytes of body fits: refused for good.
    DestinationSpec("tiny", buffer_bytes=300),
    # Fixed-size elements of 4 bytes.
    DestinationSpec("fixed", element_size=4),
]

IDENTITY = PeerIdentity("CN=pub,O=Example", ("DNS:pub.example",), "ab12")
DELIVERED, FAILED, REJECTED = pb.OUTCOME_DELIVERED, pb.OUTCOME_FAILED, pb.OUTCOME_REJECTED


def source() -> Source:
    return Source("ttrpc", "messaging", "127.0.0.1:4242", IDENTITY, received_at=1700000000.5)


@dataclass
class Gateway:
    hub: Hub
    listener: trio.SocketListener

    @asynccontextmanager
    async def client(self) -> AsyncIterator[Client]:
        """A client on a connection of its own."""
        stream = await trio.testing.open_stream_to_socket_listener(self.listener)
        async with open_client(stream) as client:
            yield client

    def members(self, destination: str) -> dict[str, int]:
        """Group name -> members, of a topic or queue."""
        groups: dict[str, dict[str, Any]] = self.hub.destination(destination).stats()["groups"]
        return {name: g["members"] for name, g in groups.items()}


@asynccontextmanager
async def gateway(store_dir: Path | None = None, **options: Any) -> AsyncIterator[Gateway]:
    """A hub (with its call timers) and a TCP listener serving the messaging service."""
    store_cm = Store.open(store_dir, fsync="never") if store_dir else contextlib.nullcontext(None)
    async with store_cm as store:
        catalog = Catalog(SPECS, TopicLimits())
        catalog.store = store
        hub = Hub(providers=[catalog])
        facade = HubFacade(hub)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(hub.run)

                async def serve(stream: trio.SocketStream) -> None:
                    service = messaging_service(facade, source, **options)
                    async with stream:
                        with contextlib.suppress(trio.BrokenResourceError):
                            await TtrpcSession(stream, {SERVICE: service}).run()

                listeners = await nursery.start(trio.serve_tcp, serve, 0)
                yield Gateway(hub, listeners[0])
                nursery.cancel_scope.cancel()
        finally:
            hub.close()


@pytest.fixture
async def gw() -> AsyncIterator[Gateway]:
    async with gateway() as g:
        yield g


# -- helpers ------------------------------------------------------------------------------


def msg(destination: str, body: bytes, content_type: str | None = None, **headers: str) -> Any:
    m = pb.Message(destination=destination, body=body, headers=headers)
    if content_type is not None:
        m.content_type = content_type
    return m


async def publish(client: Client, *messages: Any, timeout: float | None = None) -> Any:
    request = pb.PublishRequest(messages=messages).SerializeToString()
    return pb.PublishResponse.FromString(
        await client.call(SERVICE, "Publish", request, timeout=timeout)
    )


async def call(client: Client, message: Any, timeout: float | None = None) -> Any:
    request = pb.CallRequest(message=message).SerializeToString()
    return pb.CallResponse.FromString(await client.call(SERVICE, "Call", request, timeout=timeout))


async def next_delivery(call: ClientCall) -> Any:
    return pb.Delivery.FromString(await call.receive())


async def nothing_more(call: ClientCall, seconds: float = 1.0) -> bool:
    """No message arrives within ``seconds`` (use with the autojump clock)."""
    with trio.move_on_after(seconds):
        await call.receive()
        return False
    return True


def consume_request(
    destination: str = "", group: str = "", credit: int | None = None, **fields: Any
) -> bytes:
    request = pb.ConsumeRequest(**fields)
    if destination:
        request.subscribe.destination = destination
        request.subscribe.group = group
    if credit is not None:
        request.credit = credit
    return bytes(request.SerializeToString())


def offsets(results: Any) -> list[dict[str, tuple[int, int]]]:
    return [{k: (p.offset, p.partition) for k, p in r.positions.items()} for r in results]


async def error_of(awaitable: Any) -> TtrpcError:
    with pytest.raises(TtrpcError) as info:
        await awaitable
    return info.value


# -- Publish ------------------------------------------------------------------------------


async def test_publish_batch_reports_each_outcome_and_position(gw: Gateway) -> None:
    async with gw.client() as c:
        response = await publish(
            c,
            msg("mlog", b"first", "text/plain", level="info"),
            msg("fixed", b"12345"),  # not one 4-byte element
            msg("mlog", b"second"),
            msg("tiny", b"x" * 200),  # larger than the buffer
            msg("fixed", b"1234"),
        )
    assert response.outcome == REJECTED
    assert "exactly 4 bytes" in response.reason
    results = response.results
    assert [r.outcome for r in results] == [DELIVERED, REJECTED, DELIVERED, REJECTED, DELIVERED]
    assert "exactly 4 bytes, not 5" in results[1].reason
    assert "exceeds the buffer of destination 'tiny'" in results[3].reason
    assert [r.reason for r in (results[0], results[2], results[4])] == ["", "", ""]
    assert offsets(results) == [{"mlog": (0, 0)}, {}, {"mlog": (1, 0)}, {}, {}]
    # What was stored is the message as sent, with the connection's source.
    with gw.hub.subscribe("mlog", start="earliest") as sub:
        stored = [d.message for d in await sub.receive()]
    assert stored == [
        Message("mlog", b"first", {"level": "info"}, "text/plain", source()),
        Message("mlog", b"second", {}, None, source()),
    ]


async def test_publish_to_a_durable_log_reports_stored_positions(tmp_path: Path) -> None:
    async with gateway(tmp_path / "store") as gw, gw.client() as c:
        first = await publish(c, *(msg("durable", b"m%d" % i) for i in range(3)))
        second = await publish(c, msg("durable", b"m3"))
    assert first.outcome == DELIVERED
    assert second.outcome == DELIVERED
    assert offsets(first.results) == [{"durable": (i, 0)} for i in range(3)]
    assert offsets(second.results) == [{"durable": (3, 0)}]


async def test_publish_answers_only_once_subscribers_acked(
    gw: Gateway, nursery: trio.Nursery
) -> None:
    with gw.hub.subscribe("logs", "readers") as sub:
        async with gw.client() as c:
            pending = start(nursery, lambda: publish(c, msg("logs", b"a"), msg("logs", b"b")))
            deliveries = await sub.receive()
            sub.ack(deliveries[0].tag)
            await settle()
            assert not pending.done, "one message is still unacked"
            sub.nack(deliveries[1].tag, requeue=False, outcome=Outcome.FAILED, reason="disk full")
            response = await pending.wait()
    assert [(r.outcome, r.reason) for r in response.results] == [
        (DELIVERED, ""),
        (FAILED, "disk full"),
    ]
    assert (response.outcome, response.reason) == (FAILED, "disk full")


async def test_publish_to_a_full_destination_waits_until_its_deadline(
    gw: Gateway, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async with gw.client() as c:
        first = start(nursery, lambda: publish(c, msg("small", b"1")))
        await settle()
        before = trio.current_time()
        error = await error_of(publish(c, msg("small", b"2"), timeout=5))
        assert error.code == Code.DEADLINE_EXCEEDED
        assert trio.current_time() - before == pytest.approx(5, abs=0.1)
        # The consumer takes the first message: its publisher is answered.
        with gw.hub.subscribe("small") as sub:
            (d,) = await sub.receive()
            sub.ack(d.tag)
            assert (await first.wait()).outcome == DELIVERED


async def test_publish_refuses_invalid_requests() -> None:
    async with gateway(max_batch=2) as gw, gw.client() as c:
        for payload, text in [
            (b"\xff\xff", "undecodable PublishRequest"),
            (b"", "a Publish needs at least one message"),
            (pb.PublishRequest(messages=[msg("a", b"")] * 3).SerializeToString(), "limit of 2"),
            (
                pb.PublishRequest(messages=[msg("a", b""), msg("", b"")]).SerializeToString(),
                "messages[1] has no destination",
            ),
        ]:
            error = await error_of(c.call(SERVICE, "Publish", payload))
            assert (error.code, text in error.message) == (Code.INVALID_ARGUMENT, True), error


async def test_an_empty_destination_is_the_default_one_when_configured() -> None:
    async with gateway(destination="mlog") as gw, gw.client() as c:
        response = await publish(c, msg("", b"x"))
    assert offsets(response.results) == [{"mlog": (0, 0)}]


# -- Subscribe ----------------------------------------------------------------------------


async def test_subscribe_receives_what_another_client_publishes(gw: Gateway) -> None:
    request = pb.SubscribeRequest(destination="logs").SerializeToString()
    async with (
        gw.client() as subscriber,
        subscriber.stream(SERVICE, "Subscribe", CallKind.SERVER_STREAMING, request) as s,
    ):
        await settle()
        assert list(gw.members("logs").values()) == [1]
        async with gw.client() as publisher:
            response = await publish(
                publisher, msg("logs", b"one", "text/plain", k="v"), msg("logs", b"two")
            )
        # Acked once written: the publisher was answered delivered.
        assert response.outcome == DELIVERED
        first, second = await next_delivery(s), await next_delivery(s)
    assert (first.message.body, second.message.body) == (b"one", b"two")
    assert first.message.destination == "logs"
    assert dict(first.message.headers) == {"k": "v"}
    assert first.message.content_type == "text/plain"
    assert not second.message.HasField("content_type")
    assert not first.redelivered
    assert not first.call
    assert not first.HasField("position")
    src = first.source
    assert (src.protocol, src.listener, src.peer, src.received_at) == (
        "ttrpc",
        "messaging",
        "127.0.0.1:4242",
        1700000000.5,
    )
    assert (src.identity.subject, list(src.identity.sans), src.identity.fingerprint) == (
        "CN=pub,O=Example",
        ["DNS:pub.example"],
        "ab12",
    )
    # The subscriber's connection closed (ttrpc has no cancel frame): the group is gone.
    await settle()
    assert gw.members("logs") == {}


async def test_subscribe_ends_at_its_deadline_and_leaves(
    gw: Gateway, autojump_clock: trio.testing.MockClock
) -> None:
    request = pb.SubscribeRequest(destination="logs", group="g").SerializeToString()
    async with gw.client() as c:
        async with c.stream(
            SERVICE, "Subscribe", CallKind.SERVER_STREAMING, request, timeout=5
        ) as s:
            await settle()
            assert gw.members("logs") == {"g": 1}
            error = await error_of(s.receive())
        assert error.code == Code.DEADLINE_EXCEEDED
        await settle()
        assert gw.members("logs") == {"g": 0}


async def test_subscribe_reads_a_log_from_a_position_to_its_end_with_a_filter(
    gw: Gateway,
) -> None:
    async with gw.client() as c:
        await publish(c, *(msg("mlog", b"%d" % i, n=str(i)) for i in range(6)))
        request = pb.SubscribeRequest(
            destination="mlog",
            start=pb.Bound(position=pb.Position(offset=1)),
            end=pb.Bound(edge=pb.EDGE_LATEST),
            filter='[["n", "!=", 3]]',
        )
        got = []
        async with c.stream(
            SERVICE, "Subscribe", CallKind.SERVER_STREAMING, request.SerializeToString()
        ) as s:
            async for data in s:  # ends OK at the end of the read
                got.append(pb.Delivery.FromString(data))
    assert [(d.message.body, d.position.offset) for d in got] == [
        (b"1", 1),
        (b"2", 2),
        (b"4", 4),
        (b"5", 5),
    ]
    assert all(d.HasField("position") for d in got)


async def test_subscribe_refuses_invalid_requests(gw: Gateway) -> None:
    cases = [
        (pb.SubscribeRequest(), Code.INVALID_ARGUMENT, "needs a destination"),
        (
            pb.SubscribeRequest(destination="logs", start=pb.Bound(edge=pb.EDGE_EARLIEST)),
            Code.INVALID_ARGUMENT,
            "keeps no log",
        ),
        (
            pb.SubscribeRequest(destination="mlog", end=pb.Bound(edge=pb.EDGE_EARLIEST)),
            Code.INVALID_ARGUMENT,
            "EDGE_LATEST or at a position",
        ),
        (pb.SubscribeRequest(destination="logs", filter="{"), Code.INVALID_ARGUMENT, "not JSON"),
        (
            pb.SubscribeRequest(destination="logs", filter='[["n", "~", 1]]'),
            Code.INVALID_ARGUMENT,
            "unknown operator",
        ),
        (pb.SubscribeRequest(destination="logs", window=10_001), Code.INVALID_ARGUMENT, "limit"),
        (pb.SubscribeRequest(destination="upstream:nope"), Code.NOT_FOUND, "no upstream"),
    ]
    async with gw.client() as c:
        for request, code, text in cases:
            async with c.stream(
                SERVICE, "Subscribe", CallKind.SERVER_STREAMING, request.SerializeToString()
            ) as s:
                error = await error_of(s.receive())
            assert (error.code, text in error.message) == (code, True), error


# -- Consume ------------------------------------------------------------------------------


@asynccontextmanager
async def consuming(
    client: Client, destination: str, group: str = "", credit: int | None = None, **sub: Any
) -> AsyncIterator[ClientCall]:
    """A Consume stream, subscribed (and the hub's subscription made) on entry."""
    async with client.stream(SERVICE, "Consume", CallKind.BIDI) as stream:
        request = pb.ConsumeRequest(
            subscribe=pb.SubscribeRequest(destination=destination, group=group, **sub)
        )
        if credit is not None:
            request.credit = credit
        await stream.send(request.SerializeToString())
        await settle()
        yield stream


async def test_consume_delivers_within_credit_only(
    gw: Gateway, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async with gw.client() as c, consuming(c, "jobs", "workers", credit=2) as s:
        pending = start(nursery, lambda: publish(c, *(msg("jobs", b"%d" % i) for i in range(5))))
        got = [await next_delivery(s), await next_delivery(s)]
        assert await nothing_more(s), "only 2 were granted"
        # Acks free no credit: only a grant does.
        await s.send(consume_request(acks=[d.tag for d in got]))
        assert await nothing_more(s)
        await s.send(consume_request(credit=2))
        got += [await next_delivery(s), await next_delivery(s)]
        assert await nothing_more(s)
        await s.send(consume_request(credit=10, acks=[d.tag for d in got[2:]]))
        got.append(await next_delivery(s))
        await s.send(consume_request(acks=[got[-1].tag]))
        response = await pending.wait()
    assert [d.message.body for d in got] == [b"0", b"1", b"2", b"3", b"4"]
    assert len({d.tag for d in got}) == 5
    assert response.outcome == DELIVERED


async def test_consume_window_bounds_deliveries_in_flight(
    gw: Gateway, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    async with gw.client() as c, consuming(c, "jobs", "workers", window=2) as s:
        pending = start(nursery, lambda: publish(c, *(msg("jobs", b"%d" % i) for i in range(3))))
        first, second = await next_delivery(s), await next_delivery(s)
        assert await nothing_more(s), "the window is full"
        await s.send(consume_request(acks=[first.tag]))
        third = await next_delivery(s)
        await s.send(consume_request(acks=[second.tag, third.tag]))
        assert (await pending.wait()).outcome == DELIVERED


async def test_ack_settles_nack_requeues_or_rejects(gw: Gateway, nursery: trio.Nursery) -> None:
    async with gw.client() as c, consuming(c, "jobs", "workers") as s:
        pending = start(nursery, lambda: publish(c, *(msg("jobs", b"%d" % i) for i in range(3))))
        a, b, r = [await next_delivery(s) for _ in range(3)]
        nacks = [pb.Nack(tag=b.tag, requeue=True), pb.Nack(tag=r.tag, reason="bad input")]
        await s.send(consume_request(acks=[a.tag], nacks=nacks))
        again = await next_delivery(s)
        assert (again.message.body, again.redelivered, again.tag != b.tag) == (b"1", True, True)
        assert not pending.done
        await s.send(consume_request(acks=[again.tag]))
        response = await pending.wait()
        # A tag settled already is refused, and ends the stream.
        await s.send(consume_request(acks=[a.tag]))
        error = await error_of(s.receive())
    assert (error.code, error.message) == (
        Code.INVALID_ARGUMENT,
        f"unknown or already settled delivery tag {a.tag}",
    )
    assert [(x.outcome, x.reason) for x in response.results] == [
        (DELIVERED, ""),
        (DELIVERED, ""),
        (REJECTED, "bad input"),
    ]


async def test_a_dropped_consumer_s_deliveries_go_to_the_next_one(
    gw: Gateway, nursery: trio.Nursery
) -> None:
    async with gw.client() as publisher, gw.client() as first:
        async with consuming(first, "jobs", "workers") as s1:
            pending = start(nursery, lambda: publish(publisher, msg("jobs", b"job")))
            taken = await next_delivery(s1)
            assert not taken.redelivered
        async with gw.client() as second, consuming(second, "jobs", "workers") as s2:
            assert gw.members("jobs") == {"workers": 2}
            await first.aclose()  # the first consumer's connection drops, unacked
            again = await next_delivery(s2)
            assert (again.message.body, again.redelivered) == (b"job", True)
            await s2.send(consume_request(acks=[again.tag]))
            assert (await pending.wait()).outcome == DELIVERED


async def test_a_half_closed_consume_ends_ok_and_hands_back_what_it_did_not_ack(
    gw: Gateway, nursery: trio.Nursery
) -> None:
    async with gw.client() as c:
        async with consuming(c, "jobs", "workers") as s:
            pending = start(nursery, lambda: publish(c, msg("jobs", b"a"), msg("jobs", b"b")))
            a, b = await next_delivery(s), await next_delivery(s)
            assert (a.message.body, b.message.body) == (b"a", b"b")
            await s.send(consume_request(acks=[a.tag]))
            await s.close_send()
            assert [m async for m in s] == []  # ends OK
        with gw.hub.subscribe("jobs", "workers") as sub:
            (d,) = await sub.receive()
            assert (d.message.body, d.redelivered) == (b"b", True)
            sub.ack(d.tag)
        assert (await pending.wait()).outcome == DELIVERED


async def test_consume_of_a_finite_read_ends_once_everything_is_acked(gw: Gateway) -> None:
    async with gw.client() as c:
        await publish(c, msg("mlog", b"a"), msg("mlog", b"b"))
        end = pb.Bound(edge=pb.EDGE_LATEST)
        start = pb.Bound(edge=pb.EDGE_EARLIEST)
        async with consuming(c, "mlog", "readers", start=start, end=end) as s:
            a, b = await next_delivery(s), await next_delivery(s)
            assert (a.position.offset, b.position.offset) == (0, 1)
            await s.send(consume_request(acks=[a.tag, b.tag]))
            assert [m async for m in s] == []  # ends OK
        with gw.hub.subscribe("mlog", "readers") as sub:
            assert sub.committed is not None
            assert sub.committed.offset == 2


async def test_consume_refuses_invalid_requests(gw: Gateway) -> None:
    cases: list[tuple[list[bytes], bool, str]] = [
        ([], True, "needs a first ConsumeRequest"),
        ([consume_request(credit=1)], False, "must subscribe"),
        ([consume_request("jobs", acks=[1])], False, "only subscribes"),
        ([consume_request("jobs"), consume_request("jobs")], False, "subscribes once"),
        ([consume_request("jobs"), b"\xff"], False, "undecodable ConsumeRequest"),
        ([consume_request("jobs"), consume_request(acks=[7])], False, "delivery tag 7"),
    ]
    async with gw.client() as c:
        for messages, close, text in cases:
            async with c.stream(SERVICE, "Consume", CallKind.BIDI) as s:
                for m in messages:
                    await s.send(m)
                if close:
                    await s.close_send()
                error = await error_of(s.receive())
            assert (error.code, text in error.message) == (Code.INVALID_ARGUMENT, True), error


# -- Call ---------------------------------------------------------------------------------


async def serve_calls(sub: Subscription, answer: Callable[[Message], Reply]) -> None:
    """A service implemented by a hub subscriber: answer every call it is delivered."""
    with contextlib.suppress(trio.ClosedResourceError):  # the test closed it
        while True:
            for d in await sub.receive():
                assert d.reply_by is not None
                sub.reply(d.tag, answer(d.message))


async def test_call_is_answered_by_a_subscriber_s_reply(gw: Gateway, nursery: trio.Nursery) -> None:
    def upper(m: Message) -> Reply:
        if m.body == b"missing":
            return Reply(b"try later", {"why": "gone"}, None, Code.NOT_FOUND, "no such record")
        return Reply(m.body.upper(), {"seen": m.headers["id"]}, "text/plain")

    with gw.hub.subscribe("svc.upper", "svc") as sub:
        nursery.start_soon(serve_calls, sub, upper)
        async with gw.client() as c:
            response = await call(c, msg("svc.upper", b"hello", id="7"))
            error = await error_of(call(c, msg("svc.upper", b"missing", id="8")))
    assert (response.body, dict(response.headers), response.content_type) == (
        b"HELLO",
        {"seen": "7"},
        "text/plain",
    )
    assert (error.code, error.message) == (Code.NOT_FOUND, "no such record")
    (detail,) = error.details
    answered = pb.CallResponse()
    assert detail.Unpack(answered)
    assert (answered.body, dict(answered.headers)) == (b"try later", {"why": "gone"})


async def test_call_is_answered_by_a_ttrpc_consumer(gw: Gateway, nursery: trio.Nursery) -> None:
    async with (
        gw.client() as service,
        consuming(service, "svc.echo", "svc") as s,
        gw.client() as caller,
    ):
        pending = start(nursery, lambda: call(caller, msg("svc.echo", b"ping"), 10))
        request = await next_delivery(s)
        assert request.call
        assert 9 < request.reply_within <= 10
        reply = pb.Reply(tag=request.tag, body=request.message.body + b"/pong")
        reply.headers["by"] = "consumer"
        await s.send(consume_request(replies=[reply]))
        response = await pending.wait()
    assert (response.body, dict(response.headers)) == (b"ping/pong", {"by": "consumer"})
    assert not response.HasField("content_type")


async def test_a_reply_to_a_delivery_that_is_no_call_is_refused(
    gw: Gateway, nursery: trio.Nursery
) -> None:
    async with gw.client() as c, consuming(c, "jobs", "w") as s:
        start(nursery, lambda: publish(c, msg("jobs", b"x")))
        d = await next_delivery(s)
        await s.send(consume_request(replies=[pb.Reply(tag=d.tag)]))
        error = await error_of(s.receive())
    assert (error.code, error.message) == (
        Code.INVALID_ARGUMENT,
        f"delivery {d.tag} is not a call: ack it instead",
    )


async def test_call_without_a_subscriber_or_to_a_log_fails_at_once(
    gw: Gateway, autojump_clock: trio.testing.MockClock
) -> None:
    async with gw.client() as c:
        before = trio.current_time()
        nobody = await error_of(call(c, msg("svc.none", b"?")))
        log = await error_of(call(c, msg("mlog", b"?")))
        no_destination = await error_of(call(c, msg("", b"?")))
        assert trio.current_time() == before
    assert (nobody.code, nobody.message) == (Code.UNAVAILABLE, "no subscriber to answer the call")
    assert log.code == Code.INVALID_ARGUMENT
    assert "takes no calls" in log.message
    assert (no_destination.code, no_destination.message) == (
        Code.INVALID_ARGUMENT,
        "the request has no destination",
    )


async def test_an_unanswered_call_times_out(autojump_clock: trio.testing.MockClock) -> None:
    async with gateway(call_timeout=3) as gw, gw.client() as c:
        with gw.hub.subscribe("svc.slow", "svc"):  # takes calls, never answers
            before = trio.current_time()
            error = await error_of(call(c, msg("svc.slow", b"?"), timeout=2))
            assert error.code == Code.DEADLINE_EXCEEDED
            assert trio.current_time() - before == pytest.approx(2, abs=0.1)
            # Without a deadline the call waits call_timeout.
            before = trio.current_time()
            error = await error_of(call(c, msg("svc.slow", b"?")))
            assert (error.code, error.message) == (Code.DEADLINE_EXCEEDED, "no reply within 3s")
            assert trio.current_time() - before == pytest.approx(3, abs=0.1)


# -- shutdown -------------------------------------------------------------------------------


async def test_shutdown_ends_streams_and_refuses_new_work(nursery: trio.Nursery) -> None:
    shutdown = trio.Event()
    async with gateway(shutdown=shutdown) as gw, gw.client() as c:
        request = pb.SubscribeRequest(destination="logs").SerializeToString()
        async with (
            c.stream(SERVICE, "Subscribe", CallKind.SERVER_STREAMING, request) as sub,
            consuming(c, "jobs", "w") as s,
        ):
            pending = start(nursery, lambda: publish(c, msg("jobs", b"x")))
            d = await next_delivery(s)
            shutdown.set()
            assert (await error_of(sub.receive())).code == Code.UNAVAILABLE
            # The Consume stream waits for what is in flight to be settled.
            await settle()
            assert s.status is None
            await s.send(consume_request(acks=[d.tag]))
            error = await error_of(s.receive())
            assert (error.code, error.message) == (Code.UNAVAILABLE, "the gateway is shutting down")
            assert (await pending.wait()).outcome == DELIVERED
        assert (await error_of(publish(c, msg("logs", b"late")))).code == Code.UNAVAILABLE
