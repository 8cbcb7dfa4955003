"""What a half-received window costs, and how the memory budget bounds it.

The codec charges what it really allocates for a window that is not whole
(``held_bytes``, checked here against tracemalloc), inflates ``C`` frames
piece by piece as their bytes arrive (so no frame is ever held compressed and
inflated whole at once), and asks the driver for room before each piece: a
codec told to wait keeps its input as it is and goes on, without new input,
once there is room, parsing exactly what it would have parsed at once. Over
real sockets, many half-received windows stay within the gateway's budget (a
floor of 1 MiB per connection aside), a peer that resets while its input
waits for memory frees it at once, and a Beats window still arrives whole
while the budget is exhausted.
"""

from __future__ import annotations

import gc
import random
import socket
import struct
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import protocols.lumberjack.codec as codec_module
from gateway.core.errors import RemoteProtocolError
from gateway.runtime.gateway import Gateway
from protocols.lumberjack import NEED_DATA, ConnectionClosed, Limits, ServerCodec, Window
from protocols.lumberjack.codec import EVENT_OVERHEAD, INFLATER_STATE
from protocols.lumberjack.server import WINDOW_MEMORY_FLOOR

KiB = 1024
MiB = 1024 * KiB
#: Bytes inflated per piece (the codec's step).
PIECE = codec_module._INFLATE_STEP

# -- frames (built here, independent of protocols.lumberjack.frames) ------------------


def w(size: int, version: int = 2) -> bytes:
    return struct.pack(">BBI", 0x30 + version, ord("W"), size)


def j(seq: int, payload: bytes) -> bytes:
    return struct.pack(">BBII", 0x32, ord("J"), seq, len(payload)) + payload


def d(seq: int, fields: dict[str, str]) -> bytes:
    out = struct.pack(">BBII", 0x31, ord("D"), seq, len(fields))
    for key, value in fields.items():
        for text in (key, value):
            raw = text.encode()
            out += struct.pack(">I", len(raw)) + raw
    return out


def c(frames: bytes, level: int = 3, version: int = 2) -> bytes:
    packed = zlib.compress(frames, level)
    return struct.pack(">BBI", 0x30 + version, ord("C"), len(packed)) + packed


def event(rng: random.Random, seq: int, size: int) -> bytes:
    """A JSON object of exactly ``size`` bytes (at least 16) that compresses 5 to 10 times."""
    words = ("GET", "POST", "/api/v1/items", "200", "404", "upstream", "cache", "hit", "miss")
    head = b'{"n":%d,"m":"' % seq
    body = b" ".join(rng.choice(words).encode() for _ in range(size // 4))
    return head + body[: size - len(head) - 2].ljust(size - len(head) - 2, b".") + b'"}'


def json_window(
    events: int, size: int, per_c: int, *, announced: int | None = None, seed: int = 1
) -> bytes:
    """``W`` then ``events`` J frames, in C frames of ``per_c`` (0: bare)."""
    rng = random.Random(seed)
    out = [w(events if announced is None else announced)]
    frames = [j(seq, event(rng, seq, size)) for seq in range(1, events + 1)]
    step = per_c or events
    for i in range(0, events, step):
        group = b"".join(frames[i : i + step])
        out.append(c(group) if per_c else group)
    return b"".join(out)


def chunks(data: bytes, size: int = 64 * KiB) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


#: More windows than any stream here holds: a codec returning them without end fails
#: the test instead of hanging it.
MAX_WINDOWS = 100_000


def drain(codec: ServerCodec) -> list[Window]:
    windows: list[Window] = []
    while (ev := codec.next_event()) is not NEED_DATA:
        if isinstance(ev, ConnectionClosed):
            break
        assert isinstance(ev, Window)
        windows.append(ev)
        assert len(windows) <= MAX_WINDOWS, "the codec returns windows without end"
    return windows


# -- what a partial window holds ---------------------------------------------------------

SHAPES = {
    # one C frame of large events: it used to be buffered whole, then inflated whole
    # (the parts and their join), then sliced: 2.2 times the window at the peak
    "large events in one C frame": json_window(801, 20_000, 801, announced=802),
    # Beats-like windows of small events, 9000 of 9001 sent
    "small events in C frames": json_window(9000, 200, 2048, announced=9001),
    # the smallest events, bare: the objects per event cost ten times their bytes
    "tiny bare events": json_window(9999, 2, 0, announced=10_000),
    # v1 key/value events
    "D frames": w(2001, 1)
    + b"".join(d(i, {"line": "x" * 40, "host": "web-01", "n": str(i)}) for i in range(1, 2001)),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_what_a_partial_window_holds_is_what_it_allocates(shape: str) -> None:
    """``held_bytes`` covers what the half-received window really takes (tracemalloc
    sees Python's allocations: not the decompressor's state, which is charged as a
    constant), and nothing is held twice for a moment (the peak)."""
    wire = SHAPES[shape]
    pieces = list(chunks(wire))
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        codec = ServerCodec()
        for piece in pieces:
            codec.receive_data(piece)
            assert drain(codec) == []
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    traced, peak = now - base, peak - base
    held = codec.held_bytes
    print(f"\n{shape}: held {held} traced {traced} ({traced / held:.2f}) peak {peak}")
    assert traced <= held + 16 * KiB  # everything it allocates is charged ...
    assert held <= 1.5 * traced + INFLATER_STATE  # ... and not much more
    assert peak <= held + 2 * PIECE + 256 * KiB  # a piece at a time, never a whole frame


def test_a_window_charged_while_received_is_released_when_returned() -> None:
    wire = json_window(3000, 300, 1000)
    codec = ServerCodec()
    held = []
    for piece in chunks(wire[:-1]):
        codec.receive_data(piece)
        assert drain(codec) == []
        held.append(codec.held_bytes)
    assert held == sorted(held)  # grows as the window arrives
    assert held[-1] >= 3000 * (300 + 10 + EVENT_OVERHEAD)
    codec.receive_data(wire[-1:])
    (window,) = drain(codec)
    assert window.held >= 3000 * (300 + 10 + EVENT_OVERHEAD)
    assert codec.held_bytes == 0
    codec.discard()
    assert codec.held_bytes == 0


def test_discard_drops_a_partial_window() -> None:
    codec = ServerCodec()
    codec.receive_data(SHAPES["large events in one C frame"][: 300 * KiB])
    assert drain(codec) == []
    assert codec.held_bytes > MiB
    codec.discard()
    assert codec.held_bytes == 0
    codec.receive_data(b"more")  # dropped too
    assert codec.held_bytes == 0
    assert drain(codec) == []


# -- room --------------------------------------------------------------------------------


class Room:
    """A budget of ``cap`` bytes for one codec: room is what its holdings leave."""

    def __init__(self, codec: ServerCodec, cap: int) -> None:
        self.codec = codec
        self.cap = cap
        self.asked = 0
        self.most = 0
        codec.room = self

    def __call__(self) -> int:
        self.asked += 1
        held = self.codec.held_bytes
        self.most = max(self.most, held)
        return self.cap - held


def test_a_codec_without_room_inflates_nothing() -> None:
    wire = json_window(2000, 1000, 2000)
    codec = ServerCodec()
    room = Room(codec, 0)
    codec.receive_data(wire)
    assert drain(codec) == []
    assert codec.inflated_bytes == 0
    assert codec.held_bytes <= len(wire) + 64 * KiB
    room.cap = 10**9  # room: it goes on with what it holds, no new input needed
    (window,) = drain(codec)
    assert len(window.events) == 2000
    assert codec.held_bytes == 0


@pytest.mark.parametrize("per_c", [0, 1000, 10_000])
def test_a_codec_holds_at_most_its_room_and_a_piece(per_c: int) -> None:
    wire = json_window(10_000, 1000, per_c)
    codec = ServerCodec()
    room = Room(codec, 2 * MiB)
    reads = list(chunks(wire))
    while reads and codec.held_bytes <= room.cap:  # as the session: no reading past it
        codec.receive_data(reads.pop(0))
        assert drain(codec) == []
    assert reads
    # One read, and one piece inflated into events, past the room at most.
    assert room.most <= 2 * MiB + 64 * KiB + PIECE + (PIECE // 1000 + 64) * EVENT_OVERHEAD
    room.cap = 10**9
    for read in reads:
        codec.receive_data(read)
    (window,) = drain(codec)
    assert [seq for seq, _ in window.events] == list(range(1, 10_001))


def test_a_nested_c_frame_waits_for_room_whole() -> None:
    inner = c(b"".join(j(i, b'{"i":%d}' % i) for i in range(1, 501)))
    wire = w(500) + c(inner)
    codec = ServerCodec()
    room = Room(codec, 0)
    codec.receive_data(wire)
    assert drain(codec) == []
    room.cap = 10**9
    (window,) = drain(codec)
    assert len(window.events) == 500


def big_stream(rng: random.Random) -> tuple[bytes, list[list[tuple[int, Any]]]]:
    """Windows whose C frames inflate to several pieces (frames cut between pieces,
    nested C frames among them), and their events."""
    out, expected = [], []
    seq = 0
    for _ in range(rng.randint(1, 3)):
        items: list[tuple[int, Any]] = []
        frames = []
        for _ in range(rng.randint(1, 150)):
            seq += 1
            payload = event(rng, seq, rng.choice([16, 200, 200, 5000, 100_000]))
            items.append((seq, payload))
            frames.append(j(seq, payload))
        body = b""
        i = 0
        while i < len(frames):
            n = rng.randint(1, len(frames) - i)
            group = b"".join(frames[i : i + n])
            how = rng.choice(["bare", "c", "c", "cc"])
            body += group if how == "bare" else c(group) if how == "c" else c(c(group))
            i += n
        out.append(w(len(items)) + body)
        expected.append(items)
    return b"".join(out), expected


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# A nested C frame at the very end of its outer one waits for room: the outer
# stream has ended, but its last frame is not cut short.
@example(seed=1, answers=[0, 1, 1, 0], read=64 * KiB)
@given(
    seed=st.integers(0, 2**32 - 1),
    answers=st.lists(st.sampled_from([0, 0, 1, 10**9]), max_size=60),
    read=st.sampled_from([7, 1000, 64 * KiB]),
)
def test_waiting_for_room_never_changes_what_is_parsed(
    seed: int, answers: list[int], read: int
) -> None:
    """Whenever room says 0 (then more), the windows are those parsed without a budget."""
    stream, expected = big_stream(random.Random(seed))
    codec = ServerCodec()
    pending = list(answers)
    stalls = 0

    def room() -> int:
        nonlocal stalls
        answer = pending.pop(0) if pending else 10**9
        stalls += answer <= 0
        return answer

    codec.room = room
    windows: list[Window] = []
    for piece in chunks(stream, read):
        codec.receive_data(piece)
        windows += drain(codec)
    for _ in range(len(answers) + 1):  # the driver waits for room, then asks again
        windows += drain(codec)
    codec.receive_data(b"")
    assert isinstance(codec.next_event(), ConnectionClosed)
    assert [window.events for window in windows] == expected


@pytest.mark.parametrize("inflater", ["default", "zlib"])
def test_a_frame_inflating_to_many_pieces_waits_and_resumes(
    inflater: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if inflater == "zlib":
        monkeypatch.setattr(codec_module, "_inflating", zlib)
    # Very compressible: a piece fills its limit with input left over, or none.
    payloads = [b'{"x":"' + b"a" * (PIECE // 3 + i) + b'"}' for i in range(40)]
    wire = w(40) + c(b"".join(j(i + 1, p) for i, p in enumerate(payloads)), 9)
    codec = ServerCodec(Limits(max_ratio=10_000))
    room = Room(codec, 0)
    codec.receive_data(wire)
    windows = drain(codec)
    for _ in range(200):
        room.cap = codec.held_bytes + 1  # one piece at a time
        windows += drain(codec)
    room.cap = 10**9
    windows += drain(codec)
    assert [p for _, p in windows[0].events] == payloads


def test_the_inflation_bound_holds_piece_by_piece() -> None:
    bomb = w(1) + c(j(1, bytes(50 * MiB)), 9)
    codec = ServerCodec(Limits(max_inflated=1 * MiB))
    codec.receive_data(bomb)
    with pytest.raises(RemoteProtocolError, match="inflates past"):
        drain(codec)
    assert codec.inflated_bytes <= 1 * MiB + 1


# -- over sockets ----------------------------------------------------------------------


def config(**gateway: Any) -> dict[str, Any]:
    listener = {
        "name": "lj",
        "protocol": "lumberjack",
        "bind": "127.0.0.1:0",
        "destination": "logs",
        "window_timeout": "60s",
    }
    return {"gateway": {"drain_timeout": "1s"} | gateway, "listeners": [listener]}


async def connect(gw: Gateway) -> trio.SocketStream:
    return await trio.open_tcp_stream(*host_port(gw.addresses["lj"][0]))


async def wait_for(check: Callable[[], bool], limit: float = 10) -> None:
    with trio.fail_after(limit):
        while not check():
            await trio.sleep(0.05)


def reset(stream: trio.SocketStream) -> None:
    """Close with a reset (SO_LINGER 0): what a killed sender's kernel does."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


#: A window of 1500 events of 4000 bytes (6 MiB inflated), one event short, one C frame.
HALF_SENT = json_window(1500, 4000, 1500, announced=1501)


async def test_half_received_windows_stay_within_the_budget() -> None:
    """Eight connections each inflating a 6 MiB C frame used to take 8 x 6 MiB from
    an 8 MiB budget (each C frame, buffered whole, was inflated whole)."""
    async with running_gateway(config(memory_budget="8MiB", connection_memory="8MiB")) as gw:
        streams = [await connect(gw) for _ in range(8)]
        async with trio.open_nursery() as nursery:
            for stream in streams:
                nursery.start_soon(stream.send_all, HALF_SENT)
            await wait_for(lambda: gw.budget.used >= gw.budget.limit)
            # Every connection is now waiting for room: none can take more.
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        bound = gw.budget.limit + 8 * (WINDOW_MEMORY_FLOOR + PIECE + 64 * KiB + INFLATER_STATE)
        assert gw.budget.peak <= bound
        for stream in streams:
            reset(stream)
        await wait_for(lambda: gw.budget.used == 0)


async def test_a_peer_that_resets_while_its_input_waits_for_memory_frees_it_at_once() -> None:
    """It held its memory until its window timed out (60 s here): its reader, waiting
    for room, never read the reset."""
    async with running_gateway(config(memory_budget="8MiB", connection_memory="8MiB")) as gw:
        streams = [await connect(gw) for _ in range(4)]
        async with trio.open_nursery() as nursery:
            for stream in streams:
                nursery.start_soon(stream.send_all, HALF_SENT)
            await wait_for(lambda: gw.budget.used >= gw.budget.limit)
            # Every connection is now waiting for room: none can take more.
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        start = trio.current_time()
        for stream in streams:
            reset(stream)
        await wait_for(lambda: gw.budget.used == 0, limit=10)
        assert trio.current_time() - start < 5  # the hang-up check runs every second
        await wait_for(lambda: gw.connections("lj") == 0)


async def test_a_beats_window_arrives_whole_while_the_budget_is_exhausted() -> None:
    """Half-sent windows hold the whole budget; a Beats window (2048 events of 200
    bytes, 0.7 MiB once inflated into events) is within the floor of 1 MiB per
    connection, so it is still read whole and handed to the hub, which acks it
    once there is room."""
    async with running_gateway(config(memory_budget="8MiB", connection_memory="8MiB")) as gw:
        streams = [await connect(gw) for _ in range(3)]
        async with trio.open_nursery() as nursery:
            for stream in streams:
                nursery.start_soon(stream.send_all, HALF_SENT)
            await wait_for(lambda: gw.budget.used >= gw.budget.limit)
            beats = await connect(gw)
            await beats.send_all(json_window(2048, 200, 2048))
            # Read whole and handed to the hub, where it waits for room (with keepalives).
            await wait_for(lambda: windows(gw) == 1)
            nursery.cancel_scope.cancel()
        for stream in streams:
            reset(stream)
        acks = b""
        with trio.fail_after(10):
            while not acks.endswith(b"2A" + struct.pack(">I", 2048)):
                acks += await beats.receive_some(6)
        assert set(acks[:-6].split(b"2A\x00\x00\x00\x00")) <= {b""}  # keepalives before it
        reset(beats)
        await wait_for(lambda: gw.budget.used == 0)


def windows(gw: Gateway) -> float:
    return gw.metrics.value("lumberjack_windows_total", {"listener": "lj"}) or 0
