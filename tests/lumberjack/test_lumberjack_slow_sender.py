"""A window whose events trickle in is published, and acked, in parts.

On the mock clock, through the server session over an in-memory stream: the
sink holds each part's receipt, so the tests decide when it settles.
"""

from __future__ import annotations

import logging
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import trio
import trio.testing

from gateway.core.errors import LocalProtocolError, RemoteProtocolError
from gateway.core.model import Outcome
from gateway.core.receipts import Receipt
from protocols.lumberjack import NEED_DATA, Ack, ServerCodec, Window
from protocols.lumberjack.server import ServerSettings, serve_connection

LINGER = 1.0


def w(size: int, version: int = 2) -> bytes:
    return struct.pack(">BBI", 0x30 + version, ord("W"), size)


def j(seq: int) -> bytes:
    payload = b'{"n":%d}' % seq
    return struct.pack(">BBII", 0x32, ord("J"), seq, len(payload)) + payload


def d(seq: int) -> bytes:
    key, value = b"line", b"event %d" % seq
    pairs = struct.pack(">I", len(key)) + key + struct.pack(">I", len(value)) + value
    return struct.pack(">BBII", 0x31, ord("D"), seq, 1) + pairs


def a(seq: int, version: int = 2) -> bytes:
    return struct.pack(">BBI", 0x30 + version, ord("A"), seq)


@dataclass
class Sink:
    """Keeps every window handed to it, with a receipt the test settles."""

    windows: list[Window] = field(default_factory=list)
    receipts: list[Receipt] = field(default_factory=list)
    arrived: trio.Event = field(default_factory=trio.Event)

    async def __call__(self, window: Window) -> Receipt:
        receipt = Receipt(1)
        receipt.add_legs()
        receipt.seal()
        self.windows.append(window)
        self.receipts.append(receipt)
        self.arrived.set()
        self.arrived = trio.Event()
        return receipt

    async def next(self, seconds: float = 60.0) -> None:
        """Wait for the next window handed to the sink (failing after ``seconds``)."""
        with trio.fail_after(seconds):
            await self.arrived.wait()

    def settle(self, i: int, outcome: Outcome = Outcome.DELIVERED) -> None:
        self.receipts[i].settle(0, outcome, "")


async def acks_within(stream: trio.abc.Stream, seconds: float) -> list[bytes]:
    """The ack frames that arrive within ``seconds``."""
    data = b""
    with trio.move_on_after(seconds):
        while True:
            chunk = await stream.receive_some()
            if not chunk:
                break
            data += chunk
    return [data[i : i + 6] for i in range(0, len(data), 6)]


async def serve(
    nursery: trio.Nursery, settings: ServerSettings | None = None
) -> tuple[trio.abc.Stream, Sink]:
    client, server = trio.testing.memory_stream_pair()
    sink = Sink()
    settings = settings or ServerSettings(partial_after=LINGER, keepalive=5.0)

    async def run() -> None:
        await serve_connection(server, sink, settings)
        await server.aclose()

    nursery.start_soon(run)
    return client, sink


@pytest.mark.parametrize(("version", "make"), [(2, j), (1, d)], ids=["v2-json", "v1-data"])
async def test_two_events_of_a_window_of_100_are_published_and_acked_after_the_linger(
    autojump_clock: trio.testing.MockClock, version: int, make: Callable[[int], bytes]
) -> None:
    async with trio.open_nursery() as nursery:
        client, sink = await serve(nursery)
        start = trio.current_time()
        await client.send_all(w(100, version) + make(1) + make(2))
        await sink.next()
        assert trio.current_time() - start == pytest.approx(LINGER)
        [part] = sink.windows
        assert (part.part, [seq for seq, _ in part.events], part.highest_seq) == (True, [1, 2], 2)
        # Never an ack before the part's receipt settles ...
        assert await acks_within(client, 3.0) == []
        sink.settle(0)
        # ... then "A 2": events up to 2 of the window are safe.
        assert await acks_within(client, 0.1) == [a(2, version)]

        await client.send_all(b"".join(make(n) for n in range(3, 101)))
        await sink.next()
        rest = sink.windows[1]
        assert (rest.part, len(rest.events), rest.highest_seq) == (False, 98, 100)
        assert await acks_within(client, 1.0) == []
        sink.settle(1)
        assert await acks_within(client, 0.1) == [a(100, version)]
        nursery.cancel_scope.cancel()


async def test_a_window_arriving_whole_is_one_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        client, sink = await serve(nursery)
        await client.send_all(w(3) + j(1) + j(2) + j(3))
        await sink.next()
        sink.settle(0)
        assert await acks_within(client, 0.1) == [a(3)]
        await trio.sleep(5 * LINGER)
        assert [(x.part, x.highest_seq) for x in sink.windows] == [(False, 3)]
        nursery.cancel_scope.cancel()


async def test_acks_stay_in_order_when_the_rest_settles_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        client, sink = await serve(nursery)
        await client.send_all(w(4) + j(1))
        await sink.next()
        await client.send_all(j(2) + j(3) + j(4))
        await sink.next()
        sink.settle(1)  # the rest is safe, the first part not yet: nothing may be acked
        assert await acks_within(client, 2.0) == []
        sink.settle(0)
        assert await acks_within(client, 0.1) == [a(1), a(4)]
        nursery.cancel_scope.cancel()


async def test_keepalives_repeat_the_last_sequence_acked_of_the_waiting_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = ServerSettings(partial_after=LINGER, keepalive=1.0)
    async with trio.open_nursery() as nursery:
        client, sink = await serve(nursery, settings)
        await client.send_all(w(10) + j(1) + j(2))
        await sink.next()
        waiting = await acks_within(client, 2.5)
        assert len(waiting) == 2  # at 1 s and 2 s: "A 0", nothing of the window acked yet
        assert set(waiting) == {a(0)}
        sink.settle(0)
        assert await acks_within(client, 0.1) == [a(2)]
        await client.send_all(b"".join(j(n) for n in range(3, 11)))
        await sink.next()
        waiting = await acks_within(client, 2.5)
        assert len(waiting) == 2
        assert set(waiting) == {a(2)}  # never A 0 once 2 were acked
        sink.settle(1)
        assert await acks_within(client, 0.1) == [a(10)]
        nursery.cancel_scope.cancel()


async def test_events_in_a_c_frame_still_arriving_are_not_published(
    autojump_clock: trio.testing.MockClock,
) -> None:
    inner = zlib.compress(j(2) + j(3))
    c = struct.pack(">BBI", 0x32, ord("C"), len(inner)) + inner
    async with trio.open_nursery() as nursery:
        client, sink = await serve(nursery)
        await client.send_all(w(4) + j(1) + c[:-3])
        await sink.next()
        assert [seq for seq, _ in sink.windows[0].events] == [1]
        await trio.sleep(5 * LINGER)
        assert len(sink.windows) == 1  # 2 and 3 are not received until the C frame ends
        await client.send_all(c[-3:])
        await sink.next()
        assert [seq for seq, _ in sink.windows[1].events] == [2, 3]
        nursery.cancel_scope.cancel()


async def test_a_failed_part_closes_without_ack(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        client, sink = await serve(nursery)
        await client.send_all(w(5) + j(1))
        await sink.next()
        sink.settle(0, Outcome.FAILED)
        assert await acks_within(client, 1.0) == []  # closed, nothing acked


async def test_partial_after_zero_publishes_whole_windows_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = ServerSettings(partial_after=0, window_timeout=0)
    async with trio.open_nursery() as nursery:
        client, sink = await serve(nursery, settings)
        await client.send_all(w(3) + j(1))
        await trio.sleep(60)
        assert sink.windows == []
        await client.send_all(j(2) + j(3))
        await sink.next()
        assert [(x.part, x.highest_seq) for x in sink.windows] == [(False, 3)]
        nursery.cancel_scope.cancel()


async def test_the_timeout_says_how_much_of_the_window_arrived(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ServerSettings(partial_after=LINGER, window_timeout=30.0)
    caplog.set_level(logging.WARNING)
    async with trio.open_nursery() as nursery:
        client, sink = await serve(nursery, settings)
        await client.send_all(w(100) + j(1) + j(2))
        await sink.next()
        sink.settle(0)
        assert await acks_within(client, 40.0) == [a(2)]  # then closed
    [record] = [r for r in caplog.records if "window of" in r.getMessage()]
    assert (
        "window of 100 events: 2 arrived, 2 published, 2 acked, "
        "then not finished within 30s of its start"
    ) in record.getMessage()


async def test_a_window_held_up_by_our_backpressure_is_not_cut_into_parts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = ServerSettings(partial_after=LINGER, max_pending_windows=1, keepalive=60.0)
    async with trio.open_nursery() as nursery:
        client, sink = await serve(nursery, settings)
        # The first window fills the answers; the start of the second waits in the codec.
        await client.send_all(w(2) + j(1) + j(2) + w(3) + j(1))
        await sink.next()
        await trio.sleep(10 * LINGER)
        assert len(sink.windows) == 1  # no part while the reader is held up by us
        sink.settle(0)
        assert await acks_within(client, 0.1) == [a(2)]
        await client.send_all(j(2) + j(3))
        await sink.next()
        assert [(x.part, x.highest_seq) for x in sink.windows] == [(False, 2), (False, 3)]
        nursery.cancel_scope.cancel()


async def test_the_timeout_of_a_window_with_no_part_says_so(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ServerSettings(partial_after=0, window_timeout=30.0)
    caplog.set_level(logging.WARNING)
    async with trio.open_nursery() as nursery:
        client, sink = await serve(nursery, settings)
        await client.send_all(w(100) + j(1) + j(2))
        assert await acks_within(client, 40.0) == []
    assert sink.windows == []
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "window of 100 events: 2 arrived, 0 published, 0 acked, then not finished within 30s" in m
        for m in messages
    ), messages


# -- the codec's side, without I/O ------------------------------------------------------------


def parsed(codec: ServerCodec, data: bytes = b"") -> list[Window]:
    if data:
        codec.receive_data(data)
    out = []
    while isinstance(event := codec.next_event(), Window):
        out.append(event)
    return out


def test_take_part_takes_what_arrived_and_the_rest_follows() -> None:
    codec = ServerCodec()
    assert codec.take_part() is None  # no window
    assert parsed(codec, w(5) + j(1) + j(2)) == []
    held = codec.held_bytes
    part = codec.take_part()
    assert part is not None
    assert (part.part, part.size, [s for s, _ in part.events], part.highest_seq) == (
        True,
        5,
        [1, 2],
        2,
    )
    assert codec.held_bytes < held
    assert codec.take_part() is None  # nothing new arrived
    assert codec.window_progress == (5, 2, 2)
    with pytest.raises(LocalProtocolError):
        codec.send(Ack(2, 3))  # beyond the part
    assert codec.send(Ack(2, 0)) == a(0)  # a keepalive
    assert codec.send(Ack(2, 2)) == a(2)
    [rest] = parsed(codec, j(3) + j(4) + j(5))
    assert (rest.part, [s for s, _ in rest.events], rest.highest_seq) == (False, [3, 4, 5], 5)
    assert codec.window_progress is None
    assert codec.send(Ack(2, 5)) == a(5)


def test_take_part_waits_for_the_windows_parsed_before() -> None:
    codec = ServerCodec()
    codec.receive_data(w(2) + j(1) + j(2) + w(5) + j(1))
    first = codec.next_event()
    assert isinstance(first, Window)
    assert first.highest_seq == 2
    assert codec.take_part() is None  # the next window is not parsed yet
    assert codec.next_event() is NEED_DATA
    part = codec.take_part()
    assert part is not None
    assert part.highest_seq == 1


def test_sequences_must_rise_after_a_part() -> None:
    codec = ServerCodec()
    parsed(codec, w(3) + j(5))
    assert codec.take_part() is not None
    with pytest.raises(RemoteProtocolError, match="must rise"):
        parsed(codec, j(4) + j(6))
