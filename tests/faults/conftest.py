"""Shared pieces of the fault suite: a Lumberjack sink that can be killed, a gateway
process that can be SIGKILLed, and an at-least-once Lumberjack sender.

The suite checks one promise under faults: **nothing acked is ever lost**. A
sender counts an event as acked only once ``LumberjackClient.send`` returned
for its whole window; the sink records every event *before* it lets its
window be acked. So an event acked to the sender and missing from the sink's
record was lost by the gateway, whatever faults happened in between.
Duplicates (events resent after a fault) are allowed: the promise is at least
once.

The helpers are handed to the tests as fixtures (the folder has no
``__init__``, so test modules do not import from here).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

from bench._sink import KillableSink as LumberjackSink
from gateway.core.errors import ProtocolError
from protocols.lumberjack.client import ClientSettings, LumberjackClient

#: What a sender treats as "the connection failed: reconnect and resend".
CONNECTION_ERRORS = (
    OSError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
    ProtocolError,
)
_SERVING = re.compile(r"serving: (.*)$")
_LISTENER = re.compile(r"(\S+) \((\S+)\) on (.+)")


def free_port() -> int:
    """A loopback port the OS says is free now (for a listener that must keep its port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def vm_rss_bytes(pid: int | str = "self") -> int:
    """Resident memory of a process now (``VmRSS`` of /proc/PID/status)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise LookupError("no VmRSS")


def toml_config(data: dict[str, Any]) -> str:
    """Just enough TOML for a gateway config: tables and arrays of tables of scalars."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise ValueError(f"cannot write {v!r} as TOML")

    lines = []
    for key, table in data.items():
        for item in table if isinstance(table, list) else [table]:
            lines.append(f"[[{key}]]" if isinstance(table, list) else f"[{key}]")
            lines += [f"{k} = {value(v)}" for k, v in item.items()]
            lines.append("")
    return "\n".join(lines)


# -- the sink: a Logstash stand-in ----------------------------------------------------


# -- the sender: at least once --------------------------------------------------------


def acked_total(senders: Sequence[AtLeastOnceSender]) -> int:
    """Events acked to all of ``senders`` so far."""
    return sum(len(s.acked) for s in senders)


async def until_acked(senders: Sequence[AtLeastOnceSender], more: int, limit: float = 30) -> None:
    """Wait until ``senders`` got ``more`` events acked (the gateway is under load)."""
    target = acked_total(senders) + more
    with trio.fail_after(limit):
        while acked_total(senders) < target:
            await trio.sleep(0.01)


class AtLeastOnceSender:
    """Sends numbered events in windows; on any connection error, reconnects and resends.

    An event counts as acked only when ``send`` returned for its window (the
    gateway acks Lumberjack windows whole). A window that failed is sent
    again, whole, on the next connection: nothing unacked is given up.
    """

    def __init__(
        self,
        address: tuple[str, int],
        *,
        first: int = 0,
        window: int = 200,
        pad: int = 100,
        timeout: float = 10.0,
        retry_delay: float = 0.05,
    ) -> None:
        self.address = address
        self.next_n = first
        self.window = window
        self.pad = "x" * pad
        self.settings = ClientSettings(timeout=timeout, bulk_max_size=window)
        self.retry_delay = retry_delay
        #: Distinct events made (sent at least once).
        self.sent = 0
        #: Events put on the wire, resends included.
        self.transmitted = 0
        self.acked: list[int] = []
        #: Connection errors seen (each one means a reconnect and a resend).
        self.errors: Counter[str] = Counter()
        self.connects = 0
        #: Trio time of each ack, for "how long until acks came back".
        self.last_ack_at: float | None = None
        self._progress = trio.lowlevel.ParkingLot()

    def _events(self, numbers: list[int]) -> list[bytes]:
        return [b'{"n":%d,"pad":"%s"}' % (n, self.pad.encode()) for n in numbers]

    async def run(self, stop: trio.Event) -> None:
        """Send until ``stop`` is set, then until the window in flight is acked."""
        client: LumberjackClient | None = None
        pending: list[int] = []
        try:
            while pending or not stop.is_set():
                if not pending:
                    pending = list(range(self.next_n, self.next_n + self.window))
                    self.next_n += self.window
                    self.sent += self.window
                try:
                    if client is None:
                        client = await LumberjackClient.connect(
                            *self.address, settings=self.settings
                        )
                        self.connects += 1
                    self.transmitted += len(pending)
                    await client.send(self._events(pending))
                except CONNECTION_ERRORS as e:
                    self.errors[type(e).__name__] += 1
                    if client is not None:
                        await trio.aclose_forcefully(client.stream)
                        client = None
                    # Real time: the gateway restarts in another process; retry after a pause.
                    await trio.sleep(self.retry_delay)
                    continue
                self.acked += pending
                self.last_ack_at = trio.current_time()
                pending = []
                self._progress.unpark_all()
        finally:
            if client is not None:
                await trio.aclose_forcefully(client.stream)

    async def wait_acked(self, count: int) -> None:
        """Wait until at least ``count`` events in all were acked."""
        while len(self.acked) < count:
            await self._progress.park()


def report(name: str, senders: list[AtLeastOnceSender], sink: LumberjackSink) -> dict[str, int]:
    """The counts of a run, printed; ``lost`` is what the test asserts is 0."""
    acked = [n for s in senders for n in s.acked]
    received = Counter(sink.received)
    counts = {
        "sent": sum(s.sent for s in senders),
        "transmitted": sum(s.transmitted for s in senders),
        "acked": len(acked),
        "received": len(sink.received),
        "distinct_received": len(received),
        "duplicates": len(sink.received) - len(received),
        "lost": sum(1 for n in acked if n not in received),
        "sender_errors": sum(sum(s.errors.values()) for s in senders),
    }
    print(f"\n{name}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return counts


# -- the gateway as a process ---------------------------------------------------------


class GatewayProcess:
    """``python -m gateway run CONFIG``, startable again after a SIGKILL."""

    def __init__(self, nursery: trio.Nursery, config: Path) -> None:
        self.nursery = nursery
        self.config = config
        self.process: trio.Process | None = None
        self.addresses: dict[str, list[str]] = {}
        self.starts = 0
        #: The last lines of the log of every run, for a failing test's message.
        self.log: deque[str] = deque(maxlen=300)

    async def start(self, timeout: float = 30.0) -> dict[str, list[str]]:
        """Start it and wait for its ``serving:`` line; the listeners' addresses."""
        assert self.process is None or self.process.returncode is not None
        self.starts += 1
        self.log.append(f"---- start {self.starts}")
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "gateway", "run", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=str(self.config.parent),
        )
        self.process = process
        serving = trio.Event()
        self.addresses = {}
        self.nursery.start_soon(self._read_log, process, serving)
        with trio.move_on_after(timeout):
            await serving.wait()
        if not self.addresses:
            process.kill()
            await process.wait()
            raise AssertionError("the gateway did not start:\n" + "\n".join(self.log))
        return self.addresses

    async def _read_log(self, process: trio.Process, serving: trio.Event) -> None:
        assert process.stderr is not None
        pending = b""
        async with process.stderr:
            while data := await process.stderr.receive_some(65536):
                pending += data
                *lines, pending = pending.split(b"\n")
                for raw in lines:
                    line = raw.decode("utf-8", "replace")
                    self.log.append(line)
                    m = _SERVING.search(line)
                    if m and not serving.is_set():
                        for part in m.group(1).split(", "):
                            if lm := _LISTENER.fullmatch(part):
                                self.addresses[lm.group(1)] = lm.group(3).split()
                        serving.set()
        serving.set()

    async def kill(self) -> None:
        """SIGKILL: no drain, no goodbye; its sockets are closed by the kernel."""
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await self.process.wait()

    async def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM (drain), then SIGKILL if it takes longer than ``timeout``."""
        if self.process is None:
            return None
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(timeout):
                await self.process.wait()
        await self.kill()
        return self.process.returncode

    def warnings(self) -> list[str]:
        return [line for line in self.log if " WARNING " in line or " ERROR " in line]


@pytest.fixture
async def sink_factory(nursery: trio.Nursery) -> AsyncIterator[Callable[..., LumberjackSink]]:
    """Makes sinks that run in the test's nursery; each is killed at the end."""
    made: list[LumberjackSink] = []

    def make(**kwargs: Any) -> LumberjackSink:
        sink = LumberjackSink(nursery, **kwargs)
        made.append(sink)
        return sink

    yield make
    for sink in made:
        if sink.running:
            await sink.kill()


@pytest.fixture
async def gateway_process(nursery: trio.Nursery) -> AsyncIterator[Callable[[Path], GatewayProcess]]:
    """Makes :class:`GatewayProcess` objects; every one still running is killed at the end."""
    made: list[GatewayProcess] = []

    def make(config: Path) -> GatewayProcess:
        gw = GatewayProcess(nursery, config)
        made.append(gw)
        return gw

    try:
        yield make
    finally:
        with trio.CancelScope(shield=True):
            for gw in made:
                await gw.kill()


@pytest.fixture
def rng() -> random.Random:
    """Random timings, seeded from ``FAULTS_SEED`` when set; the seed is printed to replay a run."""
    seed = int(os.environ.get("FAULTS_SEED") or random.randrange(2**32))
    print(f"\nFAULTS_SEED={seed}")
    return random.Random(seed)


@pytest.fixture
def faults() -> ModuleType:
    """This module, so tests can use its helpers (``faults.AtLeastOnceSender``, …)."""
    return sys.modules[__name__]
