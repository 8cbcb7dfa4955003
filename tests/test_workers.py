"""``gateway run --workers N``: a supervisor binds once, N worker processes serve the sockets.

The end-to-end tests run the real command in a subprocess: an ndjson listener
whose every message is relayed to ``upstream:sink``, an ndjson upstream to a
second gateway running in this process (the sink, whose subscriber sees what
arrived). Which worker serves a connection is read from ``/proc`` (the
worker holding the accepted socket). The refusals and the transports'
``adopt`` are tested in-process.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import trio
from harness import host_port, running_gateway, start
from interchange_ndjson.client import NdjsonClient
from procfs import ESTABLISHED, port_of, socket_inodes, tcp_rows
from waits import subscribed, until

from gateway.cli import worker_gateway
from gateway.config.loader import ConfigError, parse, usable_cores
from gateway.runtime import listener as listener_module
from gateway.runtime.gateway import Gateway
from gateway.runtime.registry import default_registry
from gateway.runtime.supervisor import Supervisor

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

GATEWAY = [sys.executable, "-m", "gateway"]
#: How long a supervisor and its workers may take to start, stop or restart.
STARTUP = 30.0


# -- the gateway under test, in a subprocess -----------------------------------------


@dataclass
class Supervised:
    """A running ``gateway run --workers 2`` and what it logged so far."""

    process: trio.Process
    lines: list[str] = field(default_factory=list)

    def matches(self, pattern: str) -> list[re.Match[str]]:
        return [m for line in self.lines if (m := re.search(pattern, line))]

    async def wait_for(self, pattern: str, count: int = 1) -> list[re.Match[str]]:
        await until(lambda: len(self.matches(pattern)) >= count, timeout=STARTUP)
        return self.matches(pattern)

    @property
    def port(self) -> int:
        return int(self.matches(r"serving: nd \(ndjson\) on 127\.0\.0\.1:(\d+)")[0].group(1))

    def worker_pids(self) -> dict[int, int]:
        """Worker index → its latest pid."""
        return {int(m[1]): int(m[2]) for m in self.matches(r"worker (\d+) started \(pid (\d+)\)")}


async def _read_lines(stream: trio.abc.ReceiveStream, into: list[str]) -> None:
    buffer = b""
    async for chunk in stream:
        buffer += chunk
        *done, buffer = buffer.split(b"\n")
        into.extend(line.decode(errors="replace") for line in done)


def relay_config(tmp_path: Path, sink: Gateway, **gateway: object) -> Path:
    """Every name published on ``nd`` relayed to the sink gateway."""
    host, port = host_port(sink.addresses["nd"][0])
    extra = "".join(f"{k} = {v!r}\n" for k, v in gateway.items()).replace("'", '"')
    path = tmp_path / "relay.toml"
    path.write_text(
        f'[gateway]\ndrain_timeout = "3s"\n{extra}'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
        f'[[upstreams]]\nname = "sink"\nprotocol = "ndjson"\nconnect = "{host}:{port}"\n'
        'backoff_max = "0.5s"\n'
        '[[routes]]\nfrom = "*"\nto = "upstream:sink"\n'
    )
    return path


@asynccontextmanager
async def supervised(config: Path, *args: str) -> AsyncIterator[Supervised]:
    """Start ``gateway run CONFIG --workers 2``; wait until both workers serve."""
    command = [*GATEWAY, "run", str(config), "--workers", "2", "--log-level", "info", *args]
    process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
    run = Supervised(process)
    async with trio.open_nursery() as nursery:
        assert process.stderr is not None
        nursery.start_soon(_read_lines, process.stderr, run.lines)
        try:
            await run.wait_for(r"serving: ")
            await run.wait_for(r"worker \d+ \(pid \d+\) starting", 2)
            # Each worker's own line (the supervisor's ends with "; 2 workers").
            await run.wait_for(r"\] gateway\.runtime: serving: nd \(ndjson\) on [^;]+$", 2)
            yield run
        finally:
            if process.returncode is None:
                process.kill()
            with trio.move_on_after(STARTUP):
                await process.wait()
            for pid in run.worker_pids().values():  # never leave a worker behind
                _kill_quietly(pid)


def _kill_quietly(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# -- the sink: a second gateway in this process --------------------------------------


@dataclass
class Sink:
    gateway: Gateway
    bodies: list[bytes] = field(default_factory=list)


@asynccontextmanager
async def sink_gateway() -> AsyncIterator[Sink]:
    cfg = {
        "gateway": {"drain_timeout": "1s"},
        "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
    }
    async with running_gateway(cfg) as gw, trio.open_nursery() as nursery:
        sink = Sink(gw)
        host, port = host_port(gw.addresses["nd"][0])
        subscriber = await NdjsonClient.connect(host, port)
        await subscriber.subscribe("d", window=1000)
        await subscribed(gw, "d")

        async def collect() -> None:
            while True:
                delivery = await subscriber.receive()
                sink.bodies.append(delivery.body)
                await subscriber.ack(delivery.tag)

        nursery.start_soon(collect)
        yield sink
        nursery.cancel_scope.cancel()
        await subscriber.aclose()


# -- senders -------------------------------------------------------------------------


async def send_all(port: int, bodies: list[bytes], acked: set[bytes]) -> None:
    """Publish ``bodies`` in windows of 10; on a lost connection reconnect and resend what
    was not acked, as a sender that wants everything delivered does."""
    pending = list(bodies)
    while pending:
        try:
            async with await NdjsonClient.connect("127.0.0.1", port) as client:
                while pending:
                    window = pending[:10]
                    answers = await client.wait_answers(await client.publish_nowait(window, "d"))
                    for body, answer in zip(window, answers, strict=True):
                        if answer.status == "delivered":
                            acked.add(body)
                    pending = [b for b in pending if b not in acked]
        except Exception:  # the worker died under the connection: resend on a new one
            await trio.sleep(0.05)


def connections_of(pid: int, port: int) -> int:
    """Established TCP connections accepted on ``port`` that process ``pid`` holds."""
    inodes = socket_inodes(pid)
    return sum(
        1
        for row in tcp_rows()
        if port_of(row[1]) == port and row[3] == ESTABLISHED and row[9] in inodes
    )


# -- end to end ----------------------------------------------------------------------


async def test_two_workers_share_connections_relay_everything_and_drain(tmp_path: Path) -> None:
    """16 connections held at once spread over both workers; every publish is acked
    and reaches the sink, also after a SIGHUP reloaded both workers with the
    connections held; SIGTERM drains both workers and the supervisor exits 0."""
    async with sink_gateway() as sink, supervised(relay_config(tmp_path, sink.gateway)) as run:
        pids = run.worker_pids()
        assert len(pids) == 2
        # An idle worker may take a whole burst of connections (the kernel wakes
        # whichever is first): more bursts, each answered, until both serve some.
        clients: list[NdjsonClient] = []
        for _ in range(8):
            burst = await _connect_at_once(run.port, 16)
            clients += burst
            async with trio.open_nursery() as nursery:
                for client in burst:
                    nursery.start_soon(_publish_on, client, [b"hi"])
            spread = {index: connections_of(pid, run.port) for index, pid in pids.items()}
            assert sum(spread.values()) == len(clients), spread
            if all(spread.values()):
                break
        assert all(spread.values()), f"one worker served every connection: {spread}"
        expected: set[bytes] = set()
        async with trio.open_nursery() as nursery:
            for n, client in enumerate(clients):
                bodies = [b"%d-%d" % (n, i) for i in range(50)]
                expected.update(bodies)
                nursery.start_soon(_publish_on, client, bodies)
        await until(lambda: expected <= set(sink.bodies))
        # SIGHUP with connections held on both workers: each worker reloads the
        # file in place, and every held connection goes on being served.
        run.process.send_signal(signal.SIGHUP)
        await run.wait_for(r"reloaded .*: ", 2)
        async with trio.open_nursery() as nursery:
            for n, client in enumerate(clients):
                bodies = [b"after-%d" % n]
                expected.update(bodies)
                nursery.start_soon(_publish_on, client, bodies)
        await until(lambda: expected <= set(sink.bodies))
        for client in clients:
            await client.aclose()
        run.process.send_signal(signal.SIGTERM)
        with trio.fail_after(STARTUP):
            status = await run.process.wait()
        assert status == 0, "\n".join(run.lines)
        assert len(run.matches(r"worker \d \(pid \d+\) exited with status 0$")) == 2


async def _connect_at_once(port: int, n: int) -> list[NdjsonClient]:
    """``n`` connections opened together, as many senders starting at once."""
    clients: list[NdjsonClient] = []

    async def one() -> None:
        clients.append(await NdjsonClient.connect("127.0.0.1", port))

    async with trio.open_nursery() as nursery:
        for _ in range(n):
            nursery.start_soon(one)
    return clients


async def _publish_on(client: NdjsonClient, bodies: list[bytes]) -> None:
    answers = await client.wait_answers(await client.publish_nowait(bodies, "d"))
    assert {a.status for a in answers} == {"delivered"}


async def test_a_killed_worker_is_restarted_and_nothing_acked_is_lost(tmp_path: Path) -> None:
    """kill -9 of a worker under load: the supervisor logs its status and starts
    another; senders resend what was not acked; everything acked reached the sink."""
    async with sink_gateway() as sink, supervised(relay_config(tmp_path, sink.gateway)) as run:
        victim_index, victim = next(iter(run.worker_pids().items()))
        acked: set[bytes] = set()
        expected = {b"%d-%d" % (n, i) for n in range(8) for i in range(300)}
        async with trio.open_nursery() as nursery:
            for n in range(8):
                bodies = [b"%d-%d" % (n, i) for i in range(300)]
                nursery.start_soon(send_all, run.port, bodies, acked)
            await until(lambda: len(acked) >= 200)
            os.kill(victim, signal.SIGKILL)
            await run.wait_for(rf"worker {victim_index} \(pid {victim}\) exited with status -9")
            await run.wait_for(rf"worker {victim_index} started", 2)
        assert acked == expected
        await until(lambda: acked <= set(sink.bodies))
        assert run.worker_pids()[victim_index] != victim
        await run.wait_for(r"\[?serving: nd \(ndjson\) on \S+$", 3)
        run.process.send_signal(signal.SIGTERM)
        with trio.fail_after(STARTUP):
            assert await run.process.wait() == 0, "\n".join(run.lines)


async def test_a_worker_that_keeps_dying_is_restarted_later_each_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker that exits at once is logged with its status and restarted after
    0.5 s, then 1 s; stopping during the wait ends the supervisor, unclean."""
    config = parse({"gateway": {"drain_timeout": "1s"}}, source="<test>")
    dies = [sys.executable, "-c", "raise SystemExit(7)"]
    supervisor = Supervisor(config, 1, lambda spec: dies)
    async with trio.open_nursery() as nursery:
        finished = start(nursery, supervisor.run)
        await until(lambda: "restarting in 1s" in caplog.text)
        supervisor.stop()
        assert await finished.wait() == 1
    assert "exited with status 7 after" in caplog.text
    assert "restarting in 0.5s" in caplog.text


# -- refusals ------------------------------------------------------------------------


def _relay(**extra: object) -> dict[str, object]:
    return {
        "gateway": {"workers": 2},
        "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
        "upstreams": [{"name": "sink", "protocol": "ndjson", "connect": "127.0.0.1:9"}],
        "routes": [{"from": "*", "to": "upstream:sink"}],
        **extra,
    }


def test_a_relay_config_is_accepted_and_auto_is_the_usable_cores() -> None:
    assert parse(_relay(), source="gw.toml").gateway.workers == 2
    auto = _relay()
    auto["gateway"] = {"workers": "auto"}
    assert parse(auto, source="gw.toml").gateway.workers == len(os.sched_getaffinity(0))
    assert usable_cores() == len(os.sched_getaffinity(0))


RECEIVING = [
    {
        "name": "sink",
        "protocol": "reactive",
        "connect": "127.0.0.1:9",
        "subscriptions": [{"publisher": "alerts"}],
    },
    {
        "name": "feed",
        "protocol": "micromessage",
        "connect": "127.0.0.1:9",
        "subscribe": [{"destination": "alerts"}],
    },
]


def test_upstreams_that_receive_subscribe_in_worker_0_only() -> None:
    """Accepted with workers; worker 0's gateway keeps their receiving side, the
    others' relay only (else each worker would publish every message again)."""
    config = parse(_relay(upstreams=RECEIVING), source="gw.toml")
    assert config.gateway.workers == 2
    first = worker_gateway(copy.deepcopy(config), set(), receives=True)
    other = worker_gateway(copy.deepcopy(config), set(), receives=False)
    assert first.config.upstreams[0].options["subscriptions"][0]["publisher"] == "alerts"
    assert first.config.upstreams[1].options["subscribe"][0]["destination"] == "alerts"
    assert other.config.upstreams[0].options["subscriptions"] == []
    assert other.config.upstreams[1].options["subscribe"] == []
    assert other.config.upstreams[0].connect == first.config.upstreams[0].connect


def test_segment_listeners_are_accepted_with_workers() -> None:
    """They are served by worker 0 only (tests/test_workers_replace.py)."""
    cfg = _relay(
        listeners=[{"name": "seg", "protocol": "segment", "bind": "127.0.0.1:0"}],
    )
    assert parse(cfg, source="gw.toml").gateway.workers == 2


def test_in_memory_topics_are_accepted_with_workers() -> None:
    """They forward between workers (tests/test_workers_topics.py): a route to a
    topic, a declared plain topic, and no ``from = "*"`` route at all."""
    cfg = _relay(
        routes=[{"from": "logs.*", "to": ["upstream:sink", "audit"]}],
        destinations=[{"name": "audit", "kind": "topic", "buffer_messages": 10}],
    )
    assert parse(cfg, source="gw.toml").gateway.workers == 2


def test_metrics_and_admin_are_accepted_with_workers() -> None:
    """The supervisor serves them for the whole gateway (tests/test_workers_ops.py)."""
    both = {"metrics": {"bind": "127.0.0.1:0"}, "admin": {"bind": "127.0.0.1:0"}}
    config = parse(_relay(**both), source="gw.toml")
    assert config.gateway.workers == 2
    assert config.metrics_bind == config.admin_bind == "127.0.0.1:0"


def test_bad_worker_counts_name_the_key() -> None:
    for value in ("many", 0, True):
        cfg = _relay()
        cfg["gateway"] = {"workers": value}
        with pytest.raises(ConfigError) as refused:
            parse(cfg, source="gw.toml")
        assert str(refused.value).startswith("gw.toml: gateway.workers: ")


# -- the transports' adopt -----------------------------------------------------------


def _listening(
    family: int = socket.AF_INET, address: tuple[str, int] | str = ("127.0.0.1", 0)
) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind(address)
    sock.listen()
    return sock


@pytest.mark.parametrize("scheme", ["tcp", "ws"])
async def test_tcp_and_ws_adopt_a_bound_socket(scheme: str) -> None:
    sock = _listening()
    port = sock.getsockname()[1]
    address = f"127.0.0.1:{port}" if scheme == "tcp" else f"ws://127.0.0.1:{port}/in"
    transport = default_registry().transport_for(address)
    (listener,) = await transport.adopt(address, [sock])
    assert transport.listener_name(listener) == address
    async with listener, await trio.open_tcp_stream("127.0.0.1", port) as client:
        accepted = await listener.accept()
        await client.send_all(b"x")
        assert await accepted.receive_some(1) == b"x"
        await accepted.aclose()


async def test_unix_adopts_a_bound_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "gw.sock")
    sock = _listening(socket.AF_UNIX, path)
    transport = default_registry().transport_for(f"unix:{path}")
    (listener,) = await transport.adopt(f"unix:{path}", [sock])
    assert transport.listener_name(listener) == f"unix:{path}"
    async with listener, await trio.open_unix_socket(path) as client:
        accepted = await listener.accept()
        await client.send_all(b"x")
        assert await accepted.receive_some(1) == b"x"
        await accepted.aclose()


async def test_a_listener_serves_adopted_sockets_across_restarts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A gateway whose listener adopted a socket serves on it (its port, not a new
    one), and the adopted socket outlives a gateway that closed its listener."""
    monkeypatch.setattr(listener_module, "_INHERITED", {})
    sock = _listening()
    bind = "127.0.0.1:0"
    listener_module.adopt_sockets("nd", bind, [sock])
    cfg = {"listeners": [{"name": "nd", "protocol": "ndjson", "bind": bind}]}
    for _ in range(2):
        async with running_gateway(cfg) as gw:
            assert gw.addresses["nd"] == [f"127.0.0.1:{sock.getsockname()[1]}"]
            async with await NdjsonClient.connect(*host_port(gw.addresses["nd"][0])) as c:
                assert (await c.publish(b"x", "t")).status == "delivered"
    sock.close()
