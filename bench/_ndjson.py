"""Helpers shared by the ndjson benchmarks (``ndjson-pubsub``, ``ndjson-filtered``,
``ndjson-calls``): the warm-up → measure → drain sequence, the
CPU figures of the measured window, and the gateway's own checks once it
stopped."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import trio
from interchange_ndjson import ClientCodec, Deliver

from . import Result
from ._gateway import RunningGateway
from ._system import busy_seconds

__all__ = [
    "CpuSnapshot",
    "Driven",
    "add_cpu_metrics",
    "check_gateway",
    "delivered",
    "measure",
]


def delivered(codec: ClientCodec, tag: int, destination: str, *, call: bool = False) -> None:
    """``codec`` (a client subscribed to ``destination``) receives the delivery ``tag``,
    so that it may ack or reply to it: for checking templates against the codec."""
    line = b'{"op":"msg","tag":%d,"dest":"%s","body":"","call":%s}\n'
    codec.receive_data(line % (tag, destination.encode(), b"true" if call else b"false"))
    assert type(codec.next_event()) is Deliver


@dataclass(frozen=True, slots=True)
class CpuSnapshot:
    """The clocks at one instant: wall time, the gateway process's CPU (None
    in-process), this process's CPU and the whole machine's busy time (None
    off Linux)."""

    wall: float
    gateway: tuple[float, float] | None
    own: float
    busy: float | None

    @classmethod
    def take(cls, gw: RunningGateway) -> CpuSnapshot:
        return cls(time.perf_counter(), gw.cpu_times(), time.process_time(), busy_seconds())


def add_cpu_metrics(
    result: Result,
    gw: RunningGateway,
    start: CpuSnapshot,
    end: CpuSnapshot,
    count: int,
    per: str = "message",
) -> None:
    """The CPU figures of the window from ``start`` to ``end``, named as
    ``ndjson-pubsub`` names them; ``count`` of ``per`` were done in it."""
    elapsed = end.wall - start.wall
    own_cpu = end.own - start.own
    ours = own_cpu
    if start.gateway is not None and end.gateway is not None:
        gw_user, gw_system = (b - a for a, b in zip(start.gateway, end.gateway, strict=True))
        gw_cpu = gw_user + gw_system
        ours += gw_cpu
        result.details["gateway_cpu_in_window_s"] = {"user": gw_user, "system": gw_system}
        result.add("gateway cpu in window", gw_cpu, "s")
        result.add("gateway cpu load in window", 100 * gw_cpu / elapsed, "% of a core")
        if count:
            result.add(f"gateway cpu per {per}", 1e6 * gw_cpu / count, "us")
        total = gw.cpu_seconds()
        if total is not None:
            result.add("gateway cpu total (start to end of load)", total, "s")
        rss = gw.max_rss_mib()
        if rss is not None:
            result.add("gateway max rss", rss, "MiB")
        result.add("load generator cpu load in window", 100 * own_cpu / elapsed, "% of a core")
    else:
        result.add(
            "process cpu load in window (gateway + load)", 100 * own_cpu / elapsed, "% of a core"
        )
        if count:
            result.add(f"process cpu per {per}", 1e6 * own_cpu / count, "us")
    if start.busy is not None and end.busy is not None:
        others = max(0.0, (end.busy - start.busy) - ours)
        result.add("other processes' cpu load in window", 100 * others / elapsed, "% of a core")
        if others / elapsed > 0.15:
            result.details["warning"] = (
                "other processes used the CPU during the window: figures are not comparable"
            )


def check_gateway(gw: RunningGateway, result: Result, problems: list[str]) -> None:
    """After the gateway stopped: it exited cleanly and logged no warning or error."""
    if gw.returncode != 0:
        problems.append(f"the gateway exited with status {gw.returncode}")
    logged = gw.problems_logged()
    if logged:
        result.details["gateway_warnings"] = logged[-20:]
        problems.append(f"the gateway logged {len(logged)} warnings or errors (see JSON)")


class Driven(Protocol):
    """What :func:`measure` needs of a benchmark's load (``ndjson-pubsub``'s ``Load``...)."""

    #: Start and end of the measured window (perf_counter), ``inf`` until set.
    t0: float
    t1: float
    #: Set once the connections may close: an end of stream is then no failure.
    closing: bool
    #: Cancelled by the load when a failure makes the rest of the run meaningless.
    scope: trio.CancelScope

    def stop(self) -> None:
        """Send nothing new from now on."""

    async def wait_answered(self) -> None:
        """Return once everything sent has been answered."""

    def verify(self) -> None:
        """After draining: record in the load's problems what does not add up."""


async def measure(
    load: Driven,
    gw: RunningGateway,
    args: argparse.Namespace,
    start: Callable[[trio.Nursery], Awaitable[None]],
) -> tuple[CpuSnapshot, CpuSnapshot] | None:
    """Run the load for ``--warmup`` + ``--seconds``, drain, check.

    ``start`` starts the load's tasks in the nursery. After the warm-up the
    measured window is timed (``load.t0``, ``load.t1``); then the load stops
    sending, has up to ``--drain-timeout`` for its answers, and its tasks are
    cancelled. Returns the clocks at the window's start and end, or None when
    a failure stopped the run before the window ended (its problem says why).
    """
    with load.scope:
        async with trio.open_nursery() as nursery:
            await start(nursery)
            await trio.sleep(args.warmup)
            begin = CpuSnapshot.take(gw)
            load.t0 = begin.wall
            await trio.sleep(args.seconds)
            end = CpuSnapshot.take(gw)
            load.t1 = end.wall
            load.stop()
            with trio.move_on_after(args.drain_timeout):
                await load.wait_answered()
            load.closing = True
            nursery.cancel_scope.cancel()
    if load.t1 == math.inf:
        return None
    load.verify()
    return begin, end
