"""The gateway-wide memory budget: one count of the bytes the gateway holds.

Per-destination and per-connection limits alone multiply: 10 000 destinations
named by clients times ``buffer_bytes``, or 1 024 connections each holding a
half-received window. Everything that holds message bytes for a while charges
one :class:`MemoryBudget`: every destination group's buffered copies (queued
plus delivered and unacked) and every connection's partly received input
(:class:`Account`). Above the limit, publishes wait for room and connections
holding partial input stop reading; nothing is dropped. The budget counts
payload bytes, not Python's object overhead (see docs/limits.md).
"""

from __future__ import annotations

import trio

__all__ = ["Account", "MemoryBudget"]


class MemoryBudget:
    """Bytes held across the gateway, against ``limit``."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("a memory budget needs a limit of at least 1 byte")
        self.limit = limit
        self.used = 0
        #: The most ever used (for tests and the status of a run).
        self.peak = 0
        self._room = trio.lowlevel.ParkingLot()

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more stay within the limit (anything fits an empty budget)."""
        return self.used + nbytes <= self.limit or self.used == 0

    def charge(self, nbytes: int) -> None:
        self.used += nbytes
        if self.used > self.peak:
            self.peak = self.used

    def release(self, nbytes: int) -> None:
        self.used -= nbytes
        if self._room and self.used < self.limit:
            self._room.unpark_all()

    async def wait_for_room(self, nbytes: int = 0) -> None:
        """Wait until ``nbytes`` more fit (0: until the budget is no longer exhausted)."""
        while not (self.fits(nbytes) if nbytes else not self.exhausted):
            await self._room.park()

    def account(self, limit: int) -> Account:
        return Account(self, limit)


class Account:
    """What one holder (a connection) has charged to the budget, within its own ``limit``."""

    __slots__ = ("budget", "held", "limit")

    def __init__(self, budget: MemoryBudget, limit: int) -> None:
        self.budget = budget
        self.limit = limit
        self.held = 0

    def hold(self, nbytes: int) -> None:
        """The holder now holds ``nbytes`` (the difference is charged or released)."""
        delta = nbytes - self.held
        if delta > 0:
            self.budget.charge(delta)
        elif delta < 0:
            self.budget.release(-delta)
        self.held = nbytes

    def close(self) -> None:
        self.hold(0)
