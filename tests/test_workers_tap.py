"""``GET /api/tap`` on the supervisor of ``gateway run --workers 2``, end to end.

The supervisor asks every worker for a tap (a socket pair end passed over its
control channel) and merges their lines into one response, each line saying
which worker stored the message. A message published on each worker shows in
the one tap; ``gateway tap`` against the supervisor prints them; when the
client leaves, both workers' taps end. Which worker holds a connection is read
from ``/proc``.
"""

from __future__ import annotations

import http.client
import io
import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import host_port
from interchange_ndjson.client import NdjsonClient
from test_workers import STARTUP, supervised
from test_workers_replace import on_worker

from gateway.ops.fleet import merge_taps
from gateway.ops.tap_client import follow

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def tap_config(tmp_path: Path) -> Path:
    path = tmp_path / "tap.toml"
    path.write_text(
        '[gateway]\ndrain_timeout = "3s"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
        '[admin]\nbind = "127.0.0.1:0"\n'
    )
    return path


def read_tap(address: str, into: list[dict[str, Any]], workers: int) -> None:
    """Follow the tap on ``t*`` until lines from ``workers`` workers came, then leave."""
    host, port = host_port(address)
    conn = http.client.HTTPConnection(host, port, timeout=STARTUP)
    try:
        conn.request("GET", "/api/tap?dest=t*")
        response = conn.getresponse()
        assert response.status == 200, response.read()
        while line := response.readline():
            into.append(json.loads(line))
            if len({e.get("worker") for e in into if "dest" in e}) >= workers:
                return
    finally:
        conn.close()


async def publish_until(clients: dict[int, NdjsonClient], finished: trio.Event) -> None:
    """Publish ``t<worker>`` on each worker, round after round, until ``finished``
    (a tap sees only what is published once it is open)."""
    n = 0
    with trio.fail_after(STARTUP):
        while not finished.is_set():
            for index, client in clients.items():
                await client.wait_answers(await client.publish_nowait([b"m%d" % n], f"t{index}"))
            n += 1
            await trio.sleep(0.05)


async def test_one_tap_shows_what_every_worker_stored(tmp_path: Path) -> None:
    async with supervised(tap_config(tmp_path)) as run:
        admin = (await run.wait_for(r"admin: status page and /api/status on (\S+)"))[0][1]
        pids = run.worker_pids()
        clients = {i: await on_worker(run.port, pid, pids) for i, pid in pids.items()}
        lines: list[dict[str, Any]] = []
        finished = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish_until, clients, finished)
            await trio.to_thread.run_sync(read_tap, admin, lines, 2)
            finished.set()
        messages = [e for e in lines if "dest" in e]
        assert {(e["dest"], e["worker"]) for e in messages} == {("t0", 0), ("t1", 1)}
        assert all(e["body"].startswith("m") for e in messages)
        # The client left: both workers' taps end.
        await run.wait_for(r"\[worker \d\] .*tap on 't\*' ended", 2)

        # `gateway tap` against the supervisor prints the merged lines.
        out = io.StringIO()
        finished = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(publish_until, clients, finished)
            status = await trio.to_thread.run_sync(
                lambda: follow(f"http://{admin}", "t*", limit=4, out=out)
            )
            finished.set()
        assert status == 0
        printed = [json.loads(line) for line in out.getvalue().splitlines()]
        assert len(printed) >= 4
        assert all(e["worker"] in (0, 1) and e["dest"] == f"t{e['worker']}" for e in printed)
        await run.wait_for(r"\[worker \d\] .*tap on 't\*' ended", 4)
        for client in clients.values():
            await client.aclose()
        run.process.send_signal(signal.SIGTERM)
        with trio.fail_after(STARTUP):
            assert await run.process.wait() == 0, "\n".join(run.lines)


async def test_merged_lines_say_their_worker_and_split_chunks_are_rejoined() -> None:
    """Lines cut anywhere by the socket come out whole, each marked; drop reports too."""
    written: list[bytes] = []

    async def write(data: bytes) -> None:
        written.append(data)

    pairs = [trio.testing.memory_stream_pair() for _ in range(2)]
    taps = [(i, theirs) for i, (_, theirs) in enumerate(pairs)]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(merge_taps, taps, write, "json")
        await pairs[0][0].send_all(b'{"dest":"a","body":"x"}\n{"dest":"a","bo')
        await pairs[1][0].send_all(b'{"dropped": 3}\n')
        await pairs[0][0].send_all(b'dy":"y"}\n')
        for ours, _ in pairs:
            await ours.aclose()
    got = [json.loads(line) for chunk in written for line in chunk.splitlines()]
    assert sorted(got, key=json.dumps) == sorted(
        [
            {"dest": "a", "body": "x", "worker": 0},
            {"dest": "a", "body": "y", "worker": 0},
            {"dropped": 3, "worker": 1},
        ],
        key=json.dumps,
    )
