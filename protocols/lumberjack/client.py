"""The client role of Lumberjack over trio: windows out, acks in.

:func:`forward` is what a gateway upstream runs on each connection: a
:class:`~gateway.sdk.Session` whose send loop pulls deliveries from the
upstream's subscription and sends them as windows (``W n`` + one zlib ``C``
of ``J`` frames numbered 1..n), keeping ``pipelining`` windows in flight. The
:class:`ClientCodec` matches each ``A`` frame to the oldest window in flight,
and a delivery is acked to the hub only once an ``A`` covers its sequence
number. A partial ack acks the covered prefix; the rest stays in flight until
the server acks it or the connection fails, and then the unacked tail goes
back to the subscription and is sent again on the next connection (at least
once, never lost).

Any ``A`` frame (keepalives included) resets the read timeout; only progress
resets the stall timer, so a server that only sends keepalives for
``stall_timeout`` is left for the next host. With a TTL, no new window is sent
once the connection is ``ttl`` old; when the windows in flight are acked the
session ends and the caller reconnects, so TTLs work with pipelining.

:class:`LumberjackClient` is the small library API: send a batch, return when
the server acked all of it.
"""

from __future__ import annotations

import json
import logging
import math
import operator
import ssl
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from gateway.sdk import Session, Subscription, start_tls

from . import NEED_DATA, ClientCodec, ConnectionClosed, Progress
from .mapping import to_payloads
from .metrics import ClientMetrics

__all__ = ["ClientSettings", "LumberjackClient", "forward"]

RECEIVE_SIZE = 65536
_MESSAGE = operator.itemgetter(1)  # Delivery.message
_REDELIVERED = operator.itemgetter(2)  # Delivery.redelivered


@dataclass(frozen=True, slots=True)
class ClientSettings:
    """Client behaviour; the defaults are Beats' (``output.logstash``)."""

    #: Events per window at most.
    bulk_max_size: int = 2048
    #: Windows sent and not yet fully acked.
    pipelining: int = 2
    #: zlib level of the ``C`` frame; 0 sends bare ``J`` frames.
    compression_level: int = 3
    #: Seconds without any ``A`` frame (keepalives count) while windows are in flight.
    timeout: float = 30.0
    #: Seconds without progress (a positive ack) before giving up on the server.
    stall_timeout: float = 300.0
    #: Reconnect after this many seconds (0: never), once in-flight windows are acked.
    ttl: float = 0.0
    version: int = 2
    #: The ``"@metadata":{…}`` member added to events that lack one
    #: (:func:`~protocols.lumberjack.mapping.beats_metadata`); empty: none.
    metadata: bytes = b""


class _Forwarder(Session):
    codec: ClientCodec

    def __init__(
        self,
        stream: trio.abc.Stream,
        sub: Subscription,
        settings: ClientSettings,
        log: logging.Logger | logging.LoggerAdapter[Any],
        metrics: ClientMetrics,
    ) -> None:
        super().__init__(
            stream, ClientCodec(settings.version), log=log, write_timeout=settings.timeout
        )
        self.sub = sub
        self.s = settings
        self.metrics = metrics
        #: ``(delivery tags, sent at)`` of each window in flight, oldest first.
        self.inflight: deque[tuple[list[int], float]] = deque()
        self._window_done = trio.lowlevel.ParkingLot()
        self.last_ack = self.last_progress = trio.current_time()
        self.acked_events = 0

    def started(self) -> None:
        self.nursery.start_soon(self._send_loop)

    async def _send_loop(self) -> None:
        s = self.s
        end = trio.current_time() + s.ttl if s.ttl else math.inf
        while True:
            while len(self.inflight) >= s.pipelining:
                await self._window_done.park()
            deliveries = []
            with trio.move_on_at(end):
                deliveries = await self.sub.receive(s.bulk_max_size)
            if not deliveries:  # the TTL ran out
                break
            wire = self.codec.send_window(
                to_payloads(list(map(_MESSAGE, deliveries)), s.metadata),
                compression_level=s.compression_level,
            )
            if resent := sum(map(_REDELIVERED, deliveries)):
                self.metrics.events_resent.inc(resent)
            self.metrics.windows.inc()
            self.metrics.window_events.observe(len(deliveries))
            now = trio.current_time()
            if not self.inflight:
                self.last_ack = self.last_progress = now
            self.inflight.append(([d.tag for d in deliveries], now))
            self._arm()
            await self.write_when_room(wire)
            if trio.current_time() >= end:
                break
        self.log.info("connection TTL (%gs) reached; reconnecting once acked", s.ttl)
        while self.inflight:
            await self._window_done.park()
        self.stop()

    async def handle(self, event: Progress) -> None:
        now = self.last_ack = trio.current_time()
        if event.acked:
            tags, _ = self.inflight[0]
            self.sub.ack_many(tags[event.seq - event.acked : event.seq])
            self.acked_events += event.acked
            self.metrics.events_acked.inc(event.acked)
            self.last_progress = now
        if event.window_done:
            _, sent_at = self.inflight.popleft()
            self.metrics.ack_latency.observe(now - sent_at)
            self._window_done.unpark_all()
        self._arm()

    def _arm(self) -> None:
        """While windows are in flight, the server owes an ack (and progress)."""
        if not self.inflight:
            self.clear_deadline()
        elif self.last_progress + self.s.stall_timeout < self.last_ack + self.s.timeout:
            self.set_deadline(
                self.last_progress + self.s.stall_timeout,
                f"no progress for {self.s.stall_timeout:g}s (only keepalives)",
            )
        else:
            self.set_deadline(self.last_ack + self.s.timeout, f"no ack for {self.s.timeout:g}s")

    def end_of_input(self) -> None:
        raise trio.BrokenResourceError("the server closed the connection")


async def forward(
    stream: trio.abc.Stream,
    sub: Subscription,
    settings: ClientSettings | None = None,
    *,
    logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    metrics: ClientMetrics | None = None,
) -> int:
    """Send ``sub``'s deliveries as windows over ``stream`` until it fails or its TTL ends.

    Returns normally only when the TTL ended the session cleanly; returns the
    number of events acked. Raises on a lost connection, timeout or protocol
    error; deliveries not acked then are redelivered when ``sub`` closes.
    """
    metrics = metrics or ClientMetrics()
    f = _Forwarder(
        stream, sub, settings or ClientSettings(), logger or logging.getLogger(__name__), metrics
    )
    try:
        await f.run()
    except BaseException:
        if unacked := f.codec.events_in_flight:
            metrics.events_failed.inc(unacked)
        raise
    return f.acked_events


class LumberjackClient:
    """Send batches of events to a Lumberjack server; each ``send`` returns once acked."""

    def __init__(self, stream: trio.abc.Stream, settings: ClientSettings | None = None) -> None:
        self.stream = stream
        self.settings = settings or ClientSettings()
        self.codec = ClientCodec(version=self.settings.version)

    @classmethod
    async def connect(
        cls,
        host: str,
        port: int,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        settings: ClientSettings | None = None,
    ) -> LumberjackClient:
        stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
        if ssl_context is not None:
            stream = await start_tls(stream, ssl_context, server_hostname or host)
        return cls(stream, settings)

    async def __aenter__(self) -> LumberjackClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def send(self, events: Sequence[bytes | Mapping[str, Any]]) -> int:
        """Send ``events`` (JSON bytes or mappings) as windows; return once all are acked.

        Raises ``trio.TooSlowError`` when no ack arrives for ``settings.timeout``
        seconds (keepalives count), ``RemoteProtocolError`` on a bad answer, and
        ``trio.BrokenResourceError`` when the server closes.
        """
        payloads = [
            e if isinstance(e, bytes | bytearray) else json.dumps(e).encode() for e in events
        ]
        size = self.settings.bulk_max_size
        codec = self.codec
        for start in range(0, len(payloads), size) or (0,):
            chunk = payloads[start : start + size]
            await self.stream.send_all(
                codec.send_window(chunk, compression_level=self.settings.compression_level)
            )
            while codec.windows_in_flight:
                with trio.move_on_after(self.settings.timeout) as timer:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                if timer.cancelled_caught:
                    raise trio.TooSlowError(f"no ack for {self.settings.timeout:g}s")
                codec.receive_data(data)
                while (event := codec.next_event()) is not NEED_DATA:
                    if isinstance(event, ConnectionClosed):
                        raise trio.BrokenResourceError("the server closed the connection")
        return len(payloads)
