"""Lumberjack v1/v2 wire constants and frame encoders (no I/O, no state).

Every frame is a version byte (``'1'`` or ``'2'``), a type byte and a
payload whose integers are unsigned 32-bit big-endian::

    W  count                                  window: count data frames follow
    J  seq  len  <len bytes of JSON>          v2 data
    D  seq  pairs  (klen key vlen value)*     v1 data (string -> string)
    C  len  <len bytes of a zlib stream>      whole frames, compressed
    A  seq                                    ack (the only frame a reader sends)

The encoders here build those bytes; :func:`encode_window` builds a whole
Beats-style window (``W n`` + one ``C`` of ``J`` frames) in one join, and is
what :class:`~protocols.lumberjack.ClientCodec` sends. The decoders live in
:mod:`protocols.lumberjack.codec`.
"""

from __future__ import annotations

import struct
import types
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from gateway.sdk import LocalProtocolError

_isal_zlib: types.ModuleType | None
try:  # ISA-L deflates about 7 times faster than zlib (see deflate)
    from isal import isal_zlib as _isal_zlib
except ImportError:  # pragma: no cover - a platform without an isal wheel
    _isal_zlib = None

__all__ = [
    "FRAME_ACK",
    "FRAME_COMPRESSED",
    "FRAME_DATA",
    "FRAME_JSON",
    "FRAME_WINDOW",
    "HEADER6",
    "HEADER10",
    "MAX_U32",
    "U32",
    "VERSION_1",
    "VERSION_2",
    "compressed_frame",
    "data_frame",
    "deflate",
    "encode_ack",
    "encode_window",
    "json_frame",
    "window_frame",
]

#: Version bytes: ASCII ``'1'`` and ``'2'``.
VERSION_1: Final = 0x31
VERSION_2: Final = 0x32
#: Frame type bytes: ASCII ``W``, ``J``, ``D``, ``C``, ``A``.
FRAME_WINDOW: Final = 0x57
FRAME_JSON: Final = 0x4A
FRAME_DATA: Final = 0x44
FRAME_COMPRESSED: Final = 0x43
FRAME_ACK: Final = 0x41
MAX_U32: Final = 0xFFFFFFFF

#: version, type, u32: ``W``, ``C`` and ``A`` frames (and their headers).
HEADER6: Final = struct.Struct(">BBI")
#: version, type, u32, u32: the fixed part of ``J`` and ``D`` frames.
HEADER10: Final = struct.Struct(">BBII")
U32: Final = struct.Struct(">I")


def _version_byte(version: int) -> int:
    if version not in (1, 2):
        raise LocalProtocolError(f"Lumberjack version must be 1 or 2, not {version!r}")
    return version + 0x30


def _u32(value: int, what: str) -> int:
    if not 0 <= value <= MAX_U32:
        raise LocalProtocolError(f"{what} {value} does not fit in 32 bits")
    return value


def window_frame(version: int, size: int) -> bytes:
    """``W size``: the next ``size`` data frames form one window."""
    return HEADER6.pack(_version_byte(version), FRAME_WINDOW, _u32(size, "window size"))


def json_frame(version: int, seq: int, payload: bytes) -> bytes:
    """``J seq len payload`` (the payload is sent as it is, not checked to be JSON)."""
    return (
        HEADER10.pack(
            _version_byte(version),
            FRAME_JSON,
            _u32(seq, "sequence number"),
            _u32(len(payload), "J length"),
        )
        + payload
    )


def data_frame(version: int, seq: int, fields: Mapping[str, str]) -> bytes:
    """``D seq pairs (klen key vlen value)*`` with UTF-8 keys and values."""
    parts = [
        HEADER10.pack(_version_byte(version), FRAME_DATA, _u32(seq, "sequence number"), len(fields))
    ]
    for key, value in fields.items():
        for text in (key, value):
            raw = text.encode("utf-8")
            parts.append(U32.pack(_u32(len(raw), "string length")))
            parts.append(raw)
    return b"".join(parts)


def deflate(data: bytes, level: int) -> bytes:
    """``data`` as a zlib stream, at a zlib ``level`` of 1 to 9.

    Where ISA-L is installed it compresses, about 7 times faster than zlib at
    level 3 and a little smaller: levels 1-3 use its level 1, 4-6 its 2 and
    7-9 its 3. Any zlib reader inflates the result.
    """
    if _isal_zlib is not None:
        return bytes(_isal_zlib.compress(data, (min(max(level, 1), 9) + 2) // 3))
    return zlib.compress(data, level)


def compressed_frame(version: int, frames: bytes, level: int = 3) -> bytes:
    """``C len zlib(frames)``: ``frames`` must be whole frames."""
    packed = deflate(frames, level)
    header = HEADER6.pack(_version_byte(version), FRAME_COMPRESSED, _u32(len(packed), "C length"))
    return header + packed


def encode_ack(version: int, seq: int) -> bytes:
    """``A seq``: 6 bytes, e.g. ``encode_ack(2, 5) == b"2A\\x00\\x00\\x00\\x05"``."""
    return HEADER6.pack(_version_byte(version), FRAME_ACK, _u32(seq, "sequence number"))


def encode_window(
    version: int,
    payloads: Sequence[bytes],
    compression_level: int = 3,
    first_seq: int = 1,
    *,
    compress: Callable[[bytes, int], bytes] = deflate,
) -> bytes:
    """One window as Beats sends it: ``W n`` + one ``C`` holding ``n`` ``J`` frames.

    The ``J`` frames are numbered ``first_seq .. first_seq + n - 1``. Level 0
    sends the ``J`` frames bare (no ``C``); an empty window is ``W 0`` alone.
    ``compress(frames, level)`` makes the ``C`` payload (``zlib.compress`` for
    exactly what Beats sends).
    """
    vb = _version_byte(version)
    n = len(payloads)
    head = HEADER6.pack(vb, FRAME_WINDOW, _u32(n, "window size"))
    if not n:
        return head
    _u32(first_seq, "sequence number")
    _u32(first_seq + n - 1, "sequence number")
    if not 0 <= compression_level <= 9:
        raise LocalProtocolError(f"compression level must be 0..9, not {compression_level}")
    pack = HEADER10.pack
    parts: list[bytes] = []
    append = parts.append
    for seq, payload in enumerate(payloads, first_seq):
        append(pack(vb, FRAME_JSON, seq, len(payload)))
        append(payload)
    frames = b"".join(parts)
    if not compression_level:
        return head + frames
    packed = compress(frames, compression_level)
    return b"".join(
        (head, HEADER6.pack(vb, FRAME_COMPRESSED, _u32(len(packed), "C length")), packed)
    )
