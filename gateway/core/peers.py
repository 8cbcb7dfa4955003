"""In-memory topics across workers: forwarding by interest, one hop.

With ``gateway run --workers N`` each worker has its own hub. A message
published to an in-memory topic (kind ``"topic"``, no log) in one worker also
reaches the subscribers connected to the others: the hub hands each run it
put into a local topic to :meth:`Peers.forward`, which sends it once to every
other worker that announced *interest* in that topic (it has at least one
group there), as NATS routes do. A worker never forwards what it received
from another, so a message crosses at most one hop.

Receipts settle across the hop: each forwarded copy is one leg of the
publisher's receipt per message, settled when the other worker answers the
batch with its own local fan-out's outcome (its subscribers acked, or it had
nobody left to deliver to). A link that breaks fails every leg it had not
answered (the sender is not acked and resends). The bytes in flight on a link
are bounded: a full link makes the publish wait, as a full buffer does.

A stateful destination (a queue, a log, a topic with declared groups) lives
in one *home* worker; the others hold a proxy
(:class:`~gateway.core.remote.RemoteDestination`) that uses the same links: its
publishes are batches to the home (a call carries its deadline, the answer
its reply), and its subscriptions are opened at the home over the dialling
side (:class:`Outgoing` keeps the proxy's end, :class:`Incoming` the home
subscription, whose deliveries it pushes within the credit the proxy granted;
the home side's state is :mod:`gateway.core.homes`). A link that breaks ends
both ends: the home subscription closes, so what it had delivered unacked goes
back to its group.

This module keeps the state and makes the frames (:mod:`gateway.core.peerwire`);
moving the bytes is the runtime's (:mod:`gateway.runtime.peerlinks`). A
single-worker gateway has no :class:`Peers` and pays nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import trio

from gateway.core.destination import Delivery, EndOfStream, Subscription
from gateway.core.homes import Home, HomeFrame, Homes, OpenHome
from gateway.core.model import Message, Outcome, Position
from gateway.core.peerwire import (
    ENDINGS,
    VERSION,
    Answer,
    Batch,
    Committed,
    Deliveries,
    Ended,
    Failure,
    Frame,
    Hello,
    Interest,
    PeerWire,
    Subscribe,
    Unsubscribe,
    WireError,
)
from gateway.core.reasons import Reason
from gateway.core.receipts import Receipt
from gateway.core.topic import Topic

__all__ = ["DEFAULT_LINK_BYTES", "Outgoing", "Peers", "ProxyEnd"]

#: Bytes of batches one link may have in flight (sent, not answered) by default.
DEFAULT_LINK_BYTES = 8 * 1024 * 1024


@dataclass(slots=True)
class _InFlight:
    receipt: Receipt
    base: int
    count: int
    nbytes: int
    destination: str


class ProxyEnd(Protocol):
    """The proxy's end of a subscription opened at another worker: what the home
    sends for it (:class:`~gateway.core.remote.RemoteSubscription`)."""

    def delivered(self, deliveries: Sequence[Delivery]) -> None:
        """Deliveries, their ``reply_by`` as seconds left."""

    def ended(self, error: Exception) -> None:
        """The home subscription ended (closed, a finite read's end, an error)."""

    def moved(self, committed: Position | None) -> None:
        """The group's committed position moved."""


class Outgoing:
    """One link to another worker, from this side: what it wants and what it owes.

    The driver feeds it the frames the other worker sends (:meth:`received`)
    and writes out what :meth:`take` returns; :meth:`broken` ends it.
    """

    def __init__(self, me: int, peer: int, max_bytes: int, incarnation: int = 0) -> None:
        self.peer = peer
        #: The other worker's incarnation, once its hello arrived (0 before).
        self.incarnation = 0
        self.max_bytes = max_bytes
        #: Topics the other worker has subscribers for, as it announced them.
        self.interest: set[str] = set()
        self.inflight: dict[int, _InFlight] = {}
        self.inflight_bytes = 0
        self.wire = PeerWire()
        self.closed = False
        self._ids = itertools.count(1)
        #: Subscriptions opened at the other worker, by number: their proxies' ends.
        self.subscriptions: dict[int, ProxyEnd] = {}
        self._sub_ids = itertools.count(1)
        self._out: list[bytes] = [self.wire.encode(Hello(VERSION, me, incarnation))]
        self._has_output = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()

    async def send(
        self, name: str, messages: Sequence[Message], receipt: Receipt, base: int
    ) -> None:
        """Send one batch once the link has room; its legs settle on the answer.

        A call's batch carries the seconds left until its deadline."""
        batch = next(self._ids)
        timeout = None
        if receipt.is_call and receipt.reply_by is not None:
            timeout = max(receipt.reply_by - trio.current_time(), 0.0)
        frame = self.wire.encode(Batch(batch, name, tuple(messages), timeout))
        while (
            not self.closed
            and self.inflight_bytes
            and (self.inflight_bytes + len(frame) > self.max_bytes)
        ):
            await self._room.park()
        receipt.add_legs(len(messages))
        if self.closed:
            receipt.settle_range(base, base + len(messages), *_lost(self.peer))
            return
        self.inflight[batch] = _InFlight(receipt, base, len(messages), len(frame), name)
        self.inflight_bytes += len(frame)
        self._out.append(frame)
        self._has_output.unpark_all()

    def received(self, data: bytes | bytearray) -> None:
        """Take bytes from the other worker: interest changes and answers."""
        for frame in self.wire.receive_data(data):
            if isinstance(frame, Interest):
                self.interest.difference_update(frame.removed)
                self.interest.update(frame.added)
            elif isinstance(frame, Answer):
                self._answered(frame)
            elif isinstance(frame, Deliveries | Ended | Committed):
                self._for_proxy(frame)
            elif isinstance(frame, Hello):
                _check(frame)
                self.incarnation = frame.incarnation
            else:
                raise WireError(f"{type(frame).__name__} on the answering side of a link")

    # -- subscriptions opened at the other worker ------------------------------------
    def subscribe(self, request: Subscribe, end: ProxyEnd) -> int:
        """Open a subscription at the other worker (``request.sub`` is replaced by a
        number of this link); what it sends goes to ``end``. Returns the number."""
        sub = next(self._sub_ids)
        self.subscriptions[sub] = end
        self.push(dataclasses.replace(request, sub=sub))
        return sub

    def push(self, frame: Frame) -> None:
        """Queue a frame of a subscription (nothing once the link broke)."""
        if isinstance(frame, Unsubscribe):
            self.subscriptions.pop(frame.sub, None)
        if not self.closed:
            self._out.append(self.wire.encode(frame))
            self._has_output.unpark_all()

    def _for_proxy(self, frame: Deliveries | Ended | Committed) -> None:
        end = self.subscriptions.get(frame.sub)
        if end is None:
            return  # it closed here meanwhile
        if isinstance(frame, Deliveries):
            end.delivered(frame.deliveries)
        elif isinstance(frame, Committed):
            end.moved(frame.position)
        else:
            error = ENDINGS[frame.why](frame.reason)
            if not isinstance(error, EndOfStream):  # after a finite read's end, acks go on
                del self.subscriptions[frame.sub]
            end.ended(error)

    def _answered(self, answer: Answer) -> None:
        sent = self.inflight.pop(answer.batch, None)
        if sent is None:
            return
        self.inflight_bytes -= sent.nbytes
        self._room.unpark_all()
        _settle(sent, answer)

    async def take(self) -> list[bytes]:
        """Wait for frames to write, and return them (raises once broken)."""
        while not self._out:
            if self.closed:
                raise trio.ClosedResourceError("link closed")
            await self._has_output.park()
        out, self._out = self._out, []
        return out

    def broken(self) -> None:
        """The link is gone: every unanswered batch fails; nothing more is sent."""
        self.closed = True
        self.interest.clear()
        inflight, self.inflight = self.inflight, {}
        self.inflight_bytes = 0
        for sent in inflight.values():
            sent.receipt.settle_range(sent.base, sent.base + sent.count, *_lost(self.peer))
        ends, self.subscriptions = self.subscriptions, {}
        for end in ends.values():
            end.ended(trio.ClosedResourceError(f"the link to worker {self.peer} broke"))
        self._room.unpark_all()
        self._has_output.unpark_all()


def _check(hello: Hello) -> None:
    if hello.version != VERSION:
        raise WireError(f"link version {hello.version}, not {VERSION}")


def _lost(peer: int) -> tuple[Outcome, str]:
    return Outcome.FAILED, f"the link to worker {peer} broke before it answered"


def _settle(sent: _InFlight, answer: Answer) -> None:
    """Settle the legs of a batch from its answer: a call's one message with its
    reply; else its failures as answered, and each run between them delivered, or
    stored at the positions the home answered (a log's)."""
    receipt, base = sent.receipt, sent.base
    call = answer.reply is not None and not answer.positions and not answer.failures
    if call and sent.count == 1:
        receipt.settle(base, Outcome.DELIVERED, reply=answer.reply)
        return
    failed: dict[int, Failure] = {}
    for f in answer.failures:
        if 0 <= f.index < sent.count:
            failed.setdefault(f.index, f)
    at = 0
    for stop in [*sorted(failed), sent.count]:
        stored = [p for p in answer.positions[at:stop] if p is not None]
        if stored and len(stored) == stop - at:
            receipt.settle_stored(base + at, sent.destination, stored)
        else:
            receipt.settle_range(base + at, base + stop, Outcome.DELIVERED)
        failure = failed.get(stop)
        if failure is not None:
            receipt.settle(
                base + stop, failure.outcome, failure.reason, reason_code=failure.reason_code
            )
        at = stop + 1


#: What a worker does with a batch another worker forwarded: put it into the
#: local destination (waiting for room) and return the receipt of that local
#: fan-out; the third argument is a call's seconds left (None: no call).
Deliver = Callable[[str, list[Message], float | None], Awaitable[Receipt]]


class Incoming:
    """One link from another worker, from this side: batches in, answers and
    interest out."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers
        self.wire = PeerWire()
        self.closed = False
        self.announced: set[str] = set()
        self._out: list[bytes] = [self.wire.encode(Hello(VERSION, peers.index, peers.incarnation))]
        self._has_output = trio.lowlevel.ParkingLot()
        #: Subscriptions opened here for the other worker's proxies.
        self._homes = Homes(self._has_output)

    @property
    def homes(self) -> dict[int, Home]:
        """Subscriptions opened here for the other worker's proxies, by its numbers."""
        return self._homes.subs

    async def received(self, data: bytes | bytearray) -> None:
        """Take bytes from the other worker: put each batch into the local destination
        (in order, waiting for room there) and answer it once its fan-out settled;
        act on the frames of the subscriptions it opened here."""
        for frame in self.wire.receive_data(data):
            if isinstance(frame, Batch):
                receipt = await self.peers.deliver(
                    frame.destination, list(frame.messages), frame.timeout
                )
                answer = functools.partial(self.answer, frame.batch, frame.destination)
                receipt.add_done_callback(answer)
            elif isinstance(frame, HomeFrame):
                refused = self._homes.received(frame, self.peers.open_home)
                if refused is not None:
                    self._push(self.wire.encode(refused))
            elif isinstance(frame, Hello):
                _check(frame)
                self.peers.greeted(frame)
            else:
                raise WireError(f"{type(frame).__name__} on the batch side of a link")

    def answer(self, batch: int, destination: str, receipt: Receipt) -> None:
        """Queue the answer to ``batch`` once its local ``receipt`` settled (a call's
        with its reply, a log's with the positions it stored the messages at)."""
        if receipt.plain:
            self._push(self.wire.encode(Answer(batch)))
            return
        failures = tuple(
            Failure(i, r.outcome, r.reason, r.reason_code or Reason.OTHER)
            for i, r in ((i, receipt.result(i)) for i in receipt.failed())
        )
        positions: tuple[Position | None, ...] = tuple(receipt.positions_in(destination))
        if all(p is None for p in positions):
            positions = ()
        self._push(self.wire.encode(Answer(batch, failures, receipt.reply, positions)))

    def interest_changed(self) -> None:
        self._has_output.unpark_all()

    def _push(self, frame: bytes) -> None:
        if not self.closed:
            self._out.append(frame)
            self._has_output.unpark_all()

    async def take(self) -> list[bytes]:
        """Wait for frames to write (answers, interest changes) and return them."""
        while True:
            if self.closed:
                raise trio.ClosedResourceError("link closed")
            wanted = self.peers.interest
            added = tuple(sorted(wanted - self.announced))
            removed = tuple(sorted(self.announced - wanted))
            if added or removed:
                self.announced = set(wanted)
                self._out.append(self.wire.encode(Interest(added, removed)))
            if self.homes:
                self._out.extend(self.wire.encode(frame) for frame in self._homes.pump())
            if self._out:
                out, self._out = self._out, []
                return out
            await self._has_output.park()

    def broken(self) -> None:
        """The link is gone: every subscription opened here closes (its unacked
        deliveries go back to the group)."""
        self.closed = True
        self._homes.close()
        self._has_output.unpark_all()


class Peers:
    """This worker's links to the others, and the topics it has subscribers for."""

    def __init__(
        self, index: int, max_link_bytes: int = DEFAULT_LINK_BYTES, incarnation: int = 0
    ) -> None:
        #: This worker's index.
        self.index = index
        #: Which process this is (the runtime says its pid; 0: not said).
        self.incarnation = incarnation
        self.max_link_bytes = max_link_bytes
        #: Local topics with at least one group: what the others are told.
        self.interest: set[str] = set()
        self.outgoing: dict[int, Outgoing] = {}
        self.incoming: list[Incoming] = []
        #: Puts a forwarded batch into the local topic (the hub sets it when joining).
        self.deliver: Deliver = _no_hub
        #: Opens a subscription for another worker's proxy (the hub sets it too).
        self.open_home: OpenHome = _no_home
        #: Batches and messages forwarded to other workers, for the figures.
        self.batches_sent = 0
        self.messages_sent = 0
        self._linked = trio.lowlevel.ParkingLot()
        #: What waits for a link to a worker there is none to yet, by worker.
        self._when_linked: dict[int, list[Callable[[Outgoing], None]]] = {}

    # -- interest ------------------------------------------------------------------
    def watch(self, topic: Topic) -> None:
        """Follow ``topic``'s groups: announce it while it has any."""
        topic.on_interest = self._interest
        if topic.has_groups:
            self._interest(topic.name, True)

    def _interest(self, name: str, wanted: bool) -> None:
        if wanted:
            self.interest.add(name)
        else:
            self.interest.discard(name)
        for link in self.incoming:
            link.interest_changed()

    # -- forwarding ------------------------------------------------------------------
    async def forward(
        self, name: str, messages: Sequence[Message], receipt: Receipt, base: int
    ) -> None:
        """Send ``messages`` (indexes ``base``… of the publish, all for topic ``name``)
        once to each other worker that has interest; each copy is a leg of ``receipt``."""
        for link in list(self.outgoing.values()):
            if name in link.interest:
                await self.send(link, name, messages, receipt, base)

    async def send(
        self, link: Outgoing, name: str, messages: Sequence[Message], receipt: Receipt, base: int
    ) -> None:
        """Send ``messages`` for ``name`` over ``link`` in batches of about half its
        bound (:func:`split_batches`), each message a leg of ``receipt``; counted in
        the figures."""
        for lo, hi in split_batches(messages, link.max_bytes):
            await link.send(name, messages[lo:hi], receipt, base + lo)
            self.batches_sent += 1
        self.messages_sent += len(messages)

    def link(self, peer: int) -> Outgoing | None:
        """The open link to worker ``peer``, or None while there is none."""
        link = self.outgoing.get(peer)
        return None if link is None or link.closed else link

    def connected(self, peer: int) -> Outgoing:
        """A new link to worker ``peer`` (one that replaces an older one ends it)."""
        old = self.outgoing.pop(peer, None)
        if old is not None:
            old.broken()
        link = self.outgoing[peer] = Outgoing(
            self.index, peer, self.max_link_bytes, self.incarnation
        )
        self._linked.unpark_all()
        for callback in self._when_linked.pop(peer, ()):
            callback(link)
        return link

    def when_linked(self, peer: int, callback: Callable[[Outgoing], None]) -> None:
        """Call ``callback(link)`` once there is a new link to worker ``peer``."""
        self._when_linked.setdefault(peer, []).append(callback)

    async def wait_link(self, peer: int, timeout: float) -> Outgoing | None:
        """The link to worker ``peer``, waiting up to ``timeout`` seconds for one while
        there is none (the workers are starting, or ``peer`` is being restarted)."""
        with trio.move_on_after(timeout):
            while (link := self.link(peer)) is None:
                await self._linked.park()
            return link
        return None

    def greeted(self, hello: Hello) -> None:
        """Another worker linked to this one. If it is a new incarnation (a
        replacement, or a restart) of the worker the link from here reaches,
        that link goes to its predecessor, which may still be draining: end it,
        so that it is dialled again and reaches the new one."""
        link = self.outgoing.get(hello.worker)
        if (
            link is not None
            and 0 not in (link.incarnation, hello.incarnation)
            and (link.incarnation != hello.incarnation)
        ):
            link.broken()

    def disconnected(self, link: Outgoing) -> None:
        link.broken()
        if self.outgoing.get(link.peer) is link:
            del self.outgoing[link.peer]

    def accepted(self) -> Incoming:
        link = Incoming(self)
        self.incoming.append(link)
        return link

    def dropped(self, link: Incoming) -> None:
        link.broken()
        if link in self.incoming:
            self.incoming.remove(link)


async def _no_hub(name: str, messages: list[Message], timeout: float | None) -> Receipt:
    raise RuntimeError("no hub joined these peers")


def _no_home(request: Subscribe) -> Subscription:
    raise LookupError("no hub joined these peers")


def split_batches(messages: Sequence[Message], max_bytes: int) -> list[tuple[int, int]]:
    """Split ``messages`` into runs of about half a link's bound, so that one big
    window does not hold a link alone (a message larger goes on its own)."""
    limit = max(1, max_bytes // 2)
    out = []
    lo = total = 0
    for i, m in enumerate(messages):
        size = m.size
        if i > lo and total + size > limit:
            out.append((lo, i))
            lo, total = i, 0
        total += size
    if lo < len(messages):
        out.append((lo, len(messages)))
    return out
