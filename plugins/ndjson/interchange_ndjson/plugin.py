"""The trio driver of the ndjson codec, in both roles, registered as a plugin.

Server role: each ``pub`` line (one message or a batch) is published to the
hub and answered with an ``ack`` line once its receipt settles (never
before), with each message's result for a batch; a ``call`` is answered with
the subscriber's ``reply``, or an ``ack`` saying why it failed. Each ``sub``
starts a pump that sends ``msg`` lines as credit and the window allow, and an
``end`` line when a finite read is complete; ``ack``/``nack``/``reply`` lines
settle deliveries. Reading pauses while ``max_inflight`` publishes and calls
are unanswered or while the hub's buffer is full.

Client role (an upstream): messages routed to the upstream are sent as ``pub``
lines with ids; a delivery is acked to the hub only when the server's ``ack``
says ``delivered``. On a lost connection, unacked deliveries go back to the
upstream's queue and are sent again after reconnecting (at least once).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from gateway.destination import EndOfStream, Subscription
from gateway.errors import RemoteProtocolError
from gateway.model import Message, Outcome, Position, Reply
from gateway.plugin import (
    ConnectionInfo,
    Option,
    ProtocolPlugin,
    ServerConnection,
    UpstreamContext,
)
from gateway.receipts import Receipt

from .codec import CLIENT, DEFAULT_MAX_LINE, NEED_DATA, SERVER, NdjsonConnection
from .events import (
    Ack,
    Call,
    ConnectionClosed,
    Credit,
    Deliver,
    End,
    Error,
    Event,
    ItemResult,
    Nack,
    Ping,
    Pong,
    Publish,
    Published,
    PublishMany,
    Replied,
    ReplyTo,
    Subscribe,
    Unsubscribe,
)

__all__ = ["NdjsonPlugin"]

RECEIVE_SIZE = 65536
#: Reply codes ndjson carries (gRPC's numbering); others become UNKNOWN (2).
MAX_CODE = 2**31 - 1
UNKNOWN_CODE = 2
#: Unsent output above which subscription pumps wait for the socket.
WRITE_HIGH_WATER = 1024 * 1024
_STATUS = {Outcome.DELIVERED: "delivered", Outcome.FAILED: "failed", Outcome.REJECTED: "rejected"}


class _Output:
    """Bytes waiting for the one writer task; producers above the mark wait."""

    def __init__(self, stream: trio.abc.SendStream) -> None:
        self.stream = stream
        self.buf = bytearray()
        self._ready = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()
        self._flushed = trio.lowlevel.ParkingLot()
        self._sending = False

    def write(self, data: bytes) -> None:
        self.buf += data
        if self._ready:
            self._ready.unpark_all()

    async def write_when_room(self, data: bytes) -> None:
        while len(self.buf) > WRITE_HIGH_WATER:
            await self._room.park()
        self.write(data)

    async def flush(self) -> None:
        while self.buf or self._sending:
            await self._flushed.park()

    async def run(self) -> None:
        while True:
            while not self.buf:
                self._flushed.unpark_all()
                await self._ready.park()
            data, self.buf = self.buf, bytearray()
            self._room.unpark_all()
            self._sending = True
            try:
                await self.stream.send_all(data)
            finally:
                self._sending = False


class _ServerSession:
    def __init__(self, conn: ServerConnection) -> None:
        self.conn = conn
        self.codec = NdjsonConnection(SERVER, max_line=conn.options["max_line"])
        self.out = _Output(conn.stream)
        self.max_inflight: int = conn.options["max_inflight"]
        self.inflight = 0
        #: Woken when a publish is answered or a delivery settled.
        self._progress = trio.lowlevel.ParkingLot()
        self.subs: dict[str, tuple[Subscription, trio.CancelScope]] = {}
        #: Finite subscriptions that reached their end: kept open for acks until we close.
        self.ended: list[Subscription] = []
        self.tags: dict[int, tuple[Subscription, int]] = {}
        self._next_tag = itertools.count(1)
        conn.pending = lambda: self.inflight > 0 or bool(self.subs)

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                nursery.start_soon(self.out.run)
                nursery.start_soon(self._close_when_drained)
                await self._read()
                # Input ended (EOF or error): answer what is in flight, then close.
                while self.inflight:
                    await self._progress.park()
                await self.out.flush()
                nursery.cancel_scope.cancel()
        finally:
            for sub, _ in self.subs.values():
                sub.close()
            for sub in self.ended:
                sub.close()

    async def _close_when_drained(self) -> None:
        """At shutdown: no new deliveries; close once every answer and ack is through."""
        await self.conn.shutdown.wait()
        for _, scope in self.subs.values():
            scope.cancel()
        while self.inflight or self.tags:
            await self._progress.park()
        await self.out.flush()
        self.nursery.cancel_scope.cancel()

    async def _read(self) -> None:
        stream, codec = self.conn.stream, self.codec
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            codec.receive_data(data)
            while True:
                try:
                    event = codec.next_event()
                except RemoteProtocolError as e:
                    await self._protocol_error(str(e))
                    return
                if not isinstance(event, Event):  # NEED_DATA
                    break
                if isinstance(event, ConnectionClosed):
                    return
                try:
                    await self._handle(event)
                except RemoteProtocolError as e:
                    await self._protocol_error(str(e))
                    return

    async def _protocol_error(self, message: str) -> None:
        self.conn.log.warning("protocol error: %s; closing", message)
        self.out.write(self.codec.send(Error(message)))

    async def _handle(self, event: Event) -> None:
        hub = self.conn.hub
        if isinstance(event, Publish):
            message = self._message(event)
            await self._submit(event.id, lambda: hub.publish([message]), self._answer)
        elif isinstance(event, PublishMany):
            messages = [self._message(m) for m in event.messages]
            await self._submit(event.id, lambda: hub.publish(messages), self._answer_many)
        elif isinstance(event, Call):
            call = self._message(event)
            await self._submit(event.id, lambda: hub.call(call, event.timeout), self._answer_call)
        elif isinstance(event, ReplyTo):
            sub, tag = self._delivery(event.tag, keep=True)
            reply = Reply(event.body, event.headers, event.content_type, event.code, event.error)
            try:
                sub.reply(tag, reply)
            except ValueError as e:
                raise RemoteProtocolError(f"cannot reply to tag {event.tag}: {e}") from None
            del self.tags[event.tag]
            if self._progress:
                self._progress.unpark_all()
        elif isinstance(event, Ack):
            sub, tag = self._delivery(event.tag)
            sub.ack(tag)
            if self._progress:
                self._progress.unpark_all()
        elif isinstance(event, Nack):
            sub, tag = self._delivery(event.tag)
            if event.requeue:
                sub.nack(tag)
            else:
                sub.nack(
                    tag,
                    requeue=False,
                    outcome=Outcome.REJECTED,
                    reason=f"rejected by subscriber {self.conn.info.peer}",
                )
            if self._progress:
                self._progress.unpark_all()
        elif isinstance(event, Subscribe):
            self._subscribe(event)
        elif isinstance(event, Credit):
            self._sub(event.destination).grant(event.n)
        elif isinstance(event, Unsubscribe):
            sub = self._sub(event.destination)
            _, scope = self.subs.pop(event.destination)
            scope.cancel()
            sub.close()
            self.tags = {t: v for t, v in self.tags.items() if v[0] is not sub}
        elif isinstance(event, Ping):
            self.out.write(self.codec.send(Pong()))

    def _message(self, event: Publish | Call) -> Message:
        return Message(
            destination=event.destination or self.conn.listener.destination,
            body=event.body,
            headers=event.headers,
            content_type=event.content_type,
            source=self.conn.source(),
        )

    async def _submit(
        self,
        ident: Any,
        send: Callable[[], Awaitable[Receipt]],
        answer: Callable[[Any, Receipt], None],
    ) -> None:
        """Take one more unanswered publish or call (waiting for room among them),
        hand it to the hub with ``send``, and ``answer`` it once its receipt settles.
        While draining it is answered ``failed`` instead."""
        if self.conn.shutdown.is_set():
            # Draining: acks from subscribers are still read, new messages are not taken.
            reason = "the gateway is shutting down"
            self.out.write(self.codec.send(Published(ident, "failed", reason)))
            return
        while self.inflight >= self.max_inflight:
            await self._progress.park()
        self.inflight += 1
        try:
            receipt = await send()
        except BaseException:
            self._settled(None)
            raise
        receipt.add_done_callback(functools.partial(answer, ident))

    def _answer(self, ident: Any, receipt: Receipt) -> None:
        assert receipt.outcome is not None
        positions = None if receipt.plain else _offsets(receipt.result(0).positions)
        self.out.write(
            self.codec.send(
                Published(ident, _STATUS[receipt.outcome], receipt.reason, positions=positions)
            )
        )
        self._settled(receipt)

    def _answer_many(self, ident: Any, receipt: Receipt) -> None:
        assert receipt.outcome is not None
        results = tuple(
            ItemResult(_STATUS[r.outcome], r.reason, _offsets(r.positions))
            for r in receipt.results()
        )
        self.out.write(
            self.codec.send(
                Published(ident, _STATUS[receipt.outcome], receipt.reason, results=results)
            )
        )
        self._settled(receipt)

    def _answer_call(self, ident: Any, receipt: Receipt) -> None:
        assert receipt.outcome is not None
        reply = receipt.reply
        if reply is None:
            answer: Event = Published(ident, _STATUS[receipt.outcome], receipt.reason)
        else:
            # Another protocol's service may use codes outside ndjson's range.
            code = reply.status if 0 <= reply.status <= MAX_CODE else UNKNOWN_CODE
            answer = Replied(
                ident, reply.body, reply.headers, reply.content_type, code, reply.message
            )
        self.out.write(self.codec.send(answer))
        self._settled(receipt)

    def _settled(self, _: Receipt | None) -> None:
        self.inflight -= 1
        if self._progress:
            self._progress.unpark_all()

    def _subscribe(self, event: Subscribe) -> None:
        if self.conn.shutdown.is_set():
            raise RemoteProtocolError("the gateway is shutting down")
        if event.destination in self.subs:
            raise RemoteProtocolError(f"already subscribed to {event.destination!r}")
        try:
            sub = self.conn.hub.subscribe(
                event.destination,
                event.group,
                credit=event.credit,
                max_unacked=event.window,
                start=event.start,  # type: ignore[arg-type]
                end=event.end,  # type: ignore[arg-type]
                filter=event.filter,
            )
        except (ValueError, LookupError) as e:
            raise RemoteProtocolError(f"cannot subscribe to {event.destination!r}: {e}") from None
        scope = trio.CancelScope()
        self.subs[event.destination] = (sub, scope)
        self.nursery.start_soon(self._pump, sub, scope)

    async def _pump(self, sub: Subscription, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                try:
                    deliveries = await sub.receive()
                except EndOfStream:
                    # Finite read done: say so, and keep the subscription for its acks.
                    del self.subs[sub.destination]
                    self.ended.append(sub)
                    await self.out.write_when_room(self.codec.send(End(sub.destination)))
                    return
                now = trio.current_time()
                for d in deliveries:
                    tag = next(self._next_tag)
                    self.tags[tag] = (sub, d.tag)
                    m = d.message
                    line = self.codec.send(
                        Deliver(
                            tag,
                            m.destination,
                            m.body,
                            m.headers,
                            m.content_type,
                            d.redelivered,
                            position=None if d.position is None else d.position.offset,
                            call=d.reply_by is not None,
                            reply_within=(
                                None if d.reply_by is None else round(max(0.0, d.reply_by - now), 3)
                            ),
                        )
                    )
                    await self.out.write_when_room(line)

    def _sub(self, destination: str) -> Subscription:
        try:
            return self.subs[destination][0]
        except KeyError:
            raise RemoteProtocolError(f"not subscribed to {destination!r}") from None

    def _delivery(self, tag: int, *, keep: bool = False) -> tuple[Subscription, int]:
        try:
            return self.tags[tag] if keep else self.tags.pop(tag)
        except KeyError:
            raise RemoteProtocolError(f"unknown delivery tag {tag}") from None


def _offsets(positions: Mapping[str, Position]) -> dict[str, int] | None:
    """Positions as the ``pos`` object of an ``ack`` line (None when there are none)."""
    return {name: p.offset for name, p in positions.items()} if positions else None


class _ClientSession:
    """One connection of an upstream: publish deliveries, ack them on the server's ack."""

    def __init__(self, ctx: UpstreamContext, stream: trio.abc.Stream) -> None:
        self.ctx = ctx
        self.stream = stream
        self.codec = NdjsonConnection(CLIENT, max_line=ctx.options["max_line"])
        self.window: int = ctx.options["window"]
        self.timeout: float = ctx.options["timeout"]
        self.rename: str = ctx.options["destination"]
        self.pending: dict[int, int] = {}
        self._ids = itertools.count(1)
        #: Fires when acks stop while publishes are pending; moved, not recreated, by sends.
        self.ack_timer = trio.CancelScope()

    async def run(self) -> None:
        with self.ctx.subscribe(max_unacked=self.window) as sub:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send, sub)
                await self._receive(sub)
                nursery.cancel_scope.cancel()

    async def _send(self, sub: Subscription) -> None:
        while True:
            out = bytearray()
            for d in await sub.receive():
                ident = next(self._ids)
                self.pending[ident] = d.tag
                m = d.message
                out += self.codec.send(
                    Publish(m.body, self.rename or m.destination, m.headers, m.content_type, ident)
                )
            if self.ack_timer.deadline == float("inf"):
                self.ack_timer.deadline = trio.current_time() + self.timeout
            await self.stream.send_all(out)

    async def _receive(self, sub: Subscription) -> None:
        while True:
            with self.ack_timer:
                data = await self.stream.receive_some(RECEIVE_SIZE)
            if self.ack_timer.cancelled_caught:
                raise trio.TooSlowError(f"no ack for {self.timeout:g}s")
            if not data:
                raise trio.BrokenResourceError("the server closed the connection")
            self.codec.receive_data(data)
            while (event := self.codec.next_event()) is not NEED_DATA:
                if isinstance(event, Published):
                    self._settle(sub, event)
                elif isinstance(event, Error):
                    raise RemoteProtocolError(f"the server reported: {event.message}")
            # Any ack restarts the clock; with nothing pending there is none.
            self.ack_timer = trio.CancelScope(
                deadline=trio.current_time() + self.timeout if self.pending else float("inf")
            )

    def _settle(self, sub: Subscription, event: Published) -> None:
        if not isinstance(event.id, int) or event.id not in self.pending:
            raise RemoteProtocolError(f"ack for unknown id {event.id!r}")
        tag = self.pending.pop(event.id)
        if event.status == "delivered":
            sub.ack(tag)
        elif event.status == "rejected":
            sub.nack(tag, requeue=False, outcome=Outcome.REJECTED, reason=event.reason)
        else:
            sub.nack(tag)  # failed: retried, now or after reconnecting


class NdjsonPlugin(ProtocolPlugin):
    """Newline-delimited JSON, for debugging with ``nc`` and for simple scripts."""

    name = "ndjson"
    roles = frozenset({"server", "client"})
    default_port = 7070
    summary = "newline-delimited JSON: pub/sub with acks, for nc and scripts"
    listener_options = {
        "max_line": Option("size", DEFAULT_MAX_LINE, "longest line accepted, in bytes", 64),
        "max_inflight": Option(
            "int", 1000, "unacked publishes per connection before reading pauses", 1
        ),
    }
    upstream_options = {
        "max_line": Option("size", DEFAULT_MAX_LINE, "longest line accepted, in bytes", 64),
        "window": Option("int", 1000, "publishes sent and not yet acked by the server", 1),
        "timeout": Option("duration", 30.0, "reconnect when acks stop for this long", 0.001),
        "destination": Option(
            "str", "", "publish under this destination instead of each message's own"
        ),
    }

    @classmethod
    def default_listener(cls) -> dict[str, Any]:
        return {"destination": "logs"}

    async def serve(self, conn: ServerConnection) -> None:
        await _ServerSession(conn).run()

    async def run_upstream(self, ctx: UpstreamContext) -> None:
        async def session(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
            await _ClientSession(ctx, stream).run()

        await ctx.run_sessions(session)

