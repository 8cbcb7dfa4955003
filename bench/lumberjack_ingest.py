"""Lumberjack ingest with 1 and N workers: replayed windows → ``gateway run --workers N``.

``lumberjack-ingest`` starts ``python -m gateway run --workers N`` (one
Lumberjack listener whose destination ``logs`` is an in-memory topic) once
per entry of ``--workers`` (default ``1,2,2,1``: ABBA, so that a drift of the
machine during the run weighs on both sides alike), and drives each with the
replay client of ``bench lumberjack`` (one pre-encoded Beats window sent
again and again over ``--connections`` connections, at most ``--inflight``
unacked per connection): the client costs little per event, so the gateway
is what is measured.

Nobody subscribes to ``logs``: a publish to a topic without subscribers
settles delivered at once, so a window is acked as soon as the listener has
parsed, checked (``validate_json``) and published it. That is the ingest
side alone: what each worker does per event whatever the destination, and
what the number of workers multiplies. A subscriber would add its own cost
and, in one worker of N, a topic hop for the events that the other workers
received (``bench worker-hop`` measures that hop by itself).

``--destination durable`` makes ``logs`` a durable log instead
(``[[destinations]]`` with ``store = "embedded"``, the store's defaults, in
a new ``data_dir`` per gateway run, removed after it): a window is acked
once its events are stored (fsync ``interval``: at the next group commit).
The store is worker 0's alone, so with N workers the others publish to it
through their proxies (one hop each), and worker 0 stores every worker's
events: this shows where worker 0 caps durable ingest. Each phase says which
worker holds the store (the one with files under it open, from
``/proc/PID/fd``), since the workers are listed by pid, not by index.

``--inflate-in-thread SIZE`` sets the listener option ``inflate_in_thread``
(``C`` frames from SIZE compressed bytes up are inflated in a thread, off the
event loop); ``0`` inflates inline.

Per phase: acked events/s, each worker's CPU load and the workers' CPU per
event (user + system of each worker pid from ``/proc``, supervisor excluded,
between the edges of the measured window); the supervisor's load; how many
of the connections each worker holds (from ``/proc/net/tcp``, once the load
runs: the workers accept from one queue, so the spread is the kernel's and
the workers', not the benchmark's). Then, per
number of workers, the mean rate over its phases, and each N's rate as a
multiple of the first N's. Self-checks: every window sent is acked whole,
every gateway exits 0 and logs no warning, every worker served before the
load started.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from protocols.lumberjack import encode_window

from . import Result, register
from ._gateway import START_TIMEOUT
from ._process import connections_by_pid
from .lumberjack import (
    DESTINATION,
    Measured,
    Replay,
    SupervisedGateway,
    _client_context,
    _common_arguments,
    _make_certs,
    _params,
    check_gateway,
    check_replay,
    drive,
    gateway_process,
    make_events,
    sink_config,
)

#: Cores' worth of CPU used by others above which a phase is flagged (as ``bench lumberjack``).
BUSY = 0.15


@dataclass
class Phase:
    """One gateway run with ``workers`` workers, and what was measured of it."""

    workers: int
    replay: Replay
    gateway: SupervisedGateway
    measured: Measured | None = None
    #: Connections each worker held once the load ran (a worker's order as started).
    connections: list[int] = field(default_factory=list)
    #: Which of them (0-based, as started) has the store open; None: none seen.
    store_holder: int | None = None

    @property
    def rate(self) -> float:
        assert self.measured is not None
        return self.replay.window_events / self.measured.elapsed

    def worker_seconds(self) -> list[float]:
        """CPU seconds of each worker in the window (the one process when N is 1)."""
        per_process = [s for _, s in self.gateway.window_per_process()]
        return per_process if self.workers == 1 else per_process[1:]

    def supervisor_seconds(self) -> float:
        per_process = self.gateway.window_per_process()
        return per_process[0][1] if self.workers > 1 and per_process else 0.0


def ingest_config(args: argparse.Namespace, tls: bool) -> dict[str, Any]:
    """The sink's listener (destination ``logs``, nobody subscribed), inflating as asked;
    ``logs`` a durable log in the store if ``--destination durable``."""
    config = sink_config(args, tls)
    config["listeners"][0]["inflate_in_thread"] = args.inflate_in_thread
    if args.destination == "durable":
        config["destinations"] = [{"name": DESTINATION, "store": "embedded"}]
    return config


async def _run_phase(
    phase: Phase, config: dict[str, Any], tmp: Path, context: Any, args: argparse.Namespace
) -> None:
    command = ["-m", "gateway", "run", "{config}", "--workers", str(phase.workers)]
    path = tmp / f"ingest-{id(phase)}.toml"
    # A data_dir of its own: a durable log starts empty in every run, and is removed after.
    data_dir = tmp / f"data-{id(phase)}"
    config = {**config, "gateway": {**config["gateway"], "data_dir": str(data_dir)}}
    try:
        await _serve_and_drive(phase, config, path, command, context, args)
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


async def _serve_and_drive(
    phase: Phase,
    config: dict[str, Any],
    path: Path,
    command: list[str],
    context: Any,
    args: argparse.Namespace,
) -> None:
    data_dir = Path(config["gateway"]["data_dir"])
    async with gateway_process(config, path, command, phase.gateway):
        if not await phase.gateway.wait_for_workers(START_TIMEOUT):
            phase.replay.problems.append(f"not every worker served within {START_TIMEOUT:g}s")
            return
        host, port = phase.gateway.listener_address()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_count_connections, phase, port, args.warmup, data_dir / "store")
            phase.measured = await drive(phase.replay, [phase.gateway], host, port, context, args)


async def _count_connections(phase: Phase, port: int, after: float, store: Path) -> None:
    """Once the load runs (half the warm-up in): each worker's share of the connections."""
    await trio.sleep(after / 2)
    tree = phase.gateway.tree()
    workers = tree if phase.workers == 1 else tree[1:]
    counts = connections_by_pid(workers, port)
    phase.connections = [counts.get(pid, 0) for pid in workers]
    holders = [k for k, pid in enumerate(workers) if _has_open_under(pid, store)]
    phase.store_holder = holders[0] if len(holders) == 1 else None


def _has_open_under(pid: int, directory: Path) -> bool:
    """``pid`` has a file under ``directory`` open (from ``/proc/PID/fd``; False if unreadable)."""
    prefix = str(directory) + os.sep
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(prefix):
                return True
    return False


async def _run_ingest(args: argparse.Namespace) -> Result:
    window = encode_window(
        2, make_events(args.events, args.size), args.level, compress=zlib.compress
    )
    result = Result(params=_params(args, "subprocess", window))
    result.params["workers"] = args.workers
    result.params["inflate_in_thread"] = args.inflate_in_thread
    result.params["destination"] = args.destination
    phases = [
        Phase(n, Replay(window, args.events, args.inflight), SupervisedGateway(n))
        for n in args.workers
    ]
    with tempfile.TemporaryDirectory(prefix="interchange-bench-") as tmp_name:
        tmp = Path(tmp_name)
        context = _client_context(_make_certs(tmp)) if args.tls else None
        config = ingest_config(args, args.tls)
        result.details["gateway_config"] = config
        for phase in phases:
            await _run_phase(phase, config, tmp, context, args)
            if phase.measured is None:
                break
    _report(result, phases, args)
    return result


def _report(result: Result, phases: Sequence[Phase], args: argparse.Namespace) -> None:
    """Each phase's figures, then the mean rate per N and the ratios; the self-checks."""
    rates: dict[int, list[float]] = {}
    per_event: dict[int, list[float]] = {}
    busy_phases: list[int] = []
    for i, phase in enumerate(phases):
        name = f"gateway {i + 1} ({phase.workers} worker{'s' if phase.workers > 1 else ''})"
        result.problems += phase.replay.problems
        check_gateway(result.problems, result, name, phase.gateway)
        if phase.measured is None:
            continue
        check_replay(phase.replay)
        result.problems += phase.replay.problems
        rates.setdefault(phase.workers, []).append(phase.rate)
        us, others = _report_phase(result, name, phase)
        if us is not None:
            per_event.setdefault(phase.workers, []).append(us)
        if others > BUSY:
            busy_phases.append(i + 1)
        result.details[f"phase_{i + 1}_cpu_per_process_s"] = {
            str(pid): s for pid, s in phase.gateway.window_per_process()
        }
    result.add(f"phases with other processes above {BUSY:.0%} of a core", len(busy_phases))
    if busy_phases:
        result.details["warning"] = (
            f"other processes used the CPU during phases {busy_phases}: their figures, and the "
            "ratios, are not comparable"
        )
    _summarize(result, rates, per_event)


def _report_phase(result: Result, name: str, phase: Phase) -> tuple[float | None, float]:
    """One phase's figures; its workers' CPU per event (µs) and the others' load (cores)."""
    measured = phase.measured
    assert measured is not None
    elapsed = measured.elapsed
    result.add(f"{name}: acked events", phase.rate, "events/s")
    workers = phase.worker_seconds()
    events = phase.replay.window_events
    for k, seconds in enumerate(workers):
        result.add(f"{name}: worker {k + 1} cpu load", 100 * seconds / elapsed, "% of a core")
        if events:
            result.add(f"{name}: worker {k + 1} cpu per event", 1e6 * seconds / events, "us")
    for k, count in enumerate(phase.connections):
        result.add(f"{name}: worker {k + 1} connections", count)
    if phase.store_holder is not None:
        result.add(f"{name}: the store's worker", phase.store_holder + 1)
    if phase.workers > 1:
        load = 100 * phase.supervisor_seconds() / elapsed
        result.add(f"{name}: supervisor cpu load", load, "% of a core")
    us = None
    if events and workers:
        us = 1e6 * sum(workers) / events
        result.add(f"{name}: workers' cpu per event", us, "us")
    result.add(f"{name}: replay client cpu load", 100 * measured.own_cpu / elapsed, "% of a core")
    others = 0.0
    if measured.busy is not None:
        gateway = sum(workers) + phase.supervisor_seconds()
        others = max(0.0, measured.busy - gateway - measured.own_cpu) / elapsed
        result.add(f"{name}: other processes' cpu load", 100 * others, "% of a core")
    return us, others


def _summarize(
    result: Result, rates: dict[int, list[float]], per_event: dict[int, list[float]]
) -> None:
    if not rates:
        return
    first = next(iter(rates))
    base = statistics.fmean(rates[first])
    for n, values in rates.items():
        mean = statistics.fmean(values)
        result.add(f"{n} workers: acked events (mean of {len(values)})", mean, "events/s")
        if per_event.get(n):
            us = statistics.fmean(per_event[n])
            result.add(f"{n} workers: workers' cpu per event (mean)", us, "us")
        if n != first and base > 0:
            result.add(f"{n} workers / {first}", mean / base)


def _workers(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a list of worker counts like 1,2,2,1, not {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"worker counts are at least 1: {text!r}")
    return values


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workers",
        type=_workers,
        default=[1, 2, 2, 1],
        help="one gateway run per entry, `gateway run --workers N`, in this order "
        "(default: 1,2,2,1)",
    )
    parser.add_argument(
        "--destination",
        choices=("topic", "durable"),
        default="topic",
        help="logs is an in-memory topic nobody reads, or a durable log in the store, "
        "worker 0's (default: %(default)s)",
    )
    parser.add_argument(
        "--inflate-in-thread",
        type=int,
        default=0,
        metavar="BYTES",
        help="the listener option inflate_in_thread: C frames from BYTES compressed bytes up "
        "are inflated in a thread (default: 0, inline)",
    )
    _common_arguments(parser)


@register(
    "lumberjack-ingest",
    "Beats windows replayed → `gateway run --workers N` → topic nobody reads (or a durable "
    "log), per N: events/s",
    arguments=_arguments,
)
def run(args: argparse.Namespace) -> Result:
    return trio.run(_run_ingest, args)
