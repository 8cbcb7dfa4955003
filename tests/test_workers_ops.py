"""``[admin]`` and ``[metrics]`` of ``gateway run --workers N``: the supervisor serves them.

The merge of the workers' snapshots and expositions is checked on its own
(sums exact, identity kept, the worst state shown), then the supervisor's
routes against workers answering in this process over real control
channels, then the real command end to end: traffic through both workers,
and the supervisor's status and metrics sum them exactly.
"""

from __future__ import annotations

import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from test_admin import _get
from test_workers import (
    STARTUP,
    _connect_at_once,
    _publish_on,
    connections_of,
    relay_config,
    sink_gateway,
    supervised,
)
from test_workers_replace import on_worker
from waits import until

from gateway.core.destination import DestinationFigures, GroupFigures
from gateway.ops.admin import Admin
from gateway.ops.control import admin_answers, ask, metrics_answers, serve_channel
from gateway.ops.fleet import FleetAdmin, FleetMetrics, WorkerAnswer
from gateway.ops.merge import merge, merge_expositions, worker_summary
from gateway.ops.metrics import Metrics
from gateway.ops.top import fetch, render
from gateway.ops.view import (
    BudgetView,
    DestinationView,
    Fixed,
    GatewaySnapshot,
    ListenerView,
    UpstreamView,
)
from gateway.runtime.supervisor import KILL_GRACE

# -- merge ---------------------------------------------------------------------------


def _snapshot(
    n: int, *, state: str = "connected", started: float | None = 100.0
) -> GatewaySnapshot:
    """A worker's snapshot whose every count is a multiple of ``n``."""
    group = GroupFigures(
        "g", members=n, queued=2 * n, unacked=n, backlog=3 * n, backlog_bytes=10 * n, fill=0.1 * n
    )
    figures = DestinationFigures(
        kind="queue", received=5 * n, delivered=4 * n, acked=3 * n, backlog=2 * n,
        backlog_bytes=20 * n, kept=n, kept_bytes=7 * n, kept_fill=0.2 * n, full=n > 2,
        groups=(group,), limit_bytes=1000, filtered=n,
    )  # fmt: skip
    return GatewaySnapshot(
        version="1.0",
        time=1000.0 + n,
        started_at=started,
        draining=False,
        inflight=n,
        listeners=(
            ListenerView(
                "nd",
                "ndjson",
                "d",
                ("127.0.0.1:5000",),
                connections=n,
                max_connections=64,
                messages_in=10.0 * n,
                messages_out=n,
                bytes_in=100.0 * n,
                bytes_out=3.0 * n,
            ),
        ),
        upstreams=(
            UpstreamView(
                "sink",
                "ndjson",
                ("h:1",),
                state=state,
                messages_in=n,
                last_error="refused" if state != "connected" else None,
                last_error_at=50.0 if state != "connected" else None,
                connected_since=90.0 + n if state == "connected" else None,
            ),
        ),
        destinations=(DestinationView("upstream:sink", figures),),
        budget=BudgetView(limit=1000, used=10 * n, peak=20 * n, exhausted=False),
    )


def test_merge_sums_the_workers_exactly_and_keeps_identity() -> None:
    one, two = _snapshot(1), _snapshot(2)
    merged = merge([one, two])
    (ls,) = merged.listeners
    assert (ls.name, ls.protocol, ls.destination, ls.max_connections) == ("nd", "ndjson", "d", 64)
    assert ls.addresses == ("127.0.0.1:5000",)
    assert (ls.connections, ls.messages_in, ls.messages_out) == (3, 30.0, 3)
    assert (ls.bytes_in, ls.bytes_out) == (300.0, 9.0)
    assert merged.inflight == 3
    assert merged.time == 1002.0
    assert merged.started_at == 100.0
    (up,) = merged.upstreams
    assert (up.state, up.messages_in, up.connected_since) == ("connected", 3, 92.0)
    f = merged.destinations[0].figures
    assert (f.received, f.delivered, f.acked, f.backlog, f.backlog_bytes) == (15, 12, 9, 6, 60)
    assert (f.kept, f.kept_bytes, f.filtered, f.limit_bytes) == (3, 21, 3, 1000)
    assert f.kept_fill == pytest.approx(0.4)
    (g,) = f.groups
    assert (g.members, g.queued, g.unacked, g.backlog, g.backlog_bytes) == (3, 6, 3, 9, 30)
    assert g.fill == pytest.approx(0.2)
    assert merged.budget == BudgetView(limit=2000, used=30, peak=60, exhausted=False)
    # Through JSON, as the control channel carries it.
    assert merge([GatewaySnapshot.from_json(orjson.loads(orjson.dumps(one.to_json())))]) == one


def test_merge_shows_the_worst_state() -> None:
    merged = merge([_snapshot(1), _snapshot(2, state="backoff", started=None)])
    (up,) = merged.upstreams
    assert (up.state, up.last_error, up.connected_since) == ("backoff", "refused", None)
    assert merged.started_at is None  # one worker has not started
    unbound = replace(_snapshot(1), listeners=(replace(_snapshot(1).listeners[0], addresses=()),))
    assert merge([_snapshot(2), unbound]).listeners[0].addresses == ()
    draining = replace(_snapshot(3), draining=True)
    assert merge([_snapshot(1), draining]).draining
    with pytest.raises(ValueError):
        merge([])


def test_worker_summary() -> None:
    summary = worker_summary(1, 4242, _snapshot(2))
    assert (summary["index"], summary["pid"], summary["running"]) == (1, 4242, True)
    assert (summary["connections"], summary["messages_in"], summary["inflight"]) == (2, 20.0, 2)
    assert worker_summary(0, None, None) == {"index": 0, "pid": None, "running": False}


def _families(text: bytes) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text.decode())}


def test_merge_expositions_labels_every_series_with_its_worker() -> None:
    workers = [Metrics(), Metrics()]
    for n, metrics in enumerate(workers):
        metrics.connections.labels(listener="nd").inc(n + 2)
    merged = merge_expositions({str(n): m.exposition() for n, m in enumerate(workers)})
    assert merged.count(b"# TYPE interchange_connections_total counter") == 1
    samples = {
        s.labels["worker"]: s.value
        for s in _families(merged)["interchange_connections"].samples
        if s.name == "interchange_connections_total"
    }
    assert samples == {"0": 2.0, "1": 3.0}
    assert all(
        "worker" in s.labels for family in _families(merged).values() for s in family.samples
    )


# -- the supervisor's routes, over real control channels ------------------------------


class _Channels:
    """Workers answering in this process over socket pairs (None: a worker not running)."""

    def __init__(self, nursery: trio.Nursery, snapshots: list[GatewaySnapshot | None]) -> None:
        self.streams: dict[tuple[int, str], trio.abc.Stream] = {}
        for index, taken in enumerate(snapshots):
            if taken is None:
                continue
            metrics = Metrics()
            metrics.messages_received.labels(listener="nd").inc(10 * (index + 1))
            admin = Admin(view=Fixed(taken), reloader=None, taps=None)  # type: ignore[arg-type]
            for endpoint, answers in (
                ("admin", admin_answers(admin)),
                ("metrics", metrics_answers(metrics)),
            ):
                ours, theirs = trio.testing.memory_stream_pair()
                nursery.start_soon(serve_channel, theirs, answers)
                self.streams[(index, endpoint)] = ours
        self.count = len(snapshots)

    async def ask(self, endpoint: str, request: str, timeout: float) -> list[WorkerAnswer]:
        out = []
        for index in range(self.count):
            stream = self.streams.get((index, endpoint))
            body = None if stream is None else await ask(stream, request)
            out.append(WorkerAnswer(index, 100 + index, body))
        return out


async def test_status_sums_the_workers_with_a_breakdown() -> None:
    async with trio.open_nursery() as nursery:
        admin = FleetAdmin(_Channels(nursery, [_snapshot(1), _snapshot(2)]))
        reply = await admin.route("GET", "/api/status")
        assert reply.status == 200
        status = orjson.loads(reply.body)
        assert status["listeners"][0]["connections"] == 3
        assert status["destinations"][0]["received"] == 15
        assert status["inflight"] == 3
        assert [(w["index"], w["pid"], w["connections"]) for w in status["workers"]] == [
            (0, 100, 1),
            (1, 101, 2),
        ]
        assert status["ready"]
        ready = await admin.route("GET", "/readyz")
        assert ready.status == 200
        tap = await admin.route("GET", "/api/tap?dest=d")
        assert tap.status == 200
        assert tap.stream is not None
        assert (await admin.route("GET", "/api/tap")).status == 400
        assert (await admin.route("GET", "/healthz")).status == 200
        assert (await admin.route("GET", "/nowhere")).status == 404
        Console(file=None, width=120).print(render(status))  # gateway top renders it
        nursery.cancel_scope.cancel()


async def test_a_worker_not_running_makes_the_gateway_not_ready() -> None:
    async with trio.open_nursery() as nursery:
        admin = FleetAdmin(_Channels(nursery, [_snapshot(1), None]))
        status = orjson.loads((await admin.route("GET", "/api/status")).body)
        assert not status["ready"]
        assert "worker 1 is not running (restarting)" in status["not_ready"]
        assert status["workers"][1] == {"index": 1, "pid": 101, "running": False}
        ready = await admin.route("GET", "/readyz")
        assert ready.status == 503
        nobody = FleetAdmin(_Channels(nursery, [None, None]))
        assert (await nobody.route("GET", "/api/status")).status == 503
        nursery.cancel_scope.cancel()


async def test_metrics_route_merges_the_workers_and_the_supervisor() -> None:
    async with trio.open_nursery() as nursery:
        fleet = FleetMetrics(_Channels(nursery, [_snapshot(1), _snapshot(2)]), Metrics())
        reply = await fleet.route("GET", "/metrics")
        assert reply.status == 200
        families = _families(reply.body)
        received = {
            s.labels["worker"]: s.value
            for s in families["interchange_messages_received"].samples
            if s.name.endswith("_total")
        }
        assert received == {"0": 10.0, "1": 20.0}
        assert {s.labels["worker"] for s in families["process_cpu_seconds"].samples} >= {
            "0",
            "1",
            "supervisor",
        }
        assert (await fleet.route("GET", "/other")).status == 404
        assert (await fleet.route("POST", "/metrics")).status == 405
        nursery.cancel_scope.cancel()


# -- end to end ----------------------------------------------------------------------


def _with_endpoints(path: Path) -> Path:
    path.write_text(
        path.read_text() + '[admin]\nbind = "127.0.0.1:0"\n[metrics]\nbind = "127.0.0.1:0"\n'
    )
    return path


async def _http(address: str, path: str) -> Any:
    return await trio.to_thread.run_sync(_get, address, path)


def _worker_series(families: dict[str, Any], family: str) -> dict[str, float]:
    return {
        s.labels["worker"]: s.value
        for s in families[family].samples
        if s.name.endswith("_total") and s.labels.get("listener") == "nd"
    }


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_status_and_metrics_sum_the_workers_exactly(tmp_path: Path) -> None:
    """Connections held on both workers, messages through both: the supervisor's
    status shows their sum and each worker's part; /metrics each worker's series."""
    async with sink_gateway() as sink:
        config = _with_endpoints(relay_config(tmp_path, sink.gateway))
        async with supervised(config) as run:
            admin = (await run.wait_for(r"admin: status page and /api/status on (\S+)"))[0][1]
            scrape = (await run.wait_for(r"metrics: GET /metrics on (\S+)"))[0][1]
            pids = run.worker_pids()
            clients = await _spread_over(run.port, pids)
            spread = {index: connections_of(pid, run.port) for index, pid in pids.items()}
            async with trio.open_nursery() as nursery:
                for n, client in enumerate(clients):
                    nursery.start_soon(_publish_on, client, [b"%d-%d" % (n, i) for i in range(4)])
            await until(lambda: len(sink.bodies) >= 5 * len(clients))

            status = (await _http(admin, "/api/status")).json()
            (nd,) = status["listeners"]
            assert nd["connections"] == len(clients) == sum(spread.values())
            (relay,) = status["destinations"]
            assert relay["received"] == 5 * len(clients)
            workers = status["workers"]
            assert [(w["index"], w["pid"]) for w in workers] == sorted(pids.items())
            assert {w["index"]: w["connections"] for w in workers} == spread
            assert sum(w["messages_in"] for w in workers) == 5 * len(clients)
            assert all(w["messages_in"] > 0 for w in workers)
            assert status["ready"], status["not_ready"]
            assert (await _http(admin, "/readyz")).status == 200

            families = _families((await _http(scrape, "/metrics")).body)
            received = _worker_series(families, "interchange_messages_received")
            assert received == {str(w["index"]): w["messages_in"] for w in workers}
            frame = render(await trio.to_thread.run_sync(fetch, f"http://{admin}"))
            Console(file=None, width=120).print(frame)  # gateway top renders the whole
            reload = await trio.to_thread.run_sync(_get, admin, "/api/reload", "POST")
            answer = reload.json()
            assert answer["reloaded"], answer
            assert [w["index"] for w in answer["workers"] if w["reloaded"]] == [0, 1]
            for client in clients:
                await client.aclose()


async def _spread_over(port: int, pids: dict[int, int]) -> list[Any]:
    """Bursts of connections, each publishing once, until every worker holds some."""
    clients: list[Any] = []
    for _ in range(8):
        burst = await _connect_at_once(port, 16)
        clients += burst
        async with trio.open_nursery() as nursery:
            for client in burst:
                nursery.start_soon(_publish_on, client, [b"hi"])
        spread = {index: connections_of(pid, port) for index, pid in pids.items()}
        if all(spread.values()):
            return clients
    raise AssertionError(f"one worker served every connection: {spread}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_sigterm_drains_within_drain_timeout_and_the_status_says_what_was_abandoned(
    tmp_path: Path,
) -> None:
    """A publish its subscriber never acks is still in flight at SIGTERM: every worker
    drains within ``drain_timeout`` (1 s), the one holding it abandons it, and the
    supervisor exits 3 well before its kill grace; with nothing in flight, 0."""
    path = tmp_path / "abandon.toml"
    path.write_text(
        '[gateway]\ndrain_timeout = "1s"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
    )
    async with supervised(path) as run:
        pids = run.worker_pids()
        publisher = await on_worker(run.port, pids[1], pids)
        subscriber = await on_worker(run.port, pids[1], pids)
        await subscriber.subscribe("news", window=10)
        with trio.fail_after(STARTUP):
            while True:  # until the subscription is in place: then one publish is held
                ids = await publisher.publish_nowait([b"never acked"], "news")
                with trio.move_on_after(0.2):
                    await subscriber.receive()
                    break
                await publisher.wait_answers(ids)
        run.process.send_signal(signal.SIGTERM)
        started = trio.current_time()
        with trio.fail_after(STARTUP):
            status = await run.process.wait()
        took = trio.current_time() - started
        assert status == 3, "\n".join(run.lines)
        assert took < 1.0 + KILL_GRACE, took
        assert run.matches(r"\[worker 1\] .*1 publishes still unsettled after 1s")
        assert run.matches(r"worker 1 \(pid \d+\) exited with status 3$")
        assert run.matches(r"worker 0 \(pid \d+\) exited with status 0$")
        assert not run.matches(r"did not exit within drain_timeout")
