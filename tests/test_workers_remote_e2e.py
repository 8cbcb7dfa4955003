"""Stateful destinations across ``gateway run --workers 2``, end to end.

A queue lives in its home worker (``crc32(name) % 2``) and a durable log in
worker 0; ndjson connections held by either worker use them alike. Which
worker holds a connection is read from ``/proc`` (tests/test_workers.py's
helpers); the real timeouts only bound the waits for other processes.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import trio
from harness import start
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver, End
from test_workers import STARTUP, Supervised, connections_of, supervised
from test_workers_topics import EARLY, one_on_each

from gateway.durable.envelope import decode
from gateway.runtime.catalog import home_worker
from protocols.segment.blocking import SegmentClient

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

LISTENER = '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'


def config(tmp_path: Path, destinations: str) -> Path:
    path = tmp_path / "gw.toml"
    path.write_text(
        f'[gateway]\ndrain_timeout = "3s"\ndata_dir = "{tmp_path / "data"}"\n'
        + LISTENER
        + destinations
    )
    return path


async def on_worker(port: int, pids: dict[int, int], index: int) -> NdjsonClient:
    """A connection that worker ``index`` holds (others made on the way are closed)."""
    extra = []
    with trio.fail_after(STARTUP):
        while True:
            before = {i: connections_of(pid, port) for i, pid in pids.items()}
            client = await NdjsonClient.connect("127.0.0.1", port)
            while {i: connections_of(pid, port) for i, pid in pids.items()} == before:
                await trio.sleep(0.01)  # the kernel queue: wait until a worker accepted
            if connections_of(pids[index], port) > before[index]:
                break
            extra.append(client)
    for other in extra:
        await other.aclose()
    return client


async def stop(run: Supervised) -> None:
    run.process.send_signal(signal.SIGTERM)
    with trio.fail_after(STARTUP):
        assert await run.process.wait() == 0, "\n".join(run.lines)


async def test_a_queue_delivery_dropped_unacked_is_redelivered_on_the_other_worker(
    tmp_path: Path,
) -> None:
    name = next(f"jobs{n}" for n in range(100) if home_worker(f"jobs{n}", 2) == 0)
    path = config(tmp_path, f'[[destinations]]\nname = "{name}"\nkind = "queue"\n')
    async with supervised(path) as run:
        pids = run.worker_pids()
        await run.wait_for(r"linked to worker \d", 2)
        clients = await one_on_each(run.port, pids)
        publisher, consumer = clients[0], clients[1]  # the consumer reaches the queue by proxy
        await consumer.subscribe(name, window=10)
        async with trio.open_nursery() as nursery:
            ids = await publisher.publish_nowait([b"job"], name)
            with trio.fail_after(STARTUP):
                delivery = await consumer.receive()
            assert isinstance(delivery, Deliver)
            assert delivery.body == b"job"
            answered = start(nursery, publisher.wait_answers, ids)
            with trio.move_on_after(EARLY):
                await answered.finished.wait()
            assert not answered.done, "the publisher was answered before anyone acked"
            await consumer.aclose()  # gone without acking
            other = await on_worker(run.port, pids, 0)
            await other.subscribe(name, window=10)
            with trio.fail_after(STARTUP):
                again = await other.receive()
            assert isinstance(again, Deliver)
            assert again.body == b"job"
            assert again.redelivered
            await other.ack(again.tag)
            with trio.fail_after(STARTUP):
                (answer,) = await answered.wait()
            assert answer.status == "delivered"
        await publisher.aclose()
        await other.aclose()
        await stop(run)


async def _read_whole(client: NdjsonClient, name: str) -> list[bytes]:
    await client.subscribe(name, start="earliest", end="latest", window=100)
    got: list[bytes] = []
    with trio.fail_after(STARTUP):
        while True:
            event = await client.receive()
            if isinstance(event, End):
                return got
            got.append(event.body)
            await client.ack(event.tag)


async def test_a_durable_log_written_on_both_workers_reads_back_whole_after_a_restart(
    tmp_path: Path,
) -> None:
    """Also through the segment listener, which worker 0 alone serves: what the
    Spark connector reads (its blocking client) is everything both workers took."""
    path = config(
        tmp_path,
        '[[destinations]]\nname = "kept"\nstore = "embedded"\n'
        '[[listeners]]\nname = "seg"\nprotocol = "segment"\nbind = "127.0.0.1:0"\n',
    )
    sent = [b"w%d-%d" % (w, i) for w in (0, 1) for i in range(20)]
    async with supervised(path) as run:
        await run.wait_for(r"linked to worker \d", 2)
        clients = await one_on_each(run.port, run.worker_pids())
        for w, client in clients.items():
            for body in sent[20 * w : 20 * (w + 1)]:
                with trio.fail_after(STARTUP):
                    answer = await client.publish(body, "kept")
                assert answer.status == "delivered", answer.reason
        assert sorted(await _read_whole(clients[1], "kept")) == sorted(sent)
        for client in clients.values():
            await client.aclose()
        assert len(run.matches(r"store: ")) == 1, "a worker other than 0 opened the store"
        await stop(run)
    async with supervised(path) as run:
        await run.wait_for(r"linked to worker \d", 2)
        client = await on_worker(run.port, run.worker_pids(), 1)
        assert sorted(await _read_whole(client, "kept")) == sorted(sent)
        await client.aclose()
        segment = run.matches(r"seg \(segment\) on (127\.0\.0\.1:\d+) \(worker 0 only\); 2 workers")
        assert segment, "the segment listener is not pinned to worker 0"
        read = await trio.to_thread.run_sync(_read_segments, segment[0][1], "kept")
        assert sorted(read) == sorted(sent)
        await stop(run)


def _read_segments(address: str, destination: str) -> list[bytes]:
    """The bodies stored in ``destination``, read as the Spark connector reads them."""
    bodies = []
    with SegmentClient(address, timeout=STARTUP) as client:
        for info in client.partitions(destination):
            for event in client.read(info.segment, info.start, info.end):
                bodies.append(decode(event.payload, destination).body)
    return bodies
