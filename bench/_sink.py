"""A Logstash stand-in that can crash: a Lumberjack server recording each event's number.

The upstream-outage benchmark and the fault suite (``tests/faults``) both
need one: it records every event *before* its window may be acked, so an
event acked upstream and missing here was lost on the way. ``kill()`` ends
it abruptly: the listening socket is closed and every connection is reset
(``SO_LINGER`` 0), windows read but not yet acked included. ``start()``
brings it back on the same port.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Callable

import trio

from gateway.core.errors import ProtocolError
from gateway.core.model import Outcome
from gateway.core.receipts import Receipt
from protocols.lumberjack import Window
from protocols.lumberjack.server import ServerSettings, serve_connection

__all__ = ["KillableSink", "json_number"]

#: What ends a sink's connection without being a fault of the sink.
_GONE = (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


def json_number(payload: bytes) -> int:
    """An event's ``n`` field, wherever it stands in the JSON object."""
    return int(json.loads(payload)["n"])


class KillableSink:
    """A Lumberjack server that records each event's number and then acks its window."""

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        number: Callable[[bytes], int] = json_number,
        ack_delay: float = 0.0,
        keepalive: float = 1.0,
    ) -> None:
        self.nursery = nursery
        #: How an event's number is read from its payload.
        self.number = number
        #: How long a recorded window waits for its ack (so that a kill finds some waiting).
        self.ack_delay = ack_delay
        self.settings = ServerSettings(keepalive=keepalive)
        #: Every event recorded, in arrival order, duplicates included.
        self.received: list[int] = []
        self.port = 0
        self.connections = 0
        self.running = False
        #: Trio time of the first event recorded since the last start.
        self.first_event_at: float | None = None
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()
        self._got_event = trio.Event()

    async def start(self, port: int | None = None) -> int:
        """Listen on ``port`` (default: the previous one, else one the OS picks)."""
        assert not self.running
        port = self.port if port is None else port
        self.port = await self.nursery.start(self._run, port)
        return self.port

    async def _run(self, port: int, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(port, host="127.0.0.1")
        self._stopped = trio.Event()
        self.running = True
        self.first_event_at = None
        try:
            with trio.CancelScope() as self._scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(trio.serve_listeners, self._handle, listeners)
                    task_status.started(int(listeners[0].socket.getsockname()[1]))
        finally:
            for listener in listeners:
                await trio.aclose_forcefully(listener)
            self.running = False
            self._stopped.set()

    async def kill(self) -> None:
        """Close the listener and reset every connection, acked or not."""
        assert self._scope is not None
        self._scope.cancel()
        await self._stopped.wait()

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        # Closing resets the connection (RST), as a crashed process's sockets would.
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        async def ack_later(receipt: Receipt) -> None:
            await trio.sleep(self.ack_delay)
            receipt.settle(0, Outcome.DELIVERED)

        async def sink(window: Window) -> Receipt:
            for _, payload in window.events:
                assert isinstance(payload, bytes)
                self.received.append(self.number(payload))
            if window.events and self.first_event_at is None:
                self.first_event_at = trio.current_time()
            self._got_event.set()
            # Recorded: only now may the window be acked.
            if not self.ack_delay:
                return Receipt.settled(Outcome.DELIVERED)
            receipt = Receipt(1)
            receipt.add_legs()
            receipt.seal()
            acks.start_soon(ack_later, receipt)
            return receipt

        try:
            async with trio.open_nursery() as acks:
                await serve_connection(stream, sink, self.settings)
                acks.cancel_scope.cancel()
        except* (*_GONE, ProtocolError):
            pass  # the peer went away (or this sink was killed)
        finally:
            await trio.aclose_forcefully(stream)

    async def wait_first_event(self) -> float:
        """Wait for the first event since the last start; its trio time."""
        while self.first_event_at is None:
            self._got_event = trio.Event()
            await self._got_event.wait()
        return self.first_event_at
