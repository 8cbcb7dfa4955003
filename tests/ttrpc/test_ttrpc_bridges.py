"""Bridges between ttrpc's ``interchange.v1.Messaging`` and the other protocols, end to end.

Each test runs a real gateway (in-process, on loopback ports) with a ttrpc, an ndjson and
a lumberjack listener, and talks to it over real sockets with the protocols' own clients:
a ttrpc Publish reaches an ndjson subscriber (answered DELIVERED only once it acked) and a
second gateway through a lumberjack upstream; ndjson and lumberjack publishers reach a
ttrpc Subscribe stream; an ndjson publisher is acked only once a ttrpc Consume stream
acked (a requeued nack comes back); a ttrpc Call is answered by an ndjson subscriber's
reply, and an ndjson call by a ttrpc Consume stream's reply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import Task, host_port, running_gateway, settle, start
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver, Replied
from waits import subscribed

from gateway.runtime.gateway import Gateway
from protocols.lumberjack.client import LumberjackClient
from protocols.ttrpc import Code, TtrpcError
from protocols.ttrpc import messaging_pb2 as pb
from protocols.ttrpc.client import Client, ClientCall, open_client
from protocols.ttrpc.codec import CallKind
from protocols.ttrpc.messaging import SERVICE

#: Bound on anything awaited over the sockets (generous for slow CI machines).
DEADLINE = 10.0
#: How long something that must not happen is given to happen anyway.
QUIET = 0.3
DELIVERED = pb.OUTCOME_DELIVERED


def config(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """A gateway with a listener of each protocol; ``jobs`` is a queue."""
    return {
        "gateway": {"data_dir": str(tmp_path / "data"), "drain_timeout": "500ms"},
        "listeners": [
            {"name": "rpc", "protocol": "ttrpc", "bind": "127.0.0.1:0"},
            {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "logs"},
            {"name": "lj", "protocol": "lumberjack", "bind": "127.0.0.1:0", "destination": "feed"},
        ],
        "destinations": [{"name": "jobs", "kind": "queue"}],
        **extra,
    }


@asynccontextmanager
async def ndjson(gw: Gateway) -> AsyncIterator[NdjsonClient]:
    async with await NdjsonClient.connect(*host_port(gw.addresses["nd"][0])) as c:
        yield c


@asynccontextmanager
async def ttrpc(gw: Gateway) -> AsyncIterator[Client]:
    async with open_client(gw.addresses["rpc"][0]) as c:
        yield c


async def still_pending(task: Task) -> bool:
    """Not done, even after everything else ran and a little time passed."""
    await settle()
    with trio.move_on_after(QUIET):
        await task.finished.wait()
    return not task.done


async def outcome(task: Task) -> Any:
    """The background call's result, within ``DEADLINE``."""
    with trio.fail_after(DEADLINE):
        return await task.wait()


def msg(destination: str, body: bytes, content_type: str | None = None, **headers: str) -> Any:
    m = pb.Message(destination=destination, body=body, headers=headers)
    if content_type is not None:
        m.content_type = content_type
    return m


async def publish(client: Client, *messages: Any) -> Any:
    request = pb.PublishRequest(messages=messages).SerializeToString()
    return pb.PublishResponse.FromString(await client.call(SERVICE, "Publish", request))


async def call(client: Client, message: Any, timeout: float = DEADLINE) -> Any:
    request = pb.CallRequest(message=message).SerializeToString()
    return pb.CallResponse.FromString(await client.call(SERVICE, "Call", request, timeout=timeout))


async def next_delivery(stream: ClientCall) -> Any:
    with trio.fail_after(DEADLINE):
        return pb.Delivery.FromString(await stream.receive())


async def nothing_more(stream: ClientCall) -> bool:
    """No message arrives on ``stream`` for a while."""
    with trio.move_on_after(QUIET):
        await stream.receive()
        return False
    return True


async def ndjson_deliveries(c: NdjsonClient, n: int) -> list[Deliver]:
    out = []
    with trio.fail_after(DEADLINE):
        while len(out) < n:
            event = await c.receive()
            assert isinstance(event, Deliver), event
            out.append(event)
    return out


def consume_request(credit: int | None = None, **fields: Any) -> bytes:
    request = pb.ConsumeRequest(**fields)
    if credit is not None:
        request.credit = credit
    return bytes(request.SerializeToString())


@asynccontextmanager
async def consuming(
    gw: Gateway, client: Client, destination: str, group: str = "", credit: int | None = None
) -> AsyncIterator[ClientCall]:
    """A Consume stream whose subscription exists in the gateway on entry."""
    async with client.stream(SERVICE, "Consume", CallKind.BIDI) as stream:
        subscribe = pb.SubscribeRequest(destination=destination, group=group)
        await stream.send(consume_request(credit, subscribe=subscribe))
        await subscribed(gw, destination)
        yield stream


def local_address(c: NdjsonClient | LumberjackClient) -> str:
    host, port = c.stream.socket.getsockname()[:2]  # type: ignore[attr-defined]
    return f"{host}:{port}"


# -- ttrpc Publish -> ndjson subscriber ------------------------------------------------------


async def test_a_ttrpc_publish_reaches_an_ndjson_subscriber_and_waits_for_its_acks(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    async with (
        running_gateway(config(tmp_path)) as gw,
        ndjson(gw) as subscriber,
        ttrpc(gw) as publisher,
    ):
        await subscriber.subscribe("events", "readers")
        await subscribed(gw, "events")
        pending = start(
            nursery,
            lambda: publish(
                publisher,
                msg("events", b"\x00\xffbinary", "application/octet-stream", id="1"),
                msg("events", b'{"text":"two"}', "application/json", id="2", level="warn"),
                msg("events", b"three"),
            ),
        )
        got = await ndjson_deliveries(subscriber, 3)
        assert [(d.destination, d.body, dict(d.headers), d.content_type) for d in got] == [
            ("events", b"\x00\xffbinary", {"id": "1"}, "application/octet-stream"),
            ("events", b'{"text":"two"}', {"id": "2", "level": "warn"}, "application/json"),
            ("events", b"three", {}, None),
        ]
        assert not any(d.call or d.redelivered for d in got)
        assert await still_pending(pending), "answered before the subscriber acked anything"
        await subscriber.ack(got[0].tag, got[1].tag)
        assert await still_pending(pending), "answered while one message is unacked"
        await subscriber.ack(got[2].tag)
        response = await outcome(pending)
    assert response.outcome == DELIVERED
    assert [r.outcome for r in response.results] == [DELIVERED] * 3


# -- ttrpc Publish -> lumberjack upstream -> a second gateway --------------------------------


def sink_config(tmp_path: Path) -> dict[str, Any]:
    """A second gateway: what its lumberjack listener receives lands in the queue ``received``."""
    return {
        "gateway": {"data_dir": str(tmp_path / "sink"), "drain_timeout": "500ms"},
        "listeners": [
            {"name": "in", "protocol": "lumberjack", "bind": "127.0.0.1:0", "destination": "x"}
        ],
        "routes": [{"from": "*", "to": ["received"]}],
        "destinations": [{"name": "received", "kind": "queue"}],
    }


async def _serve(
    data: dict[str, Any], *, task_status: trio.TaskStatus[Gateway] = trio.TASK_STATUS_IGNORED
) -> None:
    async with running_gateway(data) as gw:
        task_status.started(gw)
        await trio.sleep_forever()


async def collect(gw: Gateway, destination: str, got: list[Any]) -> None:
    """Ack everything ``destination`` delivers, keeping the messages."""
    sub = gw.hub.subscribe(destination)
    try:
        while True:
            for delivery in await sub.receive():
                got.append(delivery.message)
                sub.ack(delivery.tag)
    except trio.ClosedResourceError:
        pass  # the gateway shut down


async def test_a_ttrpc_publish_reaches_a_second_gateway_through_a_lumberjack_upstream(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    sink = await nursery.start(partial(_serve, sink_config(tmp_path)))
    received: list[Any] = []
    nursery.start_soon(collect, sink, "received", received)
    upstream = {
        "name": "beats",
        "protocol": "lumberjack",
        "connect": sink.addresses["in"][0],
        "backoff_initial": "20ms",
        "backoff_max": "100ms",
        "metadata_beat": "",  # send the events as they are
    }
    data = config(
        tmp_path, upstreams=[upstream], routes=[{"from": "shipped", "to": ["upstream:beats"]}]
    )
    async with running_gateway(data) as gw, ttrpc(gw) as publisher:
        with trio.fail_after(DEADLINE):
            response = await publish(
                publisher,
                msg("shipped", b'{"message":"one","n":1}', "application/json"),
                msg("shipped", b'{"message":"two","n":2}', "application/json"),
                msg("shipped", b"plain text", "text/plain", host="web-1"),
            )
        assert response.outcome == DELIVERED, response.reason
        assert [r.outcome for r in response.results] == [DELIVERED] * 3
        # DELIVERED means the second gateway took them: its queue's consumer acked them already.
        assert [m.body for m in received] == [
            b'{"message":"one","n":1}',
            b'{"message":"two","n":2}',
            b'{"message":"plain text","host":"web-1"}',
        ]
    assert {(m.destination, m.content_type, m.source.protocol) for m in received} == {
        ("received", "application/json", "lumberjack")
    }


# -- ndjson and lumberjack publishers -> ttrpc Subscribe -------------------------------------


async def test_ndjson_and_lumberjack_publishers_reach_a_ttrpc_subscribe_stream(
    tmp_path: Path,
) -> None:
    async with running_gateway(config(tmp_path)) as gw, ttrpc(gw) as subscriber:
        request = pb.SubscribeRequest(destination="feed").SerializeToString()
        async with subscriber.stream(SERVICE, "Subscribe", CallKind.SERVER_STREAMING, request) as s:
            await subscribed(gw, "feed")
            async with ndjson(gw) as nd:
                with trio.fail_after(DEADLINE):
                    first = await nd.publish(
                        b"from ndjson", "feed", headers={"k": "v"}, content_type="text/plain"
                    )
                    second = await nd.publish(b"\x01\x02", "feed")
                nd_peer = local_address(nd)
            # Subscribe acks what it wrote to the socket: the publisher was told delivered.
            assert (first.status, second.status) == ("delivered", "delivered")
            async with await LumberjackClient.connect(*host_port(gw.addresses["lj"][0])) as lj:
                with trio.fail_after(DEADLINE):
                    assert await lj.send([{"message": "from beats"}, b'{"n":2}']) == 2
                lj_peer = local_address(lj)
            got = [await next_delivery(s) for _ in range(4)]
    messages = [(d.message.destination, d.message.body, dict(d.message.headers)) for d in got]
    assert messages == [
        ("feed", b"from ndjson", {"k": "v"}),
        ("feed", b"\x01\x02", {}),
        ("feed", b'{"message": "from beats"}', {}),
        ("feed", b'{"n":2}', {}),
    ]
    assert got[0].message.content_type == "text/plain"
    assert not got[1].message.HasField("content_type")
    assert [d.message.content_type for d in got[2:]] == ["application/json"] * 2
    sources = [(d.source.protocol, d.source.listener, d.source.peer) for d in got]
    assert sources == [("ndjson", "nd", nd_peer)] * 2 + [("lumberjack", "lj", lj_peer)] * 2
    assert all(d.source.received_at > 0 for d in got)
    assert not any(d.call or d.redelivered for d in got)
    assert len({d.tag for d in got}) == 4


# -- ndjson publisher -> ttrpc Consume ----------------------------------------------------


async def test_an_ndjson_publisher_is_acked_only_once_a_ttrpc_consumer_acked(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    async with (
        running_gateway(config(tmp_path)) as gw,
        ttrpc(gw) as consumer,
        consuming(gw, consumer, "jobs", "workers", credit=2) as s,
        ndjson(gw) as nd,
    ):
        ids = await nd.publish_nowait([b"job 0", b"job 1", b"job 2"], "jobs", headers={"q": "1"})
        a, b = await next_delivery(s), await next_delivery(s)
        assert [(d.message.body, dict(d.message.headers)) for d in (a, b)] == [
            (b"job 0", {"q": "1"}),
            (b"job 1", {"q": "1"}),
        ]
        assert a.source.protocol == "ndjson"
        assert await nothing_more(s), "only 2 were granted"
        answers = start(nursery, lambda: nd.wait_answers(ids[:1]))
        assert await still_pending(answers), "the publisher was acked before the consumer"
        await s.send(consume_request(acks=[a.tag]))
        (answer,) = await outcome(answers)
        assert (answer.id, answer.status) == (ids[0], "delivered")
        # A nack with requeue gives it back: it comes again, before the newer message.
        rest = start(nursery, lambda: nd.wait_answers(ids[1:]))
        await s.send(consume_request(nacks=[pb.Nack(tag=b.tag, requeue=True)]))
        assert await nothing_more(s), "no credit left for the redelivery"
        await s.send(consume_request(credit=2))
        again, c = await next_delivery(s), await next_delivery(s)
        assert (again.message.body, again.redelivered) == (b"job 1", True)
        assert again.tag != b.tag
        assert (c.message.body, c.redelivered) == (b"job 2", False)
        assert await still_pending(rest), "nothing of these was acked yet"
        await s.send(consume_request(acks=[again.tag, c.tag]))
        answers_rest = await outcome(rest)
    assert [(x.id, x.status) for x in answers_rest] == [
        (ids[1], "delivered"),
        (ids[2], "delivered"),
    ]


async def test_a_ttrpc_consumer_s_rejecting_nack_reaches_the_ndjson_publisher(
    tmp_path: Path,
) -> None:
    async with (
        running_gateway(config(tmp_path)) as gw,
        ttrpc(gw) as consumer,
        consuming(gw, consumer, "jobs", "workers") as s,
        ndjson(gw) as nd,
    ):
        (ident,) = await nd.publish_nowait([b"poison"], "jobs")
        d = await next_delivery(s)
        assert d.message.body == b"poison"
        await s.send(consume_request(nacks=[pb.Nack(tag=d.tag, reason="cannot parse")]))
        with trio.fail_after(DEADLINE):
            (answer,) = await nd.wait_answers([ident])
    assert (answer.status, answer.reason) == ("rejected", "cannot parse")


# -- ttrpc Call answered by an ndjson subscriber -------------------------------------------


async def test_a_ttrpc_call_is_answered_by_an_ndjson_subscriber_s_reply(tmp_path: Path) -> None:
    async with (
        running_gateway(config(tmp_path)) as gw,
        ndjson(gw) as service,
        ttrpc(gw) as caller,
    ):
        await service.subscribe("svc.upper", "svc")
        await subscribed(gw, "svc.upper")
        seen: list[Deliver] = []

        async def serve() -> None:
            while True:
                d = await service.receive()
                assert isinstance(d, Deliver)
                seen.append(d)
                if d.body == b"missing":
                    await service.reply(
                        d.tag,
                        b"try later",
                        headers={"why": "gone"},
                        code=Code.NOT_FOUND,
                        error="no such record",
                    )
                else:
                    await service.reply(
                        d.tag,
                        d.body.upper(),
                        headers={"seen": d.headers["id"]},
                        content_type="text/plain",
                    )

        async with trio.open_nursery() as serving:  # stops serving before the client closes
            serving.start_soon(serve)
            response = await call(caller, msg("svc.upper", b"hello", "text/plain", id="7"))
            with pytest.raises(TtrpcError) as info:
                await call(caller, msg("svc.upper", b"missing", id="8"))
            serving.cancel_scope.cancel()
    assert (response.body, dict(response.headers), response.content_type) == (
        b"HELLO",
        {"seen": "7"},
        "text/plain",
    )
    error = info.value
    assert (error.code, error.message) == (Code.NOT_FOUND, "no such record")
    (detail,) = error.details
    answered = pb.CallResponse()
    assert detail.Unpack(answered)
    assert (answered.body, dict(answered.headers)) == (b"try later", {"why": "gone"})
    assert [(d.destination, d.body, d.content_type, d.call) for d in seen] == [
        ("svc.upper", b"hello", "text/plain", True),
        ("svc.upper", b"missing", None, True),
    ]
    assert all(d.reply_within is not None and 0 < d.reply_within <= DEADLINE for d in seen)


# -- ndjson call answered by a ttrpc Consume stream ------------------------------------------


async def test_an_ndjson_call_is_answered_by_a_ttrpc_consumer_s_reply(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    async with (
        running_gateway(config(tmp_path)) as gw,
        ttrpc(gw) as service,
        consuming(gw, service, "svc.echo", "svc") as s,
        ndjson(gw) as caller,
    ):
        ok = start(
            nursery,
            lambda: caller.call(b"ping", "svc.echo", headers={"id": "1"}, timeout=DEADLINE),
        )
        request = await next_delivery(s)
        assert request.call
        assert 0 < request.reply_within <= DEADLINE
        assert (request.message.destination, request.message.body) == ("svc.echo", b"ping")
        assert dict(request.message.headers) == {"id": "1"}
        assert request.source.protocol == "ndjson"
        assert await still_pending(ok), "answered before the reply"
        reply = pb.Reply(tag=request.tag, body=b"ping/pong", content_type="text/plain")
        reply.headers["by"] = "ttrpc"
        await s.send(consume_request(replies=[reply]))
        answer = await outcome(ok)
        # An error reply reaches the ndjson caller with its code and message.
        failed = start(nursery, lambda: caller.call(b"boom", "svc.echo", timeout=DEADLINE))
        request = await next_delivery(s)
        assert (request.call, request.message.body) == (True, b"boom")
        error = pb.Reply(tag=request.tag, code=Code.FAILED_PRECONDITION, message="not ready")
        await s.send(consume_request(replies=[error]))
        refused = await outcome(failed)
    assert isinstance(answer, Replied), answer
    assert (answer.body, dict(answer.headers), answer.content_type, answer.code) == (
        b"ping/pong",
        {"by": "ttrpc"},
        "text/plain",
        0,
    )
    assert isinstance(refused, Replied), refused
    assert (refused.code, refused.error) == (Code.FAILED_PRECONDITION, "not ready")
