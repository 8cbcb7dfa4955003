"""The segment listener answers segment info, locates offsets and reports read formats,
over real sockets to a running gateway."""

from __future__ import annotations

import time
from pathlib import Path

from segment_vectors import WRITER
from test_segment_server import append, connect, gateway, payloads, segment_of

from gateway.store import RecordFormat, frame_events
from protocols.segment import (
    READ_FORMATS,
    DataAppended,
    GetStreamSegmentInfo,
    LocateOffset,
    NoSuchSegment,
    OffsetLocated,
    ReadSegment,
    SegmentRead,
    StreamSegmentInfo,
    encode,
)


async def test_info_of_a_missing_segment_says_so_and_creates_nothing(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.send(encode(GetStreamSegmentInfo(4, "nothing/0")))
        assert await peer.command() == StreamSegmentInfo(
            4, "nothing/0", False, False, False, 0, 0, 0, 0, 0
        )
        assert gw.store is not None
        assert gw.store.segment("nothing/0", create=False) is None


async def test_info_is_the_durable_state(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.setup(WRITER, "s")
        before_ms = time.time_ns() // 1_000_000
        await peer.send(append(WRITER, payloads(3), 3))
        assert isinstance(await peer.command(), DataAppended)
        end = segment_of(gw, "s").end
        await peer.send(encode(GetStreamSegmentInfo(5, "s")))
        info = await peer.command()
        assert isinstance(info, StreamSegmentInfo)
        assert (info.request_id, info.segment, info.exists, info.is_sealed) == (5, "s", True, False)
        assert (info.start_offset, info.write_offset) == (0, end)
        assert (info.first_event, info.next_event) == (0, 3)
        assert before_ms - 1000 <= info.last_modified <= time.time_ns() // 1_000_000 + 1000


async def test_info_requests_pipeline_in_order(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.setup(WRITER, "d/0")
        await peer.send(b"".join(encode(GetStreamSegmentInfo(i, f"d/{i}")) for i in range(3)))
        replies = [await peer.command() for _ in range(3)]
        assert [(r.request_id, r.exists) for r in replies] == [  # type: ignore[attr-defined]
            (0, True),
            (1, False),
            (2, False),
        ]


async def test_locate_answers_boundaries_and_indexes(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.setup(WRITER, "s")
        await peer.send(append(WRITER, payloads(3), 3))  # one record of three 18-byte events
        assert isinstance(await peer.command(), DataAppended)
        await peer.send(
            encode(LocateOffset(7, "s", 20))
            + encode(LocateOffset(8, "s", 20, "", 1))
            + encode(LocateOffset(9, "s", 10**9, "", 5))
            + encode(LocateOffset(10, "gone", 3))
        )
        assert await peer.command() == OffsetLocated(7, "s", 18, 1)
        assert await peer.command() == OffsetLocated(8, "s", 36, 2)
        assert await peer.command() == OffsetLocated(9, "s", 54, 3)
        assert await peer.command() == NoSuchSegment(10, "gone", "", 3)


async def test_a_read_reports_formats_only_when_asked(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.setup(WRITER, "s")
        await peer.send(append(WRITER, [b"raw"], 1))
        assert isinstance(await peer.command(), DataAppended)
        segment = segment_of(gw, "s")
        end = segment.append(frame_events([b"env"]), 1, format=RecordFormat.ENVELOPE).end
        await segment.durable(end)
        await peer.send(encode(ReadSegment("s", 0, 1000, "", 2, READ_FORMATS)))
        read = await peer.command()
        assert isinstance(read, SegmentRead)
        assert read.data == frame_events([b"raw", b"env"])
        assert read.format_runs == [(0, 0), (11, 1)]
        await peer.send(encode(ReadSegment("s", 13, 1000, "", 3, READ_FORMATS)))
        read = await peer.command()
        assert isinstance(read, SegmentRead)
        assert (read.offset, read.format_runs) == (13, [(13, 1)])
        await peer.send(encode(ReadSegment("s", 0, 1000, "", 4)))
        read = await peer.command()
        assert isinstance(read, SegmentRead)
        assert read.formats is None
