"""The reactive listener bridged to other protocols, end to end over real sockets.

* Demand across protocols: an ndjson publisher into a topic with a small buffer is
  answered only as far as the reactive subscriber's demand (and the buffer) let the
  messages through, and the rest are answered as it requests more.
* ``ack = "demand"`` with a named group: a subscriber that drops the connection gets
  nothing lost; the next member of the group gets every unprocessed element again.
* Beats (``pylogbeat``) into a Lumberjack listener, out to a reactive subscriber with a
  small demand: the Beats window waits on keepalives until the subscriber requests.
* ``from=``/``to=`` on memory, durable and partitioned logs.
* The listener over TLS, a unix socket, ``ws://`` and ``wss://``.

Real sockets (and a thread for pylogbeat) need the real clock: every wait is on a
condition with a guard, and "nothing more arrived" is checked once every task is
blocked (:func:`bridge_helpers.idle`), not after a sleep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from waits import members, subscribed, until

from gateway.core.model import Message, Outcome, Position
from gateway.runtime.gateway import Gateway
from protocols.reactive import Accepted, Request, Subscribe

from .bridge_helpers import (
    GUARD,
    Answers,
    RsPeer,
    connect_tcp,
    group,
    idle,
    registry,
    rs_listener,
    rs_peer,
)

# -- demand across protocols: ndjson publisher -> topic -> reactive subscriber ----------------

ND = {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.2:0"}


def topic_config(ack: str, buffer: int) -> dict[str, Any]:
    return {
        "gateway": {"drain_timeout": "100ms"},
        "listeners": [rs_listener(ack=ack), ND],
        "destinations": [{"name": "feed", "buffer_messages": buffer}],
    }


@asynccontextmanager
async def topic_bridge(
    ack: str, buffer: int, initial: int
) -> AsyncIterator[tuple[Gateway, RsPeer, NdjsonClient]]:
    """A gateway with a subscriber to the topic ``feed`` (``initial`` demand) and an
    ndjson publisher connected."""
    async with (
        running_gateway(topic_config(ack, buffer), registry=registry()) as gw,
        rs_peer(await connect_tcp(gw)) as peer,
    ):
        await peer.send(Subscribe("feed", 1, initial))
        assert await peer.answer(1) == Accepted(1, 0)
        await subscribed(gw, "feed")
        async with await NdjsonClient.connect(*host_port(gw.addresses["nd"][0])) as pub:
            yield gw, peer, pub


BODIES = [b"m%02d" % i for i in range(30)]


async def publish_all(nursery: trio.Nursery, pub: NdjsonClient) -> tuple[list[int], Answers]:
    """Each body published on its own (so each has its own answer), none awaited."""
    ids: list[int] = []
    for body in BODIES:
        ids += await pub.publish_nowait([body], "feed")
    answers = Answers(pub)
    answers.watch(nursery, ids)
    return ids, answers


async def test_ack_written_answers_the_publisher_only_as_far_as_demand_and_buffer() -> None:
    """Demand 10 and a buffer of 4: ten are answered, four wait in the buffer, the
    publisher waits for room; each request lets that many more through."""
    async with topic_bridge("written", buffer=4, initial=0) as (gw, peer, pub):
        await peer.send(Request(1, 10))
        async with trio.open_nursery() as nursery:
            ids, answers = await publish_all(nursery, pub)
            await peer.take(1, 10)
            await until(lambda: len(answers.got) >= 10 and group(gw, "feed").queued >= 4)
            await idle()
            assert peer.elements(1) == BODIES[:10]
            assert answers.got == dict.fromkeys(ids[:10], "delivered")
            assert group(gw, "feed").queued == 4  # the buffer is full...
            assert gw.hub.destination("feed").figures().full  # ...so the publisher waits

            await peer.send(Request(1, 5))
            await until(lambda: len(answers.got) >= 15)
            await idle()
            assert peer.elements(1) == BODIES[:15]
            assert answers.got == dict.fromkeys(ids[:15], "delivered")

            await peer.send(Request(1, 15))
            await until(lambda: len(answers.got) == 30)
            assert peer.elements(1) == BODIES
            assert set(answers.got.values()) == {"delivered"}


async def test_ack_demand_answers_the_publisher_as_the_subscriber_requests_more() -> None:
    """``ack = "demand"``, initial demand 10, a buffer of 12 (unacked count in it): ten
    are sent and none answered; each request(n) answers n and lets n more through."""
    async with (
        topic_bridge("demand", buffer=12, initial=10) as (gw, peer, pub),
        trio.open_nursery() as nursery,
    ):
        ids, answers = await publish_all(nursery, pub)
        await peer.take(1, 10)
        await until(lambda: gw.hub.destination("feed").figures().full)
        await idle()
        assert peer.elements(1) == BODIES[:10]
        assert answers.got == {}  # nothing processed yet: nothing acked
        assert (group(gw, "feed").unacked, group(gw, "feed").queued) == (10, 2)

        await peer.send(Request(1, 5))  # the first five are processed
        await until(lambda: len(answers.got) >= 5 and len(peer.elements(1)) >= 15)
        await idle()
        assert answers.got == dict.fromkeys(ids[:5], "delivered")
        assert peer.elements(1) == BODIES[:15]

        await peer.send(Request(1, 25))  # all thirty processed
        await until(lambda: len(answers.got) == 30)
        assert peer.elements(1) == BODIES
        assert set(answers.got.values()) == {"delivered"}


# -- ack = "demand": a crashed group member loses nothing ------------------------------------

LOGS = {
    "memory": {"name": "logs", "retain": "1MiB"},
    "durable": {"name": "logs", "store": "embedded"},
    "partitioned": {"name": "logs", "store": "embedded", "partitions": 3},
}


def log_config(kind: str, **listener: Any) -> dict[str, Any]:
    return {
        "gateway": {"drain_timeout": "100ms"},
        "store": {"fsync": "never"},
        "listeners": [rs_listener(**listener)],
        "destinations": [LOGS[kind]],
    }


async def publish(gw: Gateway, *bodies: bytes, destination: str = "logs") -> list[Position]:
    """Publish ``bodies`` as one run and wait until it is stored; their positions."""
    receipt = await gw.hub.publish([Message(destination, b) for b in bodies])
    with trio.fail_after(GUARD):
        assert await receipt.wait() == Outcome.DELIVERED
    return [r.position for r in receipt.results() if r.position is not None]


@pytest.mark.parametrize("kind", ["memory", "durable"])
async def test_a_crashed_member_of_a_group_loses_nothing(kind: str, tmp_path: Path) -> None:
    """The member is sent seven, says it processed two (request(2) beyond its initial 5)
    and drops the connection: the next member gets the five it had not processed
    again, then what follows, and not the two it had."""
    bodies = [b"e%d" % i for i in range(8)]
    config = log_config(kind, ack="demand")
    async with running_gateway(config, base_dir=tmp_path, registry=registry()) as gw:
        await publish(gw, *bodies)
        async with rs_peer(await connect_tcp(gw)) as first:
            await first.send(Subscribe("logs?group=g&from=earliest", 1, 5))
            assert await first.take(1, 5) == bodies[:5]
            await first.send(Request(1, 2))  # e0 and e1 processed
            assert await first.take(1, 7) == bodies[:7]
            await idle()
            assert group(gw, "logs", "g").committed == 2
        await until(lambda: members(gw, "logs", "g") == 0)  # the gateway saw it go
        async with rs_peer(await connect_tcp(gw)) as second:
            await second.send(Subscribe("logs?group=g", 1, 100))
            assert await second.take(1, 6) == bodies[2:]
            await publish(gw, b"after")
            assert await second.take(1, 7) == [*bodies[2:], b"after"]
            await idle()
            assert len(second.elements(1)) == 7  # nothing twice
