"""The home side of proxied subscriptions: subscriptions opened here for other workers.

A stateful destination lives in one *home* worker; a subscriber connected to
another worker subscribes through a proxy
(:class:`~gateway.core.remote.RemoteSubscription`), which asks the home over
the link between the two workers (:mod:`gateway.core.peers`) to open the real
subscription. :class:`Homes` keeps the subscriptions one link opened here, by
the numbers the proxies' side gave them: it acts on the frames the proxies
send (grants, acks, nacks, replies, unsubscribes) and says what to send back
(:meth:`Homes.pump`): the deliveries each subscription hands out, within the
credit and unacked bounds its proxy granted, its committed position once it
moved, and its end. A link that breaks closes them all, so what they had
delivered unacked goes back to their groups.

It deals in frames (:mod:`gateway.core.peerwire`), not bytes: the link
(:class:`~gateway.core.peers.Incoming`) encodes what it is given and wakes on
the parking lot the subscriptions watch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from gateway.core.destination import Delivery, EndOfStream, Subscription
from gateway.core.model import Position
from gateway.core.peerwire import (
    Acks,
    Committed,
    Deliveries,
    Ended,
    Frame,
    Grant,
    Nack,
    Respond,
    Subscribe,
    Unsubscribe,
    ending,
)

__all__ = ["Home", "HomeFrame", "Homes", "OpenHome"]

#: The links' log (:mod:`gateway.core.peers`): the home side is part of a link.
log = logging.getLogger("gateway.core.peers")

#: Opens a subscription here for another worker's proxy (raises as
#: :meth:`~gateway.core.destination.Destination.subscribe` does).
OpenHome = Callable[[Subscribe], Subscription]
#: The frames a proxy's side sends about its subscriptions here.
HomeFrame = Subscribe | Grant | Acks | Nack | Respond | Unsubscribe


@dataclass(slots=True)
class Home:
    """A subscription opened here for another worker's proxy."""

    sub: Subscription
    committed: Position | None = None
    #: A finite read that ended: nothing more to take, but acks still come.
    ended: bool = False


class Homes:
    """The subscriptions one link opened here, by the numbers its proxies gave them.

    ``wake`` is the link's parking lot: every subscription watches it, and it is
    woken when a frame may have given one something to deliver.
    """

    def __init__(self, wake: trio.lowlevel.ParkingLot) -> None:
        self.subs: dict[int, Home] = {}
        self._wake = wake

    def received(self, frame: HomeFrame, open_home: OpenHome) -> Ended | None:
        """Act on ``frame`` (a subscribe is opened with ``open_home``); the frame that
        ends a subscription its home refused, to send back."""
        if isinstance(frame, Subscribe):
            return self._open(frame, open_home)
        home = self.subs.get(frame.sub)
        if home is None:
            return None  # it ended here meanwhile (the proxy learns it from an Ended frame)
        sub = home.sub
        if isinstance(frame, Acks):
            sub.ack_many(frame.tags)
        elif isinstance(frame, Grant):
            sub.grant(frame.n)
        elif isinstance(frame, Nack):
            sub.nack(frame.tag, requeue=frame.requeue, outcome=frame.outcome, reason=frame.reason)
        elif isinstance(frame, Respond):
            try:
                sub.reply(frame.tag, frame.reply)
            except ValueError as e:
                log.warning("a reply from another worker: %s", e)
        else:
            del self.subs[frame.sub]
            sub.close()
        self._wake.unpark_all()
        return None

    def _open(self, request: Subscribe, open_home: OpenHome) -> Ended | None:
        try:
            sub = open_home(request)
        except Exception as e:  # refused at home: the proxy raises it at receive
            return Ended(request.sub, ending(e), str(e))
        self.subs[request.sub] = Home(sub, sub.committed)
        sub.watch(self._wake)
        self._wake.unpark_all()  # it may have something to deliver already
        return None

    def pump(self) -> list[Frame]:
        """What the subscriptions have to send: deliveries (within the credit and
        unacked bounds the proxies gave them), moved commits, and their ends."""
        out: list[Frame] = []
        for number, home in list(self.subs.items()):
            committed = home.sub.committed
            if committed != home.committed:
                home.committed = committed
                out.append(Committed(number, committed))
            if home.ended:
                continue
            try:
                deliveries = home.sub.take()
            except (trio.ClosedResourceError, EndOfStream) as e:
                if isinstance(e, EndOfStream):
                    home.ended = True  # kept until the proxy closes it
                else:
                    del self.subs[number]
                out.append(Ended(number, ending(e), str(e)))
                continue
            if deliveries:
                out.append(Deliveries(number, home.sub.destination, _left(deliveries)))
        return out

    def close(self) -> None:
        """The link is gone: every subscription closes (its unacked deliveries go
        back to the group)."""
        subs, self.subs = self.subs, {}
        for home in subs.values():
            home.sub.close()


def _left(deliveries: Sequence[Delivery]) -> tuple[Delivery, ...]:
    """``deliveries`` with a call's ``reply_by`` as seconds left (clocks differ)."""
    if all(d.reply_by is None for d in deliveries):
        return tuple(deliveries)
    now = trio.current_time()
    return tuple(
        d if d.reply_by is None else d._replace(reply_by=max(d.reply_by - now, 0.0))
        for d in deliveries
    )
