"""The control channel between the supervisor of ``gateway run --workers N`` and a worker.

A worker serves no ``[admin]`` or ``[metrics]`` endpoint of its own: the
supervisor serves them for the whole gateway, and asks each worker for what
they show over a channel (a socket pair the supervisor made, one end passed
to the worker). The supervisor asks, the worker answers, one request at a
time:

- a request is one line of ASCII: ``snapshot``, ``reload`` (admin channel) or
  ``metrics`` (metrics channel);
- an answer is its length (4 bytes, big-endian) then its bytes: a snapshot's
  :meth:`~gateway.ops.view.GatewaySnapshot.to_json` as JSON, the reload's
  result as JSON (``{"reloaded": …, "changes" | "error": …}``, as
  ``POST /api/reload`` answers), the Prometheus exposition.

An unknown request is answered with an empty body. The channel ends when
either side closes it (the supervisor is gone, the worker exits).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable, Callable

import orjson
import trio

from gateway.ops.admin import Admin
from gateway.ops.metrics import Metrics
from gateway.ops.reload import ReloadRefused, reload_file

__all__ = ["Answer", "admin_answers", "ask", "metrics_answers", "serve_channel"]

log = logging.getLogger("gateway.control")

#: What a worker answers a request with.
Answer = Callable[[str], Awaitable[bytes]]
#: The longest request line read.
MAX_REQUEST = 256
_LENGTH = struct.Struct(">I")


async def ask(stream: trio.abc.Stream, request: str) -> bytes:
    """Send ``request`` and read its answer; the caller bounds the time and serialises."""
    await stream.send_all(request.encode("ascii") + b"\n")
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


async def serve_channel(stream: trio.abc.Stream, answer: Answer) -> None:
    """Answer the requests arriving on ``stream`` until it closes."""
    buffer = b""
    try:
        while True:
            while b"\n" not in buffer:
                chunk = await stream.receive_some(MAX_REQUEST)
                if not chunk or len(buffer) > MAX_REQUEST:
                    return
                buffer += chunk
            line, _, buffer = buffer.partition(b"\n")
            body = await answer(line.decode("ascii", "replace").strip())
            await stream.send_all(_LENGTH.pack(len(body)) + body)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        await trio.aclose_forcefully(stream)


def admin_answers(admin: Admin) -> Answer:
    """A worker's answers on its admin channel: its snapshot, its reload."""

    async def answer(request: str) -> bytes:
        if request == "snapshot":
            return orjson.dumps(admin.view.snapshot().to_json())
        if request == "reload":
            try:
                changes = await reload_file(admin.reloader, via="POST /api/reload")
            except ReloadRefused as e:
                return orjson.dumps({"reloaded": False, "error": str(e)})
            return orjson.dumps({"reloaded": True, "changes": changes})
        log.warning("control channel: unknown request %r", request[:40])
        return b""

    return answer


def metrics_answers(metrics: Metrics) -> Answer:
    """A worker's answers on its metrics channel: its exposition."""

    async def answer(request: str) -> bytes:
        return metrics.exposition() if request == "metrics" else b""

    return answer
