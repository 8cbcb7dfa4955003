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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, overload

import trio

from gateway.store.chunk import Chunk, FileCache
from gateway.store.layout import (
    CLEAN_MARKER,
    META_FILE,
    SEGMENTS_DIR,
    STATES_DIR,
    TMP_SUFFIX,
    chunk_paths,
    decode_name,
    encode_name,
    fsync_directory,
    pack_document,
    unpack_document,
    write_document,
)
from gateway.store.recovery import RecoveredSegment, RecoveryReport, Verify, recover_segment
from gateway.store.segment import Segment
from gateway.store.space import DiskSpace, is_full

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
#: Bytes set aside in the file RESERVE_FILE while the store is open, given up at close
#: when the disk is full, so that the consumers' positions kept in memory meanwhile can
#: still be saved. A store that cannot set it aside when it opens starts full.
RESERVE_BYTES = 2**20
RESERVE_MIN = 2**16
RESERVE_FILE = "reserve"


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
        reserve_bytes: int = RESERVE_BYTES,
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
        #: Group commits begun and finished (for :meth:`sync`).
        self._begun = self._finished = 0
        self._committed = trio.lowlevel.ParkingLot()
        #: Full or writable: a full disk holds appends and documents until there is room.
        self.space = DiskSpace(self.directory, on_room=self._wake)
        self.reserve_bytes = reserve_bytes
        #: Why the reserve could not be made at open (a full disk), if it could not.
        self._reserve_error: OSError | None = None
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
        reserve_bytes: int = RESERVE_BYTES,
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
            reserve_bytes=reserve_bytes,
        )
        await store._start()
        body_error: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store._committer)
                nursery.start_soon(store._sweeper)
                nursery.start_soon(store._unlinker)
                nursery.start_soon(store.space.watch)
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

    async def _start(self) -> None:
        """Take the lock, recover every segment (in a worker thread) and adopt it; the
        clocks start now. A failed recovery gives the lock back."""
        try:
            recovered = await trio.to_thread.run_sync(self._recover)
        except BaseException:
            self._unlock()
            raise
        self._trio0 = trio.current_time()
        self._wall0 = time.time()
        if self._reserve_error is not None:
            # Opened on a full disk: it is full from the start (and says so).
            self.space.exhausted(self._reserve_error, "the store's reserve", self.reserve_bytes)
        for segment in recovered:
            self._adopt(segment)

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
        self._make_reserve()
        return recovered

    def _make_reserve(self) -> None:
        """Set RESERVE_BYTES aside on the disk (blocking). On a full disk, as much of
        it as fits (halving down to RESERVE_MIN), and the store starts full."""
        if not self.reserve_bytes:
            return
        path = self.directory / RESERVE_FILE
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            want = self.reserve_bytes
            while want > os.fstat(fd).st_size:
                try:
                    os.posix_fallocate(fd, 0, want)
                except OSError as e:
                    if not is_full(e):
                        raise
                    self._reserve_error = e
                    want //= 2
                    if want < RESERVE_MIN:
                        break
        finally:
            os.close(fd)

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
                if self.space.full:
                    await self._close_full()
                await self._unlink_doomed()
                await trio.to_thread.run_sync(self._mark_clean)
        finally:
            for segment in self._segments.values():
                for chunk in segment.chunks:
                    chunk.close()
            self.files.close_all()
            self._unlock()

    async def _close_full(self) -> None:
        """Closing on a full disk: give up the reserve, so that the documents kept in
        memory (consumers' positions) fit, and try them once more."""
        (self.directory / RESERVE_FILE).unlink(missing_ok=True)
        self.space.resume(quiet=True)
        await self._commit(sync_data=True, everything=True)
        unsaved = len(self._pending_states) + sum(s.meta_dirty for s in self._segments.values())
        if unsaved:
            log.error(
                "store: closed on a full disk with %d state documents unsaved: consumers"
                " resume from their last saved positions (what they acked since is"
                " delivered again)",
                unsaved,
            )

    def _mark_clean(self) -> None:
        """Blocking. On a full disk the store stays marked unclean: the next open
        verifies its tails, which costs time, never data."""
        try:
            (self.directory / CLEAN_MARKER).touch()
        except OSError as e:
            if not is_full(e):
                raise
            log.warning("store: no room to mark the store clean; the next start verifies it")
            return
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
        data_path, index_path = chunk_paths(directory, 0)
        chunk = Chunk(data_path, index_path, 0, 0)
        chunk.created = False
        segment = Segment(self, name, directory, [chunk], 0, {})
        try:
            self.create_files(segment, chunk)
        except OSError as e:
            if not is_full(e):
                raise
            # On a full disk the segment exists in memory; its first append makes its
            # files (and waits for room like any other).
        self._segments[name] = segment
        self._wake()
        return segment

    def create_files(self, segment: Segment, chunk: Chunk) -> None:
        """Make the files of ``segment``'s new ``chunk`` (and the segment's directory,
        for its first): its first append is coming. OSError (a full disk) leaves
        nothing behind."""
        directory = segment.directory
        made_directory = False
        try:
            if not directory.is_dir():
                directory.mkdir()
                made_directory = True
                self._dirty_dirs.add(directory.parent)
            chunk.create()
        except OSError:
            if made_directory:
                directory.rmdir()
            raise
        self.created_files(segment, chunk)

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

    async def sync(self) -> None:
        """Return after a group commit that started after this call: what was appended
        and saved before it is durable then, or (a full disk) kept for later."""
        target = self._begun + 1
        self._wake()
        while self._finished < target:
            await self._committed.park()

    async def _commit(self, *, sync_data: bool, everything: bool = False) -> None:
        """One group commit: sync what was written (if ``sync_data``), write pending
        states and meta documents, then advance durability, then delete chunks."""
        self._begun += 1
        begun = self._begun
        try:
            await self._commit_now(sync_data=sync_data, everything=everything)
        finally:
            self._finished = max(self._finished, begun)
            self._committed.unpark_all()

    async def _commit_now(self, *, sync_data: bool, everything: bool) -> None:
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
        states, metas = self._take_documents(attention)
        if chunks or dirs or states or metas:
            await self._write_out(chunks, dirs, states, metas)
        self._advance(attention, targets)
        if not everything and not self.space.full:
            for segment in attention | targets.keys():
                if segment.deletable_chunks():
                    await self._delete_chunks(segment)

    def _take_documents(
        self, attention: set[Segment]
    ) -> tuple[dict[str, bytes], list[tuple[Segment, bytes]]]:
        """The states and meta documents this commit writes: none while the disk is
        full (they wait in memory, retried once there is room)."""
        states: dict[str, bytes] = {}
        metas: list[tuple[Segment, bytes]] = []
        if not self.space.full:
            states, self._pending_states = self._pending_states, {}
            for segment in attention:
                if segment.meta_dirty:
                    segment.meta_dirty = False
                    metas.append((segment, pack_document(segment.meta_document())))
        return states, metas

    async def _write_out(
        self,
        chunks: list[Chunk],
        dirs: set[Path],
        states: dict[str, bytes],
        metas: list[tuple[Segment, bytes]],
    ) -> None:
        """Sync ``chunks`` (pinned by the caller, unpinned here) and ``dirs``, write the
        documents, and count it all."""
        began = time.perf_counter()
        unwritten: list[tuple[_Document, OSError]] = []
        try:
            fsyncs = await self._sync(chunks, dirs, states, metas, unwritten)
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
        self._stats["state_writes"] += len(states) - len(unwritten)
        if unwritten:
            self._keep_unwritten(unwritten)

    def _advance(self, attention: set[Segment], targets: dict[Segment, int]) -> None:
        """Durability after a commit: each target up to its end as the commit began;
        segments that only wanted attention run their due callbacks."""
        for segment, end in targets.items():
            segment.advance_durable(end)
        for segment in attention:
            if segment not in targets:
                segment.advance_durable(segment.durable_end)
        for segment in attention:
            if segment.meta_dirty:
                self._attention.add(segment)  # its meta document waits for room

    async def _sync(
        self,
        chunks: list[Chunk],
        dirs: set[Path],
        states: dict[str, bytes],
        metas: list[tuple[Segment, bytes]],
        unwritten: list[tuple[_Document, OSError]],
    ) -> int:
        """fsync data, indexes and directories and write documents, in up to
        SYNC_THREADS worker threads at once (concurrent fsyncs share the file system's
        journal commits and the device's cache flushes). Returns the number of fsyncs.
        A document the full disk has no room for goes to ``unwritten`` instead (it is
        written again later); any other failure raises.

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
        jobs.extend(
            functools.partial(
                _write_if_room, _Document(self.state_path(owner), data, owner=owner), unwritten
            )
            for owner, data in states.items()
        )
        jobs.extend(
            functools.partial(
                _write_if_room,
                _Document(segment.directory / META_FILE, data, segment=segment),
                unwritten,
            )
            for segment, data in metas
        )
        lanes = [jobs[i::SYNC_THREADS] for i in range(min(SYNC_THREADS, len(jobs)))]
        counts: list[int] = []

        async def lane(lane_jobs: list[Callable[[], int]]) -> None:
            counts.append(await trio.to_thread.run_sync(_run_all, lane_jobs))

        async with trio.open_nursery() as nursery:
            for lane_jobs in lanes:
                nursery.start_soon(lane, lane_jobs)
        return sum(counts)

    def _keep_unwritten(self, unwritten: list[tuple[_Document, OSError]]) -> None:
        """Documents the full disk had no room for wait for the next commit with room
        (a state saved again meanwhile replaces its older version)."""
        for document, _ in unwritten:
            if document.owner is not None:
                self._pending_states.setdefault(document.owner, document.data)
            elif document.segment is not None:
                document.segment.meta_dirty = True
                self._attention.add(document.segment)
        document, error = max(unwritten, key=lambda pair: len(pair[0].data))
        self.space.exhausted(error, document.describe(), len(document.data))

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
        meta = pack_document(document)
        try:
            await trio.to_thread.run_sync(write_document, segment.directory / META_FILE, meta)
        except OSError as e:
            if not is_full(e):
                raise
            # The files stay until the meta document fits (retried at the next commit).
            self.space.exhausted(e, f"the meta document of segment {segment.name!r}", len(meta))
            return
        moved = segment.retire(chunks)
        for chunk in chunks:
            self.files.forget(chunk)
            chunk.close()
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

    def state_path(self, owner: str) -> Path:
        """Where the owner's state document is kept."""
        return self.directory / STATES_DIR / (encode_name(owner) + ".state")

    def load_state(self, owner: str) -> dict[str, Any]:
        """The owner's document ({} if none): the latest saved, even if not written yet."""
        data = self._states.get(owner)
        if data is None:
            path = self.state_path(owner)
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
        fsync_us, state_writes, chunks_deleted, bytes_deleted, corrupt_records, the
        disk's state (disk_full 0 or 1, disk_full_episodes, disk_free_bytes), and the
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
        totals["disk_full"] = int(self.space.full)
        totals["disk_full_episodes"] = self.space.episodes
        totals["disk_free_bytes"] = self.space.free_bytes() or 0
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


@dataclass(frozen=True, slots=True)
class _Document:
    """A state (``owner``) or meta (``segment``) document the committer writes."""

    path: Path
    data: bytes
    owner: str | None = None
    segment: Segment | None = None

    def describe(self) -> str:
        if self.segment is not None:
            return f"the meta document of segment {self.segment.name!r}"
        return f"the state document of {self.owner!r}"


def _write_if_room(document: _Document, unwritten: list[tuple[_Document, OSError]]) -> int:
    """Write ``document`` (2 fsyncs); on a full disk, note it in ``unwritten`` instead."""
    try:
        write_document(document.path, document.data)
    except OSError as e:
        if not is_full(e):
            raise
        # What of the temporary file was written takes room the disk has not got.
        document.path.with_name(document.path.name + TMP_SUFFIX).unlink(missing_ok=True)
        unwritten.append((document, e))  # list.append is atomic: lanes share the list
        return 0
    return 2
