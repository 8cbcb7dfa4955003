"""Java's modified UTF-8, the text encoding of ``DataOutput.writeUTF``.

Every string of the segment-append protocol (segment names, tokens, hosts,
stack traces) is a 2-byte unsigned length followed by at most 65535 bytes of
modified UTF-8. It differs from UTF-8 in two ways, so ``str.encode("utf-8")``
is wrong for it:

* U+0000 is the two bytes ``C0 80``, so the encoded text never holds a zero byte;
* a character above U+FFFF is its UTF-16 surrogate pair, each surrogate
  encoded as three bytes (CESU-8), never a 4-byte sequence.

Decoding is strict: a raw zero byte, a 4-byte sequence, an overlong form
other than ``C0 80``, a lone surrogate or a truncated sequence is refused
with :class:`ModifiedUTF8Error` (Java's ``readUTF`` is laxer; the gateway
keeps names it can store and log). Encoding refuses lone surrogates for
the same reason.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_ENCODED", "ModifiedUTF8Error", "decode", "encode", "encode_utf"]

#: Most bytes a ``writeUTF`` string may encode to (its length prefix is 16 bits).
MAX_ENCODED: Final = 0xFFFF

#: Bytes that never occur in modified UTF-8: a raw zero, and the lead bytes of
#: 4-byte (and longer) sequences.
_FORBIDDEN: Final = re.compile(rb"[\x00\xf0-\xff]")
_SUPPLEMENTARY: Final = re.compile("[\U00010000-\U0010ffff]")


class ModifiedUTF8Error(ValueError):
    """Bytes that are not modified UTF-8, or text that cannot be written as it."""


def _surrogate_pair(match: re.Match[str]) -> str:
    code = ord(match.group()) - 0x10000
    return chr(0xD800 | code >> 10) + chr(0xDC00 | code & 0x3FF)


def encode(text: str) -> bytes:
    """``text`` as modified UTF-8 (without the length prefix)."""
    if text.isascii() and "\x00" not in text:
        return text.encode("ascii")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ModifiedUTF8Error(f"text holds a lone surrogate: {e}") from None
    if not _FORBIDDEN.search(raw):
        return raw  # no NUL and nothing above U+FFFF: UTF-8 and modified UTF-8 agree
    split = _SUPPLEMENTARY.sub(_surrogate_pair, text)
    return split.encode("utf-8", "surrogatepass").replace(b"\x00", b"\xc0\x80")


def encode_utf(text: str) -> bytes:
    """``text`` as ``writeUTF`` writes it: a 2-byte big-endian length, then the bytes."""
    raw = encode(text)
    if len(raw) > MAX_ENCODED:
        raise ModifiedUTF8Error(
            f"text encodes to {len(raw)} bytes of modified UTF-8, over {MAX_ENCODED}"
        )
    return len(raw).to_bytes(2, "big") + raw


def decode(data: bytes | bytearray | memoryview) -> str:
    """The text of modified UTF-8 ``data`` (without the length prefix), strictly."""
    raw = bytes(data)
    if raw.isascii():
        if b"\x00" in raw:
            raise ModifiedUTF8Error("a raw zero byte (U+0000 is written C0 80)")
        return raw.decode("ascii")
    bad = _FORBIDDEN.search(raw)
    if bad is not None:
        if bad.group() == b"\x00":
            raise ModifiedUTF8Error("a raw zero byte (U+0000 is written C0 80)")
        raise ModifiedUTF8Error(
            f"byte {bad.group()[0]:#04x} at {bad.start()}: 4-byte sequences are not"
            " modified UTF-8 (characters above U+FFFF are surrogate pairs)"
        )
    # C0 is never part of a valid sequence but C0 80, so this replaces exactly those.
    raw = raw.replace(b"\xc0\x80", b"\x00")
    try:
        text = raw.decode("utf-8", "surrogatepass")
        if b"\xed" in raw:  # surrogates: pairs become one character, lone ones fail
            text = text.encode("utf-16-be", "surrogatepass").decode("utf-16-be")
    except UnicodeDecodeError as e:
        raise ModifiedUTF8Error(f"not modified UTF-8: {e.reason}") from None
    return text
