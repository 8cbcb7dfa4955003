"""The trio driver of the ndjson codec, in both roles, registered as a plugin.

Both roles are :class:`gateway.sdk.Session` subclasses: the skeleton
reads, writes, answers and drains; this module says what each line means.

Server role: each ``pub`` line (one message or a batch) is published to the
hub and answered with an ``ack`` line once its receipt settles (never
before), with each message's result for a batch; a ``call`` is answered with
the subscriber's ``reply``, or an ``ack`` saying why it failed. Each ``sub``
starts a pump that sends ``msg`` lines as credit and the window allow, and an
``end`` line when a finite read is complete; ``ack``/``nack``/``reply`` lines
settle deliveries. Reading pauses while ``max_inflight`` publishes and calls
are unanswered or while the hub's buffer is full. While the gateway drains,
acks are still read and new publishes are answered ``failed``.

Client role (an upstream): messages routed to the upstream are sent as ``pub``
lines with ids; a delivery is acked to the hub only when the server's ``ack``
says ``delivered``. On a lost connection, unacked deliveries go back to the
upstream's queue and are sent again after reconnecting (at least once).
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from gateway.sdk import (
    ConnectionInfo,
    Delivery,
    Feed,
    FeedStop,
    Message,
    NotACall,
    Option,
    Outcome,
    Position,
    ProtocolPlugin,
    Receipt,
    RemoteProtocolError,
    Reply,
    ServerConnection,
    Session,
    Subscriber,
    Subscription,
    UnknownTag,
    UpstreamContext,
)

from .codec import DEFAULT_MAX_LINE, ClientCodec, ServerCodec
from .events import (
    Ack,
    Call,
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

#: Reply codes ndjson carries (gRPC's numbering); others become UNKNOWN (2).
MAX_CODE = 2**31 - 1
UNKNOWN_CODE = 2
_STATUS = {Outcome.DELIVERED: "delivered", Outcome.FAILED: "failed", Outcome.REJECTED: "rejected"}


class _ServerSession(Session):
    """One accepted connection."""

    codec: ServerCodec
    subscriber: Subscriber
    #: Subscribers still ack (and reply to) what they were delivered while we drain.
    read_while_draining = True

    def __init__(self, conn: ServerConnection) -> None:
        super().__init__(
            conn.stream,
            ServerCodec(max_line=conn.options["max_line"]),
            log=conn.log,
            shutdown=conn.shutdown,
            max_answers=conn.options["max_inflight"],
            ordered=False,
        )
        self.conn = conn
        #: The subscriptions that still deliver, by destination (a finite read that
        #: ended is gone from here, and stays in the subscriber for its acks).
        self.feeds: dict[str, Feed] = {}

    def started(self) -> None:
        self.subscriber = Subscriber(self.nursery, progress=self.progress)

    # -- the Session hooks ---------------------------------------------------------
    async def handle(self, event: Event) -> None:
        hub = self.conn.hub
        if isinstance(event, Publish):
            message = self._message(event)
            await self._submit(event.id, lambda: hub.publish([message]), _published)
        elif isinstance(event, Ack):
            self._settle(self.subscriber.ack, event.tag)
        elif isinstance(event, PublishMany):
            messages = [self._message(m) for m in event.messages]
            await self._submit(event.id, lambda: hub.publish(messages), _published_many)
        elif isinstance(event, Call):
            call = self._message(event)
            await self._submit(event.id, lambda: hub.call(call, event.timeout), _call_answer)
        elif isinstance(event, ReplyTo):
            reply = Reply(event.body, event.headers, event.content_type, event.code, event.error)
            try:
                self._settle(self.subscriber.reply, event.tag, reply)
            except NotACall as e:
                raise RemoteProtocolError(f"cannot reply to tag {event.tag}: {e}") from None
        elif isinstance(event, Nack):
            if event.requeue:
                self._settle(self.subscriber.nack, event.tag)
            else:
                reason = f"rejected by subscriber {self.conn.info.peer}"
                self._settle(self._reject, event.tag, reason)
        elif isinstance(event, Subscribe):
            self._subscribe(event)
        elif isinstance(event, Credit):
            self._feed(event.destination).sub.grant(event.n)
        elif isinstance(event, Unsubscribe):
            self._feed(event.destination).close()
            del self.feeds[event.destination]
        elif isinstance(event, Ping):
            self.write(self.codec.send(Pong()))

    def useful(self, event: Event) -> bool:
        # A ping is answered but keeps no otherwise idle connection open.
        return not isinstance(event, Ping)

    def error_reply(self, error: RemoteProtocolError) -> bytes:
        return self.codec.send(Error(str(error)))

    # -- publishes and calls ---------------------------------------------------------
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
        answer: Callable[[Any, Receipt], Event],
    ) -> None:
        """Hand a publish or call to the hub with ``send`` and answer it once its receipt
        settles; while draining it is answered ``failed`` at once instead."""
        codec = self.codec
        if self.conn.shutdown.is_set():
            self.write(codec.send(Published(ident, "failed", "the gateway is shutting down")))
            return
        await self.submit(send, lambda receipt: codec.send(answer(ident, receipt)))

    # -- subscriptions ---------------------------------------------------------------
    def _subscribe(self, event: Subscribe) -> None:
        if self.conn.shutdown.is_set():
            raise RemoteProtocolError("the gateway is shutting down")
        if event.destination in self.feeds:
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
        self.feeds[event.destination] = self.subscriber.add(sub, self._deliver, ended=self._ended)

    async def _deliver(self, tag: int, d: Delivery) -> None:
        """One delivery as a ``msg`` line, under our ``tag`` for it.

        The line is made only once there is room for it: a subscription left (``unsub``)
        while this waited has handed the delivery back to the hub and forgotten ``tag``,
        and a line made before would reach the client after the ``unsub`` was read.
        """
        await self.wait_for_room()
        if tag not in self.subscriber.tags:
            return
        m, reply_by = d.message, d.reply_by
        line = self.codec.send(
            Deliver(
                tag,
                m.destination,
                m.body,
                m.headers,
                m.content_type,
                d.redelivered,
                position=None if d.position is None else d.position.offset,
                call=reply_by is not None,
                reply_within=(
                    None if reply_by is None else round(max(0.0, reply_by - trio.current_time()), 3)
                ),
            )
        )
        await self.write_when_room(line)

    async def _ended(self, feed: Feed, why: FeedStop) -> None:
        """A finite read is done: say so with an ``end`` line (its deliveries are still
        settled as usual)."""
        destination = feed.sub.destination
        if why is FeedStop.END:
            if self.feeds.get(destination) is feed:
                del self.feeds[destination]
            await self.write_when_room(self.codec.send(End(destination)))
        elif why is FeedStop.CLOSED:
            raise trio.ClosedResourceError(f"subscription to {destination!r} closed")

    def _reject(self, tag: int, reason: str) -> None:
        self.subscriber.nack(tag, requeue=False, outcome=Outcome.REJECTED, reason=reason)

    def _settle(self, settle: Callable[..., None], tag: int, *args: Any) -> None:
        try:
            settle(tag, *args)
        except UnknownTag:
            raise RemoteProtocolError(f"unknown delivery tag {tag}") from None

    def _feed(self, destination: str) -> Feed:
        try:
            return self.feeds[destination]
        except KeyError:
            raise RemoteProtocolError(f"not subscribed to {destination!r}") from None


def _published(ident: Any, receipt: Receipt) -> Event:
    assert receipt.outcome is not None
    positions = None if receipt.plain else _offsets(receipt.result(0).positions)
    return Published(ident, _STATUS[receipt.outcome], receipt.reason, positions=positions)


def _published_many(ident: Any, receipt: Receipt) -> Event:
    assert receipt.outcome is not None
    results = tuple(
        ItemResult(_STATUS[r.outcome], r.reason, _offsets(r.positions)) for r in receipt.results()
    )
    return Published(ident, _STATUS[receipt.outcome], receipt.reason, results=results)


def _call_answer(ident: Any, receipt: Receipt) -> Event:
    assert receipt.outcome is not None
    reply = receipt.reply
    if reply is None:
        return Published(ident, _STATUS[receipt.outcome], receipt.reason)
    # Another protocol's service may use codes outside ndjson's range.
    code = reply.status if 0 <= reply.status <= MAX_CODE else UNKNOWN_CODE
    return Replied(ident, reply.body, reply.headers, reply.content_type, code, reply.message)


def _offsets(positions: Mapping[str, Position]) -> dict[str, int] | None:
    """Positions as the ``pos`` object of an ``ack`` line (None when there are none)."""
    return {name: p.offset for name, p in positions.items()} if positions else None


class _ClientSession(Session):
    """One connection of an upstream: publish deliveries, ack them on the server's ack."""

    codec: ClientCodec

    def __init__(self, ctx: UpstreamContext, stream: trio.abc.Stream, sub: Subscription) -> None:
        options = ctx.options
        self.timeout: float = options["timeout"]
        super().__init__(
            stream,
            ClientCodec(max_line=options["max_line"]),
            log=ctx.log,
            write_timeout=self.timeout,
        )
        self.sub = sub
        self.rename: str = options["destination"]
        #: Publishes the server has not answered: our id -> the delivery's tag.
        self.unacked: dict[int, int] = {}
        self._ids = itertools.count(1)

    def started(self) -> None:
        self.nursery.start_soon(self._send_loop)

    async def _send_loop(self) -> None:
        codec, sub, unacked = self.codec, self.sub, self.unacked
        while True:
            out = bytearray()
            deliveries = await sub.receive()
            if not unacked:  # the ack clock starts with the first publish it waits for
                self.set_deadline(trio.current_time() + self.timeout, self._no_ack())
            for d in deliveries:
                ident = next(self._ids)
                unacked[ident] = d.tag
                m = d.message
                destination = self.rename or m.destination
                out += codec.send(Publish(m.body, destination, m.headers, m.content_type, ident))
            await self.write_when_room(out)

    def _no_ack(self) -> str:
        return f"no ack for {self.timeout:g}s"

    async def handle(self, event: Event) -> None:
        if isinstance(event, Published):
            self._settle(event)
        elif isinstance(event, Error):
            raise RemoteProtocolError(f"the server reported: {event.message}")

    def received(self) -> None:
        # Whatever a read brought restarts the clock; with nothing unacked there is none.
        if self.unacked:
            self.set_deadline(trio.current_time() + self.timeout, self._no_ack())
        else:
            self.clear_deadline()

    def end_of_input(self) -> None:
        raise trio.BrokenResourceError("the server closed the connection")

    def _settle(self, event: Published) -> None:
        if not isinstance(event.id, int) or event.id not in self.unacked:
            raise RemoteProtocolError(f"ack for unknown id {event.id!r}")
        tag = self.unacked.pop(event.id)
        if event.status == "delivered":
            self.sub.ack(tag)
        elif event.status == "rejected":
            self.sub.nack(tag, requeue=False, outcome=Outcome.REJECTED, reason=event.reason)
        else:
            self.sub.nack(tag)  # failed: retried, now or after reconnecting


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
        await _ServerSession(conn).serve()

    async def run_upstream(self, ctx: UpstreamContext) -> None:
        window: int = ctx.options["window"]

        async def session(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
            with ctx.subscribe(max_unacked=window) as sub:
                await _ClientSession(ctx, stream, sub).run()

        await ctx.run_sessions(session)
