"""The segment listener and what the store holds: damaged records are never served
(issue 21, defect 3), and segments clients make are bounded in number and retained like
any other.

A ``ReadSegment`` reaching a damaged record gets the bytes before it; one starting in it
gets ``SegmentIsTruncated`` whose start offset is the end of the damaged record, where
the reader goes on (``SegmentReader`` raises ``SegmentTruncatedError`` with it)."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import pytest
import trio
import trio.testing
from harness import running_gateway
from test_segment_server import (
    FOREVER,
    WRITER,
    Peer,
    append,
    config,
    connect,
    hello,
    read_segment,
    setup_append,
)

from gateway.store import Store, frame_events
from protocols.segment.client import SegmentReader, SegmentTruncatedError
from protocols.segment.events import (
    DataAppended,
    Hello,
    NoSuchSegment,
    SegmentIsTruncated,
    SegmentRead,
)
from protocols.segment.server import ServerSession, ServerSettings


def payload(i: int) -> bytes:
    return b"event-%04d" % i


def record(first: int) -> bytes:
    """Three framed 10-byte events: 54 bytes."""
    return frame_events([payload(i) for i in range(first, first + 3)])


REC = len(record(0))
Found = Literal["by recovery", "by a read"]


async def damaged_store(data_dir: Path, how: Found) -> None:
    """Segment ``s`` of four records in ``data_dir/store``, the second one's data
    damaged: after a crash (recovery verifies it and flags the record) or after a clean
    close (nothing reads it before the first read does)."""
    written = data_dir / ("original" if how == "by recovery" else "store")
    async with Store.open(written) as store:
        segment = store.segment("s")
        for r in range(4):
            segment.append(record(3 * r), 3)
        if how == "by recovery":
            shutil.copytree(written, data_dir / "store")  # a crash image: no clean marker
    (data,) = (data_dir / "store" / "segments" / "s").glob("*.data")
    with open(data, "r+b") as f:
        f.seek(REC + 30)
        f.write(b"\xff")


@pytest.mark.parametrize("how", ["by recovery", "by a read"])
async def test_read_segment_never_serves_a_damaged_record(tmp_path: Path, how: Found) -> None:
    await damaged_store(tmp_path, how)
    async with running_gateway(config(tmp_path)) as gw, connect(gw) as peer:
        await peer.send(read_segment("s", 0, rid=3))
        # The bytes before it; not at the tail: there is more after it.
        assert await peer.command() == SegmentRead("s", 0, False, False, record(0), 3)
        for rid, offset in ((4, REC), (5, REC + 7)):
            await peer.send(read_segment("s", offset, rid=rid))
            reply = await peer.command()
            assert isinstance(reply, SegmentIsTruncated), reply
            assert (reply.request_id, reply.segment, reply.start_offset, reply.offset) == (
                rid,
                "s",
                2 * REC,
                offset,
            )
            assert f"bytes {REC}..{2 * REC - 1} are a damaged record" in reply.server_stack_trace
        await peer.send(read_segment("s", 2 * REC, rid=6))
        rest = record(6) + record(9)
        assert await peer.command() == SegmentRead("s", 2 * REC, True, False, rest, 6)
        assert gw.metrics.value("segment_damaged_reads_total", {"listener": "seg"}) == 2
        assert gw.store is not None
        assert gw.store.stats()["corrupt_records"] == 1


async def test_a_segment_reader_goes_on_after_a_damaged_record(tmp_path: Path) -> None:
    await damaged_store(tmp_path, "by a read")
    async with running_gateway(config(tmp_path)) as gw:
        got: list[bytes] = []
        async with SegmentReader.connect(gw.addresses["seg"][0]) as reader:
            events = reader.read("s", 0, follow=False)
            got += [event for _, event in [await events.__anext__() for _ in range(3)]]
            with pytest.raises(SegmentTruncatedError) as caught:
                await events.__anext__()
            assert caught.value.start_offset == 2 * REC
            assert "damaged record" in str(caught.value)
            async for _, event in reader.read("s", caught.value.start_offset, follow=False):
                got.append(event)
    assert got == [payload(i) for i in (*range(3), *range(6, 12))]


# -- how many segments clients make, and what they keep ----------------------------------------


async def test_auto_create_stops_at_max_segments(tmp_path: Path) -> None:
    data = config(tmp_path, max_segments=3) | {
        "destinations": [{"name": "logs", "store": "embedded"}]  # its logs/0 counts
    }
    async with running_gateway(data) as gw, connect(gw) as peer:
        await peer.setup(WRITER, "a", rid=1)
        await peer.setup(WRITER, "b", rid=2)
        await peer.send(setup_append(3, WRITER, "c"))
        reply = await peer.command()
        assert isinstance(reply, NoSuchSegment), reply
        assert (reply.request_id, reply.segment) == (3, "c")
        assert "max_segments is 3" in reply.server_stack_trace
        # The connection goes on; existing segments still set up and take appends.
        assert (await peer.setup(WRITER, "a", rid=4)).segment == "a"
        await peer.send(append(WRITER, [b"x"], 1))
        assert isinstance(await peer.command(), DataAppended)
        assert gw.store is not None
        assert gw.store.names() == ["a", "b", "logs/0"]
        labels = {"listener": "seg"}
        assert gw.metrics.value("segment_creations_refused_total", labels) == 1


@asynccontextmanager
async def session(store: Store, settings: ServerSettings) -> AsyncIterator[Peer]:
    client, server = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ServerSession(server, store, settings).serve)
        peer = Peer(client)
        await peer.send(hello())
        assert await peer.command() == Hello(17, 5)
        yield peer
        nursery.cancel_scope.cancel()


async def test_segments_the_listener_makes_are_retained_like_any_other(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ServerSettings(retain_bytes=2048, retain_age=3600.0)
    async with Store.open(tmp_path, chunk_bytes=1024) as store:
        old = store.segment("from-before")  # a plain segment an earlier run made
        owned = store.segment("logs/0")  # a durable destination's: it retains its own
        owned.observe(lambda appended, fmt: None)
        async with session(store, settings) as peer:
            for rid, name in enumerate(("new", "from-before", "logs/0"), 1):
                await peer.send(setup_append(rid, WRITER, name))
                assert (await peer.command(FOREVER)).segment == name  # type: ignore[attr-defined]
            new = store.segment("new", create=False)
            assert new is not None
            assert (new.retain_bytes, new.retain_age) == (2048, 3600.0)
            assert (old.retain_bytes, old.retain_age) == (2048, 3600.0)
            assert (owned.retain_bytes, owned.retain_age) == (None, None)
            # 40 blocks of 100 bytes: about four chunks; retention keeps the newest 2 KiB.
            await peer.send(setup_append(9, WRITER, "new"))
            await peer.command(FOREVER)
            for n in range(1, 41):
                await peer.send(append(WRITER, [b"x" * 92], n))
                assert isinstance(await peer.command(FOREVER), DataAppended)
            store.sweep()  # as the sweeper does every 2 s
            await store.sync()  # the committer lets the chunks go
            assert new.start > 0
            assert sum(c.size for c in new.chunks) <= 2048 + 1024
            await peer.send(read_segment("new", 0, rid=10))
            reply = await peer.command(FOREVER)
            assert isinstance(reply, SegmentIsTruncated)
            assert reply.start_offset == new.start
