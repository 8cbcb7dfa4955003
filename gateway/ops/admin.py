"""The admin endpoint: health, readiness, status and the status page over HTTP/1.1.

``[admin] bind`` serves, with the same h11 driver design as the metrics
endpoint (keep-alive, an idle timeout per request, a connection cap answered
``503``, accepting through :func:`~gateway.runtime.accept.accept_forever`):

* ``GET /healthz``: ``200 ok`` while the process runs;
* ``GET /readyz``: ``200`` when every listener is bound and every upstream is
  connected (and the gateway is not draining), else ``503``; the body is JSON,
  ``{"ready": …, "reasons": […]}``;
* ``GET /api/status``: :func:`gateway.ops.status.status` as JSON;
* ``POST /api/reload``: re-read the config file and apply it
  (:func:`gateway.ops.reload.reload_file`); the JSON answer says what changed or
  why the running config stays;
* ``GET /api/tap?dest=…&filter=…&format=json|pretty``: a passive
  :class:`~gateway.ops.tap.Tap` on the matching destinations, streamed as one
  line per message until the client leaves (``gateway tap``);
* ``GET /``: the status page, and its files under ``/static/``;
* ``GET /live?ws=…&publisher=…&window=…``: a page subscribing to a reactive
  listener over a WebSocket and showing its messages live (its policy lets
  it connect to ``ws:`` and ``wss:`` addresses).

Any other path is 404 and any other method 405. The endpoint is plain HTTP
without authentication and a tap shows message bodies: keep it on loopback or
a private network.

The endpoint never holds the running gateway: it reaches it through an
:class:`Admin`, three narrow interfaces (a view whose snapshots it reads, a
reload it asks for, taps it opens), which a control plane serving the
status of gateways in other processes could provide as well.
"""

from __future__ import annotations

import functools
import logging
import urllib.parse
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import orjson
import trio

from gateway.ops.http_server import Handler, Response, Write, refusal, serve_http
from gateway.ops.metrics import Metrics
from gateway.ops.reload import Reloadable, ReloadRefused, reload_file
from gateway.ops.status import StatusTracker, readiness, status
from gateway.ops.tap import Tappable, tap_filter
from gateway.ops.tap import stream as stream_tap
from gateway.ops.view import GatewayView

__all__ = ["Admin", "Response", "page", "route", "secured", "serve_admin", "serve_admin_with"]

log = logging.getLogger("gateway.admin")

#: Listener name in the metrics' ``listener`` label and in log lines.
NAME = "admin"

_REFUSAL_BODY = b"too many admin connections; try again later\n"
_REFUSAL = refusal(_REFUSAL_BODY)

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
#: Every response: no MIME sniffing, no referrer.
_SECURITY = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]
_CSP = b"content-security-policy"
#: Every response but the live page's: no framing, scripts and connections from here only.
_POLICY = b"default-src 'self'; frame-ancestors 'none'"
#: The live page's: it also opens WebSockets to listeners, at the address its user gives.
_LIVE_POLICY = b"default-src 'self'; connect-src 'self' ws: wss:; frame-ancestors 'none'"


@dataclass(frozen=True)
class Admin:
    """What the admin endpoint reaches: a view to read, a reload to ask for, taps to open."""

    view: GatewayView
    reloader: Reloadable
    taps: Tappable


def _json(code: int, data: object) -> Response:
    return Response(
        code,
        orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n",
        _JSON,
        [(b"cache-control", b"no-store")],
    )


@functools.cache
def _static_files() -> dict[str, tuple[bytes, str]]:
    """The status page's files by name, read once from the package."""
    out: dict[str, tuple[bytes, str]] = {}
    folder = resources.files("gateway.ops") / "static"
    if not folder.is_dir():
        return out
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES and not entry.name.startswith("."):
            out[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return out


def _static(name: str, policy: bytes = _POLICY) -> Response:
    found = _static_files().get(name)
    if found is None:
        return Response(404, b"not found\n")
    body, content_type = found
    return Response(200, body, content_type, [(b"cache-control", b"no-cache"), (_CSP, policy)])


def _secured(admin: Admin, tracker: StatusTracker | None, method: str, target: str) -> Response:
    """:func:`route`'s response, with the default content security policy."""
    return secured(route(admin, tracker, method, target))


def secured(response: Response) -> Response:
    """``response`` with the default content security policy unless it has one."""
    if all(name != _CSP for name, _ in response.headers):
        response.headers.append((_CSP, _POLICY))
    return response


def route(admin: Admin, tracker: StatusTracker | None, method: str, target: str) -> Response:
    """The response to ``method target`` (GET or HEAD; POST /api/reload), without any I/O."""
    path, _, query = target.partition("?")
    if path == "/api/reload":
        if method != "POST":
            return Response(405, b"POST to reload\n", headers=[(b"allow", b"POST")])
        return _reload(admin.reloader)
    if method not in ("GET", "HEAD"):
        return Response(405, b"method not allowed\n", headers=[(b"allow", b"GET, HEAD")])
    if path == "/readyz":
        reasons = readiness(admin.view.snapshot())
        return _json(503 if reasons else 200, {"ready": not reasons, "reasons": reasons})
    if path == "/api/status":
        return _json(200, status(admin.view.snapshot(), tracker))
    if path == "/api/tap":
        return _tap(admin.taps, urllib.parse.parse_qs(query))
    return page(path)


def page(path: str) -> Response:
    """What every admin endpoint serves alike (a gateway's, a supervisor's): ``/healthz``,
    the status page and its files; else 404."""
    if path == "/healthz":
        return Response(200, b"ok\n", headers=[(b"cache-control", b"no-store")])
    if path in ("/", "/index.html"):
        return _static("status.html")
    if path == "/live":
        return _static("live.html", _LIVE_POLICY)
    if path.startswith("/static/"):
        return _static(path[len("/static/") :])
    return Response(404, b"not found: try /, /api/status, /healthz or /readyz\n")


def _reload(reloader: Reloadable) -> Response:
    """Re-read the config file and apply it; the body says what changed or why not."""

    async def run(write: Write) -> None:
        try:
            summary = await reload_file(reloader, via="POST /api/reload")
        except ReloadRefused as e:
            await write(orjson.dumps({"reloaded": False, "error": str(e)}) + b"\n")
        else:
            await write(orjson.dumps({"reloaded": True, "changes": summary}) + b"\n")

    return Response(200, content_type=_JSON, stream=run)


def _tap(taps: Tappable, query: dict[str, list[str]]) -> Response:
    pattern = query.get("dest", [""])[0]
    fmt = query.get("format", ["json"])[0]
    if not pattern:
        return Response(400, b"dest= is required: a destination name or glob\n")
    if fmt not in ("json", "pretty"):
        return Response(400, b"format= is json or pretty\n")
    try:
        filter = tap_filter(query.get("filter", [""])[0])
    except ValueError as e:
        return Response(400, f"filter: {e}\n".encode())
    kind: Literal["json", "pretty"] = "json" if fmt == "json" else "pretty"

    async def run(write: Write) -> None:
        tap = taps.tap(pattern, filter)
        try:
            await stream_tap(tap, write, kind)
        finally:
            taps.untap(tap)

    content_type = "application/x-ndjson" if kind == "json" else _TEXT
    return Response(200, content_type=content_type, stream=run)


async def serve_admin(
    admin: Admin,
    listeners: list[trio.SocketListener],
    *,
    metrics: Metrics,
    max_connections: int = 16,
    idle_timeout: float = 10.0,
    tracker: StatusTracker | None = None,
) -> None:
    """Answer admin requests on ``listeners`` until cancelled.

    At most ``max_connections`` connections are served at once (a tap holds
    one for as long as it runs); each must send every request within
    ``idle_timeout`` seconds of the previous response (of connecting).
    """
    tracker = tracker or StatusTracker(admin.view)
    tracker.sample()  # a baseline: the first status has rates since the start
    await serve_admin_with(
        functools.partial(_secured, admin, tracker),
        listeners,
        metrics=metrics,
        max_connections=max_connections,
        idle_timeout=idle_timeout,
    )


async def serve_admin_with(
    handler: Handler,
    listeners: list[trio.SocketListener],
    *,
    metrics: Metrics,
    max_connections: int = 16,
    idle_timeout: float = 10.0,
) -> None:
    """Answer admin requests on ``listeners`` with ``handler`` (its responses should be
    :func:`secured`): the endpoint's name, headers and refusal, another's routes
    (the supervisor's of ``gateway run --workers N``)."""
    await serve_http(
        listeners,
        handler,
        name=NAME,
        metrics=metrics,
        log=log,
        refused_with=_REFUSAL,
        max_connections=max_connections,
        idle_timeout=idle_timeout,
        headers=_SECURITY,
    )
