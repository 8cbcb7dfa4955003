"""The per-subscription state machines and the connection's two id tables.

Both peers may subscribe on one connection, so each keeps two tables:

* :class:`MySubscriptions`: subscriptions I made, by the ids I chose (I am the
  subscriber); ``subscribe``/``request``/``cancel`` I send carry these ids, and
  ``subscribed``/``onNext*``/``onComplete``/``onError`` I receive carry them too;
* :class:`SubscriptionsToMe`: subscriptions the peer made, by the ids it chose
  (I am the publisher).

Demand follows Reactive Streams 1.0: it adds up, saturating at
:data:`~.messages.MAX_DEMAND` (which then means unbounded and is never spent);
``initialDemand`` is an implicit first request. An element packed with others
counts one each; a split element counts one, charged at its first part. Ids
are never reused within a connection.

Refusals: what the peer breaks is a :class:`RemoteProtocolError` (a connection
error), what our side asks wrongly a :class:`LocalProtocolError`; both leave
the tables unchanged.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from gateway.sdk import LocalProtocolError, RemoteProtocolError

from .messages import MAX_DEMAND

__all__ = [
    "Mine",
    "MySubscriptions",
    "Stage",
    "SubscriptionsToMe",
    "Theirs",
    "add_demand",
    "spend",
]


def add_demand(outstanding: int, more: int) -> int:
    """``outstanding`` plus ``more``, saturating at :data:`MAX_DEMAND`."""
    return min(MAX_DEMAND, outstanding + more)


def spend(outstanding: int, count: int) -> int:
    """What is left after ``count`` elements (unbounded stays unbounded)."""
    return outstanding if outstanding == MAX_DEMAND else outstanding - count


class Stage(enum.Enum):
    """Where one subscription stands."""

    #: subscribe sent/received, no subscribed yet.
    PENDING = "pending"
    #: subscribed: elements may flow.
    ACTIVE = "active"
    #: The publisher side owes onError (after a bad request).
    OWES_ERROR = "owes-error"


@dataclass(slots=True)
class Mine:
    """One of my subscriptions (I am the subscriber)."""

    stage: Stage = Stage.PENDING
    outstanding: int = 0
    element_size: int = 0
    #: The split element being reassembled: its id and parts.
    split_id: int | None = None
    parts: list[bytes] = field(default_factory=list)
    split_size: int = 0


@dataclass(slots=True)
class Theirs:
    """A subscription to me (I am the publisher)."""

    stage: Stage = Stage.PENDING
    outstanding: int = 0
    element_size: int = 0
    #: The id of the split element we are sending (None: none open).
    split_id: int | None = None


class MySubscriptions:
    """The ids I chose, and the subscriber side's rules."""

    def __init__(self, max_element: int) -> None:
        self.live: dict[int, Mine] = {}
        self.used: set[int] = set()
        #: Cancelled by us, no terminal signal seen: what still arrives for them is dropped.
        self.cancelled: set[int] = set()
        self.max_element = max_element

    # -- what I send -------------------------------------------------------------------
    def subscribe(self, subscriber: int, initial_demand: int) -> None:
        if subscriber in self.used:
            raise LocalProtocolError(f"subscribe: id {subscriber} was used on this connection")
        _check_demand(initial_demand, zero_ok=True)
        self.used.add(subscriber)
        self.live[subscriber] = Mine(outstanding=min(initial_demand, MAX_DEMAND))

    def request(self, subscriber: int, demand: int) -> None:
        sub = self._mine(subscriber, "request")
        _check_demand(demand, zero_ok=False)
        sub.outstanding = add_demand(sub.outstanding, demand)

    def cancel(self, subscriber: int) -> None:
        self._mine(subscriber, "cancel")
        del self.live[subscriber]  # reassembly abandoned
        self.cancelled.add(subscriber)

    def ended(self, subscriber: int) -> bool:
        """Whether ``subscriber`` was used and is over (cancelled, or terminated)."""
        return subscriber in self.used and subscriber not in self.live

    def _mine(self, subscriber: int, action: str) -> Mine:
        sub = self.live.get(subscriber)
        if sub is None:
            raise LocalProtocolError(f"{action}: no live subscription {subscriber}")
        return sub

    # -- what I receive ----------------------------------------------------------------
    def _get(self, subscriber: int, what: str) -> Mine | None:
        """The subscription a received signal is for; None: cancelled (drop it)."""
        sub = self.live.get(subscriber)
        if sub is not None:
            return sub
        if subscriber in self.cancelled:
            return None
        if subscriber in self.used:
            raise RemoteProtocolError(f"{what} for {subscriber}, which ended")
        raise RemoteProtocolError(f"{what} for unknown subscription {subscriber}")

    def subscribed(self, subscriber: int, element_size: int) -> bool:
        sub = self._get(subscriber, "subscribed")
        if sub is None:
            return False
        if sub.stage is not Stage.PENDING:
            raise RemoteProtocolError(f"a second subscribed for {subscriber}")
        sub.stage, sub.element_size = Stage.ACTIVE, element_size
        return True

    def terminated(self, subscriber: int, what: str) -> bool:
        """onComplete/onError: the subscription leaves the table (False: it was cancelled)."""
        sub = self._get(subscriber, what)
        if sub is None:
            self.cancelled.discard(subscriber)  # its end: later signals are errors
            return False
        if sub.split_id is not None:
            raise RemoteProtocolError(f"{what} for {subscriber} inside a split element")
        if what == "onComplete" and sub.stage is not Stage.ACTIVE:
            raise RemoteProtocolError(f"onComplete for {subscriber} before subscribed")
        del self.live[subscriber]
        return True

    def elements(self, subscriber: int, count: int, size: int | None = None) -> bool:
        """Charge ``count`` whole elements (``size``: each one's length, checked against
        elementSize). False: cancelled, drop them."""
        sub = self._active(subscriber, "an element")
        if sub is None:
            return False
        if sub.split_id is not None:
            raise RemoteProtocolError(f"an element for {subscriber} inside a split element")
        if size is not None and sub.element_size and size != sub.element_size:
            raise RemoteProtocolError(
                f"an element of {size} bytes, the subscription's are {sub.element_size}"
            )
        self._charge(sub, subscriber, count)
        return True

    def part(self, subscriber: int, element_id: int, data: bytes, last: bool) -> bytes | None:
        """One part of a split element: the whole element after the last (else None)."""
        sub = self._active(subscriber, "a part")
        if sub is None:
            return None
        if sub.element_size:
            raise RemoteProtocolError("a split element, but elementSize is fixed")
        if sub.split_id is None:
            self._charge(sub, subscriber, 1)
            sub.split_id = element_id
        elif sub.split_id != element_id:
            raise RemoteProtocolError(f"part of element {element_id} inside {sub.split_id}")
        sub.split_size += len(data)
        if sub.split_size > self.max_element:
            raise RemoteProtocolError(f"a split element over {self.max_element} bytes")
        sub.parts.append(data)
        if not last:
            return None
        whole = b"".join(sub.parts)
        sub.split_id, sub.parts, sub.split_size = None, [], 0
        return whole

    @property
    def held(self) -> int:
        """Bytes held in split elements being reassembled."""
        return sum(sub.split_size for sub in self.live.values())

    def _active(self, subscriber: int, what: str) -> Mine | None:
        sub = self._get(subscriber, what)
        if sub is not None and sub.stage is not Stage.ACTIVE:
            raise RemoteProtocolError(f"{what} for {subscriber} before subscribed")
        return sub

    @staticmethod
    def _charge(sub: Mine, subscriber: int, count: int) -> None:
        if count > sub.outstanding:
            raise RemoteProtocolError(
                f"{count} elements for {subscriber}, over its demand of {sub.outstanding}"
            )
        sub.outstanding = spend(sub.outstanding, count)

    def close_all(self) -> list[int]:
        """Goodbye: every live subscription ends; the ids not cancelled."""
        ids = list(self.live)
        self.live.clear()
        self.cancelled.clear()
        return ids


def _check_demand(demand: int, *, zero_ok: bool) -> None:
    if demand < 0 or (demand == 0 and not zero_ok) or demand > MAX_DEMAND:
        raise LocalProtocolError(f"demand {demand}: a request is 1 to {MAX_DEMAND}")


class SubscriptionsToMe:
    """The ids the peer chose, and the publisher side's rules."""

    def __init__(self) -> None:
        self.live: dict[int, Theirs] = {}
        self.used: set[int] = set()

    # -- what I receive ----------------------------------------------------------------
    def subscribe(self, subscriber: int, initial_demand: int) -> None:
        if subscriber in self.used:
            raise RemoteProtocolError(f"subscribe: id {subscriber} was used on this connection")
        self.used.add(subscriber)
        self.live[subscriber] = Theirs(outstanding=min(initial_demand, MAX_DEMAND))

    def request(self, subscriber: int, demand: int) -> int | None:
        """Add demand: the new outstanding; None: the request was non-positive (the
        stream now owes onError); -1: for a stream that ended or owes onError (ignored:
        it crossed our terminal signal)."""
        sub = self.live.get(subscriber)
        if sub is None:
            if subscriber in self.used:
                return -1  # raced with our terminal signal: ignored
            raise RemoteProtocolError(f"request for unknown subscription {subscriber}")
        if sub.stage is Stage.OWES_ERROR:
            return -1
        if demand <= 0:
            sub.stage = Stage.OWES_ERROR
            return None
        sub.outstanding = add_demand(sub.outstanding, demand)
        return sub.outstanding

    def cancel(self, subscriber: int) -> bool:
        """The peer cancels: True if it was live (a cancel for an unknown id is ignored)."""
        return self.live.pop(subscriber, None) is not None

    # -- what I send -------------------------------------------------------------------
    def get(self, subscriber: int, action: str) -> Theirs:
        sub = self.live.get(subscriber)
        if sub is None:
            raise LocalProtocolError(f"{action}: no live subscription {subscriber} to me")
        return sub

    def subscribed(self, subscriber: int, element_size: int) -> None:
        sub = self.get(subscriber, "send Subscribed")
        if sub.stage is not Stage.PENDING:
            raise LocalProtocolError(f"send Subscribed: {subscriber} is {sub.stage.value}")
        sub.stage, sub.element_size = Stage.ACTIVE, element_size

    def charge(self, subscriber: int, count: int, sizes: list[int] | None) -> Theirs:
        """Check and spend demand for ``count`` whole elements we send."""
        sub = self._sending(subscriber)
        if sub.split_id is not None:
            raise LocalProtocolError(f"send elements: a split element of {subscriber} is open")
        fixed = sub.element_size
        if sizes is not None and fixed and sizes.count(fixed) != len(sizes):
            size = next(s for s in sizes if s != fixed)
            raise LocalProtocolError(f"send elements: {size} bytes, elementSize is {fixed}")
        _spend_local(sub, subscriber, count)
        return sub

    def part(self, subscriber: int, element_id: int, last: bool) -> None:
        sub = self._sending(subscriber)
        if sub.element_size:
            raise LocalProtocolError("send a part: split is forbidden with elementSize > 0")
        if sub.split_id is None:
            _spend_local(sub, subscriber, 1)
            sub.split_id = element_id
        elif sub.split_id != element_id:
            raise LocalProtocolError(f"send a part of {element_id}: {sub.split_id} is open")
        if last:
            sub.split_id = None

    def terminal(self, subscriber: int, error: bool) -> None:
        sub = self.get(subscriber, "send a terminal signal")
        if sub.split_id is not None:
            raise LocalProtocolError("send a terminal signal: a split element is open")
        if sub.stage is Stage.PENDING and not error:
            raise LocalProtocolError("send OnComplete: before Subscribed (reject with OnError)")
        if sub.stage is Stage.OWES_ERROR and not error:
            raise LocalProtocolError("send OnComplete: the stream owes OnError")
        del self.live[subscriber]

    def _sending(self, subscriber: int) -> Theirs:
        sub = self.get(subscriber, "send elements")
        if sub.stage is not Stage.ACTIVE:
            raise LocalProtocolError(f"send elements: {subscriber} is {sub.stage.value}")
        return sub

    def close_all(self) -> list[int]:
        ids = list(self.live)
        self.live.clear()
        return ids


def _spend_local(sub: Theirs, subscriber: int, count: int) -> None:
    if count > sub.outstanding:
        raise LocalProtocolError(
            f"send {count} elements to {subscriber}: its demand is {sub.outstanding}"
        )
    sub.outstanding = spend(sub.outstanding, count)
