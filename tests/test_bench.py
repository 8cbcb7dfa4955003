"""The benchmarks run and check themselves (figures come from `python -m bench`, not tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_bench_lists_its_benchmarks() -> None:
    out = bench("--list").stdout
    for name in (
        "ndjson-pubsub",
        "ndjson-filtered",
        "ndjson-calls",
        "lumberjack",
        "lumberjack-relay",
        "lumberjack-ingest",
        "lumberjack-inflate",
        "hub-roundtrip",
        "ttrpc-echo",
        "micromessage",
        "reactive",
        "worker-hop",
    ):
        assert name in out


@pytest.mark.parametrize(
    ("name", "metric", "options"),
    [
        ("ndjson-pubsub", "msg", ()),
        ("micromessage", "delivered end to end", ()),
        ("micromessage", "delivered end to end", ("--topic",)),
        (
            "reactive",
            "tcp-packed elements/s",
            ("--no-rsocket", "--elements", "100000", "--warmup", "0"),
        ),
        ("ndjson-filtered", "deliveries, all subscribers", ()),
        ("ndjson-calls", "calls replied", ()),
        ("ndjson-calls", "calls replied", ("--concurrency", "1")),
        ("lumberjack", "acked events", ()),
        (
            "lumberjack-relay",
            "relay / direct",
            ("--workers", "2", "--connections", "4", "--direct"),
        ),
        ("lumberjack-ingest", "2 workers / 1", ("--workers", "1,2", "--connections", "4")),
        (
            "lumberjack-ingest",
            "2 workers / 1",
            ("--workers", "1,2", "--connections", "4", "--inflate-in-thread", "1"),
        ),
        (
            "lumberjack-ingest",
            "2 workers / 1",
            ("--workers", "1,2", "--connections", "4", "--destination", "durable"),
        ),
        ("lumberjack-inflate", "thread / inline: loop cpu per window", ("--events", "64")),
        ("segment-append", "acked / raw", ("--read", "warm")),
        ("segment-append", "acked / raw", ("--client", "replay", "--writers", "2", "--shared")),
        ("ttrpc-echo", "py calls", ("--pairs", "py")),
        ("ttrpc-echo", "go-proxy / go", ()),
        (
            "ttrpc-echo",
            "go-proxy w=2 / w=1",
            ("--pairs", "go-proxy", "--proxy-workers", "1,2", "--conns", "2"),
        ),
        ("worker-hop", "hop cost per message", ()),
        ("worker-hop", "proxy cost per message", ("--kind", "queue")),
        ("worker-hop", "proxy cost per message", ("--kind", "durable")),
    ],
)
def test_a_short_run_passes_its_self_checks(
    name: str, metric: str, options: tuple[str, ...]
) -> None:
    """One second of load: nothing lost or duplicated, and the gateway exits cleanly."""
    result = bench(name, "--seconds", "1", "--warmup", "0.2", "--no-json", *options)
    assert result.returncode == 0, result.stdout + result.stderr
    assert metric in result.stdout


def test_the_hub_roundtrip_passes_its_self_checks() -> None:
    """The socket-free hub loop: every message received once, every receipt delivered."""
    result = bench("hub-roundtrip", "--messages", "2000", "--rounds", "2", "--no-json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "publish + receive + ack" in result.stdout
