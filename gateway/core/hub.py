"""The hub: routes published messages to destinations and tracks receipts.

Publishing returns a :class:`~gateway.core.receipts.Receipt` that settles when every
copy of every message has been delivered (acked by a subscriber) or stored;
the worst outcome wins, and each message's own result is kept. Protocol
listeners ack their senders only from that receipt. A *call* is a publish of
one message that wants a reply: a subscriber answers it, and the reply reaches
the caller through the receipt, or the call fails at its deadline.

Destinations are created on demand: by a provider (the ``[[destinations]]``
table, the durable store) when one claims the name, else as an in-memory
topic; ``upstream:NAME`` destinations are queues, so nothing routed to an
upstream is lost while it is down.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import math
import operator
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypeGuard

import trio

from gateway.core.budget import MemoryBudget
from gateway.core.destination import (
    Destination,
    DestinationInfo,
    DestinationProvider,
    StartAt,
    StopAt,
    Subscription,
)
from gateway.core.model import Message, Outcome
from gateway.core.peers import Peers
from gateway.core.peerwire import Subscribe
from gateway.core.reasons import Reason
from gateway.core.receipts import Receipt
from gateway.core.remote import RemoteDestination
from gateway.core.routing import UPSTREAM_PREFIX, Router
from gateway.core.topic import Topic, TopicLimits
from gateway.ops.tap import Tap

if TYPE_CHECKING:
    from gateway.core.filters import Filter

__all__ = ["Hub", "HubLimits", "NoDestination"]

log = logging.getLogger(__name__)

_DESTINATION = operator.attrgetter("destination")


class NoDestination(LookupError):
    """A name the hub has no destination for, and will not create one for; ``code``
    says why (:class:`~gateway.core.reasons.Reason`)."""

    def __init__(self, code: Reason, text: str) -> None:
        super().__init__(text)
        self.code = code


@dataclasses.dataclass(frozen=True, slots=True)
class HubLimits:
    #: Bytes one group of one destination may hold (queued plus unacked).
    buffer_bytes: int = 64 * 1024 * 1024
    #: Messages one group of one destination may hold.
    buffer_messages: int = 100_000
    #: Destinations the hub will create on demand.
    max_destinations: int = 10_000
    #: Bytes the whole gateway may hold: every destination's buffers plus what
    #: connections hold partly received. Publishes wait and reads pause above it.
    memory_budget: int = 512 * 1024 * 1024
    #: Bytes one connection may hold partly received (an unfinished window, a
    #: frame being reassembled); a peer that needs more is refused with an error.
    connection_memory: int = 64 * 1024 * 1024


class Hub:
    """Routes messages to destinations; owns every destination of a gateway."""

    def __init__(
        self,
        router: Router | None = None,
        limits: HubLimits | None = None,
        providers: Sequence[DestinationProvider] = (),
        upstreams: Iterable[str] = (),
        budget: MemoryBudget | None = None,
    ) -> None:
        self.router = router or Router()
        self.limits = limits or HubLimits()
        #: What every destination the hub creates charges its buffers to (None: no budget).
        self.budget = budget
        self._topic_limits = TopicLimits(
            self.limits.buffer_bytes, self.limits.buffer_messages, budget
        )
        self._providers = list(providers)
        self._destinations: dict[str, Destination] = {}
        self._upstreams = set(upstreams)
        self._inflight = 0
        #: Settled publishes: how many were delivered, and the others by (outcome,
        #: reason code); plain counts that the metrics read at scrape time.
        self.delivered = 0
        self.not_delivered: dict[tuple[Outcome, Reason], int] = {}
        self._idle = trio.lowlevel.ParkingLot()
        self._closed = False
        #: Call deadlines: ``(reply_by, n, receipt, reason)``, soonest first.
        self._deadlines: list[tuple[float, int, Receipt, str]] = []
        self._deadline_ids = itertools.count()
        self._calls = 0
        self._timer = trio.lowlevel.ParkingLot()
        self._timers_running = False
        #: Passive views of what is stored (``gateway tap``), never part of a receipt.
        self._taps: list[Tap] = []
        #: The other workers' hubs, with ``--workers N``: in-memory topics forward
        #: to them (:mod:`gateway.core.peers`); None in a single process.
        self.peers: Peers | None = None

    # -- destinations -----------------------------------------------------------
    def destination(self, name: str) -> Destination:
        """The destination called ``name``, created on first use."""
        d = self._destinations.get(name)
        if d is not None:
            return d
        if self._closed:
            raise trio.ClosedResourceError("the hub is closed")
        if len(self._destinations) >= self.limits.max_destinations:
            raise NoDestination(
                Reason.TOO_MANY_DESTINATIONS,
                f"too many destinations ({self.limits.max_destinations}); not creating {name!r}",
            )
        if name.startswith(UPSTREAM_PREFIX) and name[len(UPSTREAM_PREFIX) :] not in self._upstreams:
            raise NoDestination(
                Reason.NO_UPSTREAM, f"no upstream named {name[len(UPSTREAM_PREFIX) :]!r}"
            )
        for provider in self._providers:
            d = provider.open(name)
            if d is not None:
                break
        else:
            queue = name.startswith(UPSTREAM_PREFIX)
            d = Topic(name, self._topic_limits, kind="queue" if queue else "topic")
        self._destinations[name] = d
        if self.peers is not None and _forwarded_to(d):
            self.peers.watch(d)
        return d

    def join(self, peers: Peers) -> None:
        """Forward in-memory topics to (and take them from) other workers' hubs, and
        serve the other workers' proxies of the destinations whose home is here
        (:mod:`gateway.core.remote`)."""
        self.peers = peers
        peers.deliver = self._accept_forwarded
        peers.open_home = self._open_home
        for d in self._destinations.values():
            if _forwarded_to(d):
                peers.watch(d)

    def _open_home(self, request: Subscribe) -> Subscription:
        """A subscription another worker's proxy asked for, opened here at the home."""
        return self.subscribe(
            request.destination,
            request.group,
            credit=request.credit,
            max_unacked=request.max_unacked,
            max_unacked_bytes=request.max_unacked_bytes,
            start=request.start,
            end=request.end,
            filter=request.filter,
            positions=request.positions,
        )

    async def _accept_forwarded(
        self, name: str, messages: list[Message], timeout: float | None = None
    ) -> Receipt:
        """Put a batch another worker sent into the local destination ``name`` (waiting
        for room) and return the receipt of this worker's fan-out. It is not routed
        again, nor forwarded on: a message crosses one hop. ``timeout``: the batch is
        a call with that many seconds left."""
        if timeout is not None and self._timers_running:
            receipt = Receipt.for_call(trio.current_time() + timeout)
            self._track_call(receipt, f"no reply within {timeout:g}s")
        else:
            receipt = Receipt(len(messages))
        try:
            dest = self.destination(name)
            await dest.put_many(messages, receipt, 0)
            if _forwarded_to(dest):
                dest.forwarded_in += len(messages)
        except LookupError as e:
            code = e.code if isinstance(e, NoDestination) else Reason.UNAVAILABLE
            receipt.add_legs(len(messages))
            receipt.settle_range(0, len(messages), Outcome.REJECTED, str(e), reason_code=code)
        except trio.ClosedResourceError as e:
            receipt.expire(str(e), Reason.CLOSED)
        finally:
            receipt.seal()
        return receipt

    def add_upstream(self, name: str) -> None:
        """``upstream:NAME`` may be created from now on (a reload added the upstream)."""
        self._upstreams.add(name)

    def tap(self, pattern: str, filter: Filter | None = None) -> Tap:
        """A passive view of the messages stored into destinations matching ``pattern``.

        It holds no credit, takes no part in any receipt and never slows a
        publisher: what its reader does not take in time is dropped and
        counted (:attr:`Tap.dropped`). Close it with :meth:`untap`.
        """
        tap = Tap(pattern, filter)
        self._taps.append(tap)
        return tap

    def untap(self, tap: Tap) -> None:
        tap.close()
        if tap in self._taps:
            self._taps.remove(tap)

    def destinations(self) -> dict[str, Destination]:
        """A snapshot of the destinations that exist now, here: a proxy of one whose
        home is another worker is left out (the home reports it)."""
        return {n: d for n, d in self._destinations.items() if not isinstance(d, RemoteDestination)}

    def info(self, destination: str) -> DestinationInfo:
        """What kind ``destination`` is (it is created if it does not exist yet)."""
        return self.destination(destination).info

    def subscribe(
        self,
        destination: str,
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
        """Subscribe to ``destination`` (see :meth:`Destination.subscribe`)."""
        return self.destination(destination).subscribe(
            group,
            credit=credit,
            max_unacked=max_unacked,
            max_unacked_bytes=max_unacked_bytes,
            start=start,
            end=end,
            filter=filter,
            positions=positions,
        )

    # -- publishing ---------------------------------------------------------------
    async def publish(self, messages: Iterable[Message]) -> Receipt:
        """Route ``messages`` to their targets; return one receipt for all of them.

        Waits while a target's buffer is full (backpressure). A message no
        target can ever take settles its leg as rejected instead of waiting.
        """
        if self._closed:
            raise trio.ClosedResourceError("the hub is closed")
        if not isinstance(messages, list):
            messages = list(messages)
        receipt = Receipt(len(messages))
        await self._publish(messages, receipt)
        return receipt

    async def call(self, message: Message, timeout: float) -> Receipt:
        """Publish ``message`` as a call: a subscriber answers it with a reply.

        The receipt settles at the first reply (``receipt.reply``), or fails when
        no reply came within ``timeout`` seconds, when nobody subscribes, or
        when its copies were settled without a reply. Needs :meth:`run`.
        """
        if self._closed:
            raise trio.ClosedResourceError("the hub is closed")
        if not self._timers_running:
            raise RuntimeError("calls need the hub's timers: run hub.run() in a nursery")
        if not timeout > 0:
            raise ValueError("a call needs a timeout above 0")
        receipt = Receipt.for_call(trio.current_time() + timeout)
        self._track_call(receipt, f"no reply within {timeout:g}s")
        await self._publish([message], receipt)
        return receipt

    def _track_call(self, receipt: Receipt, reason: str) -> None:
        """Expire the call ``receipt`` at its deadline unless it settled before."""
        assert receipt.reply_by is not None
        self._calls += 1
        heapq.heappush(
            self._deadlines, (receipt.reply_by, next(self._deadline_ids), receipt, reason)
        )
        if self._deadlines[0][2] is receipt:
            self._timer.unpark_all()
        receipt.add_done_callback(self._call_settled)

    async def _publish(self, messages: list[Message], receipt: Receipt) -> None:
        self._inflight += 1
        receipt.add_done_callback(self._settled)
        try:
            names = list(map(_DESTINATION, messages))
            if names and names.count(names[0]) == len(names):
                # All for one destination (a protocol's window, typically).
                await self._route(messages, receipt, 0)
                return
            # Runs of messages for one destination are routed and put together.
            start = 0
            for i in range(1, len(messages) + 1):
                if i == len(messages) or names[i] != names[start]:
                    await self._route(messages[start:i], receipt, start)
                    start = i
        except trio.ClosedResourceError as e:
            # Shutdown closed a target under the publish: it fails (nobody gets this receipt).
            receipt.expire(str(e), Reason.CLOSED)
            raise
        finally:
            # Legs already handed out still settle; the receipt settles after them.
            receipt.seal()

    async def _route(self, run: list[Message], receipt: Receipt, base: int) -> None:
        """Put ``run`` (messages ``base``… of the publish, for one destination) into
        each of its targets."""
        name = run[0].destination
        for target in self.router.targets(name):
            copies = run
            if target != name and not target.startswith(UPSTREAM_PREFIX):
                copies = [m._replace(destination=target) for m in run]
            try:
                dest = self.destination(target)
                if receipt.is_call and dest.info.kind == "log":
                    raise NoDestination(
                        Reason.TAKES_NO_CALLS, f"destination {target!r} is a log: it takes no calls"
                    )
            except LookupError as e:
                # A provider that cannot open the name raises a LookupError of its own.
                code = e.code if isinstance(e, NoDestination) else Reason.UNAVAILABLE
                receipt.add_legs(len(copies))
                receipt.settle_range(
                    base, base + len(copies), Outcome.REJECTED, str(e), reason_code=code
                )
                continue
            await dest.put_many(copies, receipt, base)
            if self.peers is not None and _forwarded_to(dest):
                # Other workers' subscribers of a plain topic get their copies too (a
                # call's batch carries its deadline, and the answer its reply).
                await self.peers.forward(dest.name, copies, receipt, base)
            if self._taps:
                for tap in self._taps:
                    if tap.watches(target):
                        tap.offer(target, copies)

    # -- call deadlines -------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Expire calls at their deadlines, until cancelled (the runtime starts it)."""
        if self._timers_running:
            raise RuntimeError("the hub's timers are already running")
        self._timers_running = True
        task_status.started()
        try:
            while True:
                now = trio.current_time()
                deadlines = self._deadlines
                while deadlines and deadlines[0][0] <= now:
                    _, _, receipt, reason = heapq.heappop(deadlines)
                    receipt.expire(reason, Reason.EXPIRED)
                with trio.move_on_at(deadlines[0][0] if deadlines else math.inf):
                    await self._timer.park()
        finally:
            self._timers_running = False

    def _call_settled(self, _: Receipt) -> None:
        self._calls -= 1
        # Answered calls stay in the heap until their deadline; drop them in
        # bulk when they outnumber the live ones, so memory follows live calls.
        if len(self._deadlines) > 1024 and len(self._deadlines) > 2 * self._calls:
            self._deadlines = [d for d in self._deadlines if not d[2].done()]
            heapq.heapify(self._deadlines)

    def _settled(self, receipt: Receipt) -> None:
        self._inflight -= 1
        outcome = receipt.outcome
        if outcome is Outcome.DELIVERED:
            self.delivered += 1
        elif outcome is not None:
            key = (outcome, receipt.reason_code or Reason.OTHER)
            self.not_delivered[key] = self.not_delivered.get(key, 0) + 1
        if self._inflight == 0 and self._idle:
            self._idle.unpark_all()

    @property
    def inflight(self) -> int:
        """Publishes whose receipts have not settled yet."""
        return self._inflight

    async def wait_idle(self) -> None:
        """Wait until every receipt handed out so far has settled."""
        while self._inflight:
            await self._idle.park()

    def close(self) -> None:
        """Refuse new work and wake every waiting publisher and subscriber."""
        self._closed = True
        for d in self._destinations.values():
            d.close()


def _forwarded_to(d: Destination) -> TypeGuard[Topic]:
    """Whether ``d`` is a plain in-memory topic, which every worker has and the
    others forward to by interest; anything stateful has one home instead."""
    return type(d) is Topic and d.kind == "topic" and not d.declared_groups
