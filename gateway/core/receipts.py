"""Receipts: the promise a publisher holds until its messages are safe.

A receipt counts *legs*: one per copy of a message the hub made (one per target
group, or one per stored write). Each leg belongs to one message of the
publish, by its index, and settles once: with an outcome, or "neutral" (a copy
that became unnecessary, e.g. its subscriber left while others kept theirs).
When the last leg has settled the receipt settles with the worst outcome seen,
and only then may a protocol ack the sender.

A receipt also tells each message's own result (:meth:`Receipt.results`): its
worst outcome and reason, the position where each log stored it, a status code
and details a target attached, and for a call the reply. A reason is a text for
humans and a code (:class:`~gateway.core.reasons.Reason`, ``reason_code``)
chosen where the failure happened: whatever tells failures apart (the metrics,
a protocol's error codes) reads the code. Nothing per message is
kept while every leg settles plainly delivered, so a window of thousands of
events that settles alike costs a few objects, not one per event.

A *call* (request/reply, :meth:`Receipt.for_call`) settles at its first reply;
if every leg settles without one, or its deadline passes first, it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import trio

from gateway.core.model import Outcome, Position, Reply
from gateway.core.reasons import Reason

__all__ = ["Receipt", "Result"]

_EMPTY: Mapping[str, str] = MappingProxyType({})
_NO_POSITIONS: Mapping[str, Position] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Result:
    """How one message of a publish settled."""

    outcome: Outcome = Outcome.DELIVERED
    #: Why, when the outcome is not ``DELIVERED``.
    reason: str = ""
    #: A status code a target attached (a protocol's own error code, say).
    code: int | None = None
    details: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    #: Destination name → where that destination's log stored the message.
    positions: Mapping[str, Position] = field(default_factory=lambda: _NO_POSITIONS)
    #: The answer, when the message was a call that was answered.
    reply: Reply | None = None
    #: Why, as a code chosen where the failure happened (None when delivered):
    #: what code, a protocol or the metrics should read instead of ``reason``.
    #: Left out of comparisons: a result equals another of the same outcome and text.
    reason_code: Reason | None = field(default=None, compare=False)

    @property
    def position(self) -> Position | None:
        """The position, when exactly one log stored the message."""
        if len(self.positions) == 1:
            return next(iter(self.positions.values()))
        return None


@dataclass(slots=True)
class _Extra:
    """What targets attached to one message's legs beyond an outcome."""

    code: int | None = None
    details: Mapping[str, str] = field(default_factory=lambda: _EMPTY)


_DELIVERED = Result()
_NO_REASON: tuple[str, Reason | None] = ("", None)


class Receipt:
    """Settles once every leg of a publish has settled; the worst outcome wins."""

    __slots__ = (
        "_callbacks",
        "_count",
        "_event",
        "_extras",
        "_legs",
        "_outcome",
        "_pending",
        "_position_runs",
        "_reasons",
        "_replied",
        "_sealed",
        "_worst",
        "_worsts",
        "is_call",
        "reason",
        "reason_code",
        "reply",
        "reply_by",
    )

    def __init__(self, count: int = 0) -> None:
        #: Messages in the publish: the length of :meth:`results`.
        self._count = count
        self._pending = 0
        #: Legs announced in all, for telling "nobody took the call" apart.
        self._legs = 0
        self._sealed = False
        self._outcome: Outcome | None = None
        self._event: trio.Event | None = None
        self._callbacks: list[Callable[[Receipt], None]] | None = None
        #: Human-readable reason of the worst non-delivered outcome.
        self.reason = ""
        #: The code of that reason (:class:`~gateway.core.reasons.Reason`), None while
        #: nothing failed.
        self.reason_code: Reason | None = None
        #: The worst outcome so far; final only once every leg has settled.
        self._worst = Outcome.DELIVERED
        #: Per message, built on first need: worst outcome, its reason and code, extras.
        self._worsts: bytearray | None = None
        self._reasons: dict[int, tuple[str, Reason]] | None = None
        self._extras: dict[int, _Extra] | None = None
        #: ``(first index, destination, positions)`` of each stored run.
        self._position_runs: list[tuple[int, str, Sequence[Position]]] | None = None
        #: A call: one message that asks for a reply.
        self.is_call = False
        self._replied = -1
        #: The first reply to a call (``None`` until one arrives, and for publishes).
        self.reply: Reply | None = None
        #: For a call, the trio time by which it wants its reply.
        self.reply_by: float | None = None

    @classmethod
    def settled(
        cls,
        outcome: Outcome,
        reason: str = "",
        count: int = 0,
        *,
        reason_code: Reason = Reason.OTHER,
    ) -> Receipt:
        """A receipt that is already settled (e.g. a publish refused up front)."""
        r = cls(count)
        r._worst = outcome
        r.reason = reason
        if outcome != Outcome.DELIVERED:
            r.reason_code = reason_code
            if count:
                r._worsts = bytearray([outcome]) * count
                r._reasons = dict.fromkeys(range(count), (reason, reason_code))
        r.seal()
        return r

    @classmethod
    def for_call(cls, reply_by: float) -> Receipt:
        """The receipt of a call: one message that asks for a reply by trio time ``reply_by``."""
        r = cls(1)
        r.is_call = True
        r.reply_by = reply_by
        return r

    @property
    def count(self) -> int:
        return self._count

    # -- used by the hub and destinations ------------------------------------
    def add_legs(self, n: int = 1) -> None:
        """Announce ``n`` more copies that will each settle once."""
        if self._sealed:
            raise RuntimeError("legs added to a sealed receipt")
        self._pending += n
        self._legs += n

    def settle_range(
        self,
        start: int,
        stop: int,
        outcome: Outcome | None,
        reason: str = "",
        *,
        reason_code: Reason = Reason.REFUSED_BY_TARGET,
    ) -> None:
        """Settle one leg of each message ``start`` to ``stop`` (exclusive) alike.

        ``None`` is neutral: the copies are no longer needed and do not count.
        A failed or rejected leg carries ``reason_code``; without one it was
        refused by its target (a subscriber's nack).
        """
        n = stop - start
        if n <= 0:
            return
        if self._outcome is not None:
            self._pending -= n
            return
        if outcome is not None and outcome != Outcome.DELIVERED:
            self._mark(start, stop, outcome, reason, reason_code)
        self._pending -= n
        if self._pending == 0 and self._sealed:
            self._maybe_finish()

    def settle(
        self,
        index: int,
        outcome: Outcome | None,
        reason: str = "",
        *,
        reason_code: Reason = Reason.REFUSED_BY_TARGET,
        code: int | None = None,
        details: Mapping[str, str] | None = None,
        reply: Reply | None = None,
    ) -> None:
        """Settle one leg of message ``index``, with what its target attached.

        A failed or rejected leg carries ``reason_code``; without one it was
        refused by its target (a subscriber's nack). ``code`` is a status code
        of the target's own (a protocol's error code, say).
        """
        if self._outcome is not None:
            self._pending -= 1
            return
        if code is not None or details:
            extra = self._extra(index)
            if code is not None:
                extra.code = code
            if details:
                extra.details = details
        if reply is not None and self.reply is None:
            self.reply = reply
            self._replied = index
        if outcome is not None and outcome != Outcome.DELIVERED:
            self._mark(index, index + 1, outcome, reason, reason_code)
        self._pending -= 1
        if reply is not None and self.is_call:
            # A call is answered by its first reply; copies that failed or are
            # still pending no longer matter.
            self._worst = Outcome.DELIVERED
            self.reason = ""
            self.reason_code = None
            if self._worsts is not None:
                self._worsts[index] = Outcome.DELIVERED
            if self._reasons:
                self._reasons.pop(index, None)
            self._finish()
            return
        self._maybe_finish()

    def settle_stored(self, start: int, destination: str, positions: Sequence[Position]) -> None:
        """Settle one leg of each message from ``start`` on as stored, at ``positions``."""
        if self._outcome is None:
            if self._position_runs is None:
                self._position_runs = []
            self._position_runs.append((start, destination, positions))
        self.settle_range(start, start + len(positions), Outcome.DELIVERED)

    def seal(self) -> None:
        """No more legs will be added: settle as soon as the pending ones have."""
        self._sealed = True
        self._maybe_finish()

    def expire(self, reason: str, reason_code: Reason = Reason.EXPIRED) -> None:
        """Settle now as failed with ``reason`` and its code (by default: a call's
        deadline passed); later legs change nothing."""
        if self._outcome is not None:
            return
        self._mark(0, self._count, Outcome.FAILED, reason, reason_code, force=True)
        self._finish()

    def _mark(
        self,
        start: int,
        stop: int,
        outcome: Outcome,
        reason: str,
        code: Reason,
        *,
        force: bool = False,
    ) -> None:
        if outcome > self._worst or force:
            self._worst = max(outcome, self._worst)
            self.reason = reason
            self.reason_code = code
        if stop > self._count:
            self._count = stop
        worsts = self._worsts
        if worsts is None:
            worsts = self._worsts = bytearray(self._count)
        elif len(worsts) < self._count:
            worsts.extend(bytes(self._count - len(worsts)))
        reasons = self._reasons
        if reasons is None:
            reasons = self._reasons = {}
        why = (reason, code)
        for i in range(start, stop):
            if outcome > worsts[i] or force:
                worsts[i] = max(outcome, worsts[i])
                reasons[i] = why

    def _extra(self, index: int) -> _Extra:
        if self._extras is None:
            self._extras = {}
        extra = self._extras.get(index)
        if extra is None:
            extra = self._extras[index] = _Extra()
        return extra

    def _maybe_finish(self) -> None:
        if self._pending == 0 and self._sealed:
            if self.is_call and self.reply is None and self._worst == Outcome.DELIVERED:
                if self._legs == 0:
                    why = "no subscriber to answer the call", Reason.NO_SUBSCRIBER
                else:
                    why = "the call was settled without a reply", Reason.NO_REPLY
                self._mark(0, self._count, Outcome.FAILED, *why, force=True)
            self._finish()

    def _finish(self) -> None:
        if self._outcome is not None:
            return
        self._outcome = self._worst
        if self._event is not None:
            self._event.set()
        if self._callbacks:
            callbacks, self._callbacks = self._callbacks, None
            for cb in callbacks:
                cb(self)

    # -- used by publishers ---------------------------------------------------
    @property
    def outcome(self) -> Outcome | None:
        """The final outcome, or ``None`` while legs are pending."""
        return self._outcome

    def done(self) -> bool:
        return self._outcome is not None

    async def wait(self) -> Outcome:
        """Wait until the receipt settles and return its outcome."""
        if self._outcome is None:
            if self._event is None:
                self._event = trio.Event()
            await self._event.wait()
        assert self._outcome is not None
        return self._outcome

    def add_done_callback(self, callback: Callable[[Receipt], None]) -> None:
        """Call ``callback(receipt)`` once settled (at once if it already is)."""
        if self._outcome is not None:
            callback(self)
            return
        if self._callbacks is None:
            self._callbacks = []
        self._callbacks.append(callback)

    @property
    def plain(self) -> bool:
        """True while every message is simply delivered, with nothing attached: a
        protocol can skip :meth:`results`."""
        return (
            self._worsts is None
            and self._extras is None
            and self._position_runs is None
            and self.reply is None
        )

    def result(self, index: int) -> Result:
        """How message ``index`` of the publish settled (final once :meth:`done`)."""
        if not 0 <= index < max(self._count, 1):
            raise IndexError(f"message {index} of a publish of {self._count}")
        outcome = (
            Outcome(self._worsts[index])
            if self._worsts is not None and index < len(self._worsts)
            else Outcome.DELIVERED
        )
        reason, reason_code = self._reasons.get(index, _NO_REASON) if self._reasons else _NO_REASON
        extra = self._extras.get(index) if self._extras else None
        positions: dict[str, Position] | None = None
        if self._position_runs:
            for start, destination, run in self._position_runs:
                if start <= index < start + len(run):
                    if positions is None:
                        positions = {}
                    positions[destination] = run[index - start]
        reply = self.reply if index == self._replied else None
        if (
            outcome == Outcome.DELIVERED
            and extra is None
            and not positions
            and reply is None
            and not reason
        ):
            return _DELIVERED
        return Result(
            outcome,
            reason,
            extra.code if extra else None,
            extra.details if extra else _EMPTY,
            MappingProxyType(positions) if positions else _NO_POSITIONS,
            reply,
            reason_code,
        )

    def results(self) -> list[Result]:
        """Each message's result, in publish order."""
        return [self.result(i) for i in range(self._count)]

    def failed(self) -> list[int]:
        """The indexes of the messages that were not delivered (in publish order),
        without building a result for each of the others."""
        worsts = self._worsts
        if worsts is None or not any(worsts):
            return []
        return [i for i, worst in enumerate(worsts) if worst]

    def positions_in(self, destination: str) -> list[Position | None]:
        """Where each message was stored in ``destination`` (None where it was not),
        read from the runs of positions as the log reported them."""
        out: list[Position | None] = [None] * self._count
        for start, name, run in self._position_runs or ():
            if name == destination:
                out[start : start + len(run)] = run
        return out

    def __repr__(self) -> str:
        state = self._outcome.name if self._outcome is not None else f"pending={self._pending}"
        return f"<Receipt {state}>"
