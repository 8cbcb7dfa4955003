"""A small HTTP/1.1 server for the gateway's own endpoints (metrics, admin).

A thin trio driver over h11 (HTTP's sans-IO state machine): keep-alive, an
idle timeout per request, h11's bound on request heads, a write timeout per
response. An endpoint is a *handler*: ``handler(method, target) -> Response``,
without I/O, or a coroutine function when answering needs some (the
supervisor of ``gateway run --workers N`` asks its workers); a
:class:`Response` may stream its body (a tap). A malformed
request gets 400 and the connection closes; a fault in one request closes
that connection only.

At most ``max_connections`` connections are served at once: each costs a file
descriptor the gateway's listeners may need. A connection beyond the cap is
answered ``503`` at once, without waiting for its request, and closed.
Accepting goes through :func:`~gateway.runtime.accept.accept_forever`, so running out
of file descriptors slows the endpoint down instead of crashing it or
flooding the log.
"""

from __future__ import annotations

import functools
import http
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import h11
import trio
from prometheus_client import Counter

from gateway.ops.loglines import Throttled
from gateway.ops.metrics import Metrics
from gateway.runtime.accept import accept_forever

__all__ = ["Handler", "Response", "Write", "refusal", "serve_http"]

#: Seconds a response (or one write of a stream) may take to be written.
WRITE_TIMEOUT = 10.0
#: Seconds a refused connection gets to take its 503 before it is closed regardless.
REFUSE_TIMEOUT = 1.0
#: Bytes of a refused client's request read and dropped while it takes its 503.
REFUSE_DRAIN = 65536
RECEIVE_SIZE = 16384

_TEXT = "text/plain; charset=utf-8"

Write = Callable[[bytes], Awaitable[None]]
Headers = Sequence[tuple[bytes, bytes]]


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = _TEXT
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    #: A streamed body: called with a write function, runs until cancelled or done.
    stream: Callable[[Write], Awaitable[None]] | None = None


#: What an endpoint answers each request with (a streamed body runs later).
Handler = Callable[[str, str], Response | Awaitable[Response]]


def refusal(body: bytes) -> bytes:
    """The whole ``503`` sent to a connection beyond the cap, before reading its request."""
    return (
        b"HTTP/1.1 503 Service Unavailable\r\n"
        b"content-type: text/plain\r\n"
        b"content-length: %d\r\n"
        b"connection: close\r\n"
        b"\r\n%s"
    ) % (len(body), body)


async def serve_http(
    listeners: Sequence[trio.abc.Listener[trio.abc.Stream]],
    handler: Handler,
    *,
    name: str,
    metrics: Metrics,
    log: logging.Logger,
    refused_with: bytes,
    max_connections: int = 16,
    idle_timeout: float = 10.0,
    headers: Headers = (),
) -> None:
    """Answer requests on ``listeners`` with ``handler`` until cancelled.

    ``name`` labels the metrics (``listener``) and log lines; ``headers`` go
    on every response; ``refused_with`` is the 503 (:func:`refusal`) for a
    connection beyond ``max_connections``. Each connection must send every
    request (the first one too) within ``idle_timeout`` seconds of the
    previous response (of connecting), or it is closed.
    """
    throttled = Throttled(log, suppressed=metrics.log_lines_suppressed)
    try:
        async with trio.open_nursery() as nursery:
            endpoint = _Endpoint(
                nursery,
                handler,
                name=name,
                log=throttled,
                refused=metrics.refused_connections.labels(listener=name, reason="max_connections"),
                refused_with=refused_with,
                max_connections=max_connections,
                idle_timeout=idle_timeout,
                headers=headers,
            )
            for listener in listeners:
                nursery.start_soon(
                    functools.partial(
                        accept_forever,
                        listener,
                        endpoint.handle,
                        name=name,
                        log=throttled,
                        errors=metrics.accept_errors,
                    )
                )
    finally:
        throttled.flush()


@dataclass
class _Endpoint:
    """The connections of one endpoint: served up to the cap, refused with 503 beyond."""

    nursery: trio.Nursery
    handler: Handler
    name: str
    log: Throttled
    #: Counts the connections refused for ``max_connections``.
    refused: Counter
    refused_with: bytes
    max_connections: int
    idle_timeout: float
    headers: Headers
    #: Connections being served now.
    serving: int = 0
    #: Refusals hold a descriptor for up to REFUSE_TIMEOUT: bounded too. Beyond
    #: this many at once, a connection is closed without its 503.
    refusing: int = 0

    def handle(self, stream: trio.abc.Stream) -> None:
        """Serve ``stream``, or refuse it (the accept loop's decision, made at once)."""
        if self.serving < self.max_connections:
            self.serving += 1
            self.nursery.start_soon(self._serve, stream)
            return
        self.refused.inc()
        self.log.warning(
            f"{self.name}:max_connections",
            "%s: refusing a connection: %d open (max_connections)",
            self.name,
            self.serving,
        )
        if self.refusing < self.max_connections:
            self.refusing += 1
            self.nursery.start_soon(self._refuse, stream)
        else:
            self.nursery.start_soon(trio.aclose_forcefully, stream)

    async def _serve(self, stream: trio.abc.Stream) -> None:
        try:
            await _serve_connection(stream, self.handler, self.idle_timeout, self.headers)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            pass
        except Exception:  # one request's fault must not stop the endpoint
            self.log.logger.exception("%s request failed; closing its connection", self.name)
        finally:
            self.serving -= 1
            await trio.aclose_forcefully(stream)

    async def _refuse(self, stream: trio.abc.Stream) -> None:
        try:
            await _refuse(stream, self.refused_with)
        finally:
            self.refusing -= 1
            await trio.aclose_forcefully(stream)


async def _refuse(stream: trio.abc.Stream, answer: bytes) -> None:
    """Answer 503 without reading the request, then linger briefly so the reply survives
    (closing a socket with unread input resets it, and the reset can destroy the 503)."""
    with trio.move_on_after(REFUSE_TIMEOUT):
        try:
            await stream.send_all(answer)
            if not isinstance(stream, trio.abc.HalfCloseableStream):
                return
            await stream.send_eof()
            drained = 0
            while drained < REFUSE_DRAIN and (chunk := await stream.receive_some(RECEIVE_SIZE)):
                drained += len(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


async def _serve_connection(
    stream: trio.abc.Stream, handler: Handler, idle_timeout: float, headers: Headers
) -> None:
    conn = h11.Connection(h11.SERVER)
    while True:
        try:
            request = await _next_request(stream, conn, idle_timeout)
        except h11.RemoteProtocolError as e:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _send(stream, conn, Response(e.error_status_hint, b"bad request\n"), headers)
            return
        if request is None:  # closed between requests
            return
        method = request.method.decode("ascii", "replace")
        answer = handler(method, request.target.decode("ascii", "replace"))
        response = answer if isinstance(answer, Response) else await answer
        head = method == "HEAD"
        if response.stream is not None and not head:
            await _send_stream(stream, conn, response, headers)
            return
        await _send(stream, conn, response, headers, head=head)
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


def _head(response: Response, length: int | None, extra: Headers) -> h11.Response:
    headers = [(b"content-type", response.content_type.encode()), *extra, *response.headers]
    if length is not None:
        headers.append((b"content-length", b"%d" % length))
    if response.status >= 400 and response.status not in (404, 405):
        headers.append((b"connection", b"close"))
    reason = http.HTTPStatus(response.status).phrase.encode()
    return h11.Response(status_code=response.status, headers=headers, reason=reason)


async def _send(
    stream: trio.abc.Stream,
    conn: h11.Connection,
    response: Response,
    headers: Headers,
    *,
    head: bool = False,
) -> None:
    data = conn.send(_head(response, len(response.body), headers))
    if not head:
        data += conn.send(h11.Data(data=response.body))
    data += conn.send(h11.EndOfMessage())
    with trio.fail_after(WRITE_TIMEOUT):
        await stream.send_all(data)


async def _send_stream(
    stream: trio.abc.Stream, conn: h11.Connection, response: Response, headers: Headers
) -> None:
    """Send a streamed response until its producer ends or the client leaves.

    The body is chunked (or ends with the connection, for HTTP/1.0), and the
    connection closes after it. While it runs, the client's side is watched:
    a client that closes its connection ends the stream even when nothing is
    being written.
    """
    assert response.stream is not None
    with trio.fail_after(WRITE_TIMEOUT):
        await stream.send_all(conn.send(_head(response, None, headers)))

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
