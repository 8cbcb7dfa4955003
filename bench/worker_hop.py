"""What a topic hop between two workers costs per message, against no hop.

With ``--workers N`` a message published to an in-memory topic in one
worker reaches subscribers in another over a unix-socket link
(:mod:`gateway.core.peers`). This measures that hop in two processes, as
the workers are: worker 0 (this process) and worker 1 (a child process),
each with its own :class:`~gateway.core.hub.Hub` and
:class:`~gateway.core.peers.Peers`, linked by the workers' own driver
(:func:`~gateway.runtime.peerlinks.serve_peers`) over real unix sockets.

A publisher on worker 0 publishes batches of ``--batch`` messages of
``--size`` bytes, keeping ``--window`` batches unsettled, in three modes:

- ``alone``: to topic ``alone``, which nobody subscribes to (what publishing
  costs by itself: the receipt settles at once, nothing is forwarded);
- ``local``: to topic ``local``, whose acking subscriber is on worker 0 (no
  hop: worker 1 has no interest in it, so nothing is forwarded);
- ``hop``: to topic ``hop``, whose acking subscriber is on worker 1 (every
  message is forwarded once, and its receipt settles on worker 1's answer).

The modes run ABCCBA (alone, local, hop, hop, local, alone), each for a
sixth of ``--seconds``. Each phase reports messages/s and CPU per message of
each process (``time.process_time`` in each, read at the phase's edges); the
hop cost per message is the CPU per message of both workers in ``hop`` minus
that in ``local``. Against ``alone``, the sides split: worker 0's forwarding
to one link is its ``hop`` minus ``alone``; a local subscriber's share is
``local`` minus ``alone``. Self-checks: every message reaches its subscriber exactly
once and every receipt settles delivered.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import trio

from gateway.core.hub import Hub
from gateway.core.model import Message, Outcome
from gateway.core.peers import Peers
from gateway.runtime.peerlinks import serve_peers

from . import Result, add_warmup, int_at_least, register
from ._system import busy_seconds

MODES = ("alone", "local", "hop")
ORDER = ("alone", "local", "hop", "hop", "local", "alone")
_SEQ = 12  # digits of the sequence number at the start of each body


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int_at_least(1), default=100, help="messages per publish")
    parser.add_argument("--size", type=int_at_least(_SEQ), default=256, help="body bytes")
    parser.add_argument(
        "--window", type=int_at_least(1), default=16, help="publishes unsettled at once"
    )
    add_warmup(parser)


class Checker:
    """Counts what a subscriber got: each sequence number once, none unknown."""

    def __init__(self) -> None:
        self.seen = bytearray()
        self.received = 0
        self.duplicates = 0

    def take(self, body: bytes) -> None:
        seq = int(body[:_SEQ])
        if seq >= len(self.seen):
            self.seen.extend(bytes(max(seq + 1 - len(self.seen), 65536)))
        if self.seen[seq]:
            self.duplicates += 1
        self.seen[seq] = 1
        self.received += 1


async def _consume(hub: Hub, topic: str, checker: Checker, max_unacked: int) -> None:
    """An acking subscriber: check each delivery, ack each window at once."""
    sub = hub.subscribe(topic, max_unacked=max_unacked)
    while True:
        deliveries = await sub.receive()
        for d in deliveries:
            checker.take(d.message.body)
        sub.ack_many([d.tag for d in deliveries])


# -- worker 1: the child process --------------------------------------------------------


def _worker1(paths: list[str], conn: Connection, max_unacked: int) -> None:
    """Worker 1's process: its hub, its links, the ``hop`` subscriber; answers marks."""
    trio.run(_worker1_main, paths, conn, max_unacked)


async def _worker1_main(paths: list[str], conn: Connection, max_unacked: int) -> None:
    hub, peers, checker = Hub(), Peers(1), Checker()
    hub.join(peers)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_peers, peers, paths)
        nursery.start_soon(_consume, hub, "hop", checker, max_unacked)
        conn.send("ready")
        while True:
            command = await trio.to_thread.run_sync(conn.recv, abandon_on_cancel=True)
            conn.send((time.process_time(), checker.received, checker.duplicates))
            if command == "stop":
                nursery.cancel_scope.cancel()


# -- worker 0: this process -------------------------------------------------------------


@dataclass(slots=True)
class Phase:
    mode: str
    messages: int
    seconds: float
    cpu0: float
    cpu1: float
    #: CPU seconds the whole machine used (all processes) during the phase.
    machine: float | None


class Publisher:
    """Worker 0's side: publishes numbered batches and keeps their receipts."""

    def __init__(self, hub: Hub, args: argparse.Namespace, result: Result) -> None:
        self.hub, self.args, self.result = hub, args, result
        self.next_seq = dict.fromkeys(MODES, 0)
        self.pad = b"x" * (args.size - _SEQ)

    def batch(self, mode: str) -> list[Message]:
        start = self.next_seq[mode]
        self.next_seq[mode] = start + self.args.batch
        pad = self.pad
        return [
            Message(mode, b"%012d" % seq + pad) for seq in range(start, start + self.args.batch)
        ]

    async def run_for(self, mode: str, seconds: float) -> int:
        """Publish to ``mode``'s topic for ``seconds``, then wait for every receipt;
        returns how many messages settled."""
        window: collections.deque[Any] = collections.deque()
        settled = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            if len(window) >= self.args.window:
                settled += await self._settle(window.popleft())
            window.append(await self.hub.publish(self.batch(mode)))
        while window:
            settled += await self._settle(window.popleft())
        return settled

    async def _settle(self, receipt: Any) -> int:
        if await receipt.wait() is not Outcome.DELIVERED and len(self.result.problems) < 5:
            self.result.problems.append(
                f"a receipt settled {receipt.outcome.name}: {receipt.reason}"
            )
        return int(receipt.count)


class Worker1:
    """The parent's handle on the child: marks read its CPU and its counts."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def mark(self, command: str = "mark") -> tuple[float, int, int]:
        self.conn.send(command)
        reply: tuple[float, int, int] = await _receive(self.conn)
        return reply


async def _receive(conn: Connection, timeout: float = 30.0) -> Any:
    """Worker 1's next reply (a child that died or hangs fails the run, not hangs it)."""
    if not await trio.to_thread.run_sync(conn.poll, timeout):
        raise RuntimeError(f"worker 1 did not answer within {timeout:g}s")
    return conn.recv()


async def _phase(publisher: Publisher, child: Worker1, mode: str, seconds: float) -> Phase:
    cpu1_before = (await child.mark())[0]
    machine_before = busy_seconds()
    t0, cpu0_before = time.perf_counter(), time.process_time()
    n = await publisher.run_for(mode, seconds)
    t1, cpu0_after = time.perf_counter(), time.process_time()
    machine_after = busy_seconds()
    cpu1_after = (await child.mark())[0]
    machine = None
    if machine_before is not None and machine_after is not None:
        machine = machine_after - machine_before
    return Phase(mode, n, t1 - t0, cpu0_after - cpu0_before, cpu1_after - cpu1_before, machine)


async def _worker0(
    args: argparse.Namespace, paths: list[str], conn: Connection, result: Result
) -> list[Phase]:
    hub, peers, local = Hub(), Peers(0), Checker()
    hub.join(peers)
    child = Worker1(conn)
    max_unacked = args.batch * args.window * 2
    phases = []
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_peers, peers, paths)
        nursery.start_soon(_consume, hub, "local", local, max_unacked)
        await _receive(conn)  # "ready": worker 1 subscribed
        with trio.fail_after(10):
            # Worker 1's interest arrives over the link; nothing signals it.
            while "hop" not in getattr(peers.outgoing.get(1), "interest", ()):  # noqa: ASYNC110
                await trio.sleep(0.01)
        publisher = Publisher(hub, args, result)
        for mode in MODES:
            await publisher.run_for(mode, args.warmup / 2)
        for mode in ORDER:
            phases.append(await _phase(publisher, child, mode, args.seconds / len(ORDER)))
        _, received1, duplicates1 = await child.mark("stop")
        _check(result, "local", publisher.next_seq["local"], local.received, local.duplicates)
        _check(result, "hop", publisher.next_seq["hop"], received1, duplicates1)
        result.details["forwarded"] = peers.messages_sent
        nursery.cancel_scope.cancel()
    return phases


def _check(result: Result, mode: str, published: int, received: int, duplicates: int) -> None:
    if duplicates:
        result.problems.append(f"{mode}: {duplicates} messages received twice")
    if received != published:
        result.problems.append(f"{mode}: {received} received of {published} published")


# -- the figures -------------------------------------------------------------------------


def _report(result: Result, phases: list[Phase]) -> None:
    result.details["phases"] = [
        {
            "mode": p.mode,
            "messages": p.messages,
            "seconds": p.seconds,
            "cpu_worker0_s": p.cpu0,
            "cpu_worker1_s": p.cpu1,
            "cpu_machine_s": p.machine,
        }
        for p in phases
    ]
    per: dict[str, dict[str, float]] = {}
    for mode in MODES:
        mine = [p for p in phases if p.mode == mode]
        n = sum(p.messages for p in mine)
        seconds = sum(p.seconds for p in mine)
        per[mode] = {
            "rate": statistics.median(p.messages / p.seconds for p in mine),
            "w0": sum(p.cpu0 for p in mine) / n * 1e6,
            "w1": sum(p.cpu1 for p in mine) / n * 1e6,
        }
        result.add(f"{mode} msg/s", per[mode]["rate"], "msg/s")
        result.add(f"{mode} cpu/msg worker 0", per[mode]["w0"], "us")
        result.add(f"{mode} cpu/msg worker 1", per[mode]["w1"], "us")
        result.add(f"{mode} cpu/msg both", per[mode]["w0"] + per[mode]["w1"], "us")
        machine = [p.machine for p in mine]
        if all(m is not None for m in machine):
            busy = sum(m for m in machine if m is not None) / seconds
            others = busy - sum(p.cpu0 + p.cpu1 for p in mine) / seconds
            result.add(f"{mode} other processes' load", max(0.0, others) * 100, "% core")
    local, hop, alone = per["local"], per["hop"], per["alone"]
    result.add("local subscriber (local - alone)", local["w0"] - alone["w0"], "us/msg")
    result.add("forwarding on worker 0 (hop - alone)", hop["w0"] - alone["w0"], "us/msg")
    result.add("hop cost worker 0", hop["w0"] - local["w0"], "us/msg")
    result.add("hop cost worker 1", hop["w1"] - local["w1"], "us/msg")
    result.add("hop cost per message", hop["w0"] + hop["w1"] - local["w0"] - local["w1"], "us/msg")


@register(
    "worker-hop",
    "a topic hop between two worker processes over a unix socket, against none "
    "(CPU per message each side)",
    arguments=_arguments,
    default_seconds=8.0,
)
def run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "batch": args.batch,
            "size": args.size,
            "window": args.window,
            "order": list(ORDER),
            "processes": 2,
        }
    )
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    with tempfile.TemporaryDirectory(prefix="bench-hop-") as tmp:
        paths = [os.path.join(tmp, f"w{i}.sock") for i in range(2)]
        max_unacked = args.batch * args.window * 2
        child = context.Process(target=_worker1, args=(paths, theirs, max_unacked), daemon=True)
        child.start()
        try:
            phases = trio.run(_worker0, args, paths, mine, result)
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()
                result.problems.append("worker 1 did not exit when told to stop")
    if child.exitcode not in (0, None) and not result.problems:
        result.problems.append(f"worker 1 exited with status {child.exitcode}")
    _report(result, phases)
    return result
