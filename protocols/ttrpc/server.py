"""A ttrpc server over trio: services of async handlers, one task per call.

Register handlers on a :class:`Service` (by full protobuf service name) and
serve a connection with :class:`TtrpcSession` (the protocol toolkit's
:class:`~gateway.sdk.Session` driving :class:`~.codec.ServerCodec`). Each
call runs in a task of its own, so calls on one connection run concurrently
and their replies go out in completion order, as Go's server does. A call's
inbound messages wait in a bounded queue of their own; a burst larger than
the queue pauses the connection's reading while the handler makes room, and
a handler that leaves it full for ``INBOUND_WAIT`` fails its call alone with
RESOURCE_EXHAUSTED (Go's main branch does the same; 1.2.4 blocks the
connection for as long as it takes). ``timeout_nano`` becomes the handler's
deadline: DEADLINE_EXCEEDED "context deadline exceeded" when it passes.

Handlers take and return bytes (the messages' serialized form); they raise
:class:`TtrpcError` for a status of their choice. Any other exception is
UNKNOWN with its text, as Go does with a plain error.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from gateway.sdk import Session

from . import status as statuses
from .codec import CallKind, ServerCodec, StreamState
from .events import BadInput, Call, HalfClosed, Message
from .status import Code, Status, TtrpcError

__all__ = ["CallContext", "MessageStream", "Method", "Service", "TtrpcSession"]

log = logging.getLogger(__name__)

#: Inbound messages a call may have waiting before it fails (Go 1.2.4 buffers 5,
#: main 64 for client-streaming methods).
INBOUND_MESSAGES = 64
#: Seconds a handler has to make room in its full queue before its call fails (as
#: Go's main branch waits); the connection's reading pauses meanwhile.
INBOUND_WAIT = 1.0

#: Calls one connection may run at once, by default (Go sets no limit).
MAX_CALLS = 1024

Unary = Callable[["CallContext", bytes], Awaitable[bytes]]
ServerStreaming = Callable[["CallContext", bytes, "MessageStream"], Awaitable[None]]
ClientStreaming = Callable[["CallContext", AsyncIterator[bytes]], Awaitable[bytes]]
Bidi = Callable[["CallContext", AsyncIterator[bytes], "MessageStream"], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class CallContext:
    """What a handler knows of its call."""

    service: str
    method: str
    #: Metadata as received: keys as sent, duplicates and their order kept.
    metadata: tuple[tuple[str, str], ...]
    #: trio time by which the call must end (inf: none).
    deadline: float

    def get(self, key: str) -> list[str]:
        """The values of ``key``, its case ignored (Go lower-cases keys it sets)."""
        key = key.lower()
        return [v for k, v in self.metadata if k.lower() == key]


@dataclass(frozen=True, slots=True)
class Method:
    kind: CallKind
    handler: Callable[..., Awaitable[Any]]


@dataclass
class Service:
    """Handlers of one protobuf service, by method name."""

    name: str
    methods: dict[str, Method] = field(default_factory=dict)

    def unary(self, method: str, handler: Unary) -> None:
        self.methods[method] = Method(CallKind.UNARY, handler)

    def server_streaming(self, method: str, handler: ServerStreaming) -> None:
        self.methods[method] = Method(CallKind.SERVER_STREAMING, handler)

    def client_streaming(self, method: str, handler: ClientStreaming) -> None:
        self.methods[method] = Method(CallKind.CLIENT_STREAMING, handler)

    def bidi(self, method: str, handler: Bidi) -> None:
        self.methods[method] = Method(CallKind.BIDI, handler)


class MessageStream:
    """A streaming call's way back to the client."""

    def __init__(self, session: TtrpcSession, stream_id: int) -> None:
        self._session = session
        self._sid = stream_id

    async def send(self, data: bytes) -> None:
        """One message (waits while the connection's output is over its high water)."""
        await self._session.write_when_room(self._session.codec.send_data(self._sid, data))

    async def flush(self) -> None:
        """Wait until what was sent so far has been handed to the socket (not merely
        queued): before treating it as delivered."""
        await self._session.flush()


@dataclass
class _Active:
    scope: trio.CancelScope
    inbound: trio.MemorySendChannel[bytes] | None
    messages: trio.MemoryReceiveChannel[bytes] | None
    #: Set when the call failed for a reason of the connection's (oversize, overflow).
    failed: Status | None = None


class TtrpcSession(Session):
    """One ttrpc connection, server side, for ``services`` (by full name)."""

    codec: ServerCodec
    read_while_draining = True  # streaming calls still need their messages
    timed_reads = False  # a ttrpc peer owes us nothing by a deadline

    def __init__(
        self,
        stream: trio.abc.Stream,
        services: dict[str, Service],
        *,
        max_calls: int = MAX_CALLS,
        codec: ServerCodec | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("log", log)
        kwargs.setdefault("unit_timeout", 0)
        super().__init__(stream, codec if codec is not None else ServerCodec(), **kwargs)
        self.services = services
        #: Calls one connection may run at once; more are refused (RESOURCE_EXHAUSTED).
        self.max_calls = max_calls
        self._calls: dict[int, _Active] = {}
        self._draining = False

    def open_calls(self) -> int:
        """Calls this connection has open (its handlers running), for ``max_calls``."""
        return len(self._calls)

    # -- Session hooks -------------------------------------------------------------------
    def busy(self) -> bool:
        return bool(self._calls)

    def draining(self) -> None:
        self._draining = True

    async def handle(self, event: object) -> None:
        if isinstance(event, Call):
            self._call(event)
        elif isinstance(event, Message):
            await self._message(event)
        elif isinstance(event, HalfClosed):
            active = self._calls.get(event.stream_id)
            if active is not None and active.inbound is not None:
                active.inbound.close()
        elif isinstance(event, BadInput):
            self.write(self.codec.reply(event))
            active = self._calls.get(event.stream_id)
            if event.ends_stream and active is not None:
                active.failed = event.status
                active.scope.cancel()

    # -- calls ---------------------------------------------------------------------------
    def _call(self, call: Call) -> None:
        sid, request = call.stream_id, call.request
        service = self.services.get(request.service)
        method = service.methods.get(request.method) if service is not None else None
        if self._draining:
            self._refuse(sid, Status(Code.UNAVAILABLE, "the server is shutting down"))
            return
        if service is None:
            self._refuse(sid, statuses.unknown_service(request.service))
            return
        if method is None:
            self._refuse(sid, statuses.unknown_method(request.method))
            return
        if self.open_calls() >= self.max_calls:
            self._refuse(sid, too_many_calls(self.max_calls))
            return
        timeout = request.timeout_nano
        deadline = trio.current_time() + timeout / 1e9 if timeout else math.inf
        context = CallContext(
            request.service,
            request.method,
            tuple((kv.key, kv.value) for kv in request.metadata),
            deadline,
        )
        inbound: trio.MemorySendChannel[bytes] | None = None
        messages: trio.MemoryReceiveChannel[bytes] | None = None
        if method.kind.client_streams:
            inbound, messages = trio.open_memory_channel[bytes](INBOUND_MESSAGES)
            if not call.client_streams:  # called without messages: none will come
                inbound.close()
        active = _Active(trio.CancelScope(deadline=deadline), inbound, messages)
        self._calls[sid] = active
        self.nursery.start_soon(self._run, sid, method, context, request.payload, active)

    def _refuse(self, sid: int, status: Status) -> None:
        self.write(self.codec.respond(sid, status=status))

    async def _message(self, event: Message) -> None:
        active = self._calls.get(event.stream_id)
        if active is None or active.inbound is None:
            return  # a call that takes no messages, or one that ended meanwhile
        try:
            try:
                active.inbound.send_nowait(event.data)
                return
            except trio.WouldBlock:
                pass
            # A burst read at once: its handler gets INBOUND_WAIT to make room (reading
            # pauses meanwhile); one that does not read fails alone.
            with trio.move_on_after(INBOUND_WAIT):
                await active.inbound.send(event.data)
                return
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            return
        active.failed = Status(
            Code.RESOURCE_EXHAUSTED,
            f"more than {INBOUND_MESSAGES} messages waiting on stream {event.stream_id}",
        )
        active.scope.cancel()

    async def _run(
        self, sid: int, method: Method, context: CallContext, payload: bytes, active: _Active
    ) -> None:
        kind = method.kind
        result: bytes | None = None
        status: Status | None = None
        with active.scope:
            try:
                if kind is CallKind.UNARY:
                    result = await method.handler(context, payload)
                elif kind is CallKind.SERVER_STREAMING:
                    await method.handler(context, payload, MessageStream(self, sid))
                elif kind is CallKind.CLIENT_STREAMING:
                    result = await method.handler(context, active.messages)
                else:
                    await method.handler(context, active.messages, MessageStream(self, sid))
            except TtrpcError as e:
                status = e.status
            except Exception as e:
                status = Status(Code.UNKNOWN, str(e))
        if active.scope.cancelled_caught:
            status = active.failed or statuses.deadline_exceeded()
        del self._calls[sid]
        self.progress()
        if self.codec.stream_state(sid) in (None, StreamState.LOCAL_CLOSED):
            return  # answered already (an oversize frame), or our side is closed
        if status is not None:
            self.write(self.codec.respond(sid, status=status))
        elif kind in (CallKind.UNARY, CallKind.CLIENT_STREAMING):
            self.write(self.codec.respond(sid, result or b""))
        else:
            self.write(self.codec.send_data(sid, None, close=True))


def too_many_calls(limit: int) -> Status:
    """What a call over a connection's limit of concurrent calls is answered."""
    return Status(Code.RESOURCE_EXHAUSTED, f"more than {limit} calls at once on this connection")
