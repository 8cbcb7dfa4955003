"""The Lumberjack codec on its own: bytes in, windows and acks out; no I/O.

Golden byte vectors (written out literally, zlib streams included) pin the
wire format; the probe table of research/lumberjack.md §4 is one test per
row; every golden stream is also parsed split at each byte; the limits are
checked to refuse hostile input before allocating for it; and Hypothesis
properties check that a peer can only ever cause a RemoteProtocolError.

The frame builders below are written here with ``struct`` and ``zlib`` on
purpose, independent of ``protocols.lumberjack.frames``, so that the codec
is checked against an oracle it does not share code with.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import tracemalloc
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protocols.lumberjack.codec as codec_module
from gateway.core.errors import LocalProtocolError, RemoteProtocolError
from gateway.protocol.conformance import splits
from protocols.lumberjack import (
    NEED_DATA,
    Ack,
    ClientCodec,
    CodecState,
    ConnectionClosed,
    Limits,
    Progress,
    ServerCodec,
    Window,
    encode_ack,
    encode_window,
)
from protocols.lumberjack.frames import deflate

MiB = 2**20

# -- an independent frame builder -------------------------------------------------------


def w(version: int, size: int) -> bytes:
    return struct.pack(">BBI", 0x30 + version, ord("W"), size)


def j(version: int, seq: int, payload: bytes) -> bytes:
    return struct.pack(">BBII", 0x30 + version, ord("J"), seq, len(payload)) + payload


def d(version: int, seq: int, fields: dict[str, str]) -> bytes:
    out = struct.pack(">BBII", 0x30 + version, ord("D"), seq, len(fields))
    for key, value in fields.items():
        for text in (key, value):
            raw = text.encode("utf-8")
            out += struct.pack(">I", len(raw)) + raw
    return out


def c(version: int, frames: bytes, level: int = 3) -> bytes:
    packed = zlib.compress(frames, level)
    return struct.pack(">BBI", 0x30 + version, ord("C"), len(packed)) + packed


# -- feeding helpers ----------------------------------------------------------------


def drain(codec: ServerCodec | ClientCodec) -> list[Any]:
    """Every event ``codec`` can produce from what it has received so far."""
    events: list[Any] = []
    while True:
        event = codec.next_event()
        if event is NEED_DATA:
            return events
        events.append(event)
        if isinstance(event, ConnectionClosed):
            return events


def feed(
    chunks: Iterable[bytes], limits: Limits | None = None, *, eof: bool = True
) -> list[Window]:
    """Feed ``chunks`` (then EOF) to a fresh server codec; the windows, in order."""
    server = ServerCodec(limits)
    events: list[Any] = []
    for chunk in chunks:
        if chunk:  # b"" would mean EOF
            server.receive_data(chunk)
            events += drain(server)
    if eof:
        server.receive_data(b"")
        events += drain(server)
        assert events[-1] == ConnectionClosed()
        assert server.state is CodecState.CLOSED
        events.pop()
    assert all(isinstance(e, Window) for e in events), events
    return events


def summary(windows: Sequence[Window]) -> list[tuple[int, int, bool]]:
    return [(win.version, win.highest_seq, win.complete) for win in windows]


# -- golden vectors ----------------------------------------------------------------

#: v2: W 2, then two J frames.
GOLDEN_V2_JSON = (
    b"2W\x00\x00\x00\x02"
    b"2J\x00\x00\x00\x01\x00\x00\x00\x02{}"
    b'2J\x00\x00\x00\x02\x00\x00\x00\x07{"a":1}'
)
#: v1: W 2, then two D frames built by hand (the second has two pairs, one non-ASCII).
GOLDEN_V1_DATA = (
    b"1W\x00\x00\x00\x02"
    b"1D\x00\x00\x00\x01\x00\x00\x00\x01"
    b"\x00\x00\x00\x04line\x00\x00\x00\x05hello"
    b"1D\x00\x00\x00\x02\x00\x00\x00\x02"
    b"\x00\x00\x00\x04line\x00\x00\x00\x05world"
    b"\x00\x00\x00\x04host\x00\x00\x00\x03h\xc3\xa9"
)
#: zlib.compress(J1 {"a":1} + J2 {"b":2} + J3 {"c":3}, 3), all 2J.
ZLIB_3J = bytes.fromhex(
    "785e33f2626060600462f66aa544252bc35a23900013442049c9ca0822c00c114856b232ae0500b38e07ae"
)
GOLDEN_V2_COMPRESSED = b"2W\x00\x00\x00\x03" + b"2C\x00\x00\x00\x2b" + ZLIB_3J
#: zlib.compress(2C len=25 zlib.compress(2J 1 {} + 2J 2 [], 3), 3): a C inside a C.
ZLIB_NESTED = bytes.fromhex(
    "785e337266606090ac8833fe94949090c092b4ec5594b2c06cce96c5c98cf2f14c1b00934c09ee"
)
GOLDEN_V2_NESTED = b"2W\x00\x00\x00\x02" + b"2C\x00\x00\x00\x27" + ZLIB_NESTED
#: zlib.compress(1D 1 {line: a} + 1D 2 {line: b}, 3).
ZLIB_2D = bytes.fromhex("785e3374616060608462969cccbc54103bd11024cc842e9c040068f0050d")
GOLDEN_V1_COMPRESSED = b"1W\x00\x00\x00\x02" + b"1C\x00\x00\x00\x1e" + ZLIB_2D

GOLDEN: dict[str, tuple[bytes, list[Window]]] = {
    "v2-json": (
        GOLDEN_V2_JSON,
        [Window(2, 2, [(1, b"{}"), (2, b'{"a":1}')], 2, True)],
    ),
    "v1-data": (
        GOLDEN_V1_DATA,
        [Window(1, 2, [(1, {"line": "hello"}), (2, {"line": "world", "host": "hé"})], 2, True)],
    ),
    "v2-compressed": (
        GOLDEN_V2_COMPRESSED,
        [Window(2, 3, [(1, b'{"a":1}'), (2, b'{"b":2}'), (3, b'{"c":3}')], 3, True)],
    ),
    "v2-nested": (
        GOLDEN_V2_NESTED,
        [Window(2, 2, [(1, b"{}"), (2, b"[]")], 2, True)],
    ),
    "v1-compressed": (
        GOLDEN_V1_COMPRESSED,
        [Window(1, 2, [(1, {"line": "a"}), (2, {"line": "b"})], 2, True)],
    ),
}


def test_golden_zlib_literals_are_what_they_claim() -> None:
    # The literals are fixed; this pins what is inside them, independently of the codec.
    assert zlib.decompress(ZLIB_3J) == (
        j(2, 1, b'{"a":1}') + j(2, 2, b'{"b":2}') + j(2, 3, b'{"c":3}')
    )
    inner = zlib.decompress(ZLIB_NESTED)
    assert inner[:6] == b"2C\x00\x00\x00\x19"
    assert zlib.decompress(inner[6:]) == j(2, 1, b"{}") + j(2, 2, b"[]")
    assert zlib.decompress(ZLIB_2D) == d(1, 1, {"line": "a"}) + d(1, 2, {"line": "b"})
    assert GOLDEN_V1_DATA[6:] == d(1, 1, {"line": "hello"}) + d(
        1, 2, {"line": "world", "host": "hé"}
    )


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_vector(name: str) -> None:
    data, expected = GOLDEN[name]
    assert feed([data]) == expected


@pytest.mark.parametrize("name", list(GOLDEN))
def test_golden_vector_split_at_every_byte(name: str) -> None:
    data, expected = GOLDEN[name]
    for chunks in splits(data):
        assert feed(chunks) == expected, [len(chunk) for chunk in chunks]


@pytest.mark.parametrize(
    ("ack", "wire"),
    [
        (Ack(2, 5), b"2A\x00\x00\x00\x05"),
        (Ack(1, 0), b"1A\x00\x00\x00\x00"),
        (Ack(2, 2048), b"2A\x00\x00\x08\x00"),
        (Ack(1, 2**32 - 1), b"1A\xff\xff\xff\xff"),
    ],
)
def test_golden_ack(ack: Ack, wire: bytes) -> None:
    server = ServerCodec()
    one = (w(ack.version, 1) + d(ack.version, ack.seq, {})) if ack.seq else w(ack.version, 0)
    server.receive_data(one)
    drain(server)  # one window whose highest sequence is ack.seq: the ack it awaits
    assert server.send(ack) == wire
    assert encode_ack(ack.version, ack.seq) == wire
    for chunks in splits(wire + wire):
        client = ClientCodec(version=ack.version)
        client.window_sent(ack.seq)  # two windows of ack.seq events in flight
        client.window_sent(ack.seq)
        events: list[Any] = []
        for chunk in chunks:
            if chunk:
                client.receive_data(chunk)
                events += drain(client)
        client.receive_data(b"")
        events += drain(client)
        done = Progress(ack.seq, ack.seq, True)
        assert events == [done, done, ConnectionClosed()]


# -- the probe table (research/lumberjack.md §4) --------------------------------------------


def _rows() -> dict[str, tuple[bytes, Any]]:
    three = b"".join(j(2, i, b'{"n":%d}' % i) for i in (1, 2, 3))
    two = j(2, 1, b"{}") + j(2, 2, b"{}")
    return {
        "W3 + 3 J": (w(2, 3) + three, [(2, 3, True)]),
        "W5 + C{5 J}": (
            w(2, 5) + c(2, b"".join(j(2, i, b"{}") for i in range(1, 6))),
            [(2, 5, True)],
        ),
        "W4 + C{2J} + C{2J}": (
            w(2, 4) + c(2, two) + c(2, j(2, 3, b"{}") + j(2, 4, b"{}")),
            [(2, 4, True)],
        ),
        "nested C{C{2J}}": (w(2, 2) + c(2, c(2, two)), [(2, 2, True)]),
        "seq 101..103": (
            w(2, 3) + b"".join(j(2, i, b"{}") for i in (101, 102, 103)),
            [(2, 103, True)],
        ),
        "seq 1,2,7": (w(2, 3) + b"".join(j(2, i, b"{}") for i in (1, 2, 7)), [(2, 7, True)]),
        "two windows back to back": (
            w(2, 2) + two + w(2, 3) + three,
            [(2, 2, True), (2, 3, True)],
        ),
        "2D in a v2 window": (w(2, 1) + d(2, 1, {"k": "v"}), [(2, 1, True)]),
        "v1 W2 + 2 D": (
            w(1, 2) + d(1, 1, {"line": "a"}) + d(1, 2, {"line": "b"}),
            [(1, 2, True)],
        ),
        "v1 W2 + C{2 D}": (
            w(1, 2) + c(1, d(1, 1, {"line": "a"}) + d(1, 2, {"line": "b"})),
            [(1, 2, True)],
        ),
        "v1 W2 then 4 D (sticky)": (
            w(1, 2) + b"".join(d(1, i, {"line": str(i)}) for i in (1, 2, 3, 4)),
            [(1, 2, True), (1, 4, True)],
        ),
        "W0": (w(2, 0), [(2, 0, True)]),
        "W3 + 2J, then W1 + 1J": (
            w(2, 3) + two + w(2, 1) + j(2, 1, b"{}"),
            [(2, 2, False), (2, 1, True)],
        ),
        "bad version": (b"3W\x00\x00\x00\x01", RemoteProtocolError),
        "unknown type": (w(2, 1) + b"2X\x00\x00\x00\x01", RemoteProtocolError),
        "client sends A": (b"2A\x00\x00\x00\x01", RemoteProtocolError),
        "bad zlib": (w(2, 1) + b"2C\x00\x00\x00\x05" + b"not z", RemoteProtocolError),
        "truncated inside C": (
            w(2, 2) + b"2C" + struct.pack(">I", len(z := zlib.compress(two[:-3]))) + z,
            RemoteProtocolError,
        ),
        "J cut short after whole ones inside C": (
            w(2, 3) + c(2, (three)[:-1]),
            RemoteProtocolError,
        ),
        "J announcing 2^31 bytes after whole ones inside C": (
            w(2, 3) + c(2, two + b"2J\x00\x00\x00\x03\x80\x00\x00\x00{}"),
            RemoteProtocolError,
        ),
        "D between J frames inside C": (
            w(2, 3) + c(2, j(2, 1, b"{}") + d(2, 2, {"k": "v"}) + j(2, 3, b"{}")),
            [(2, 3, True)],
        ),
        "v1 J between v2 J frames inside C": (
            w(2, 3) + c(2, j(2, 1, b"{}") + j(1, 2, b"{}") + j(2, 3, b"{}")),
            [(2, 3, True)],
        ),
        # The codec keeps J payloads as raw bytes; JSON validity is the driver's call.
        "invalid JSON is passed through": (w(2, 1) + j(2, 1, b"{not json"), [(2, 1, True)]),
        "W 2^32-1": (b"2W\xff\xff\xff\xff", RemoteProtocolError),
        "J announcing 2^31 bytes": (
            w(2, 1) + b"2J\x00\x00\x00\x01\x80\x00\x00\x00",
            RemoteProtocolError,
        ),
        "J before any W": (j(2, 1, b"{}"), RemoteProtocolError),
        "500 x (W1 + C{1J}) pipelined": (
            b"".join(w(2, 1) + c(2, j(2, 1, b'{"i":%d}' % i)) for i in range(500)),
            [(2, 1, True)] * 500,
        ),
    }


PROBES = _rows()


@pytest.mark.parametrize("name", list(PROBES))
def test_probe_table(name: str) -> None:
    data, expected = PROBES[name]
    if isinstance(expected, list):
        assert summary(feed([data])) == expected
    else:
        # The error comes from the bytes themselves: no EOF needed to see it.
        with pytest.raises(expected):
            feed([data], eof=False)


def test_probe_one_byte_at_a_time() -> None:
    data = w(2, 2) + j(2, 1, b"{}") + j(2, 2, b"{}")
    assert summary(feed([data[i : i + 1] for i in range(len(data))])) == [(2, 2, True)]


@pytest.mark.parametrize(
    "name", [name for name, (data, expected) in PROBES.items() if isinstance(expected, list)]
)
def test_probe_split_in_two_everywhere(name: str) -> None:
    data, expected = PROBES[name]
    whole = feed([data])
    step = max(1, len(data) // 300)  # the 500-window row: every 60th split point
    for i in range(0, len(data) + 1, step):
        assert feed([data[:i], data[i:]]) == whole, i
    assert summary(whole) == expected


@pytest.mark.parametrize(
    "name", [name for name, (data, expected) in PROBES.items() if not isinstance(expected, list)]
)
def test_probe_errors_then_error_state(name: str) -> None:
    data, _ = PROBES[name]
    server = ServerCodec()
    server.receive_data(data)
    with pytest.raises(RemoteProtocolError):
        drain(server)
    assert server.state is CodecState.ERROR
    with pytest.raises(LocalProtocolError):
        server.next_event()


# -- window semantics beyond the table ------------------------------------------------


def test_compressed_frame_spanning_windows_never_drops_events() -> None:
    four = b"".join(j(2, i, b"{}") for i in (1, 2, 3, 4))
    windows = feed([w(2, 2) + c(2, four)])
    assert summary(windows) == [(2, 2, True), (2, 4, True)]
    assert [seq for win in windows for seq, _ in win.events] == [1, 2, 3, 4]
    three = b"".join(j(2, i, b"{}") for i in (1, 2, 3))
    windows = feed([w(2, 2) + c(2, three) + w(2, 1) + j(2, 4, b"{}")])
    assert summary(windows) == [(2, 2, True), (2, 3, False), (2, 4, True)]
    assert [len(win.events) for win in windows] == [2, 1, 1]
    assert windows[1].size == 2


def test_windows_inside_a_compressed_frame() -> None:
    inner = w(2, 1) + j(2, 1, b"{}") + w(2, 0) + w(2, 2) + j(2, 2, b"{}") + j(2, 3, b"{}")
    assert summary(feed([c(2, inner)])) == [(2, 1, True), (2, 0, True), (2, 3, True)]


def test_new_w_before_any_event_flushes_an_empty_partial_window() -> None:
    windows = feed([w(2, 3) + w(2, 1) + j(2, 9, b"{}")])
    assert windows == [Window(2, 3, [], 0, False), Window(2, 1, [(9, b"{}")], 9, True)]


def test_w0_keeps_the_sticky_size() -> None:
    stream = w(1, 2) + d(1, 1, {}) + d(1, 2, {}) + w(1, 0) + d(1, 3, {}) + d(1, 4, {})
    windows = feed([stream])
    assert summary(windows) == [(1, 2, True), (1, 0, True), (1, 4, True)]
    assert windows[2].size == 2


def test_data_after_w0_alone_is_an_error() -> None:
    with pytest.raises(RemoteProtocolError, match="before any W"):
        feed([w(2, 0) + j(2, 1, b"{}")], eof=False)


def test_window_version_comes_from_w_or_first_data_frame() -> None:
    assert summary(feed([w(2, 1) + j(1, 1, b"{}")])) == [(2, 1, True)]
    stream = w(2, 1) + j(2, 1, b"{}") + d(1, 2, {"k": "v"})
    assert summary(feed([stream])) == [(2, 1, True), (1, 2, True)]  # sticky, from the D


def test_sequence_numbers_are_free() -> None:
    top = 2**32 - 1
    windows = feed([w(2, 3) + j(2, top, b"{}") + j(2, 0, b"{}") + j(2, 5, b"{}")])
    assert windows[0].highest_seq == top
    assert [seq for seq, _ in windows[0].events] == [top, 0, 5]


def test_d_frame_edge_cases() -> None:
    windows = feed([w(1, 2) + d(1, 1, {}) + d(1, 2, {"": "", "k": "x" * 300})])
    assert windows[0].events == [(1, {}), (2, {"": "", "k": "x" * 300})]
    bad = w(1, 1) + b"1D\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x01\xff\x00\x00\x00\x00"
    with pytest.raises(RemoteProtocolError, match="UTF-8"):
        feed([bad], eof=False)


def test_eof_drops_a_partial_window_and_a_partial_frame() -> None:
    assert feed([w(2, 3) + j(2, 1, b"{}") + j(2, 2, b"{}")]) == []
    assert feed([w(2, 1) + j(2, 1, b"{}")[:-1]]) == []
    assert feed([w(2, 1) + b"2C\x00\x00\x00\x10" + b"x"]) == []
    # Whole windows before the cut are still returned.
    data = w(2, 1) + j(2, 1, b"{}") + w(2, 2) + j(2, 2, b"{}")
    assert summary(feed([data])) == [(2, 1, True)]


def test_states_and_closed_repeats() -> None:
    server = ServerCodec()
    assert server.state is CodecState.OPEN
    assert not server.in_window
    server.receive_data(b"2W")
    assert server.next_event() is NEED_DATA
    assert server.state is CodecState.OPEN
    assert server.in_window
    server.receive_data(b"\x00\x00\x00\x01")
    assert server.next_event() is NEED_DATA
    assert server.state is CodecState.OPEN
    assert server.in_window
    server.receive_data(j(2, 1, b"{}"))
    assert isinstance(server.next_event(), Window)
    assert server.state is CodecState.OPEN
    assert not server.in_window
    server.receive_data(b"")
    assert server.next_event() == ConnectionClosed()
    assert server.next_event() == ConnectionClosed()
    assert server.state is CodecState.CLOSED
    with pytest.raises(LocalProtocolError):
        server.receive_data(b"2W")


def test_send_validates() -> None:
    server = ServerCodec()
    with pytest.raises(LocalProtocolError):
        server.send(Window(2, 0, [], 0, True))  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        server.send(Ack(3, 1))
    with pytest.raises(LocalProtocolError):
        server.send(Ack(2, 2**32))
    with pytest.raises(LocalProtocolError):
        encode_ack(2, -1)


# -- what the server may send (h11-style state checks) ---------------------------------


def returned(*streams: bytes) -> ServerCodec:
    """A server codec that returned every window of ``streams`` (fed in one piece)."""
    server = ServerCodec()
    server.receive_data(b"".join(streams))
    drain(server)
    return server


def test_an_ack_needs_a_window_that_awaits_it() -> None:
    with pytest.raises(LocalProtocolError, match="no window awaits"):
        ServerCodec().send(Ack(2, 0))
    # A window that is only partly received (or parsed but not returned) awaits nothing.
    server = returned(w(2, 2) + j(2, 1, b"{}"))
    with pytest.raises(LocalProtocolError, match="no window awaits"):
        server.send(Ack(2, 1))
    server = returned(w(2, 1) + j(2, 7, b"{}"))
    assert server.send(Ack(2, 7)) == b"2A\x00\x00\x00\x07"
    with pytest.raises(LocalProtocolError, match="no window awaits"):
        server.send(Ack(2, 7))  # acked already


def test_an_ack_has_its_window_version_and_stays_within_it() -> None:
    server = returned(w(1, 2) + d(1, 3, {}) + d(1, 5, {}))
    with pytest.raises(LocalProtocolError, match="version 1"):
        server.send(Ack(2, 5))
    with pytest.raises(LocalProtocolError, match="highest sequence 5"):
        server.send(Ack(1, 6))
    # A refused ack changes nothing: the window still awaits its own.
    assert server.send(Ack(1, 5)) == b"1A\x00\x00\x00\x05"


def test_acks_answer_the_returned_windows_in_order() -> None:
    server = returned(w(2, 1) + j(2, 9, b"{}"), w(1, 1) + d(1, 4, {}), w(2, 0))
    with pytest.raises(LocalProtocolError, match="version 2"):
        server.send(Ack(1, 4))  # the second window's ack, too early
    assert server.send(Ack(2, 9)) == encode_ack(2, 9)
    with pytest.raises(LocalProtocolError):
        server.send(Ack(2, 0))  # the second window is v1
    assert server.send(Ack(1, 4)) == encode_ack(1, 4)
    assert server.send(Ack(2, 0)) == encode_ack(2, 0)  # W 0 is acked by A 0 ...
    with pytest.raises(LocalProtocolError, match="no window awaits"):
        server.send(Ack(2, 0))  # ... once


def test_a_0_is_a_keepalive_for_a_window_with_events() -> None:
    server = returned(w(2, 3) + j(2, 1, b"{}") + j(2, 2, b"{}") + j(2, 3, b"{}"))
    for _ in range(3):
        assert server.send(Ack(2, 0)) == b"2A\x00\x00\x00\x00"  # acks nothing
    assert server.send(Ack(2, 2)) == encode_ack(2, 2)  # a partial ack: still awaiting
    assert server.send(Ack(2, 3)) == encode_ack(2, 3)
    with pytest.raises(LocalProtocolError):
        server.send(Ack(2, 0))
    # A window whose highest sequence is 0 is acked by A 0 (it can have no keepalive).
    server = returned(w(2, 2) + j(2, 0, b"{}") + j(2, 0, b"[]"))
    assert server.send(Ack(2, 0)) == encode_ack(2, 0)
    with pytest.raises(LocalProtocolError):
        server.send(Ack(2, 0))


def test_a_returned_window_stays_ackable_after_bad_input_or_the_end_of_input() -> None:
    server = ServerCodec()
    server.receive_data(w(2, 1) + j(2, 3, b"{}") + w(2, 2) + j(2, 4, b"{}") + b"9W")
    first = server.next_event()
    with pytest.raises(RemoteProtocolError):
        server.next_event()  # the second window, partly received, is dropped
    assert server.state is CodecState.ERROR
    assert isinstance(first, Window)
    assert server.send(Ack(2, first.highest_seq)) == encode_ack(2, 3)
    with pytest.raises(LocalProtocolError, match="no window awaits"):
        server.send(Ack(2, 4))
    server = returned(w(2, 1) + j(2, 3, b"{}") + w(2, 2) + j(2, 4, b"{}"))
    server.receive_data(b"")
    assert drain(server) == [ConnectionClosed()]
    assert server.send(Ack(2, 3)) == encode_ack(2, 3)
    with pytest.raises(LocalProtocolError, match="no window awaits"):
        server.send(Ack(2, 4))  # the window cut by the end of input is never acked


_window_specs = st.lists(
    st.tuples(st.sampled_from([1, 2]), st.lists(st.integers(0, 6), max_size=3)), max_size=5
)


@settings(max_examples=200, deadline=None)
@given(specs=_window_specs, acks=st.lists(st.tuples(st.sampled_from([1, 2]), st.integers(0, 7))))
def test_send_accepts_exactly_the_acks_a_model_allows(
    specs: list[tuple[int, list[int]]], acks: list[tuple[int, int]]
) -> None:
    stream = b"".join(
        w(v, len(seqs)) + b"".join(d(v, seq, {}) for seq in seqs) for v, seqs in specs
    )
    server = returned(stream)
    awaiting = [(v, max(seqs, default=0)) for v, seqs in specs]  # the model
    for version, seq in acks:
        allowed = bool(awaiting) and awaiting[0][0] == version and seq <= awaiting[0][1]
        if not allowed:
            with pytest.raises(LocalProtocolError):
                server.send(Ack(version, seq))
            continue
        assert server.send(Ack(version, seq)) == encode_ack(version, seq)
        if seq == awaiting[0][1]:
            awaiting.pop(0)


def test_windows_are_returned_one_per_call_and_the_buffer_compacts() -> None:
    one = w(2, 1) + j(2, 1, b"x" * 100)
    server = ServerCodec()
    server.receive_data(one * 50)
    for _ in range(50):
        assert isinstance(server.next_event(), Window)
        assert not server._ready  # parsed lazily: one window per call
        assert server._buffer.pos <= len(server._buffer.data) // 2  # consumed bytes are dropped
    assert server.next_event() is NEED_DATA
    assert len(server._buffer.data) <= len(one)


def test_a_big_frame_in_small_pieces_is_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    parse = ServerCodec._parse

    def counting(self: ServerCodec, *args: Any) -> int:
        nonlocal calls
        calls += 1
        return parse(self, *args)

    monkeypatch.setattr(ServerCodec, "_parse", counting)
    data = w(2, 1) + j(2, 1, b"x" * 20_000)
    windows = feed([data[i : i + 7] for i in range(0, len(data), 7)])
    assert summary(windows) == [(2, 1, True)]
    assert calls <= 6  # not once per piece (there are about 2900 pieces)


def test_d_frame_length_fields_are_scanned_once(monkeypatch: pytest.MonkeyPatch) -> None:
    scanned = 0
    scan = codec_module._scan_data_frame

    def counting(*args: Any) -> tuple[int, int, int]:
        nonlocal scanned
        result = scan(*args)
        scanned += args[4] - result[1]
        return result

    monkeypatch.setattr(codec_module, "_scan_data_frame", counting)
    fields = {f"k{i}": f"v{i}" for i in range(500)}
    data = w(1, 1) + d(1, 1, fields)
    windows = feed([data[i : i + 3] for i in range(0, len(data), 3)])
    assert windows[0].events == [(1, fields)]
    assert scanned == 2 * len(fields)  # resumed, not rescanned from the start


# -- the client ------------------------------------------------------------------------


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("level", [0, 1, 3, 9])
def test_client_window_parses_back(version: int, level: int) -> None:
    payloads = [b'{"i":%d}' % i for i in range(300)] + [b"", b"x" * 5000]
    wire = ClientCodec(version=version).send_window(payloads, compression_level=level)
    assert wire[:6] == w(version, len(payloads))
    assert wire[7] == (ord("J") if level == 0 else ord("C"))
    windows = feed([wire])
    assert len(windows) == 1
    assert windows[0].version == version
    assert windows[0].events == list(enumerate(payloads, 1))
    assert windows[0].highest_seq == len(payloads)


def test_client_level_0_is_bare_json_frames() -> None:
    wire = ClientCodec().send_window([b"{}", b"[]"], compression_level=0)
    assert wire == w(2, 2) + j(2, 1, b"{}") + j(2, 2, b"[]")
    wire = ClientCodec().send_window([b"{}", b"[]"])
    # W 2, then one C whose zlib stream (from ISA-L or zlib) inflates to the J frames.
    assert wire[:8] == w(2, 2) + b"2C"
    assert struct.unpack(">I", wire[8:12])[0] == len(wire) - 12
    assert zlib.decompress(wire[12:]) == j(2, 1, b"{}") + j(2, 2, b"[]")
    assert ClientCodec().send_window([]) == b"2W\x00\x00\x00\x00"


@pytest.mark.parametrize("level", range(1, 10))
def test_deflate_is_a_zlib_stream_at_every_level(level: int) -> None:
    data = b"".join(j(2, i, b'{"n":%d,"pad":"%s"}' % (i, b"x" * (i % 50))) for i in range(500))
    packed = deflate(data, level)
    assert zlib.decompress(packed) == data
    assert len(packed) < len(data) // 5


def test_encode_window_compresses_with_what_it_is_given() -> None:
    wire = encode_window(2, [b"{}"], 3, compress=zlib.compress)
    assert wire == w(2, 1) + c(2, j(2, 1, b"{}"), 3)


def test_encode_window_first_seq_and_bounds() -> None:
    wire = encode_window(1, [b"a", b"b"], compression_level=0, first_seq=2**32 - 2)
    assert wire == w(1, 2) + j(1, 2**32 - 2, b"a") + j(1, 2**32 - 1, b"b")
    with pytest.raises(LocalProtocolError):
        encode_window(2, [b"a", b"b"], first_seq=2**32 - 1)
    with pytest.raises(LocalProtocolError):
        encode_window(3, [b"a"])
    with pytest.raises(LocalProtocolError):
        encode_window(2, [b"a"], compression_level=10)


@pytest.mark.parametrize(
    ("version", "wire", "match"),
    [
        (2, b"1A\x00\x00\x00\x01", "version 1"),
        (1, b"2A\x00\x00\x00\x01", "version 2"),
        (2, b"2W\x00\x00\x00\x01", "only send A"),
        (2, b"2J\x00\x00\x00\x01", "only send A"),
        (2, b"\x00A\x00\x00\x00\x01", "version byte"),
    ],
)
def test_client_rejects_bad_acks(version: int, wire: bytes, match: str) -> None:
    client = ClientCodec(version=version)
    client.receive_data(wire[:2])  # the first two bytes are enough to tell
    with pytest.raises(RemoteProtocolError, match=match):
        client.next_event()
    assert client.state is CodecState.ERROR
    with pytest.raises(LocalProtocolError):
        client.next_event()
    with pytest.raises(LocalProtocolError):
        client.send_window([b"{}"])


def test_client_eof() -> None:
    client = ClientCodec()
    client.send_window([b"{}"] * 7)
    client.receive_data(b"2A\x00\x00\x00\x07" + b"2A\x00")
    client.receive_data(b"")
    assert drain(client) == [Progress(7, 7, True), ConnectionClosed()]
    assert client.next_event() == ConnectionClosed()
    assert client.state is CodecState.CLOSED
    with pytest.raises(ValueError, match="version"):
        ClientCodec(version=3)


# -- the client matches acks to its windows ----------------------------------------


def acks(version: int, *seqs: int) -> bytes:
    return b"".join(struct.pack(">BBI", 0x30 + version, ord("A"), seq) for seq in seqs)


def matched(client: ClientCodec, wire: bytes) -> list[Any]:
    client.receive_data(wire)
    return drain(client)


def test_client_golden_acks() -> None:
    assert acks(2, 1, 2048) == b"2A\x00\x00\x00\x01" + b"2A\x00\x00\x08\x00"
    client = ClientCodec()
    client.send_window([b"{}"] * 2048, compression_level=0)
    assert matched(client, b"2A\x00\x00\x00\x01" + b"2A\x00\x00\x08\x00") == [
        Progress(1, 1, False),
        Progress(2048, 2047, True),
    ]


@pytest.mark.parametrize("version", [1, 2])
def test_client_partial_repeated_and_full_acks(version: int) -> None:
    client = ClientCodec(version=version)
    client.send_window([b"{}"] * 5)
    assert (client.windows_in_flight, client.events_in_flight) == (1, 5)
    wire = acks(version, 1, 1, 0, 4, 2, 5)
    assert matched(client, wire) == [
        Progress(1, 1, False),
        Progress(1, 0, False),  # repeated: nothing new
        Progress(0, 0, False),  # a keepalive
        Progress(4, 3, False),  # events [1:4] of the window
        Progress(2, 0, False),  # older than what was acked: nothing new
        Progress(5, 1, True),
    ]
    assert (client.windows_in_flight, client.events_in_flight) == (0, 0)
    assert matched(client, acks(version, 0)) == [Progress(0, 0, False)]  # idle keepalive


def test_client_acks_are_matched_to_pipelined_windows_in_order() -> None:
    client = ClientCodec()
    client.send_window([b"{}"] * 3)
    client.send_window([b"{}"] * 2)
    client.send_window([])  # W 0: acked by A 0
    assert client.events_in_flight == 5
    assert matched(client, acks(2, 2)) == [Progress(2, 2, False)]
    assert client.events_in_flight == 3
    assert matched(client, acks(2, 3, 2, 0)) == [
        Progress(3, 1, True),
        Progress(2, 2, True),
        Progress(0, 0, True),
    ]
    assert client.windows_in_flight == 0


def test_client_window_sent_is_a_window_encoded_elsewhere() -> None:
    client = ClientCodec(version=1)
    wire = encode_window(1, [b"{}"] * 3)  # encoded once, sent twice
    client.window_sent(3)
    client.window_sent(3)
    assert summary(feed([wire + wire])) == [(1, 3, True), (1, 3, True)]
    assert matched(client, acks(1, 3, 3)) == [Progress(3, 3, True)] * 2


@pytest.mark.parametrize(
    ("wire", "match"),
    [
        (acks(2, 1), "no window in flight"),
        (acks(2, 0, 0, 4), "no window in flight"),
    ],
)
def test_client_refuses_an_ack_with_no_window_in_flight(wire: bytes, match: str) -> None:
    client = ClientCodec()
    with pytest.raises(RemoteProtocolError, match=match):
        matched(client, wire)
    assert client.state is CodecState.ERROR
    with pytest.raises(LocalProtocolError):
        client.next_event()
    with pytest.raises(LocalProtocolError):
        client.window_sent(1)


def test_client_refuses_an_ack_beyond_the_oldest_window() -> None:
    client = ClientCodec()
    client.send_window([b"{}"] * 2)
    client.send_window([b"{}"] * 5)
    with pytest.raises(RemoteProtocolError, match="beyond the window of 2 events"):
        matched(client, acks(2, 1, 3))  # 3 would fit the second window, not the first
    assert client.state is CodecState.ERROR
    with pytest.raises(LocalProtocolError):
        client.send_window([b"{}"])


def test_client_matching_split_at_every_byte() -> None:
    wire = acks(2, 0, 2, 2, 3, 0, 1, 4)
    expected = [
        Progress(0, 0, False),
        Progress(2, 2, False),
        Progress(2, 0, False),
        Progress(3, 1, True),
        Progress(0, 0, False),
        Progress(1, 1, False),
        Progress(4, 3, True),
        ConnectionClosed(),
    ]
    for chunks in splits(wire):
        client = ClientCodec()
        client.send_window([b"{}"] * 3)
        client.send_window([b"{}"] * 4)
        events: list[Any] = []
        for chunk in chunks:
            if chunk:
                events += matched(client, chunk)
        client.receive_data(b"")
        events += drain(client)
        assert events == expected, [len(chunk) for chunk in chunks]


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 6), max_size=4),
    seqs=st.lists(st.integers(0, 7), max_size=12),
    cuts=st.lists(st.integers(0, 80), max_size=5),
)
def test_client_matching_follows_a_model_in_any_chunks(
    sizes: list[int], seqs: list[int], cuts: list[int]
) -> None:
    # The model: windows in flight as [size, acked]; an error ends the stream.
    inflight = [[size, 0] for size in sizes]
    expected: list[Any] = []
    for seq in seqs:
        if not inflight:
            if seq:
                expected.append(RemoteProtocolError)
                break
            expected.append(Progress(0, 0, False))
            continue
        size, done = inflight[0]
        if seq > size:
            expected.append(RemoteProtocolError)
            break
        if seq == size:
            inflight.pop(0)
            expected.append(Progress(seq, seq - done, True))
        else:
            expected.append(Progress(seq, max(seq - done, 0), False))
            inflight[0][1] = max(done, seq)
    client = ClientCodec()
    for size in sizes:
        client.send_window([b"{}"] * size, compression_level=0)
    events: list[Any] = []
    try:
        for chunk in _chunked(acks(2, *seqs), cuts):
            if chunk:
                client.receive_data(chunk)
                while (event := client.next_event()) is not NEED_DATA:
                    events.append(event)
    except RemoteProtocolError:
        events.append(RemoteProtocolError)
        assert client.state is CodecState.ERROR
    assert events == expected
    if RemoteProtocolError not in expected:
        assert client.events_in_flight == sum(size - done for size, done in inflight)


# -- limits ----------------------------------------------------------------------------


def test_default_limits() -> None:
    assert Limits() == Limits(
        max_window=10_000, max_frame=64 * MiB, max_inflated=256 * MiB, max_ratio=100, max_depth=2
    )
    assert ServerCodec().limits == Limits()
    with pytest.raises(ValueError, match="max_frame"):
        Limits(max_frame=-1)


def test_window_limit() -> None:
    assert feed([w(2, 10_000)]) == []  # accepted; dropped at EOF as partial
    with pytest.raises(RemoteProtocolError, match="window"):
        feed([w(2, 10_001)], eof=False)
    small = Limits(max_window=5)
    assert summary(feed([w(2, 5) + b"".join(j(2, i, b"") for i in range(5))], small)) == [
        (2, 4, True)
    ]
    with pytest.raises(RemoteProtocolError, match="window"):
        feed([w(2, 6)], small, eof=False)


def test_frame_limit_is_checked_on_the_header() -> None:
    small = Limits(max_frame=100)
    assert summary(feed([w(2, 1) + j(2, 1, b"x" * 100)], small)) == [(2, 1, True)]
    with pytest.raises(RemoteProtocolError, match="J frame"):
        feed([w(2, 1) + b"2J\x00\x00\x00\x01\x00\x00\x00\x65"], small, eof=False)
    with pytest.raises(RemoteProtocolError, match="C frame"):
        feed([w(2, 1) + b"2C\x00\x00\x00\x65"], small, eof=False)
    # D: the pair count alone, then the running total of lengths.
    with pytest.raises(RemoteProtocolError, match="D frame"):
        feed([w(1, 1) + b"1D\x00\x00\x00\x01\x00\x00\x00\x0d"], small, eof=False)
    with pytest.raises(RemoteProtocolError, match="D frame"):
        feed([w(1, 1) + b"1D\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x60"], small, eof=False)
    data = w(1, 1) + d(1, 1, {"k" * 40: "v" * 60})  # 8 + 100 > 100
    with pytest.raises(RemoteProtocolError, match="D frame"):
        feed([data[:64]], small, eof=False)  # up to the value's length, not the value


def _bomb(size: int) -> bytes:
    """A window whose one J frame of ``size`` zero bytes is sent as one C frame."""
    frames = struct.pack(">BBII", 0x32, ord("J"), 1, size) + bytes(size)
    return w(2, 1) + c(2, frames, 9)


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return _bomb(50_000_000)  # 50 MB inflated from about 49 KB


def test_zip_bomb_within_generous_limits_is_accepted(bomb: bytes) -> None:
    # The control: with the bounds raised, the same bytes are a valid window.
    generous = Limits(max_inflated=64 * MiB, max_ratio=10_000)
    (window,) = feed([bomb], generous)
    payload = window.events[0][1]
    assert isinstance(payload, bytes)
    assert len(payload) == 50_000_000


@pytest.mark.parametrize(
    ("limits", "peak_limit"),
    [(Limits(max_inflated=1 * MiB), 4 * MiB), (Limits(), 8 * MiB)],
    ids=["max_inflated", "max_ratio"],
)
def test_zip_bomb_is_refused_without_inflating_it(
    bomb: bytes, limits: Limits, peak_limit: int
) -> None:
    server = ServerCodec(limits)
    server.receive_data(bomb)
    tracemalloc.start()
    try:
        with pytest.raises(RemoteProtocolError, match="inflates past"):
            server.next_event()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < peak_limit, peak


@pytest.mark.parametrize("limits", [Limits(max_inflated=1 * MiB), Limits()])
def test_zip_bomb_never_inflates_past_the_bound(
    bomb: bytes, limits: Limits, monkeypatch: pytest.MonkeyPatch
) -> None:
    produced = 0
    real = codec_module._inflating.decompressobj

    class Counting:
        def __init__(self) -> None:
            self.inner = real()

        def decompress(self, data: Any, max_length: int = 0) -> bytes:
            nonlocal produced
            assert max_length > 0  # never unbounded
            out = self.inner.decompress(data, max_length)
            produced += len(out)
            return out

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    monkeypatch.setattr(codec_module._inflating, "decompressobj", Counting)
    compressed = len(bomb) - 12
    bound = min(limits.max_inflated, limits.max_ratio * compressed)
    with pytest.raises(RemoteProtocolError, match="inflates past"):
        feed([bomb], limits, eof=False)
    assert bound < produced <= bound + 1


def test_inflated_size_boundary() -> None:
    frames = j(2, 1, b"x" * 1000)
    data = w(2, 1) + c(2, frames)
    assert summary(feed([data], Limits(max_inflated=len(frames)))) == [(2, 1, True)]
    with pytest.raises(RemoteProtocolError, match="inflates past"):
        feed([data], Limits(max_inflated=len(frames) - 1), eof=False)


@pytest.mark.parametrize(
    ("depth", "max_depth", "ok"),
    [(1, 2, True), (2, 2, True), (3, 2, False), (0, 0, True), (1, 0, False), (2, 1, False)],
)
def test_nesting_depth(depth: int, max_depth: int, ok: bool) -> None:
    frames = j(2, 1, b"{}")
    for _ in range(depth):
        frames = c(2, frames)
    data = w(2, 1) + frames
    if ok:
        assert summary(feed([data], Limits(max_depth=max_depth))) == [(2, 1, True)]
    else:
        with pytest.raises(RemoteProtocolError, match="nested"):
            feed([data], Limits(max_depth=max_depth), eof=False)


def test_compressed_frame_with_trailing_bytes_or_cut_frame() -> None:
    packed = zlib.compress(j(2, 1, b"{}")) + b"junk"
    data = w(2, 1) + b"2C" + struct.pack(">I", len(packed)) + packed
    with pytest.raises(RemoteProtocolError, match="after the zlib stream"):
        feed([data], eof=False)
    with pytest.raises(RemoteProtocolError, match="cut short"):
        feed([w(2, 1) + c(2, j(2, 1, b"{}") + b"2")], eof=False)
    packed = zlib.compress(j(2, 1, b"{}" * 100))[:-6]
    with pytest.raises(RemoteProtocolError, match="truncated"):
        feed([w(2, 1) + b"2C" + struct.pack(">I", len(packed)) + packed], eof=False)


# -- Hypothesis ------------------------------------------------------------------------


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


def _run(make: Callable[[], ServerCodec | ClientCodec], chunks: list[bytes]) -> None:
    """Feed ``chunks`` then EOF: only events or a RemoteProtocolError may come out."""
    codec = make()
    try:
        for chunk in [*[chunk for chunk in chunks if chunk], b""]:
            codec.receive_data(chunk)
            for event in drain(codec):
                assert isinstance(event, Window | Progress | ConnectionClosed)
    except RemoteProtocolError:
        assert codec.state is CodecState.ERROR
        return
    assert codec.state is CodecState.CLOSED


SMALL = Limits(max_window=50, max_frame=4096, max_inflated=64 * 1024, max_ratio=100, max_depth=2)
_prefixes = st.sampled_from([b"", b"2W\x00\x00\x00\x03", b"1W\x00\x00\x00\x02", b"2C", b"2A"])


@settings(max_examples=300, deadline=None)
@given(prefix=_prefixes, data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 400)))
def test_random_bytes_only_raise_remote_errors(prefix: bytes, data: bytes, cuts: list[int]) -> None:
    chunks = _chunked(prefix + data, cuts)
    _run(lambda: ServerCodec(SMALL), chunks)
    _run(ServerCodec, chunks)
    _run(ClientCodec, chunks)
    _run(lambda: ClientCodec(version=1), chunks)


@st.composite
def valid_streams(draw: st.DrawFn) -> tuple[bytes, list[tuple[int, int, bool]], list[Any]]:
    """Whole windows as the oracle builds them, plus what the codec must return."""
    version = draw(st.sampled_from([1, 2]))
    stream = b""
    expected: list[tuple[int, int, bool]] = []
    events: list[Any] = []
    for _ in range(draw(st.integers(1, 3))):
        items = draw(
            st.lists(
                st.tuples(
                    st.integers(0, 2**32 - 1),
                    st.one_of(
                        st.binary(max_size=40),
                        st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
                    ),
                ),
                max_size=8,
            )
        )
        frames = [
            j(version, seq, item) if isinstance(item, bytes) else d(version, seq, item)
            for seq, item in items
        ]
        # Group the data frames into bare runs and C frames (some nested).
        body = b""
        i = 0
        while i < len(frames):
            n = draw(st.integers(1, len(frames) - i))
            group = b"".join(frames[i : i + n])
            how = draw(st.sampled_from(["bare", "c", "cc"]))
            level = draw(st.integers(0, 9))
            if how == "c":
                group = c(version, group, level)
            elif how == "cc":
                group = c(version, c(version, group, level), level)
            body += group
            i += n
        stream += w(version, len(items)) + body
        expected.append((version, max((seq for seq, _ in items), default=0), True))
        events.append(items)
    return stream, expected, events


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(built=valid_streams(), cuts=st.lists(st.integers(0, 2000), max_size=6))
def test_valid_streams_parse_in_any_chunks(
    built: tuple[bytes, list[tuple[int, int, bool]], list[Any]], cuts: list[int]
) -> None:
    stream, expected, events = built
    windows = feed(_chunked(stream, cuts))
    assert summary(windows) == expected
    assert [win.events for win in windows] == [list(items) for items in events]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    built=valid_streams(),
    mutations=st.lists(
        st.tuples(
            st.sampled_from(["flip", "insert", "delete"]),
            st.integers(0, 10**6),
            st.integers(0, 255),
        ),
        min_size=1,
        max_size=4,
    ),
    cuts=st.lists(st.integers(0, 2000), max_size=4),
)
def test_mutated_streams_only_raise_remote_errors(
    built: tuple[bytes, list[tuple[int, int, bool]], list[Any]],
    mutations: list[tuple[str, int, int]],
    cuts: list[int],
) -> None:
    data = bytearray(built[0])
    for kind, where, byte in mutations:
        at = where % (len(data) + 1)
        if kind == "insert":
            data.insert(at, byte)
        elif at < len(data):
            if kind == "flip":
                data[at] ^= byte or 1
            else:
                del data[at]
    chunks = _chunked(bytes(data), cuts)
    _run(lambda: ServerCodec(SMALL), chunks)
    _run(ServerCodec, chunks)


@settings(max_examples=150, deadline=None)
@given(
    version=st.sampled_from([1, 2]),
    payloads=st.lists(st.binary(max_size=300), max_size=40),
    level=st.integers(0, 9),
    data=st.data(),
)
def test_encode_window_round_trip(
    version: int, payloads: list[bytes], level: int, data: st.DataObject
) -> None:
    n = len(payloads)
    first_seq = data.draw(st.integers(0, 2**32 - max(n, 1)))
    (window,) = feed([encode_window(version, payloads, level, first_seq)])
    assert window.version == version
    assert window.size == n
    assert window.complete
    assert window.events == [(first_seq + i, p) for i, p in enumerate(payloads)]
    assert window.highest_seq == (first_seq + n - 1 if n else 0)


def test_the_codec_imports_no_io_library() -> None:
    code = (
        "import sys, protocols.lumberjack\n"
        "print(sorted({'trio', 'socket', 'asyncio'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", [name for name in PROBES if "C" in name or "zlib" in name])
def test_isal_and_zlib_inflaters_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ISA-L is used where installed, zlib elsewhere: every C-frame probe reads the same."""
    data, _ = PROBES[name]

    def outcome() -> Any:
        try:
            return feed([data], eof=False)
        except RemoteProtocolError:
            return RemoteProtocolError

    with_default = outcome()
    monkeypatch.setattr(codec_module, "_inflating", zlib)
    assert outcome() == with_default


def test_isal_is_the_inflater_where_installed() -> None:
    isal_zlib = pytest.importorskip("isal.isal_zlib")
    assert codec_module._inflating is isal_zlib
