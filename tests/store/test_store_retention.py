"""Retention by size and age, truncate_before's deletions, the ledger snapshot that
outlives deleted records, and state documents."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from gateway.store import SegmentTruncated, Store, frame_events
from gateway.store import store as store_module
from gateway.store.store import SWEEP_SECONDS

#: One record: two events of 41 payload bytes, 98 bytes framed.
RECORD = frame_events([b"a" * 41, b"b" * 41])


async def until(predicate: Callable[[], bool]) -> None:
    """Wait (in trio time) until ``predicate()``: the committer deletes files in a worker
    thread, which the mock clock does not wait for."""
    while not predicate():
        await trio.sleep(0.01)


async def finished(predicate: Callable[[], bool]) -> None:
    """Wait without letting trio time pass until ``predicate()``: the work a sweep started
    finishes in a worker thread (with fsync "always", the committer never sleeps). Busy,
    so that the mock clock does not jump; bounded in real time."""
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, "the store did not finish in 30 s"
        await trio.lowlevel.checkpoint()


def data_files(directory: Path) -> list[Path]:
    return sorted((directory / "segments" / "s").glob("*.data"))


async def test_retention_by_size(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with Store.open(tmp_path, chunk_bytes=200, retain_bytes=500) as store:
        segment = store.segment("s")
        assert segment is not None
        truncated: list[int] = []
        segment.observe(lambda a, f: None, truncated.append)
        for _ in range(10):  # two records a chunk: five chunks of 196 bytes
            segment.append(RECORD, 2)
        assert len(data_files(tmp_path)) == 5
        await until(lambda: bool(truncated))  # the observers hear once the chunks are released
        assert trio.current_time() >= SWEEP_SECONDS
        await until(lambda: store.stats()["chunks_deleted"] == 3)  # the unlinker's work
        # 980 bytes > 500: the oldest chunks go until what is left fits.
        assert len(data_files(tmp_path)) == 2
        assert (segment.first_event, segment.start) == (12, 3 * 196)
        assert truncated == [12]
        assert segment.stats()["bytes"] == 2 * 196
        assert store.stats()["chunks_deleted"] == 3
        with pytest.raises(SegmentTruncated) as info:
            segment.read_events(11, 1, 100)
        assert info.value.first_event == 12
        with pytest.raises(SegmentTruncated):
            segment.read(0, 10)
        assert len(segment.read_events(12, 100, 10_000)) == 8
    async with Store.open(tmp_path, chunk_bytes=200) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        assert (segment.first_event, segment.start, segment.next_event) == (12, 588, 20)


async def test_commits_do_not_wait_for_released_chunk_files_to_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Unlinking big chunk files is slow; appends must become durable meanwhile.
    release = threading.Event()
    unlink = store_module._unlink_chunks

    def slow_unlink(directory: Path, chunks: list[store_module.Chunk]) -> None:
        release.wait(30)
        unlink(directory, chunks)

    monkeypatch.setattr(store_module, "_unlink_chunks", slow_unlink)
    try:
        async with Store.open(tmp_path, fsync="always", chunk_bytes=200, retain_bytes=500) as store:
            segment = store.segment("s")
            assert segment is not None
            for _ in range(10):  # five chunks of 196 bytes
                segment.append(RECORD, 2)
            assert store.sweep() == {"s": 12}
            await finished(lambda: segment.first_event == 12)  # released by the committer
            assert len(data_files(tmp_path)) == 5  # the unlinker is still at it
            appended = segment.append(RECORD, 2)
            with trio.fail_after(10):
                await segment.durable(appended.end)
            assert store.stats()["chunks_deleted"] == 0
            release.set()
            await finished(lambda: store.stats()["chunks_deleted"] == 3)
            assert len(data_files(tmp_path)) == 3  # the two kept and a new active one
    finally:
        release.set()


async def test_chunk_files_a_crash_left_behind_are_deleted_after_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with monkeypatch.context() as patch:
        # The process dies after the meta snapshot and before the files went.
        patch.setattr(store_module, "_unlink_chunks", lambda directory, chunks: None)
        async with Store.open(tmp_path, fsync="always", chunk_bytes=200, retain_bytes=500) as store:
            segment = store.segment("s")
            assert segment is not None
            for _ in range(10):
                segment.append(RECORD, 2)
            store.sweep()
            await finished(lambda: segment.first_event == 12)
        assert len(data_files(tmp_path)) == 5
    async with Store.open(tmp_path, fsync="always", chunk_bytes=200) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        await finished(lambda: store.stats()["chunks_deleted"] == 3)
        assert len(data_files(tmp_path)) == 2
        assert (segment.first_event, segment.start, segment.next_event) == (12, 3 * 196, 20)


async def test_the_active_chunk_is_never_deleted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with Store.open(tmp_path, retain_bytes=10, retain_age=1) as store:
        segment = store.segment("s")
        assert segment is not None
        segment.append(RECORD, 2)
        await trio.sleep(10 * SWEEP_SECONDS)
        assert (segment.first_event, len(data_files(tmp_path))) == (0, 1)


async def test_retention_by_age(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with Store.open(tmp_path, fsync="always", chunk_bytes=200, retain_age=60) as store:
        segment = store.segment("s")
        assert segment is not None
        for _ in range(4):  # two full chunks, written at t=0
            segment.append(RECORD, 2)
        await trio.sleep(30)
        segment.append(RECORD, 2)  # a third chunk, written at t=30
        segment.append(RECORD, 2)
        segment.append(RECORD, 2)  # the active chunk
        await trio.sleep(29)  # t=59: nothing is 60 s old yet
        assert store.sweep() == {}
        assert segment.first_event == 0
        await trio.sleep(2)  # t=61: the first two are
        assert store.sweep() == {"s": 8}
        await finished(lambda: store.stats()["chunks_deleted"] == 2)
        assert segment.first_event == 8
        assert len(data_files(tmp_path)) == 2
        await trio.sleep(28)  # t=89: the third not yet
        assert store.sweep() == {}
        await trio.sleep(2)  # t=91: now it is
        assert store.sweep() == {"s": 12}
        await finished(lambda: store.stats()["chunks_deleted"] == 3)
        assert segment.first_event == 12
        assert len(data_files(tmp_path)) == 1


async def test_truncate_before_deletes_whole_chunks_below(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with Store.open(tmp_path, chunk_bytes=200) as store:
        segment = store.segment("s")
        assert segment is not None
        truncated: list[int] = []
        segment.observe(lambda a, f: None, truncated.append)
        for _ in range(6):
            segment.append(RECORD, 2)
        segment.truncate_before(5)  # inside the second chunk: only the first can go
        await until(lambda: store.stats()["chunks_deleted"] > 0)
        await trio.sleep(10)
        assert len(data_files(tmp_path)) == 2
        assert (segment.first_event, segment.start) == (5, 4 * 49 + 49)
        assert truncated == []  # the owner moved the start itself: no retention news
    async with Store.open(tmp_path, chunk_bytes=200) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        assert segment.first_event == 5
        assert segment.read_events(5, 1, 100) == [(0, b"b" * 41)]


async def test_writers_whose_records_were_deleted_keep_their_numbers(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    early, late = uuid.uuid4(), uuid.uuid4()
    async with Store.open(tmp_path, chunk_bytes=200, retain_bytes=200) as store:
        segment = store.segment("s")
        assert segment is not None
        segment.append(RECORD, 2, writer=early, last_event_number=42)
        for n in range(1, 6):
            segment.append(RECORD, 2, writer=late, last_event_number=n)
        await until(lambda: len(data_files(tmp_path)) == 1)  # the early writer's record goes
        assert segment.last_event_number(early) == 42
    # Not in any index any more: the snapshot written before the deletion has it.
    async with Store.open(tmp_path, chunk_bytes=200) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        assert segment.last_event_number(early) == 42
        assert segment.last_event_number(late) == 5


async def test_state_documents(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        state = {"committed": 3, "name": "ü/x", "blob": b"\x00\x01"}
        store.save_state("durable/logs", state)
        state["committed"] = 4  # saved as it was when saved
        assert store.load_state("durable/logs")["committed"] == 3
        store.save_state("durable/logs", {"committed": 5})
        with pytest.raises(TypeError):
            store.save_state("bad", {"x": object()})
        assert store.load_state("bad") == {}
    assert len(list((tmp_path / "states").iterdir())) == 1
    async with Store.open(tmp_path) as store:
        assert store.load_state("durable/logs") == {"committed": 5}


async def test_states_are_written_by_the_committer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with Store.open(tmp_path, fsync_interval=1) as store:
        for n in range(100):
            store.save_state("owner", {"n": n})
        while store.stats()["state_writes"] == 0:
            await trio.sleep(0.1)
        assert store.stats()["state_writes"] == 1  # only the latest version is written
        copy = tmp_path.parent / "copy"
        shutil.copytree(tmp_path, copy)
    async with Store.open(copy) as store:
        assert store.load_state("owner") == {"n": 99}


async def test_reads_while_retention_deletes_files_see_the_new_start(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with Store.open(tmp_path, chunk_bytes=200, retain_bytes=500, fsync="never") as store:
        segment = store.segment("s")
        for _ in range(10):
            segment.append(RECORD, 2)
        assert store.sweep() == {"s": 12}
        outcomes: set[str] = set()
        deadline = time.monotonic() + 30
        # The files go in a worker thread: every read meanwhile either still finds the
        # old events or is told where the segment starts now; none finds a file gone.
        while store.stats()["chunks_deleted"] < 3:
            assert time.monotonic() < deadline
            try:
                segment.read_events(0, 4, 1 << 20)
                outcomes.add("read")
            except SegmentTruncated as e:
                outcomes.add(f"truncated at {e.first_event}")
            await trio.lowlevel.checkpoint()
        assert outcomes - {"read"} == {"truncated at 12"}
        with pytest.raises(SegmentTruncated):
            segment.read(0, 100)
