"""Event framing: what a record holds."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.store import frame_events, split_events
from gateway.store.records import count_events


def test_framing_is_pravegas_big_endian_event() -> None:
    assert frame_events([b"ab", b""]) == b"\0\0\0\0\0\0\0\x02ab" + b"\0" * 8


@given(st.lists(st.binary(max_size=300), max_size=20))
def test_split_inverts_frame(payloads: list[bytes]) -> None:
    framed = frame_events(payloads)
    assert split_events(framed) == payloads
    assert split_events(memoryview(framed)) == payloads
    assert count_events(framed) == len(payloads)


@pytest.mark.parametrize(
    "data",
    [
        b"\0\0\0\0\0\0\0",  # a partial header
        struct.pack(">ii", 0, 5) + b"abcd",  # a payload cut short
        struct.pack(">ii", 1, 0),  # a type other than Event
        struct.pack(">ii", 0, -1),  # a negative length
        frame_events([b"x"]) + b"\0",  # bytes left over
    ],
)
def test_bad_framing_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        split_events(data)
    with pytest.raises(ValueError):
        count_events(data)
