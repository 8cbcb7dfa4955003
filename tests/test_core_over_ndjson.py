"""The core model's capabilities end to end, from real sockets through ndjson.

Each test runs a gateway on loopback and talks to it with the ndjson client:
per-message results of a batch publish, request/reply between two connections,
filtered subscriptions, positions with replay and committed group positions
across a reconnect, finite reads that end, queues shared by competing
consumers, and plain topics that do not hold publishers when nobody listens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver, End, Publish, Published, Replied

from gateway.filters import Filter
from gateway.model import Reply
from gateway.runtime import Gateway


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
            async with trio.open_nursery() as nursery:
                for name, svc in (("a", a), ("b", b)):

                    async def serve(name: str = name, svc: NdjsonClient = svc) -> None:
                        while True:
                            (d,) = await deliveries(svc, 1)
                            served[name] += 1
                            await trio.sleep(0.01)
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
        await trio.sleep(0.05)
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
        await trio.sleep(0.05)
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
            await trio.sleep(0.05)
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
                            await trio.sleep(0.005)
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
