"""The server role of Lumberjack over a trio stream: windows in, acks out.

:class:`ServerSession` is a :class:`~gateway.sdk.Session`: its reader
feeds the sans-IO :class:`ServerCodec` and hands each complete window to a
*sink*, which returns a :class:`~gateway.core.receipts.Receipt` (the gateway's sink
publishes to the hub; the library server's sink waits for the application).
Windows are answered strictly in order: a window is acked with its highest
sequence number only once its receipt has settled as delivered. While the
oldest window waits, a keepalive ``A 0`` (nothing of this window acked yet)
goes out every ``keepalive`` seconds, in that window's version, so clients'
30 s read timeouts do not fire under backpressure. A window whose receipt
fails, or that never arrived whole, is never acked: the connection is closed
and the client resends it.

Slow writers: a window left partly received after a read arms a linger
(``partial_after``); once the events received of it have waited that long,
they are handed to the sink as one part (``Window.part``) and acked with
their highest sequence once its receipt settles delivered (acks are
cumulative), in order with the other answers; the rest of the window is
acked when it is safe too. A window that arrives whole in one read arms
nothing. Keepalives repeat the last sequence acked of the waiting window
(``A 0`` while none was).

Backpressure: the reader stops reading while ``max_pending_windows`` windows
are unacked, or while the sink is waiting (the hub is full). Keepalives go on.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from gateway.sdk import NotKept, Outcome, Receipt, Session

from . import Ack, Inflate, Limits, ServerCodec, Window
from .metrics import ServerMetrics

__all__ = ["ServerMetrics", "ServerSession", "ServerSettings", "WindowSink", "serve_connection"]

log = logging.getLogger(__name__)

#: Hands a window off; returns the receipt that says when it is safe.
WindowSink = Callable[[Window], Awaitable[Receipt]]

#: Partial input a connection may always hold, whatever the memory budget says
#: (``Session.memory_floor``): a Beats window of 2048 events of 200 bytes takes
#: about 0.7 MiB once inflated into events, so such windows still arrive whole,
#: and wait for the hub with keepalives, while the budget is exhausted. Above it
#: a connection stops reading and inflating until there is room.
WINDOW_MEMORY_FLOOR = 1024 * 1024

#: Threads inflating at once, per process: more than the cores gains nothing.
_INFLATERS: trio.lowlevel.RunVar[trio.CapacityLimiter] = trio.lowlevel.RunVar(
    "lumberjack_inflaters"
)


def _inflaters() -> trio.CapacityLimiter:
    try:
        return _INFLATERS.get()
    except LookupError:
        limiter = trio.CapacityLimiter(max(1, len(os.sched_getaffinity(0))))
        _INFLATERS.set(limiter)
        return limiter


@dataclass(frozen=True, slots=True)
class ServerSettings:
    limits: Limits = field(default_factory=Limits)
    #: Seconds between keepalive acks while the oldest window waits: 5 s keeps
    #: Beats' 30 s read timeout from firing while the hub applies backpressure.
    keepalive: float = 5.0
    #: Windows read and not yet acked before reading pauses.
    max_pending_windows: int = 4
    #: Once a window has started, the rest of it must arrive within this (0: no limit).
    window_timeout: float = 30.0
    #: An ack that cannot be written within this closes the connection.
    write_timeout: float = 30.0
    #: Events of an unfinished window that waited this long are published (and
    #: acked once safe) as a part of it (0: windows are published whole only).
    partial_after: float = 1.0
    #: ``C`` frames of at least this many compressed bytes are inflated in a thread,
    #: off the event loop (0: every one inline); see :data:`INFLATE_IN_THREAD`.
    inflate_in_thread: int = 0


class ServerSession(Session):
    """One Lumberjack connection, server side; :meth:`serve` runs it."""

    codec: ServerCodec

    def __init__(
        self,
        stream: trio.abc.Stream,
        sink: WindowSink,
        settings: ServerSettings | None = None,
        *,
        logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        shutdown: trio.Event | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        settings = settings or ServerSettings()
        super().__init__(
            stream,
            ServerCodec(settings.limits),
            log=logger or log,
            shutdown=shutdown,
            max_answers=settings.max_pending_windows,
            keepalive=settings.keepalive,
            unit_timeout=settings.window_timeout,
            write_timeout=settings.write_timeout,
            memory_floor=WINDOW_MEMORY_FLOOR,
        )
        self.codec.offload_at = settings.inflate_in_thread
        self.sink = sink
        self.metrics = metrics or ServerMetrics()
        self._inflated = 0
        self.partial_after = settings.partial_after
        #: When events of the unfinished window started waiting (None: none wait).
        self._part_since: float | None = None
        self._part_armed = trio.lowlevel.ParkingLot()
        self._part_task = False
        #: A window is in the reader's hands (parts may not be taken before it) ...
        self._handling = False
        #: ... or a part in the sink's (the reader's next window waits for it, so that
        #: the hub gets them in order).
        self._part_in_sink = False
        self._part_handed = trio.lowlevel.ParkingLot()
        #: Parts of the unfinished window: their count of events acked, by window
        #: number (the number moves on with each window that was published in parts).
        self._window_no = 0
        self._parted = False
        self._part_floor = 0
        self._part_acked = 0
        self._unfinished: tuple[int, int, int] | None = None

    def ended_by(self, error: Exception) -> None:
        if not isinstance(error, NotKept):  # refused windows are counted as they are refused
            self.metrics.protocol_errors.inc()
        if isinstance(error, trio.TooSlowError) and self._unfinished is not None:
            # Say how much of the window arrived, not only that it did not finish.
            size, arrived, taken = self._unfinished
            error.args = (
                f"window of {size} events: {arrived} arrived, {taken} published,"
                f" {self._part_acked} acked, then not finished within"
                f" {self.unit_timeout:g}s of its start",
            )

    async def handle(self, window: Window | Inflate) -> None:
        if isinstance(window, Inflate):
            # zlib releases the GIL while it inflates: the loop serves other connections
            # meanwhile. This connection reads nothing more until it is back.
            await trio.to_thread.run_sync(window.run, limiter=_inflaters())
            return
        self._count_inflated()  # per window too: a protocol error later in the read loses none
        self.metrics.windows.inc()
        if window.events:
            self.metrics.events.inc(len(window.events))
        self._handling = True
        try:
            while self._part_in_sink:
                await self._part_handed.park()
            await self._submit(window, self._whole())
        finally:
            self._handling = False

    def _whole(self) -> int:
        """A window is whole: the highest sequence of its parts (0: none), and the
        next window gets a new number if this one had parts."""
        if not self._parted:
            return 0
        self._parted = False
        self._window_no += 1
        self._part_acked = 0
        return self._part_floor

    async def _submit(self, window: Window, acked: int) -> None:
        # The keepalive repeats the last sequence acked of this window ("A 0": nothing
        # yet), which is a lie for a window whose highest sequence is not above it:
        # such a window gets none.
        keepalive = (
            functools.partial(self._keepalive, window.version, acked)
            if window.highest_seq > acked
            else None
        )
        # The answer keeps what the ack needs, not the window: its events are freed
        # once the sink has handed them off.
        answer = functools.partial(
            self._answer,
            (window.version, window.highest_seq, len(window.events)),
            trio.current_time(),
            self._window_no if window.part else -1,
        )
        await self.submit(functools.partial(self.sink, window), answer, keepalive)

    def _answer(
        self, window: tuple[int, int, int], received_at: float, part_of: int, receipt: Receipt
    ) -> bytes:
        version, highest_seq, count = window
        if receipt.outcome is not Outcome.DELIVERED:
            self.metrics.refused_windows.inc()
            raise _NotAccepted(count, highest_seq, receipt)
        # Counted as the ack goes out, so that whoever reads it sees it counted.
        self.metrics.ack_latency.observe(trio.current_time() - received_at)
        if part_of == self._window_no:
            self._part_acked += count
        return self.codec.send(Ack(version, highest_seq))

    def _keepalive(self, version: int, acked: int) -> bytes:
        # The last sequence acked *in the waiting window*: 0, or the highest of its
        # parts already acked. Repeating the previous window's highest sequence would
        # read, to a client whose sequences restart at 1 (Beats), as an ack of this
        # window before it is safe.
        self.metrics.keepalives.inc()
        return self.codec.send(Ack(version, acked))

    # -- a slow writer's window, in parts ------------------------------------------------
    def _arm_part(self) -> None:
        """After a read: events of an unfinished window wait; publish them after the
        linger unless the window is whole by then."""
        if not self.codec.part_ready:
            self._part_since = None
            return
        if self._part_since is not None:
            return
        self._part_since = trio.current_time()
        if not self._part_task:
            self._part_task = True
            self.nursery.start_soon(self._publish_parts)
        elif self._part_armed:
            self._part_armed.unpark_all()

    async def _publish_parts(self) -> None:
        """One task per session, started by the first window left partly received."""
        while True:
            since = self._part_since
            if since is None:
                await self._part_armed.park()
                continue
            due = since + self.partial_after
            if trio.current_time() < due:
                await trio.sleep_until(due)
                continue
            if not self.partial_after:
                return
            if self._handling or self.answers.full:
                # A window in the reader's hands goes first, and a part needs room
                # among the answers. Time held up by our own backpressure does not
                # count: the linger starts again, so that a writer that is not slow
                # (whose rest waits in the socket) is not cut into parts.
                self._part_since = trio.current_time()
                await trio.sleep(min(0.1, self.partial_after))
                continue
            self._part_since = None
            window = self.codec.take_part()
            if window is None:
                continue
            await self._submit_part(window)

    async def _submit_part(self, window: Window) -> None:
        acked = self._part_floor if self._parted else 0
        self._parted = True
        self._part_floor = window.highest_seq
        self.metrics.events.inc(len(window.events))
        self._part_in_sink = True
        try:
            await self._submit(window, acked)
        finally:
            self._part_in_sink = False
            self._part_handed.unpark_all()

    def partial(self) -> bool:
        return self.codec.in_window

    def draining(self) -> None:
        super().draining()
        self._stop_parts()

    def _stop_parts(self) -> None:
        """No more parts: the gateway drains, or the peer closed its side (a window it
        left unfinished is dropped whole; what was acked of it stays acked)."""
        self.partial_after = 0
        self._part_since = None

    def finished(self) -> None:
        self._unfinished = self.codec.window_progress
        self.codec.discard()

    def useful(self, window: Window | Inflate) -> bool:
        # ``W 0`` is a liveness probe: answered, but no reason to keep an idle connection.
        return isinstance(window, Window) and bool(window.events)

    def received(self) -> None:
        self._count_inflated()
        if self.partial_after:
            self._arm_part()

    def end_of_input(self) -> None:
        # The client closed its side: what is in flight still gets its ack (a
        # half-read window is dropped, unacked).
        self._count_inflated()
        self._stop_parts()

    def _count_inflated(self) -> None:
        inflated = self.codec.inflated_bytes
        if inflated > self._inflated:
            self.metrics.inflated_bytes.inc(inflated - self._inflated)
            self._inflated = inflated


class _NotAccepted(NotKept):
    def __init__(self, count: int, highest_seq: int, receipt: Receipt) -> None:
        outcome = receipt.outcome.name.lower() if receipt.outcome is not None else "unsettled"
        super().__init__(
            f"window of {count} events (highest seq {highest_seq}) was "
            f"{outcome}{': ' + receipt.reason if receipt.reason else ''}; closing without ack"
        )


async def serve_connection(
    stream: trio.abc.Stream,
    sink: WindowSink,
    settings: ServerSettings | None = None,
    *,
    logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    shutdown: trio.Event | None = None,
    metrics: ServerMetrics | None = None,
) -> None:
    """Serve one Lumberjack connection until the client closes it or breaks the protocol.

    Once ``shutdown`` is set, no more windows are read and the call returns as
    soon as the windows already handed off are acked (or the caller cancels).
    ``metrics`` says where to count windows, events, keepalives and errors.
    """
    session = ServerSession(
        stream, sink, settings, logger=logger, shutdown=shutdown, metrics=metrics
    )
    await session.serve()
