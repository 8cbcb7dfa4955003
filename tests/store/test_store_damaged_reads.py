"""Damaged records are never read back (issue 21, defect 3): not by raw byte reads, not by
``read_events``, whether recovery flagged the record after a crash or a read is the
first to check it (a clean start does not read the data)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Literal

import pytest
from test_store_recovery import REC, WRITER, chunk_files, fill, flip, payload, record

from gateway.store import RecordFormat, Store
from gateway.store.segment import Segment, SegmentDamaged

CORRUPT = (RecordFormat.CORRUPT, b"")
#: How the damage (a flipped byte in the data of the second of four records) is found.
Found = Literal["by recovery", "by a read"]
HOW: list[Found] = ["by recovery", "by a read"]


async def damaged_store(tmp_path: Path, how: Found) -> Path:
    """A store of four records of three events whose second record's data has a
    flipped byte: a crash image (recovery verifies it and flags the record) or a store
    closed cleanly (recovery reads no data: the first read finds it)."""
    if how == "by recovery":
        image = await fill(tmp_path / "store", 4)
    else:
        image = tmp_path / "store"
        await fill(image, 4)  # closed cleanly (the crash image it also makes is not used)
    flip(chunk_files(image, ".data")[0], REC + 30)
    return image


def the_segment(store: Store) -> Segment:
    segment = store.segment("s", create=False)
    assert segment is not None
    return segment


@pytest.mark.parametrize("how", HOW)
async def test_raw_reads_never_return_a_damaged_record(
    tmp_path: Path, how: Found, caplog: pytest.LogCaptureFixture
) -> None:
    image = await damaged_store(tmp_path, how)
    with caplog.at_level(logging.ERROR, "gateway.store"):
        async with Store.open(image) as store:
            segment = the_segment(store)
            assert store.recovery[0].corrupt_records == (1 if how == "by recovery" else 0)
            # A read reaching the damaged record stops before it, on an event boundary.
            assert segment.read(0, 10_000) == record(0)
            assert segment.read(10, 10_000) == record(0)[10:]
            # A read starting at it, or inside it, is refused: where to go on is said.
            for offset in (REC, REC + 1, REC + 30, 2 * REC - 1):
                with pytest.raises(SegmentDamaged) as caught:
                    segment.read(offset, 10_000)
                assert (caught.value.offset, caught.value.end) == (REC, 2 * REC)
            assert segment.read(2 * REC, 10_000) == record(6) + record(9)
            # The damage is counted once, however often it is read.
            assert segment.stats()["corrupt_records"] == 1
            # Forgotten columns (the file cache closed the chunk) forget nothing.
            for chunk in segment.chunks:
                chunk.unload()
            store.record_cache.clear()
            assert segment.read(0, 10_000) == record(0)
            with pytest.raises(SegmentDamaged):
                segment.read(REC + 2, 3)
    if how == "by a read":
        assert len([r for r in caplog.records if f"byte {REC}" in r.getMessage()]) == 1


@pytest.mark.parametrize("how", HOW)
async def test_read_events_never_return_a_damaged_record(tmp_path: Path, how: Found) -> None:
    image = await damaged_store(tmp_path, how)
    async with Store.open(image) as store:
        segment = the_segment(store)
        assert segment.read_events(0, 100, 10_000) == [
            *[(RecordFormat.RAW, payload(i)) for i in range(3)],
            *[CORRUPT] * 3,
            *[(RecordFormat.RAW, payload(i)) for i in range(6, 12)],
        ]
        assert segment.read_events(4, 1, 10) == [CORRUPT]
        assert segment.stats()["corrupt_records"] == 1
        # A raw read after the events were read (the record is known damaged by now).
        with pytest.raises(SegmentDamaged):
            segment.read(REC, 1)
        assert segment.last_event_number(WRITER) == 12


async def test_raw_reads_check_each_record_once_and_then_read_runs_at_once(
    tmp_path: Path,
) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        for r in range(4):
            segment.append(record(3 * r), 3)
        assert segment.read(0, 10_000) == b"".join(record(3 * r) for r in range(4))
        # Damage after a record was checked is found by verify, not by every read; reads
        # of unchecked records still find theirs.
        segment.append(record(12), 3)
        flip(chunk_files(tmp_path, ".data")[0], 4 * REC + 9)
        assert segment.read(0, 4 * REC) == b"".join(record(3 * r) for r in range(4))
        assert segment.read(0, 10_000) == b"".join(record(3 * r) for r in range(4))
        with pytest.raises(SegmentDamaged):
            segment.read(4 * REC, 10)
        assert segment.read_events(12, 3, 1000) == [CORRUPT] * 3


async def test_a_read_of_several_chunks_stops_at_damage_in_a_later_one(tmp_path: Path) -> None:
    image = tmp_path / "store"
    await fill(image, 4, chunk_bytes=120)  # two records a chunk
    _, second = chunk_files(image, ".data")
    flip(second, 10)  # the third record
    async with Store.open(image) as store:
        segment = the_segment(store)
        assert segment.read(0, 10_000) == record(0) + record(3)
        with pytest.raises(SegmentDamaged) as caught:
            segment.read(2 * REC, 10_000)
        assert (caught.value.offset, caught.value.end) == (2 * REC, 3 * REC)
        assert segment.read(3 * REC, 10_000) == record(9)
