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

Backpressure: the reader stops reading while ``max_pending_windows`` windows
are unacked, or while the sink is waiting (the hub is full). Keepalives go on.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from gateway.sdk import NotKept, Outcome, Receipt, Session

from . import Ack, Limits, ServerCodec, Window
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
        self.sink = sink
        self.metrics = metrics or ServerMetrics()
        self._inflated = 0

    def ended_by(self, error: Exception) -> None:
        if not isinstance(error, NotKept):  # refused windows are counted as they are refused
            self.metrics.protocol_errors.inc()

    async def handle(self, window: Window) -> None:
        self._count_inflated()  # per window too: a protocol error later in the read loses none
        self.metrics.windows.inc()
        if window.events:
            self.metrics.events.inc(len(window.events))
        # The keepalive "A 0" says "nothing of this window acked yet", which is a lie
        # for a window whose highest sequence is 0: such a window gets none.
        keepalive = (
            functools.partial(self._keepalive, window.version) if window.highest_seq else None
        )
        # The answer keeps what the ack needs, not the window: its events are freed
        # once the sink has handed them off.
        answer = functools.partial(
            self._answer,
            (window.version, window.highest_seq, len(window.events)),
            trio.current_time(),
        )
        await self.submit(functools.partial(self.sink, window), answer, keepalive)

    def _answer(self, window: tuple[int, int, int], received_at: float, receipt: Receipt) -> bytes:
        version, highest_seq, count = window
        if receipt.outcome is not Outcome.DELIVERED:
            self.metrics.refused_windows.inc()
            raise _NotAccepted(count, highest_seq, receipt)
        # Counted as the ack goes out, so that whoever reads it sees it counted.
        self.metrics.ack_latency.observe(trio.current_time() - received_at)
        return self.codec.send(Ack(version, highest_seq))

    def _keepalive(self, version: int) -> bytes:
        # The last sequence acked *in the waiting window*: always 0, as windows are
        # acked whole. Repeating the previous window's highest sequence would read,
        # to a client whose sequences restart at 1 (Beats), as an ack of this
        # window before it is safe.
        self.metrics.keepalives.inc()
        return self.codec.send(Ack(version, 0))

    def partial(self) -> bool:
        return self.codec.in_window

    def finished(self) -> None:
        self.codec.discard()

    def useful(self, window: Window) -> bool:
        # ``W 0`` is a liveness probe: answered, but no reason to keep an idle connection.
        return bool(window.events)

    def received(self) -> None:
        self._count_inflated()

    def end_of_input(self) -> None:
        # The client closed its side: what is in flight still gets its ack (a
        # half-read window is dropped, unacked).
        self._count_inflated()

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
