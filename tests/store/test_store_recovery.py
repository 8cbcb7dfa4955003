"""Reopening a store: what survives a clean close, and what recovery makes of a crash
(torn tails written by the tests, damaged records in the middle)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import uuid
from pathlib import Path

import pytest
import trio
import trio.testing

from gateway.core.errors import StorageFull
from gateway.store import RecordFormat, Store, frame_events
from gateway.store.layout import (
    INDEX_ENTRY,
    INDEX_HEADER,
    INDEX_VERSION,
    IndexHeader,
    UnknownFormat,
    crc32,
)

WRITER = uuid.UUID(int=1)
CORRUPT = (RecordFormat.CORRUPT, b"")
#: Bytes of one record of ``record()``: three framed 10-byte events.
REC = 54


def payload(i: int) -> bytes:
    return b"event-%04d" % i


def record(first: int, count: int = 3) -> bytes:
    return frame_events([payload(i) for i in range(first, first + count)])


def copy_while_open(source: Path, target: Path) -> None:
    """What a crash leaves: every byte written so far (it is in the page cache), and no
    clean-shutdown marker (an open store has removed it)."""
    shutil.copytree(source, target)


async def fill(directory: Path, records: int, *, chunk_bytes: int = 10**6) -> Path:
    """Append ``records`` records of 3 events (numbers 3, 6, ... for WRITER) and return
    a copy made while the store was open: a crash image."""
    image = directory.parent / (directory.name + "-crash")
    async with Store.open(directory, chunk_bytes=chunk_bytes) as store:
        segment = store.segment("s")
        assert segment is not None
        for r in range(records):
            segment.append(record(3 * r), 3, writer=WRITER, last_event_number=3 * r + 3)
        copy_while_open(directory, image)
    return image


def chunk_files(directory: Path, suffix: str) -> list[Path]:
    return sorted((directory / "segments" / "s").glob("*" + suffix))


def payloads(segment_events: list[tuple[RecordFormat, bytes]]) -> list[bytes]:
    return [p for _, p in segment_events]


async def test_a_clean_reopen_keeps_everything(tmp_path: Path) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    async with Store.open(tmp_path, chunk_bytes=100) as store:
        segment = store.segment("x/y")
        assert segment is not None
        for i in range(10):
            segment.append(record(3 * i), 3, writer=a, last_event_number=i + 1)
        segment.append(record(30, 1), 1, writer=b, last_event_number=99)
        segment.truncate_before(4)
        store.save_state("group/one", {"committed": 12, "members": ["m"]})
        assert store.load_state("group/one") == {"committed": 12, "members": ["m"]}
        written = segment.read(segment.start, 10_000)
    async with Store.open(tmp_path, chunk_bytes=100) as store:
        segment = store.segment("x/y", create=False)
        assert segment is not None
        assert (segment.first_event, segment.next_event) == (4, 31)
        assert segment.read(segment.start, 10_000) == written
        assert payloads(segment.read_events(4, 100, 10_000)) == [payload(i) for i in range(4, 31)]
        assert segment.last_event_number(a) == 10
        assert segment.last_event_number(b) == 99
        assert store.load_state("group/one") == {"committed": 12, "members": ["m"]}
        assert store.load_state("nobody") == {}
        (report,) = store.recovery
        assert (report.segment, report.records, report.corrupt_records) == ("x/y", 11, 0)
        assert (report.truncated_bytes, report.verified_bytes) == (0, 0)  # clean: no data read
        # Appends go on where they stopped.
        assert segment.append(record(31, 1), 1).first_event == 31


async def test_a_crash_image_verifies_only_the_chunks_that_may_be_torn(tmp_path: Path) -> None:
    image = await fill(tmp_path / "store", 10, chunk_bytes=60)  # one record a chunk
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        (report,) = store.recovery
        assert report.problems == []
        assert report.verified_bytes == 2 * REC  # the last two chunks
        assert payloads(segment.read_events(0, 100, 10_000)) == [payload(i) for i in range(30)]
        assert segment.last_event_number(WRITER) == 30


async def test_data_cut_mid_record(tmp_path: Path) -> None:
    image = await fill(tmp_path / "store", 4)
    (data,) = chunk_files(image, ".data")
    os.truncate(data, data.stat().st_size - 20)
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        (report,) = store.recovery
        assert report.truncated_bytes == REC - 20  # what was left of the last record
        assert report.records == 3
        assert (segment.end, segment.next_event) == (3 * REC, 9)
        assert segment.last_event_number(WRITER) == 9  # the lost record's number is gone
        assert payloads(segment.read_events(0, 100, 10_000)) == [payload(i) for i in range(9)]
        # The writer resends; the event indexes go on densely.
        assert segment.append(record(9), 3, writer=WRITER, last_event_number=12).first_event == 9
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        assert store.recovery[0].problems == []
        assert payloads(segment.read_events(0, 100, 10_000)) == [payload(i) for i in range(12)]


async def test_index_cut_mid_entry(tmp_path: Path) -> None:
    image = await fill(tmp_path / "store", 4)
    (index,) = chunk_files(image, ".index")
    os.truncate(index, index.stat().st_size - 30)
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        (report,) = store.recovery
        assert report.truncated_bytes == REC  # the record the lost entry described
        assert segment.next_event == 9
        assert index.stat().st_size == INDEX_HEADER.size + 3 * INDEX_ENTRY.size
        assert chunk_files(image, ".data")[0].stat().st_size == 3 * REC


@pytest.mark.parametrize("suffix", [".data", ".index"])
async def test_garbage_after_the_end(tmp_path: Path, suffix: str) -> None:
    image = await fill(tmp_path / "store", 4)
    (path,) = chunk_files(image, suffix)
    with open(path, "ab") as f:
        f.write(os.urandom(100))
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        (report,) = store.recovery
        assert report.truncated_bytes == (100 if suffix == ".data" else 0)
        assert (segment.end, segment.next_event, report.corrupt_records) == (4 * REC, 12, 0)
        assert payloads(segment.read_events(0, 100, 10_000)) == [payload(i) for i in range(12)]


def flip(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0x40]))


async def test_a_damaged_last_record_is_a_torn_tail(tmp_path: Path) -> None:
    image = await fill(tmp_path / "store", 4)
    flip(chunk_files(image, ".data")[0], 3 * REC + 30)
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        (report,) = store.recovery
        assert (report.truncated_bytes, report.corrupt_records) == (REC, 0)
        assert segment.next_event == 9


async def test_a_damaged_record_in_the_middle_stays_in_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    image = await fill(tmp_path / "store", 4)
    (data,) = chunk_files(image, ".data")
    flip(data, REC + 30)  # the second record
    with caplog.at_level(logging.ERROR, "gateway.store"):
        async with Store.open(image) as store:
            segment = store.segment("s", create=False)
            assert segment is not None
            (report,) = store.recovery
            assert (report.truncated_bytes, report.corrupt_records, report.records) == (0, 1, 4)
            assert segment.stats()["corrupt_records"] == 1
            # Offsets and event indexes do not move; its events read as corrupt.
            assert (segment.end, segment.next_event) == (4 * REC, 12)
            assert segment.read_events(0, 100, 10_000) == [
                *[(RecordFormat.RAW, payload(i)) for i in range(3)],
                CORRUPT,
                CORRUPT,
                CORRUPT,
                *[(RecordFormat.RAW, payload(i)) for i in range(6, 12)],
            ]
            assert segment.read_events(4, 1, 10) == [CORRUPT]
            assert segment.event_offset(6) == 2 * REC
            assert segment.last_event_number(WRITER) == 12
            assert segment.append(record(12), 3).first_event == 12
    logged = [r.getMessage() for r in caplog.records if str(REC) in r.getMessage()]
    assert len(logged) == 1
    assert "'s'" in logged[0]
    # The damage is remembered in the index: a clean reopen still knows it.
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        assert store.recovery[0].corrupt_records == 1
        assert store.recovery[0].verified_bytes == 0
        assert segment.read_events(3, 1, 10) == [CORRUPT]
        assert len(segment.read_events(0, 100, 10_000)) == 15


async def test_damage_found_by_a_read_after_a_clean_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    await fill(tmp_path, 4)  # closed cleanly: recovery will not read the data
    flip(chunk_files(tmp_path, ".data")[0], REC + 30)
    with caplog.at_level(logging.ERROR, "gateway.store"):
        async with Store.open(tmp_path) as store:
            segment = store.segment("s", create=False)
            assert segment is not None
            assert store.recovery[0].corrupt_records == 0
            assert segment.read_events(3, 3, 10_000) == [CORRUPT] * 3
            assert segment.read_events(2, 2, 10_000) == [(RecordFormat.RAW, payload(2)), CORRUPT]
            assert segment.stats()["corrupt_records"] == 1
    assert len([r for r in caplog.records if f"byte {REC}" in r.getMessage()]) == 1


async def test_a_damaged_index_entry_in_the_middle_is_repaired(tmp_path: Path) -> None:
    image = await fill(tmp_path / "store", 4)
    (index,) = chunk_files(image, ".index")
    flip(index, INDEX_HEADER.size + INDEX_ENTRY.size + 5)
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        (report,) = store.recovery
        assert (report.corrupt_records, report.truncated_bytes, report.repaired) == (0, 0, 1)
        assert payloads(segment.read_events(0, 100, 10_000)) == [payload(i) for i in range(12)]
        assert segment.read(REC, REC) == record(3)
    async with Store.open(image) as store:  # repaired on disk
        assert store.recovery[0].problems == []


async def test_a_chunk_whose_index_lost_its_tail(tmp_path: Path) -> None:
    image = await fill(tmp_path / "store", 4, chunk_bytes=120)  # two records a chunk
    first_index, _ = chunk_files(image, ".index")
    os.truncate(first_index, first_index.stat().st_size - INDEX_ENTRY.size)
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        (report,) = store.recovery
        assert (report.corrupt_records, report.records) == (1, 4)
        assert segment.read_events(0, 100, 10_000) == [
            *[(RecordFormat.RAW, payload(i)) for i in range(3)],
            *[CORRUPT] * 3,
            *[(RecordFormat.RAW, payload(i)) for i in range(6, 12)],
        ]


async def test_a_chunk_whose_data_lost_its_tail(tmp_path: Path) -> None:
    image = await fill(tmp_path / "store", 4, chunk_bytes=120)
    first_data, _ = chunk_files(image, ".data")
    os.truncate(first_data, REC + 10)
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        (report,) = store.recovery
        assert report.corrupt_records == 1
        assert first_data.stat().st_size == 2 * REC  # holes filled so offsets hold
        assert segment.read_events(3, 100, 10_000) == [
            *[CORRUPT] * 3,
            *[(RecordFormat.RAW, payload(i)) for i in range(6, 12)],
        ]
        assert segment.read(2 * REC, REC) == record(6)


async def test_everything_torn(tmp_path: Path) -> None:
    image = await fill(tmp_path / "store", 2)
    (data,) = chunk_files(image, ".data")
    os.truncate(data, 0)
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        assert store.recovery[0].truncated_bytes == 0
        assert (segment.end, segment.next_event) == (0, 0)
        assert segment.last_event_number(WRITER) is None
        assert segment.append(record(0), 3).first_event == 0


async def test_a_new_chunk_with_nothing_in_it_yet(tmp_path: Path) -> None:
    image = await fill(tmp_path / "store", 2, chunk_bytes=60)
    # A roll the crash interrupted after creating the files: only the index header.
    _, last_index = chunk_files(image, ".index")
    os.truncate(last_index, INDEX_HEADER.size)
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        assert (segment.end, segment.next_event) == (REC, 3)
        assert segment.append(record(3), 3).first_event == 3
        assert payloads(segment.read_events(0, 10, 1000)) == [payload(i) for i in range(6)]


async def test_a_crash_after_a_clean_restart_is_still_dirty(tmp_path: Path) -> None:
    await fill(tmp_path, 2)
    image = tmp_path.parent / "image"
    async with Store.open(tmp_path) as store:  # a clean start: the marker goes
        assert store.recovery[0].verified_bytes == 0
        copy_while_open(tmp_path, image)
    async with Store.open(image) as store:
        assert store.recovery[0].verified_bytes == 2 * REC


def newer_header(start: int, first_event: int) -> bytes:
    """An intact index header (its CRC holds) of a version after ours."""
    fields = bytearray(IndexHeader(start, first_event).pack())
    fields[8:10] = (INDEX_VERSION + 1).to_bytes(2, "little")
    fields[12:16] = crc32(bytes(fields[16:]), crc32(bytes(fields[:12]))).to_bytes(4, "little")
    return bytes(fields)


async def test_a_newer_format_is_refused_untouched(tmp_path: Path) -> None:
    await fill(tmp_path, 2)
    (index,) = chunk_files(tmp_path, ".index")
    with open(index, "r+b") as f:
        f.write(newer_header(0, 0))
    before = {p: p.read_bytes() for p in (tmp_path / "segments" / "s").iterdir()}
    with pytest.raises(UnknownFormat, match=f"version {INDEX_VERSION + 1}"):
        async with Store.open(tmp_path):
            pass
    assert {p: p.read_bytes() for p in (tmp_path / "segments" / "s").iterdir()} == before


async def test_a_failed_write_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    real = os.pwrite
    calls = 0

    def full_disk(fd: int, data: bytes, position: int) -> int:
        nonlocal calls
        calls += 1
        if calls == 2:  # the index entry, after the record's data was written
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, position)

    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        assert segment is not None
        segment.append(record(0), 3)
        monkeypatch.setattr(os, "pwrite", full_disk)
        with pytest.raises(StorageFull, match="the disk is full") as full:
            segment.append(record(3, 5), 5)
        assert (segment.end, segment.next_event) == (REC, 3)
        await full.value.room()  # the watcher finds the free space (statvfs)
        segment.append(record(3), 3)
        assert payloads(segment.read_events(0, 10, 1000)) == [payload(i) for i in range(6)]
        assert chunk_files(tmp_path, ".data")[0].stat().st_size == 2 * REC
    async with Store.open(tmp_path) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        assert payloads(segment.read_events(0, 10, 1000)) == [payload(i) for i in range(6)]
