"""The example job on a Spark standalone cluster: a master and a worker started on
loopback from the pyspark install (``bin/spark-class``: pip's pyspark has no
``sbin/`` scripts), so the executors are separate JVMs with their own Python
workers, reaching the gateway as a cluster's executors would. ``gateway
pipeline --master spark://…`` runs the same job there."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.traffic import pipeline_command, publish, read_all

pytestmark = pytest.mark.spark


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def spark_class(home: Path, *args: str, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A daemon of ``bin/spark-class`` in its own process group, output to ``log``."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(home / "bin" / "spark-class"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text(errors="replace")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            time.sleep(0.2)
        else:
            return
    pytest.fail(f"nothing listens on {port} after 120 s:\n{log.read_text(errors='replace')}")


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, Path, dict[str, str]]]:
    """A standalone master and one worker (2 cores, 1 GiB) on loopback: the master
    URL, the worker's work directory, and the environment they run with."""
    import pyspark

    home = Path(pyspark.__file__).parent
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    master_port, master_ui, worker_ui = free_port(), free_port(), free_port()
    master_url = f"spark://127.0.0.1:{master_port}"
    work = tmp_path / "work"
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    master = spark_class(
        home,
        "org.apache.spark.deploy.master.Master",
        *("--host", "127.0.0.1", "--port", str(master_port), "--webui-port", str(master_ui)),
        log=master_log,
        env=env,
    )
    worker = None
    try:
        wait_for_port(master_port, master, master_log)
        worker = spark_class(
            home,
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--webui-port", str(worker_ui)),
            *("--cores", "2", "--memory", "1g", "--work-dir", str(work), master_url),
            log=worker_log,
            env=env,
        )
        wait_for_port(worker_ui, worker, worker_log)
        yield master_url, work, env
    finally:
        if worker is not None:
            stop(worker)
        stop(master)


def test_gateway_pipeline_runs_on_a_standalone_cluster(
    cluster: tuple[str, Path, dict[str, str]], gateway: Any, tmp_path: Path
) -> None:
    master_url, work, env = cluster
    ndjson = gateway.address("ndjson")
    bodies = [
        json.dumps({"seq": n, "log": {"level": "ERROR" if n % 4 == 0 else "info"}}).encode()
        for n in range(400)
    ]
    publish(ndjson, bodies)
    run = subprocess.run(
        pipeline_command(
            gateway.address("segment"),
            f"--master={master_url}",
            "--available-now",
            "--max-records-per-trigger=150",
            "--conf=spark.sql.shuffle.partitions=2",
            "--conf=spark.executor.memory=512m",
        ),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "alerts batch 0: 150 rows" in run.stdout
    sent = read_all(ndjson, "alerts")
    assert sorted(json.loads(a.body)["seq"] for a in sent) == list(range(0, 400, 4))
    # The tasks ran in an executor the worker launched: a JVM of its own.
    executors = list(work.glob("app-*/[0-9]*"))
    assert executors, "the worker launched no executor"
    launched = (executors[0] / "stderr").read_text(errors="replace")
    assert "-xmx512m" in launched.lower()  # with the memory --conf asked for
