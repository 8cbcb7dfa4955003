"""Where inflating a Lumberjack ``C`` frame in a thread pays: the codec alone, per frame size.

``lumberjack-inflate`` runs, in one trio loop, ``--tasks`` tasks that each
feed one :class:`~protocols.lumberjack.ServerCodec` the same Beats window
(``W n`` + one ``C`` frame of ``n`` events of ``--size`` bytes, as ``bench
lumberjack`` encodes it) again and again, acking each window; no sockets, no
hub. For each ``n`` of ``--events`` the tasks run in two modes, ABBA
(inline, thread, thread, inline), each for a quarter of ``--seconds``:

- ``inline``: the codec inflates the frame itself (``offload_at`` 0);
- ``thread``: the codec hands the frame out as an
  :class:`~protocols.lumberjack.Inflate` event and the task runs it with
  ``trio.to_thread.run_sync`` (the listener's ``inflate_in_thread``), with at
  most as many threads as usable cores.

Per mode: windows/s, and the CPU per window of the event loop's thread
(``time.thread_time`` read in the loop) and of the whole process. The loop's
CPU per window is what decides: a worker's loop is its bottleneck, and in
thread mode it pays the thread hop instead of the inflate. ``thread / inline``
below 1 for the loop's CPU means the hop is cheaper than the inflate it
moves off the loop: frames from that compressed size up are worth handing
out. Self-check: every window comes back whole, with its ``n`` events.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import zlib
from dataclasses import dataclass, field

import trio

from protocols.lumberjack import NEED_DATA, Ack, Inflate, ServerCodec, Window, encode_window

from . import Result, add_warmup, int_at_least, register
from .lumberjack import make_events

MODES = ("inline", "thread")
ORDER = ("inline", "thread", "thread", "inline")


@dataclass
class Tally:
    """What the tasks did in one phase."""

    windows: int = 0
    problems: list[str] = field(default_factory=list)


async def _feed(
    window: bytes, events: int, offload: bool, tally: Tally, limiter: trio.CapacityLimiter
) -> None:
    """Feed ``window`` to one codec again and again, acking each, until cancelled."""
    codec = ServerCodec()
    codec.offload_at = 1 if offload else 0
    while True:
        codec.receive_data(window)
        while (event := codec.next_event()) is not NEED_DATA:
            if isinstance(event, Inflate):
                await trio.to_thread.run_sync(event.run, limiter=limiter)
                continue
            if not isinstance(event, Window) or len(event.events) != events:
                tally.problems.append(f"expected a window of {events} events, got {event!r}")
                raise trio.Cancelled._create()  # pragma: no cover - stops the phase
            codec.send(Ack(event.version, event.highest_seq))
            tally.windows += 1
        await trio.lowlevel.checkpoint()


async def _phase(
    window: bytes, events: int, offload: bool, seconds: float, tasks: int, warmup: float
) -> tuple[Tally, float, float, float]:
    """Run the tasks for ``warmup`` + ``seconds``; (tally, wall, loop cpu, process cpu)."""
    tally = Tally()
    limiter = trio.CapacityLimiter(max(1, len(os.sched_getaffinity(0))))
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(_feed, window, events, offload, tally, limiter)
        await trio.sleep(warmup)
        start = tally.windows
        wall, loop, process = time.perf_counter(), time.thread_time(), time.process_time()
        await trio.sleep(seconds)
        counted = tally.windows - start
        wall = time.perf_counter() - wall
        loop = time.thread_time() - loop
        process = time.process_time() - process
        nursery.cancel_scope.cancel()
    tally.windows = counted
    return tally, wall, loop, process


async def _run(args: argparse.Namespace) -> Result:
    result = Result(params={"tasks": args.tasks, "size": args.size, "level": args.level})
    result.params["events"] = args.events
    for n in args.events:
        window = encode_window(2, make_events(n, args.size), args.level, compress=zlib.compress)
        compressed = len(window) - 12
        result.add(f"n={n}: C frame", compressed, "bytes")
        rates: dict[str, list[float]] = {m: [] for m in MODES}
        loops: dict[str, list[float]] = {m: [] for m in MODES}
        procs: dict[str, list[float]] = {m: [] for m in MODES}
        for mode in ORDER:
            tally, wall, loop, process = await _phase(
                window, n, mode == "thread", args.seconds / 4, args.tasks, args.warmup
            )
            result.problems += tally.problems
            if not tally.windows:
                result.problems.append(f"n={n} {mode}: no window in the measured time")
                continue
            rates[mode].append(tally.windows / wall)
            loops[mode].append(1e6 * loop / tally.windows)
            procs[mode].append(1e6 * process / tally.windows)
        _report(result, n, rates, loops, procs)
    return result


def _report(
    result: Result,
    n: int,
    rates: dict[str, list[float]],
    loops: dict[str, list[float]],
    procs: dict[str, list[float]],
) -> None:
    if not all(rates.values()):
        return
    mean = {m: statistics.fmean(rates[m]) for m in MODES}
    loop = {m: statistics.fmean(loops[m]) for m in MODES}
    for mode in MODES:
        result.add(f"n={n} {mode}: windows", mean[mode], "windows/s")
        result.add(f"n={n} {mode}: loop cpu per window", loop[mode], "us")
        result.add(f"n={n} {mode}: process cpu per window", statistics.fmean(procs[mode]), "us")
    result.add(f"n={n} thread / inline: windows/s", mean["thread"] / mean["inline"])
    result.add(f"n={n} thread / inline: loop cpu per window", loop["thread"] / loop["inline"])


def _counts(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"a list of event counts like 50,500, not {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"event counts are at least 1: {text!r}")
    return values


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--events",
        type=_counts,
        default=[16, 64, 256, 1024, 2048],
        help="events per window, one measurement each (default: 16,64,256,1024,2048)",
    )
    parser.add_argument("--size", type=int_at_least(16), default=200, help="bytes per event")
    parser.add_argument("--level", type=int, default=3, help="zlib level (default: 3)")
    parser.add_argument(
        "--tasks", type=int_at_least(1), default=4, help="codecs fed at once (default: 4)"
    )
    add_warmup(parser, "before each phase")


@register(
    "lumberjack-inflate",
    "the Lumberjack codec alone, C frames inflated inline or in threads: loop cpu per window",
    arguments=_arguments,
    default_seconds=8.0,
)
def run(args: argparse.Namespace) -> Result:
    return trio.run(_run, args)
