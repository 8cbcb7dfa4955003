"""The stream a protocol's driver is given: the accepted one, counted and guarded."""

from __future__ import annotations

import trio

from gateway.ops.metrics import Tally
from gateway.protocol.guard import Guard
from gateway.protocol.plugin import ServerConnection
from gateway.transports.nowait import NowaitSender, nowait_sender

__all__ = ["TrackedStream"]


class TrackedStream(trio.abc.Stream):
    """Passes everything through, counting bytes; carries the connection's :class:`Guard`.

    Until the protocol's driver reports progress itself (a
    :class:`~gateway.sdk.Session` does), every transfer counts as
    activity for the idle timeout, as a plugin of its own may expect.
    """

    def __init__(self, inner: trio.abc.Stream, received: Tally, sent: Tally, guard: Guard) -> None:
        self.inner = inner
        #: trio's name for the stream under a layer (the hang-up probe follows it).
        self.transport_stream = inner
        self.guard = guard
        self.conn: ServerConnection | None = None
        self._received = received
        self._sent = sent
        #: Bytes of this connection, for its closing log line.
        self.bytes_in = 0
        self.bytes_out = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self._received.inc(len(data))
        self.bytes_in += len(data)
        if self.conn is not None and not self.guard.reports_progress:
            self.conn.touch()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)
        self._count_sent(len(data))

    def nowait_sender(self) -> NowaitSender | None:
        """The inner stream's way to write without waiting, counting what it writes."""
        inner = nowait_sender(self.inner)
        if inner is None:
            return None

        def send(data: bytes | bytearray | memoryview) -> int:
            sent = inner(data)
            if sent:
                self._count_sent(sent)
            return sent

        return send

    def _count_sent(self, n: int) -> None:
        self._sent.inc(n)
        self.bytes_out += n
        if self.conn is not None and not self.guard.reports_progress:
            self.conn.touch()

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        send_eof = getattr(self.inner, "send_eof", None)
        if send_eof is not None:
            await send_eof()

    async def aclose(self) -> None:
        await self.inner.aclose()
