"""kill -9 of a worker of ``gateway run --workers 2`` under load, end to end.

Subscribers (ndjson, acking every delivery) hold a plain topic on both
workers; publishers on both workers send numbered messages and resend what
was not answered ``delivered``. Worker 1 is killed mid-stream: the supervisor
restarts it, the subscriber and the publisher it held reconnect, and every
message a publisher was told was delivered reached a subscriber (nothing
acked is lost); the status shows two running workers again.

Both workers hold a subscriber because a plain topic with no subscriber
anywhere settles a publish at once (nobody listens, as with NATS): with the
only subscriber on the killed worker, what is published meanwhile would be
answered ``delivered`` and reach nobody, by design.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import trio
from interchange_ndjson.client import NdjsonClient
from test_admin import _get
from test_workers import STARTUP, supervised
from test_workers_remote_e2e import _read_segments
from test_workers_replace import on_worker
from waits import until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: Messages each publisher sends.
COUNT = 600


def crash_config(tmp_path: Path) -> Path:
    path = tmp_path / "crash.toml"
    path.write_text(
        '[gateway]\ndrain_timeout = "3s"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
        '[admin]\nbind = "127.0.0.1:0"\n'
    )
    return path


async def subscribe(client: NdjsonClient | None, port: int, received: set[bytes]) -> None:
    """Receive and ack ``news`` on ``client``, then on new connections each time one
    breaks (a subscriber that reconnects), until cancelled."""
    while True:
        try:
            if client is None:
                client = await NdjsonClient.connect("127.0.0.1", port)
                await client.subscribe("news", window=50)
            async with client:
                while True:
                    delivery = await client.receive()
                    received.add(delivery.body)  # type: ignore[union-attr]
                    await client.ack(delivery.tag)  # type: ignore[union-attr]
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            client = None
            await trio.sleep(0.05)


async def publish(
    client: NdjsonClient | None,
    port: int,
    bodies: list[bytes],
    acked: set[bytes],
    destination: str = "news",
) -> None:
    """Publish ``bodies`` to ``destination`` in windows of 10, resending what was not
    delivered, on new connections when one breaks."""
    pending = list(bodies)
    while pending:
        try:
            if client is None:
                client = await NdjsonClient.connect("127.0.0.1", port)
            async with client:
                while pending:
                    window = pending[:10]
                    ids = await client.publish_nowait(window, destination)
                    for body, answer in zip(window, await client.wait_answers(ids), strict=True):
                        if answer.status == "delivered":
                            acked.add(body)
                    pending = [b for b in pending if b not in acked]
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            client = None
            await trio.sleep(0.05)


async def test_kill_9_under_load_loses_nothing_acked(tmp_path: Path) -> None:
    async with supervised(crash_config(tmp_path)) as run:
        admin = (await run.wait_for(r"admin: status page and /api/status on (\S+)"))[0][1]
        await run.wait_for(r"linked to worker \d", 2)
        pids = run.worker_pids()
        subscribers = {i: await on_worker(run.port, pid, pids) for i, pid in pids.items()}
        publishers = {i: await on_worker(run.port, pid, pids) for i, pid in pids.items()}
        received: dict[int, set[bytes]] = {0: set(), 1: set()}
        acked: set[bytes] = set()
        expected = {b"%d-%d" % (i, n) for i in pids for n in range(COUNT)}
        async with trio.open_nursery() as nursery:
            for i, client in subscribers.items():
                await client.subscribe("news", window=50)
                nursery.start_soon(subscribe, client, run.port, received[i])
            # Each worker knows the other's subscriber before the load starts.
            await _probe(publishers, received)
            async with trio.open_nursery() as load:
                for i, client in publishers.items():
                    bodies = [b"%d-%d" % (i, n) for n in range(COUNT)]
                    load.start_soon(publish, client, run.port, bodies, acked)
                await until(lambda: len(acked) >= COUNT // 2, timeout=STARTUP)
                assert len(acked) < len(expected), "the load was over before the kill"
                os.kill(pids[1], signal.SIGKILL)
                await run.wait_for(rf"worker 1 \(pid {pids[1]}\) exited with status -9")
                await run.wait_for(r"worker 1 started", 2)
            assert acked == expected
            everything = received[0] | received[1]
            assert acked <= everything, sorted(acked - everything)[:10]
            nursery.cancel_scope.cancel()
        assert run.worker_pids()[1] != pids[1]
        status = await _status(admin)
        assert [(w["index"], w["running"]) for w in status["workers"]] == [(0, True), (1, True)]
        assert status["workers"][1]["pid"] == run.worker_pids()[1]
        run.process.send_signal(signal.SIGTERM)
        with trio.fail_after(STARTUP):
            assert await run.process.wait() == 0, "\n".join(run.lines)


async def test_kill_9_of_the_store_worker_loses_nothing_acked(tmp_path: Path) -> None:
    """Worker 0 holds the store: killed while both workers' publishers store into a
    durable log, it is restarted and recovers the store; every message either
    publisher was told was delivered is in the log, read as the Spark connector
    reads it (resends may have stored some twice)."""
    path = tmp_path / "durable.toml"
    path.write_text(
        f'[gateway]\ndrain_timeout = "3s"\ndata_dir = "{tmp_path / "data"}"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
        '[[listeners]]\nname = "seg"\nprotocol = "segment"\nbind = "127.0.0.1:0"\n'
        '[[destinations]]\nname = "kept"\nstore = "embedded"\n'
    )
    async with supervised(path) as run:
        seg = run.matches(r"seg \(segment\) on (127\.0\.0\.1:\d+) \(worker 0 only\)")[0][1]
        await run.wait_for(r"linked to worker \d", 2)
        pids = run.worker_pids()
        publishers = {i: await on_worker(run.port, pid, pids) for i, pid in pids.items()}
        acked: set[bytes] = set()
        expected = {b"%d-%d" % (i, n) for i in pids for n in range(COUNT)}
        async with trio.open_nursery() as load:
            for i, client in publishers.items():
                bodies = [b"%d-%d" % (i, n) for n in range(COUNT)]
                load.start_soon(publish, client, run.port, bodies, acked, "kept")
            await until(lambda: len(acked) >= COUNT // 2, timeout=STARTUP)
            assert len(acked) < len(expected), "the load was over before the kill"
            os.kill(pids[0], signal.SIGKILL)
            await run.wait_for(rf"worker 0 \(pid {pids[0]}\) exited with status -9")
            await run.wait_for(r"worker 0 started", 2)
        assert acked == expected
        stored = await trio.to_thread.run_sync(_read_segments, seg, "kept")
        assert acked <= set(stored), sorted(acked - set(stored))[:10]
        run.process.send_signal(signal.SIGTERM)
        with trio.fail_after(STARTUP):
            assert await run.process.wait() == 0, "\n".join(run.lines)


async def _probe(publishers: dict[int, NdjsonClient], received: dict[int, set[bytes]]) -> None:
    """Probe until what each worker's publisher sends reaches both subscribers."""
    with trio.fail_after(STARTUP):
        for index, publisher in publishers.items():
            n = 0
            while True:
                body = b"probe %d-%d" % (index, n)
                await publisher.wait_answers(await publisher.publish_nowait([body], "news"))
                with trio.move_on_after(0.2):
                    await until(lambda b=body: b in received[0] and b in received[1])  # type: ignore[misc]
                    break
                n += 1


async def _status(admin: str) -> dict[str, object]:
    async def ready() -> dict[str, object] | None:
        reply = await trio.to_thread.run_sync(_get, admin, "/api/status")
        status = reply.json()
        return status if status.get("ready") else None

    with trio.fail_after(STARTUP):
        while (status := await ready()) is None:
            await trio.sleep(0.05)
    return status
