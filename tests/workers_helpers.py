"""A real ``gateway run`` (1 worker, or ``--workers N``) and what a test sees from outside it.

For the bridge tests of tests/test_workers_bridges.py: the same test runs
against a single gateway and against a supervisor with workers, so every
helper here answers the same way for both: the worker pids (the gateway
itself is worker 0 of a single gateway), the listeners' addresses from the
log, which worker holds an accepted connection (read from ``/proc``), the
admin endpoint's status reduced to per-worker figures, and subscribers that
keep what they received.
"""

from __future__ import annotations

import http.client
import itertools
import json
import math
import re
import signal
import subprocess
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import trio
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver
from procfs import ESTABLISHED, port_of, socket_inodes, tcp_rows
from test_workers import GATEWAY, STARTUP, _kill_quietly, _read_lines, connections_of
from waits import POLL, until

from protocols.reactive import Peer

__all__ = [
    "PROBE",
    "GatewayProcess",
    "NdInbox",
    "RsInbox",
    "connections_to",
    "counted",
    "destination",
    "holder",
    "place",
    "running",
    "status",
    "until_heard",
    "worker_connections",
]

#: The start of a probe's body (:func:`until_heard`); the inboxes keep probes apart.
PROBE = b"probe "
#: How long one round of probes may take to be heard before the next is sent.
PROBE_ROUND = 0.2


# -- the gateway under test -----------------------------------------------------------------


@dataclass
class GatewayProcess:
    """A running ``gateway run`` and what it logged so far."""

    process: trio.Process
    workers: int
    lines: list[str] = field(default_factory=list)

    def matches(self, pattern: str) -> list[re.Match[str]]:
        return [m for line in self.lines if (m := re.search(pattern, line))]

    async def wait_for(self, pattern: str, count: int = 1) -> list[re.Match[str]]:
        await until(lambda: len(self.matches(pattern)) >= count, timeout=STARTUP)
        return self.matches(pattern)

    def pids(self) -> dict[int, int]:
        """Worker index → pid; a single gateway is its own worker 0."""
        if self.workers == 1:
            return {0: self.process.pid}
        return {int(m[1]): int(m[2]) for m in self.matches(r"worker (\d+) started \(pid (\d+)\)")}

    def address(self, listener: str) -> tuple[str, int]:
        """The host and port listener ``listener`` serves on, from the ``serving:`` line."""
        first = self.matches(r"serving: (.*)$")[0]
        for name, rest in re.findall(r"(\S+) \(\S+\) on ([^,;]+)", first[1]):
            if name == listener:
                host, _, port = rest.split()[0].rpartition(":")
                return host.strip("[]"), int(port)
        raise KeyError(listener)

    def ports(self, *listeners: str) -> list[int]:
        return [self.address(name)[1] for name in listeners]

    @property
    def admin(self) -> str:
        return self.matches(r"admin: status page and /api/status on (\S+)")[0][1]

    def connections(self, *listeners: str) -> dict[int, int]:
        """Worker index → the connections it holds, accepted on ``listeners``."""
        ports = self.ports(*listeners)
        return {i: sum(connections_of(pid, p) for p in ports) for i, pid in self.pids().items()}

    async def stop(self) -> int:
        """SIGTERM, as an operator stops it; its exit status once it exited."""
        self.process.send_signal(signal.SIGTERM)
        with trio.fail_after(STARTUP):
            return await self.process.wait()


@asynccontextmanager
async def running(config: Path, workers: int) -> AsyncIterator[GatewayProcess]:
    """``gateway run CONFIG`` (with ``--workers N`` when ``workers`` > 1), once every
    worker serves and, with workers, every link between them is up. Left without an
    error, it is stopped with SIGTERM and must exit 0 (nothing abandoned)."""
    command = [*GATEWAY, "run", str(config), "--log-level", "info"]
    if workers > 1:
        command += ["--workers", str(workers)]
    process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
    gateway = GatewayProcess(process, workers)
    async with trio.open_nursery() as nursery:
        assert process.stderr is not None
        nursery.start_soon(_read_lines, process.stderr, gateway.lines)
        try:
            await gateway.wait_for(r"gateway\.runtime: serving: ", workers)
            await gateway.wait_for(r"linked to worker \d", workers * (workers - 1))
            yield gateway
            assert await gateway.stop() == 0, "\n".join(gateway.lines)
        except BaseException:
            print("\n".join(gateway.lines))  # pytest shows it with the failure
            raise
        finally:
            if process.returncode is None:
                process.kill()
            with trio.move_on_after(STARTUP):
                await process.wait()
            if workers > 1:
                for pid in gateway.pids().values():  # never leave a worker behind
                    _kill_quietly(pid)
            nursery.cancel_scope.cancel()


# -- which worker holds a connection ----------------------------------------------------------


def _accepted_inode(server_port: int, client_port: int) -> str | None:
    """The inode of the socket accepted on ``server_port`` for the client whose own
    port is ``client_port``; None until a process accepted it."""
    for cols in tcp_rows():
        if (port_of(cols[1]), port_of(cols[2])) == (server_port, client_port) and cols[9] != "0":
            return cols[9]
    return None


def connections_to(pid: int, port: int) -> int:
    """Established TCP connections that process ``pid`` opened to ``port``."""
    inodes = socket_inodes(pid)
    return sum(
        1 for c in tcp_rows() if port_of(c[2]) == port and c[3] == ESTABLISHED and c[9] in inodes
    )


def holder(pids: Mapping[int, int], server_port: int, client_port: int) -> int | None:
    """The index of the worker holding the connection from ``client_port`` to
    ``server_port``; None while no worker accepted it yet."""
    inode = _accepted_inode(server_port, client_port)
    if inode is None:
        return None
    return next((index for index, pid in pids.items() if inode in socket_inodes(pid)), None)


async def place(
    gateway: GatewayProcess, listener: str, each: int
) -> dict[int, list[trio.SocketStream]]:
    """Connections to ``listener``, ``each`` held by every worker: connect one at a time,
    see which worker accepted it, close those a worker already has enough of."""
    host, port = gateway.address(listener)
    pids = gateway.pids()
    placed: dict[int, list[trio.SocketStream]] = {index: [] for index in pids}
    extra: list[trio.SocketStream] = []
    with trio.fail_after(STARTUP):
        while any(len(streams) < each for streams in placed.values()):
            stream = await trio.open_tcp_stream(host, port)
            client_port = stream.socket.getsockname()[1]
            while (index := holder(pids, port, client_port)) is None:
                await trio.sleep(POLL)  # in the kernel's queue until a worker accepts it
            (placed[index] if len(placed[index]) < each else extra).append(stream)
    for stream in extra:
        await stream.aclose()
    return placed


# -- the admin endpoint -----------------------------------------------------------------------


def _get_status(address: str) -> dict[str, Any]:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host.strip("[]"), int(port), timeout=STARTUP)
    try:
        conn.request("GET", "/api/status")
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    assert response.status == 200, body
    answer: dict[str, Any] = json.loads(body)
    return answer


async def status(gateway: GatewayProcess) -> dict[str, Any]:
    """``GET /api/status`` of the gateway's admin endpoint."""
    return await trio.to_thread.run_sync(_get_status, gateway.admin)


def worker_connections(answer: Mapping[str, Any]) -> dict[int, int]:
    """Worker index → the connections it holds, in a status: the supervisor's
    breakdown, or a single gateway's listeners summed as worker 0."""
    if "workers" in answer:
        return {w["index"]: w["connections"] for w in answer["workers"]}
    return {0: sum(listener["connections"] for listener in answer["listeners"])}


def destination(answer: Mapping[str, Any], name: str) -> dict[str, Any]:
    """Destination ``name``'s entry in a status."""
    found: dict[str, Any] = next(d for d in answer["destinations"] if d["name"] == name)
    return found


def counted(before: Mapping[str, Any], after: Mapping[str, Any], name: str, key: str) -> int:
    """How much destination ``name``'s counter ``key`` grew between two statuses."""
    grown: int = destination(after, name)[key] - destination(before, name)[key]
    return grown


# -- subscribers --------------------------------------------------------------------------------


class Inbox(Protocol):
    """What a subscriber received, probes apart."""

    def heard(self) -> set[int]: ...


def _split(bodies: Iterable[bytes]) -> tuple[list[bytes], set[int]]:
    """The bodies that are not probes, and the probers heard."""
    real, probers = [], set()
    for body in bodies:
        if body.startswith(PROBE):
            probers.add(int(body.split()[1]))
        else:
            real.append(body)
    return real, probers


@dataclass
class NdInbox:
    """An ndjson subscriber on worker ``worker``, acking what it receives unless it holds."""

    client: NdjsonClient
    worker: int
    received: list[bytes] = field(default_factory=list)
    hold: bool = False
    held: list[int] = field(default_factory=list)

    async def subscribe(self, nursery: trio.Nursery, topic: str) -> None:
        await self.client.subscribe(topic, window=1000)
        nursery.start_soon(self._collect)

    async def _collect(self) -> None:
        while True:
            delivery = await self.client.receive()
            assert isinstance(delivery, Deliver), delivery
            self.received.append(delivery.body)
            if self.hold:
                self.held.append(delivery.tag)
            else:
                await self.client.ack(delivery.tag)

    async def release(self) -> None:
        """Stop holding, and ack what was held."""
        self.hold = False
        tags, self.held = self.held, []
        await self.client.ack(*tags)

    def bodies(self) -> list[bytes]:
        return _split(self.received)[0]

    def ids(self) -> list[str]:
        """The ``id`` of each JSON event received, in order."""
        return [json.loads(body)["id"] for body in self.bodies()]

    def heard(self) -> set[int]:
        return _split(self.received)[1]


@dataclass
class RsInbox:
    """A reactive-streams subscriber on worker ``worker``, asking for one more each time."""

    worker: int
    received: list[bytes] = field(default_factory=list)

    async def subscribe(
        self,
        peer: Peer,
        topic: str,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with peer.subscribe(topic, demand=1000) as sub:
            task_status.started()
            async for element in sub:
                self.received.append(element)
                sub.request(1)

    def bodies(self) -> list[bytes]:
        return _split(self.received)[0]

    def heard(self) -> set[int]:
        return _split(self.received)[1]


async def until_heard(
    probers: Mapping[int, NdjsonClient], topic: str, inboxes: Sequence[Inbox]
) -> None:
    """Publish a probe to ``topic`` from each worker's prober, round after round, until
    every inbox heard one from every worker: each subscription took effect wherever
    a publisher may be (on another worker, a moment after it landed on its own)."""
    everyone = set(probers)
    with trio.fail_after(STARTUP):
        for n in itertools.count():
            for index, prober in probers.items():
                await prober.publish_nowait([PROBE + b"%d %d" % (index, n)], topic)
            with trio.move_on_after(PROBE_ROUND):
                await until(lambda: all(x.heard() >= everyone for x in inboxes), timeout=math.inf)
                return
