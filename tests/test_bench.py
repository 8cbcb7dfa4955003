"""The benchmarks run and check themselves (figures come from `python -m bench`, not tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_lists_its_benchmarks() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "ndjson-pubsub" in out


def test_ndjson_pubsub_smoke() -> None:
    """A one-second run completes its own checks: nothing lost, nothing duplicated."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "ndjson-pubsub",
            "--seconds",
            "1",
            "--warmup",
            "0.2",
            "--no-json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "msg" in result.stdout


def test_lumberjack_smoke() -> None:
    """The Lumberjack replay benchmark runs and its self-checks pass (acked == consumed)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "lumberjack",
            "--seconds",
            "1",
            "--warmup",
            "0.2",
            "--no-json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "acked events" in result.stdout
