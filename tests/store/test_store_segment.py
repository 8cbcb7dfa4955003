"""Appending to and reading from a segment: bytes, events, chunks, tails, observers."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import trio
import trio.testing

from gateway.store import (
    Appended,
    FsyncPolicy,
    RecordFormat,
    SegmentTruncated,
    Store,
    StoreLocked,
    frame_events,
)


def events(*payloads: bytes) -> bytes:
    return frame_events(payloads)


async def test_append_then_read_bytes_and_events(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("scope/stream/0.#epoch.0")
        assert segment is not None
        first = segment.append(events(b"one", b"two"), 2)
        second = segment.append(events(b"three"), 1, format=RecordFormat.ENVELOPE)
        assert first == Appended(offset=0, end=22, first_event=0, count=2)
        assert second == Appended(offset=22, end=35, first_event=2, count=1)
        assert (segment.end, segment.next_event, segment.first_event) == (35, 3, 0)
        # Reads return exactly what was appended, from any offset.
        assert segment.read(0, 1000) == events(b"one", b"two", b"three")
        assert segment.read(5, 10) == events(b"one", b"two", b"three")[5:15]
        assert segment.read(35, 10) == b""
        assert segment.read_events(0, 10, 1000) == [
            (RecordFormat.RAW, b"one"),
            (RecordFormat.RAW, b"two"),
            (RecordFormat.ENVELOPE, b"three"),
        ]
        assert segment.read_events(1, 1, 1000) == [(RecordFormat.RAW, b"two")]
        assert segment.read_events(3, 10, 1000) == []
        assert [segment.event_offset(i) for i in range(4)] == [0, 11, 22, 35]
        assert store.names() == ["scope/stream/0.#epoch.0"]


async def test_read_events_stops_before_max_bytes_but_returns_one(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        assert segment is not None
        segment.append(events(b"a" * 10, b"b" * 10, b"c" * 10), 3)
        assert len(segment.read_events(0, 10, 20)) == 2
        assert len(segment.read_events(0, 10, 19)) == 1
        assert segment.read_events(0, 10, 0) == [(RecordFormat.RAW, b"a" * 10)]
        assert len(segment.read_events(0, 2, 1000)) == 2


async def test_read_bounds(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        assert segment is not None
        segment.append(events(b"x"), 1)
        with pytest.raises(ValueError):
            segment.read(10, 1)
        with pytest.raises(ValueError):
            segment.read_events(2, 1, 10)
        with pytest.raises(ValueError):
            segment.event_offset(2)


@pytest.mark.parametrize(
    ("data", "count"),
    [(events(b"a", b"b"), 1), (events(b"a"), 2), (events(b"a") + b"\0", 1), (b"", 0)],
)
async def test_bad_appends_write_nothing(tmp_path: Path, data: bytes, count: int) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        assert segment is not None
        with pytest.raises(ValueError):
            segment.append(data, count)
        with pytest.raises(ValueError):
            segment.append(events(b"a"), 1, writer=uuid.uuid4())
        assert (segment.end, segment.next_event) == (0, 0)
        assert segment.read(0, 100) == b""


async def test_verified_append_skips_the_walk_and_bad_framing_reads_as_corrupt(
    tmp_path: Path,
) -> None:
    # The caller vouches for the framing: a wrong count is stored, not refused, and
    # reads never make other events of it; the records around it are unharmed.
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        assert segment is not None
        segment.append(events(b"a"), 1, verified=True)
        segment.append(events(b"b", b"c"), 3, verified=True)  # frames 2, says 3
        segment.append(events(b"d") + b"\0", 1, verified=True)  # a byte left over
        segment.append(events(b"e"), 1, verified=True)
        assert segment.next_event == 6
        assert segment.read_events(0, 10, 1000) == [
            (RecordFormat.RAW, b"a"),
            *[(RecordFormat.CORRUPT, b"")] * 4,
            (RecordFormat.RAW, b"e"),
        ]
        assert segment.stats()["corrupt_records"] == 2


async def test_chunks_roll_and_reads_cross_them(tmp_path: Path) -> None:
    payloads = [b"%03d" % i for i in range(30)]
    async with Store.open(tmp_path, chunk_bytes=50) as store:
        segment = store.segment("s")
        assert segment is not None
        for i in range(0, 30, 3):
            segment.append(events(*payloads[i : i + 3]), 3)  # 33 bytes: one record a chunk
        # A record larger than a chunk gets a chunk of its own.
        segment.append(events(b"x" * 100), 1)
        assert segment.stats()["chunks"] == 11
        assert len(list((tmp_path / "segments" / "s").glob("*.data"))) == 11
        whole = events(*payloads, b"x" * 100)
        assert segment.read(0, 10_000) == whole
        assert segment.read(40, 60) == whole[40:100]
        assert [p for _, p in segment.read_events(0, 100, 10_000)] == [*payloads, b"x" * 100]
        assert [p for _, p in segment.read_events(4, 4, 10_000)] == payloads[4:8]


async def test_segment_lookup_without_create(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        assert store.segment("missing", create=False) is None
        assert store.names() == []
        created = store.segment("a/b")
        assert store.segment("a/b", create=False) is created


async def test_wait_for_wakes_on_append(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store, trio.open_nursery() as nursery:
        segment = store.segment("s")
        assert segment is not None
        woke: list[int] = []

        async def tail() -> None:
            await segment.wait_for(0)
            woke.append(segment.end)

        nursery.start_soon(tail)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == []
        segment.append(events(b"x"), 1)
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [9]
        await segment.wait_for(5)  # already past: returns at once


async def test_wait_for_raises_when_the_store_closes(tmp_path: Path) -> None:
    failures: list[BaseException] = []
    async with trio.open_nursery() as nursery, Store.open(tmp_path) as store:
        segment = store.segment("s")
        assert segment is not None

        async def tail() -> None:
            try:
                await segment.wait_for(0)
            except trio.ClosedResourceError as e:
                failures.append(e)

        nursery.start_soon(tail)
        await trio.testing.wait_all_tasks_blocked()
    assert len(failures) == 1
    with pytest.raises(trio.ClosedResourceError):
        segment.append(events(b"late"), 1)


async def test_observers_see_every_append_until_unsubscribed(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        assert segment is not None
        seen: list[tuple[Appended, RecordFormat]] = []
        unsubscribe = segment.observe(lambda a, f: seen.append((a, f)))
        appended = segment.append(events(b"x"), 1, format=RecordFormat.ENVELOPE)
        assert seen == [(appended, RecordFormat.ENVELOPE)]  # before append returned
        unsubscribe()
        segment.append(events(b"y"), 1)
        assert len(seen) == 1
        unsubscribe()  # idempotent


async def test_ledger_tracks_each_writer(tmp_path: Path) -> None:
    a, b = uuid.uuid4(), uuid.uuid4()
    async with Store.open(tmp_path, fsync="never") as store:
        segment = store.segment("s")
        assert segment is not None
        segment.append(events(b"1", b"2"), 2, writer=a, last_event_number=2)
        segment.append(events(b"x"), 1, writer=b, last_event_number=10)
        segment.append(events(b"3"), 1, writer=a, last_event_number=3)
        segment.append(events(b"anonymous"), 1)
        assert segment.last_event_number(a) == 3
        assert segment.last_event_number(b, durable=False) == 10
        assert segment.last_event_number(uuid.uuid4()) is None


async def test_truncate_before_moves_the_start(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        assert segment is not None
        segment.append(events(b"a", b"b"), 2)
        segment.append(events(b"c"), 1)
        segment.truncate_before(1)
        assert (segment.first_event, segment.start) == (1, 9)
        with pytest.raises(SegmentTruncated) as info:
            segment.read_events(0, 1, 100)
        assert (info.value.first_event, info.value.start) == (1, 9)
        with pytest.raises(SegmentTruncated):
            segment.read(8, 1)
        assert segment.read_events(1, 5, 100) == [
            (RecordFormat.RAW, b"b"),
            (RecordFormat.RAW, b"c"),
        ]
        segment.truncate_before(0)  # never backwards
        segment.truncate_before(1)
        assert segment.first_event == 1
        segment.truncate_before(99)  # at most to the end
        assert (segment.first_event, segment.start) == (3, segment.end)
        assert segment.read_events(3, 1, 10) == []


async def test_a_store_is_open_in_one_place_at_a_time(tmp_path: Path) -> None:
    async with Store.open(tmp_path):
        with pytest.raises(StoreLocked):
            async with Store.open(tmp_path):
                pass
    async with Store.open(tmp_path):  # released on close
        pass


@pytest.mark.parametrize("fsync", ["interval", "never"])
async def test_chunks_closed_to_bound_open_files_reopen_on_demand(
    tmp_path: Path, fsync: FsyncPolicy
) -> None:
    payloads = [b"%04d" % i for i in range(40)]
    async with Store.open(tmp_path, fsync=fsync, chunk_bytes=30) as store:
        store.files.limit = 2
        segments = [store.segment(f"s{n}") for n in range(3)]
        for i, payload in enumerate(payloads):  # one event a chunk, the segments in turn
            segment = segments[i % 3]
            assert segment is not None
            segment.append(events(payload), 1)
        for n, segment in enumerate(segments):
            assert segment is not None
            assert [p for _, p in segment.read_events(0, 100, 10_000)] == payloads[n::3]
            assert segment.read(0, 10_000) == events(*payloads[n::3])
            assert segment.event_offset(5) == 5 * 12
    async with Store.open(tmp_path, chunk_bytes=30) as store:
        assert store.recovery[0].problems == []
        segment = store.segment("s1", create=False)
        assert segment is not None
        assert [p for _, p in segment.read_events(0, 100, 10_000)] == payloads[1::3]
