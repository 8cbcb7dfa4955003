"""The benchmark runner: ``python -m bench NAME [options]`` or ``python -m bench --list``.

Runs one benchmark, prints its metrics as a fixed-width table and writes a
JSON record (default ``bench/results/NAME-<UTC timestamp>.json``, git-ignored)
with the results, the command line, the software versions and the machine,
so a figure quoted in docs/performance.md can be traced to the run that made
it. Process CPU time and max RSS come from ``resource.getrusage``: ``self`` is
this process (the load generator, plus the gateway in in-process mode),
``children`` is every child process waited for (the gateway in subprocess
mode).

Exit status: 0 when the benchmark's own checks passed, 1 when one failed
(the figures are then printed but must not be quoted), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from . import Benchmark, Metric, benchmarks
from ._system import busy_cores, wait_for_idle

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: Cores' worth of CPU used by others above which the machine is not "quiet".
IDLE_THRESHOLD = 0.15


def build_parser(registry: dict[str, Benchmark]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description="Run one of Interchange's benchmarks."
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    sub = parser.add_subparsers(dest="benchmark", metavar="NAME")
    for bench in registry.values():
        p = sub.add_parser(bench.name, help=bench.summary, description=bench.summary)
        p.add_argument(
            "--seconds",
            type=_positive_float,
            default=bench.default_seconds,
            help="measured time, warm-up excluded (default: %(default)g)",
        )
        p.add_argument(
            "--json",
            metavar="PATH",
            help="where to write the JSON record (default: bench/results/NAME-<UTC time>.json)",
        )
        p.add_argument("--no-json", action="store_true", help="do not write a JSON record")
        p.add_argument(
            "--repeat",
            type=_positive_int,
            default=1,
            metavar="N",
            help="run N times and report the median, min and max of each metric (default: 1)",
        )
        p.add_argument(
            "--wait-idle",
            type=float,
            default=0.0,
            metavar="SECONDS",
            help="first wait up to SECONDS for the machine to be quiet (under "
            f"{IDLE_THRESHOLD:g} cores busy over a second); default: just measure it",
        )
        if bench.add_arguments is not None:
            bench.add_arguments(p)
    return parser


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    registry = benchmarks()
    parser = build_parser(registry)
    args = parser.parse_args(argv)
    if args.list:
        width = max((len(n) for n in registry), default=0)
        for bench in registry.values():
            print(f"{bench.name:<{width}}  {bench.summary}")
        return 0
    if args.benchmark is None:
        parser.print_usage(sys.stderr)
        print("python -m bench: give a benchmark NAME or --list", file=sys.stderr)
        return 2
    bench = registry[args.benchmark]

    started = dt.datetime.now(dt.UTC)
    runs = []
    for i in range(args.repeat):
        if args.repeat > 1:
            print(f"== run {i + 1} of {args.repeat}", flush=True)
        run = run_once(bench, args)
        runs.append(run)
        metrics: list[Metric] = run["metrics"]
        header = ", ".join(f"{k}={v}" for k, v in run["params"].items())
        print(f"{bench.name} ({header})" if header else bench.name)
        print(format_table([(m.name, format_value(m.value), m.unit) for m in metrics]))
        sys.stdout.flush()
        if "warning" in run["details"]:
            print(f"warning: {run['details']['warning']}", file=sys.stderr)
        for problem in run["problems"]:
            print(f"PROBLEM: {problem}", file=sys.stderr)
        sys.stderr.flush()
    summary = summarize([run["metrics"] for run in runs])
    if args.repeat > 1:
        print(f"== {bench.name}: median and range of {args.repeat} runs")
        print(
            format_table(
                [
                    (
                        row["metric"],
                        *(format_value(row[k]) for k in ("value", "min", "max")),
                        row["unit"],
                    )
                    for row in summary
                ],
                ("metric", "median", "min", "max", "unit"),
            )
        )
    problems = [f"run {i + 1}: {p}" for i, run in enumerate(runs) for p in run["problems"]]

    if not args.no_json:
        path = Path(args.json) if args.json else _default_path(bench.name, started)
        record = {
            "benchmark": bench.name,
            "summary": bench.summary,
            "timestamp": started.isoformat(timespec="seconds").replace("+00:00", "Z"),
            "command": shlex.join(["python", "-m", "bench", *argv]),
            "ok": not problems,
            "problems": problems,
            "params": runs[0]["params"],
            "repeat": args.repeat,
            # value: the median over the runs (the value itself for one run).
            "results": summary,
            "runs": [
                {
                    "results": [
                        {"metric": m.name, "value": m.value, "unit": m.unit} for m in run["metrics"]
                    ],
                    **{k: v for k, v in run.items() if k not in ("metrics", "params")},
                }
                for run in runs
            ],
            "environment": environment(),
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(_finite(record), indent=2, allow_nan=False)
        path.write_text(text + "\n", encoding="utf-8")
        print(f"written: {_display(path)}")
    if problems:
        print(f"{bench.name}: FAILED its checks; do not quote these figures", file=sys.stderr)
        return 1
    return 0


def run_once(bench: Benchmark, args: argparse.Namespace) -> dict[str, Any]:
    """One run: wait for (or measure) a quiet machine, run, add process figures."""
    if args.wait_idle > 0:
        busy, waited = wait_for_idle(args.wait_idle, IDLE_THRESHOLD)
    else:
        busy, waited = busy_cores(0.5), 0.0
    if busy is not None and busy >= IDLE_THRESHOLD:
        print(
            f"warning: other processes kept {busy:.2f} cores busy before the run; "
            "figures from a busy machine are not comparable",
            file=sys.stderr,
        )
    self_before = resource.getrusage(resource.RUSAGE_SELF)
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall_before = time.perf_counter()
    result = bench.run(args)
    wall = time.perf_counter() - wall_before
    self_after = resource.getrusage(resource.RUSAGE_SELF)
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    process = {
        "wall_s": wall,
        "self_cpu_user_s": self_after.ru_utime - self_before.ru_utime,
        "self_cpu_system_s": self_after.ru_stime - self_before.ru_stime,
        # ru_maxrss is in KiB on Linux, and a high-water mark over the process's life.
        "self_max_rss_mib": self_after.ru_maxrss / 1024,
        "children_cpu_user_s": children_after.ru_utime - children_before.ru_utime,
        "children_cpu_system_s": children_after.ru_stime - children_before.ru_stime,
        "children_max_rss_mib": children_after.ru_maxrss / 1024,
    }
    return {
        "metrics": result.metrics + _process_metrics(process),
        "params": result.params,
        "problems": result.problems,
        "process": process,
        "machine_load": {"busy_cores_before": busy, "waited_for_idle_s": waited},
        "details": result.details,
    }


def summarize(runs: Sequence[Sequence[Metric]]) -> list[dict[str, Any]]:
    """Median, min and max of each metric over the runs, in the first run's order."""
    values: dict[str, list[float]] = {}
    units: dict[str, str] = {}
    for metrics in runs:
        for m in metrics:
            values.setdefault(m.name, []).append(m.value)
            units[m.name] = m.unit
    return [
        {
            "metric": name,
            "value": statistics.median(vs),
            "min": min(vs),
            "max": max(vs),
            "unit": units[name],
            "runs": len(vs),
        }
        for name, vs in values.items()
    ]


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities replaced by None (JSON has no NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _process_metrics(process: dict[str, float]) -> list[Metric]:
    return [
        Metric("runner wall time", process["wall_s"], "s"),
        Metric(
            "runner process cpu (self)",
            process["self_cpu_user_s"] + process["self_cpu_system_s"],
            "s",
        ),
        Metric("runner max rss (self)", process["self_max_rss_mib"], "MiB"),
        Metric(
            "child processes cpu",
            process["children_cpu_user_s"] + process["children_cpu_system_s"],
            "s",
        ),
        Metric("child processes max rss", process["children_max_rss_mib"], "MiB"),
    ]


def format_value(value: float | int) -> str:
    """Enough digits to compare runs, no more."""
    if isinstance(value, int):  # bool too
        return str(int(value))
    magnitude = abs(value)
    if magnitude >= 1000:
        return f"{value:.0f}"
    if magnitude >= 100:
        return f"{value:.1f}"
    if magnitude >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def format_table(
    rows: Sequence[Sequence[str]], header: Sequence[str] = ("metric", "value", "unit")
) -> str:
    """A plain fixed-width table: the name left-aligned, figures right-aligned, unit last."""
    table = [tuple(header), *(tuple(r) for r in rows)]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    last = len(header) - 1

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, (cell, width) in enumerate(zip(cells, widths, strict=True)):
            out.append(f"{cell:<{width}}" if i in (0, last) else f"{cell:>{width}}")
        return "  ".join(out).rstrip()

    lines = [line(r) for r in table]
    lines.insert(1, line(["-" * w for w in widths]))
    return "\n".join(lines)


def _default_path(name: str, started: dt.datetime) -> Path:
    return RESULTS_DIR / f"{name}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"


def _display(path: Path) -> str:
    """``path`` relative to the working directory when it is below it."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def environment() -> dict[str, Any]:
    """The software and machine a run happened on (no paths, no host name)."""
    return {
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "trio": _version("trio"),
        "interchange": _version("interchange-gateway"),
        "interchange_ndjson": _version("interchange-gateway-ndjson"),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "git": _git(),
    }


def cpu_model() -> str | None:
    """The ``model name`` of the first CPU in /proc/cpuinfo (Linux), else platform's guess."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _git() -> dict[str, Any] | None:
    """The commit the package's tree is at, and whether it has local changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}


if __name__ == "__main__":
    sys.exit(main())
