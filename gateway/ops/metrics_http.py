"""The metrics endpoint: ``GET /metrics`` over HTTP/1.1, for Prometheus to scrape.

Served by :mod:`gateway.ops.http_server` (keep-alive, an idle timeout per
request, a connection cap answered with 503, accept failures survived); this
module only says what each request gets: any other path is 404 and any other
method 405. A scraper needs one connection.
"""

from __future__ import annotations

import functools
import logging

import trio
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.ops.http_server import Handler, Response, refusal, serve_http
from gateway.ops.metrics import Metrics

__all__ = ["route", "serve_metrics"]

log = logging.getLogger("gateway.metrics")

PATH = "/metrics"
#: Listener name in the metrics' ``listener`` label and in log lines.
NAME = "metrics"
_REFUSAL = refusal(b"too many metrics connections; try again later\n")


def route(metrics: Metrics, method: str, target: str) -> Response:
    """The response to ``method target``: the exposition for GET or HEAD /metrics."""
    if method not in ("GET", "HEAD"):
        return Response(405, b"method not allowed\n", "text/plain", [(b"allow", b"GET, HEAD")])
    if target.split("?", 1)[0] != PATH:
        return Response(404, b"not found: try /metrics\n", "text/plain")
    return Response(200, metrics.exposition(), CONTENT_TYPE_LATEST)


async def serve_metrics(
    metrics: Metrics,
    listeners: list[trio.SocketListener],
    *,
    max_connections: int = 16,
    idle_timeout: float = 10.0,
    handler: Handler | None = None,
) -> None:
    """Answer scrapes on ``listeners`` until cancelled (with ``handler``: its answers,
    as the supervisor of ``gateway run --workers N`` gives every worker's series).

    At most ``max_connections`` connections are served at once; each must send
    every request (the first one too) within ``idle_timeout`` seconds of the
    previous response (of connecting), or it is closed.
    """
    await serve_http(
        listeners,
        handler or functools.partial(route, metrics),
        name=NAME,
        metrics=metrics,
        log=log,
        refused_with=_REFUSAL,
        max_connections=max_connections,
        idle_timeout=idle_timeout,
    )
