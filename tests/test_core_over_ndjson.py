"""The core model's capabilities end to end, from real sockets through ndjson.

Each test runs a gateway on loopback and talks to it with the ndjson client:
per-message results of a batch publish, request/reply between two connections,
filtered subscriptions, positions with replay and committed group positions
across a reconnect, finite reads that end, queues shared by competing
consumers, and plain topics that do not hold publishers when nobody listens.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver, End, Publish, Published, Replied
from waits import subscribed, until

from gateway.core.errors import LocalProtocolError
from gateway.core.filters import Filter
from gateway.core.model import Reply
from gateway.runtime.gateway import Gateway


def config(**extra: Any) -> dict[str, Any]:
    return {
        "gateway": {"drain_timeout": "2s"},
        "listeners": [
            {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "logs"}
        ],
        **extra,
    }


@asynccontextmanager
async def client(gateway: Gateway) -> AsyncIterator[NdjsonClient]:
    host, port = host_port(gateway.addresses["nd"][0])
    async with await NdjsonClient.connect(host, port) as c:
        yield c


async def deliveries(c: NdjsonClient, n: int) -> list[Deliver]:
    out = []
    with trio.fail_after(5):
        while len(out) < n:
            event = await c.receive()
            assert isinstance(event, Deliver), event
            out.append(event)
    return out


def committed(gateway: Gateway, destination: str, group: str) -> int | None:
    """The first offset ``group`` of the log ``destination`` has not settled."""
    figures = gateway.hub.destination(destination).figures()
    return next((g.committed for g in figures.groups if g.name == group), None)


# -- per-message results -------------------------------------------------------------


async def test_a_batch_publish_answers_each_message() -> None:
    """A batch into a fixed-size element stream: the one wrong-sized element is
    rejected on its own, the others are stored with their positions."""
    cfg = config(destinations=[{"name": "frames", "element_size": 4, "retain": "64KiB"}])
    async with running_gateway(cfg) as gw, client(gw) as c:
        answer = await c.publish_many(
            [
                Publish(b"abcd", "frames"),
                Publish(b"toolong", "frames"),
                Publish(b"wxyz", "frames"),
            ]
        )
        assert answer.status == "rejected"
        assert answer.results is not None
        statuses = [r.status for r in answer.results]
        assert statuses == ["delivered", "rejected", "delivered"]
        assert "exactly 4 bytes" in answer.results[1].reason
        assert answer.results[0].positions == {"frames": 0}
        assert answer.results[2].positions == {"frames": 1}


async def test_a_publish_into_a_log_is_answered_with_its_position() -> None:
    cfg = config(destinations=[{"name": "audit", "retain": "1MiB"}])
    async with running_gateway(cfg) as gw, client(gw) as c:
        first = await c.publish(b"one", "audit")
        second = await c.publish(b"two", "audit")
        assert (first.status, first.positions) == ("delivered", {"audit": 0})
        assert second.positions == {"audit": 1}


# -- request/reply ---------------------------------------------------------------------


async def test_a_call_is_answered_by_a_reply_from_another_connection() -> None:
    async with running_gateway(config()) as gw, client(gw) as service, client(gw) as caller:
        await service.subscribe("echo", "echo-service")
        await subscribed(gw, "echo")
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                (d,) = await deliveries(service, 1)
                assert d.call
                assert d.reply_within is not None
                assert d.reply_within > 0
                await service.reply(d.tag, b"echo:" + d.body, headers={"served-by": "one"})

            nursery.start_soon(serve)
            with trio.fail_after(5):
                answer = await caller.call(b"hello", "echo", timeout=5)
        assert isinstance(answer, Replied), answer
        assert (answer.body, answer.code, dict(answer.headers)) == (
            b"echo:hello",
            0,
            {"served-by": "one"},
        )


async def test_a_reply_code_ndjson_cannot_carry_reaches_the_caller_as_unknown() -> None:
    """A service of another protocol may answer with any status; ndjson's codes stop at
    2**31-1, so a larger one arrives as UNKNOWN (2) with its message kept."""
    async with running_gateway(config()) as gw, client(gw) as caller:
        service = gw.hub.subscribe("svc", "pool")
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                (d,) = await service.receive()
                service.reply(d.tag, Reply(b"", status=2**40, message="too big a code"))

            nursery.start_soon(serve)
            with trio.fail_after(5):
                answer = await caller.call(b"x", "svc", timeout=5)
        assert isinstance(answer, Replied), answer
        assert (answer.code, answer.error) == (2, "too big a code")


async def test_a_call_nobody_answers_in_time_fails_with_the_reason() -> None:
    async with running_gateway(config()) as gw, client(gw) as service, client(gw) as caller:
        await service.subscribe("slow", "workers")
        await subscribed(gw, "slow")
        with trio.fail_after(5):
            answer = await caller.call(b"x", "slow", timeout=0.2)
        assert isinstance(answer, Published)
        assert (answer.status, answer.reason) == ("failed", "no reply within 0.2s")


async def test_a_call_to_a_destination_without_subscribers_fails_at_once() -> None:
    async with running_gateway(config()) as gw, client(gw) as caller:
        with trio.fail_after(5):
            answer = await caller.call(b"x", "nobody", timeout=30)
        assert isinstance(answer, Published)
        assert answer.status == "failed"
        assert "no subscriber" in answer.reason


async def test_calls_are_load_balanced_across_a_group() -> None:
    async with running_gateway(config()) as gw:
        async with client(gw) as a, client(gw) as b, client(gw) as caller:
            served: Counter[str] = Counter()
            for svc in (a, b):
                await svc.subscribe("svc", "pool", window=1)
            await subscribed(gw, "svc", 2)
            async with trio.open_nursery() as nursery:
                for name, svc in (("a", a), ("b", b)):

                    async def serve(name: str = name, svc: NdjsonClient = svc) -> None:
                        while True:
                            (d,) = await deliveries(svc, 1)
                            served[name] += 1
                            await svc.reply(d.tag, name.encode())

                    nursery.start_soon(serve)
                answers = []
                with trio.fail_after(10):
                    for i in range(20):
                        answers.append(await caller.call(str(i).encode(), "svc", timeout=5))
                nursery.cancel_scope.cancel()
        assert all(isinstance(r, Replied) for r in answers)
        assert served["a"] + served["b"] == 20
        assert served["a"] > 0
        assert served["b"] > 0


# -- filters ---------------------------------------------------------------------------


async def test_a_filtered_subscriber_gets_only_matching_messages_and_holds_nobody() -> None:
    async with running_gateway(config()) as gw, client(gw) as sub, client(gw) as pub:
        await sub.subscribe("events", filter=Filter.from_json({"level": "error"}))
        await subscribed(gw, "events")
        (first,) = await pub.publish_nowait([b"1"], "events", headers={"level": "error"})
        with trio.fail_after(5):
            others = [
                await pub.publish(b"2", "events", headers={"level": "info"}),
                await pub.publish(b"3", "events"),
            ]
        # Messages the filter does not match settled at once: nobody else listens.
        assert [a.status for a in others] == ["delivered", "delivered"]
        (d,) = await deliveries(sub, 1)
        assert d.body == b"1"
        await sub.ack(d.tag)
        (answer,) = await pub.wait_answers([first])
        assert answer.status == "delivered"


async def test_a_filter_with_numbers_over_the_wire() -> None:
    async with running_gateway(config()) as gw, client(gw) as sub, client(gw) as pub:
        await sub.subscribe("m", "big", filter=Filter.from_json([["size", ">", 100]]))
        await subscribed(gw, "m")
        for size in (5, 500, 50, 101):
            await pub.publish_nowait([str(size).encode()], "m", headers={"size": str(size)})
        got = await deliveries(sub, 2)
        assert [d.body for d in got] == [b"500", b"101"]


async def test_a_bad_filter_is_refused_with_an_error_line() -> None:
    async with running_gateway(config()) as gw, client(gw) as c:
        await c.stream.send_all(b'{"op":"sub","dest":"x","filter":[["a","==",1]]}\n')
        with pytest.raises(Exception, match="operator"):
            with trio.fail_after(5):
                await c.receive()


# -- positions, replay, committed positions, end of stream -------------------------------


async def test_a_group_that_reconnects_resumes_at_its_committed_position() -> None:
    cfg = config(destinations=[{"name": "orders", "retain": "1MiB"}])
    async with running_gateway(cfg) as gw, client(gw) as pub:
        async with client(gw) as first:
            await first.subscribe("orders", "billing", start="earliest", window=10)
            for i in range(6):
                await pub.publish(f"o{i}".encode(), "orders")
            got = await deliveries(first, 6)
            assert [d.position for d in got] == [0, 1, 2, 3, 4, 5]
            await first.ack(*[d.tag for d in got[:3]])  # acks 0..2; 3..5 stay unacked
            await until(lambda: committed(gw, "orders", "billing") == 3)
        # The first member is gone; a new one resumes at offset 3 (redelivered).
        async with client(gw) as second:
            await second.subscribe("orders", "billing", start="earliest", window=10)
            again = await deliveries(second, 3)
            assert [(d.position, d.redelivered) for d in again] == [
                (3, True),
                (4, True),
                (5, True),
            ]
            await second.ack(*[d.tag for d in again])
            await pub.publish(b"o6", "orders")
            (new,) = await deliveries(second, 1)
            assert (new.position, new.redelivered, new.body) == (6, False, b"o6")


async def test_replay_from_earliest_and_from_a_position_with_an_end() -> None:
    cfg = config(destinations=[{"name": "audit", "retain": "1MiB"}])
    async with running_gateway(cfg) as gw, client(gw) as pub, client(gw) as reader:
        for i in range(5):
            await pub.publish(f"a{i}".encode(), "audit")
        await reader.subscribe("audit", start=1, end=4)
        got = await deliveries(reader, 3)
        assert [(d.position, d.body) for d in got] == [(1, b"a1"), (2, b"a2"), (3, b"a3")]
        with trio.fail_after(5):
            end = await reader.receive()
        assert end == End("audit")
        await reader.ack(*[d.tag for d in got])  # acks after the end still work
        # The subscription is gone, so the same destination can be read again.
        await reader.subscribe("audit", start="earliest", end="latest")
        assert len(await deliveries(reader, 5)) == 5
        with trio.fail_after(5):
            assert await reader.receive() == End("audit")


async def test_a_topic_refuses_a_start_position() -> None:
    async with running_gateway(config()) as gw, client(gw) as c:
        await c.subscribe("plain", start="earliest")
        with pytest.raises(Exception, match="keeps no log"):
            with trio.fail_after(5):
                await c.receive()


# -- destination kinds --------------------------------------------------------------------


async def test_a_queue_gives_each_message_to_exactly_one_of_three_consumers() -> None:
    cfg = config(destinations=[{"name": "jobs", "kind": "queue"}])
    async with running_gateway(cfg) as gw, client(gw) as pub:
        # Published before any consumer: a queue keeps them.
        ids = await pub.publish_nowait([f"j{i}".encode() for i in range(30)], "jobs")
        async with client(gw) as a, client(gw) as b, client(gw) as c:
            consumers = [a, b, c]
            for i, consumer in enumerate(consumers):
                # Different group names, or none: a queue has one group anyway.
                await consumer.subscribe("jobs", [None, "x", "y"][i], window=1)
            seen: list[bytes] = []
            per_consumer: Counter[int] = Counter()
            async with trio.open_nursery() as nursery:
                for i, consumer in enumerate(consumers):

                    async def consume(i: int = i, consumer: NdjsonClient = consumer) -> None:
                        while True:
                            (d,) = await deliveries(consumer, 1)
                            seen.append(d.body)
                            per_consumer[i] += 1
                            await consumer.ack(d.tag)

                    nursery.start_soon(consume)
                with trio.fail_after(10):
                    answers = await pub.wait_answers(ids)
                nursery.cancel_scope.cancel()
        assert all(a.status == "delivered" for a in answers)
        assert sorted(seen) == sorted(f"j{i}".encode() for i in range(30))
        assert len(per_consumer) == 3, "every consumer took a share"


async def test_a_plain_topic_with_no_subscriber_does_not_hold_the_publisher() -> None:
    async with running_gateway(config()) as gw, client(gw) as pub:
        with trio.fail_after(5):
            answer = await pub.publish(b"into the void", "nobody-listens")
        assert answer.status == "delivered"
        assert gw.hub.destination("nobody-listens").stats()["discarded"] == 1


async def test_a_configured_group_collects_before_its_first_member() -> None:
    cfg = config(destinations=[{"name": "alerts", "groups": ["pager"]}])
    async with running_gateway(cfg) as gw, client(gw) as pub:
        # Named in the table, it exists from start-up with its group.
        assert gw.hub.destinations()["alerts"].stats()["groups"] == {
            "pager": {"queued": 0, "held_bytes": 0, "held": 0, "members": 0}
        }
        ids = await pub.publish_nowait([b"a1", b"a2"], "alerts")
        async with client(gw) as pager:
            await pager.subscribe("alerts", "pager")
            got = await deliveries(pager, 2)
            await pager.ack(*[d.tag for d in got])
            answers = await pub.wait_answers(ids)
        assert [a.status for a in answers] == ["delivered", "delivered"]


# -- the driver itself: drains, protocol errors, unsubscribing, the upstream's clock -------


async def read_to_close(stream: trio.abc.Stream) -> list[bytes]:
    """Every line ``stream`` receives until the gateway closes it."""
    data = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some():
            data += chunk
    return data.splitlines()


async def raw(gateway: Gateway) -> trio.abc.Stream:
    return await trio.open_tcp_stream(*host_port(gateway.addresses["nd"][0]))


async def test_while_draining_acks_are_read_and_new_work_is_refused() -> None:
    async with running_gateway(config()) as gw, client(gw) as sub, client(gw) as pub:
        await sub.subscribe("logs", window=10)
        await subscribed(gw, "logs")
        [first] = await pub.publish_nowait([b"before"])
        (d,) = await deliveries(sub, 1)
        gw.shutdown()
        await gw.draining.wait()
        # A new publish is answered at once, and not published.
        late = await pub.publish(b"after")
        assert (late.status, late.reason) == ("failed", "the gateway is shutting down")
        # The delivery made before still settles, and so does its publish.
        await sub.ack(d.tag)
        [answer] = await pub.wait_answers([first])
        assert answer.status == "delivered"
        # Nothing is owed any more: the gateway closes both connections.
        with pytest.raises(trio.BrokenResourceError), trio.fail_after(5):
            await sub.receive()
    assert gw.drained_cleanly is True


async def test_a_subscribe_while_draining_is_refused_with_an_error_line() -> None:
    """A connection stays while it holds an unacked delivery; a new ``sub`` on it is
    refused (a connection that owes nothing closes as the drain starts)."""
    async with running_gateway(config()) as gw, client(gw) as pub:
        stream = await raw(gw)
        await stream.send_all(b'{"op":"sub","dest":"logs"}\n{"op":"ping"}\n')
        with trio.fail_after(5):
            assert await stream.receive_some() == b'{"op":"pong"}\n'
        await pub.publish_nowait([b"held"])
        with trio.fail_after(5):
            assert (await stream.receive_some()).startswith(b'{"op":"msg","tag":1,')
        gw.shutdown()
        await gw.draining.wait()
        await stream.send_all(b'{"op":"sub","dest":"more"}\n')
        assert await read_to_close(stream) == [
            b'{"op":"error","error":"the gateway is shutting down"}'
        ]


async def test_a_protocol_error_is_the_last_line_and_closes_at_once() -> None:
    """Publishes still in flight are not answered after the error line (nor awaited:
    their publisher sends them again), and no more deliveries follow it."""
    cfg = config(destinations=[{"name": "held", "kind": "queue"}])
    async with running_gateway(cfg) as gw, client(gw) as pub:
        stream = await raw(gw)
        await stream.send_all(
            b'{"op":"sub","dest":"logs","window":1000}\n{"op":"ping"}\n'
            b'{"op":"pub","id":1,"dest":"held","body":"kept until consumed"}\n'
        )
        assert await stream.receive_some() == b'{"op":"pong"}\n'
        await pub.publish_nowait([b"m%d" % i for i in range(200)])
        await stream.send_all(b"not json\n")
        lines = await read_to_close(stream)
        assert lines[-1].startswith(b'{"op":"error","error":"invalid JSON')
        assert all(line.startswith(b'{"op":"msg"') for line in lines[:-1]), lines[:-1]
        # The publish it made is kept by the queue, for a consumer.
        async with client(gw) as consumer:
            await consumer.subscribe("held")
            (d,) = await deliveries(consumer, 1)
            assert d.body == b"kept until consumed"


async def test_unsubscribing_while_deliveries_flow_leaves_the_connection_usable() -> None:
    """The pump of a subscription left while its deliveries are written stops at once,
    and the connection goes on; deliveries written before the ``unsub`` was read may
    still arrive (the client refuses to ack them: the gateway forgot them), none after
    a delivery the gateway wrote once it had read the ``unsub``."""
    body = b"x" * 5000  # 300 of them are more than the writer's high-water mark
    async with running_gateway(config()) as gw, client(gw) as sub, client(gw) as pub:
        ids = []
        for _ in range(3):  # 900 messages: the topic holds at most 1000 for the next one
            await sub.subscribe("logs", window=1000)
            await subscribed(gw, "logs")
            ids += await pub.publish_nowait([body] * 300)
            (first,) = await deliveries(sub, 1)
            await sub.unsubscribe("logs")
            # A fence: the gateway reads ``unsub`` before this ``sub`` and writes one
            # ordered stream, so every late delivery of "logs" arrives before the fence.
            await sub.subscribe("other")
            await subscribed(gw, "other")
            await pub.publish_nowait([b"fence"], "other")
            with trio.fail_after(10):
                while (late := await sub.receive()).destination != "other":
                    assert isinstance(late, Deliver)
                    with pytest.raises(LocalProtocolError):
                        await sub.ack(late.tag)
            assert isinstance(late, Deliver)
            assert late.body == b"fence"
            await sub.ack(late.tag)
            await sub.unsubscribe("other")
            with pytest.raises(LocalProtocolError):
                await sub.ack(first.tag)
        # The topic kept what nobody acked for its next subscriber: this one.
        await sub.subscribe("logs", window=1000)
        async with trio.open_nursery() as nursery:

            async def consume() -> None:
                while True:
                    d = await sub.receive()
                    assert isinstance(d, Deliver)
                    await sub.ack(d.tag)

            nursery.start_soon(consume)
            with trio.fail_after(10):
                answers = await pub.wait_answers(ids)
            nursery.cancel_scope.cancel()
        assert {a.status for a in answers} == {"delivered"}


class FakeServer:
    """An ndjson server that records the ``pub`` lines each connection sends and answers
    them as ``answer(connection number, line)`` says (None: not at all)."""

    def __init__(self, answer: Callable[[int, dict[str, Any]], bytes | None]) -> None:
        self.answer = answer
        self.connections: list[list[dict[str, Any]]] = []
        self.open = 0
        self.changed = trio.Event()

    async def handle(self, stream: trio.SocketStream) -> None:
        lines: list[dict[str, Any]] = []
        self.connections.append(lines)
        number = len(self.connections)
        self.open += 1
        self._changed()
        buf = b""
        try:
            while data := await stream.receive_some():
                buf += data
                *complete, buf = buf.split(b"\n")
                for line in complete:
                    obj = json.loads(line)
                    lines.append(obj)
                    self._changed()
                    reply = self.answer(number, obj)
                    if reply is not None:
                        await stream.send_all(reply)
        except trio.BrokenResourceError:
            pass
        finally:
            self.open -= 1
            self._changed()

    def _changed(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def until(self, done: Callable[[], bool]) -> None:
        with trio.fail_after(5):
            while not done():
                await self.changed.wait()


@asynccontextmanager
async def relay_to(server: FakeServer, timeout: str) -> AsyncIterator[Gateway]:
    """A gateway whose ``logs`` go to an ndjson upstream served by ``server``."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1")
        )
        port = listeners[0].socket.getsockname()[1]
        upstream = {
            "name": "fake",
            "protocol": "ndjson",
            "connect": f"127.0.0.1:{port}",
            "timeout": timeout,
            "backoff_initial": "20ms",
            "backoff_max": "50ms",
        }
        cfg = config(upstreams=[upstream], routes=[{"from": "logs", "to": ["upstream:fake"]}])
        async with running_gateway(cfg) as gw:
            yield gw
        nursery.cancel_scope.cancel()


def ack(obj: dict[str, Any], status: str = "delivered") -> bytes:
    return json.dumps({"op": "ack", "id": obj["id"], "status": status}).encode() + b"\n"


async def test_the_upstream_reconnects_and_resends_when_acks_stop() -> None:
    server = FakeServer(lambda number, obj: None if number == 1 else ack(obj))
    async with relay_to(server, "200ms") as gw, client(gw) as pub:
        answer = await pub.publish(b"once more")
        assert answer.status == "delivered"
        first, second = server.connections[:2]
        assert [o["body"] for o in first] == [b"once more".decode()]  # never acked
        assert [o["body"] for o in second] == ["once more"]


async def test_the_upstream_ack_clock_runs_only_while_a_publish_waits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    server = FakeServer(lambda number, obj: ack(obj))
    async with relay_to(server, "100ms") as gw, client(gw) as pub:
        await server.until(lambda: server.open == 1)
        await trio.sleep(0.4)  # idle for longer than the timeout: kept
        for body in (b"a", b"b"):
            assert (await pub.publish(body)).status == "delivered"
            await trio.sleep(0.25)
        assert len(server.connections) == 1
        assert server.open == 1


async def test_the_upstream_reconnects_on_an_error_line_and_settles_by_status() -> None:
    def answer(number: int, obj: dict[str, Any]) -> bytes:
        if number == 1:
            return b'{"op":"error","error":"not today"}\n'
        return ack(obj, "rejected" if obj["body"] == "bad" else "delivered")

    server = FakeServer(answer)
    async with relay_to(server, "5s") as gw, client(gw) as pub:
        ok = await pub.publish(b"good")
        bad = await pub.publish(b"bad")
        assert ok.status == "delivered"
        assert bad.status == "rejected"
        assert len(server.connections) == 2
