"""The reactive-streams listener's session: the gateway as a publisher.

* **Handshake**: our serverHello goes out at once; the client's hello must
  arrive within ``handshake_timeout``.
* **Subscribing**: each ``subscribe(publisher, id, demand)`` is parsed
  (:func:`~.publisher_names.parse_publisher`) into a hub subscription. A name
  the listener's ``publishers`` globs do not match, a malformed string, or a
  subscription the hub refuses is answered ``onError(id, reason)`` (a
  rejection: no ``subscribed``); otherwise ``subscribed(id, elementSize)``,
  elementSize being the destination's fixed element size or 0.
* **Delivering**: one :class:`~gateway.sdk.Feed` per stream, whose own demand
  is the peer's (initial demand, then each ``request(n)``), so never more is
  sent than requested. Each batch the feed takes is one write: elements of a
  fixed size packed (``onNextPacked``, in chunks of at most ``part_size``
  bytes), others as ``onNext``, those larger than ``part_size`` in parts. A
  finite read (``to=``) ends with ``onComplete``; a subscription the hub
  closes with ``onError``.
* **Acks to the hub**: ``written`` (at most once): a batch is acked once
  written to the socket. ``demand`` (at least once for a named group): the
  k-th element of a stream is acked once the peer has requested k more than
  its initial demand, since a peer requests more only after processing
  (an unbounded demand: as sent; a completed stream: with its onComplete).
* **Ending**: ``cancel`` closes the stream's subscription (what was not acked
  goes back to the group); a non-positive ``request`` is answered with the
  codec's ``onError`` and closes it too; a goodbye is answered with a goodbye
  and the connection closes; a protocol error gets
  ``goodbye("protocol-error: …")``. When the gateway drains, we say goodbye
  and close once the peer answers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import trio

from gateway.sdk import (
    Delivery,
    Feed,
    FeedStop,
    LocalProtocolError,
    RemoteProtocolError,
    ServerConnection,
    Session,
    Subscriber,
    Subscription,
)

from . import messages as m
from .codec import Connection, Phase, Role, goodbye_reason
from .events import (
    BadRequest,
    Cancelled,
    DemandAdded,
    GoodbyeAnswered,
    GoodbyeReceived,
    Hello,
    Pinged,
    SubscribeRequested,
)
from .publisher_names import PublisherName, exposed, parse_publisher

__all__ = ["ReactiveSession"]

#: The goodbye reason sent when the gateway drains.
SHUTTING_DOWN = "going-away: the gateway is shutting down"


@dataclass(eq=False)
class Stream:
    """One subscription to us: its feed and what is on its way to the peer."""

    id: int
    element_size: int
    feed: Feed | None = None
    #: Bodies handed to ``send`` and not yet encoded (``ack = "written"``).
    pending: list[bytes] = field(default_factory=list)
    #: Peer tags sent and not yet acked to the hub (``ack = "demand"``).
    unacked: deque[int] = field(default_factory=deque)
    #: Demand the peer requested beyond its initial demand, not yet spent on acks.
    processed: int = 0


class ReactiveSession(Session):
    """One accepted reactive-streams connection, the gateway publishing."""

    codec: Connection
    read_while_draining = True  # the peer's answer to our goodbye still arrives

    def __init__(
        self,
        conn: ServerConnection,
        *,
        publishers: tuple[str, ...],
        ack_on_demand: bool = False,
        part_size: int = 64 * 1024,
        max_unacked: int = 1024,
        handshake_timeout: float = 10.0,
    ) -> None:
        super().__init__(conn.stream, Connection(Role.SERVER), log=conn.log, shutdown=conn.shutdown)
        self.conn = conn
        self.publishers = publishers
        self.ack_on_demand = ack_on_demand
        self.part_size = part_size
        self.max_unacked = max_unacked
        self.handshake_timeout = handshake_timeout
        self.streams: dict[int, Stream] = {}

    # -- the skeleton's hooks ---------------------------------------------------------------
    def started(self) -> None:
        self.subscriber = Subscriber(
            self.nursery, ack="peer" if self.ack_on_demand else "write", progress=self.progress
        )
        self.write(self.codec.hello())
        self.set_deadline(
            trio.current_time() + self.handshake_timeout,
            f"no hello within {self.handshake_timeout:g}s",
        )

    def useful(self, event: Any) -> bool:
        return not isinstance(event, Pinged)

    def error_reply(self, error: RemoteProtocolError) -> bytes | None:
        return self.codec.send(m.Goodbye(goodbye_reason(error)))

    def draining(self) -> None:
        super().draining()
        self._send(m.Goodbye(SHUTTING_DOWN))

    def busy(self) -> bool:
        """A drain also waits for the answer to our goodbye (``drain_timeout`` bounds it)."""
        return super().busy() or self.codec.phase is Phase.GOODBYE_SENT

    def finished(self) -> None:
        self.streams.clear()

    # -- events -------------------------------------------------------------------------------
    async def handle(self, event: Any) -> None:
        if isinstance(event, SubscribeRequested):
            self._subscribe(event)
        elif isinstance(event, DemandAdded):
            self._demand(event)
        elif isinstance(event, Cancelled):
            self._close(event.subscriber)
        elif isinstance(event, BadRequest):
            self._send(m.OnError(event.subscriber, event.error))
            self._close(event.subscriber)
        elif isinstance(event, Pinged):
            self._send(m.Pong(event.payload))
        elif isinstance(event, Hello):
            self.clear_deadline()
        elif isinstance(event, GoodbyeReceived | GoodbyeAnswered):
            self._goodbye(event)

    def _goodbye(self, event: GoodbyeReceived | GoodbyeAnswered) -> None:
        """The peer said goodbye (answered) or answered ours: close once written."""
        if isinstance(event, GoodbyeReceived) and not event.answers_ours:
            self._send(m.Goodbye(event.reason))
        self.stop()
        self.progress()  # a drain waiting for the answer looks again

    def _send(self, message: m.Message) -> None:
        """Queue ``message``, unless the stream or connection it is for has ended on the
        peer's side meanwhile (a cancel crossing our onComplete, say)."""
        try:
            self.write(self.codec.send(message))
        except LocalProtocolError:
            pass

    # -- subscribing -------------------------------------------------------------------------
    def _subscribe(self, event: SubscribeRequested) -> None:
        sid = event.subscriber
        if self.conn.shutdown.is_set():
            self._send(m.OnError(sid, "the gateway is shutting down"))
            return
        try:
            name = parse_publisher(event.publisher)
            if not exposed(name.destination, self.publishers):
                raise LookupError(f"publisher {name.destination!r} is not exposed")
            stream, sub = self._open(sid, name)
        except (ValueError, LookupError) as e:
            self._send(m.OnError(sid, str(e)))
            return
        if event.initial_demand >= m.MAX_DEMAND:
            stream.processed = m.MAX_DEMAND  # unbounded: it will never request
        self._send(m.Subscribed(sid, stream.element_size))
        assert self.subscriber is not None
        self.streams[sid] = stream
        if self.ack_on_demand:
            stream.feed = self.subscriber.add(
                sub,
                self._unused,
                send_many=lambda tags, ds: self._send_many(stream, tags, ds),
                ended=lambda feed, why: self._ended(stream, why),
                credit=event.initial_demand,
            )
        else:
            stream.feed = self.subscriber.add(
                sub,
                lambda tag, d: self._collect(stream, d),
                flush=lambda: self._flush(stream),
                ended=lambda feed, why: self._ended(stream, why),
                credit=event.initial_demand,
            )

    def _open(self, sid: int, name: PublisherName) -> tuple[Stream, Subscription]:
        """The stream and its hub subscription (ValueError, LookupError: refused)."""
        hub = self.conn.hub
        size = hub.info(name.destination).element_size or 0
        sub = hub.subscribe(
            name.destination,
            name.group,
            max_unacked=self.max_unacked,
            start=name.start,
            end=name.end,
            filter=name.filter,
            positions=False,  # elements carry bodies only
        )
        return Stream(sid, size), sub

    def _demand(self, event: DemandAdded) -> None:
        stream = self.streams.get(event.subscriber)
        if stream is None or stream.feed is None:
            return
        stream.feed.grant(event.demand)
        if self.ack_on_demand:
            if event.outstanding >= m.MAX_DEMAND:
                stream.processed = m.MAX_DEMAND  # unbounded now: no request follows
            else:
                stream.processed = min(stream.processed + event.demand, m.MAX_DEMAND)
            self._settle(stream)

    def _close(self, sid: int) -> None:
        stream = self.streams.pop(sid, None)
        if stream is not None and stream.feed is not None:
            stream.feed.close()

    # -- delivering --------------------------------------------------------------------------
    async def _collect(self, stream: Stream, d: Delivery) -> None:
        """``ack = "written"``: gather the batch; :meth:`_flush` writes it at once."""
        stream.pending.append(d.message.body)

    async def _flush(self, stream: Stream) -> None:
        bodies, stream.pending = stream.pending, []
        try:
            data = self._encode(stream, bodies)
        except LocalProtocolError:
            return  # the peer ended the stream meanwhile: at most once, as documented
        await self.write_when_room(data)
        await self.flush()

    async def _unused(self, tag: int, d: Delivery) -> None:  # pragma: no cover
        raise AssertionError("send_many takes every batch")

    async def _send_many(self, stream: Stream, tags: list[int], ds: list[Delivery]) -> None:
        """``ack = "demand"``: write the batch; its tags wait for the peer's demand."""
        try:
            data = self._encode(stream, [d.message.body for d in ds])
        except LocalProtocolError:
            return  # the stream ended: closing it handed the deliveries back
        stream.unacked.extend(tags)
        self._settle(stream)
        await self.write_when_room(data)

    def _settle(self, stream: Stream) -> None:
        """Ack the deliveries the peer's demand beyond its initial demand has passed."""
        assert self.subscriber is not None
        done: list[int] = []
        while stream.unacked and stream.processed > 0:
            done.append(stream.unacked.popleft())
            stream.processed -= 1
        if done:
            self.subscriber.ack_many(done)

    def _encode(self, stream: Stream, bodies: list[bytes]) -> bytes:
        """One blob for a batch: packed chunks of fixed-size elements, else onNext runs
        with the elements above ``part_size`` in parts."""
        codec, sid, part = self.codec, stream.id, self.part_size
        out: list[bytes] = []
        if stream.element_size:
            step = max(1, part // stream.element_size)
            for at in range(0, len(bodies), step):
                out.append(codec.send_elements(sid, bodies[at : at + step]))
            return b"".join(out)
        run: list[bytes] = []
        for body in bodies:
            if len(body) <= part:
                run.append(body)
                continue
            if run:
                out.append(codec.send_elements(sid, run))
                run = []
            out.append(codec.send_split(sid, body, part))
        if run:
            out.append(codec.send_elements(sid, run))
        return b"".join(out)

    async def _ended(self, stream: Stream, why: FeedStop) -> None:
        if self.streams.get(stream.id) is not stream:
            return  # cancelled or refused by the peer: nothing owed
        if why is FeedStop.END:
            self._send(m.OnComplete(stream.id))
            # A completed stream takes no more requests: the peer has it all.
            stream.processed = m.MAX_DEMAND
            self._settle(stream)
            self._close(stream.id)
        elif why is FeedStop.CLOSED:
            self._send(m.OnError(stream.id, "the subscription was closed by the gateway"))
            self.streams.pop(stream.id, None)
        # else: stopped by a drain, and the goodbye ends the stream
