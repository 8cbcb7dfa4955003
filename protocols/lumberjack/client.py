"""The client role of Lumberjack over trio: windows out, acks in.

:func:`forward` is what a gateway upstream runs on each connection: it pulls
deliveries from the upstream's subscription, sends them as windows (``W n`` +
one zlib ``C`` of ``J`` frames numbered 1..n), keeps ``pipelining`` windows in
flight, and acks each delivery to the hub only once the server's ``A`` covers
its sequence number. Acks are matched to windows in order. A partial ack acks
the covered prefix; the rest stays in flight until the server acks it or the
connection fails, and then the unacked tail goes back to the subscription and
is sent again on the next connection (at least once, never lost).

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

from gateway.destination import Subscription
from gateway.errors import RemoteProtocolError

from . import NEED_DATA, Ack, ClientCodec, ConnectionClosed
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


class _Sent:
    __slots__ = ("acked", "sent_at", "tags")

    def __init__(self, tags: list[int]) -> None:
        self.tags = tags
        self.acked = 0
        self.sent_at = trio.current_time()


class _Forwarder:
    def __init__(
        self,
        stream: trio.abc.Stream,
        sub: Subscription,
        settings: ClientSettings,
        log: logging.Logger | logging.LoggerAdapter,
        metrics: ClientMetrics,
    ) -> None:
        self.stream = stream
        self.sub = sub
        self.s = settings
        self.log = log
        self.metrics = metrics
        self.codec = ClientCodec(version=settings.version)
        self.inflight: deque[_Sent] = deque()
        self.changed = trio.lowlevel.ParkingLot()
        self.timer = trio.CancelScope()
        self.last_ack = self.last_progress = trio.current_time()
        self.expired = False
        self.acked_events = 0

    def _wake(self) -> None:
        if self.changed:
            self.changed.unpark_all()

    def _arm_timer(self) -> None:
        if self.inflight:
            self.timer.deadline = min(
                self.last_ack + self.s.timeout, self.last_progress + self.s.stall_timeout
            )
        else:
            self.timer.deadline = math.inf

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.send_loop)
                await self.receive_loop()
                nursery.cancel_scope.cancel()
        except BaseException:
            unacked = sum(len(sent.tags) - sent.acked for sent in self.inflight)
            if unacked:
                self.metrics.events_failed.inc(unacked)
            raise

    async def send_loop(self) -> None:
        born = trio.current_time()
        s = self.s
        while True:
            if s.ttl and trio.current_time() - born >= s.ttl:
                self.log.info("connection TTL (%gs) reached; reconnecting once acked", s.ttl)
                self.expired = True
                if not self.inflight:
                    self.timer.cancel()  # the receiver may be waiting with no deadline
                return
            while len(self.inflight) >= s.pipelining:
                await self.changed.park()
            if s.ttl:
                deliveries = []
                with trio.move_on_at(born + s.ttl):
                    deliveries = await self.sub.receive(s.bulk_max_size)
                if not deliveries:  # the TTL ran out while idle
                    continue
            else:
                deliveries = await self.sub.receive(s.bulk_max_size)
            wire = self.codec.send_window(
                to_payloads(list(map(_MESSAGE, deliveries)), s.metadata),
                compression_level=s.compression_level,
            )
            resent = sum(map(_REDELIVERED, deliveries))
            if resent:
                self.metrics.events_resent.inc(resent)
            self.metrics.windows.inc()
            self.metrics.window_events.observe(len(deliveries))
            if not self.inflight:
                self.last_ack = self.last_progress = trio.current_time()
            self.inflight.append(_Sent([d.tag for d in deliveries]))
            self._arm_timer()
            await self.stream.send_all(wire)

    async def receive_loop(self) -> None:
        while not (self.expired and not self.inflight):
            self.timer = trio.CancelScope()
            self._arm_timer()
            with self.timer:
                data = await self.stream.receive_some(RECEIVE_SIZE)
            if self.timer.cancelled_caught:
                if self.expired and not self.inflight:
                    return
                now = trio.current_time()
                if now - self.last_progress >= self.s.stall_timeout:
                    raise trio.TooSlowError(
                        f"no progress for {self.s.stall_timeout:g}s (only keepalives)"
                    )
                raise trio.TooSlowError(f"no ack for {self.s.timeout:g}s")
            if not data:
                raise trio.BrokenResourceError("the server closed the connection")
            self.codec.receive_data(data)
            while (event := self.codec.next_event()) is not NEED_DATA:
                if isinstance(event, ConnectionClosed):
                    raise trio.BrokenResourceError("the server closed the connection")
                assert isinstance(event, Ack)
                self.on_ack(event.seq)

    def on_ack(self, seq: int) -> None:
        self.last_ack = trio.current_time()
        if seq == 0:
            return  # keepalive
        if not self.inflight:
            raise RemoteProtocolError(f"ack {seq} with no window in flight")
        head = self.inflight[0]
        if seq > len(head.tags):
            raise RemoteProtocolError(f"ack {seq} beyond the window of {len(head.tags)} events")
        if seq <= head.acked:
            return
        self.sub.ack_many(head.tags[head.acked : seq])
        self.acked_events += seq - head.acked
        self.metrics.events_acked.inc(seq - head.acked)
        head.acked = seq
        self.last_progress = self.last_ack
        if seq == len(head.tags):
            self.inflight.popleft()
            self.metrics.ack_latency.observe(self.last_ack - head.sent_at)
            self._wake()


async def forward(
    stream: trio.abc.Stream,
    sub: Subscription,
    settings: ClientSettings | None = None,
    *,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    metrics: ClientMetrics | None = None,
) -> int:
    """Send ``sub``'s deliveries as windows over ``stream`` until it fails or its TTL ends.

    Returns normally only when the TTL ended the session cleanly; returns the
    number of events acked. Raises on a lost connection, timeout or protocol
    error; deliveries not acked then are redelivered when ``sub`` closes.
    """
    f = _Forwarder(
        stream,
        sub,
        settings or ClientSettings(),
        logger or logging.getLogger(__name__),
        metrics or ClientMetrics(),
    )
    await f.run()
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
            tls = trio.SSLStream(stream, ssl_context, server_hostname=server_hostname or host)
            await tls.do_handshake()
            stream = tls
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
        for start in range(0, len(payloads), size) or (0,):
            chunk = payloads[start : start + size]
            await self.stream.send_all(
                self.codec.send_window(chunk, compression_level=self.settings.compression_level)
            )
            await self._await_ack(len(chunk))
        return len(payloads)

    async def _await_ack(self, n: int) -> None:
        while True:
            with trio.move_on_after(self.settings.timeout) as timer:
                data = await self.stream.receive_some(RECEIVE_SIZE)
            if timer.cancelled_caught:
                raise trio.TooSlowError(f"no ack for {self.settings.timeout:g}s")
            if not data:
                raise trio.BrokenResourceError("the server closed the connection")
            self.codec.receive_data(data)
            while (event := self.codec.next_event()) is not NEED_DATA:
                if isinstance(event, ConnectionClosed):
                    raise trio.BrokenResourceError("the server closed the connection")
                assert isinstance(event, Ack)
                if event.seq > n:
                    raise RemoteProtocolError(f"ack {event.seq} beyond the window of {n}")
                if event.seq == n:
                    return
