"""The segment listener: appends acked only once durable, exactly once, reads of durable data.

Most tests run a gateway on an OS-chosen loopback port and speak to it with
raw sockets: client commands are built here with ``struct`` (or are the
research vectors, byte for byte), and replies are decoded one command at a
time. The tests that need trio's clock (fsync intervals, read waits,
backpressure) drive :class:`ServerSession` over a memory stream against a
store opened in ``tmp_path``.
"""

from __future__ import annotations

import math
import struct
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway
from segment_vectors import EV1, EV2, SEGMENT, VECTORS, WRITER

from gateway.runtime.gateway import Gateway
from gateway.store import Segment, Store
from protocols.segment.events import (
    NULL_EVENT_NUMBER,
    AppendSetup,
    Command,
    DataAppended,
    ErrorMessage,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    NoSuchSegment,
    SegmentIsTruncated,
    SegmentRead,
)
from protocols.segment.frames import decode_command
from protocols.segment.server import ServerSession, ServerSettings

OTHER = UUID("ffeeddcc-bbaa-9988-7766-554433221100")
#: No timeout: for trio's mock clock, whose jumps would fire any deadline.
FOREVER = math.inf


# -- client commands, built independently of the codec --------------------------------------


def frame(code: int, body: bytes) -> bytes:
    return struct.pack(">ii", code, len(body)) + body


def utf(text: str) -> bytes:
    raw = text.encode()  # the names here are ASCII, where modified UTF-8 is the same
    return struct.pack(">H", len(raw)) + raw


def hello(high: int = 17, low: int = 5) -> bytes:
    return frame(-127, struct.pack(">ii", high, low))


def keepalive() -> bytes:
    return frame(100, b"")


def setup_append(rid: int, writer: UUID, segment: str) -> bytes:
    return frame(1, struct.pack(">q", rid) + writer.bytes + utf(segment) + utf(""))


def event(payload: bytes) -> bytes:
    return struct.pack(">ii", 0, len(payload)) + payload


def append(writer: UUID, payloads: Sequence[bytes], last: int, rid: int = 1) -> bytes:
    """One unbatched block holding ``payloads``, numbered up to ``last``."""
    block = b"".join(event(p) for p in payloads)
    end = struct.pack(">ii", len(block), 0) + struct.pack(">iqq", len(payloads), last, rid)
    return frame(3, writer.bytes + block) + frame(4, writer.bytes + end)


def read_segment(segment: str, offset: int, length: int = 1 << 20, rid: int = 2) -> bytes:
    return frame(
        9, utf(segment) + struct.pack(">qi", offset, length) + utf("") + struct.pack(">q", rid)
    )


def payloads(n: int, start: int = 0, size: int = 10) -> list[bytes]:
    return [f"event-{i:0{size - 6}d}".encode() for i in range(start, start + n)]


# -- the client's end of a connection ----------------------------------------------------------


class Peer:
    """Raw bytes out, one decoded reply at a time in."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = bytearray()

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    def _whole(self) -> Command | None:
        if len(self.buf) >= 8:
            length = struct.unpack_from(">i", self.buf, 4)[0]
            if len(self.buf) >= 8 + length:
                command, end = decode_command(self.buf)
                del self.buf[:end]
                return command
        return None

    async def command(self, timeout: float = 10.0) -> Command:
        with trio.fail_after(timeout):
            while (command := self._whole()) is None:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError(f"closed with {bytes(self.buf).hex()} unparsed")
                self.buf += data
        return command

    async def raw(self, n: int, timeout: float = 10.0) -> bytes:
        with trio.fail_after(timeout):
            while len(self.buf) < n:
                data = await self.stream.receive_some(65536)
                if not data:
                    raise EOFError(f"closed after {bytes(self.buf).hex()}")
                self.buf += data
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def closed(self, timeout: float = 10.0) -> list[Command]:
        """Every reply until the server closes the connection."""
        replies = []
        with trio.fail_after(timeout):
            while True:
                while (command := self._whole()) is not None:
                    replies.append(command)
                try:
                    data = await self.stream.receive_some(65536)
                except trio.BrokenResourceError:
                    data = b""
                if not data:
                    return replies
                self.buf += data

    async def nothing_within(self, seconds: float) -> bool:
        """True when no whole reply arrives (and the server does not close) for ``seconds``."""
        with trio.move_on_after(seconds):
            await self.command(timeout=seconds + 1)
            return False
        return True

    async def setup(self, writer: UUID, segment: str, rid: int = 1) -> AppendSetup:
        await self.send(setup_append(rid, writer, segment))
        reply = await self.command()
        assert isinstance(reply, AppendSetup), reply
        return reply


# -- a running gateway -----------------------------------------------------------------------


def config(tmp_path: Path, store: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    return {
        "gateway": {"data_dir": str(tmp_path), "drain_timeout": "100ms"},
        "store": store or {},
        "listeners": [{"name": "seg", "protocol": "segment", "bind": "127.0.0.1:0"} | options],
    }


@asynccontextmanager
async def gateway(tmp_path: Path, **kwargs: Any) -> AsyncIterator[Gateway]:
    async with running_gateway(config(tmp_path, **kwargs)) as gw:
        yield gw


@asynccontextmanager
async def connect(gw: Gateway, *, say_hello: bool = True) -> AsyncIterator[Peer]:
    stream = await trio.open_tcp_stream(*host_port(gw.addresses["seg"][0]))
    async with stream:
        peer = Peer(stream)
        if say_hello:
            await peer.send(hello())
            assert await peer.command() == Hello(17, 5)
        yield peer


def segment_of(gw: Gateway, name: str) -> Segment:
    assert gw.store is not None
    segment = gw.store.segment(name, create=False)
    assert segment is not None
    return segment


def stored(segment: Segment) -> list[bytes]:
    """Every payload the segment holds, in order."""
    data = segment.read(segment.start, segment.end)
    out = []
    pos = 0
    while pos < len(data):
        kind, length = struct.unpack_from(">ii", data, pos)
        assert kind == 0
        out.append(data[pos + 8 : pos + 8 + length])
        pos += 8 + length
    return out


# -- the A.4 sequences, byte for byte --------------------------------------------------------


async def test_the_research_sequence_is_answered_byte_for_byte(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw, say_hello=False) as peer:
        await peer.send(VECTORS["hello"])
        assert await peer.raw(16) == VECTORS["hello"]
        await peer.send(VECTORS["setup_append"])
        assert await peer.raw(65) == VECTORS["append_setup_new_writer"]
        # A batched block of 32 bytes whose second event straddles into the block end.
        await peer.send(VECTORS["batched_block"] + VECTORS["batched_block_end"])
        assert await peer.raw(56) == VECTORS["data_appended"]
        await peer.send(VECTORS["read_segment"])
        assert await peer.raw(96) == VECTORS["segment_read"]
        await peer.send(VECTORS["keepalive"])
        assert await peer.raw(8) == VECTORS["keepalive"]
        assert stored(segment_of(gw, SEGMENT)) == [b"hello", b"0123456789abcdefghij"]


async def test_single_and_padded_blocks_are_acked_in_order(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.setup(WRITER, SEGMENT)
        await peer.send(VECTORS["append_block_single"] + VECTORS["append_block_end_single"])
        assert await peer.command() == DataAppended(WRITER, 1, NULL_EVENT_NUMBER, 1, 13)
        # A padded block of event #2 (the vector's numbers, moved on by one).
        padded_end = bytearray(VECTORS["padded_block_end"])
        struct.pack_into(">q", padded_end, 8 + 16 + 8 + 4, 2)
        await peer.send(VECTORS["padded_block"] + bytes(padded_end))
        assert await peer.command() == DataAppended(WRITER, 2, 1, 1, 26)
        assert stored(segment_of(gw, SEGMENT)) == [b"hello", b"hello"]


async def test_an_incompatible_hello_is_answered_then_closed(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw, say_hello=False) as peer:
        await peer.send(hello(high=4, low=2))
        assert await peer.closed() == [Hello(17, 5)]


async def test_keepalives_are_echoed_and_keep_the_connection(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with gateway(tmp_path, idle_timeout="300ms") as gw, connect(gw) as peer:
        for _ in range(4):
            await trio.sleep(0.15)  # past the idle timeout in all, kept open by keepalives
            await peer.send(keepalive())
            assert await peer.command() == KeepAlive()
        assert await peer.closed() == []  # then idle for good: closed


# -- appends: durable, exactly once ----------------------------------------------------------


async def test_a_reconnecting_writer_learns_what_was_stored_and_nothing_is_duplicated(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as gw:
        async with connect(gw) as first:
            assert (await first.setup(WRITER, "s")).last_event_number == NULL_EVENT_NUMBER
            await first.send(append(WRITER, payloads(3), 3))
            assert (await first.command()).event_number == 3  # type: ignore[attr-defined]
            # Cut before the acks of 4..6 are read: the writer does not know they are safe.
            await first.send(append(WRITER, payloads(3, 3), 6))
        async with connect(gw) as second:
            # AppendSetup waits until what was written is durable, and says so.
            assert (await second.setup(WRITER, "s")).last_event_number == 6
            await second.send(append(WRITER, payloads(2, 6), 8))
            ack = await second.command()
            assert ack == DataAppended(WRITER, 8, 6, 1, segment_of(gw, "s").end)
        async with connect(gw) as third:
            await third.setup(WRITER, "s")
            # Resending 7..8 after all (a client that ignored AppendSetup): refused, closed.
            await third.send(append(WRITER, payloads(2, 6), 8))
            replies = await third.closed()
            assert [type(r) for r in replies] == [InvalidEventNumber]
            assert replies[0].event_number == 8  # type: ignore[attr-defined]
        assert stored(segment_of(gw, "s")) == payloads(8)


async def test_a_stale_event_number_on_the_same_connection_gets_invalid_event_number(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.setup(WRITER, "s")
        await peer.send(append(WRITER, payloads(2), 2))
        await peer.command()
        await peer.send(append(WRITER, payloads(1, 2), 2))
        replies = await peer.closed()
        assert replies == [InvalidEventNumber(WRITER, 1, "", 2)]
        assert stored(segment_of(gw, "s")) == payloads(2)


async def test_a_block_overlapping_stored_numbers_is_refused_across_connections(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as gw:
        async with connect(gw) as one, connect(gw) as two:
            await one.setup(WRITER, "s")
            await two.setup(WRITER, "s")  # the same writer on a second connection
            await one.send(append(WRITER, payloads(3), 3))
            await one.command()
            # Numbers 2..4: its last is new to connection two, its first is stored.
            await two.send(append(WRITER, payloads(3, 1), 4))
            assert [type(r) for r in await two.closed()] == [InvalidEventNumber]
            await one.send(append(WRITER, payloads(1, 3), 4))  # connection one goes on
            assert (await one.command()).event_number == 4  # type: ignore[attr-defined]
        assert stored(segment_of(gw, "s")) == payloads(4)


async def test_two_writers_share_a_connection_and_one_client_writes_two_segments(
    tmp_path: Path,
) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.setup(WRITER, "a", rid=1)
        await peer.setup(OTHER, "a", rid=2)
        third = UUID(int=3)
        await peer.setup(third, "b", rid=3)
        await peer.send(append(WRITER, [b"w1"], 1, rid=1))
        await peer.send(append(OTHER, [b"o1", b"o2"], 2, rid=2))
        await peer.send(append(third, [b"b1"], 1, rid=3))
        await peer.send(append(WRITER, [b"w2"], 2, rid=1))
        acks = [await peer.command() for _ in range(4)]
        assert [(a.writer_id, a.event_number, a.previous_event_number) for a in acks] == [  # type: ignore[attr-defined]
            (WRITER, 1, NULL_EVENT_NUMBER),
            (OTHER, 2, NULL_EVENT_NUMBER),
            (third, 1, NULL_EVENT_NUMBER),
            (WRITER, 2, 1),
        ]
        assert stored(segment_of(gw, "a")) == [b"w1", b"o1", b"o2", b"w2"]
        assert stored(segment_of(gw, "b")) == [b"b1"]
        a = segment_of(gw, "a")
        assert (a.last_event_number(WRITER), a.last_event_number(OTHER)) == (2, 2)


async def test_setup_without_auto_create_answers_no_such_segment(tmp_path: Path) -> None:
    async with gateway(tmp_path, auto_create=False) as gw, connect(gw) as peer:
        await peer.send(setup_append(7, WRITER, "missing"))
        assert await peer.command() == NoSuchSegment(7, "missing", "", -1)
        # The connection goes on; an existing segment can be set up.
        assert gw.store is not None
        gw.store.segment("there")
        assert (await peer.setup(WRITER, "there", rid=8)).segment == "there"
        await peer.send(append(WRITER, [b"x"], 1))
        assert isinstance(await peer.command(), DataAppended)


async def test_an_append_before_setup_closes_only_that_connection(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as good, connect(gw) as bad:
        await good.setup(WRITER, "s")
        await bad.send(append(OTHER, [b"sneaky"], 1))
        replies = await bad.closed()
        assert [type(r) for r in replies] == [ErrorMessage]
        await good.send(append(WRITER, [b"fine"], 1))
        assert isinstance(await good.command(), DataAppended)
        assert stored(segment_of(gw, "s")) == [b"fine"]


async def test_garbage_gets_an_error_reply_and_a_close(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.send(frame(43, b"what is this"))
        replies = await peer.closed()
        assert [type(r) for r in replies] == [ErrorMessage]
        assert "43" in replies[0].message  # type: ignore[attr-defined]


async def test_a_half_block_is_never_stored(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        async with connect(gw) as peer:
            await peer.setup(WRITER, "s")
            whole = append(WRITER, [b"never"], 1)
            await peer.send(whole[:-5])  # the block end is cut short; then the client leaves
        async with connect(gw) as peer:
            assert (await peer.setup(WRITER, "s")).last_event_number == NULL_EVENT_NUMBER
        assert segment_of(gw, "s").end == 0


async def test_appends_are_counted_per_listener(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.setup(WRITER, "s")
        await peer.send(append(WRITER, payloads(3), 3))
        await peer.command()
        labels = {"listener": "seg"}
        assert gw.metrics.value("interchange_messages_received_total", labels) == 3
        assert gw.metrics.value("segment_appended_bytes_total", labels) == 3 * 18


async def test_appends_to_a_durable_destination_reach_its_subscribers(tmp_path: Path) -> None:
    data = config(tmp_path) | {"destinations": [{"name": "logs", "store": "embedded"}]}
    async with running_gateway(data) as gw, connect(gw) as peer:
        sub = gw.hub.subscribe("logs", "readers", start="earliest")
        await peer.setup(WRITER, "logs/0")  # the destination's own segment
        await peer.send(append(WRITER, [b"first", b"second"], 2))
        assert isinstance(await peer.command(), DataAppended)
        with trio.fail_after(5):
            deliveries = await sub.receive()
        assert [(d.message.destination, d.message.body) for d in deliveries] == [
            ("logs", b"first"),
            ("logs", b"second"),
        ]


# -- reads -----------------------------------------------------------------------------------


async def test_reads_return_durable_bytes_from_any_offset(tmp_path: Path) -> None:
    async with gateway(tmp_path, max_read_bytes="20") as gw, connect(gw) as peer:
        await peer.setup(WRITER, "s")
        await peer.send(append(WRITER, [b"hello", b"0123456789abcdefghij"], 2))
        await peer.command()
        data = EV1 + EV2
        await peer.send(read_segment("s", 0, 5, rid=3))  # the client's suggestion is the cap
        assert await peer.command() == SegmentRead("s", 0, False, False, data[:5], 3)
        await peer.send(read_segment("s", 5, 1000, rid=4))  # mid-event; max_read_bytes caps
        assert await peer.command() == SegmentRead("s", 5, False, False, data[5:25], 4)
        await peer.send(read_segment("s", 25, 1000, rid=5))  # the rest, up to the tail
        assert await peer.command() == SegmentRead("s", 25, True, False, data[25:], 5)


async def test_a_tail_read_waits_and_wakes_on_new_data(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as reader, connect(gw) as writer:
        await writer.setup(WRITER, "s")
        await writer.send(append(WRITER, [b"hello"], 1))
        await writer.command()
        await reader.send(read_segment("s", 13, rid=9))
        assert await reader.nothing_within(0.2)  # held: nothing new yet
        await writer.send(append(WRITER, [b"0123456789abcdefghij"], 2))
        ack = await writer.command()
        assert await reader.command() == SegmentRead("s", 13, True, False, EV2, 9)
        assert ack.current_segment_write_offset == 41  # type: ignore[attr-defined]


async def test_a_held_read_does_not_hold_appends_on_its_connection(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.setup(WRITER, "s")
        await peer.send(read_segment("s", 0, rid=9))  # at the tail of an empty segment
        await peer.send(append(WRITER, [b"hello"], 1))
        first, second = await peer.command(), await peer.command()
        replies = {type(first): first, type(second): second}
        assert replies[DataAppended] == DataAppended(WRITER, 1, NULL_EVENT_NUMBER, 1, 13)
        assert replies[SegmentRead] == SegmentRead("s", 0, True, False, EV1, 9)


async def test_missing_and_truncated_segments_are_refused(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.send(read_segment("nowhere", 0, rid=4))
        assert await peer.command() == NoSuchSegment(4, "nowhere", "", 0)
        await peer.setup(WRITER, "s")
        await peer.send(append(WRITER, [b"hello", b"0123456789abcdefghij"], 2))
        await peer.command()
        segment_of(gw, "s").truncate_before(1)  # the owner let event 0 go
        await peer.send(read_segment("s", 0, rid=5))
        assert await peer.command() == SegmentIsTruncated(5, "s", 13, "", 0)
        await peer.send(read_segment("s", 13, rid=6))  # from the new start: fine
        assert await peer.command() == SegmentRead("s", 13, True, False, EV2, 6)


async def test_a_negative_offset_is_bad_input(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, connect(gw) as peer:
        await peer.setup(WRITER, "s")
        await peer.send(read_segment("s", -1, rid=4))
        replies = await peer.closed()
        assert [type(r) for r in replies] == [ErrorMessage]
        assert replies[0].request_id == 4  # type: ignore[attr-defined]


# -- on trio's clock: the session over a memory stream, a store in tmp_path -------------------


@asynccontextmanager
async def session(
    tmp_path: Path, settings: ServerSettings | None = None, *, fsync_interval: float = 10.0
) -> AsyncIterator[tuple[Peer, Store]]:
    async with Store.open(
        tmp_path / "store", fsync="interval", fsync_interval=fsync_interval
    ) as store:
        client, server = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ServerSession(server, store, settings).serve)
            peer = Peer(client)
            await peer.send(hello())
            assert await peer.command() == Hello(17, 5)
            yield peer, store
            nursery.cancel_scope.cancel()


async def test_an_ack_waits_for_the_group_commit(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    # The clock is frozen: a commit after the first happens only when the test moves it.
    async with session(tmp_path, fsync_interval=10.0) as (peer, store):
        await warm_up(peer, mock_clock, 10.0)
        segment = store.segment("s", create=False)
        assert segment is not None
        async with collecting(peer) as acks:
            await peer.send(append(WRITER, [b"b"], 2))
            await trio.testing.wait_all_tasks_blocked()
            assert (segment.end, segment.durable_end) == (18, 9)  # written, not durable ...
            assert acks.commands == []  # ... and not acked
            mock_clock.jump(10.0)
            await acks.arrived.wait()
        assert acks.commands == [DataAppended(WRITER, 2, 1, 1, 18)]
        assert segment.durable_end == 18


async def test_setup_waits_until_earlier_appends_are_durable(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    async with session(tmp_path, fsync_interval=10.0) as (peer, _):
        await warm_up(peer, mock_clock, 10.0)
        await peer.send(append(WRITER, [b"b"], 2) + setup_append(2, WRITER, "s"))
        async with collecting(peer) as replies:
            await trio.testing.wait_all_tasks_blocked()
            assert replies.commands == []  # #2 is not durable: no ack, and no AppendSetup yet
            mock_clock.jump(10.0)
            await replies.arrived.wait()
        # The ack of #2 is dropped (set up again since): the AppendSetup covers it.
        assert replies.commands == [AppendSetup(2, "s", WRITER, 2)]


async def test_reads_see_only_durable_data(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    settings = ServerSettings(read_wait=60.0)  # longer than the commit interval
    async with session(tmp_path, settings, fsync_interval=10.0) as (peer, store):
        await warm_up(peer, mock_clock, 10.0)
        await peer.send(append(WRITER, [b"b"], 2))
        segment = store.segment("s", create=False)
        assert segment is not None
        await segment.wait_for(9)  # #2 is written, not durable
        await peer.send(read_segment("s", 0, rid=3))
        assert await peer.command(FOREVER) == SegmentRead("s", 0, True, False, event(b"a"), 3)
        async with collecting(peer) as replies:
            await peer.send(read_segment("s", 9, rid=4))  # held until #2 is durable
            await trio.testing.wait_all_tasks_blocked()
            assert replies.commands == []
            mock_clock.jump(10.0)
            while len(replies.commands) < 2:
                await replies.arrived.wait()
                replies.arrived = trio.Event()
        assert sorted(replies.commands, key=lambda c: c.TYPE) == [
            DataAppended(WRITER, 2, 1, 1, 18),
            SegmentRead("s", 9, True, False, event(b"b"), 4),
        ]


async def test_a_tail_read_times_out_with_an_empty_reply_at_the_tail(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with session(tmp_path, ServerSettings(read_wait=10.0)) as (peer, _):
        await peer.setup(WRITER, "s")
        asked_at = trio.current_time()
        await peer.send(read_segment("s", 0, rid=3))
        assert await peer.command(FOREVER) == SegmentRead("s", 0, True, False, b"", 3)
        assert trio.current_time() - asked_at == pytest.approx(10.0, abs=0.01)


async def test_reading_stops_above_max_outstanding_bytes(
    tmp_path: Path, mock_clock: trio.testing.MockClock
) -> None:
    settings = ServerSettings(max_outstanding_bytes=250)
    async with session(tmp_path, settings, fsync_interval=1.0) as (peer, store):
        await warm_up(peer, mock_clock, 1.0, b"x" * 92)  # 100 bytes stored a block
        segment = store.segment("s", create=False)
        assert segment is not None
        await peer.send(b"".join(append(WRITER, [b"x" * 92], n) for n in range(2, 12)))
        await trio.testing.wait_all_tasks_blocked()
        # Blocks 2..4 were read (300 bytes > 250); the other 7 wait in the stream.
        assert (segment.end, segment.durable_end) == (400, 100)
        mock_clock.autojump_threshold = 0  # commits go on: reading resumes as acks go out
        acks = [await peer.command(FOREVER) for _ in range(10)]
        assert [a.event_number for a in acks] == list(range(2, 12))  # type: ignore[attr-defined]
        assert segment.end == 1100


async def warm_up(
    peer: Peer, clock: trio.testing.MockClock, interval: float, payload: bytes = b"a"
) -> None:
    """Set the writer up and have event #1 acked; the next commit is then ``interval`` away."""
    await peer.setup(WRITER, "s")
    clock.jump(interval)  # whatever commit was due is due now
    await peer.send(append(WRITER, [payload], 1))
    assert isinstance(await peer.command(FOREVER), DataAppended)  # committed at once


@asynccontextmanager
async def collecting(peer: Peer) -> AsyncIterator[Collected]:
    """Replies collected by a task of their own while the block runs."""
    collected = Collected(peer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collected.run)
        yield collected
        nursery.cancel_scope.cancel()


class Collected:
    """Replies as they arrive."""

    def __init__(self, peer: Peer) -> None:
        self.peer = peer
        self.commands: list[Command] = []
        self.arrived = trio.Event()

    async def run(self) -> None:
        while True:
            self.commands.append(await self.peer.command(FOREVER))
            self.arrived.set()
