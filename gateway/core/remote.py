"""Stateful destinations across workers: the proxy a worker holds for a
destination whose home is another worker.

With ``gateway run --workers N`` every stateful destination (a queue, a
``retain`` log, a durable log, a topic with declared groups) lives in one
*home* worker, so its semantics (competing consumers and redelivery, a named
group's committed position, replay, storage) are those of one process. The
other workers' hubs open a :class:`RemoteDestination` for the name instead (the
runtime puts a :class:`RemoteProvider` first among the hub's providers), which
reaches the home over the links between workers (:mod:`gateway.core.peers`):

* a publish is a batch to the home, which puts it into the real destination
  and answers once that receipt settled (stored, for a durable log); the
  publisher's legs settle from the answer, and fail if the link breaks first;
* a subscription is opened at the home with the same arguments; the home
  pushes deliveries only within the credit and unacked bounds this side
  granted, and acks, nacks and replies go back as frames. Closing it, or the
  link breaking, closes the home subscription: what it held unacked is
  redelivered to its group.

A proxy reports no figures of its own (zeros): the home's are the
destination's, and the fleet's merged status sums workers.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

import trio

from gateway.core.destination import (
    Delivery,
    Destination,
    DestinationFigures,
    DestinationInfo,
    EndOfStream,
    Refusal,
    StartAt,
    StopAt,
    Subscription,
)
from gateway.core.model import Message, Outcome, Position, Reply
from gateway.core.peers import Outgoing, Peers
from gateway.core.peerwire import Acks, Grant, Nack, Respond, Subscribe, Unsubscribe
from gateway.core.reasons import Reason
from gateway.core.receipts import Receipt

if TYPE_CHECKING:
    from gateway.core.filters import Filter

__all__ = ["LINK_WAIT", "RemoteDestination", "RemoteProvider", "RemoteSubscription"]

#: Seconds a publish to a destination whose home has no link waits for one (the
#: workers are starting, or the home is being restarted) before its messages fail
#: and the sender resends.
LINK_WAIT = 5.0


class RemoteProvider:
    """Opens a :class:`RemoteDestination` for each name homed at another worker.

    ``home`` says which worker is a name's home (None: no stateful destination,
    a plain topic of every worker); ``info`` what kind it is, from the config
    every worker shares, so that a proxy need not ask its home.
    """

    def __init__(
        self,
        peers: Peers,
        home: Callable[[str], int | None],
        info: Callable[[str], DestinationInfo],
    ) -> None:
        self.peers = peers
        self._home = home
        self._info = info

    def open(self, name: str) -> Destination | None:
        home = self._home(name)
        if home is None or home == self.peers.index:
            return None
        return RemoteDestination(self._info(name), self.peers, home)


class RemoteDestination(Destination):
    """A destination that lives in worker ``home``, as the other workers reach it."""

    def __init__(self, info: DestinationInfo, peers: Peers, home: int) -> None:
        self.name = info.name
        self._info = info
        self.peers = peers
        #: The worker where the destination lives.
        self.home = home
        self._subscriptions: set[RemoteSubscription] = set()

    @property
    def info(self) -> DestinationInfo:
        return self._info

    def check(self, message: Message) -> Refusal | None:
        return None  # the home checks, and answers a refusal as REJECTED

    async def put(self, message: Message, receipt: Receipt, index: int = 0) -> None:
        await self.put_many((message,), receipt, index)

    async def put_many(self, messages: Sequence[Message], receipt: Receipt, base: int = 0) -> None:
        """Send ``messages`` to the home (waiting while the link is full); their legs
        settle when it answers, or fail when it breaks first, or when there is no link
        within :data:`LINK_WAIT` seconds."""
        link = self.peers.link(self.home) or await self.peers.wait_link(self.home, LINK_WAIT)
        if link is None:
            receipt.add_legs(len(messages))
            receipt.settle_range(
                base,
                base + len(messages),
                Outcome.FAILED,
                f"no link to worker {self.home}, the home of {self.name!r}, within {LINK_WAIT:g}s",
                reason_code=Reason.UNAVAILABLE,
            )
            return
        await self.peers.send(link, self.name, messages, receipt, base)

    def subscribe(
        self,
        group: str | None = None,
        *,
        credit: int | None = None,
        max_unacked: int = 1024,
        max_unacked_bytes: int | None = None,
        start: StartAt | None = None,
        end: StopAt | None = None,
        filter: Filter | None = None,
        positions: bool = True,
    ) -> Subscription:
        """A subscription opened at the home; an error opening it there (a bad
        start, say) is raised by its ``receive`` and ``take``."""
        request = Subscribe(
            0,
            self.name,
            group,
            credit,
            max_unacked,
            max_unacked_bytes,
            start,
            end,
            filter,
            positions,
        )
        sub = RemoteSubscription(self, request, self.peers.link(self.home))
        if not sub.closed:
            self._subscriptions.add(sub)
        return sub

    def forget(self, sub: RemoteSubscription) -> None:
        self._subscriptions.discard(sub)

    def declare_group(self, group: str) -> None:
        """Nothing here: the home declares the groups of its config."""

    def close(self) -> None:
        for sub in list(self._subscriptions):
            sub.ended(trio.ClosedResourceError("the hub is closed"))
        self._subscriptions.clear()

    def figures(self) -> DestinationFigures:
        """Zeros: the home reports the destination (merged status sums workers)."""
        return DestinationFigures(
            kind=self._info.kind,
            received=0,
            delivered=0,
            acked=0,
            backlog=0,
            backlog_bytes=None,
            kept=0,
            kept_bytes=0,
            kept_fill=0.0,
            full=False,
        )

    def stats(self) -> dict[str, object]:
        return {"home": self.home}


class RemoteSubscription(Subscription):
    """A subscription whose real one is at the destination's home.

    It keeps the consumer's view here (credit, unacked tags, committed
    position) and what the home pushed and the consumer has not taken yet;
    the home's subscription holds the same credit and unacked bounds, so it
    never pushes more than this side may hold.
    """

    def __init__(
        self, destination: RemoteDestination, request: Subscribe, link: Outgoing | None
    ) -> None:
        self.destination = destination.name
        self.group = request.group
        self.filter = request.filter
        self._owner = destination
        self._credit = request.credit
        self._unacked: set[int] = set()
        self._calls: set[int] = set()
        self._buffer: collections.deque[Delivery] = collections.deque()
        self._error: Exception | None = None
        self._committed: Position | None = None
        self._wake = trio.lowlevel.ParkingLot()
        self._lots: list[trio.lowlevel.ParkingLot] = []
        self.closed = False
        self._link = link
        self._number = 0
        #: The request, while there is no link to the home to send it over yet.
        self._pending: Subscribe | None = None
        self._deadline = 0.0
        if link is None:
            self._pending = request
            self._deadline = trio.current_time() + LINK_WAIT
            destination.peers.when_linked(destination.home, self._linked)
        else:
            self._number = link.subscribe(request, self)

    def _linked(self, link: Outgoing) -> None:
        """The home is reachable at last: open the subscription there, with the
        credit granted meanwhile."""
        request, self._pending = self._pending, None
        if request is None or self.closed or self._error is not None:
            return
        self._link = link
        self._number = link.subscribe(dataclasses.replace(request, credit=self._credit), self)
        self._wake_up()

    def _check_pending(self) -> None:
        """No link to the home within :data:`LINK_WAIT`: the subscription ends."""
        if self._pending is not None and trio.current_time() >= self._deadline:
            self._pending = None
            self.ended(
                trio.ClosedResourceError(
                    f"no link to worker {self._owner.home}, the home of"
                    f" {self.destination!r}, within {LINK_WAIT:g}s"
                )
            )

    # -- what the home sends (ProxyEnd) ------------------------------------------------
    def delivered(self, deliveries: Sequence[Delivery]) -> None:
        now = trio.current_time()
        for d in deliveries:
            if d.reply_by is not None:
                d = d._replace(reply_by=now + d.reply_by)
            self._buffer.append(d)
        self._wake_up()

    def ended(self, error: Exception) -> None:
        if self._error is not None:
            return
        self._error = error
        if not isinstance(error, EndOfStream):
            # The home closed its subscription: what it delivered goes back to the group.
            self._buffer.clear()
            self._unacked.clear()
            self._calls.clear()
            self._owner.forget(self)
        self._wake_up()

    def moved(self, committed: Position | None) -> None:
        self._committed = committed

    def _wake_up(self) -> None:
        self._wake.unpark_all()
        for lot in self._lots:
            lot.unpark_all()

    # -- the Subscription interface ------------------------------------------------------
    @property
    def credit(self) -> int | None:
        return self._credit

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    @property
    def committed(self) -> Position | None:
        return self._committed

    def grant(self, n: int) -> None:
        if n <= 0:
            return
        if self._credit is not None:
            self._credit += n
        self._send(Grant(self._number, n))

    def take(self, max_count: int | None = None) -> list[Delivery]:
        if self.closed:
            raise trio.ClosedResourceError("the subscription is closed")
        self._check_pending()
        buffer = self._buffer
        if not buffer:
            if self._error is not None:
                raise self._error
            return []
        n = len(buffer) if max_count is None else min(max_count, len(buffer))
        out = [buffer.popleft() for _ in range(n)]
        if self._credit is not None:
            self._credit = max(self._credit - n, 0)
        for d in out:
            self._unacked.add(d.tag)
            if d.reply_by is not None:
                self._calls.add(d.tag)
        return out

    async def receive(self, max_count: int | None = None) -> list[Delivery]:
        while True:
            out = self.take(max_count)
            if out or max_count == 0:
                return out
            if self._pending is None:
                await self._wake.park()
                continue
            with trio.move_on_at(self._deadline):
                await self._wake.park()

    def watch(self, lot: trio.lowlevel.ParkingLot) -> None:
        self._lots.append(lot)

    def ack(self, tag: int) -> None:
        self.ack_many((tag,))

    def ack_many(self, tags: Iterable[int]) -> None:
        mine = tuple(t for t in tags if t in self._unacked)
        if mine:
            self._unacked.difference_update(mine)
            self._calls.difference_update(mine)
            self._send(Acks(self._number, mine))

    def nack(
        self, tag: int, *, requeue: bool = True, outcome: Outcome = Outcome.FAILED, reason: str = ""
    ) -> None:
        if tag in self._unacked:
            self._unacked.discard(tag)
            self._calls.discard(tag)
            self._send(Nack(self._number, tag, requeue, outcome, reason))

    def reply(self, tag: int, reply: Reply) -> None:
        if tag not in self._calls:
            raise ValueError(f"delivery {tag} of {self.destination!r} is no call awaiting a reply")
        self._calls.discard(tag)
        self._unacked.discard(tag)
        self._send(Respond(self._number, tag, reply))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._send(Unsubscribe(self._number))
        self._buffer.clear()
        self._unacked.clear()
        self._owner.forget(self)
        self._wake_up()
        self._lots.clear()

    def _send(self, frame: Grant | Acks | Nack | Respond | Unsubscribe) -> None:
        if self._link is not None and (self._error is None or self._finished):
            self._link.push(frame)

    @property
    def _finished(self) -> bool:
        """A finite read ended at the home: its subscription stays for the acks."""
        return isinstance(self._error, EndOfStream)
