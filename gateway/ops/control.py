"""The control channel between the supervisor of ``gateway run --workers N`` and a worker.

A worker serves no ``[admin]`` or ``[metrics]`` endpoint of its own: the
supervisor serves them for the whole gateway, and asks each worker for what
they show over a channel (a socket pair the supervisor made, one end passed
to the worker). The supervisor asks, the worker answers, one request at a
time:

- a request is one line of ASCII: ``snapshot``, ``reload``, ``tap QUERY``
  (admin channel) or ``metrics`` (metrics channel);
- an answer is its length (4 bytes, big-endian) then its bytes: a snapshot's
  :meth:`~gateway.ops.view.GatewaySnapshot.to_json` as JSON, the reload's
  result as JSON (``{"reloaded": …, "changes" | "error": …}``, as
  ``POST /api/reload`` answers), the Prometheus exposition.

A tap (``GET /api/tap`` on the supervisor) outlives its request: the
supervisor makes a fresh socket pair and passes one end with the request
(``SCM_RIGHTS``); ``QUERY`` is JSON (``dest``, ``filter``, ``format``). The
worker answers ``{"tapping": true}`` (or ``{"error": …}``) at once, then
writes the tap's lines to that end until the supervisor closes its own (the
HTTP client left) or the worker stops. The channel stays free for other
requests meanwhile.

An unknown request is answered with an empty body. The channel ends when
either side closes it (the supervisor is gone, the worker exits).
"""

from __future__ import annotations

import array
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import orjson
import trio

from gateway.ops.admin import Admin
from gateway.ops.metrics import Metrics
from gateway.ops.reload import ReloadRefused, reload_file
from gateway.ops.tap import Tap, Tappable, stream, tap_filter

__all__ = ["Answer", "Request", "admin_answers", "ask", "metrics_answers", "serve_channel"]

log = logging.getLogger("gateway.control")

#: The longest request line read (a tap's carries its filter).
MAX_REQUEST = 16 * 1024
#: The most descriptors one request may carry.
MAX_FDS = 4
_LENGTH = struct.Struct(">I")


@dataclass
class Request:
    """One request as a worker reads it."""

    line: str
    #: Where a request that goes on after its answer runs (a tap).
    nursery: trio.Nursery
    #: Descriptors passed with it (a tap's end of its socket pair), now the answer's.
    fds: list[int] = field(default_factory=list)


#: What a worker answers a request with.
Answer = Callable[[Request], Awaitable[bytes]]


async def ask(stream: trio.abc.Stream, request: str, fds: list[int] | None = None) -> bytes:
    """Send ``request`` (with ``fds``, over a socket) and read its answer; the caller
    bounds the time and serialises."""
    data = request.encode("ascii") + b"\n"
    if fds:
        assert isinstance(stream, trio.SocketStream), "descriptors pass over a unix socket"
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sent = await stream.socket.sendmsg([data], rights)
        data = data[sent:]
    if data:
        await stream.send_all(data)
    head = await _read_exactly(stream, _LENGTH.size)
    (length,) = _LENGTH.unpack(head)
    return await _read_exactly(stream, length)


async def _read_exactly(stream: trio.abc.Stream, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = await stream.receive_some(n - len(data))
        if not chunk:
            raise trio.BrokenResourceError("the control channel closed")
        data += chunk
    return bytes(data)


async def serve_channel(channel: trio.abc.Stream, answer: Answer) -> None:
    """Answer the requests arriving on ``channel`` until it closes (which ends the taps
    the requests started)."""
    buffer = b""
    fds: list[int] = []
    try:
        async with trio.open_nursery() as nursery:
            while True:
                while b"\n" not in buffer:
                    chunk = await _receive(channel, fds)
                    if not chunk or len(buffer) > MAX_REQUEST:
                        nursery.cancel_scope.cancel()
                        return
                    buffer += chunk
                line, _, buffer = buffer.partition(b"\n")
                request = Request(line.decode("ascii", "replace").strip(), nursery, fds)
                fds = []
                body = await answer(request)
                await channel.send_all(_LENGTH.pack(len(body)) + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        for fd in fds:
            _close_quietly(fd)
        await trio.aclose_forcefully(channel)


async def _receive(channel: trio.abc.Stream, fds: list[int]) -> bytes:
    """Some bytes of ``channel``; descriptors passed with them are added to ``fds``."""
    if not isinstance(channel, trio.SocketStream):
        return bytes(await channel.receive_some(MAX_REQUEST))
    space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
    data, ancillary, _, _ = await channel.socket.recvmsg(MAX_REQUEST, space)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            passed = array.array("i")
            passed.frombytes(payload[: len(payload) - len(payload) % passed.itemsize])
            fds.extend(passed)
    return bytes(data)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        socket.close(fd)


def admin_answers(admin: Admin) -> Answer:
    """A worker's answers on its admin channel: its snapshot, its reload, its taps."""

    async def answer(request: Request) -> bytes:
        word, _, rest = request.line.partition(" ")
        if word == "snapshot":
            return orjson.dumps(admin.view.snapshot().to_json())
        if word == "reload":
            try:
                changes = await reload_file(admin.reloader, via="POST /api/reload")
            except ReloadRefused as e:
                return orjson.dumps({"reloaded": False, "error": str(e)})
            return orjson.dumps({"reloaded": True, "changes": changes})
        if word == "tap":
            return _start_tap(admin.taps, rest, request)
        log.warning("control channel: unknown request %r", request.line[:40])
        for fd in request.fds:
            _close_quietly(fd)
        return b""

    return answer


def _start_tap(taps: Tappable, query: str, request: Request) -> bytes:
    """Start streaming a tap into the socket passed with ``request``; the answer."""
    fds, request.fds = request.fds, []
    for fd in fds[1:]:
        _close_quietly(fd)
    try:
        if not fds:
            raise ValueError("a tap needs the socket to write to")
        asked = orjson.loads(query)
        fmt: Literal["json", "pretty"] = "pretty" if asked.get("format") == "pretty" else "json"
        filter = tap_filter(asked.get("filter"))
        pattern = str(asked["dest"])
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        for fd in fds[:1]:
            _close_quietly(fd)
        return orjson.dumps({"error": f"tap: {e}"})
    sock = socket.socket(fileno=fds[0])
    out = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    tap = taps.tap(pattern, filter)
    request.nursery.start_soon(_feed_tap, taps, tap, out, fmt)
    return orjson.dumps({"tapping": True})


async def _feed_tap(
    taps: Tappable, tap: Tap, out: trio.SocketStream, fmt: Literal["json", "pretty"]
) -> None:
    """Write ``tap``'s lines to ``out`` until the supervisor closes its end."""
    log.info("tap on %r for the supervisor: started", tap.pattern)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_closed, out, nursery.cancel_scope)
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream(tap, out.send_all, fmt)
            nursery.cancel_scope.cancel()
    finally:
        taps.untap(tap)
        await trio.aclose_forcefully(out)
        log.info("tap on %r ended (%d seen, %d dropped)", tap.pattern, tap.seen, tap.dropped)


async def _until_closed(out: trio.SocketStream, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once the reader closed its end (it never writes)."""
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while await out.receive_some(1024):
            pass
    scope.cancel()


def metrics_answers(metrics: Metrics) -> Answer:
    """A worker's answers on its metrics channel: its exposition."""

    async def answer(request: Request) -> bytes:
        return metrics.exposition() if request.line == "metrics" else b""

    return answer
