"""Java's modified UTF-8 (``DataOutput.writeUTF``): vector 15, the edge cases, and an oracle.

The oracle below is the algorithm of ``java.io.DataOutputStream.writeUTF``
(each UTF-16 code unit on its own: 1..0x7F one byte, 0 and ..0x7FF two,
the rest three), written independently of ``protocols.segment.mutf8``.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from segment_vectors import VECTORS

from protocols.segment import mutf8
from protocols.segment.mutf8 import ModifiedUTF8Error, decode, encode, encode_utf


def java_write_utf(text: str) -> bytes:
    """What ``DataOutputStream.writeUTF`` writes, unit by unit."""
    units = text.encode("utf-16-be", "surrogatepass")
    out = bytearray()
    for i in range(0, len(units), 2):
        c = int.from_bytes(units[i : i + 2], "big")
        if 0x0001 <= c <= 0x007F:
            out.append(c)
        elif c <= 0x07FF:
            out += bytes((0xC0 | c >> 6, 0x80 | c & 0x3F))
        else:
            out += bytes((0xE0 | c >> 12, 0x80 | c >> 6 & 0x3F, 0x80 | c & 0x3F))
    return len(out).to_bytes(2, "big") + bytes(out)


def test_vector_15() -> None:
    text = "a\u0000é\U0001f600"
    assert encode_utf(text) == VECTORS["jutf_tricky"]
    assert encode_utf(text).hex() == "000b61c080c3a9eda0bdedb880"
    assert decode(VECTORS["jutf_tricky"][2:]) == text
    # What a plain UTF-8 encoder gives instead, and which must not decode.
    assert text.encode("utf-8").hex() == "6100c3a9f09f9880"
    with pytest.raises(ModifiedUTF8Error):
        decode(text.encode("utf-8"))


@pytest.mark.parametrize(
    ("text", "wire"),
    [
        ("", ""),
        ("abc", "616263"),
        ("\x00", "c080"),
        ("a\x00b", "61c08062"),
        ("\x7f", "7f"),
        ("\x80", "c280"),
        ("é", "c3a9"),
        ("\u07ff", "dfbf"),
        ("\u0800", "e0a080"),
        ("€", "e282ac"),
        ("\ud7ff", "ed9fbf"),  # the last character before the surrogates
        ("\ue000", "ee8080"),
        ("\uffff", "efbfbf"),
        ("\U00010000", "eda080edb080"),
        ("\U0001f600", "eda0bdedb880"),
        ("\U0010ffff", "edafbfedbfbf"),
        ("x\U0001f600\x00é", "78eda0bdedb880c080c3a9"),
    ],
)
def test_edge_cases(text: str, wire: str) -> None:
    raw = bytes.fromhex(wire)
    assert encode(text) == raw
    assert encode_utf(text) == len(raw).to_bytes(2, "big") + raw
    assert encode_utf(text) == java_write_utf(text)
    assert decode(raw) == text


def test_longest_strings() -> None:
    for text in ("a" * 65535, "é" * 32767 + "a", "€" * 21845, "\x00" * 32767 + "a"):
        wire = encode_utf(text)
        assert len(wire) == 2 + 65535
        assert wire[:2] == b"\xff\xff"
        assert decode(wire[2:]) == text
    for text in ("a" * 65536, "€" * 21846, "\x00" * 32768, "\U0001f600" * 10923):
        with pytest.raises(ModifiedUTF8Error, match="over 65535"):
            encode_utf(text)
    assert mutf8.MAX_ENCODED == 65535


@pytest.mark.parametrize(
    "wire",
    [
        "00",  # a raw NUL
        "6100",
        "f09f9880",  # a 4-byte sequence (standard UTF-8 for U+1F600)
        "f4",
        "ff",
        "eda0bd",  # a lone high surrogate
        "edb880",  # a lone low surrogate
        "edb880eda0bd",  # a pair in the wrong order
        "eda0bd61",
        "c181",  # overlong 'A'
        "e08080",  # overlong NUL in three bytes
        "c0",  # C0 without its 80
        "c081",
        "c3",  # cut short
        "e282",
        "80",  # a stray continuation byte
        "61c3",
    ],
)
def test_invalid_input_is_refused(wire: str) -> None:
    with pytest.raises(ModifiedUTF8Error):
        decode(bytes.fromhex(wire))


@pytest.mark.parametrize("text", ["\ud800", "a\udfff", "\udc00\ud800"])
def test_lone_surrogates_are_not_encoded(text: str) -> None:
    with pytest.raises(ModifiedUTF8Error, match="surrogate"):
        encode(text)


def test_decode_takes_any_buffer() -> None:
    raw = bytearray(b"xx\xc3\xa9yy")
    assert decode(memoryview(raw)[2:4]) == "é"
    assert decode(raw[2:4]) == "é"


@given(st.text(max_size=300))
def test_matches_java_and_round_trips(text: str) -> None:
    assert encode_utf(text) == java_write_utf(text)
    assert decode(encode(text)) == text


@given(st.binary(max_size=40))
def test_decode_never_fails_otherwise(data: bytes) -> None:
    try:
        text = decode(data)
    except ModifiedUTF8Error:
        return
    assert encode(text) == data  # what decodes is exactly what we would write
