"""The interop test service ``interchange.test.Echo`` on Interchange's ttrpc server.

It answers exactly as ``ttrpc_go/server.go`` does (same codes, messages, details and
payload bytes), so that the Go client's scenario prints the same lines against both;
keep the two in step. Messages are protobuf's wrapper types (BytesValue, StringValue),
the same ones the Go program uses, so neither side needs generated code:

* ``Echo`` (unary): BytesValue -> the same BytesValue.
* ``Fail`` (unary): StringValue ``"CODE:message"`` -> that status with one detail,
  ``Any(StringValue("detail"))``.
* ``Metadata`` (unary): the request metadata as sorted ``key=value`` lines, keys
  lower-cased, in a StringValue.
* ``Sleep`` (unary): StringValue duration in Go's syntax (``"200ms"``) -> the same
  StringValue after that long; the call's deadline ends it first with
  DEADLINE_EXCEEDED (the server does that when the cancel scope fires).
* ``Count`` (server streaming): BytesValue ``"N"`` -> BytesValue ``"0"``..``"N-1"``;
  ``"N!"`` sends them, then fails with ABORTED.
* ``Sum`` (client streaming): BytesValues -> one BytesValue, the values joined by ``,``.
* ``Chat`` (bidi): each BytesValue back with ASCII letters upper-cased; ``"bye"`` also
  ends the call from the server's side, before the client closes its own.

:func:`serve_echo` serves it on a ``tcp:host:port`` or ``unix:/path`` address, the
address forms the Go program takes.
"""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator
from typing import TypeVar

import trio
from google.protobuf import any_pb2, wrappers_pb2
from google.protobuf.message import DecodeError, Message

from gateway.transports.unix import transport as unix_transport
from protocols.ttrpc import Code, TtrpcError
from protocols.ttrpc.server import CallContext, MessageStream, Service, TtrpcSession

__all__ = ["SERVICE", "echo_service", "parse_go_duration", "serve_echo", "services"]

SERVICE = "interchange.test.Echo"

M = TypeVar("M", bound=Message)

#: One ``number unit`` term of a Go duration (``time.ParseDuration``).
_TERM = re.compile(r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)")
_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_go_duration(text: str) -> float:
    """Seconds in a Go duration string (``"1h2m"``, ``"200ms"``, ``"0"``), as Go's
    ``time.ParseDuration`` reads it; ``ValueError`` for what Go refuses."""
    sign, body = (-1.0, text[1:]) if text[:1] == "-" else (1.0, text.removeprefix("+"))
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total, pos = 0.0, 0
    while pos < len(body):
        match = _TERM.match(body, pos)
        if match is None or match.group(1) in ("", "."):
            raise ValueError(f"invalid duration {text!r}")
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        pos = match.end()
    return sign * total


def _decode(cls: type[M], payload: bytes) -> M:
    """The request message, or INTERNAL as Go's server answers an undecodable one."""
    message = cls()
    try:
        message.ParseFromString(payload)
    except DecodeError as e:
        raise TtrpcError(Code.INTERNAL, f"ttrpc: error unmarshalling payload: {e}")
    return message


def _bytes(value: bytes) -> bytes:
    return wrappers_pb2.BytesValue(value=value).SerializeToString()


async def echo(ctx: CallContext, payload: bytes) -> bytes:
    return _decode(wrappers_pb2.BytesValue, payload).SerializeToString()


async def fail(ctx: CallContext, payload: bytes) -> bytes:
    text, colon, message = _decode(wrappers_pb2.StringValue, payload).value.partition(":")
    # Go: strconv.ParseUint(text, 10, 32), and a code of 0 would be no error at all.
    if not colon or not re.fullmatch(r"[0-9]+", text) or not 0 < int(text) < 2**32:
        raise TtrpcError(Code.INVALID_ARGUMENT, "fail: want CODE:message, CODE > 0")
    detail = any_pb2.Any()
    detail.Pack(wrappers_pb2.StringValue(value="detail"))
    code = int(text)
    # Go's codes.Code is a uint32 that the Status message's int32 code wraps.
    raise TtrpcError(code if code < 2**31 else code - 2**32, message, [detail])


async def metadata(ctx: CallContext, payload: bytes) -> bytes:
    _decode(wrappers_pb2.StringValue, payload)
    lines = sorted(f"{key.lower()}={value}" for key, value in ctx.metadata)
    return wrappers_pb2.StringValue(value="\n".join(lines)).SerializeToString()


async def sleep(ctx: CallContext, payload: bytes) -> bytes:
    request = _decode(wrappers_pb2.StringValue, payload)
    try:
        seconds = parse_go_duration(request.value)
    except ValueError:
        seconds = -1.0
    if seconds < 0:
        raise TtrpcError(Code.INVALID_ARGUMENT, "sleep: bad duration")
    await trio.sleep(seconds)  # the server's cancel scope holds the call's deadline
    return request.SerializeToString()


async def count(ctx: CallContext, payload: bytes, out: MessageStream) -> None:
    text = _decode(wrappers_pb2.BytesValue, payload).value
    abort = text.endswith(b"!")
    text = text.removesuffix(b"!")
    if not re.fullmatch(rb"0|[1-9][0-9]*", text):
        raise TtrpcError(Code.INVALID_ARGUMENT, "count: want a decimal count")
    n = int(text)
    for i in range(n):
        await out.send(_bytes(str(i).encode()))
    if abort:
        raise TtrpcError(Code.ABORTED, f"count: aborted after {n}")


async def sum_(ctx: CallContext, messages: AsyncIterator[bytes]) -> bytes:
    parts = [_decode(wrappers_pb2.BytesValue, m).value async for m in messages]
    return _bytes(b",".join(parts))


async def chat(ctx: CallContext, messages: AsyncIterator[bytes], out: MessageStream) -> None:
    async for m in messages:
        value = _decode(wrappers_pb2.BytesValue, m).value
        # bytes.upper() changes ASCII letters only, as the Go side's asciiUpper does.
        await out.send(_bytes(value.upper()))
        if value == b"bye":
            return


def echo_service() -> Service:
    """The Echo service on Interchange's :class:`~protocols.ttrpc.server.Service` API."""
    service = Service(SERVICE)
    service.unary("Echo", echo)
    service.unary("Fail", fail)
    service.unary("Metadata", metadata)
    service.unary("Sleep", sleep)
    service.server_streaming("Count", count)
    service.client_streaming("Sum", sum_)
    service.bidi("Chat", chat)
    return service


def services() -> dict[str, Service]:
    """The services table a :class:`TtrpcSession` serves: just Echo."""
    service = echo_service()
    return {service.name: service}


async def serve_echo(
    address: str,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve Echo on ``address`` (``tcp:host:port``, port 0 for any, or ``unix:/path``)
    until cancelled; for ``nursery.start``, which returns the address bound, in the
    form the Go program takes (``tcp:127.0.0.1:PORT`` or ``unix:/path``)."""
    table = services()
    if address.startswith("unix:"):
        listeners = await unix_transport.listen(address)
        bound = address
    else:
        host, _, port = address.removeprefix("tcp:").rpartition(":")
        host = host.strip("[]") or "127.0.0.1"
        listeners = await trio.open_tcp_listeners(int(port), host=host)
        sock = listeners[0].socket
        ip, bound_port = sock.getsockname()[:2]
        ip = f"[{ip}]" if sock.family == socket.AF_INET6 else ip
        bound = f"tcp:{ip}:{bound_port}"

    async def handler(stream: trio.SocketStream) -> None:
        await TtrpcSession(stream, table).run()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handler, listeners)
        task_status.started(bound)
        await trio.sleep_forever()
