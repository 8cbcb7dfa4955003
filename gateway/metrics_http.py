"""The metrics endpoint: ``GET /metrics`` over HTTP/1.1, for Prometheus to scrape.

A thin trio driver over h11 (HTTP's sans-IO state machine), with keep-alive,
an idle timeout per request and h11's bound on request heads. Any other path is
404 and any other method 405; a malformed request gets 400 and the connection
closes. A fault in one scrape closes that connection only.

The endpoint holds at most ``max_connections`` connections: a scraper needs
one, and each connection costs a file descriptor the gateway's listeners may
need. A connection beyond the cap is answered ``503`` at once, without waiting
for its request, and closed. Accepting goes through
:func:`~gateway.accept.accept_forever`, so running out of file descriptors
slows the endpoint down instead of crashing it or flooding the log.
"""

from __future__ import annotations

import functools
import logging

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST

from .accept import accept_forever
from .logs import Throttled
from .metrics import Metrics

__all__ = ["serve_metrics"]

log = logging.getLogger("gateway.metrics")

PATH = b"/metrics"
#: Listener name in the metrics' ``listener`` label and in log lines.
NAME = "metrics"
#: Seconds a response may take to be written (a client that does not read it is dropped).
WRITE_TIMEOUT = 10.0
#: Seconds a refused connection gets to take its 503 before it is closed regardless.
REFUSE_TIMEOUT = 1.0
#: Bytes of a refused client's request read and dropped while it takes its 503: a
#: socket closed with unread input is reset, and the reset can destroy the 503.
REFUSE_DRAIN = 65536
RECEIVE_SIZE = 16384

_REFUSAL_BODY = b"too many metrics connections; try again later\n"
_REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\n"
    b"content-type: text/plain\r\n"
    b"content-length: %d\r\n"
    b"connection: close\r\n"
    b"\r\n%s"
) % (len(_REFUSAL_BODY), _REFUSAL_BODY)


async def serve_metrics(
    metrics: Metrics,
    listeners: list[trio.SocketListener],
    *,
    max_connections: int = 16,
    idle_timeout: float = 10.0,
) -> None:
    """Answer scrapes on ``listeners`` until cancelled.

    At most ``max_connections`` connections are served at once; each must send
    every request (the first one too) within ``idle_timeout`` seconds of the
    previous response (of connecting), or it is closed.
    """
    throttled = Throttled(log, suppressed=metrics.log_lines_suppressed)
    refused = metrics.refused_connections.labels(listener=NAME, reason="max_connections")
    serving = 0
    # Refusals hold a descriptor for up to REFUSE_TIMEOUT: bounded too. Beyond
    # this many at once, a connection is closed without its 503.
    refusing = 0

    async def serve(stream: trio.abc.Stream) -> None:
        nonlocal serving
        try:
            await _serve_connection(stream, metrics, idle_timeout)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            pass
        except Exception:  # one scrape's fault must not stop the endpoint
            log.exception("metrics request failed; closing its connection")
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
                    "metrics: refusing a connection: %d open (max_connections)",
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
    """Answer 503 without reading the request, then linger briefly so the reply survives.

    Closing a socket whose input was not read resets the connection, and a
    client may then lose the 503 it was sent; so after the reply, the write side
    is shut and whatever the client sends is read and dropped until it closes,
    REFUSE_DRAIN bytes have come or REFUSE_TIMEOUT has passed.
    """
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


async def _serve_connection(stream: trio.abc.Stream, metrics: Metrics, idle_timeout: float) -> None:
    conn = h11.Connection(h11.SERVER)
    while True:
        try:
            request = await _next_request(stream, conn, idle_timeout)
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


async def _next_request(
    stream: trio.abc.Stream, conn: h11.Connection, timeout: float
) -> h11.Request | None:
    """The next request whose head (and any body) has arrived within ``timeout`` seconds.

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
    with trio.fail_after(WRITE_TIMEOUT):
        await stream.send_all(data)
