"""``[admin]`` and ``[metrics]`` of ``gateway run --workers N``, served by the supervisor.

The workers bind neither endpoint; the supervisor does, and answers each
request by asking every worker over its control channel
(:mod:`gateway.ops.control`) through a :class:`Workers`:

- ``GET /api/status``: the status (:func:`gateway.ops.status.status`) of the
  workers' snapshots merged (:func:`gateway.ops.merge.merge`), with a
  ``workers`` breakdown (index, pid, running, connections, messages, bytes,
  in flight); a worker that does not answer (restarting) makes the gateway
  not ready;
- ``GET /readyz``: ready when every worker answers and the merged gateway is;
- ``POST /api/reload``: every worker re-reads the file; reloaded when none
  refused (a restarting worker reads it as it starts);
- ``GET /api/tap``: 501, a tap would see one worker's messages;
- ``GET /metrics``: every worker's series with ``worker="N"`` added, and the
  supervisor's own process series with ``worker="supervisor"``
  (:func:`gateway.ops.merge.merge_expositions`);
- ``/healthz`` and the status page as a single gateway's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector
from prometheus_client.exposition import generate_latest

from gateway.ops import metrics_http
from gateway.ops.admin import page, secured, serve_admin_with
from gateway.ops.http_server import Response
from gateway.ops.merge import merge, merge_expositions, worker_summary
from gateway.ops.metrics import Metrics
from gateway.ops.status import StatusTracker, readiness, status
from gateway.ops.view import GatewaySnapshot

__all__ = ["FleetAdmin", "FleetMetrics", "WorkerAnswer", "Workers"]

log = logging.getLogger("gateway.supervisor")

#: Seconds a worker has to answer a snapshot or a scrape.
ASK_TIMEOUT = 5.0
#: Seconds a worker has to answer a reload.
RELOAD_TIMEOUT = 60.0
_JSON = "application/json"
_TAP_REFUSED = (
    b"tap is not served with workers > 1 yet: each worker sees only the messages of its own"
    b" connections; run one worker to tap\n"
)


@dataclass(frozen=True)
class WorkerAnswer:
    """One worker's answer to a request: None when it did not answer (not running)."""

    index: int
    pid: int | None
    body: bytes | None


class Workers(Protocol):
    """The supervisor's side of the control channels."""

    async def ask(self, endpoint: str, request: str, timeout: float) -> list[WorkerAnswer]:
        """Ask every worker ``request`` on its ``endpoint`` channel; every worker's answer."""
        ...


def _json(code: int, data: object) -> Response:
    body = orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n"
    return Response(code, body, _JSON, [(b"cache-control", b"no-store")])


@dataclass
class FleetAdmin:
    """The admin endpoint of the whole gateway, from its workers' answers."""

    workers: Workers
    tracker: StatusTracker = field(default_factory=StatusTracker)

    async def route(self, method: str, target: str) -> Response:
        """The response to ``method target`` (as :func:`gateway.ops.admin.route`)."""
        return secured(await self._route(method, target.partition("?")[0]))

    async def _route(self, method: str, path: str) -> Response:
        if path == "/api/reload":
            if method != "POST":
                return Response(405, b"POST to reload\n", headers=[(b"allow", b"POST")])
            return await self._reload()
        if method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers=[(b"allow", b"GET, HEAD")])
        if path == "/api/tap":
            return Response(501, _TAP_REFUSED)
        if path in ("/api/status", "/readyz"):
            answers = await self.workers.ask("admin", "snapshot", ASK_TIMEOUT)
            return self._status(answers) if path == "/api/status" else self._ready(answers)
        return page(path)

    def _status(self, answers: Sequence[WorkerAnswer]) -> Response:
        taken = _snapshots(answers)
        if not taken:
            return _json(503, {"error": "no worker answered", "workers": _breakdown(answers, {})})
        out: dict[str, Any] = status(merge(list(taken.values())), self.tracker)
        missing = _missing(answers)
        out["not_ready"] += missing
        out["ready"] = not out["not_ready"]
        out["workers"] = _breakdown(answers, taken)
        return _json(200, out)

    def _ready(self, answers: Sequence[WorkerAnswer]) -> Response:
        taken = _snapshots(answers)
        reasons = readiness(merge(list(taken.values()))) if taken else []
        reasons += _missing(answers)
        return _json(503 if reasons else 200, {"ready": not reasons, "reasons": reasons})

    async def _reload(self) -> Response:
        answers = await self.workers.ask("admin", "reload", RELOAD_TIMEOUT)
        results = []
        for a in answers:
            result = orjson.loads(a.body) if a.body else {"restarting": True}
            results.append({"index": a.index, "pid": a.pid, **result})
        refused = [r for r in results if r.get("reloaded") is False]
        done = [r for r in results if r.get("reloaded")]
        out: dict[str, Any] = {"reloaded": not refused, "workers": results}
        if refused:
            out["error"] = f"worker {refused[0]['index']}: {refused[0].get('error')}"
        elif done:
            out["changes"] = done[0].get("changes", "")
        return _json(200, out)


def _snapshots(answers: Sequence[WorkerAnswer]) -> dict[int, GatewaySnapshot]:
    """The snapshots the workers answered with, by worker index."""
    return {a.index: GatewaySnapshot.from_json(orjson.loads(a.body)) for a in answers if a.body}


def _missing(answers: Sequence[WorkerAnswer]) -> list[str]:
    return [f"worker {a.index} is not running (restarting)" for a in answers if not a.body]


def _breakdown(
    answers: Sequence[WorkerAnswer], taken: dict[int, GatewaySnapshot]
) -> list[dict[str, Any]]:
    return [worker_summary(a.index, a.pid, taken.get(a.index)) for a in answers]


@dataclass
class FleetMetrics:
    """The metrics endpoint of the whole gateway: every worker's series, labelled."""

    workers: Workers
    #: The supervisor's endpoints' metrics (what refuses a scrape: 404, 405).
    metrics: Metrics
    #: The supervisor's own series (its process: CPU, memory, descriptors).
    own: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        ProcessCollector(registry=self.own)

    async def route(self, method: str, target: str) -> Response:
        """``GET /metrics``: every worker's exposition merged; else as one gateway's."""
        if method not in ("GET", "HEAD") or target.split("?", 1)[0] != metrics_http.PATH:
            return metrics_http.route(self.metrics, method, target)
        return Response(200, await self.exposition(), CONTENT_TYPE_LATEST)

    async def exposition(self) -> bytes:
        answers = await self.workers.ask("metrics", "metrics", ASK_TIMEOUT)
        texts = {str(a.index): a.body for a in answers if a.body}
        return merge_expositions({**texts, "supervisor": generate_latest(self.own)})


async def serve_fleet(
    workers: Workers,
    admin: list[trio.SocketListener] | None,
    metrics: list[trio.SocketListener] | None,
    own: Metrics,
    *,
    max_connections: tuple[int, int] = (16, 16),
    idle_timeout: tuple[float, float] = (10.0, 10.0),
) -> None:
    """Serve the admin (``admin``) and metrics (``metrics``) endpoints until cancelled;
    ``own`` counts their connections; the tuples are (admin, metrics)."""
    async with trio.open_nursery() as nursery:
        if admin is not None:
            nursery.start_soon(
                lambda: serve_admin_with(
                    FleetAdmin(workers).route,
                    admin,
                    metrics=own,
                    max_connections=max_connections[0],
                    idle_timeout=idle_timeout[0],
                )
            )
        if metrics is not None:
            nursery.start_soon(
                lambda: metrics_http.serve_metrics(
                    own,
                    metrics,
                    max_connections=max_connections[1],
                    idle_timeout=idle_timeout[1],
                    handler=FleetMetrics(workers, own).route,
                )
            )
