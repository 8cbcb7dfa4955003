"""What a hop between two workers costs per message, against no hop.

With ``--workers N`` a message published to an in-memory topic in one
worker reaches subscribers in another over a unix-socket link
(:mod:`gateway.core.peers`), and a stateful destination (a queue, a log)
lives in one *home* worker that the others reach through proxies
(:mod:`gateway.core.remote`) over the same links. This measures those hops
in two processes, as the workers are: worker 0 (this process) and worker 1
(a child process), each with its own :class:`~gateway.core.hub.Hub`,
:class:`~gateway.core.peers.Peers`, :class:`~gateway.runtime.catalog.Catalog`
and :class:`~gateway.core.remote.RemoteProvider` (as ``gateway run
--workers 2`` builds them), linked by the workers' own driver
(:func:`~gateway.runtime.peerlinks.serve_peers`) over real unix sockets.

A publisher publishes batches of ``--batch`` messages of ``--size`` bytes,
keeping ``--window`` batches unsettled. ``--kind`` chooses what it publishes to:

- ``topic`` (the default), from worker 0, in three modes:

  - ``alone``: to topic ``alone``, which nobody subscribes to (what
    publishing costs by itself: the receipt settles at once, nothing is
    forwarded);
  - ``local``: to topic ``local``, whose acking subscriber is on worker 0 (no
    hop: worker 1 has no interest in it, so nothing is forwarded);
  - ``hop``: to topic ``hop``, whose acking subscriber is on worker 1 (every
    message is forwarded once, and its receipt settles on worker 1's answer).

- ``queue``, from worker 0, to a queue whose acking consumer is on worker 0:

  - ``local``: the queue's home is worker 0 (no hop);
  - ``proxy``: its home is worker 1, so every message crosses twice (the
    publish to the home, the delivery back to the consumer's proxy) and its
    acks cross once; the receipt settles on the home's answer.

- ``durable``: to a durable log in the store (``store = "embedded"``, home
  worker 0, which alone opens the store; here in a temporary directory, fsync
  ``interval`` as the gateway's default), nobody reading it:

  - ``local``: published from worker 0;
  - ``proxy``: published from worker 1, through its proxy (the receipt settles
    when worker 0 answers that the batch is stored).

The modes run in ABBA order (``topic``: ABCCBA), each for an equal share of
``--seconds``. Each phase reports messages/s and CPU per message of each
process (``time.process_time`` in each, read at the phase's edges). The hop
(or proxy) cost per message is the CPU per message of both workers in
``hop`` (``proxy``) minus that in ``local``. For topics, against ``alone``,
the sides split: worker 0's forwarding to one link is its ``hop`` minus
``alone``; a local subscriber's share is ``local`` minus ``alone``.
Self-checks: every receipt settles delivered, every message reaches its
subscriber exactly once, and a durable log holds every message published to it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import multiprocessing
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import trio

from gateway.core.destination import Subscription
from gateway.core.hub import Hub, HubLimits
from gateway.core.model import Message, Outcome
from gateway.core.peers import Peers
from gateway.core.remote import RemoteProvider
from gateway.core.topic import TopicLimits
from gateway.runtime.catalog import Catalog, DestinationSpec, home_worker
from gateway.runtime.peerlinks import serve_peers
from gateway.store import Store

from . import Result, add_warmup, int_at_least, register
from ._system import busy_seconds

#: The modes of each ``--kind``, in their order (run ABBA).
KINDS: dict[str, tuple[str, ...]] = {
    "topic": ("alone", "local", "hop"),
    "queue": ("local", "proxy"),
    "durable": ("local", "proxy"),
}
#: Where each mode's acking subscriber is (worker 0 or 1); modes not here have none.
SUBSCRIBERS: dict[str, dict[str, int]] = {
    "topic": {"local": 0, "hop": 1},
    "queue": {"local": 0, "proxy": 0},
    "durable": {},
}
#: Bytes a durable log keeps (older chunks are dropped, as a full ``retain`` does).
RETAIN = 256 * 2**20
SPECS = (
    DestinationSpec("q.*", kind="queue"),
    DestinationSpec("d.*", store="embedded", retain=RETAIN),
)
_SEQ = 12  # digits of the sequence number at the start of each body


def order(kind: str) -> tuple[str, ...]:
    """The phases of ``kind``: its modes, then the same backwards (ABBA)."""
    modes = KINDS[kind]
    return (*modes, *reversed(modes))


def homed_at(home: int, prefix: str, workers: int = 2) -> str:
    """The first name ``prefix<n>`` whose home, of ``workers``, is ``home``."""
    n = 0
    while home_worker(f"{prefix}{n}", workers) != home:
        n += 1
    return f"{prefix}{n}"


def destination(kind: str, mode: str) -> str:
    """The destination ``mode`` of ``kind`` publishes to."""
    if kind == "queue":
        return homed_at(0 if mode == "local" else 1, "q.")
    if kind == "durable":
        return f"d.{mode}"  # durable: home worker 0 whatever the name
    return mode


def publishing_worker(kind: str, mode: str) -> int:
    """The worker that publishes in ``mode``: worker 1 only for a durable proxy."""
    return 1 if (kind, mode) == ("durable", "proxy") else 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kind",
        choices=sorted(KINDS),
        default="topic",
        help="a topic hop, a queue homed at the other worker, or a durable log published "
        "from the other worker (default: %(default)s)",
    )
    parser.add_argument("--batch", type=int_at_least(1), default=100, help="messages per publish")
    parser.add_argument("--size", type=int_at_least(_SEQ), default=256, help="body bytes")
    parser.add_argument(
        "--window", type=int_at_least(1), default=16, help="publishes unsettled at once"
    )
    add_warmup(parser)


def _hub(index: int, store: Store | None) -> tuple[Hub, Peers]:
    """Worker ``index`` of 2 as ``gateway run --workers 2`` builds it: its catalog of
    :data:`SPECS`, proxies first for what is homed at the other worker, its peers."""
    limits = HubLimits()
    catalog = Catalog(SPECS, TopicLimits(limits.buffer_bytes, limits.buffer_messages))
    catalog.store = store
    peers = Peers(index)
    provider = RemoteProvider(peers, lambda name: catalog.home(name, 2), catalog.info)
    hub = Hub(limits=limits, providers=[provider, catalog])
    hub.join(peers)
    return hub, peers


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


async def _consume(sub: Subscription, checker: Checker) -> None:
    """An acking subscriber: check each delivery, ack each window at once. (Subscribed
    before its task runs: a publisher that never waits would not let the task start.)"""
    while True:
        deliveries = await sub.receive()
        for d in deliveries:
            checker.take(d.message.body)
        sub.ack_many([d.tag for d in deliveries])


class Publisher:
    """A worker's publisher: numbered batches per destination, their receipts kept."""

    def __init__(self, hub: Hub, args: argparse.Namespace, problems: list[str]) -> None:
        self.hub, self.args, self.problems = hub, args, problems
        self.next_seq: dict[str, int] = collections.defaultdict(int)
        self.pad = b"x" * (args.size - _SEQ)

    def batch(self, name: str) -> list[Message]:
        start = self.next_seq[name]
        self.next_seq[name] = start + self.args.batch
        pad = self.pad
        return [
            Message(name, b"%012d" % seq + pad) for seq in range(start, start + self.args.batch)
        ]

    async def run_for(self, name: str, seconds: float) -> int:
        """Publish to ``name`` for ``seconds``, then wait for every receipt;
        returns how many messages settled."""
        window: collections.deque[Any] = collections.deque()
        settled = 0
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            if len(window) >= self.args.window:
                settled += await self._settle(window.popleft())
            window.append(await self.hub.publish(self.batch(name)))
        while window:
            settled += await self._settle(window.popleft())
        return settled

    async def _settle(self, receipt: Any) -> int:
        if await receipt.wait() is not Outcome.DELIVERED and len(self.problems) < 5:
            self.problems.append(f"a receipt settled {receipt.outcome.name}: {receipt.reason}")
        return int(receipt.count)


# -- worker 1: the child process --------------------------------------------------------


def _worker1(paths: list[str], conn: Connection, args: argparse.Namespace) -> None:
    """Worker 1's process: its hub, its links, its subscriber if any; answers commands."""
    trio.run(_worker1_main, paths, conn, args)


async def _worker1_main(paths: list[str], conn: Connection, args: argparse.Namespace) -> None:
    hub, peers = _hub(1, None)
    checker, problems = Checker(), list[str]()
    publisher = Publisher(hub, args, problems)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_peers, peers, paths)
        for mode, worker in SUBSCRIBERS[args.kind].items():
            if worker == 1:
                name = destination(args.kind, mode)
                sub = hub.subscribe(name, max_unacked=_max_unacked(args))
                nursery.start_soon(_consume, sub, checker)
        conn.send("ready")
        while True:
            command = await trio.to_thread.run_sync(conn.recv, abandon_on_cancel=True)
            if isinstance(command, tuple):  # ("publish", name, seconds)
                settled = await publisher.run_for(command[1], command[2])
                conn.send((settled, problems[:]))
                continue
            conn.send((time.process_time(), checker.received, checker.duplicates))
            if command == "stop":
                nursery.cancel_scope.cancel()


def _max_unacked(args: argparse.Namespace) -> int:
    return int(args.batch * args.window * 2)


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


class Worker1:
    """The parent's handle on the child: marks read its CPU and its counts; it can
    be told to publish (and keeps count of what it settled)."""

    def __init__(self, conn: Connection, result: Result) -> None:
        self.conn, self.result = conn, result
        self.settled: dict[str, int] = collections.defaultdict(int)

    async def mark(self, command: str = "mark") -> tuple[float, int, int]:
        self.conn.send(command)
        reply: tuple[float, int, int] = await _receive(self.conn)
        return reply

    async def publish(self, name: str, seconds: float) -> int:
        """Worker 1 publishes to ``name`` for ``seconds``; how many messages settled."""
        self.conn.send(("publish", name, seconds))
        settled, problems = await _receive(self.conn, 30.0 + seconds)
        for problem in problems:
            if problem not in self.result.problems:
                self.result.problems.append(f"worker 1: {problem}")
        self.settled[name] += settled
        return int(settled)


async def _receive(conn: Connection, timeout: float = 30.0) -> Any:
    """Worker 1's next reply (a child that died or hangs fails the run, not hangs it)."""
    if not await trio.to_thread.run_sync(conn.poll, timeout):
        raise RuntimeError(f"worker 1 did not answer within {timeout:g}s")
    return conn.recv()


@dataclass(slots=True)
class Side:
    """Worker 0's side of the run: its hub and peers, its publisher, worker 1's handle."""

    kind: str
    hub: Hub
    peers: Peers
    publisher: Publisher
    child: Worker1

    async def publish(self, mode: str, seconds: float) -> int:
        name = destination(self.kind, mode)
        if publishing_worker(self.kind, mode) == 1:
            return await self.child.publish(name, seconds)
        return await self.publisher.run_for(name, seconds)


async def _phase(side: Side, mode: str, seconds: float) -> Phase:
    cpu1_before = (await side.child.mark())[0]
    machine_before = busy_seconds()
    t0, cpu0_before = time.perf_counter(), time.process_time()
    n = await side.publish(mode, seconds)
    t1, cpu0_after = time.perf_counter(), time.process_time()
    machine_after = busy_seconds()
    cpu1_after = (await side.child.mark())[0]
    machine = None
    if machine_before is not None and machine_after is not None:
        machine = machine_after - machine_before
    return Phase(mode, n, t1 - t0, cpu0_after - cpu0_before, cpu1_after - cpu1_before, machine)


async def _linked(peers: Peers, kind: str) -> None:
    """Until worker 0 has its link to worker 1 (and, for topics, worker 1's interest
    in ``hop``): nothing signals either, so poll."""
    with trio.fail_after(10):
        while peers.link(1) is None:  # noqa: ASYNC110
            await trio.sleep(0.01)
        if kind == "topic":
            while "hop" not in getattr(peers.outgoing.get(1), "interest", ()):  # noqa: ASYNC110
                await trio.sleep(0.01)


async def _worker0(
    args: argparse.Namespace, tmp: Path, conn: Connection, result: Result
) -> list[Phase]:
    paths = [str(tmp / f"w{i}.sock") for i in range(2)]
    async with contextlib.AsyncExitStack() as stack:
        store = None
        if args.kind == "durable":
            store = await stack.enter_async_context(Store.open(tmp / "store"))
        hub, peers = _hub(0, store)
        nursery = await stack.enter_async_context(trio.open_nursery())
        await nursery.start(serve_peers, peers, paths)
        await _receive(conn)  # "ready": worker 1 subscribed
        await _linked(peers, args.kind)
        checkers: dict[str, Checker] = {}
        for mode, worker in SUBSCRIBERS[args.kind].items():
            if worker == 0:
                name = destination(args.kind, mode)
                checkers[name] = Checker()
                sub = hub.subscribe(name, max_unacked=_max_unacked(args))
                nursery.start_soon(_consume, sub, checkers[name])
        side = Side(
            args.kind, hub, peers, Publisher(hub, args, result.problems), Worker1(conn, result)
        )
        for mode in KINDS[args.kind]:
            await side.publish(mode, args.warmup / 2)
        phases = [
            await _phase(side, mode, args.seconds / len(order(args.kind)))
            for mode in order(args.kind)
        ]
        _, received1, duplicates1 = await side.child.mark("stop")
        _check_all(result, side, checkers, received1, duplicates1)
        result.details["forwarded by worker 0"] = peers.messages_sent
        nursery.cancel_scope.cancel()
    return phases


def _check_all(
    result: Result, side: Side, checkers: dict[str, Checker], received1: int, duplicates1: int
) -> None:
    """Every subscriber got each message published once; a durable log holds them all."""
    published = side.publisher.next_seq
    for name, checker in checkers.items():
        _check(result, name, published[name], checker.received, checker.duplicates)
    if side.kind == "topic":
        _check(result, "hop", published["hop"], received1, duplicates1)
    if side.kind == "durable":
        for mode in KINDS["durable"]:
            name = destination("durable", mode)
            total = published[name] + side.child.settled[name]
            stored = side.hub.destinations()[name].figures().received
            if stored != total:
                result.problems.append(f"{name}: {stored} stored of {total} published")


def _check(result: Result, name: str, published: int, received: int, duplicates: int) -> None:
    if duplicates:
        result.problems.append(f"{name}: {duplicates} messages received twice")
    if received != published:
        result.problems.append(f"{name}: {received} received of {published} published")


# -- the figures -------------------------------------------------------------------------


def _report(result: Result, kind: str, phases: list[Phase]) -> None:
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
    per = {mode: _report_mode(result, mode, phases) for mode in KINDS[kind]}
    local = per["local"]
    if kind != "topic":
        proxy = per["proxy"]
        result.add("proxy cost worker 0", proxy["w0"] - local["w0"], "us/msg")
        result.add("proxy cost worker 1", proxy["w1"] - local["w1"], "us/msg")
        both = proxy["w0"] + proxy["w1"] - local["w0"] - local["w1"]
        result.add("proxy cost per message", both, "us/msg")
        return
    hop, alone = per["hop"], per["alone"]
    result.add("local subscriber (local - alone)", local["w0"] - alone["w0"], "us/msg")
    result.add("forwarding on worker 0 (hop - alone)", hop["w0"] - alone["w0"], "us/msg")
    result.add("hop cost worker 0", hop["w0"] - local["w0"], "us/msg")
    result.add("hop cost worker 1", hop["w1"] - local["w1"], "us/msg")
    result.add("hop cost per message", hop["w0"] + hop["w1"] - local["w0"] - local["w1"], "us/msg")


def _report_mode(result: Result, mode: str, phases: list[Phase]) -> dict[str, float]:
    """One mode's figures over its phases: its rate, each worker's CPU per message (µs)."""
    mine = [p for p in phases if p.mode == mode]
    n = sum(p.messages for p in mine)
    seconds = sum(p.seconds for p in mine)
    figures = {
        "rate": statistics.median(p.messages / p.seconds for p in mine),
        "w0": sum(p.cpu0 for p in mine) / n * 1e6,
        "w1": sum(p.cpu1 for p in mine) / n * 1e6,
    }
    result.add(f"{mode} msg/s", figures["rate"], "msg/s")
    result.add(f"{mode} cpu/msg worker 0", figures["w0"], "us")
    result.add(f"{mode} cpu/msg worker 1", figures["w1"], "us")
    result.add(f"{mode} cpu/msg both", figures["w0"] + figures["w1"], "us")
    machine = [p.machine for p in mine]
    if all(m is not None for m in machine):
        busy = sum(m for m in machine if m is not None) / seconds
        others = busy - sum(p.cpu0 + p.cpu1 for p in mine) / seconds
        result.add(f"{mode} other processes' load", max(0.0, others) * 100, "% core")
    return figures


@register(
    "worker-hop",
    "a topic hop, a queue homed at the other worker or a durable log published from it, "
    "between two worker processes over a unix socket, against none (CPU per message each side)",
    arguments=_arguments,
    default_seconds=8.0,
)
def run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "kind": args.kind,
            "batch": args.batch,
            "size": args.size,
            "window": args.window,
            "order": list(order(args.kind)),
            "processes": 2,
        }
    )
    context = multiprocessing.get_context("spawn")
    mine, theirs = context.Pipe()
    with tempfile.TemporaryDirectory(prefix="bench-hop-") as tmp:
        paths = [os.path.join(tmp, f"w{i}.sock") for i in range(2)]
        child = context.Process(target=_worker1, args=(paths, theirs, args), daemon=True)
        child.start()
        try:
            phases = trio.run(_worker0, args, Path(tmp), mine, result)
        finally:
            child.join(10)
            if child.is_alive():
                child.kill()
                child.join()
                result.problems.append("worker 1 did not exit when told to stop")
    if child.exitcode not in (0, None) and not result.problems:
        result.problems.append(f"worker 1 exited with status {child.exitcode}")
    _report(result, args.kind, phases)
    return result
