"""Benchmarks for Interchange, run with ``python -m bench NAME``.

Each benchmark is a module of this package that registers one function with
:func:`register`. The function gets the parsed command-line options and
returns a :class:`Result`: named metrics with units, the parameters it ran
with, and the problems its own checks found (a benchmark whose numbers cannot
be trusted, e.g. because messages went missing, must say so there rather than
print a figure). The runner (``bench/__main__.py``) adds process CPU time,
max RSS and a description of the machine, prints a table and writes JSON.

Modules whose name starts with ``_`` are helpers and are not imported as
benchmarks.
"""

from __future__ import annotations

import argparse
import importlib
import math
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Benchmark",
    "Metric",
    "Result",
    "add_warmup",
    "benchmarks",
    "int_at_least",
    "percentile",
    "register",
]


@dataclass(slots=True)
class Metric:
    """One measured figure: ``value`` in ``unit`` (``""`` for a plain count)."""

    name: str
    value: float | int
    unit: str = ""


@dataclass(slots=True)
class Result:
    """What a benchmark run produced."""

    metrics: list[Metric] = field(default_factory=list)
    #: The settings it ran with (message size, in-flight bound, ...).
    params: dict[str, Any] = field(default_factory=dict)
    #: Anything else worth keeping in the JSON (log excerpts, counters by kind).
    details: dict[str, Any] = field(default_factory=dict)
    #: Failed self-checks; any entry makes the run fail (exit status 1).
    problems: list[str] = field(default_factory=list)

    def add(self, name: str, value: float | int, unit: str = "") -> None:
        self.metrics.append(Metric(name, value, unit))

    def add_latencies(self, prefix: str, seconds: list[float]) -> None:
        """``"<prefix> p50"``, ``p90``, ``p99`` and ``max`` in ms of latencies in seconds
        (NaN when there are none)."""
        ordered = sorted(seconds)
        for p in (50, 90, 99):
            self.add(f"{prefix} p{p}", percentile(ordered, p) * 1e3, "ms")
        self.add(f"{prefix} max", (ordered[-1] if ordered else math.nan) * 1e3, "ms")


def percentile(ordered: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (NaN when empty)."""
    if not ordered:
        return math.nan
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An option type: a whole number no smaller than ``minimum``."""

    def convert(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    return convert


def add_warmup(parser: argparse.ArgumentParser, when: str = "before measuring") -> None:
    """``--warmup SECONDS`` (default 1): load that runs first and is not counted."""
    parser.add_argument(
        "--warmup",
        type=float,
        default=1.0,
        help=f"seconds of load {when}, not counted (default: %(default)g)",
    )


#: The function a benchmark registers: options in, result out.
RunFunction = Callable[[argparse.Namespace], Result]
#: Adds the benchmark's own options to its sub-command parser.
ArgumentsFunction = Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True, slots=True)
class Benchmark:
    name: str
    summary: str
    run: RunFunction
    add_arguments: ArgumentsFunction | None = None
    #: Default of the common ``--seconds`` option (measured time, warm-up excluded).
    default_seconds: float = 10.0


_registry: dict[str, Benchmark] = {}


def register(
    name: str,
    summary: str,
    *,
    arguments: ArgumentsFunction | None = None,
    default_seconds: float = 10.0,
) -> Callable[[RunFunction], RunFunction]:
    """Register the decorated function as the benchmark ``name``."""

    def decorate(run: RunFunction) -> RunFunction:
        if name in _registry:
            raise ValueError(f"benchmark {name!r} registered twice")
        _registry[name] = Benchmark(name, summary, run, arguments, default_seconds)
        return run

    return decorate


def benchmarks() -> dict[str, Benchmark]:
    """Every benchmark of this package, by name (imports the modules once)."""
    for module in pkgutil.iter_modules(__path__):
        if not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")
    return dict(sorted(_registry.items()))
