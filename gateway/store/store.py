"""The embedded segment store: segments on disk, a group-committing fsync
task, retention, and small per-owner state documents.

Appends and reads run in the trio thread; what blocks for long (fsync, the
recovery scan, atomic document writes, deleting chunk files) runs in a worker
thread. One committer task makes written data durable under the fsync policy:
``always`` syncs after every write (an append is durable only after an fsync
that started after it), ``interval`` (the default) at most every
``fsync_interval`` seconds while anything is pending, so one fsync covers every
append of the interval, and ``never`` leaves it to the OS until the store
closes. The sweeper applies retention every few seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import math
import os
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Literal, overload

import trio

from .chunk import Chunk, FileCache
from .layout import (
    CLEAN_MARKER,
    META_FILE,
    SEGMENTS_DIR,
    STATES_DIR,
    chunk_paths,
    decode_name,
    encode_name,
    fsync_directory,
    pack_document,
    unpack_document,
    write_document,
)
from .recovery import RecoveredSegment, RecoveryReport, Verify, recover_segment
from .segment import Segment

__all__ = ["FsyncPolicy", "Store", "StoreLocked"]

log = logging.getLogger("gateway.store")

FsyncPolicy = Literal["always", "interval", "never"]

#: The file a store holds an exclusive flock on while it is open.
LOCK_FILE = "lock"


class StoreLocked(OSError):
    """Another process has the store open."""


#: Seconds between retention sweeps.
SWEEP_SECONDS = 2.0
#: Worker threads one group commit syncs files in at once.
SYNC_THREADS = 16
#: Bytes of recently read records kept for readers that take a few events at a time.
RECORD_CACHE_BYTES = 32 * 2**20


class Store:
    """Segments under one directory (open it with :meth:`Store.open`)."""

    def __init__(
        self,
        directory: Path,
        *,
        fsync: FsyncPolicy = "interval",
        fsync_interval: float = 0.005,
        chunk_bytes: int = 64 * 2**20,
        retain_bytes: int | None = None,
        retain_age: float | None = None,
    ) -> None:
        if fsync not in ("always", "interval", "never"):
            raise ValueError(f"fsync must be always, interval or never, not {fsync!r}")
        if chunk_bytes < 1:
            raise ValueError("chunk_bytes must be positive")
        self.directory = Path(directory)
        self.fsync: FsyncPolicy = fsync
        self.fsync_interval = fsync_interval if fsync == "interval" else 0.0
        self.chunk_bytes = chunk_bytes
        self.retain_bytes = retain_bytes
        self.retain_age = retain_age
        self.files = FileCache(keep_dirty=fsync != "never")
        self.record_cache: OrderedDict[Any, Any] = OrderedDict()
        self._record_cache_bytes = 0
        self._record_sizes: dict[Any, int] = {}
        #: Per segment, one recovery report (from the last open).
        self.recovery: list[RecoveryReport] = []
        self._segments: dict[str, Segment] = {}
        self._states: dict[str, bytes] = {}
        self._pending_states: dict[str, bytes] = {}
        #: Chunks written and not synced yet, by segment.
        self._dirty: dict[Segment, set[Chunk]] = {}
        self._dirty_dirs: set[Path] = set()
        #: Segments with something for the committer besides data: callbacks, meta, deletions.
        self._attention: set[Segment] = set()
        #: Released chunks whose files the unlinker has yet to delete, oldest first.
        self._doomed: deque[tuple[Path, list[Chunk]]] = deque()
        self._doomed_lot = trio.lowlevel.ParkingLot()
        self._kick = trio.Event()
        self._closed = False
        self._failed = False
        self._lock_fd: int | None = None
        self._wall0 = time.time()
        self._trio0 = 0.0
        self._stats = {
            "commits": 0,
            "fsyncs": 0,
            "fsync_us": 0,
            "state_writes": 0,
            "chunks_deleted": 0,
            "bytes_deleted": 0,
        }

    # -- opening and closing ---------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls,
        directory: Path,
        *,
        fsync: FsyncPolicy = "interval",
        fsync_interval: float = 0.005,
        chunk_bytes: int = 64 * 2**20,
        retain_bytes: int | None = None,
        retain_age: float | None = None,
    ) -> AsyncIterator[Store]:
        """Recover every segment under ``directory`` (created if missing), run the
        committer (group commit) and the retention sweeper while the block runs; on exit:
        make everything durable, save states, close files. Never refuses to start because
        of a torn tail or a corrupt record."""
        store = cls(
            directory,
            fsync=fsync,
            fsync_interval=fsync_interval,
            chunk_bytes=chunk_bytes,
            retain_bytes=retain_bytes,
            retain_age=retain_age,
        )
        try:
            recovered = await trio.to_thread.run_sync(store._recover)
        except BaseException:
            store._unlock()
            raise
        store._trio0 = trio.current_time()
        store._wall0 = time.time()
        for segment in recovered:
            store._adopt(segment)
        body_error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store._committer)
                nursery.start_soon(store._sweeper)
                nursery.start_soon(store._unlinker)
                try:
                    yield store
                except BaseException as e:
                    body_error = e
                    raise
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The caller's own exception comes back as itself, not wrapped in the group of
            # the store's background tasks.
            if body_error is not None and group.exceptions == (body_error,):
                raise body_error from None
            raise
        finally:
            with trio.CancelScope(shield=True):
                await store._close()

    def _recover(self) -> list[RecoveredSegment]:
        """Blocking: read every segment back (in a worker thread)."""
        segments_dir = self.directory / SEGMENTS_DIR
        segments_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        (self.directory / STATES_DIR).mkdir(exist_ok=True)
        marker = self.directory / CLEAN_MARKER
        clean = marker.exists()
        if clean:
            # Gone (durably) before anything is written: a crash from now on is dirty.
            marker.unlink()
            fsync_directory(self.directory)
        verify: Verify = "none" if clean else "tail"
        recovered = []
        for entry in sorted(os.scandir(segments_dir), key=lambda e: e.name):
            if not entry.is_dir():
                continue
            try:
                decode_name(entry.name)
            except UnicodeDecodeError:
                log.warning("%s: not a segment directory of this store; ignored", entry.path)
                continue
            segment = recover_segment(Path(entry.path), verify=verify)
            recovered.append(segment)
            report = segment.report
            if report.truncated_bytes or report.corrupt_records:
                log.warning(
                    "segment %r recovered: %d records, %d corrupt, %d bytes of torn tail cut",
                    report.segment,
                    report.records,
                    report.corrupt_records,
                    report.truncated_bytes,
                )
        for leftover in (self.directory / STATES_DIR).glob("*.tmp"):
            leftover.unlink()
        return recovered

    def _lock(self) -> None:
        """Hold the store's lock file until close: a second process opening the same
        store would interleave its appends with ours."""
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLocked(f"{self.directory}: the store is open in another process")
        self._lock_fd = fd

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _adopt(self, recovered: RecoveredSegment) -> Segment:
        chunks = []
        for rc in recovered.chunks:
            data_path, index_path = chunk_paths(recovered.directory, rc.start)
            chunk = Chunk(data_path, index_path, rc.start, rc.first_event)
            chunk.next_event = rc.next_event
            chunk.size = rc.size
            chunk.records = rc.records
            chunk.newest_us = rc.newest_us
            if rc.entries is not None:
                chunk.set_records(rc.entries)
            else:
                chunk.unload()
            chunks.append(chunk)
        segment = Segment(
            self,
            recovered.name,
            recovered.directory,
            chunks,
            recovered.first_event,
            recovered.ledger,
            corrupt_records=recovered.report.corrupt_records,
        )
        self._segments[recovered.name] = segment
        self.recovery.append(recovered.report)
        if segment.deletable_chunks():
            # Chunks a crash left behind below the saved start (released, not yet deleted).
            self.wants_commit(segment)
        return segment

    async def _close(self) -> None:
        """Refuse appends, make everything durable, mark the store clean."""
        self._closed = True
        for segment in self._segments.values():
            segment.close()
        try:
            if not self._failed:
                await self._commit(sync_data=True, everything=True)
                await self._unlink_doomed()
                await trio.to_thread.run_sync(self._mark_clean)
        finally:
            for segment in self._segments.values():
                for chunk in segment.chunks:
                    chunk.close()
            self.files.close_all()
            self._unlock()

    def _mark_clean(self) -> None:
        (self.directory / CLEAN_MARKER).touch()
        fsync_directory(self.directory)

    # -- segments ----------------------------------------------------------------------

    @overload
    def segment(self, name: str, *, create: Literal[True] = True) -> Segment: ...

    @overload
    def segment(self, name: str, *, create: bool) -> Segment | None: ...

    def segment(self, name: str, *, create: bool = True) -> Segment | None:
        """The segment ``name``; created (empty) if missing and ``create``, else None."""
        segment = self._segments.get(name)
        if segment is not None or not create:
            return segment
        if self._closed:
            raise trio.ClosedResourceError("the store is closed")
        directory = self.directory / SEGMENTS_DIR / encode_name(name)
        directory.mkdir()
        data_path, index_path = chunk_paths(directory, 0)
        chunk = Chunk(data_path, index_path, 0, 0)
        chunk.create()
        segment = Segment(self, name, directory, [chunk], 0, {})
        self._segments[name] = segment
        self._dirty_dirs.update((directory, directory.parent))
        self.created_files(segment, chunk)
        self._wake()
        return segment

    def names(self) -> list[str]:
        """Every segment, sorted."""
        return sorted(self._segments)

    # -- what segments tell the store ------------------------------------------------

    def now_us(self) -> int:
        """Wall-clock microseconds, advanced by trio's clock since the store opened (so
        a test's MockClock ages records, and a clock step does not)."""
        return int((self._wall0 + trio.current_time() - self._trio0) * 1e6)

    def written(self, segment: Segment, chunk: Chunk) -> None:
        """``segment`` appended to ``chunk``."""
        dirty = self._dirty.get(segment)
        if dirty is None:
            dirty = self._dirty[segment] = set()
        dirty.add(chunk)
        if self.fsync == "never":
            segment.advance_durable(segment.end, callbacks=False)
            if segment.has_callbacks:
                self.wants_commit(segment)
        else:
            self._wake()

    def created_files(self, segment: Segment, chunk: Chunk) -> None:
        """``segment`` created the files of ``chunk``: its directory needs a sync."""
        self._dirty_dirs.add(segment.directory)
        self.files.touch(chunk)

    def wants_commit(self, segment: Segment) -> None:
        """``segment`` has callbacks, a meta document or deletions for the committer."""
        self._attention.add(segment)
        self._wake()

    def _wake(self) -> None:
        """Something is pending for the committer."""
        if not self._kick.is_set():
            self._kick.set()

    def cache_record(self, key: Any, value: Any, size: int) -> None:
        cache = self.record_cache
        cache[key] = value
        self._record_sizes[key] = size
        self._record_cache_bytes += size
        while self._record_cache_bytes > RECORD_CACHE_BYTES and len(cache) > 1:
            old, _ = cache.popitem(last=False)
            self._record_cache_bytes -= self._record_sizes.pop(old)

    # -- the committer -------------------------------------------------------------------

    async def _committer(self) -> None:
        last = -math.inf
        while True:
            await self._kick.wait()
            if self.fsync_interval > 0:
                await trio.sleep_until(last + self.fsync_interval)
            last = trio.current_time()
            # Shielded: a commit that took the pending work must finish it, or a close
            # arriving meanwhile would find that work neither done nor pending.
            with trio.CancelScope(shield=True):
                await self._commit(sync_data=self.fsync != "never")

    async def _commit(self, *, sync_data: bool, everything: bool = False) -> None:
        """One group commit: sync what was written (if ``sync_data``), write pending
        states and meta documents, then advance durability, then delete chunks."""
        self._kick = trio.Event()
        attention = self._attention
        self._attention = set()
        if everything:
            attention.update(self._segments.values())
        dirty: dict[Segment, set[Chunk]] = {}
        dirs: set[Path] = set()
        if sync_data:
            dirty, self._dirty = self._dirty, {}
            dirs, self._dirty_dirs = self._dirty_dirs, set()
        targets = {segment: segment.end for segment in (attention if everything else dirty)}
        chunks = [chunk for chunks in dirty.values() for chunk in chunks]
        for chunk in chunks:
            chunk.dirty = False
            chunk.pins += 1
        states, self._pending_states = self._pending_states, {}
        metas: list[tuple[Path, bytes]] = []
        for segment in attention:
            if segment.meta_dirty:
                segment.meta_dirty = False
                metas.append(
                    (segment.directory / META_FILE, pack_document(segment.meta_document()))
                )
        if chunks or dirs or states or metas:
            began = time.perf_counter()
            try:
                fsyncs = await self._sync(chunks, dirs, states, metas)
            except BaseException:
                # A failed fsync may have lost written data (the kernel drops the pages):
                # nothing may call this store clean again.
                self._failed = True
                raise
            finally:
                for chunk in chunks:
                    chunk.pins -= 1
            self._stats["commits"] += 1
            self._stats["fsyncs"] += fsyncs
            self._stats["fsync_us"] += int((time.perf_counter() - began) * 1e6)
            self._stats["state_writes"] += len(states)
        for segment, end in targets.items():
            segment.advance_durable(end)
        for segment in attention:
            if segment not in targets:
                segment.advance_durable(segment.durable_end)
        if not everything:
            for segment in attention | targets.keys():
                if segment.deletable_chunks():
                    await self._delete_chunks(segment)

    async def _sync(
        self,
        chunks: list[Chunk],
        dirs: set[Path],
        states: dict[str, bytes],
        metas: list[tuple[Path, bytes]],
    ) -> int:
        """fsync data, indexes and directories and write documents, in up to
        SYNC_THREADS worker threads at once (concurrent fsyncs share the file system's
        journal commits and the device's cache flushes). Returns the number of fsyncs.

        A chunk's data and index are synced one after the other in one thread: on
        ext4 two concurrent fdatasyncs of a pair cost more than two in a row (one
        writer of 1 KiB events: 360 against 415 MiB/s with a sync every 6 MiB,
        docs/performance.md "Segment store")."""
        jobs: list[Callable[[], int]] = [
            functools.partial(
                _sync_chunk, chunk.fd, chunk.data_path, chunk.index_fd, chunk.index_path
            )
            for chunk in chunks
        ]
        jobs.extend(functools.partial(_fsync_directory, d) for d in dirs)
        states_dir = self.directory / STATES_DIR
        jobs.extend(
            functools.partial(_write_document, states_dir / (encode_name(owner) + ".state"), data)
            for owner, data in states.items()
        )
        jobs.extend(functools.partial(_write_document, path, data) for path, data in metas)
        lanes = [jobs[i::SYNC_THREADS] for i in range(min(SYNC_THREADS, len(jobs)))]
        counts: list[int] = []

        async def lane(lane_jobs: list[Callable[[], int]]) -> None:
            counts.append(await trio.to_thread.run_sync(_run_all, lane_jobs))

        async with trio.open_nursery() as nursery:
            for lane_jobs in lanes:
                nursery.start_soon(lane, lane_jobs)
        return sum(counts)

    async def _delete_chunks(self, segment: Segment) -> None:
        """Let go of the chunks retention or ``truncate_before`` released: save the
        segment's ledger snapshot (so writers whose records go keep their numbers), forget
        the chunks, and queue their files for the unlinker.

        The files are not deleted here: unlinking a 64 MiB chunk takes tens of
        milliseconds on ext4, and a sweep that releases a dozen of them held every
        append's ack up for a third of a second while the committer waited."""
        chunks = segment.deletable_chunks()
        head = segment.chunks[len(chunks)]
        document = segment.meta_document()
        document["first_event"] = max(segment.first_event, head.first_event)
        moved = segment.retire(chunks)
        for chunk in chunks:
            self.files.forget(chunk)
            chunk.close()
        await trio.to_thread.run_sync(
            write_document, segment.directory / META_FILE, pack_document(document)
        )
        dirty = self._dirty.get(segment)
        if dirty is not None:
            dirty.difference_update(chunks)
        segment.drop_chunks(chunks, moved)
        self._doomed.append((segment.directory, chunks))
        self._doomed_lot.unpark_all()

    async def _unlinker(self) -> None:
        """Delete the files of released chunks, oldest first, apart from the committer."""
        while True:
            while not self._doomed:
                await self._doomed_lot.park()
            await self._unlink_doomed()

    async def _unlink_doomed(self) -> None:
        """Delete the files of every released chunk queued now (in a worker thread)."""
        while self._doomed:
            directory, chunks = self._doomed[0]
            await trio.to_thread.run_sync(_unlink_chunks, directory, chunks)
            self._doomed.popleft()
            self._stats["chunks_deleted"] += len(chunks)
            self._stats["bytes_deleted"] += sum(c.size for c in chunks)

    # -- retention -------------------------------------------------------------------------

    async def _sweeper(self) -> None:
        while True:
            await trio.sleep(SWEEP_SECONDS)
            self.sweep()

    def sweep(self) -> dict[str, int]:
        """Apply retention by size and age to every segment (the sweeper calls it every
        few seconds): the committer deletes whole non-active chunks, oldest first. Returns,
        for each segment with chunks to delete, the first event retention keeps."""
        now = self.now_us()
        wanted: dict[str, int] = {}
        for segment in self._segments.values():
            chunks = segment.chunks
            retain_bytes = segment.retain_bytes
            retain_age = segment.retain_age
            total = sum(c.size for c in chunks)
            keep_from = 0
            for chunk in chunks[:-1]:
                too_big = retain_bytes is not None and total > retain_bytes
                too_old = retain_age is not None and chunk.newest_us < now - retain_age * 1e6
                if not (too_big or too_old):
                    break
                total -= chunk.size
                keep_from += 1
            if keep_from:
                target = chunks[keep_from].first_event
                wanted[segment.name] = target
                if target > segment.delete_below:
                    segment.delete_below = target
                self.wants_commit(segment)
        return wanted

    # -- states ----------------------------------------------------------------------------

    def load_state(self, owner: str) -> dict[str, Any]:
        """The owner's document ({} if none): the latest saved, even if not written yet."""
        data = self._states.get(owner)
        if data is None:
            path = self.directory / STATES_DIR / (encode_name(owner) + ".state")
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return {}
            self._states[owner] = data
        return unpack_document(data) or {}

    def save_state(self, owner: str, state: dict[str, Any]) -> None:
        """Remember the document (packed now: later changes to ``state`` do not count);
        the committer writes it atomically (tmp, fsync, rename) on its next cycle,
        only the latest version per owner, and at close."""
        data = pack_document(state)
        self._states[owner] = data
        self._pending_states[owner] = data
        self._wake()

    # -- figures ------------------------------------------------------------------------------

    def stats(self) -> dict[str, int]:
        """Store-wide counters: segments, bytes, events, appends, commits, fsyncs,
        fsync_us, state_writes, chunks_deleted, bytes_deleted, corrupt_records, and the
        recovery totals (recovery_truncated_bytes, recovery_corrupt_records)."""
        totals: dict[str, int] = {
            "segments": len(self._segments),
            "bytes": 0,
            "events": 0,
            "appends": 0,
            "appended_bytes": 0,
            "corrupt_records": 0,
        }
        for segment in self._segments.values():
            figures = segment.stats()
            for key in ("bytes", "events", "appends", "appended_bytes", "corrupt_records"):
                totals[key] += figures[key]
        totals.update(self._stats)
        totals["recovery_truncated_bytes"] = sum(r.truncated_bytes for r in self.recovery)
        totals["recovery_corrupt_records"] = sum(r.corrupt_records for r in self.recovery)
        return totals


def _run_all(jobs: list[Callable[[], int]]) -> int:
    return sum(job() for job in jobs)


def _fdatasync(fd: int | None, path: Path) -> int:
    """fdatasync an open file, or open it to (a chunk the file cache closed); a file
    retention deleted meanwhile needs nothing. Returns the fsyncs done."""
    if fd is not None:
        os.fdatasync(fd)
        return 1
    try:
        own = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        os.fdatasync(own)
    finally:
        os.close(own)
    return 1


def _sync_chunk(fd: int | None, path: Path, index_fd: int | None, index_path: Path) -> int:
    """A chunk's data, then its index."""
    return _fdatasync(fd, path) + _fdatasync(index_fd, index_path)


def _unlink_chunks(directory: Path, chunks: list[Chunk]) -> None:
    for chunk in chunks:
        chunk.data_path.unlink(missing_ok=True)
        chunk.index_path.unlink(missing_ok=True)
    fsync_directory(directory)


def _fsync_directory(path: Path) -> int:
    fsync_directory(path)
    return 1


def _write_document(path: Path, data: bytes) -> int:
    write_document(path, data)
    return 2
