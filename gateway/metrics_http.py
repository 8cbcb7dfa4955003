"""The metrics endpoint: ``GET /metrics`` over HTTP/1.1, for Prometheus to scrape.

A thin trio driver over h11 (HTTP's sans-IO state machine), with keep-alive,
a read timeout per request and h11's bound on request heads. Any other path is
404 and any other method 405; a malformed request gets 400 and the connection
closes. A fault in one scrape closes that connection only.
"""

from __future__ import annotations

import logging

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST

from .metrics import Metrics

__all__ = ["serve_metrics"]

log = logging.getLogger("gateway.metrics")

PATH = b"/metrics"
#: Seconds a client has to send each request (and the first one after connecting).
READ_TIMEOUT = 10.0
RECEIVE_SIZE = 16384


async def serve_metrics(metrics: Metrics, listeners: list[trio.SocketListener]) -> None:
    """Answer scrapes on ``listeners`` until cancelled."""

    async def handle(stream: trio.SocketStream) -> None:
        try:
            await _serve_connection(stream, metrics)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            pass
        except Exception:  # one scrape's fault must not stop the endpoint
            log.exception("metrics request failed; closing its connection")
        finally:
            await trio.aclose_forcefully(stream)

    await trio.serve_listeners(handle, listeners)


async def _serve_connection(stream: trio.abc.Stream, metrics: Metrics) -> None:
    conn = h11.Connection(h11.SERVER)
    while True:
        try:
            request = await _next_request(stream, conn)
        except h11.RemoteProtocolError as e:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _respond(stream, conn, e.error_status_hint, b"bad request\n", b"text/plain")
            return
        if request is None:  # closed between requests
            return
        if request.method not in (b"GET", b"HEAD"):
            await _respond(stream, conn, 405, b"method not allowed\n", b"text/plain", allow=True)
        elif request.target.split(b"?", 1)[0] != PATH:
            await _respond(stream, conn, 404, b"not found: try /metrics\n", b"text/plain")
        else:
            body = metrics.exposition()
            content_type = CONTENT_TYPE_LATEST.encode()
            await _respond(stream, conn, 200, body, content_type, head=request.method == b"HEAD")
        if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
            return
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:  # the client had not finished its request
            return


async def _next_request(stream: trio.abc.Stream, conn: h11.Connection) -> h11.Request | None:
    """The next request whose head (and any body) has arrived; None at a clean close."""
    request = None
    with trio.fail_after(READ_TIMEOUT):
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


async def _respond(
    stream: trio.abc.Stream,
    conn: h11.Connection,
    status: int,
    body: bytes,
    content_type: bytes,
    *,
    head: bool = False,
    allow: bool = False,
) -> None:
    headers = [(b"content-type", content_type), (b"content-length", b"%d" % len(body))]
    if allow:
        headers.append((b"allow", b"GET, HEAD"))
    if status >= 400 and status != 404 and status != 405:
        headers.append((b"connection", b"close"))
    data = conn.send(h11.Response(status_code=status, headers=headers))
    if not head:
        data += conn.send(h11.Data(data=body))
    data += conn.send(h11.EndOfMessage())
    with trio.fail_after(READ_TIMEOUT):
        await stream.send_all(data)
