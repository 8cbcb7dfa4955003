"""The admin endpoint: health, readiness, status and the status page over HTTP/1.1.

``[admin] bind`` serves, with the same h11 driver design as the metrics
endpoint (keep-alive, an idle timeout per request, a connection cap answered
``503``, accepting through :func:`~gateway.accept.accept_forever`):

* ``GET /healthz``: ``200 ok`` while the process runs;
* ``GET /readyz``: ``200`` when every listener is bound and every upstream is
  connected (and the gateway is not draining), else ``503``; the body is JSON,
  ``{"ready": …, "reasons": […]}``;
* ``GET /api/status``: :func:`gateway.status.snapshot` as JSON;
* ``POST /api/reload``: re-read the config file and apply it
  (:func:`gateway.reload.reload_file`); the JSON answer says what changed or
  why the running config stays;
* ``GET /api/tap?dest=…&filter=…&format=json|pretty``: a passive
  :class:`~gateway.tap.Tap` on the matching destinations, streamed as one
  line per message until the client leaves (``gateway tap``);
* ``GET /``: the status page, and its files under ``/static/``.

Any other path is 404 and any other method 405. The endpoint is plain HTTP
without authentication and a tap shows message bodies: keep it on loopback or
a private network.
"""

from __future__ import annotations

import functools
import http
import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import TYPE_CHECKING, Literal

import h11
import orjson
import trio

from .accept import accept_forever
from .logs import Throttled
from .reload import ReloadRefused, reload_file
from .status import StatusTracker, readiness, snapshot
from .tap import stream as stream_tap
from .tap import tap_filter

if TYPE_CHECKING:
    from .runtime import Gateway

__all__ = ["Response", "route", "serve_admin"]

log = logging.getLogger("gateway.admin")

#: Listener name in the metrics' ``listener`` label and in log lines.
NAME = "admin"
#: Seconds a response (or one write of a stream) may take to be written.
WRITE_TIMEOUT = 10.0
#: Seconds a refused connection gets to take its 503 before it is closed regardless.
REFUSE_TIMEOUT = 1.0
#: Bytes of a refused client's request read and dropped while it takes its 503.
REFUSE_DRAIN = 65536
RECEIVE_SIZE = 16384

_REFUSAL_BODY = b"too many admin connections; try again later\n"
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: text/plain\r\n"
    b"content-length: %d\r\n"
    b"connection: close\r\n"
    b"\r\n%s"
) % (len(_REFUSAL_BODY), _REFUSAL_BODY)

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
#: Every response: no MIME sniffing, no framing, no referrer, scripts from here only.
_SECURITY = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'"),
]

Write = Callable[[bytes], Awaitable[None]]


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = _TEXT
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    #: A streamed body: called with a write function, runs until cancelled or done.
    stream: Callable[[Write], Awaitable[None]] | None = None


def _json(status: int, data: object) -> Response:
    return Response(
        status,
        orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n",
        _JSON,
        [(b"cache-control", b"no-store")],
    )


@functools.cache
def _static_files() -> dict[str, tuple[bytes, str]]:
    """The status page's files by name, read once from the package."""
    out: dict[str, tuple[bytes, str]] = {}
    folder = resources.files("gateway") / "static"
    if not folder.is_dir():
        return out
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES and not entry.name.startswith("."):
            out[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return out


def _static(name: str) -> Response:
    found = _static_files().get(name)
    if found is None:
        return Response(404, b"not found\n")
    body, content_type = found
    return Response(200, body, content_type, [(b"cache-control", b"no-cache")])


def route(gateway: Gateway, tracker: StatusTracker | None, method: str, target: str) -> Response:
    """The response to ``method target`` (GET or HEAD; POST /api/reload), without any I/O."""
    path, _, query = target.partition("?")
    if path == "/api/reload":
        if method != "POST":
            return Response(405, b"POST to reload\n", headers=[(b"allow", b"POST")])
        return _reload(gateway)
    if method not in ("GET", "HEAD"):
        return Response(405, b"method not allowed\n", headers=[(b"allow", b"GET, HEAD")])
    if path == "/healthz":
        return Response(200, b"ok\n", headers=[(b"cache-control", b"no-store")])
    if path == "/readyz":
        reasons = readiness(gateway)
        return _json(503 if reasons else 200, {"ready": not reasons, "reasons": reasons})
    if path == "/api/status":
        return _json(200, snapshot(gateway, tracker))
    if path == "/api/tap":
        return _tap(gateway, urllib.parse.parse_qs(query))
    if path in ("/", "/index.html"):
        return _static("status.html")
    if path.startswith("/static/"):
        return _static(path[len("/static/") :])
    return Response(404, b"not found: try /, /api/status, /healthz or /readyz\n")


def _reload(gateway: Gateway) -> Response:
    """Re-read the config file and apply it; the body says what changed or why not."""

    async def run(write: Write) -> None:
        try:
            summary = await reload_file(gateway)
        except ReloadRefused as e:
            await write(orjson.dumps({"reloaded": False, "error": str(e)}) + b"\n")
        else:
            await write(orjson.dumps({"reloaded": True, "changes": summary}) + b"\n")

    return Response(200, content_type=_JSON, stream=run)


def _tap(gateway: Gateway, query: dict[str, list[str]]) -> Response:
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
        tap = gateway.hub.tap(pattern, filter)
        try:
            await stream_tap(tap, write, kind)
        finally:
            gateway.hub.untap(tap)

    content_type = "application/x-ndjson" if kind == "json" else _TEXT
    return Response(200, content_type=content_type, stream=run)


async def serve_admin(
    gateway: Gateway,
    listeners: list[trio.SocketListener],
    *,
    max_connections: int = 16,
    idle_timeout: float = 10.0,
    tracker: StatusTracker | None = None,
) -> None:
    """Answer admin requests on ``listeners`` until cancelled.

    At most ``max_connections`` connections are served at once (a tap holds
    one for as long as it runs); each must send every request within
    ``idle_timeout`` seconds of the previous response (of connecting).
    """
    tracker = tracker or StatusTracker(gateway)
    tracker.sample()  # a baseline: the first snapshot has rates since the start
    metrics = gateway.metrics
    throttled = Throttled(log, suppressed=metrics.log_lines_suppressed)
    refused = metrics.refused_connections.labels(listener=NAME, reason="max_connections")
    serving = 0
    refusing = 0

    def handler(method: str, target: str) -> Response:
        return route(gateway, tracker, method, target)

    async def serve(stream: trio.abc.Stream) -> None:
        nonlocal serving
        try:
            await _serve_connection(stream, handler, idle_timeout)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            pass
        except Exception:  # one request's fault must not stop the endpoint
            log.exception("admin request failed; closing its connection")
        finally:
            serving -= 1
            await trio.aclose_forcefully(stream)

    async def refuse(stream: trio.abc.Stream) -> None:
        nonlocal refusing
        try:
            await _refuse(stream)
        finally:
            refusing -= 1
            await trio.aclose_forcefully(stream)

    try:
        async with trio.open_nursery() as nursery:

            def handle(stream: trio.abc.Stream) -> None:
                nonlocal serving, refusing
                if serving < max_connections:
                    serving += 1
                    nursery.start_soon(serve, stream)
                    return
                refused.inc()
                throttled.warning(
                    f"{NAME}:max_connections",
                    "admin: refusing a connection: %d open (max_connections)",
                    serving,
                )
                if refusing < max_connections:
                    refusing += 1
                    nursery.start_soon(refuse, stream)
                else:
                    nursery.start_soon(trio.aclose_forcefully, stream)

            for listener in listeners:
                nursery.start_soon(
                    functools.partial(
                        accept_forever,
                        listener,
                        handle,
                        name=NAME,
                        log=throttled,
                        errors=metrics.accept_errors,
                    )
                )
    finally:
        throttled.flush()


async def _refuse(stream: trio.abc.Stream) -> None:
    """Answer 503 without reading the request, then linger briefly so the reply survives
    (closing a socket with unread input resets it, and the reset can destroy the 503)."""
    with trio.move_on_after(REFUSE_TIMEOUT):
        try:
            await stream.send_all(_REFUSAL)
            if not isinstance(stream, trio.abc.HalfCloseableStream):
                return
            await stream.send_eof()
            drained = 0
            while drained < REFUSE_DRAIN and (chunk := await stream.receive_some(RECEIVE_SIZE)):
                drained += len(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def _serve_connection(
    stream: trio.abc.Stream, handler: Callable[[str, str], Response], idle_timeout: float
) -> None:
    conn = h11.Connection(h11.SERVER)
    while True:
        try:
            request = await _next_request(stream, conn, idle_timeout)
        except h11.RemoteProtocolError as e:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _send(stream, conn, Response(e.error_status_hint, b"bad request\n"))
            return
        if request is None:  # closed between requests
            return
        method = request.method.decode("ascii", "replace")
        response = handler(method, request.target.decode("ascii", "replace"))
        head = method == "HEAD"
        if response.stream is not None and not head:
            await _send_stream(stream, conn, response)
            return
        await _send(stream, conn, response, head=head)
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            return
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:  # the client had not finished its request
            return


async def _next_request(
    stream: trio.abc.Stream, conn: h11.Connection, timeout: float
) -> h11.Request | None:
    """The next request whose head (and any body) arrived within ``timeout`` seconds.

    None at a clean close; :exc:`trio.TooSlowError` when the time is up.
    """
    request = None
    with trio.fail_after(timeout):
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await stream.receive_some(RECEIVE_SIZE)))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.EndOfMessage):
                return request
            elif isinstance(event, h11.ConnectionClosed):
                return None
            # Data events (a body nobody asked for) are read and dropped.


def _head(response: Response, length: int | None) -> h11.Response:
    headers = [(b"content-type", response.content_type.encode()), *_SECURITY, *response.headers]
    if length is not None:
        headers.append((b"content-length", b"%d" % length))
    if response.status >= 400 and response.status not in (404, 405):
        headers.append((b"connection", b"close"))
    reason = http.HTTPStatus(response.status).phrase.encode()
    return h11.Response(status_code=response.status, headers=headers, reason=reason)


async def _send(
    stream: trio.abc.Stream, conn: h11.Connection, response: Response, *, head: bool = False
) -> None:
    data = conn.send(_head(response, len(response.body)))
    if not head:
        data += conn.send(h11.Data(data=response.body))
    data += conn.send(h11.EndOfMessage())
    with trio.fail_after(WRITE_TIMEOUT):
        await stream.send_all(data)


async def _send_stream(stream: trio.abc.Stream, conn: h11.Connection, response: Response) -> None:
    """Send a streamed response until its producer ends or the client leaves.

    The body is chunked (or ends with the connection, for HTTP/1.0), and the
    connection closes after it. While it runs, the client's side is watched:
    a client that closes its connection ends the stream even when nothing is
    being written.
    """
    assert response.stream is not None
    with trio.fail_after(WRITE_TIMEOUT):
        await stream.send_all(conn.send(_head(response, None)))

    async def write(data: bytes) -> None:
        with trio.fail_after(WRITE_TIMEOUT):
            await stream.send_all(conn.send(h11.Data(data=data)))

    async def watch(cancel: trio.CancelScope) -> None:
        try:
            while await stream.receive_some(RECEIVE_SIZE):
                pass  # nothing more is read on this connection
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        cancel.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        await response.stream(write)
        nursery.cancel_scope.cancel()
    with trio.move_on_after(WRITE_TIMEOUT):
        await stream.send_all(conn.send(h11.EndOfMessage()))
