"""The subscriber side of a connection, written once: hub subscriptions pumped to the
peer, and the peer's acks, nacks and replies back to the hub.

A protocol that delivers to its peer makes one :class:`Subscriber` per
connection (or per stream, where each stream is a subscription of its own)
and adds each hub subscription to it with :meth:`Subscriber.add`, which
starts that subscription's pump and returns its :class:`Feed`. The protocol
says only how one delivery goes on the wire (``send(tag, delivery)``) and
what to do when a feed stops; the toolkit does the rest:

* **the pump** (one task per subscription): take what the subscription has
  (:meth:`~gateway.core.destination.Subscription.take`, never more than the
  room allows), hand each delivery to ``send`` with a peer tag (or the whole
  batch, with its tags, to ``send_many``: one frame or one write per batch, in
  either ack mode), wait
  (:meth:`~gateway.core.destination.Subscription.watch`) when there is nothing
  to take; it stops at the end of a finite read (:attr:`FeedStop.END`), when the
  subscription is closed under it (:attr:`FeedStop.CLOSED`: the hub closing), or
  when told to (:attr:`FeedStop.STOPPED`: unsubscribe, drain, a protocol error).
  A feed told to stop mid-batch sends nothing more: what it took and did not
  send goes back to the hub at once;
* **peer tags** (:mod:`.tags`): each delivery sent gets the next tag of the
  peer's sequence space (integers from 1, or a wrapping space such as
  Micromessage2's 1..65535), and the peer settles by that tag: :meth:`ack`,
  :meth:`ack_many`, :meth:`nack`, :meth:`reply`, and :meth:`ack_through`,
  the cumulative ack ("everything up to N", in serial order);
* **when a delivery is acked to the hub**: ``ack="peer"`` (the default) when
  the peer acks it; ``ack="write"`` as soon as it was written (after
  ``flush``), for protocols without consumer acks (at most once);
* **room**: each subscription's own window and credit (``max_unacked``,
  ``credit``, ``grant``) bound what it hands out as always; on top of them a
  subscriber may hold **one window across all its subscriptions**
  (``window``: deliveries the peer has not settled, as Micromessage2's
  per-connection ack window), and **demand** in messages, per connection
  (:meth:`grant`) or per feed (:meth:`Feed.grant`), which saturates at
  :data:`MAX_DEMAND` (Reactive Streams' ``request(n)``): adding to a large
  demand caps it instead of growing without end;
* **drain, busy, pending**: :meth:`drain` stops every pump and keeps what the
  peer still owes; :meth:`busy` (deliveries not settled) is what a drain
  waits for; :meth:`pending` (busy, or a pump still running) keeps the
  connection from the idle timeout. A :class:`~gateway.protocol.session.Session`
  given the subscriber (``session.subscriber``) counts both and drains and
  closes it by itself;
* **a peer that leaves**: :meth:`close` closes every subscription, which hands
  each delivery the peer had not acked back to its group: another member
  gets it (``redelivered``), or this one again after a reconnect.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal

import trio

from gateway.core.destination import Delivery, EndOfStream, Subscription
from gateway.core.model import Outcome, Reply
from gateway.protocol.tags import UNBOUNDED, SerialSpace, TagTable, UnknownTag

__all__ = ["MAX_DEMAND", "AckMode", "Demand", "Feed", "FeedStop", "SendMany", "Subscriber"]

#: The most demand a subscriber keeps (Reactive Streams' 2**63 - 1, "effectively
#: unbounded"): more is capped there.
MAX_DEMAND = 2**63 - 1

#: When a delivery is acked to the hub: when the peer acks it, or once written.
AckMode = Literal["peer", "write"]


class FeedStop(enum.Enum):
    """Why a feed's pump stopped."""

    #: A finite read handed out everything before its end; the peer still settles it.
    END = "end"
    #: The subscription was closed under the pump (the hub closed); its unacked
    #: deliveries went back to the group, and the peer's tags for them are forgotten.
    CLOSED = "closed"
    #: The protocol stopped it (:meth:`Feed.stop`, :meth:`Feed.close`,
    #: :meth:`Subscriber.drain`).
    STOPPED = "stopped"


class Demand:
    """Messages the peer asked for and was not sent yet (``None``: unlimited).

    Saturating: granting more than ``limit`` in all leaves ``limit``.
    """

    __slots__ = ("limit", "value")

    def __init__(self, initial: int | None = None, *, limit: int = MAX_DEMAND) -> None:
        if initial is not None and initial < 0:
            raise ValueError("demand must not be negative")
        self.limit = limit
        #: What may still be sent (None: unlimited).
        self.value = None if initial is None else min(initial, limit)

    def grant(self, n: int) -> None:
        """``n`` more (Reactive Streams ``request(n)``), capped at ``limit``."""
        if n < 0:
            raise ValueError("demand must not be negative")
        if self.value is not None:
            self.value = min(self.value + n, self.limit)

    def spend(self, n: int) -> None:
        if self.value is not None:
            self.value -= n


#: Puts one delivery on the wire, under the peer's ``tag`` for it.
Send = Callable[[int, Delivery], Awaitable[None]]
#: Puts a batch of deliveries on the wire at once, under the peer's tags for them
#: (consecutive in the peer's sequence space, in order; with ``ack="write"``, the
#: hub's tags, as the peer settles nothing).
SendMany = Callable[[list[int], list[Delivery]], Awaitable[None]]
#: Waits until what was sent is written (handed to the socket, not merely queued).
Flush = Callable[[], Awaitable[None]]


class Feed:
    """One subscription pumped to the peer (made by :meth:`Subscriber.add`)."""

    __slots__ = (
        "_lot",
        "_owner",
        "closed",
        "demand",
        "ended",
        "flush",
        "outstanding",
        "send",
        "send_many",
        "stopped",
        "sub",
        "writing",
    )

    def __init__(
        self,
        owner: Subscriber,
        sub: Subscription,
        send: Send,
        flush: Flush | None,
        ended: Callable[[Feed, FeedStop], Awaitable[None]] | None,
        credit: int | None,
        send_many: SendMany | None = None,
    ) -> None:
        self._owner = owner
        self.sub = sub
        self.send = send
        #: Sends a whole batch in one call (None: one ``send`` per delivery).
        self.send_many = send_many
        self.flush = flush
        self.ended = ended
        #: This feed's own demand, on top of the subscription's credit (None: unlimited).
        self.demand = Demand(credit)
        #: Deliveries sent and not settled by the peer (``ack="peer"``).
        self.outstanding = 0
        #: Deliveries being written and not acked to the hub yet (``ack="write"``).
        self.writing = 0
        #: Why the pump stopped, or was told to (None: it runs).
        self.stopped: FeedStop | None = None
        #: The subscription was closed through this feed.
        self.closed = False
        self._lot = trio.lowlevel.ParkingLot()

    @property
    def done(self) -> bool:
        """The pump stopped and every delivery it sent was settled."""
        return self.stopped is not None and not self.outstanding and not self.writing

    def grant(self, n: int) -> None:
        """``n`` more deliveries for this feed (saturating, see :class:`Demand`)."""
        self.demand.grant(n)
        self.wake()

    def stop(self) -> None:
        """Send nothing more; deliveries sent stay for the peer to settle."""
        if self.stopped is None:
            self.stopped = FeedStop.STOPPED
            self.wake()

    def close(self) -> None:
        """Stop, forget the peer's tags of this feed, and close the subscription: its
        unacked deliveries go back to the group (idempotent)."""
        if self.closed:
            return
        self.closed = True
        self.stop()
        self._owner._forget(self)
        self.sub.close()

    def wake(self) -> None:
        """Have the pump look again (room or demand may have changed)."""
        if self._lot:
            self._lot.unpark_all()


class Subscriber:
    """The subscriber side of one connection or stream (see the module docstring).

    Pumps run in ``nursery``. ``space`` numbers the peer's tags, from
    ``start`` (by default its first number); a wrapping space needs a
    ``window`` under half of it, so that tags outstanding compare without
    ambiguity and none is handed out twice. ``progress`` is
    called whenever the peer settled something or a feed stopped (a
    session's :meth:`~gateway.protocol.session.Session.progress`: drains
    re-check, the idle timeout restarts).
    """

    def __init__(
        self,
        nursery: trio.Nursery,
        *,
        ack: AckMode = "peer",
        window: int | None = None,
        credit: int | None = None,
        space: SerialSpace = UNBOUNDED,
        start: int | None = None,
        progress: Callable[[], None] | None = None,
    ) -> None:
        if window is not None and window < 1:
            raise ValueError("a window must be at least 1")
        limit = space.max_window
        if limit is not None and ack == "peer" and (window is None or window > limit):
            raise ValueError(
                f"tags {space.first}..{space.last} wrap: the window must be at most {limit}"
            )
        self._nursery = nursery
        self.ack_on_write = ack == "write"
        #: Deliveries not settled by the peer, across every feed (None: no such bound).
        self.window = window
        #: The connection's demand, across every feed (None: unlimited).
        self.demand = Demand(credit)
        self.tags: TagTable[Feed] = TagTable(space, start)
        self.feeds: list[Feed] = []
        self._writing = 0
        self._progress = progress
        self._closed = False

    # -- feeds ---------------------------------------------------------------------------
    def add(
        self,
        sub: Subscription,
        send: Send,
        *,
        flush: Flush | None = None,
        ended: Callable[[Feed, FeedStop], Awaitable[None]] | None = None,
        credit: int | None = None,
        send_many: SendMany | None = None,
    ) -> Feed:
        """Pump ``sub`` to the peer through ``send``.

        ``send_many``, if given, takes each batch the pump takes in one call
        instead, so that a protocol frames and writes it at once rather than
        awaiting ``send`` per delivery: with ``ack="peer"`` the peer tags of the
        whole batch are handed out first; with ``ack="write"`` it gets the hub's
        tags, and the batch is acked once ``send_many`` (and ``flush``) returned.
        A feed stopped before the call sends none of the batch (it goes back to
        the hub); once called, the whole batch counts as sent.

        ``flush``, if given, is awaited after each batch (before its acks, with
        ``ack="write"``). ``ended(feed, why)`` is awaited once the pump stopped
        (an ``end`` frame for :attr:`FeedStop.END`, say). ``credit``: the feed's own
        demand (None: unlimited; the subscription's credit applies anyway).
        """
        if self._closed:
            raise trio.ClosedResourceError("the subscriber is closed")
        feed = Feed(self, sub, send, flush, ended, credit, send_many)
        sub.watch(feed._lot)
        self.feeds.append(feed)
        self._nursery.start_soon(self._pump, feed)
        return feed

    def grant(self, n: int) -> None:
        """``n`` more deliveries across every feed (saturating, see :class:`Demand`)."""
        self.demand.grant(n)
        self._wake_all()

    def drain(self) -> None:
        """Stop every pump: nothing more is sent; the peer still settles what it got."""
        for feed in self.feeds:
            feed.stop()

    def close(self) -> None:
        """Close every feed: unacked deliveries go back to their groups (idempotent)."""
        self._closed = True
        for feed in list(self.feeds):
            feed.close()

    @property
    def outstanding(self) -> int:
        """Deliveries the peer has not settled, and those being written (``ack="write"``)."""
        return len(self.tags) + self._writing

    def busy(self) -> bool:
        """Whether deliveries are unsettled: what a drain waits for."""
        return bool(len(self.tags) or self._writing)

    def pending(self) -> bool:
        """Whether the peer owes acks or a pump still runs: not idle."""
        return self.busy() or any(feed.stopped is None for feed in self.feeds)

    # -- what the peer settles, by its tags -------------------------------------------------
    def ack(self, tag: int) -> None:
        """The peer acked ``tag``: ack the delivery to the hub."""
        feed, hub_tag = self.tags.pop(tag)
        feed.outstanding -= 1
        try:
            feed.sub.ack(hub_tag)
        except KeyError:  # its subscription was closed under the feed: handed back already
            raise UnknownTag(tag) from None
        finally:
            self._settled()

    def ack_many(self, tags: Iterable[int]) -> None:
        """Ack ``tags`` in order; an unknown tag raises :class:`UnknownTag` after the ones
        before it were acked."""
        entries: list[tuple[Feed, int]] = []
        try:
            for tag in tags:
                entries.append(self.tags.pop(tag))
        finally:
            if entries:
                self._ack_entries(entries)

    def ack_through(self, tag: int) -> int:
        """Cumulative ack: every outstanding tag up to ``tag`` in serial order (tags
        acked before are passed over); how many that acked. A ``tag`` never handed
        out is :class:`UnknownTag`."""
        entries = self.tags.pop_through(tag)
        if entries:
            self._ack_entries(entries)
        return len(entries)

    def nack(
        self, tag: int, *, requeue: bool = True, outcome: Outcome = Outcome.FAILED, reason: str = ""
    ) -> None:
        """The peer gave ``tag`` back: redeliver it, or settle it with ``outcome``."""
        feed, hub_tag = self.tags.pop(tag)
        feed.outstanding -= 1
        try:
            feed.sub.nack(hub_tag, requeue=requeue, outcome=outcome, reason=reason)
        except KeyError:
            raise UnknownTag(tag) from None
        finally:
            self._settled()

    def reply(self, tag: int, reply: Reply) -> None:
        """The peer answered the call delivered as ``tag`` (:class:`~.tags.NotACall` if
        it asked for no reply): settles it like an ack."""
        feed, hub_tag = self.tags.pop(tag, call=True)
        feed.outstanding -= 1
        try:
            feed.sub.reply(hub_tag, reply)
        except KeyError:
            raise UnknownTag(tag) from None
        finally:
            self._settled()

    def _ack_entries(self, entries: list[tuple[Feed, int]]) -> None:
        """Ack ``entries`` at the hub, each run of one feed's in one call."""
        i, n = 0, len(entries)
        try:
            while i < n:
                feed = entries[i][0]
                j = i + 1
                while j < n and entries[j][0] is feed:
                    j += 1
                feed.outstanding -= j - i
                hub_tags = [hub_tag for _, hub_tag in entries[i:j]]
                i = j
                try:
                    feed.sub.ack_many(hub_tags)
                except KeyError:
                    pass  # its subscription was closed under it: handed back already
        finally:
            self._settled()

    def _settled(self) -> None:
        if self.window is not None:
            self._wake_all()
        if self._progress is not None:
            self._progress()

    # -- the pumps --------------------------------------------------------------------------
    async def _pump(self, feed: Feed) -> None:
        why = await self._run(feed)
        if feed.stopped is None:
            feed.stopped = why
        if why is FeedStop.CLOSED:
            self._forget(feed)
        if self._progress is not None:
            self._progress()
        if feed.ended is not None:
            await feed.ended(feed, why)

    async def _run(self, feed: Feed) -> FeedStop:
        """Take and send until told to stop, the read ends or the subscription closes."""
        sub = feed.sub
        lot = feed._lot
        while feed.stopped is None:
            try:
                batch = sub.take(self._room(feed))
            except EndOfStream:
                return FeedStop.END
            except trio.ClosedResourceError:
                return feed.stopped or FeedStop.CLOSED
            if not batch:
                await lot.park()
                continue
            if self.ack_on_write:
                await self._write(feed, batch)
            else:
                await self._hand(feed, batch)
            if self.window is not None and len(self.feeds) > 1:
                # The other feeds take their share of the window before this one again.
                await trio.lowlevel.checkpoint()
        return feed.stopped

    def _room(self, feed: Feed) -> int | None:
        """How many ``feed`` may take now (None: as many as its subscription allows)."""
        n = feed.demand.value
        shared = self.demand.value
        if shared is not None:
            n = shared if n is None else min(n, shared)
        if self.window is not None:
            free = self.window - self.outstanding
            running = sum(1 for f in self.feeds if f.stopped is None)
            if running > 1:  # a fair share, so that one busy feed does not take it all
                free = -(-free // running)
            n = free if n is None else min(n, free)
        return None if n is None else max(n, 0)

    async def _hand(self, feed: Feed, batch: list[Delivery]) -> None:
        """``ack="peer"``: send each delivery under a peer tag the peer settles by."""
        self._spend(feed, len(batch))
        add = self.tags.add
        if feed.send_many is not None:
            tags = self.tags.add_many(
                feed, [d.tag for d in batch], [d.reply_by is not None for d in batch]
            )
            feed.outstanding += len(tags)
            await feed.send_many(tags, batch)
            if feed.flush is not None:
                await feed.flush()
            return
        send = feed.send
        sent = 0
        for d in batch:
            if feed.stopped is not None:
                break
            tag = add(feed, d.tag, d.reply_by is not None)
            feed.outstanding += 1
            await send(tag, d)
            sent += 1
        if feed.flush is not None and sent:
            await feed.flush()
        if sent < len(batch):
            self._give_back(feed, batch[sent:])

    async def _write(self, feed: Feed, batch: list[Delivery]) -> None:
        """``ack="write"``: send the batch, flush it, then ack what was written."""
        self._spend(feed, len(batch))
        k = len(batch)
        self._writing += k
        feed.writing += k
        written: list[int] = []
        try:
            if feed.send_many is not None:
                if feed.stopped is None:
                    tags = [d.tag for d in batch]
                    await feed.send_many(tags, batch)
                    written = tags
            else:
                for d in batch:
                    if feed.stopped is not None:
                        break
                    await feed.send(d.tag, d)
                    written.append(d.tag)
            if feed.flush is not None and written:
                await feed.flush()
        finally:
            self._writing -= k
            feed.writing -= k
        if written and not feed.closed:
            feed.sub.ack_many(written)
        if len(written) < k:
            self._give_back(feed, batch[len(written) :])
        self._settled()

    def _spend(self, feed: Feed, n: int) -> None:
        feed.demand.spend(n)
        self.demand.spend(n)

    def _give_back(self, feed: Feed, unsent: list[Delivery]) -> None:
        """Deliveries taken and not sent (the feed stopped mid-batch) go back to the hub
        now, and the demand they used with them."""
        feed.demand.grant(len(unsent))
        self.demand.grant(len(unsent))
        if feed.closed:
            return  # closing the subscription handed them back
        try:
            for d in unsent:
                feed.sub.nack(d.tag)
        except KeyError:
            pass  # the subscription was closed under the feed: handed back already

    def _forget(self, feed: Feed) -> None:
        """``feed``'s subscription closed: its tags are settled for the peer."""
        if feed in self.feeds:
            self.feeds.remove(feed)
        dropped = self.tags.drop(feed)
        feed.outstanding -= dropped
        if dropped:
            self._settled()
        elif self._progress is not None:
            self._progress()

    def _wake_all(self) -> None:
        for feed in self.feeds:
            feed.wake()
