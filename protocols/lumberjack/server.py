"""The server role of Lumberjack over a trio stream: windows in, acks out.

One reader task feeds the sans-IO :class:`ServerCodec` and hands each
complete window to a *sink*, which returns a :class:`~gateway.receipts.Receipt`
(the gateway's sink publishes to the hub; the library server's sink waits for
the application). One acker task answers windows strictly in order: a window
is acked with its highest sequence number only once its receipt has settled
as delivered. While the oldest window waits, the acker sends a keepalive
``A 0`` (nothing of this window acked yet) every ``keepalive`` seconds, in
that window's version, so clients' 30 s read timeouts do not fire under
backpressure. A window whose receipt fails, or that never arrived whole, is
never acked: the connection is closed and the client resends it.

Backpressure: the reader stops reading while ``max_pending_windows`` windows
are unacked, or while the sink is waiting (the hub is full). Keepalives go on.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from gateway.errors import RemoteProtocolError
from gateway.model import Outcome
from gateway.receipts import Receipt

from . import NEED_DATA, Ack, ConnectionClosed, Limits, ServerCodec, Window
from .metrics import ServerMetrics

__all__ = ["ServerMetrics", "ServerSettings", "WindowSink", "serve_connection"]

log = logging.getLogger(__name__)

#: Hands a window off; returns the receipt that says when it is safe.
WindowSink = Callable[[Window], Awaitable[Receipt]]
RECEIVE_SIZE = 65536


@dataclass(frozen=True, slots=True)
class ServerSettings:
    limits: Limits = field(default_factory=Limits)
    #: Seconds between keepalive acks while the oldest window waits (DECISIONS §1: 5 s).
    keepalive: float = 5.0
    #: Windows read and not yet acked before reading pauses.
    max_pending_windows: int = 4
    #: Once a window has started, the rest of it must arrive within this (0: no limit).
    window_timeout: float = 30.0
    #: An ack that cannot be written within this closes the connection.
    write_timeout: float = 30.0


class _Pending:
    """A window between hand-off and ack."""

    __slots__ = ("receipt", "received_at", "window")

    def __init__(self, window: Window) -> None:
        self.window = window
        self.receipt: Receipt | None = None
        self.received_at = trio.current_time()


class _Session:
    def __init__(
        self,
        stream: trio.abc.Stream,
        sink: WindowSink,
        settings: ServerSettings,
        logger: logging.Logger | logging.LoggerAdapter,
        on_ack: Callable[[Window], None] | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        self.stream = stream
        self.sink = sink
        self.on_ack = on_ack
        self.metrics = metrics or ServerMetrics()
        self.settings = settings
        self.log = logger
        self.codec = ServerCodec(settings.limits)
        self.pending: deque[_Pending] = deque()
        #: Woken when a window is queued, handed off or settled, or one is acked.
        self.changed = trio.lowlevel.ParkingLot()
        self.finished_reading = False

    def wake(self, *_: object) -> None:
        if self.changed:
            self.changed.unpark_all()

    async def run(self, shutdown: trio.Event | None) -> None:
        async with trio.open_nursery() as nursery:
            reading = trio.CancelScope()
            if shutdown is not None:
                nursery.start_soon(_cancel_when_set, shutdown, reading)
            nursery.start_soon(self.read_until_done, reading)
            # Ends once reading has ended and every handed-off window is answered.
            await self.ack_loop()
            nursery.cancel_scope.cancel()

    async def read_until_done(self, reading: trio.CancelScope) -> None:
        with reading:
            await self.read_loop()
        # The client closed its side, or the gateway is draining: what is in
        # flight still gets its ack (a half-read window is dropped, unacked).
        self.finished_reading = True
        self.wake()

    # -- reading ------------------------------------------------------------------
    async def read_loop(self) -> None:
        codec = self.codec
        window_timer = trio.CancelScope()
        while True:
            if len(self.pending) >= self.settings.max_pending_windows:
                paused = trio.current_time()
                while len(self.pending) >= self.settings.max_pending_windows:
                    await self.changed.park()
                # Our own pause is not the client's slowness.
                window_timer.deadline += trio.current_time() - paused
            with window_timer:
                data = await self.stream.receive_some(RECEIVE_SIZE)
            if window_timer.cancelled_caught:
                raise trio.TooSlowError(
                    f"a window took longer than {self.settings.window_timeout:g}s to arrive"
                )
            codec.receive_data(data)
            while True:
                inflated = codec.inflated_bytes
                event = codec.next_event()  # RemoteProtocolError closes the connection
                if codec.inflated_bytes > inflated:
                    self.metrics.inflated_bytes.inc(codec.inflated_bytes - inflated)
                if event is NEED_DATA:
                    break
                if isinstance(event, ConnectionClosed):
                    return
                assert isinstance(event, Window)
                self.metrics.windows.inc()
                if event.events:
                    self.metrics.events.inc(len(event.events))
                await self.hand_off(event)
            window_timer = self._window_timer()

    def _window_timer(self) -> trio.CancelScope:
        """A deadline while a window is partly received; none between windows."""
        timeout = self.settings.window_timeout
        if timeout and self.codec.in_window:
            return trio.CancelScope(deadline=trio.current_time() + timeout)
        return trio.CancelScope()

    async def hand_off(self, window: Window) -> None:
        item = _Pending(window)
        # Queued before the hand-off so that keepalives flow while the sink waits.
        self.pending.append(item)
        self.wake()
        item.receipt = await self.sink(window)
        item.receipt.add_done_callback(self.wake)
        self.wake()

    # -- acking -------------------------------------------------------------------
    async def ack_loop(self) -> None:
        keepalive = self.settings.keepalive
        # When the last frame went out; keepalives are due ``keepalive`` after it,
        # however often other windows come and go meanwhile.
        last_sent = trio.current_time()
        while True:
            if not self.pending:
                if self.finished_reading:
                    return
                await self.changed.park()
                last_sent = trio.current_time()
                continue
            head = self.pending[0]
            receipt = head.receipt
            if receipt is not None and receipt.done():
                self.pending.popleft()
                self.wake()
                if receipt.outcome is not Outcome.DELIVERED:
                    self.metrics.refused_windows.inc()
                    raise _NotAccepted(head.window, receipt)
                # Counted as the ack goes out, so that whoever reads it sees it counted.
                self.metrics.ack_latency.observe(trio.current_time() - head.received_at)
                await self.send(Ack(head.window.version, head.window.highest_seq))
                if self.on_ack is not None:
                    self.on_ack(head.window)
                last_sent = trio.current_time()
                continue
            with trio.move_on_at(last_sent + keepalive) as scope:
                await self.changed.park()
            if scope.cancelled_caught:
                # The last sequence acked *in the waiting window*: always 0, as
                # windows are acked whole. Repeating the previous window's highest
                # sequence would read, to a client whose sequences restart at 1
                # (Beats), as an ack of this window before it is safe.
                await self.send(Ack(head.window.version, 0))
                self.metrics.keepalives.inc()
                last_sent = trio.current_time()

    async def send(self, ack: Ack) -> None:
        with trio.fail_after(self.settings.write_timeout):
            await self.stream.send_all(self.codec.send(ack))


async def _cancel_when_set(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


class _NotAccepted(Exception):
    def __init__(self, window: Window, receipt: Receipt) -> None:
        outcome = receipt.outcome.name.lower() if receipt.outcome is not None else "unsettled"
        super().__init__(
            f"window of {len(window.events)} events (highest seq {window.highest_seq}) was "
            f"{outcome}{': ' + receipt.reason if receipt.reason else ''}; closing without ack"
        )


async def serve_connection(
    stream: trio.abc.Stream,
    sink: WindowSink,
    settings: ServerSettings | None = None,
    *,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    shutdown: trio.Event | None = None,
    on_ack: Callable[[Window], None] | None = None,
    metrics: ServerMetrics | None = None,
) -> None:
    """Serve one Lumberjack connection until the client closes it or breaks the protocol.

    Once ``shutdown`` is set, no more windows are read and the call returns as
    soon as the windows already handed off are acked (or the caller cancels).
    ``on_ack(window)`` is called once a window's ack has been written.
    Protocol errors, refused windows and timeouts are logged and end the
    connection (the caller closes the stream); nothing unsafe is ever acked.
    ``metrics`` says where to count windows, events, keepalives and errors.
    """
    logger = logger or log
    metrics = metrics or ServerMetrics()
    session = _Session(stream, sink, settings or ServerSettings(), logger, on_ack, metrics)
    try:
        await session.run(shutdown)
    except* RemoteProtocolError as eg:
        metrics.protocol_errors.inc()
        logger.warning("protocol error: %s; closing", eg.exceptions[0])
    except* _NotAccepted as eg:
        logger.warning("%s", eg.exceptions[0])
    except* trio.TooSlowError as eg:
        metrics.protocol_errors.inc()
        logger.warning("%s; closing", eg.exceptions[0] or "ack write timed out")
