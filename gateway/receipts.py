"""Receipts: the promise a publisher holds until its messages are safe.

A receipt counts *legs*: one per copy of a message the hub made (one per target
group, or one per durable write). Each leg settles once, with an outcome or
"neutral" (a copy that became unnecessary, e.g. its subscriber left while
others kept theirs). When the last leg settles the receipt settles with the
worst outcome seen, and only then may a protocol ack the sender.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from .model import Outcome

__all__ = ["Receipt"]


class Receipt:
    """Settles once every leg of a publish has settled; the worst outcome wins."""

    __slots__ = ("_callbacks", "_event", "_outcome", "_pending", "_sealed", "_worst", "reason")

    def __init__(self) -> None:
        self._pending = 0
        self._sealed = False
        self._outcome: Outcome | None = None
        self._event: trio.Event | None = None
        self._callbacks: list[Callable[[Receipt], None]] | None = None
        #: Human-readable reason of the worst non-delivered outcome.
        self.reason = ""
        #: The worst outcome so far; final only once every leg has settled.
        self._worst = Outcome.DELIVERED

    @classmethod
    def settled(cls, outcome: Outcome, reason: str = "") -> Receipt:
        """A receipt that is already settled (e.g. a publish refused up front)."""
        r = cls()
        r._worst = outcome
        r.reason = reason
        r.seal()
        return r

    # -- used by the hub and destinations ------------------------------------
    def add_legs(self, n: int = 1) -> None:
        """Announce ``n`` more copies that will each settle once."""
        if self._sealed:
            raise RuntimeError("legs added to a sealed receipt")
        self._pending += n

    def settle_leg(self, outcome: Outcome | None, reason: str = "") -> None:
        """Settle one leg; ``None`` is neutral (the copy is no longer needed)."""
        self.settle_legs(1, outcome, reason)

    def settle_legs(self, n: int, outcome: Outcome | None, reason: str = "") -> None:
        """Settle ``n`` legs at once with the same outcome (``None``: neutral)."""
        if n <= 0:
            return
        if outcome is not None and outcome > self._worst:
            self._worst = outcome
            self.reason = reason
        self._pending -= n
        if self._pending == 0 and self._sealed:
            self._finish()

    def seal(self) -> None:
        """No more legs will be added: settle as soon as the pending ones have."""
        self._sealed = True
        if self._pending == 0:
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

    def __repr__(self) -> str:
        state = self._outcome.name if self._outcome is not None else f"pending={self._pending}"
        return f"<Receipt {state}>"
