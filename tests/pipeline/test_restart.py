"""Exactly once across a crash: a streaming driver in its own process, killed with
SIGKILL (its whole process group: the Python driver, Spark's JVM and its Python
workers) while a micro-batch is in flight, then restarted from its checkpoint.
Its Parquet output, read with Spark (which trusts ``_spark_metadata``), and the
alerts it wrote back to the gateway hold every input record exactly once.

Also ``gateway pipeline`` stopped by SIGINT to its process group, as Ctrl-C in a
terminal sends it: it exits 0, its checkpoint intact,
and the next run goes on from there without writing an alert twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.traffic import pipeline_command, publish, read_all

pytestmark = pytest.mark.spark

#: The driver: every event of ``logs`` to Parquet (partition, offset, body), and
#: every error-level one to ``alerts`` by the example job's own query, in small
#: micro-batches; ``drain`` processes what is there and exits.
DRIVER = """
import sys
from pathlib import Path

from gateway.pipeline.job import JobSettings, alerts, write_alerts
from gateway.pipeline.session import local_session

address, out, checkpoint, mode = sys.argv[1:]
drain = mode == "drain"
spark = local_session("local[2]", app_name="restart-test")
events = (
    spark.readStream.format("interchange")
    .option("address", address)
    .option("destination", "logs")
    .option("maxRecordsPerTrigger", "150")
    .load()
)
writer = events.select("partition", "offset", "body").writeStream.format("parquet")
if drain:
    writer = writer.trigger(availableNow=True)
copy = (
    writer.option("path", out)
    .option("checkpointLocation", str(Path(checkpoint) / "copy"))
    .start()
)
settings = JobSettings(address=address, checkpoint=Path(checkpoint), available_now=drain)
sent = write_alerts(alerts(events), settings)
print("started", flush=True)
copy.awaitTermination()
sent.awaitTermination()
print("drained", flush=True)
"""


def records(first: int, count: int) -> list[bytes]:
    """Log events numbered ``first`` …; every third is error-level."""
    return [
        json.dumps({"seq": n, "level": "error" if n % 3 == 0 else "info"}).encode()
        for n in range(first, first + count)
    ]


def in_flight(checkpoint: Path) -> set[int]:
    """Batches whose offsets are logged but not committed, in a query's checkpoint."""

    def numbers(folder: str) -> set[int]:
        return {int(p.name) for p in (checkpoint / folder).glob("[0-9]*")}

    try:
        return numbers("offsets") - numbers("commits")
    except FileNotFoundError:
        return set()


def driver(tmp_path: Path, address: str, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER, encoding="utf-8")
    args = [address, str(tmp_path / "out"), str(tmp_path / "checkpoint"), mode]
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,  # its own process group: the JVM and workers too
    )


def kill_mid_batch(process: subprocess.Popen[str], checkpoint: Path) -> set[int]:
    """SIGKILL the driver's process group once the query has committed two batches
    and has the next one in flight; the batches in flight then."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stdout.read() if process.stdout else ""
        commits = list((checkpoint / "commits").glob("[0-9]*"))
        flying = in_flight(checkpoint)
        if len(commits) >= 2 and flying:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)
            return flying
        time.sleep(0.01)
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail("the driver committed no two batches in 240 s")


def test_a_killed_driver_restarts_and_writes_every_record_once(
    spark: Any, gateway: Any, tmp_path: Path
) -> None:
    ndjson = gateway.address("ndjson")
    publish(ndjson, records(0, 3000))
    process = driver(tmp_path, gateway.address("segment"), "run")
    flying = kill_mid_batch(process, tmp_path / "checkpoint" / "copy")
    assert process.returncode == -signal.SIGKILL
    assert in_flight(tmp_path / "checkpoint" / "copy") == flying  # left as it was
    publish(ndjson, records(3000, 500))  # more arrives while it is down

    restarted = driver(tmp_path, gateway.address("segment"), "drain")
    output, _ = restarted.communicate(timeout=300)
    assert restarted.returncode == 0, output
    assert "drained" in output

    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    seqs = sorted(json.loads(bytes(r.body))["seq"] for r in rows)
    assert seqs == list(range(3500))  # each exactly once
    assert len({(r.partition, r.offset) for r in rows}) == 3500
    sent = read_all(ndjson, "alerts")
    assert sorted(json.loads(a.body)["seq"] for a in sent) == list(range(0, 3500, 3))
    assert len({a.headers["source_offset"] for a in sent}) == len(sent)


def test_sigint_stops_gateway_pipeline_with_its_checkpoint_intact(
    gateway: Any, tmp_path: Path
) -> None:
    ndjson = gateway.address("ndjson")
    publish(ndjson, records(0, 2000))
    argv = pipeline_command(
        gateway.address("segment"), "--master=local[2]", "--max-records-per-trigger=100"
    )
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:  # progress lines: wait for a few batches
        lines.append(line)
        if line.startswith("alerts batch 2:"):
            break
    os.killpg(process.pid, signal.SIGINT)  # as Ctrl-C: the whole process group
    try:
        rest, _ = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        late, _ = process.communicate()
        pytest.fail("no exit 120 s after SIGINT; it wrote:\n" + "".join(lines) + (late or ""))
    assert process.returncode == 0, "".join(lines) + rest
    assert "stopped; the checkpoint in pipeline-checkpoint resumes it" in rest
    checkpoint = tmp_path / "pipeline-checkpoint" / "alerts"
    assert list((checkpoint / "commits").glob("[0-9]*"))

    drained = subprocess.run(
        [*argv, "--available-now"], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert drained.returncode == 0, drained.stdout + drained.stderr
    sent = read_all(ndjson, "alerts")
    assert sorted(json.loads(a.body)["seq"] for a in sent) == list(range(0, 2000, 3))
