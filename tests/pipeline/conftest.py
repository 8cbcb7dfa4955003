"""Fixtures of the Spark pipeline tests: one quiet Spark session for the whole run,
and real gateways on loopback, each in a thread of its own (Spark's Python code is
blocking: it reaches the gateway over sockets, as executors on a cluster would)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.harness import running_gateway


class GatewayThread:
    """A gateway running ``trio.run`` in a background thread; :meth:`stop` drains it."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.addresses: dict[str, list[str]] = {}
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="gateway", daemon=True)

    def start(self) -> GatewayThread:
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the gateway did not start within 60 s")
        if self._error is not None:
            raise self._error
        return self

    def address(self, listener: str) -> str:
        """The bound ``host:port`` of ``listener``."""
        return self.addresses[listener][0]

    def run(self, fn: Any, *args: Any) -> Any:
        """Run ``await fn(gateway, *args)`` in the gateway's trio thread; its result."""
        assert self._token is not None
        return trio.from_thread.run(fn, self.gateway, *args, trio_token=self._token)

    def stop(self) -> None:
        if self._token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(60)

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # reported to start(), or seen as a hang in stop()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with running_gateway(self.config) as gateway:
            self.gateway = gateway
            self.addresses = gateway.addresses
            self._ready.set()
            await self._stop.wait()


def pipeline_config(data_dir: Path, **extra: Any) -> dict[str, Any]:
    """A gateway with segment, ndjson and Lumberjack listeners on OS-chosen ports, and
    durable destinations ``logs`` (one partition), ``parts`` (three, keyed by the
    ``key`` header) and ``alerts`` (a topic)."""
    config: dict[str, Any] = {
        "gateway": {"data_dir": str(data_dir)},
        "listeners": [
            {
                "name": "segment",
                "protocol": "segment",
                "bind": "127.0.0.1:0",
                "destination": "logs",
            },
            {"name": "ndjson", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "logs"},
            {
                "name": "lumberjack",
                "protocol": "lumberjack",
                "bind": "127.0.0.1:0",
                "destination": "logs",
            },
        ],
        "destinations": [
            {"name": "logs", "kind": "queue", "store": "embedded"},
            {
                "name": "parts",
                "kind": "topic",
                "store": "embedded",
                "partitions": 3,
                "partition_key": "key",
            },
            {"name": "alerts", "kind": "topic", "store": "embedded"},
        ],
    }
    config.update(extra)
    return config


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayThread]:
    """A fresh gateway (:func:`pipeline_config`) for one test."""
    thread = GatewayThread(pipeline_config(tmp_path / "data")).start()
    try:
        yield thread
    finally:
        thread.stop()


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session for every Spark test: loopback only, no UI, quiet logs,
    two shuffle partitions; the ``interchange`` data source registered."""
    if os.environ.get("INTERCHANGE_SKIP_JAVA") == "1":
        pytest.skip("INTERCHANGE_SKIP_JAVA=1: Spark needs Java, its tests are skipped")
    if shutil.which("java") is None:
        pytest.fail("Spark needs Java 17+ on PATH: bash .ci/test-deps installs it")
    try:
        import pyspark  # noqa: F401
    except ImportError:  # the peer is missing: fail, saying how to get it
        pytest.fail("pyspark is not installed: pip install -e '.[pipeline]'")
    from gateway.pipeline.session import local_session

    session = local_session("local[2]", app_name="interchange-tests")
    try:
        yield session
    finally:
        for query in session.streams.active:
            query.stop()
        session.stop()
