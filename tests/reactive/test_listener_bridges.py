"""The reactive listener bridged to other protocols, end to end over real sockets.

* Demand across protocols: an ndjson publisher into a topic with a small buffer is
  answered only as far as the reactive subscriber's demand (and the buffer) let the
  messages through, and the rest are answered as it requests more.
* ``ack = "demand"`` with a named group: a subscriber that drops the connection loses
  nothing; the next member of the group gets every unprocessed element again (memory,
  durable and partitioned logs; a topic, whose ndjson publisher waits for that member).
* Beats (``pylogbeat``) into a Lumberjack listener, out to a reactive subscriber with a
  small demand: the Beats window waits on keepalives until the subscriber requests.
* ``from=``/``to=`` on memory, durable and partitioned logs.
* The listener over TLS, a unix socket, ``ws://`` and ``wss://``.

Real sockets (and a thread for pylogbeat) need the real clock: every wait is on a
condition with a guard, and "nothing more arrived" is checked once every task is
blocked (:func:`bridge_helpers.idle`), not after a sleep.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pylogbeat
import pytest
import trio
from harness import host_port, running_gateway, start
from interchange_ndjson.client import NdjsonClient
from waits import members, subscribed, until

from gateway.config.certs import init_dir
from gateway.core.model import Message, Outcome, Position
from gateway.runtime.gateway import Gateway
from protocols.reactive import Accepted, Request, Subscribe

from .bridge_helpers import (
    GUARD,
    Answers,
    RsPeer,
    connect_tcp,
    connect_tls,
    connect_unix,
    connect_ws,
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


@pytest.mark.parametrize("kind", ["memory", "durable", "partitioned"])
async def test_a_crashed_member_of_a_group_loses_nothing(kind: str, tmp_path: Path) -> None:
    """The member is sent seven, says it processed two (request(2) beyond its initial 5)
    and drops the connection: the next member gets the five it had not processed
    again, then what follows, and not the two it had. (Three runs: on the partitioned
    log, one to each partition, and the order holds within each.)"""
    runs = [[b"r%d.%d" % (r, i) for i in range(n)] for r, n in enumerate((3, 3, 2))]
    bodies = [body for run in runs for body in run]
    same = (lambda a, b: per_run(a) == per_run(b)) if kind == "partitioned" else list.__eq__
    config = log_config(kind, ack="demand")
    async with running_gateway(config, base_dir=tmp_path, registry=registry()) as gw:
        for run in runs:
            await publish(gw, *run)
        async with rs_peer(await connect_tcp(gw)) as first:
            await first.send(Subscribe("logs?group=g&from=earliest", 1, 5))
            await first.take(1, 5)
            await first.send(Request(1, 2))  # the first two are processed
            sent = await first.take(1, 7)
            await idle()
            assert len(first.elements(1)) == 7
            assert group(gw, "logs", "g").committed == 2
        assert same(sent, [b for b in bodies if b in sent])
        unprocessed = [b for b in bodies if b not in sent[:2]]
        await until(lambda: members(gw, "logs", "g") == 0)  # the gateway saw it go
        async with rs_peer(await connect_tcp(gw)) as second:
            await second.send(Subscribe("logs?group=g", 1, 100))
            assert same(await second.take(1, 6), unprocessed)
            await publish(gw, b"after")
            assert (await second.take(1, 7))[6] == b"after"
            await idle()
            assert len(second.elements(1)) == 7  # nothing twice


async def test_a_crashed_member_on_a_topic_leaves_the_publisher_waiting_for_the_next() -> None:
    """A topic's named group, an ndjson publisher: only what a member processed is
    answered; what the crashed member had not goes to the next member and is answered
    once that one has processed it."""
    config = {
        "gateway": {"drain_timeout": "100ms"},
        "listeners": [rs_listener(ack="demand"), ND],
        "destinations": [{"name": "feed", "groups": ["g"]}],
    }
    bodies = BODIES[:6]
    async with (
        running_gateway(config, registry=registry()) as gw,
        await NdjsonClient.connect(*host_port(gw.addresses["nd"][0])) as pub,
        trio.open_nursery() as nursery,
    ):
        ids = [i for body in bodies for i in await pub.publish_nowait([body], "feed")]
        answers = Answers(pub)
        answers.watch(nursery, ids)
        async with rs_peer(await connect_tcp(gw)) as first:
            await first.send(Subscribe("feed?group=g", 1, 4))
            assert await first.take(1, 4) == bodies[:4]
            await first.send(Request(1, 1))  # the first is processed
            assert await first.take(1, 5) == bodies[:5]
            await until(lambda: len(answers.got) >= 1)
        await until(lambda: members(gw, "feed", "g") == 0)
        await idle()
        assert answers.got == {ids[0]: "delivered"}  # the crash answered nothing
        async with rs_peer(await connect_tcp(gw)) as second:
            await second.send(Subscribe("feed?group=g", 1, 5))
            assert await second.take(1, 5) == bodies[1:]
            await idle()
            assert len(answers.got) == 1  # sent again, not processed yet
            await second.send(Request(1, 5))
            await until(lambda: len(answers.got) == 6)
            assert set(answers.got.values()) == {"delivered"}
            await idle()
            assert second.elements(1) == bodies[1:]


# -- from= and to= on logs -------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "durable"])
async def test_from_and_to_on_a_log(kind: str, tmp_path: Path) -> None:
    bodies = [b"e%d" % i for i in range(10)]
    async with running_gateway(log_config(kind), base_dir=tmp_path, registry=registry()) as gw:
        await publish(gw, *bodies)
        async with rs_peer(await connect_tcp(gw)) as peer:
            await peer.send(
                Subscribe("logs?from=earliest", 1, 100),
                Subscribe("logs?from=4", 2, 100),
                Subscribe("logs?from=2&to=5", 3, 100),
                Subscribe("logs?from=earliest&to=3", 4, 1),  # less demand than the range
                Subscribe("logs?from=8&to=12", 5, 100),  # ends beyond the tail
                Subscribe("logs", 6, 100),  # latest: only what comes next
            )
            assert await peer.take(1, 10) == bodies
            assert await peer.take(2, 6) == bodies[4:]
            await peer.until(lambda: peer.completed(3))
            assert peer.elements(3) == bodies[2:5]
            assert await peer.take(4, 1) == bodies[:1]
            assert await peer.take(5, 2) == bodies[8:]
            await idle()
            assert not peer.completed(4)  # e1 and e2 wait for demand, the end behind them
            assert not peer.completed(5)  # offsets 10 and 11 are still to come
            assert peer.elements(6) == []

            await peer.send(Request(4, 5))
            await peer.until(lambda: peer.completed(4))
            assert peer.elements(4) == bodies[:3]

            await publish(gw, b"e10", b"e11", b"e12")
            await peer.until(lambda: peer.completed(5))
            assert peer.elements(5) == [b"e8", b"e9", b"e10", b"e11"]
            assert await peer.take(6, 3) == [b"e10", b"e11", b"e12"]
            await idle()
            assert len(peer.elements(1)) == 13  # the open-ended ones go on
            assert not peer.completed(1)


async def test_positions_resume_every_partition(tmp_path: Path) -> None:
    """Three runs of four go one to each partition; ``from=`` positions start each
    partition at its own offset and ``to=`` positions end each at its own."""
    config = log_config("partitioned")
    async with running_gateway(config, base_dir=tmp_path, registry=registry()) as gw:
        placed: dict[int, list[bytes]] = {}
        for run in range(3):
            bodies = [b"r%d.%d" % (run, i) for i in range(4)]
            positions = await publish(gw, *bodies)
            (partition,) = {p.partition for p in positions}
            assert [p.offset for p in positions] == [0, 1, 2, 3]
            placed[partition] = bodies
        assert sorted(placed) == [0, 1, 2]
        async with rs_peer(await connect_tcp(gw)) as peer:
            await peer.send(
                Subscribe("logs?from=0:1,1:2,2:3", 1, 100),
                Subscribe("logs?from=0:0,1:1,2:2&to=0:2,1:3,2:4", 2, 100),
            )
            expected = placed[0][1:] + placed[1][2:] + placed[2][3:]
            got = await peer.take(1, len(expected))
            assert sorted(got) == sorted(expected)
            assert per_run(got) == per_run(expected)  # in order within each partition
            await peer.until(lambda: peer.completed(2))
            got = peer.elements(2)
            assert per_run(got) == per_run(placed[0][:2] + placed[1][1:3] + placed[2][2:4])
            await idle()
            assert len(peer.elements(1)) == len(expected)


def per_run(bodies: list[bytes]) -> dict[bytes, list[bytes]]:
    """``bodies`` by their run (the prefix before the dot), each in the order given."""
    runs: dict[bytes, list[bytes]] = {}
    for body in bodies:
        runs.setdefault(body.partition(b".")[0], []).append(body)
    return runs


# -- transports -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return init_dir(tmp_path_factory.mktemp("certs"))


def transport_listener(transport: str, certs: dict[str, Path], tmp: Path) -> dict[str, Any]:
    tls = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    binds: dict[str, dict[str, Any]] = {
        "tls": {"bind": "127.0.0.1:0", "tls": tls},
        "unix": {"bind": f"unix:{tmp / 'rs.sock'}"},
        "ws": {"bind": "ws://127.0.0.1:0/rs"},
        "wss": {"bind": "wss://127.0.0.1:0/rs", "tls": tls},
    }
    return rs_listener(part_size=1024, **binds[transport])


async def connect(transport: str, gw: Gateway, ca: Path) -> trio.abc.Stream:
    if transport == "tls":
        return await connect_tls(gw, ca)
    if transport == "unix":
        return await connect_unix(gw)
    return await connect_ws(gw, ca if transport == "wss" else None)


@pytest.mark.parametrize("transport", ["tls", "unix", "ws", "wss"])
async def test_the_listener_over(transport: str, certs: dict[str, Path], tmp_path: Path) -> None:
    """Within demand, with an element split in parts across the transport's frames."""
    big = bytes(range(256)) * 20  # 5120 bytes: five parts of at most 1024
    config = {
        "gateway": {"drain_timeout": "100ms"},
        "listeners": [transport_listener(transport, certs, tmp_path)],
        "destinations": [LOGS["memory"]],
    }
    async with running_gateway(config, registry=registry()) as gw:
        await publish(gw, b"one", big, b"three")
        async with rs_peer(await connect(transport, gw, certs["ca_cert"])) as peer:
            await peer.send(Subscribe("logs?from=earliest", 1, 2))
            assert await peer.answer(1) == Accepted(1, 0)
            assert await peer.take(1, 2) == [b"one", big]
            await idle()
            assert len(peer.elements(1)) == 2
            await peer.send(Request(1, 2))
            assert await peer.take(1, 3) == [b"one", big, b"three"]
            await publish(gw, b"live")
            assert await peer.take(1, 4) == [b"one", big, b"three", b"live"]


# -- Beats (pylogbeat) -> Lumberjack listener -> topic -> reactive subscriber -----------------


def beats_config() -> dict[str, Any]:
    lumberjack = {
        "name": "lj",
        "protocol": "lumberjack",
        "bind": "127.0.0.2:0",
        "destination": "beats",
        "keepalive": "50ms",
    }
    return {"gateway": {"drain_timeout": "100ms"}, "listeners": [rs_listener(), lumberjack]}


def pylogbeat_send(host: str, port: int, windows: list[list[dict[str, Any]]]) -> int:
    """Each window on one pylogbeat connection (``send`` returns once it is acked; keepalive
    acks it reads and waits on); its last sequence number."""
    with pylogbeat.PyLogBeatClient(host, port, timeout=10) as client:
        for window in windows:
            client.send(window)
        return int(client._sequence)


def keepalives(gw: Gateway) -> float:
    return gw.metrics.value("lumberjack_keepalives_total", {"listener": "lj"}) or 0.0


async def test_a_beats_window_waits_on_keepalives_for_the_subscribers_demand() -> None:
    """Demand 2 for a window of 10: the window is held (pylogbeat's ``send`` does not
    return) over several keepalives; a request for the rest lets it and the next
    window through, every event once and in order."""
    windows = [[{"w": w, "i": i} for i in range(size)] for w, size in enumerate((10, 5))]
    events = [event for window in windows for event in window]
    async with (
        running_gateway(beats_config(), registry=registry()) as gw,
        rs_peer(await connect_tcp(gw)) as peer,
    ):
        await peer.send(Subscribe("beats", 1, 2))
        assert await peer.answer(1) == Accepted(1, 0)
        await subscribed(gw, "beats")
        host, port = host_port(gw.addresses["lj"][0])
        async with trio.open_nursery() as nursery:
            sending = start(nursery, in_thread, pylogbeat_send, host, port, windows)
            assert [json.loads(e) for e in await peer.take(1, 2)] == events[:2]
            await until(lambda: keepalives(gw) >= 3)  # held across three keepalives
            await idle()
            assert not sending.done
            assert len(peer.elements(1)) == 2
            assert group(gw, "beats").queued == 8

            await peer.send(Request(1, 13))
            with trio.fail_after(GUARD):
                assert await sending.wait() == 15  # both windows acked
        await idle()
        assert [json.loads(e) for e in peer.elements(1)] == events


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a worker thread, abandoned if the test is cancelled."""
    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)
