"""``C`` frames inflated off the event loop: the codec hands them out, the driver runs them.

With :attr:`ServerCodec.offload_at` set, a ``C`` frame at least that large is
returned whole as an :class:`Inflate` event; the driver runs it (in a thread,
in the gateway) and asks for the next event. Everything else must be as with
inline inflating: the same windows from the golden vectors and the probe
table, however the bytes are split; the same refusals (a zip bomb is refused
with the same error, within the same bounds); windows in wire order through a
real :class:`ServerSession` that inflates in threads.
"""

from __future__ import annotations

import struct
import threading
import tracemalloc
from collections.abc import Iterable
from typing import Any

import pytest
import trio
import trio.testing

from gateway.core.errors import LocalProtocolError, RemoteProtocolError
from gateway.core.model import Outcome
from gateway.core.receipts import Receipt
from gateway.protocol.conformance import splits
from protocols.lumberjack import (
    NEED_DATA,
    ClientCodec,
    CodecState,
    ConnectionClosed,
    Inflate,
    Limits,
    Progress,
    ServerCodec,
    Window,
)
from protocols.lumberjack.codec import OFFLOAD_MAX_FRAME, OFFLOAD_STEP
from protocols.lumberjack.server import ServerSession, ServerSettings
from tests.lumberjack.test_lumberjack_codec import GOLDEN, PROBES, c, j, summary, w

MiB = 2**20


class Fed:
    """What a codec returned from some input, running each :class:`Inflate` handed out."""

    def __init__(self, offload_at: int, limits: Limits | None = None) -> None:
        self.codec = ServerCodec(limits)
        self.codec.offload_at = offload_at
        self.windows: list[Window] = []
        self.offloaded = 0

    def drain(self) -> None:
        while (event := self.codec.next_event()) is not NEED_DATA:
            if isinstance(event, Inflate):
                self.offloaded += 1
                event.run()
            elif isinstance(event, Window):
                self.windows.append(event)
            else:
                assert isinstance(event, ConnectionClosed)
                return

    def feed(self, chunks: Iterable[bytes], *, eof: bool = True) -> list[Window]:
        for chunk in chunks:
            if chunk:
                self.codec.receive_data(chunk)
                self.drain()
        if eof:
            self.codec.receive_data(b"")
            self.drain()
            assert self.codec.state is CodecState.CLOSED
        return self.windows


def inline(chunks: Iterable[bytes], limits: Limits | None = None) -> list[Window]:
    return Fed(0, limits).feed(chunks)


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_vectors_whole_and_split_at_every_byte(name: str) -> None:
    data, expected = GOLDEN[name]
    fed = Fed(1)
    assert fed.feed([data]) == expected
    assert fed.offloaded == (1 if "compressed" in name or "nested" in name else 0)
    for chunks in splits(data):
        assert Fed(1).feed(chunks) == expected, [len(chunk) for chunk in chunks]


@pytest.mark.parametrize(
    "name", [name for name, (_, expected) in PROBES.items() if isinstance(expected, list)]
)
def test_probe_rows_as_inline_however_split(name: str) -> None:
    data, _ = PROBES[name]
    whole = inline([data])
    assert Fed(1).feed([data]) == whole
    step = max(1, len(data) // 100)
    for i in range(0, len(data) + 1, step):
        assert Fed(1).feed([data[:i], data[i:]]) == whole, i


@pytest.mark.parametrize(
    "name", [name for name, (_, expected) in PROBES.items() if not isinstance(expected, list)]
)
def test_probe_errors_as_inline(name: str) -> None:
    data, expected = PROBES[name]
    with pytest.raises(expected) as inline_error:
        Fed(0).feed([data], eof=False)
    fed = Fed(1)
    with pytest.raises(expected) as offload_error:
        fed.feed([data], eof=False)
    assert str(offload_error.value) == str(inline_error.value)
    assert fed.codec.state is CodecState.ERROR


def test_only_frames_from_the_threshold_up_are_handed_out() -> None:
    small = w(2, 1) + c(2, j(2, 1, b"{}"))
    large = w(2, 1) + c(2, j(2, 2, b'{"m":"' + b"x" * 5000 + b'"}'), 1)
    size = struct.unpack(">I", large[8:12])[0]
    fed = Fed(size)
    assert summary(fed.feed([small + large])) == [(2, 1, True), (2, 2, True)]
    assert fed.offloaded == 1
    fed = Fed(size + 1)
    fed.feed([small + large])
    assert fed.offloaded == 0


def test_frames_above_the_offload_maximum_stream_inline() -> None:
    payload = bytes(range(256)) * (OFFLOAD_MAX_FRAME // 200)  # incompressible enough
    frame = c(2, j(2, 1, payload), 0)
    fed = Fed(1, Limits(max_window_bytes=8 * MiB))
    assert summary(fed.feed([w(2, 1) + frame])) == [(2, 1, True)]
    assert fed.offloaded == 0


def test_what_the_event_leaves_is_inflated_inline_within_the_same_bound() -> None:
    big = b'{"m":"' + b"a" * (OFFLOAD_STEP + MiB) + b'"}'
    data = w(2, 1) + c(2, j(2, 1, big), 9)
    limits = Limits(max_ratio=10_000)
    fed = Fed(1, limits)
    (window,) = fed.feed([data])
    assert fed.offloaded == 1
    assert window.events == [(1, big)]
    assert fed.codec.inflated_bytes == 10 + len(big)


def test_next_event_before_the_inflate_ran_is_refused() -> None:
    codec = ServerCodec()
    codec.offload_at = 1
    codec.receive_data(w(2, 1) + c(2, j(2, 1, b"{}")))
    event = codec.next_event()
    assert isinstance(event, Inflate)
    with pytest.raises(LocalProtocolError):
        codec.next_event()
    assert codec.held_bytes >= len(event.data)
    event.run()
    assert summary([codec.next_event()]) == [(2, 1, True)]  # type: ignore[list-item]


def _bomb(size: int) -> bytes:
    frames = struct.pack(">BBII", 0x32, ord("J"), 1, size) + bytes(size)
    return w(2, 1) + c(2, frames, 9)


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return _bomb(50_000_000)  # 50 MB inflated from about 49 KB


@pytest.mark.parametrize("limits", [Limits(max_inflated=1 * MiB), Limits()])
def test_a_zip_bomb_is_refused_with_the_same_error_and_bounded_memory(
    bomb: bytes, limits: Limits
) -> None:
    with pytest.raises(RemoteProtocolError, match="inflates past") as inline_error:
        Fed(0, limits).feed([bomb], eof=False)
    fed = Fed(1, limits)
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError, match="inflates past") as offload_error:
            fed.feed([bomb], eof=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(offload_error.value) == str(inline_error.value)
    assert fed.offloaded == 1
    bound = min(limits.max_inflated, limits.max_ratio * (len(bomb) - 12))
    assert peak < bound + OFFLOAD_STEP + 2 * MiB, peak


def test_a_bad_zlib_stream_is_refused_as_inline() -> None:
    packed = b"\x78\x9c" + b"\xff" * 40
    data = w(2, 1) + b"2C" + struct.pack(">I", len(packed)) + packed
    fed = Fed(1)
    with pytest.raises(RemoteProtocolError, match="bad zlib stream"):
        fed.feed([data], eof=False)
    assert fed.offloaded == 1


# -- through a session that inflates in threads ------------------------------------------


async def test_a_session_inflating_in_threads_keeps_the_windows_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client_stream, server_stream = trio.testing.memory_stream_pair()
    received: list[list[int]] = []
    threads: list[int] = []
    run = Inflate.run

    def counted(event: Inflate) -> None:
        threads.append(threading.get_ident())
        run(event)

    monkeypatch.setattr(Inflate, "run", counted)

    async def sink(window: Window) -> Receipt:
        received.append([seq for seq, _ in window.events])
        return Receipt.settled(Outcome.DELIVERED, count=len(window.events))

    windows = 40
    settings = ServerSettings(inflate_in_thread=1, max_pending_windows=3)
    session = ServerSession(server_stream, sink, settings)
    client = ClientCodec(2)
    progress: list[Any] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.serve)
        wire = b""
        for n in range(windows):
            events = [b'{"n":%d,"i":%d}' % (n, i) for i in range(1 + n % 7)]
            wire += client.send_window(events)
        await client_stream.send_all(wire)
        while client.windows_in_flight:
            client.receive_data(await client_stream.receive_some())
            while isinstance(event := client.next_event(), Progress):
                progress.append(event)
        await client_stream.aclose()
    assert received == [list(range(1, 2 + n % 7)) for n in range(windows)]
    assert all(p.window_done for p in progress)
    assert len(threads) == windows
    assert threading.get_ident() not in threads


def test_events_before_a_frame_handed_out_can_be_taken_as_a_part_meanwhile() -> None:
    codec = ServerCodec()
    codec.offload_at = 1
    codec.receive_data(
        w(2, 4) + j(2, 1, b"{}") + j(2, 2, b"{}") + c(2, j(2, 3, b"{}") + j(2, 4, b"{}"))
    )
    event = codec.next_event()
    assert isinstance(event, Inflate)
    part = codec.take_part()  # the thread runs; the events before the frame wait no longer
    assert part is not None
    assert part.part
    assert [seq for seq, _ in part.events] == [1, 2]
    assert codec.take_part() is None
    event.run()
    rest = codec.next_event()
    assert isinstance(rest, Window)
    assert [seq for seq, _ in rest.events] == [3, 4]
    assert (rest.highest_seq, rest.complete) == (4, True)
