"""A full disk as a state the store lives through, not an error it dies of.

When a write of the store fails with ``ENOSPC`` (or ``EDQUOT``, a quota) the
store becomes **full**: appends are refused at once with
:class:`~gateway.core.errors.StorageFull` (whose ``room()`` waits for space), state
documents stay in memory, and one ERROR line says what is full and how much
is needed (again at most once a minute while it lasts). A watcher looks at
the file system's free space every second; once space was freed and the largest
write that failed fits, the store is writable again: waiters retry, the committer writes what
it kept, and an INFO line says so. A quota that ``statvfs`` does not show is
retried every :data:`RETRY_SECONDS` all the same.

Nothing here writes: the caller's write failed, nothing of it was kept (a
chunk cuts back a partial record), and retrying it whole is safe.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from gateway.core.errors import StorageFull

__all__ = ["FULL_ERRNOS", "DiskSpace", "Shortage", "is_full"]

log = logging.getLogger("gateway.store")

#: The errors that mean "no room": a full file system, or the user's quota reached.
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
#: Seconds between looks at the free space while full.
POLL_SECONDS = 1.0
#: While full, a retry at least this often even if the free space looks too small
#: (a quota does not show in ``statvfs``; a file system may free reserved blocks).
RETRY_SECONDS = 10.0
#: The ERROR line for a full disk is repeated at most this often while it lasts.
LOG_SECONDS = 60.0


def is_full(error: BaseException) -> bool:
    """``error`` says the disk (or the quota) is full."""
    return isinstance(error, OSError) and error.errno in FULL_ERRNOS


@dataclass
class Shortage:
    """What is full, since when, and how much room the writes that failed need."""

    #: The directory whose file system is full.
    path: str
    #: The largest write that failed since the disk became full, in bytes.
    needed: int
    #: What failed first (``segment 'logs/0'``, ``state document 'logs'``…).
    what: str
    #: The error, as ``ENOSPC (No space left on device)``.
    error: str
    #: trio time it became full.
    since: float
    #: The free space when it became full (None: unknown).
    free: int | None = None
    #: Writes refused or failed since (each one waits and is retried).
    refused: int = 1


class DiskSpace:
    """The full-or-writable state of one store's directory (see the module docstring)."""

    def __init__(self, directory: Path, on_room: Callable[[], None] | None = None) -> None:
        self.directory = directory
        #: Called when the store is writable again (the store wakes its committer).
        self._on_room = on_room
        #: None while writable.
        self.shortage: Shortage | None = None
        #: Times the disk became full since the store opened.
        self.episodes = 0
        self._lot = trio.lowlevel.ParkingLot()
        self._became_full = trio.Event()
        self._logged_at: float | None = None

    @property
    def full(self) -> bool:
        return self.shortage is not None

    def free_bytes(self) -> int | None:
        """Bytes an unprivileged writer may still use on the file system (None if it
        cannot be asked)."""
        try:
            st = os.statvfs(self.directory)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def refuse(self, what: str, needed: int) -> StorageFull:
        """The error for a write that is not even tried while the disk is full."""
        shortage = self.shortage
        assert shortage is not None
        shortage.refused += 1
        shortage.needed = max(shortage.needed, needed)
        return StorageFull(f"{what}: the disk is full ({shortage.path})", self.room)

    def exhausted(self, error: OSError, what: str, needed: int) -> StorageFull:
        """A write of ``needed`` bytes for ``what`` failed with ``error`` (a full disk):
        the store is full from now on. Returns the exception to raise."""
        if self.shortage is not None:
            return self.refuse(what, needed)
        code = error.errno if error.errno is not None else errno.ENOSPC
        self.shortage = Shortage(
            path=str(self.directory),
            needed=needed,
            what=what,
            error=f"{errno.errorcode.get(code, code)} ({os.strerror(code)})",
            since=trio.current_time(),
            free=self.free_bytes(),
        )
        self.episodes += 1
        self._became_full.set()
        if self._logged_at is None or trio.current_time() - self._logged_at >= LOG_SECONDS:
            self._log_full()
        return StorageFull(f"{what}: the disk is full ({self.directory})", self.room)

    async def room(self) -> None:
        """Return once the store is writable again (at once if it is)."""
        while self.shortage is not None:
            await self._lot.park()

    def resume(self, *, quiet: bool = False) -> None:
        """Writable again: wake every waiter (each retries its write); an INFO line says
        so unless ``quiet`` (the store closing tries its documents once more)."""
        shortage = self.shortage
        if shortage is None:
            return
        self.shortage = None
        self._became_full = trio.Event()
        free = self.free_bytes()
        if not quiet:
            log.info(
                "store: room on the disk again after %.0fs (%s free); %d held writes resume",
                trio.current_time() - shortage.since,
                "?" if free is None else _size(free),
                shortage.refused,
            )
        self._lot.unpark_all()
        if self._on_room is not None:
            self._on_room()

    async def watch(self) -> None:
        """Run for the store's life: while full, look at the free space every
        POLL_SECONDS and resume once the writes that failed fit (or every
        RETRY_SECONDS regardless); repeat the ERROR line every LOG_SECONDS."""
        while True:
            await self._became_full.wait()
            shortage = self.shortage
            if shortage is None:
                continue
            await trio.sleep(POLL_SECONDS)
            free = self.free_bytes()
            waited = trio.current_time() - shortage.since
            if _room_for(shortage, free) or waited >= RETRY_SECONDS:
                self.resume()
            elif self._logged_at is None or trio.current_time() - self._logged_at >= LOG_SECONDS:
                self._log_full()

    def _log_full(self) -> None:
        shortage = self.shortage
        if shortage is None:
            return
        self._logged_at = trio.current_time()
        free = self.free_bytes()
        log.error(
            "store: the disk is full under %s: a write of %s for %s failed with %s (%s"
            " free). Publishers are held (not acked), readers go on, consumers' positions"
            " are kept in memory; everything resumes once at least %s is free",
            shortage.path,
            _size(shortage.needed),
            shortage.what,
            shortage.error,
            "?" if free is None else _size(free),
            _size(shortage.needed),
        )


def _room_for(shortage: Shortage, free: int | None) -> bool:
    """Space was freed since the disk became full, and the writes that failed fit now.
    (Room shown all along, as with a quota, is not taken for room: RETRY_SECONDS is.)"""
    if free is None or free < shortage.needed:
        return False
    return shortage.free is None or free > shortage.free


def _size(n: int) -> str:
    """``512 B``, ``4.0 KiB``, ``1.5 MiB``: a byte count as people read it."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
