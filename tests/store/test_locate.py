"""Locating event boundaries and the formats of byte ranges, from a segment's record
index, bounded by what is durable."""

from __future__ import annotations

from pathlib import Path

import trio
import trio.testing

from gateway.store import RecordFormat, Segment, Store, frame_events

RAW, ENV = RecordFormat.RAW, RecordFormat.ENVELOPE


def events(*payloads: bytes) -> bytes:
    return frame_events(payloads)


async def _filled(store: Store) -> tuple[Segment, list[int]]:
    """Records: [a] [bb cc ddd] (envelopes) [e] [f]; returns the segment and the
    offset of every event and of the end."""
    segment = store.segment("s")
    segment.append(events(b"a"), 1)
    segment.append(events(b"bb", b"cc", b"ddd"), 3, format=ENV)
    segment.append(events(b"e"), 1)
    end = segment.append(events(b"f"), 1).end
    await segment.durable(end)
    return segment, [segment.event_offset(i) for i in range(7)]


async def test_locate_finds_the_boundary_at_or_before_the_target(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment, at = await _filled(store)
        assert at == [0, 9, 19, 29, 40, 49, 58]
        assert segment.locate(0) == (0, 0)
        assert segment.locate(8) == (0, 0)
        assert segment.locate(9) == (9, 1)
        assert segment.locate(25) == (19, 2)  # inside a record
        assert segment.locate(39) == (29, 3)
        assert segment.locate(57) == (49, 5)
        assert segment.locate(58) == (58, 6)
        # Clamped into [start, durable end].
        assert segment.locate(-5) == (0, 0)
        assert segment.locate(10**12) == (58, 6)


async def test_locate_counts_events_after_the_boundary(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment, at = await _filled(store)
        locate = segment.locate
        assert locate(0, 0) == (0, 0)
        assert locate(0, 2) == (at[2], 2)  # lands inside the multi-event record
        assert locate(25, 1) == (at[3], 3)
        assert locate(25, 2) == (at[4], 4)
        assert locate(0, 100) == (58, 6)  # clamped to the end
        assert locate(58, 1) == (58, 6)
        assert locate(0, -1) == locate(0) == (0, 0)


async def test_locate_and_the_event_indexes_stop_at_the_durable_end(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with Store.open(tmp_path, fsync="interval", fsync_interval=0.5) as store:
        segment = store.segment("s")
        durable = segment.append(events(b"one", b"two"), 2).end
        await segment.durable(durable)
        segment.append(events(b"three"), 1)
        assert segment.end > segment.durable_end == durable
        assert segment.durable_next_event == 2
        assert segment.locate(10**6) == (durable, 2)
        assert segment.locate(0, 10) == (durable, 2)
        assert segment.formats(0, segment.durable_end) == [(0, RAW)]
        await segment.durable(segment.end)
        assert segment.durable_next_event == 3
        assert segment.locate(10**6) == (segment.end, 3)


async def test_locate_never_answers_below_the_retained_start(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment, at = await _filled(store)
        segment.truncate_before(3)  # inside [bb cc ddd]
        assert segment.start == at[3]
        assert segment.locate(0) == (at[3], 3)
        assert segment.locate(at[3] + 2) == (at[3], 3)
        assert segment.locate(0, 1) == (at[4], 4)


async def test_an_empty_segment_locates_zero(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("empty")
        assert segment.locate(100) == (0, 0)
        assert segment.locate(0, 5) == (0, 0)
        assert segment.durable_next_event == 0
        assert segment.last_modified_us == 0
        assert segment.formats(0, 0) == []


async def test_formats_are_runs_of_the_records_formats(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment, _ = await _filled(store)
        formats = segment.formats
        assert formats(0, 58) == [(0, RAW), (9, ENV), (40, RAW)]
        assert formats(25, 58) == [(25, ENV), (40, RAW)]  # from inside a record
        assert formats(0, 9) == [(0, RAW)]
        assert formats(9, 40) == [(9, ENV)]
        assert formats(41, 10**6) == [(41, RAW)]  # clamped to the end
        assert formats(58, 58) == []


async def test_formats_follow_chunks(tmp_path: Path) -> None:
    async with Store.open(tmp_path, chunk_bytes=20) as store:
        segment = store.segment("s")
        for i in range(6):
            segment.append(events(b"x" * 5), 1, format=ENV if i in (2, 3) else RAW)
        assert len(segment.chunks) > 2
        assert segment.locate(30) == (0, 0)  # nothing durable yet
        await segment.durable(segment.end)
        assert segment.formats(0, segment.end) == [(0, RAW), (26, ENV), (52, RAW)]
        assert segment.locate(30) == (26, 2)


async def test_last_modified_is_the_newest_durable_appends_time(tmp_path: Path) -> None:
    async with Store.open(tmp_path) as store:
        segment = store.segment("s")
        before = store.now_us()
        end = segment.append(events(b"x"), 1).end
        await segment.durable(end)
        assert before <= segment.last_modified_us <= store.now_us()


async def test_inside_a_damaged_record_its_start_is_the_boundary(tmp_path: Path) -> None:
    from test_store_damaged_reads import damaged_store
    from test_store_recovery import REC

    async with Store.open(await damaged_store(tmp_path, "by a read")) as store:
        segment = store.segment("s")
        # Four records of three events; the second's data is damaged.
        assert segment.locate(REC + 30) == (REC, 3)
        assert segment.locate(2 * REC - 1) == (REC, 3)
        # Its events have no known boundaries: counting into it answers its end.
        assert segment.locate(0, 4) == (2 * REC, 6)
        assert segment.locate(REC, 1) == (2 * REC, 6)
        assert segment.locate(0, 3) == (REC, 3)
        assert segment.locate(2 * REC + 1) == (2 * REC, 6)
        assert segment.formats(0, 4 * REC)[0] == (0, RAW)
