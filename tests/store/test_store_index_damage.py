"""Damage to an index loses no record whose data can be proven intact (issue 21, defect 5).

A damaged index header (it only repeats the file name and the previous chunk) is rebuilt;
an entry with one damaged byte is repaired from its own CRC; a stretch whose entries are
damaged beyond that is rebuilt from the data where a data CRC the damaged entry still
holds proves the bytes. What nothing proves stays a corrupt record, with the event
numbering dense. And the records come back to subscribers of a durable destination."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from test_store_recovery import REC, WRITER, chunk_files, fill, flip, payload, record

from gateway.store import RecordFormat, Store
from gateway.store.layout import INDEX_ENTRY, INDEX_HEADER, IndexHeader

CORRUPT = (RecordFormat.CORRUPT, b"")
EVENTS = [(RecordFormat.RAW, payload(i)) for i in range(12)]

#: Each field of the 32-byte header: magic, version, entry size, header CRC, start,
#: first event.
HEADER_BYTES = {
    "magic": 3,
    "version": 8,
    "entry size": 10,
    "header crc": 13,
    "start": 16,
    "first event": 27,
}
#: A byte of each field of a 72-byte entry.
ENTRY_BYTES = {
    "offset": 0,
    "first event": 8,
    "length": 16,
    "count": 20,
    "format": 24,
    "flags": 25,
    "reserved": 28,
    "writer": 40,
    "last event number": 48,
    "timestamp": 60,
    "data crc": 65,
    "entry crc": 70,
}


def entry_at(record_index: int, byte: int) -> int:
    """The position in a chunk's index of ``byte`` of the entry of its record ``record_index``."""
    return INDEX_HEADER.size + record_index * INDEX_ENTRY.size + byte


async def opened(image: Path) -> tuple[list[tuple[RecordFormat, bytes]], Any, int | None]:
    """Every event of segment ``s``, its recovery report and WRITER's last number."""
    async with Store.open(image) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        return (
            segment.read_events(0, 100, 10_000),
            store.recovery[0],
            segment.last_event_number(WRITER),
        )


async def reopens_clean(image: Path) -> bool:
    """The repair was written: a second open finds nothing wrong."""
    async with Store.open(image) as store:
        return store.recovery[0].problems == []


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash"])
@pytest.mark.parametrize("chunk", [0, 1, 2], ids=["first chunk", "middle chunk", "last chunk"])
@pytest.mark.parametrize("field", list(HEADER_BYTES))
async def test_a_damaged_index_header_loses_nothing(
    tmp_path: Path, field: str, chunk: int, crash: bool
) -> None:
    image = await fill(tmp_path / "store", 6, chunk_bytes=120)  # two records a chunk
    if not crash:
        image = tmp_path / "store"
    flip(chunk_files(image, ".index")[chunk], HEADER_BYTES[field])
    events, report, last = await opened(image)
    assert events == [(RecordFormat.RAW, payload(i)) for i in range(18)]
    assert (report.records, report.corrupt_records, report.truncated_bytes) == (6, 0, 0)
    assert report.repaired == 1
    assert any(f"index header of the chunk at byte {2 * chunk * REC}" in p for p in report.problems)
    assert last == 18
    assert await reopens_clean(image)
    header = IndexHeader.unpack(chunk_files(image, ".index")[chunk].read_bytes())
    assert header == IndexHeader(2 * chunk * REC, 6 * chunk)


async def test_a_header_written_before_headers_had_a_crc_is_read(tmp_path: Path) -> None:
    await fill(tmp_path, 4)
    (index,) = chunk_files(tmp_path, ".index")
    with open(index, "r+b") as f:
        f.seek(12)
        f.write(bytes(4))  # what the reserved field held
    events, report, _ = await opened(tmp_path)
    assert (events, report.problems) == (EVENTS, [])
    # Such a header whose version byte is damaged is damage, not a newer format.
    with open(index, "r+b") as f:
        f.seek(12)
        f.write(bytes(4))
    flip(index, 8)
    events, report, _ = await opened(tmp_path)
    assert (events, report.repaired) == (EVENTS, 1)


@pytest.mark.parametrize("crash", [False, True], ids=["clean", "crash"])
@pytest.mark.parametrize("field", list(ENTRY_BYTES))
async def test_an_index_entry_with_one_damaged_byte_is_repaired(
    tmp_path: Path, field: str, crash: bool
) -> None:
    image = await fill(tmp_path / "store", 4)
    if not crash:
        image = tmp_path / "store"
    flip(chunk_files(image, ".index")[0], entry_at(1, ENTRY_BYTES[field]))
    events, report, last = await opened(image)
    assert events == EVENTS
    assert (report.records, report.corrupt_records, report.repaired) == (4, 0, 1)
    assert "damaged in one byte: repaired from its checksum" in report.problems[0]
    assert last == 12
    assert await reopens_clean(image)


@pytest.mark.parametrize("field", ["writer", "last event number", "entry crc"])
async def test_the_last_entry_of_a_crash_image_with_one_damaged_byte_is_not_a_torn_tail(
    tmp_path: Path, field: str
) -> None:
    image = await fill(tmp_path / "store", 4)
    flip(chunk_files(image, ".index")[0], entry_at(3, ENTRY_BYTES[field]))
    events, report, last = await opened(image)
    assert events == EVENTS
    assert (report.truncated_bytes, report.repaired) == (0, 1)
    assert last == 12  # its writer's number comes back with it: no resend, no duplicate


async def test_a_repaired_entry_whose_data_is_damaged_is_a_corrupt_record(tmp_path: Path) -> None:
    await fill(tmp_path, 4)
    flip(chunk_files(tmp_path, ".index")[0], entry_at(1, ENTRY_BYTES["writer"]))
    flip(chunk_files(tmp_path, ".data")[0], REC + 20)
    events, report, _ = await opened(tmp_path)
    assert events == [*EVENTS[:3], *[CORRUPT] * 3, *EVENTS[6:]]
    assert (report.corrupt_records, report.repaired) == (1, 1)


def damage(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


async def test_entries_damaged_beyond_one_byte_are_rebuilt_from_the_data(tmp_path: Path) -> None:
    # Records 1 and 2 lose their writer and timestamp bytes: no single byte explains it,
    # but the data CRC each still holds matches its record's bytes, whole events.
    await fill(tmp_path, 4)
    (index,) = chunk_files(tmp_path, ".index")
    for r in (1, 2):
        damage(index, entry_at(r, 32), b"garbage!garbage!")
        damage(index, entry_at(r, 56), b"\xff" * 4)
    events, report, last = await opened(tmp_path)
    assert events == EVENTS
    assert (report.records, report.corrupt_records, report.repaired) == (4, 0, 2)
    assert all("rebuilt from the data" in p for p in report.problems)
    assert last == 12  # the last record's entry, intact, says it
    assert await reopens_clean(tmp_path)


async def test_what_nothing_proves_stays_corrupt_and_numbering_stays_dense(
    tmp_path: Path,
) -> None:
    # Record 1's entry loses its data CRC too; record 2's its offset: their bytes cannot
    # be proven. They are kept as one corrupt stretch holding their six events.
    await fill(tmp_path, 4)
    (index,) = chunk_files(tmp_path, ".index")
    damage(index, entry_at(1, 60), b"\x00\x01\x02\x03\x04\x05")
    damage(index, entry_at(2, 0), b"\xee\xee")
    events, report, last = await opened(tmp_path)
    assert events == [*EVENTS[:3], *[CORRUPT] * 6, *EVENTS[9:]]
    assert (report.records, report.corrupt_records) == (3, 1)
    assert last == 12
    async with Store.open(tmp_path) as store:
        segment = store.segment("s", create=False)
        assert segment is not None
        assert segment.read(3 * REC, REC) == record(9)
        assert segment.event_offset(9) == 3 * REC


# -- delivered: a durable destination across a restart --------------------------------------

BODIES = [b"message %04d " % i + b"x" * 1000 for i in range(200)]


def durable(tmp_path: Path) -> dict[str, Any]:
    return {
        "gateway": {"data_dir": str(tmp_path)},
        "store": {"chunk_bytes": "64KiB"},
        "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
        "destinations": [{"name": "logs", "store": "embedded"}],
    }


@pytest.mark.parametrize("where", ["header", "entry"])
async def test_every_intact_message_is_still_delivered_after_index_damage(
    tmp_path: Path, where: str
) -> None:
    async with (
        running_gateway(durable(tmp_path)) as gw,
        NdjsonClient(await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))) as client,
    ):
        for body in BODIES:  # one record each
            (answer,) = await client.wait_answers(await client.publish_nowait([body], "logs"))
            assert answer.status == "delivered"
    indexes = sorted((tmp_path / "store" / "segments" / "logs%2F0").glob("*.index"))
    assert len(indexes) >= 3
    middle = indexes[len(indexes) // 2]
    records = (middle.stat().st_size - INDEX_HEADER.size) // INDEX_ENTRY.size
    flip(middle, 20 if where == "header" else entry_at(records // 2, ENTRY_BYTES["length"]))
    async with running_gateway(durable(tmp_path)) as gw:
        assert gw.store is not None
        assert gw.store.recovery[0].repaired == 1
        sub = gw.hub.subscribe("logs", start="earliest")
        got: list[bytes] = []
        with trio.fail_after(10):
            while len(got) < len(BODIES):
                got += [d.message.body for d in await sub.receive()]
        sub.close()
    assert got == BODIES
    assert (middle.stat().st_size - INDEX_HEADER.size) // INDEX_ENTRY.size == records
    assert os.path.exists(middle)
