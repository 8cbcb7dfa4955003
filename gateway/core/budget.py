"""The gateway-wide memory budget: one count of the bytes the gateway holds.

Per-destination and per-connection limits alone multiply: 10 000 destinations
named by clients times ``buffer_bytes``, or 1 024 connections each holding a
half-received window. Everything that holds message bytes for a while charges
one :class:`MemoryBudget`: every destination group's buffered copies (queued
plus delivered and unacked) and every connection's partly received input
(:class:`Account`). Above the limit, publishes wait for room and connections
holding partial input stop reading; nothing is dropped.

Destinations charge a message's payload plus a fixed overhead; a connection
charges what its codec really allocates for partial input (buffers as
allocated, the objects built for a unit's parts, a decompressor's state), and
asks :meth:`Account.room` before a large step, so that many connections cannot
together run far past the limit. See docs/limits.md.

Freed memory goes back to the allocator, which does not always give it back to
the system: glibc keeps freed pages of its heap unless they are at its top.
After a large release (:data:`TRIM_AFTER` bytes below the level of the last
trim) the budget asks glibc to return its free pages (``malloc_trim``), at
most once per :data:`TRIM_INTERVAL`, from a task of its own.
"""

from __future__ import annotations

import ctypes
import logging
import sys
import time
from collections.abc import Callable

import trio

__all__ = ["TRIM_AFTER", "TRIM_INTERVAL", "Account", "MemoryBudget", "trim_heap"]

log = logging.getLogger(__name__)

#: A release that brings the budget this many bytes below its level at the last
#: trim (or its highest since) has the allocator's free pages returned.
TRIM_AFTER = 64 * 1024 * 1024
#: Seconds between two trims at least; the first waits this long after the release
#: too, so that a burst of releases (connections closing) is trimmed once.
TRIM_INTERVAL = 1.0


def _malloc_trim() -> Callable[[], object] | None:
    """glibc's ``malloc_trim(0)``, or None where there is none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def trim_all() -> object:
        return trim(0)

    return trim_all


_TRIM = _malloc_trim()


def trim_heap() -> bool:
    """Ask the C allocator to give its free pages back to the system (glibc only).

    False where it cannot. It walks the heap and unmaps what is free: about
    40 ms after 600 MiB were freed, under 2 ms when little is; call it after a
    large release, not after every one.
    """
    if _TRIM is None:  # pragma: no cover - not glibc
        return False
    _TRIM()
    return True


class MemoryBudget:
    """Bytes held across the gateway, against ``limit``."""

    def __init__(self, limit: int, *, trim_after: int = TRIM_AFTER) -> None:
        if limit < 1:
            raise ValueError("a memory budget needs a limit of at least 1 byte")
        self.limit = limit
        self.used = 0
        #: The most ever used (for tests and the status of a run).
        self.peak = 0
        self._room = trio.lowlevel.ParkingLot()
        #: Releases this far below ``_level`` have the heap trimmed (0: never).
        self.trim_after = trim_after if _TRIM is not None else 0
        #: The highest ``used`` since the last trim.
        self._level = 0
        self._trim_due = False
        #: Heap trims done (for tests and the status of a run).
        self.trims = 0

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def fits(self, nbytes: int) -> bool:
        """Whether ``nbytes`` more stay within the limit (anything fits an empty budget)."""
        return self.used + nbytes <= self.limit or self.used == 0

    def charge(self, nbytes: int) -> None:
        used = self.used = self.used + nbytes
        if used > self._level:
            self._level = used
            if used > self.peak:
                self.peak = used

    def release(self, nbytes: int) -> None:
        used = self.used = self.used - nbytes
        if self._room and used < self.limit:
            self._room.unpark_all()
        if self.trim_after and self._level - used >= self.trim_after and not self._trim_due:
            self._trim_soon()

    async def wait_for_room(self, nbytes: int = 0) -> None:
        """Wait until ``nbytes`` more fit (0: until the budget is no longer exhausted)."""
        while not (self.fits(nbytes) if nbytes else not self.exhausted):
            await self._room.park()

    def account(self, limit: int) -> Account:
        return Account(self, limit)

    # -- giving freed memory back ---------------------------------------------------------
    def _trim_soon(self) -> None:
        try:
            trio.lowlevel.spawn_system_task(self._trim_later, name="gateway.core.budget.trim")
        except RuntimeError:  # outside trio (a test's own budget): nothing to give back to
            self._level = self.used
            return
        self._trim_due = True

    async def _trim_later(self) -> None:
        try:
            await trio.sleep(TRIM_INTERVAL)
            started = time.perf_counter()
            trim_heap()
            self.trims += 1
            log.debug(
                "gave free heap pages back after a release of %d bytes (%.1f ms)",
                self._level - self.used,
                (time.perf_counter() - started) * 1000,
            )
        finally:
            self._level = self.used
            self._trim_due = False


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

    def room(self, floor: int = 0) -> int:
        """How many more bytes the holder may take on now.

        What the budget has left, but at least what brings the holder to
        ``floor`` (a little never waits); unbounded (``sys.maxsize``) while it
        is the budget's only holder (anything fits an empty budget). The
        holder's own ``limit`` is its to enforce.
        """
        budget = self.budget
        if budget.used <= self.held:
            return sys.maxsize
        return max(budget.limit - budget.used, floor - self.held)

    def must_wait(self, floor: int = 0) -> bool:
        """Whether the holder, holding more than ``floor``, must wait for room to take on more."""
        budget = self.budget
        return self.held > floor and budget.used >= budget.limit and budget.used > self.held

    async def wait_for_room(self, floor: int = 0) -> None:
        """Wait while :meth:`must_wait` says so."""
        while self.must_wait(floor):
            await self.budget.wait_for_room()

    def close(self) -> None:
        self.hold(0)
