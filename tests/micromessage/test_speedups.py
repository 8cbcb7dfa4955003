"""The optional C speedups of Micromessage2's frame layer against the Python code they
replace: for any bytes, the C scan takes exactly the frames the Python scan takes and
stops at the same byte; for any batch, the C framing gives the Python framing's bytes
or declines (and the Python code then frames or refuses the batch).

The module is built by ``pip install`` where a C compiler and Python's headers are
present (``.ci/test-deps`` installs them). Without it these tests fail, saying what to
install, unless ``INTERCHANGE_SKIP_SPEEDUPS=1`` says the build is meant to be without.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocols.micromessage import frames
from protocols.micromessage.events import MAX_FRAGMENT, Message
from protocols.micromessage.frames import FrameDecoder, encode_frame, encode_messages

SKIP_VARIABLE = "INTERCHANGE_SKIP_SPEEDUPS"


def _speedups() -> Any:
    module = frames._speedups
    if module is None:
        if os.environ.get(SKIP_VARIABLE) == "1":
            pytest.skip(f"{SKIP_VARIABLE}=1: built without the C speedups")
        pytest.fail(
            "protocols.micromessage._speedups is not built: install a C compiler and "
            "Python's headers (Debian: apt install gcc python3-dev), then "
            "`python -m pip install -e .` again (or set INTERCHANGE_SKIP_SPEEDUPS=1)"
        )
    return module


def test_the_decoder_uses_the_c_scan_when_built() -> None:
    assert frames.scan_messages is _speedups().scan_messages


_text = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=12)
_messages = st.builds(
    Message,
    st.integers(1, 0xFFFF),
    _text,
    _text,
    st.binary(max_size=300),
)


@st.composite
def _streams(draw: st.DrawFn) -> bytes:
    """Valid MESSAGE frames, maybe with bytes changed, cut or added: anything a peer
    could send, most of it close to what a scan must take."""
    wire = b"".join(encode_frame(m) for m in draw(st.lists(_messages, max_size=6)))
    data = bytearray(wire)
    for _ in range(draw(st.integers(0, 3))):
        if data:
            data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    cut = draw(st.integers(0, len(data)))
    return bytes(data[:cut]) + draw(st.binary(max_size=8))


@settings(max_examples=400)
@given(
    _streams(),
    st.integers(0, 40),
    st.integers(1, 8),
    st.sampled_from([0, 5, 255, 300, MAX_FRAGMENT]),
)
def test_c_scan_takes_what_python_takes(data: bytes, pos: int, limit: int, cap: int) -> None:
    scan = _speedups().scan_messages
    pos = min(pos, len(data))
    for buffer in (data, bytearray(data)):
        expected = frames._scan_messages(buffer, pos, limit, cap, Message)
        got = scan(buffer, pos, limit, cap, Message)
        assert got == expected
        assert all(type(m) is Message for m in got[0])


def test_c_scan_stops_at_the_first_frame_it_does_not_take() -> None:
    scan = _speedups().scan_messages
    plain = encode_frame(Message(7, "q", "k:v;", b"x"))
    command = bytes([0x01, 2]) + b"hi"
    data = plain + plain + command + plain
    assert scan(data, 0, 100, MAX_FRAGMENT, Message) == (
        [Message(7, "q", "k:v;", b"x")] * 2,
        2 * len(plain),
    )
    assert scan(data, 2 * len(plain), 100, MAX_FRAGMENT, Message) == ([], 2 * len(plain))


@pytest.mark.parametrize("size", [0, 5, 255, 256, 300])
def test_both_scans_take_a_payload_of_exactly_the_cap(size: int) -> None:
    scan = _speedups().scan_messages
    fits = encode_frame(Message(1, "d", "", b"x" * size))
    wire = fits + encode_frame(Message(2, "d", "", b"x" * (size + 1)))
    for each in (scan, frames._scan_messages):
        assert each(wire, 0, 10, size, Message) == ([Message(1, "d", "", b"x" * size)], len(fits))


def test_the_decoder_gives_the_same_frames_either_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole decoder, not only the scan, over a stream split at every byte."""
    _speedups()
    items = [(f"d{i % 3}", "" if i % 2 else "a:N1;", bytes([i]) * (i * 37)) for i in range(12)]
    wire, _ = encode_messages(65530, items)

    def decoded() -> list[Any]:
        out: list[Any] = []
        for split in range(len(wire) + 1):
            decoder = FrameDecoder()
            for piece in (wire[:split], wire[split:]):
                decoder.feed(piece)
                while batch := decoder.next_messages(5):
                    out += batch
                while (frame := decoder.next_frame()) is not None:
                    out.append(frame)
        return out

    with_c = decoded()
    monkeypatch.setattr(frames, "scan_messages", frames._scan_messages)
    assert decoded() == with_c
    assert len(with_c) == 12 * (len(wire) + 1)


_items = st.lists(
    st.tuples(
        st.text(max_size=6) | st.text(st.characters(max_codepoint=127), min_size=250, max_size=260),
        st.text(max_size=6),
        st.binary(max_size=300),
    ),
    max_size=5,
)


@settings(max_examples=300)
@given(st.integers(-2, 0x10001), _items, st.sampled_from([1, 100, 256, MAX_FRAGMENT]))
def test_c_framing_gives_python_bytes_or_declines(
    first: int, items: list[tuple[str, str, bytes]], max_fragment: int
) -> None:
    got = _speedups().encode_messages(first, items, max_fragment)
    try:
        expected = frames._encode_messages(first, items, max_fragment)
    except Exception:
        assert got is None  # the Python code refuses it: C must leave it to Python
        return
    if got is not None:
        assert got == expected
    assert encode_messages(first, items, max_fragment=max_fragment) == expected


def test_c_framing_takes_the_usual_batch() -> None:
    items = [("topic", "", b"p" * 256), ("topic", "k:v;", b"")] * 3
    expected = frames._encode_messages(65535, items, MAX_FRAGMENT)
    assert _speedups().encode_messages(65535, items, MAX_FRAGMENT) == expected


def test_c_framing_declines_what_it_does_not_handle() -> None:
    c = _speedups()
    assert c.encode_messages(1, [("d", "", b"x" * 11)], 10) is None  # fragments
    assert c.encode_messages(1, [("dé", "", b"")], MAX_FRAGMENT) is None  # not ASCII
    assert c.encode_messages(1, [("d" * 256, "", b"")], MAX_FRAGMENT) is None  # too long
    assert c.encode_messages(0, [("d", "", b"")], MAX_FRAGMENT) is None  # seq 0
    assert c.encode_messages(1, [("d", "", bytearray(b"x"))], MAX_FRAGMENT) is None
