"""Rolling replacement of the workers of ``gateway run --workers 2`` (SIGUSR2), end to end.

Each worker holds a publisher whose message waits for a subscriber's ack on
the same worker (work in flight). SIGUSR2 replaces the workers one at a time:
a new worker starts on the same sockets, says it serves, then the old one
drains: its publisher is answered once the subscriber acks, and both its
connections are closed by the gateway. Connections opened all along are
served (the listening socket never closes), and the status shows two workers
with new pids. Which worker holds a connection is read from ``/proc``.
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
import trio
from harness import start
from interchange_ndjson.client import NdjsonClient
from test_admin import _get
from test_workers import STARTUP, Supervised, connections_of, supervised
from waits import until, until_async

from gateway.config.loader import Config, load, parse
from gateway.runtime.supervisor import Supervisor, default_command

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: How long a draining worker's publisher is watched for an early answer.
EARLY = 0.3


def replace_config(tmp_path: Path) -> Path:
    path = tmp_path / "replace.toml"
    path.write_text(
        '[gateway]\ndrain_timeout = "10s"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
        '[admin]\nbind = "127.0.0.1:0"\n'
    )
    return path


async def on_worker(port: int, pid: int, pids: dict[int, int]) -> NdjsonClient:
    """A connection held by worker process ``pid`` (others it took are closed)."""
    extra: list[NdjsonClient] = []
    with trio.fail_after(STARTUP):
        while True:
            before = {p: connections_of(p, port) for p in pids.values()}
            client = await NdjsonClient.connect("127.0.0.1", port)
            while {p: connections_of(p, port) for p in pids.values()} == before:
                await trio.sleep(0.01)  # the kernel queue: wait until a worker accepted
            if connections_of(pid, port) > before[pid]:
                break
            extra.append(client)
    for other in extra:
        await other.aclose()
    return client


async def closed_by_gateway(client: NdjsonClient) -> bool:
    """Whether the gateway closed ``client``'s connection (it receives nothing more)."""
    try:
        await client.receive()
    except trio.BrokenResourceError:
        return True
    return False


async def keep_connecting(port: int, served: list[int], stop: trio.Event) -> None:
    """Open a connection and publish once, again and again, until ``stop``: each must be
    answered (a refused or unanswered connection fails the test)."""
    n = 0
    while not stop.is_set():
        with trio.fail_after(STARTUP):
            async with await NdjsonClient.connect("127.0.0.1", port) as client:
                (answer,) = await client.wait_answers(
                    await client.publish_nowait([b"probe %d" % n], "nobody")
                )
        assert answer.status, answer  # answered: served
        served.append(n)
        n += 1
        await trio.sleep(0.02)


async def test_sigusr2_replaces_the_workers_one_at_a_time_refusing_nothing(
    tmp_path: Path,
) -> None:
    async with supervised(replace_config(tmp_path)) as run:
        admin = (await run.wait_for(r"admin: status page and /api/status on (\S+)"))[0][1]
        old = run.worker_pids()
        await run.wait_for(r"linked to worker \d", 2)
        held: dict[int, tuple[NdjsonClient, NdjsonClient]] = {}
        for index, pid in sorted(old.items()):
            publisher = await on_worker(run.port, pid, old)
            subscriber = await on_worker(run.port, pid, old)
            held[index] = (publisher, subscriber)
        # Work in flight on each worker: a publish its subscriber has not acked.
        pending: dict[int, list[int]] = {}
        tags: dict[int, int] = {}
        for index, (publisher, subscriber) in held.items():
            await subscriber.subscribe(f"t{index}", window=10)
            with trio.fail_after(STARTUP):
                while True:  # the subscription is in place when its first delivery comes
                    ids = await publisher.publish_nowait([b"in flight %d" % index], f"t{index}")
                    with trio.move_on_after(0.2):
                        tags[index] = (await subscriber.receive()).tag  # type: ignore[union-attr]
                        pending[index] = ids
                        break
                    await publisher.wait_answers(ids)

        served: list[int] = []
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(keep_connecting, run.port, served, done)
            run.process.send_signal(signal.SIGUSR2)
            for index, (publisher, subscriber) in sorted(held.items()):
                await run.wait_for(r"worker \d \(pid \d+\) serves", index + 1)
                await run.wait_for(r"shutting down: no new connections", index + 1)
                # The old worker drains: its in-flight publish settles once acked.
                with trio.move_on_after(EARLY):
                    await publisher.wait_answers(pending[index])
                    raise AssertionError("answered before the subscriber acked")
                await subscriber.ack(tags[index])
                with trio.fail_after(STARTUP):
                    (answer,) = await publisher.wait_answers(pending[index])
                assert answer.status == "delivered"
                with trio.fail_after(STARTUP):
                    assert await closed_by_gateway(publisher)
                    assert await closed_by_gateway(subscriber)
                gone = rf"worker {index} \(pid {old[index]}\) replaced: exited with status 0"
                await run.wait_for(gone)
            await run.wait_for(r"replacement done: ")
            done.set()
        assert len(served) > 1, "no connection was opened during the replacement"

        new = run.worker_pids()
        assert set(new) == {0, 1}
        assert not set(new.values()) & set(old.values())
        status = await _status(run, admin)
        assert [(w["index"], w["pid"], w["running"]) for w in status["workers"]] == [
            (0, new[0], True),
            (1, new[1], True),
        ]
        assert status["ready"], status["not_ready"]
        # The new workers serve and link to each other.
        await _served_by_both(run, new)
        run.process.send_signal(signal.SIGTERM)
        with trio.fail_after(STARTUP):
            assert await run.process.wait() == 0, "\n".join(run.lines)


async def _status(run: Supervised, admin: str) -> dict[str, object]:
    reply = await trio.to_thread.run_sync(_get, admin, "/api/status")
    assert reply.status == 200
    return reply.json()  # type: ignore[no-any-return]


async def _served_by_both(run: Supervised, pids: dict[int, int]) -> None:
    for pid in pids.values():
        client = await on_worker(run.port, pid, pids)
        async with client:
            (answer,) = await client.wait_answers(await client.publish_nowait([b"x"], "x"))
            assert answer.status


async def test_post_api_reload_replace_replaces_every_worker(tmp_path: Path) -> None:
    """The admin endpoint's replacement answers with each worker's old and new pid."""
    async with supervised(replace_config(tmp_path)) as run:
        admin = (await run.wait_for(r"admin: status page and /api/status on (\S+)"))[0][1]
        old = run.worker_pids()
        reply = await trio.to_thread.run_sync(_get, admin, "/api/reload?replace=1", "POST")
        answer = reply.json()
        assert answer["replaced"], answer
        workers = answer["workers"]
        pairs = [(w["index"], w["old_pid"], w["replaced"], w["old_status"]) for w in workers]
        assert pairs == [(0, old[0], True, 0), (1, old[1], True, 0)]
        await until(lambda: set(run.worker_pids().values()) == {w["pid"] for w in workers})
        status = await _status(run, admin)
        assert [w["pid"] for w in status["workers"]] == [w["pid"] for w in answer["workers"]]
        run.process.send_signal(signal.SIGTERM)
        with trio.fail_after(STARTUP):
            assert await run.process.wait() == 0, "\n".join(run.lines)


# -- listeners pinned to worker 0, the store's worker drains first -------------------

#: A stand-in worker: reports ready at once, logs its life to a file, exits 0 on SIGTERM.
STAND_IN = """
import json, os, signal, sys, time
spec = json.loads(sys.argv[2])
log = open(sys.argv[1], "a", buffering=1)
def bye(*_):
    log.write(f"exit {spec['index']} {os.getpid()}\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, bye)
given = {name: entry["fds"] for name, entry in spec["listeners"].items()}
log.write(f"start {spec['index']} {os.getpid()} {json.dumps(given)}\\n")
os.write(spec["ready"], b"ready\\n")
while True:
    time.sleep(1)
"""


def pinned_config(tmp_path: Path) -> Config:
    """An ndjson listener and a segment listener (the loader's refusal with workers > 1
    is the CLI's: the supervisor is given the config directly)."""
    return parse(
        {
            "gateway": {"drain_timeout": "2s", "data_dir": str(tmp_path / "data")},
            "listeners": [
                {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"},
                {"name": "seg", "protocol": "segment", "bind": "127.0.0.1:0"},
            ],
        },
        source="<test>",
    )


async def test_segment_listeners_reach_worker_0_only_and_it_drains_before_its_replacement(
    tmp_path: Path,
) -> None:
    """Worker 0 alone gets the segment listener's sockets; replacing it stops it first
    (one process holds the store), while worker 1's replacement starts first."""
    life = tmp_path / "life.txt"
    supervisor = Supervisor(
        pinned_config(tmp_path),
        2,
        lambda spec: [sys.executable, "-c", STAND_IN, str(life), spec.encode()],
    )
    assert supervisor.pinned("seg")
    assert not supervisor.pinned("nd")
    async with trio.open_nursery() as nursery:
        finished = start(nursery, supervisor.run)
        await until(lambda: life.exists() and life.read_text().count("start") == 2)
        old = {s.index: s.process.pid for s in supervisor.slots if s.process is not None}
        results = await supervisor.replace()
        assert [(r["index"], r["replaced"]) for r in results] == [(0, True), (1, True)]
        supervisor.stop()
        assert await finished.wait() == 0
    events = [line.split(" ", 3) for line in life.read_text().splitlines()]
    given = {int(e[2]): json.loads(e[3]) for e in events if e[0] == "start"}
    assert {name: bool(fds) for name, fds in given[old[0]].items()} == {"nd": True, "seg": True}
    assert {name: bool(fds) for name, fds in given[old[1]].items()} == {"nd": True, "seg": False}
    order = [(e[0], int(e[1]), int(e[2])) for e in events]
    new = {r["index"]: r["pid"] for r in results}
    # Worker 0: the old one exits, then the new one starts. Worker 1: the other way.
    assert order.index(("exit", 0, old[0])) < order.index(("start", 0, new[0]))
    assert order.index(("start", 1, new[1])) < order.index(("exit", 1, old[1]))


async def test_every_segment_connection_lands_on_worker_0(tmp_path: Path) -> None:
    """Real workers: the segment port reaches worker 0 only; worker 1 reloads without
    it (it opens no store)."""
    path = tmp_path / "pinned.toml"
    path.write_text(
        f'[gateway]\ndrain_timeout = "2s"\ndata_dir = "{tmp_path / "data"}"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
        '[[listeners]]\nname = "seg"\nprotocol = "segment"\nbind = "127.0.0.1:0"\n'
        '[admin]\nbind = "127.0.0.1:0"\n'
    )
    supervisor = Supervisor(load(path), 2, default_command(str(path)))
    async with trio.open_nursery() as nursery:
        finished = start(nursery, supervisor.run)
        await until(lambda: len(supervisor.pids) == 2 and bool(supervisor.sockets))
        port = supervisor.sockets["seg"][0].getsockname()[1]
        pids = {s.index: s.process.pid for s in supervisor.slots if s.process is not None}
        streams = []
        with trio.fail_after(STARTUP):
            for n in range(1, 17):
                streams.append(await trio.open_tcp_stream("127.0.0.1", port))
                await until(lambda n=n: connections_of(pids[0], port) == n)  # type: ignore[misc]
        assert connections_of(pids[1], port) == 0
        # Worker 1 leaves the segment listener out of every config it reads.
        await until_async(lambda: _both_serve(supervisor), timeout=STARTUP)
        reloads = await supervisor.ask("admin", "reload", STARTUP)
        assert [json.loads(a.body or b"{}").get("reloaded") for a in reloads] == [True, True]
        for stream in streams:
            await stream.aclose()
        supervisor.stop()
        assert await finished.wait() == 0


async def _both_serve(supervisor: Supervisor) -> bool:
    """Whether both workers answer with their ``nd`` listener bound (a reload before
    a worker's listeners all started is another matter)."""
    answers = await supervisor.ask("admin", "snapshot", STARTUP)
    for answer in answers:
        listeners = json.loads(answer.body or b"{}").get("listeners", [])
        if not any(ls.get("name") == "nd" and ls.get("addresses") for ls in listeners):
            return False
    return True
