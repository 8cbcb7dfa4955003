"""``[gateway] reuse_port``: a listening socket per worker, kept by the supervisor.

End to end, ``gateway run --workers 2`` runs in a subprocess (``supervised``
from tests/test_workers.py) with an ndjson listener; a publish to a topic
nobody subscribes to is answered at once, so a connection is served when its
publish is answered. Which listening socket a worker serves is read from
``/proc``: the socket inodes among its descriptors that ``/proc/net/tcp``
lists as listening on the port. Which sets of sockets the supervisor hands
each worker (TCP, unix and pinned listeners) is checked in-process, with
workers that only sleep.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest
import trio
from harness import start
from interchange_ndjson.client import NdjsonClient
from procfs import LISTEN, port_of, socket_inodes, tcp_rows
from test_workers import STARTUP, Supervised, connections_of, supervised
from waits import until

from gateway.config.loader import ConfigError, load, parse
from gateway.runtime.supervisor import Supervisor
from gateway.runtime.worker import WorkerSpec

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: Short connections opened at once: all on one worker's socket has odds of 2 in 2**40.
SHORT = 40


def nd_config(tmp_path: Path, reuse_port: bool) -> Path:
    path = tmp_path / "nd.toml"
    path.write_text(
        f'[gateway]\ndrain_timeout = "2s"\nreuse_port = {str(reuse_port).lower()}\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
    )
    return path


def listening_inodes(port: int) -> list[str]:
    """The inodes of the sockets ``/proc/net/tcp`` lists as listening on ``port``."""
    return [row[9] for row in tcp_rows() if port_of(row[1]) == port and row[3] == LISTEN]


def listening_of(pid: int, port: int) -> set[str]:
    """The inodes of the sockets listening on ``port`` that process ``pid`` holds."""
    return socket_inodes(pid) & set(listening_inodes(port))


async def served(port: int, n: int) -> list[NdjsonClient]:
    """``n`` connections opened at once, each of whose publish was answered ``delivered``
    (held open, so that ``connections_of`` tells which worker took each)."""
    clients: list[NdjsonClient] = []

    async def one() -> None:
        client = await NdjsonClient.connect("127.0.0.1", port)
        clients.append(client)
        assert (await client.publish(b"x", "nobody")).status == "delivered"

    with trio.fail_after(STARTUP):
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)
    return clients


async def close_all(clients: list[NdjsonClient]) -> None:
    for client in clients:
        await client.aclose()


async def stop(run: Supervised) -> None:
    run.process.send_signal(signal.SIGTERM)
    with trio.fail_after(STARTUP):
        assert await run.process.wait() == 0, "\n".join(run.lines)


# -- end to end ----------------------------------------------------------------------


async def test_each_worker_has_its_own_socket_and_short_connections_spread(
    tmp_path: Path,
) -> None:
    """Two LISTEN sockets on the port, one in each worker; the log says so; 40
    connections opened at once are served by both workers."""
    async with supervised(nd_config(tmp_path, reuse_port=True)) as run:
        pids = run.worker_pids()
        assert run.matches(r"serving: nd \(ndjson\) on \S+ \(reuse_port: a socket per worker\)")
        assert len(listening_inodes(run.port)) == 2
        own = {index: listening_of(pid, run.port) for index, pid in pids.items()}
        assert len(own[0]) == len(own[1]) == 1, own
        assert not own[0] & own[1], own
        clients = await served(run.port, SHORT)
        spread = {index: connections_of(pid, run.port) for index, pid in pids.items()}
        assert sum(spread.values()) == SHORT, spread
        assert all(spread.values()), f"one worker served every connection: {spread}"
        await close_all(clients)
        await stop(run)


async def test_without_it_the_workers_share_one_socket(tmp_path: Path) -> None:
    """Today's default: one LISTEN socket on the port, held by both workers."""
    async with supervised(nd_config(tmp_path, reuse_port=False)) as run:
        pids = run.worker_pids()
        assert not run.matches(r"reuse_port")
        (inode,) = listening_inodes(run.port)
        assert listening_of(pids[0], run.port) == listening_of(pids[1], run.port) == {inode}
        await stop(run)


async def test_a_killed_worker_comes_back_on_its_socket_and_serves_its_queue(
    tmp_path: Path,
) -> None:
    """kill -9 of worker 1: connections made before it is back all connect (none is
    refused) and are all served once it is back, by the restarted worker 1 too,
    which serves the very socket its predecessor did."""
    async with supervised(nd_config(tmp_path, reuse_port=True)) as run:
        victim = run.worker_pids()[1]
        (socket_of_1,) = listening_of(victim, run.port)
        os.kill(victim, signal.SIGKILL)
        await run.wait_for(rf"worker 1 \(pid {victim}\) exited with status -9")
        clients = []
        with trio.fail_after(STARTUP):
            for _ in range(SHORT):
                clients.append(await NdjsonClient.connect("127.0.0.1", run.port))
        assert run.worker_pids()[1] == victim, "worker 1 was back before the connections"
        async with trio.open_nursery() as nursery:  # answered once worker 1 is back
            for client in clients:
                nursery.start_soon(_publish_one, client)
        back = run.worker_pids()[1]
        assert back != victim
        assert listening_of(back, run.port) == {socket_of_1}
        spread = [connections_of(back, run.port), connections_of(run.worker_pids()[0], run.port)]
        assert sum(spread) == SHORT, spread
        assert all(spread), f"[worker 1, worker 0] = {spread}"
        await close_all(clients)
        await stop(run)


async def _publish_one(client: NdjsonClient) -> None:
    with trio.fail_after(STARTUP):
        assert (await client.publish(b"x", "nobody")).status == "delivered"


# -- which sockets each worker is given ----------------------------------------------


async def test_tcp_listeners_get_a_set_per_worker_unix_and_pinned_ones_share(
    tmp_path: Path,
) -> None:
    """A wildcard TCP listener on port 0: each worker's own IPv4 and IPv6 sockets on
    one port; a unix listener: one socket for both; a segment listener (pinned):
    worker 0 only."""
    path = tmp_path / "gw.toml"
    path.write_text(
        f'[gateway]\nreuse_port = true\ndata_dir = "{tmp_path / "data"}"\n'
        '[[listeners]]\nname = "wild"\nprotocol = "ndjson"\nbind = "*:0"\n'
        f'[[listeners]]\nname = "local"\nprotocol = "ndjson"\nbind = "unix:{tmp_path}/gw.sock"\n'
        '[[listeners]]\nname = "seg"\nprotocol = "segment"\nbind = "127.0.0.1:0"\n'
    )
    specs: dict[int, WorkerSpec] = {}

    def command(spec: WorkerSpec) -> list[str]:
        specs[spec.index] = spec
        return ["sleep", "60"]

    supervisor = Supervisor(load(path), 2, command)
    async with trio.open_nursery() as nursery:
        finished = start(nursery, supervisor.run)
        await until(lambda: len(supervisor.pids) == 2)
        wild = supervisor.bound["wild"]
        assert len(wild) == 2
        assert {s.family for s in wild[0]} == {s.family for s in wild[1]}
        assert len({s.getsockname()[1] for sockets in wild for s in sockets}) == 1
        assert specs[0].listeners["wild"][1] != specs[1].listeners["wild"][1]
        assert specs[0].listeners["local"][1] == specs[1].listeners["local"][1] != []
        assert specs[0].listeners["seg"][1] != []
        assert specs[1].listeners["seg"][1] == []
        supervisor.stop()
        assert await finished.wait() == 0


async def test_a_stop_while_a_worker_starts_drains_that_worker_too() -> None:
    """The SIGTERM forwarded while a worker was being started reaches it once it is
    (else it would be killed past ``drain_timeout``, the exit status unclean)."""
    config = parse({"gateway": {"drain_timeout": "1s"}}, source="<test>")

    def command(spec: WorkerSpec) -> list[str]:
        supervisor.stop()  # before the process exists
        return ["sleep", "60"]

    supervisor = Supervisor(config, 1, command)
    async with trio.open_nursery() as nursery:
        finished = start(nursery, supervisor.run)
        assert await finished.wait() == 0
    assert supervisor.slots[0].final == -signal.SIGTERM


# -- the key -------------------------------------------------------------------------


def test_the_key_is_off_by_default_and_a_bad_value_names_it() -> None:
    assert parse({}, source="gw.toml").gateway.reuse_port is False
    assert parse({"gateway": {"reuse_port": True}}, source="gw.toml").gateway.reuse_port
    for value in ("yes", 1):
        with pytest.raises(ConfigError) as refused:
            parse({"gateway": {"reuse_port": value}}, source="gw.toml")
        assert str(refused.value).startswith("gw.toml: gateway.reuse_port: expected true or false")
