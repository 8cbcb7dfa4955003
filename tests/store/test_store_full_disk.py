"""A full disk is a state the store lives through (docs/store.md, "A full disk").

These tests inject ``ENOSPC`` at chosen writes (an I/O seam: ``os.pwrite``,
``os.open`` and the document writer); tests/faults/test_disk_full.py fills a real
small file system under a whole gateway.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from gateway.core.errors import StorageFull
from gateway.store import Store, frame_events
from gateway.store import store as store_module
from gateway.store.layout import unpack_document
from gateway.store.space import DiskSpace


def nospace() -> OSError:
    return OSError(errno.ENOSPC, "No space left on device")


class Disk:
    """Switches ENOSPC on and off for the store's writes, and counts the attempts. The
    free space the store sees is none while full, unless ``quota`` (a quota fails the
    writes while the file system has room)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full = False
        self.quota = False
        self.attempts = 0
        real_pwrite, real_write_document = os.pwrite, store_module.write_document
        real_fallocate = os.posix_fallocate

        def pwrite(fd: int, data: Any, position: int) -> int:
            self.attempts += 1
            if self.full:
                raise nospace()
            return real_pwrite(fd, data, position)

        def write_document(path: Path, data: bytes) -> None:
            self.attempts += 1
            if self.full:
                raise nospace()
            real_write_document(path, data)

        def fallocate(fd: int, offset: int, length: int) -> None:
            if self.full:
                raise nospace()
            real_fallocate(fd, offset, length)

        def free_bytes(space: DiskSpace) -> int:
            return 0 if self.full and not self.quota else 2**30

        monkeypatch.setattr(DiskSpace, "free_bytes", free_bytes)
        monkeypatch.setattr(os, "pwrite", pwrite)
        monkeypatch.setattr(os, "posix_fallocate", fallocate)
        monkeypatch.setattr(store_module, "write_document", write_document)


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Disk:
    return Disk(monkeypatch)


def events(*payloads: bytes) -> bytes:
    return frame_events(list(payloads))


def saved_state(tmp_path: Path, owner: str) -> dict[str, Any] | None:
    path = tmp_path / "states" / f"{owner}.state"
    return unpack_document(path.read_bytes()) if path.exists() else None


@pytest.fixture
def store_errors(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    caplog.set_level(logging.INFO, logger="gateway.store")

    def errors() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]

    return errors


async def test_a_state_document_that_does_not_fit_waits_in_memory(
    tmp_path: Path,
    disk: Disk,
    autojump_clock: trio.testing.MockClock,
    store_errors: Callable[[], list[str]],
) -> None:
    async with Store.open(tmp_path) as store:
        store.save_state("logs", {"position": 1})
        await store.sync()
        assert saved_state(tmp_path, "logs") == {"position": 1}
        disk.full = True
        store.save_state("logs", {"position": 2})
        await store.sync()  # the committer tried, and lives on
        assert store.space.full
        store.save_state("logs", {"position": 3})  # a consumer acks on
        await store.sync()
        assert saved_state(tmp_path, "logs") == {"position": 1}
        assert store.load_state("logs") == {"position": 3}
        disk.full = False
        await store.space.room()
        await store.sync()
        assert saved_state(tmp_path, "logs") == {"position": 3}
    assert len(store_errors()) == 1
    assert "the disk is full" in store_errors()[0]
    assert not list((tmp_path / "states").glob("*.tmp"))


async def test_appends_are_refused_at_once_while_full_and_resume(
    tmp_path: Path, disk: Disk, autojump_clock: trio.testing.MockClock
) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        segment.append(events(b"a"), 1)
        disk.full = True
        with pytest.raises(StorageFull) as first:
            segment.append(events(b"b"), 1)
        tried = disk.attempts
        for _ in range(100):
            with pytest.raises(StorageFull):
                segment.append(events(b"b"), 1)
        assert disk.attempts == tried  # refused without touching the disk
        assert (segment.next_event, store.stats()["disk_full"]) == (1, 1)
        woke: list[float] = []

        async def held_publisher() -> None:
            await first.value.room()
            woke.append(trio.current_time())
            segment.append(events(b"b"), 1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(held_publisher)
            await trio.sleep(5)
            assert not woke  # the disk is still full: held
            disk.full = False
        assert segment.next_event == 2
        assert store.stats()["disk_full"] == 0
        assert store.stats()["disk_full_episodes"] == 1
        await segment.durable(segment.end)
    async with Store.open(tmp_path) as store:
        got = store.segment("s").read_events(0, 10, 1000)
        assert [payload for _, payload in got] == [b"a", b"b"]


async def test_a_quota_the_free_space_does_not_show_is_retried(
    tmp_path: Path,
    disk: Disk,
    autojump_clock: trio.testing.MockClock,
    store_errors: Callable[[], list[str]],
) -> None:
    """statvfs shows room, the writes fail: retried every RETRY_SECONDS (not every
    POLL_SECONDS), the ERROR line at most once a minute."""
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        disk.full = disk.quota = True
        retries = 0

        async def publisher() -> None:
            nonlocal retries
            while True:
                try:
                    segment.append(events(b"x"), 1)
                    return
                except StorageFull as full:
                    retries += 1
                    await full.room()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(publisher)
            await trio.sleep(119)
            assert 11 <= retries <= 13  # every RETRY_SECONDS
            disk.full = False
        assert segment.next_event == 1
    assert len(store_errors()) == 2  # at 0 s and after a minute


async def test_a_new_segment_and_a_new_chunk_need_no_room_until_written(
    tmp_path: Path, disk: Disk, autojump_clock: trio.testing.MockClock
) -> None:
    async with Store.open(tmp_path, chunk_bytes=100) as store:
        old = store.segment("old")
        old.append(events(b"x" * 80), 1)
        disk.full = True
        real_open = os.open

        def no_inodes(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
            if flags & os.O_CREAT and disk.full:
                raise nospace()
            return real_open(path, flags, mode, **kw)

        with pytest.MonkeyPatch.context() as m:
            m.setattr(os, "open", no_inodes)
            new = store.segment("new")  # a destination declared on a full disk
            with pytest.raises(StorageFull):
                new.append(events(b"y"), 1)
            disk.full = False
            store.space.resume()
            disk.full = True
            with pytest.raises(StorageFull):  # the roll's files cannot be made
                old.append(events(b"z" * 80), 1)
        assert sorted(p.name for p in (tmp_path / "segments" / "old").iterdir()) == [
            "00000000000000000000.data",
            "00000000000000000000.index",
        ]
        disk.full = False
        await store.space.room()
        new.append(events(b"y"), 1)
        old.append(events(b"z" * 80), 1)
        assert len(old.chunks) == 2
    async with Store.open(tmp_path) as store:
        assert [p for _, p in store.segment("new").read_events(0, 9, 999)] == [b"y"]
        assert len(store.segment("old").read_events(0, 9, 999)) == 2


async def test_closing_on_a_full_disk_saves_states_in_the_reserve(
    tmp_path: Path, disk: Disk, autojump_clock: trio.testing.MockClock
) -> None:
    reserve = tmp_path / store_module.RESERVE_FILE
    async with Store.open(tmp_path, reserve_bytes=65536) as store:
        assert reserve.stat().st_size == 65536
        store.save_state("logs", {"position": 1})
        await store.sync()
        disk.full = True
        store.save_state("logs", {"position": 7})
        await store.sync()
        assert store.space.full

        # The disk stays full; only the reserve given up makes room for the document.
        def fits_once_reserve_is_gone() -> None:
            disk.full = reserve.exists()

        store.space._on_room = fits_once_reserve_is_gone  # type: ignore[assignment]
    assert saved_state(tmp_path, "logs") == {"position": 7}
    disk.full = False
    async with Store.open(tmp_path, reserve_bytes=65536):
        assert reserve.stat().st_size == 65536  # made again when there is room


async def test_closing_on_a_disk_too_full_even_for_the_reserve(
    tmp_path: Path,
    disk: Disk,
    autojump_clock: trio.testing.MockClock,
    store_errors: Callable[[], list[str]],
) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        segment.append(events(b"a"), 1)
        store.save_state("logs", {"position": 1})
        await store.sync()
        disk.full = True
        store.save_state("logs", {"position": 2})
        await store.sync()
    # Closed without an exception; the consumer resumes from its last saved position.
    assert saved_state(tmp_path, "logs") == {"position": 1}
    assert any("closed on a full disk with 1 state documents unsaved" in e for e in store_errors())
    disk.full = False
    async with Store.open(tmp_path) as store:
        assert [p for _, p in store.segment("s").read_events(0, 9, 99)] == [b"a"]
        assert store.load_state("logs") == {"position": 1}


async def test_a_store_opened_on_a_full_disk_is_full_from_the_start(
    tmp_path: Path, disk: Disk, autojump_clock: trio.testing.MockClock
) -> None:
    disk.full = True
    async with Store.open(tmp_path, reserve_bytes=4096) as store:
        assert store.space.full
        assert store.space.shortage is not None
        assert store.space.shortage.needed == 4096
        segment = store.segment("s")
        with pytest.raises(StorageFull) as held:
            segment.append(events(b"a"), 1)
        disk.full = False
        await held.value.room()
        segment.append(events(b"a"), 1)
        await segment.durable(segment.end)
