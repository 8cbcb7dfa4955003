"""End-to-end bridges through a real ``gateway run``, with 1 worker and with 2: same assertions.

Issue 27 asks that a gateway with two workers passes the bridge tests one
worker passes. The in-process bridge tests look into the gateway's hub, which
a gateway of several processes does not have, so these run the real command
(``gateway run CONFIG``, or ``--workers 2``) and observe it from outside only:
the clients' acks and replies, what subscribers of every protocol received,
a second gateway acting as the sink of a relay, and ``/api/status`` of the
admin endpoint. Each protocol's own client connects over real sockets, and
which worker holds each connection is read from ``/proc``: with 2 workers
every bridge has clients on both, so a message crosses between the workers
(a topic's forwarding, with receipts settling across the hop) or each
worker's own upstream pool carries its part (relays, the ttrpc proxy).

1. Lumberjack senders → an in-memory topic → ndjson subscribers;
2. reactive streams both ways with ndjson (a peer's publisher into a topic,
   and an ndjson publisher out to a peer's subscription);
3. a Lumberjack relay to a second gateway, everything acked arriving once;
4. ttrpc clients → the proxy → a ttrpc Echo service;
5. Micromessage2 publishers → a topic → ndjson subscribers.

A subscription takes effect on the other worker a moment after it landed on
its own, and ndjson's ``sub`` answers nothing: before sending, each test
probes the topic from every worker until every subscriber heard each
(:func:`workers_helpers.until_heard`).
"""

from __future__ import annotations

import functools
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest
import trio
from google.protobuf import wrappers_pb2
from harness import start
from interchange_ndjson.client import NdjsonClient
from interop.echo_service import SERVICE, serve_echo
from waits import until, until_async
from workers_helpers import (
    GatewayProcess,
    NdInbox,
    RsInbox,
    connections_to,
    counted,
    destination,
    place,
    running,
    status,
    until_heard,
    worker_connections,
)

from protocols.lumberjack.client import ClientSettings, LumberjackClient
from protocols.micromessage import Client as MmClient
from protocols.reactive import Ending, Peer
from protocols.ttrpc.client import CallKind, open_client

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

WORKERS = pytest.mark.parametrize("workers", [1, 2], ids=["1-worker", "2-workers"])
#: Seconds in which an answer that must wait would have come early.
EARLY = 0.3
#: Seconds any one exchange may take (a loaded machine, two cores shared).
GUARD = 20.0
#: Lumberjack windows of this many events (so each sender sends several).
WINDOW = 20

ADMIN = '[admin]\nbind = "127.0.0.1:0"\n'


def config(tmp_path: Path, name: str, *listeners: str, extra: str = "") -> Path:
    """A config file: ``drain_timeout``, the listeners given as TOML tables, the admin
    endpoint, and ``extra`` (upstreams, routes)."""
    path = tmp_path / f"{name}.toml"
    path.write_text('[gateway]\ndrain_timeout = "2s"\n' + "".join(listeners) + extra + ADMIN)
    return path


def listener(name: str, protocol: str, bind: str, **options: str) -> str:
    lines = "".join(f'{key} = "{value}"\n' for key, value in options.items())
    return f'[[listeners]]\nname = "{name}"\nprotocol = "{protocol}"\nbind = "{bind}:0"\n{lines}'


ND = listener("nd", "ndjson", "127.0.0.2")


async def nd_subscribers(
    gw: GatewayProcess, nursery: trio.Nursery, topic: str
) -> dict[int, NdInbox]:
    """One ndjson subscriber of ``topic`` on each worker, acking what it receives."""
    inboxes = {}
    for index, (stream,) in (await place(gw, "nd", 1)).items():
        inboxes[index] = NdInbox(NdjsonClient(stream), index)
        await inboxes[index].subscribe(nursery, topic)
    return inboxes


async def heard_everywhere(inboxes: dict[int, NdInbox], topic: str) -> None:
    """Every subscriber of ``topic`` hears what each worker publishes (the subscribers
    themselves publish the probes)."""
    await until_heard({i: x.client for i, x in inboxes.items()}, topic, list(inboxes.values()))


def both_workers_took_part(gw: GatewayProcess, placed: dict[int, list[Any]]) -> None:
    assert sorted(placed) == list(range(gw.workers))
    assert all(placed.values()), placed


async def settled(gw: GatewayProcess, *topics: str) -> dict[str, Any]:
    """The status once every delivery of ``topics`` was acked (the last probes' acks
    may still be on their way): its counters no longer move while nothing is sent."""
    answer: dict[str, Any] = {}

    async def acked() -> bool:
        answer.update(await status(gw))
        found = [destination(answer, topic) for topic in topics]
        return all(d["acked"] == d["delivered"] for d in found)

    await until_async(acked, timeout=GUARD)
    return answer


async def connections_match_proc(gw: GatewayProcess, *listeners: str) -> None:
    """The admin endpoint's connections per worker are those ``/proc`` shows each
    worker holding on ``listeners`` (the single gateway's: its own)."""
    assert worker_connections(await status(gw)) == gw.connections(*listeners)


def members(answer: dict[str, Any], topic: str) -> int:
    return sum(g["members"] for g in destination(answer, topic)["groups"])


def copies(before: dict[str, Any], after: dict[str, Any], topic: str) -> tuple[int, int]:
    """What ``topic`` delivered and what was acked of it between two statuses."""
    return counted(before, after, topic, "delivered"), counted(before, after, topic, "acked")


async def close_all(*clients: Any) -> None:
    for client in clients:
        await client.aclose()


# -- 1. Lumberjack senders → topic → ndjson subscribers -----------------------------------------


async def send(client: LumberjackClient, events: list[dict[str, str]]) -> None:
    with trio.fail_after(GUARD):
        assert await client.send(events) == len(events)


def events_of(tag: str, count: int) -> list[dict[str, str]]:
    return [{"id": f"{tag}.{n}", "message": f"event {n} of {tag}"} for n in range(count)]


@WORKERS
async def test_lumberjack_senders_reach_ndjson_subscribers_on_every_worker(
    tmp_path: Path, workers: int
) -> None:
    """Two senders per worker, a subscriber on each worker: every event acked to a
    sender reached every subscriber exactly once, and a window is acked only once
    the subscriber on the other worker acked it."""
    lj = listener("lj", "lumberjack", "127.0.0.1", destination="logs")
    async with running(config(tmp_path, "lj", lj, ND), workers) as gw:
        async with trio.open_nursery() as nursery:
            inboxes = await nd_subscribers(gw, nursery, "logs")
            await heard_everywhere(inboxes, "logs")
            before = await settled(gw, "logs")
            placed = await place(gw, "lj", 2)
            both_workers_took_part(gw, placed)
            settings = ClientSettings(bulk_max_size=WINDOW)
            senders = {
                (i, k): LumberjackClient(stream, settings)
                for i, streams in placed.items()
                for k, stream in enumerate(streams)
            }

            # One window from worker 0, the last worker's subscriber holding its acks.
            window = events_of("window", 5)
            held = inboxes[workers - 1]
            held.hold = True
            sending = start(nursery, send, senders[0, 0], window)
            ids = [e["id"] for e in window]
            await until(lambda: all(x.ids() == ids for x in inboxes.values()), timeout=GUARD)
            with trio.move_on_after(EARLY):
                await sending.finished.wait()
            assert not sending.done, "the window was acked before every subscriber acked"
            await held.release()
            await sending.wait()

            expected = list(ids)
            async with trio.open_nursery() as senders_running:
                for (i, k), client in senders.items():
                    events = events_of(f"{i}.{k}", 3 * WINDOW)
                    expected += [e["id"] for e in events]
                    senders_running.start_soon(send, client, events)
            for inbox in inboxes.values():  # each had acked its copy before the sender's ack
                assert Counter(inbox.ids()) == Counter(expected)  # every id once

            await connections_match_proc(gw, "lj", "nd")
            after = await settled(gw, "logs")
            assert members(after, "logs") == len(inboxes)
            copied = len(expected) * len(inboxes)
            assert copies(before, after, "logs") == (copied, copied)
            nursery.cancel_scope.cancel()
        await close_all(*senders.values(), *(x.client for x in inboxes.values()))


# -- 2. reactive streams ↔ topic ↔ ndjson -------------------------------------------------------


async def elements(tag: bytes, count: int, go: trio.Event) -> AsyncIterator[bytes]:
    """``count`` elements, once ``go`` is set."""
    await go.wait()
    for n in range(count):
        yield b"%s.%d" % (tag, n)


@WORKERS
async def test_reactive_streams_both_ways_with_ndjson_across_workers(
    tmp_path: Path, workers: int
) -> None:
    """A peer on each worker publishes ``feed`` (the listener subscribes to it into the
    topic ``rsfeed``) and subscribes to the topic ``ndfeed``; an ndjson client on
    each worker subscribes to ``rsfeed`` and publishes to ``ndfeed``. Every element
    reaches every ndjson subscriber once; every message acked to an ndjson publisher
    reaches every peer once."""
    rs = listener("rs", "reactive", "127.0.0.1") + (
        'publishers = ["ndfeed"]\n'
        '[[listeners.subscriptions]]\npublisher = "feed"\ndestination = "rsfeed"\n'
    )
    go = trio.Event()
    endings: list[Ending] = []
    async with running(config(tmp_path, "rs", rs, ND), workers) as gw:
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            placed = await place(gw, "rs", 1)
            both_workers_took_part(gw, placed)
            peers: dict[int, Peer] = {}
            for i, (stream,) in placed.items():
                peers[i] = await stack.enter_async_context(Peer(stream))
                # Offered at once: the listener subscribes as soon as our hello arrives.
                await nursery.start(_publish, peers[i], elements(b"r%d" % i, 50, go), endings)
            inboxes = await nd_subscribers(gw, nursery, "rsfeed")
            rs_inboxes = [RsInbox(i) for i in peers]
            for inbox in rs_inboxes:
                await nursery.start(inbox.subscribe, peers[inbox.worker], "ndfeed")
            await heard_everywhere(inboxes, "rsfeed")
            await until_heard({i: x.client for i, x in inboxes.items()}, "ndfeed", rs_inboxes)
            before = await settled(gw, "rsfeed", "ndfeed")

            # Peers → rsfeed → ndjson subscribers.
            go.set()
            await until(lambda: len(endings) == len(peers), timeout=GUARD)
            assert set(endings) == {Ending.COMPLETED}
            expected = Counter(b"r%d.%d" % (i, n) for i in peers for n in range(50))
            for nd_inbox in inboxes.values():
                await until(functools.partial(_has, nd_inbox, 50 * workers), timeout=GUARD)
                assert Counter(nd_inbox.bodies()) == expected

            # ndjson publishers → ndfeed → peers.
            expected = Counter(b"n%d.%d" % (i, n) for i in inboxes for n in range(50))
            async with trio.open_nursery() as publishing:
                for i, nd_inbox in inboxes.items():
                    bodies = [b"n%d.%d" % (i, n) for n in range(50)]
                    publishing.start_soon(_delivered, nd_inbox.client, bodies, "ndfeed")
            for rs_inbox in rs_inboxes:
                await until(functools.partial(_has, rs_inbox, 50 * workers), timeout=GUARD)
                assert Counter(rs_inbox.bodies()) == expected

            await connections_match_proc(gw, "rs", "nd")
            after = await settled(gw, "rsfeed", "ndfeed")
            assert (members(after, "rsfeed"), members(after, "ndfeed")) == (workers, workers)
            copied = 50 * workers * len(inboxes)  # as many subscribers of each kind
            assert copies(before, after, "rsfeed") == (copied, copied)
            assert copies(before, after, "ndfeed") == (copied, copied)
            nursery.cancel_scope.cancel()
        await close_all(*(x.client for x in inboxes.values()))


def _has(inbox: NdInbox | RsInbox, count: int) -> bool:
    return len(inbox.bodies()) >= count


async def _publish(
    peer: Peer,
    source: AsyncIterator[bytes],
    endings: list[Ending],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Offer ``feed`` (started once offered), and note how its stream ended."""
    endings.append(await peer.publish("feed", source, task_status=task_status))


async def _delivered(client: NdjsonClient, bodies: list[bytes], topic: str) -> None:
    with trio.fail_after(GUARD):
        answers = await client.wait_answers(await client.publish_nowait(bodies, topic))
    assert {a.status for a in answers} == {"delivered"}


# -- 3. a Lumberjack relay to a second gateway ---------------------------------------------------


@WORKERS
async def test_a_lumberjack_relay_delivers_everything_acked_exactly_once(
    tmp_path: Path, workers: int
) -> None:
    """Senders on every worker of the relay; each worker relays with its own upstream
    connection to the sink, a plain gateway whose subscriber gets every acked event
    once, and whose listener counted each event once (nothing was sent twice)."""
    sink_lj = listener("lj", "lumberjack", "127.0.0.1", destination="logs")
    async with running(config(tmp_path, "sink", sink_lj, ND), 1) as sink:
        async with trio.open_nursery() as nursery:
            (inbox,) = (await nd_subscribers(sink, nursery, "logs")).values()
            await heard_everywhere({0: inbox}, "logs")
            before = await settled(sink, "logs")
            host, port = sink.address("lj")
            upstream = (
                f'[[upstreams]]\nname = "sink"\nprotocol = "lumberjack"\n'
                f'connect = "{host}:{port}"\nbackoff_initial = "50ms"\nbackoff_max = "200ms"\n'
                '[[routes]]\nfrom = "relay"\nto = "upstream:sink"\n'
            )
            relay_lj = listener("lj", "lumberjack", "127.0.0.1", destination="relay")
            async with running(config(tmp_path, "relay", relay_lj, extra=upstream), workers) as gw:
                placed = await place(gw, "lj", 2)
                both_workers_took_part(gw, placed)
                settings = ClientSettings(bulk_max_size=WINDOW)
                expected: list[str] = []
                async with trio.open_nursery() as senders_running:
                    for i, streams in placed.items():
                        for k, stream in enumerate(streams):
                            events = events_of(f"{i}.{k}", 3 * WINDOW)
                            expected += [e["id"] for e in events]
                            client = LumberjackClient(stream, settings)
                            senders_running.start_soon(send, client, events)
                assert sorted(inbox.ids()) == sorted(expected)  # each once, before its ack
                pids = gw.pids()
                assert all(connections_to(pids[i], port) for i in pids), "a worker's own pool"
                await connections_match_proc(gw, "lj")
                relayed = await status(gw)
                assert [up["state"] for up in relayed["upstreams"]] == ["connected"]
                relay = destination(relayed, "upstream:sink")
                assert (relay["received"], relay["acked"]) == (len(expected), len(expected))
                assert members(relayed, "upstream:sink") == workers  # each worker's own
                for streams in placed.values():
                    await close_all(*streams)
            after = await settled(sink, "logs")
            assert counted(before, after, "logs", "received") == len(expected)
            assert copies(before, after, "logs") == (len(expected), len(expected))
            nursery.cancel_scope.cancel()
        await inbox.client.aclose()


# -- 4. ttrpc clients → proxy → Echo service ----------------------------------------------------


def bytes_value(value: bytes) -> bytes:
    return wrappers_pb2.BytesValue(value=value).SerializeToString()


async def echo_calls(client: Any, tag: bytes, count: int) -> None:
    """``count`` concurrent Echo calls and a streaming Count, each checked."""
    with trio.fail_after(GUARD):
        async with trio.open_nursery() as nursery:
            for n in range(count):
                nursery.start_soon(_echo, client, b"%s.%d" % (tag, n))
        async with client.stream(
            SERVICE, "Count", CallKind.SERVER_STREAMING, bytes_value(b"3")
        ) as call:
            counted = [wrappers_pb2.BytesValue.FromString(m).value async for m in call]
        assert counted == [b"0", b"1", b"2"]


async def _echo(client: Any, value: bytes) -> None:
    reply = await client.call(SERVICE, "Echo", bytes_value(value))
    assert wrappers_pb2.BytesValue.FromString(reply).value == value


@WORKERS
async def test_ttrpc_calls_through_the_proxy_on_every_worker(tmp_path: Path, workers: int) -> None:
    """Two client connections per worker, each with 20 concurrent calls and a stream:
    every call gets its reply, and every worker reached the service on its own."""
    async with trio.open_nursery() as backend:
        bound: str = await backend.start(serve_echo, "tcp:127.0.0.1:0")
        port = int(bound.rsplit(":", 1)[1])
        rpc = listener("rpc", "ttrpc", "127.0.0.1") + (
            'services = [{match = "interchange.test.*", upstream = "echo"}]\n'
        )
        upstream = (
            f'[[upstreams]]\nname = "echo"\nprotocol = "ttrpc"\nconnect = ["127.0.0.1:{port}"]\n'
            'backoff_initial = "20ms"\n'
        )
        async with running(config(tmp_path, "rpc", rpc, extra=upstream), workers) as gw:
            placed = await place(gw, "rpc", 2)
            both_workers_took_part(gw, placed)
            async with AsyncExitStack() as stack:
                clients = {
                    (i, k): await stack.enter_async_context(open_client(stream))
                    for i, streams in placed.items()
                    for k, stream in enumerate(streams)
                }
                async with trio.open_nursery() as calling:
                    for (i, k), client in clients.items():
                        calling.start_soon(echo_calls, client, b"%d.%d" % (i, k), 20)
                pids = gw.pids()
                assert all(connections_to(pids[i], port) for i in pids), "a worker's own pool"
                await connections_match_proc(gw, "rpc")
                answer = await status(gw)
                assert [up["state"] for up in answer["upstreams"]] == ["connected"]
        backend.cancel_scope.cancel()


# -- 5. Micromessage2 publishers → topic → ndjson subscribers -----------------------------------


async def mm_publish(client: MmClient, bodies: list[bytes]) -> None:
    with trio.fail_after(GUARD):
        for body in bodies:
            await client.publish("mmfeed", body, {"kind": "bridge"})
        await client.wait_acked()


@WORKERS
async def test_micromessage_publishers_reach_ndjson_subscribers_on_every_worker(
    tmp_path: Path, workers: int
) -> None:
    """Two publishers per worker (no resend: a long expiry), a subscriber on each worker:
    every message acked to a publisher reached every subscriber exactly once."""
    mm = listener("mm", "micromessage", "127.0.0.1")
    async with running(config(tmp_path, "mm", mm, ND), workers) as gw, AsyncExitStack() as stack:
        placed = await place(gw, "mm", 2)
        both_workers_took_part(gw, placed)
        publishers = {
            (i, k): await stack.enter_async_context(await MmClient.over(stream, expire=GUARD))
            for i, streams in placed.items()
            for k, stream in enumerate(streams)
        }
        async with trio.open_nursery() as nursery:
            inboxes = await nd_subscribers(gw, nursery, "mmfeed")
            await heard_everywhere(inboxes, "mmfeed")
            before = await settled(gw, "mmfeed")
            expected: list[bytes] = []
            async with trio.open_nursery() as publishing:
                for (i, k), client in publishers.items():
                    bodies = [b"m%d.%d.%d" % (i, k, n) for n in range(50)]
                    expected += bodies
                    publishing.start_soon(mm_publish, client, bodies)
            for inbox in inboxes.values():  # each had acked its copy before the publisher's ack
                assert Counter(inbox.bodies()) == Counter(expected)
            await connections_match_proc(gw, "mm", "nd")
            after = await settled(gw, "mmfeed")
            assert members(after, "mmfeed") == len(inboxes)
            copied = len(expected) * len(inboxes)
            assert copies(before, after, "mmfeed") == (copied, copied)
            nursery.cancel_scope.cancel()
        await close_all(*(x.client for x in inboxes.values()))


# -- the status counts a topic's messages as one gateway would ---------------------------------


@pytest.mark.parametrize("workers", [1, 2], ids=["1-worker", "2-workers"])
async def test_the_status_counts_a_message_published_to_a_topic_once(
    tmp_path: Path, workers: int
) -> None:
    """A subscriber on each worker, each publishing ten: the topic received what was
    published, and delivered and had acked one copy per subscriber."""
    async with running(config(tmp_path, "nd", ND), workers) as gw:
        async with trio.open_nursery() as nursery:
            inboxes = await nd_subscribers(gw, nursery, "news")
            await heard_everywhere(inboxes, "news")
            before = await settled(gw, "news")
            for i, inbox in inboxes.items():
                await _delivered(inbox.client, [b"x%d.%d" % (i, n) for n in range(10)], "news")
            after = await settled(gw, "news")
            copied = 10 * len(inboxes) ** 2  # each one's ten, to every subscriber
            assert copies(before, after, "news") == (copied, copied)
            assert counted(before, after, "news", "received") == 10 * len(inboxes)
            nursery.cancel_scope.cancel()
        await close_all(*(x.client for x in inboxes.values()))
