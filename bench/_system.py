"""What the whole machine's CPUs did, from /proc/stat (Linux; None elsewhere).

The benchmark machine has 2 cores shared with other work (test runs of other
engineers, CI). A figure measured while something else kept a core busy is
not comparable with one measured on a quiet machine, so benchmarks report
how much CPU the rest of the machine used during their window, and the
runner can wait for a quiet moment before starting (``--wait-idle``).
"""

from __future__ import annotations

import os
import time

__all__ = ["busy_seconds", "wait_for_idle"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def busy_seconds() -> float | None:
    """CPU seconds spent not idle, summed over every CPU, since boot."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user).
    values = [int(v) for v in fields[1:9]]
    idle = values[3] + values[4]
    return (sum(values) - idle) / _CLOCK_TICKS


def busy_cores(interval: float = 1.0) -> float | None:
    """Cores' worth of CPU the machine used during the next ``interval`` seconds."""
    before = busy_seconds()
    time.sleep(interval)
    after = busy_seconds()
    if before is None or after is None:
        return None
    return (after - before) / interval


def wait_for_idle(
    max_wait: float, threshold: float = 0.15, interval: float = 1.0
) -> tuple[float | None, float]:
    """Wait until the machine uses under ``threshold`` cores over ``interval``.

    Gives up after ``max_wait`` seconds. Returns the last busy figure (cores)
    and the seconds waited, for the record.
    """
    started = time.monotonic()
    while True:
        busy = busy_cores(interval)
        waited = time.monotonic() - started
        if busy is None or busy < threshold or waited >= max_wait:
            return busy, waited
