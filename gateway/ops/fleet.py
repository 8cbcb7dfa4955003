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
- ``POST /api/reload?replace=1``: the workers are replaced one at a time
  (:meth:`gateway.runtime.supervisor.Supervisor.replace`); the answer says,
  for each, its old and new pid;
- ``GET /api/tap``: a tap in every running worker (:mod:`gateway.ops.control`),
  their lines merged into one stream, each saying which worker stored the
  message (``"worker": N`` in json, ``[worker N]`` pretty; a ``dropped`` line
  is one worker's); the workers' taps end when the client leaves;
- ``GET /metrics``: every worker's series with ``worker="N"`` added, and the
  supervisor's own process series with ``worker="supervisor"``
  (:func:`gateway.ops.merge.merge_expositions`);
- ``/healthz`` and the status page as a single gateway's.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import orjson
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector
from prometheus_client.exposition import generate_latest

from gateway.ops import metrics_http
from gateway.ops.admin import page, secured, serve_admin_with
from gateway.ops.http_server import Response, Write
from gateway.ops.merge import merge, merge_expositions, worker_summary
from gateway.ops.metrics import Metrics
from gateway.ops.status import StatusTracker, readiness, status
from gateway.ops.tap import tap_filter
from gateway.ops.view import GatewaySnapshot

__all__ = ["FleetAdmin", "FleetMetrics", "WorkerAnswer", "Workers", "merge_taps"]

log = logging.getLogger("gateway.supervisor")

#: Seconds a worker has to answer a snapshot or a scrape.
ASK_TIMEOUT = 5.0
#: Seconds a worker has to answer a reload.
RELOAD_TIMEOUT = 60.0
_JSON = "application/json"
#: Chunks of tap lines waiting to be written to the client, per worker.
TAP_BUFFER = 8


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

    async def open_taps(self, query: str, timeout: float) -> list[tuple[int, trio.SocketStream]]:
        """A tap for ``query`` (JSON) in every running worker: (index, its lines)."""
        ...

    async def replace(self) -> list[dict[str, Any]]:
        """Replace the workers one at a time; each one's outcome."""
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
        path, _, query = target.partition("?")
        return secured(await self._route(method, path, urllib.parse.parse_qs(query)))

    async def _route(self, method: str, path: str, query: dict[str, list[str]]) -> Response:
        if path == "/api/reload":
            if method != "POST":
                return Response(405, b"POST to reload\n", headers=[(b"allow", b"POST")])
            if query.get("replace", ["0"])[0] in ("1", "true"):
                return await self._replace()
            return await self._reload()
        if method not in ("GET", "HEAD"):
            return Response(405, b"method not allowed\n", headers=[(b"allow", b"GET, HEAD")])
        if path == "/api/tap":
            return self._tap(query)
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

    async def _replace(self) -> Response:
        results = await self.workers.replace()
        replaced = bool(results) and all(r.get("replaced") for r in results)
        return _json(200, {"replaced": replaced, "workers": results})

    def _tap(self, query: dict[str, list[str]]) -> Response:
        """Every worker's tap on ``dest=``, merged (the checks are a single gateway's)."""
        pattern = query.get("dest", [""])[0]
        fmt = query.get("format", ["json"])[0]
        if not pattern:
            return Response(400, b"dest= is required: a destination name or glob\n")
        if fmt not in ("json", "pretty"):
            return Response(400, b"format= is json or pretty\n")
        filter_text = query.get("filter", [""])[0]
        try:
            tap_filter(filter_text)
        except ValueError as e:
            return Response(400, f"filter: {e}\n".encode())
        kind: Literal["json", "pretty"] = "json" if fmt == "json" else "pretty"
        asked = orjson.dumps({"dest": pattern, "filter": filter_text, "format": kind}).decode()

        async def run(write: Write) -> None:
            await merge_taps(await self.workers.open_taps(asked, ASK_TIMEOUT), write, kind)

        content_type = "application/x-ndjson" if kind == "json" else "text/plain; charset=utf-8"
        return Response(200, content_type=content_type, stream=run)


async def merge_taps(
    taps: list[tuple[int, trio.SocketStream]], write: Write, fmt: Literal["json", "pretty"]
) -> None:
    """Write the lines of every worker's tap as they come, each marked with its worker,
    until every tap ended or ``write`` fails; the taps are closed (their workers untap)."""
    try:
        if not taps:
            await write(b'{"error": "no worker could open a tap"}\n')
            return
        send, receive = trio.open_memory_channel[bytes](TAP_BUFFER * len(taps))
        async with trio.open_nursery() as nursery, receive:
            async with send:
                for index, stream in taps:
                    nursery.start_soon(_relay_tap, index, stream, send.clone(), fmt)
            async for chunk in receive:
                await write(chunk)
    finally:
        for _, stream in taps:
            await trio.aclose_forcefully(stream)


async def _relay_tap(
    index: int,
    stream: trio.SocketStream,
    out: trio.MemorySendChannel[bytes],
    fmt: Literal["json", "pretty"],
) -> None:
    """Pass worker ``index``'s whole lines on to ``out``, marked, until its tap ends."""
    buffer = b""
    async with out:
        try:
            async for chunk in stream:
                *lines, buffer = (buffer + chunk).split(b"\n")
                if lines:
                    await out.send(b"".join(_mark(line, index, fmt) + b"\n" for line in lines))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


def _mark(line: bytes, index: int, fmt: Literal["json", "pretty"]) -> bytes:
    """``line`` saying it comes from worker ``index``."""
    if fmt == "json":
        if line.endswith(b"}"):
            return line[:-1] + b',"worker":%d}' % index
        return line
    if line.startswith(b"-- "):
        return line + b" (worker %d)" % index
    return b"[worker %d] " % index + line


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
