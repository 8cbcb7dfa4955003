"""The publisher side of a reactive-streams connection: streams the peer subscribed to.

* **Subscribing**: each ``subscribe(publisher, id, demand)`` is opened by the
  session's *opener* (a listener: a destination it exposes; an upstream: its
  queue) into a hub subscription. What the opener refuses is answered
  ``onError(id, reason)`` (a rejection: no ``subscribed``); otherwise
  ``subscribed(id, elementSize)``, elementSize being the destination's fixed
  element size or 0.
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
  codec's ``onError`` and closes it too.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.sdk import Delivery, Feed, FeedStop, LocalProtocolError, Subscriber, Subscription

from . import messages as m
from .events import BadRequest, Cancelled, DemandAdded, SubscribeRequested

if TYPE_CHECKING:
    from .peer import PeerSession

__all__ = ["Opener", "Outgoing"]

#: Opens a hub subscription for a publisher string: the subscription and the
#: element size of its destination (0: variable). ValueError or LookupError:
#: refused, the message is the onError's reason.
Opener = Callable[[str], tuple[Subscription, int]]


@dataclass(eq=False)
class Stream:
    """One subscription to us: its feed and what is on its way to the peer."""

    id: int
    element_size: int
    feed: Feed | None = None
    #: Peer tags sent and not yet acked to the hub (``ack = "demand"``).
    unacked: deque[int] = field(default_factory=deque)
    #: Demand the peer requested beyond its initial demand, not yet spent on acks.
    processed: int = 0


class Outgoing:
    """The streams one connection publishes to its peer (see the module docstring)."""

    def __init__(
        self,
        session: PeerSession,
        opener: Opener,
        *,
        ack_on_demand: bool,
        part_size: int,
    ) -> None:
        self.session = session
        self.opener = opener
        self.ack_on_demand = ack_on_demand
        self.part_size = part_size
        self.streams: dict[int, Stream] = {}
        self.subscriber: Subscriber | None = None

    def start(self) -> Subscriber:
        """The session started: make its subscriber toolkit (acks as configured)."""
        s = self.session
        self.subscriber = Subscriber(
            s.nursery, ack="peer" if self.ack_on_demand else "write", progress=s.progress
        )
        return self.subscriber

    def handle(self, event: object) -> bool:
        """Act on ``event`` if it is about a subscription to us; whether it was."""
        if isinstance(event, DemandAdded):
            self._demand(event)
        elif isinstance(event, SubscribeRequested):
            self._subscribe(event)
        elif isinstance(event, Cancelled):
            self._close(event.subscriber)
        elif isinstance(event, BadRequest):
            self.session.send_message(m.OnError(event.subscriber, event.error))
            self._close(event.subscriber)
        else:
            return False
        return True

    def clear(self) -> None:
        self.streams.clear()

    # -- subscribing -------------------------------------------------------------------------
    def _subscribe(self, event: SubscribeRequested) -> None:
        sid, session = event.subscriber, self.session
        if session.shutdown is not None and session.shutdown.is_set():
            session.metrics.refused.inc()
            session.send_message(m.OnError(sid, "the gateway is shutting down"))
            return
        try:
            sub, size = self.opener(event.publisher)
        except (ValueError, LookupError) as e:
            session.metrics.refused.inc()
            session.send_message(m.OnError(sid, str(e)))
            return
        stream = Stream(sid, size)
        if event.initial_demand >= m.MAX_DEMAND:
            stream.processed = m.MAX_DEMAND  # unbounded: it will never request
        session.metrics.served.inc()
        session.send_message(m.Subscribed(sid, size))
        self.streams[sid] = stream
        stream.feed = self._feed(stream, sub, event.initial_demand)

    def _feed(self, stream: Stream, sub: Subscription, credit: int) -> Feed:
        assert self.subscriber is not None
        if self.ack_on_demand:
            send_many = lambda tags, ds: self._send_many(stream, tags, ds)  # noqa: E731
        else:
            send_many = lambda tags, ds: self._write(stream, ds)  # noqa: E731
        return self.subscriber.add(
            sub,
            _unused,
            send_many=send_many,
            ended=lambda feed, why: self._ended(stream, why),
            credit=credit,
        )

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
    async def _write(self, stream: Stream, ds: list[Delivery]) -> None:
        """``ack = "written"``: write the batch at once and wait until it is written
        (the toolkit acks it to the hub when this returns)."""
        try:
            data = self._encode(stream, [d.message.body for d in ds])
        except LocalProtocolError:
            return  # the peer ended the stream meanwhile: at most once, as documented
        await self.session.write_when_room(data)
        await self.session.flush()

    async def _send_many(self, stream: Stream, tags: list[int], ds: list[Delivery]) -> None:
        """``ack = "demand"``: write the batch; its tags wait for the peer's demand."""
        try:
            data = self._encode(stream, [d.message.body for d in ds])
        except LocalProtocolError:
            return  # the stream ended: closing it handed the deliveries back
        stream.unacked.extend(tags)
        self._settle(stream)
        await self.session.write_when_room(data)

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
        codec, sid, part = self.session.codec, stream.id, self.part_size
        sent = self.session.metrics.elements_sent
        out: list[bytes] = []
        if stream.element_size:
            step = max(1, part // stream.element_size)
            for at in range(0, len(bodies), step):
                out.append(codec.send_elements(sid, bodies[at : at + step]))
            sent.inc(len(bodies))
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
        sent.inc(len(bodies))
        return b"".join(out)

    async def _ended(self, stream: Stream, why: FeedStop) -> None:
        if self.streams.get(stream.id) is not stream:
            return  # cancelled or refused by the peer: nothing owed
        if why is FeedStop.END:
            self.session.send_message(m.OnComplete(stream.id))
            # A completed stream takes no more requests: the peer has it all.
            stream.processed = m.MAX_DEMAND
            self._settle(stream)
            self._close(stream.id)
        elif why is FeedStop.CLOSED:
            reason = "the subscription was closed by the gateway"
            self.session.send_message(m.OnError(stream.id, reason))
            self.streams.pop(stream.id, None)
        # else: stopped by a drain, and the goodbye ends the stream


async def _unused(tag: int, d: Delivery) -> None:  # pragma: no cover
    raise AssertionError("send_many takes every batch")
