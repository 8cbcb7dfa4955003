"""A ttrpc client over trio: concurrent calls of the four kinds on one connection.

``open_client(address)`` connects (``host:port`` or ``unix:/path``, or a
stream of one's own) and yields a :class:`Client`. Its calls share the
connection, each on a stream of its own, as Go's client does; replies come
in whatever order the server finishes them.

* :meth:`Client.call`: a unary call, request bytes in, response bytes out;
* :meth:`Client.stream`: a streaming call as an async context manager
  (:class:`ClientCall`): ``send`` / ``close_send`` messages, iterate over the
  server's messages, ``response()`` for a client-streaming call's answer.

A call's deadline is ``timeout`` seconds, or else the caller's own trio
deadline (``trio.current_effective_deadline``): sent as ``timeout_nano`` so
the server stops too, and kept locally so that a server that never answers
cannot hold the caller. Either way a call that runs out fails with
DEADLINE_EXCEEDED "context deadline exceeded" as Go's does. Metadata is
sent with every kind of call. A failed call raises
:class:`~protocols.ttrpc.status.TtrpcError` with code, message and
details; a lost connection fails every call on it with UNAVAILABLE
"ttrpc: closed" (Go's ``ErrClosed``). A connection does not reconnect: open
another.

ttrpc has no flow control, so a streaming call's inbound messages wait in a
bounded queue of their own: a caller that leaves ``max_inbound`` unread for
over ``INBOUND_WAIT`` loses that call (RESOURCE_EXHAUSTED); the connection's
reader waits no longer than that, so the other calls go on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from gateway.sdk import Session, tcp_transport, unix_transport

from .codec import CallKind, ClientCodec
from .events import Reply, StreamMessage
from .status import Code, Status, TtrpcError, deadline_exceeded

__all__ = ["CallKind", "Client", "ClientCall", "Metadata", "open_client"]

#: Messages a streaming call may have waiting to be read before it fails.
MAX_INBOUND = 256
#: Seconds a full queue may stay full (the connection's reader waiting) before its call fails.
INBOUND_WAIT = 1.0

#: What a call's metadata may be: a mapping (a value may be a list of values),
#: or ``(key, value)`` pairs in the order they are sent.
Metadata = Mapping[str, str | Sequence[str]] | Iterable[tuple[str, str]]


def _pairs(metadata: Metadata | None) -> list[tuple[str, str]]:
    if metadata is None:
        return []
    if isinstance(metadata, Mapping):
        pairs = []
        for key, value in metadata.items():
            if isinstance(value, str):
                pairs.append((key, value))
            else:
                pairs.extend((key, v) for v in value)
        return pairs
    return list(metadata)


def closed() -> TtrpcError:
    """What calls on a connection that is gone fail with (Go's ``ErrClosed``)."""
    return TtrpcError(Code.UNAVAILABLE, "ttrpc: closed")


class ClientCall:
    """One call in progress, as :meth:`Client.stream` hands it out."""

    def __init__(self, client: Client, kind: CallKind, deadline: float) -> None:
        self._client = client
        self.kind = kind
        self.stream_id = 0
        #: trio time by which the call must end (inf: none).
        self.deadline = deadline
        self._send: trio.MemorySendChannel[bytes] | None = None
        self._inbound: trio.MemoryReceiveChannel[bytes] | None = None
        if kind is not CallKind.UNARY:  # a unary call's reply is its only message
            self._send, self._inbound = trio.open_memory_channel(client.max_inbound)
        self._ended = trio.Event()
        self._status: Status | None = None
        self._payload: bytes | None = None

    # -- what the connection's reader does --------------------------------------------
    async def _message(self, data: bytes) -> None:
        assert self._send is not None, "the codec gives no messages to unary calls"
        try:
            self._send.send_nowait(data)
            return
        except trio.WouldBlock:
            pass
        with trio.move_on_after(INBOUND_WAIT):  # a burst: the reader waits a little
            try:
                await self._send.send(data)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                pass
            return
        if self._status is None:
            self._client._abandon(self.stream_id)
            self._end(
                Status(
                    Code.RESOURCE_EXHAUSTED,
                    f"more than {self._client.max_inbound} messages waiting on stream"
                    f" {self.stream_id}",
                ),
                None,
            )

    def _end(self, status: Status, payload: bytes | None) -> None:
        if self._status is None:
            self._status, self._payload = status, payload
            if self._send is not None:
                self._send.close()
            self._ended.set()

    # -- the caller's side ---------------------------------------------------------------
    @property
    def status(self) -> Status | None:
        """How the call ended (None while it runs)."""
        return self._status

    async def send(self, data: bytes) -> None:
        """Send one message (client-streaming and bidi calls); raises if the call ended."""
        self._raise_if_ended()
        await self._client._write(self, lambda codec: codec.send(self.stream_id, data))

    async def close_send(self) -> None:
        """Send no more messages: the server's handler sees the end of its input."""
        self._raise_if_ended()
        await self._client._write(self, lambda codec: codec.close_send(self.stream_id))

    async def receive(self) -> bytes:
        """The server's next message; ``trio.EndOfChannel`` once the call ended OK.

        A call that failed raises its :class:`TtrpcError` once the messages
        received before the failure have been read.
        """
        if self._inbound is None:
            raise TypeError("a unary call has no messages: await its response()")
        with trio.move_on_at(self.deadline) as scope:
            try:
                return await self._inbound.receive()
            except trio.EndOfChannel:
                pass
        if scope.cancelled_caught:
            self._expire()
        self._raise_if_failed()
        raise trio.EndOfChannel

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        while True:
            try:
                yield await self.receive()
            except trio.EndOfChannel:
                return

    async def response(self) -> bytes:
        """Wait for the end of the call: the response's payload (client-streaming and
        unary calls; ``b""`` for streams that end without one); raises if it failed."""
        if math.isinf(self.deadline):
            await self._ended.wait()
        else:
            with trio.move_on_at(self.deadline) as scope:
                await self._ended.wait()
            if scope.cancelled_caught:
                self._expire()
        self._raise_if_failed()
        return self._payload or b""

    def _raise_if_failed(self) -> None:
        """The call has ended: raise its error unless it ended OK."""
        status = self._status
        assert status is not None
        if not status.ok:
            raise status.error()

    def _expire(self) -> None:
        self._client._abandon(self.stream_id)
        self._end(deadline_exceeded(), None)
        raise deadline_exceeded().error()

    def _raise_if_ended(self) -> None:
        if self._status is not None:
            raise (self._status if not self._status.ok else _sent_after_end()).error()


def _sent_after_end() -> Status:
    return Status(Code.FAILED_PRECONDITION, "the call has ended: nothing more can be sent")


class _ClientSession(Session):
    """The connection's reader and writer: hands replies to their calls."""

    codec: ClientCodec
    timed_reads = False  # each call has its own deadline

    def __init__(self, stream: trio.abc.Stream, client: Client) -> None:
        super().__init__(
            stream,
            ClientCodec(),
            log=client.log,
            unit_timeout=0,
            linger=0,
            write_timeout=0,
        )
        self.client = client

    async def handle(self, event: object) -> None:
        calls = self.client._calls
        if isinstance(event, StreamMessage):
            call = calls.get(event.stream_id)
            if call is not None:
                await call._message(event.data)
        elif isinstance(event, Reply):
            call = calls.pop(event.stream_id, None)
            if call is not None:
                call._end(event.status, event.payload)


class Client:
    """Calls on one ttrpc connection (made by :func:`open_client`)."""

    def __init__(
        self, stream: trio.abc.Stream, *, max_inbound: int = MAX_INBOUND, log: Any = None
    ) -> None:
        self.log = log or logging.getLogger(__name__)
        self.max_inbound = max_inbound
        self._session = _ClientSession(stream, self)
        self._calls: dict[int, ClientCall] = {}
        #: Why the connection ended (None while it is up).
        self.closed_reason: str | None = None
        self._closed = trio.Event()

    @property
    def is_closed(self) -> bool:
        return self.closed_reason is not None

    @property
    def active_calls(self) -> int:
        return len(self._calls)

    async def _run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the connection until it ends; then every call still waiting fails."""
        reason = "the server closed the connection"
        try:
            task_status.started()
            await self._session.run()
        except* (OSError, trio.BrokenResourceError, trio.ClosedResourceError) as eg:
            reason = str(eg.exceptions[0]) or type(eg.exceptions[0]).__name__
        except* Exception as eg:
            reason = f"{type(eg.exceptions[0]).__name__}: {eg.exceptions[0]}"
            self.log.warning("ttrpc client connection failed: %s", reason)
        finally:
            self._fail_all(reason)

    async def wait_closed(self) -> None:
        """Return once the connection has ended (see :attr:`closed_reason`)."""
        await self._closed.wait()

    def _fail_all(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
        self._closed.set()
        self._session.codec.fail_all()
        calls, self._calls = self._calls, {}
        for call in calls.values():
            call._end(closed().status, None)

    def _abandon(self, stream_id: int) -> None:
        self._calls.pop(stream_id, None)
        self._session.codec.abandon(stream_id)

    async def _write(self, call: ClientCall, frame: Any) -> None:
        """Make a frame of ``call`` (``frame(codec) -> bytes``) once there is room, and
        queue it; DEADLINE_EXCEEDED if there is no room by the call's deadline."""
        session = self._session
        if not await self._room_by(call.deadline):
            call._expire()
        if self.is_closed:
            raise closed()
        session.write(frame(session.codec))

    async def _room_by(self, deadline: float) -> bool:
        """Wait for room in the connection's output until ``deadline``: whether there is.

        (A cancel scope only when there is none now: it costs more than a call.)
        """
        session = self._session
        if session.has_room or math.isinf(deadline):
            await session.wait_for_room()
            return True
        with trio.move_on_at(deadline):
            await session.wait_for_room()
            return True
        return False

    def _deadline(self, timeout: float | None) -> float:
        """The call's trio deadline: ``timeout`` from now, or the caller's own."""
        deadline = trio.current_effective_deadline()
        if timeout is not None:
            deadline = min(deadline, trio.current_time() + timeout)
        return deadline

    async def _start(
        self,
        kind: CallKind,
        service: str,
        method: str,
        payload: bytes,
        timeout: float | None,
        metadata: Metadata | None,
    ) -> ClientCall:
        deadline = self._deadline(timeout)
        call = ClientCall(self, kind, deadline)
        pairs = _pairs(metadata)
        session = self._session
        if not await self._room_by(deadline):
            raise deadline_exceeded().error()
        if self.is_closed:
            raise closed()
        # What is left of the deadline once the Request can go (0: none).
        timeout_nano = 0
        if not math.isinf(deadline):
            timeout_nano = max(1, int((deadline - trio.current_time()) * 1e9))
        # Ids reach the wire in the order they are handed out: no wait in between.
        call.stream_id, wire = session.codec.start(
            kind, service, method, payload, timeout_nano=timeout_nano, metadata=pairs
        )
        self._calls[call.stream_id] = call
        session.write(wire)
        return call

    # -- the API ---------------------------------------------------------------------------
    async def call(
        self,
        service: str,
        method: str,
        payload: bytes = b"",
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
    ) -> bytes:
        """A unary call: the response's payload, or :class:`TtrpcError`."""
        call = await self._start(CallKind.UNARY, service, method, payload, timeout, metadata)
        try:
            return await call.response()
        finally:
            if call.status is None:  # cancelled by the caller: forget it
                self._abandon(call.stream_id)

    @asynccontextmanager
    async def stream(
        self,
        service: str,
        method: str,
        kind: CallKind,
        payload: bytes = b"",
        *,
        timeout: float | None = None,
        metadata: Metadata | None = None,
    ) -> AsyncIterator[ClientCall]:
        """A call of any kind, open for the block's duration.

        ``payload`` is the request of a server-streaming call; client-streaming
        and bidi calls ``send`` theirs. Leaving the block while the call runs
        forgets it (ttrpc has no cancel frame; late frames are dropped).
        """
        call = await self._start(kind, service, method, payload, timeout, metadata)
        try:
            yield call
        finally:
            if call.status is None:
                self._abandon(call.stream_id)

    async def aclose(self) -> None:
        """Close the connection; calls still running fail with UNAVAILABLE."""
        self._fail_all("the client closed the connection")
        self._session.stop()
        await self._session.stream.aclose()


async def connect_stream(address: str) -> trio.abc.Stream:
    """A stream to ``host:port`` (or Go's ``tcp:host:port``) or ``unix:/path``, by the
    gateway's own transports (the same parsing and errors as its upstreams)."""
    if unix_transport.claims(address):
        return await unix_transport.connect(address)
    return await tcp_transport.connect(address.removeprefix("tcp:"))


@asynccontextmanager
async def open_client(
    address: str | trio.abc.Stream, *, max_inbound: int = MAX_INBOUND
) -> AsyncIterator[Client]:
    """A :class:`Client` on a new connection to ``address`` (or on a stream), closed at exit."""
    stream = await connect_stream(address) if isinstance(address, str) else address
    client = Client(stream, max_inbound=max_inbound)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(client._run)
            try:
                yield client
            finally:
                nursery.cancel_scope.cancel()
    finally:
        client._fail_all("the client closed the connection")
        with trio.CancelScope(shield=True):
            await stream.aclose()
