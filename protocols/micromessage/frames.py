"""Micromessage2 frames to bytes and back: the frame layer, sans I/O.

The frame layer starts after the handshake, which has no flags byte and is
the codec's. One exception reaches it early: an ERROR frame may replace any
handshake step, and the codec tells it apart by bit ``0x04`` of the first
byte (a handshake's major version, 1, never has it) and hands it here.

Layout (all integers big-endian; ``len`` is 1 byte, or 4 with LARGE_PAYLOAD):

* MESSAGE   ``[flags][seq:u16][destLen:u8][dest][propsLen:u16][props][len][payload]``
* COMMAND   ``[flags|0x01][len][payload]``
* EXTENSION ``[flags|0x02][id:u8][len][payload]``
* ERROR     ``[flags|0x04][len][UTF-8 text]``

:func:`encode_frame` sets LARGE_PAYLOAD iff the payload is over 255 bytes
(for every kind) and cuts payloads over :data:`MAX_FRAGMENT` into CONTINUED
fragments; :class:`FrameDecoder` parses by offset, joins fragments, and
bounds what it holds: a frame announcing more than :data:`MAX_FRAGMENT` is
refused from its length field, before its bytes arrive.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from gateway.sdk import LocalProtocolError, ReceiveBuffer, RemoteProtocolError

from .events import (
    FLAG_NAMES,
    MAX_FRAGMENT,
    MAX_HEADER,
    MAX_PAYLOAD,
    MAX_SMALL_LENGTH,
    RESERVED_BITS,
    SEQUENCE,
    TYPE_BITS,
    Command,
    Error,
    Extension,
    Flags,
    Frame,
    Message,
)

try:  # the same two loops in C, when built (see _speedups.c)
    from . import _speedups
except ImportError:  # pragma: no cover - a build without a C compiler
    _speedups = None

__all__ = ["FrameDecoder", "encode_frame", "encode_messages"]

_U16: Final = struct.Struct(">H")
_U32: Final = struct.Struct(">I")
_KIND: Final = {Message: 0, Command: 1, Extension: 2, Error: 4}
_LARGE: Final = int(Flags.LARGE_PAYLOAD)
#: Each length byte, made once.
_BYTE: Final = [bytes((i,)) for i in range(256)]
#: A MESSAGE frame's flags, seq and destination length.
_HEAD: Final = struct.Struct(">BHB")


def _payload_of(frame: Frame) -> bytes:
    """The payload bytes of ``frame`` (an ERROR's text in UTF-8)."""
    if isinstance(frame, Error):
        return frame.message.encode("utf-8")
    return frame.payload


def _ascii(text: str, what: str, limit: int) -> bytes:
    """``text`` as ASCII of at most ``limit`` bytes, else LocalProtocolError."""
    try:
        raw = text.encode("ascii")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"{what} must be ASCII: {text!r}") from exc
    if len(raw) > limit:
        raise LocalProtocolError(f"{what} is {len(raw)} bytes, at most {limit}")
    return raw


def _check(frame: Frame) -> None:
    """Refuse a frame no peer may receive (LocalProtocolError)."""
    if isinstance(frame, Message) and frame.seq not in SEQUENCE:
        raise LocalProtocolError(f"sequence number {frame.seq} is outside 1..65535")
    if isinstance(frame, Extension) and not 1 <= frame.ext_id <= 255:
        raise LocalProtocolError(f"extension id {frame.ext_id} is outside 1..255")


def _length(n: int) -> tuple[int, bytes]:
    """The LARGE_PAYLOAD bit and the length field for an ``n``-byte payload."""
    if n > MAX_SMALL_LENGTH:
        return Flags.LARGE_PAYLOAD, _U32.pack(n)
    return 0, bytes((n,))


def _encode_one(frame: Frame, chunk: bytes, first: bool, more: bool) -> bytes:
    """One fragment of ``frame`` carrying ``chunk``; only the first names a destination."""
    large, length = _length(len(chunk))
    flags = _KIND[type(frame)] | large | (Flags.CONTINUED if more else 0)
    head = bytearray((flags,))
    if isinstance(frame, Message):
        dest = _ascii(frame.destination, "destination", 255) if first else b""
        props = _ascii(frame.properties, "properties", 65535) if first else b""
        head += _U16.pack(frame.seq) + bytes((len(dest),)) + dest
        head += _U16.pack(len(props)) + props
    elif isinstance(frame, Extension):
        head.append(frame.ext_id)
    return bytes(head + length + chunk)


def encode_frame(frame: Frame, *, max_fragment: int = MAX_FRAGMENT) -> bytes:
    """The bytes of ``frame``: one frame, or CONTINUED fragments of ``max_fragment`` bytes.

    Fragments of a MESSAGE share its sequence number; only the first carries
    the destination and properties. Raises LocalProtocolError for a frame
    outside the protocol's ranges.
    """
    _check(frame)
    if not 1 <= max_fragment <= MAX_FRAGMENT:
        raise LocalProtocolError(f"max_fragment {max_fragment} is outside 1..{MAX_FRAGMENT}")
    payload = _payload_of(frame)
    if len(payload) <= max_fragment:
        return _encode_one(frame, payload, True, False)
    starts = range(0, len(payload), max_fragment)
    last = starts[-1]
    return b"".join(
        _encode_one(frame, payload[s : s + max_fragment], s == 0, s != last) for s in starts
    )


def encode_messages(
    first: int, items: Iterable[tuple[str, str, bytes]], *, max_fragment: int = MAX_FRAGMENT
) -> tuple[bytes, list[int]]:
    """MESSAGE frames numbered from ``first`` (wrapping) for ``items`` of (destination,
    properties, payload), as one run of bytes and the offset where each frame ends:
    :func:`encode_frame` for each, made faster for the usual case (one fragment)."""
    if _speedups is not None:
        if not isinstance(items, list | tuple):
            items = list(items)
        done = _speedups.encode_messages(first, items, max_fragment)
        if done is not None:
            return done
    return _encode_messages(first, items, max_fragment)


def _encode_messages(
    first: int, items: Iterable[tuple[str, str, bytes]], max_fragment: int
) -> tuple[bytes, list[int]]:
    """:func:`encode_messages` in Python: every case, and every refusal."""
    parts: list[bytes] = []
    ends: list[int] = []
    total = 0
    seq = first
    last_dest: str | None = None
    dest = b""
    dlen = 0
    head, u16, u32 = _HEAD.pack, _U16.pack, _U32.pack
    for destination, properties, payload in items:
        n = len(payload)
        if n > max_fragment or not 0 < seq <= 0xFFFF:
            wire = encode_frame(
                Message(seq, destination, properties, payload), max_fragment=max_fragment
            )
            parts.append(wire)
            total += len(wire)
        else:
            if destination != last_dest:
                dest, last_dest = _ascii(destination, "destination", 255), destination
                dlen = len(dest)
            props = _ascii(properties, "properties", 65535) if properties else b""
            if n > MAX_SMALL_LENGTH:
                parts += (head(_LARGE, seq, dlen), dest, u16(len(props)), props, u32(n), payload)
                total += 10 + dlen + len(props) + n
            else:
                parts += (head(0, seq, dlen), dest, u16(len(props)), props, _BYTE[n], payload)
                total += 7 + dlen + len(props) + n
        ends.append(total)
        seq = seq + 1 if seq < 0xFFFF else 1
    return b"".join(parts), ends


@dataclass(frozen=True, slots=True)
class _Raw:
    """One parsed frame (maybe a fragment), before fragments are joined."""

    flags: int
    seq: int
    ext_id: int
    destination: str
    properties: str
    payload: bytes
    at: int  # offset of its flags byte in the stream

    @property
    def kind(self) -> int:
        return self.flags & TYPE_BITS

    @property
    def more(self) -> bool:
        return bool(self.flags & Flags.CONTINUED)


def _check_flags(flags: int, at: int) -> None:
    """Reject reserved bits and more than one kind bit."""
    if flags & RESERVED_BITS:
        raise RemoteProtocolError(
            f"byte {at} (flags 0x{flags:02x}): reserved bits 0x{flags & RESERVED_BITS:02x} set"
        )
    if flags & TYPE_BITS not in FLAG_NAMES:
        raise RemoteProtocolError(
            f"byte {at} (flags 0x{flags:02x}): more than one of COMMAND/EXTENSION/ERROR set"
        )


def _text(data: bytearray, start: int, n: int, what: str, at: int) -> str:
    """``n`` bytes at ``start`` as ASCII, else RemoteProtocolError naming the byte."""
    raw = bytes(data[start : start + n])
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(
            f"byte {at + exc.start} (0x{raw[exc.start]:02x}): {what} must be ASCII"
        ) from exc


def _message_head(data: bytearray, p: int, end: int, base: int) -> tuple[int, str, str, int] | None:
    """A MESSAGE's seq, destination and properties from ``p``; None: incomplete."""
    if end - p < 3:
        return None
    seq = _U16.unpack_from(data, p)[0]
    if seq == 0:
        raise RemoteProtocolError(f"byte {base + p} (0x0000): sequence number 0 is never sent")
    dlen = data[p + 2]
    p += 3
    if end - p < dlen + 2:
        return None
    dest = _text(data, p, dlen, "the destination", base + p)
    p += dlen
    plen = _U16.unpack_from(data, p)[0]
    p += 2
    if end - p < plen:
        return None
    props = _text(data, p, plen, "the properties", base + p)
    return seq, dest, props, p + plen


def _payload_length(
    data: bytearray, p: int, end: int, flags: int, base: int, cap: int
) -> tuple[int, int] | None:
    """The payload length at ``p`` and the offset after it; None: incomplete."""
    at = base + p
    if flags & Flags.LARGE_PAYLOAD:
        if end - p < 4:
            return None
        n, p = _U32.unpack_from(data, p)[0], p + 4
    else:
        if end - p < 1:
            return None
        n, p = data[p], p + 1
    if n > cap:
        raise RemoteProtocolError(
            f"byte {at} (length {n}): a frame's payload is at most {cap} bytes;"
            " longer payloads must be sent as CONTINUED fragments"
        )
    return n, p


def _parse_frame(
    data: bytearray, pos: int, end: int, base: int, cap: int
) -> tuple[_Raw, int] | None:
    """The frame (or fragment) at ``data[pos:end]`` and the offset after it; None: incomplete.

    ``base`` is the stream offset of ``data[0]`` (for error messages); ``cap``
    the largest payload accepted. Raises RemoteProtocolError naming the byte.
    """
    if pos >= end:
        return None
    flags, at, p = data[pos], base + pos, pos + 1
    _check_flags(flags, at)
    seq, ext_id, dest, props = 0, 0, "", ""
    if flags & TYPE_BITS == 0:
        head = _message_head(data, p, end, base)
        if head is None:
            return None
        seq, dest, props, p = head
    elif flags & Flags.EXTENSION:
        if p >= end:
            return None
        ext_id, p = data[p], p + 1
        if ext_id == 0:
            raise RemoteProtocolError(f"byte {base + p - 1} (0x00): extension ids start at 1")
    sized = _payload_length(data, p, end, flags, base, cap)
    if sized is None:
        return None
    n, p = sized
    if end - p < n:
        return None
    return _Raw(flags, seq, ext_id, dest, props, bytes(data[p : p + n]), at), p + n


def _scan_messages(
    data: bytes | bytearray, pos: int, limit: int, cap: int, message_type: type[Message]
) -> tuple[list[Message], int]:
    """Up to ``limit`` plain MESSAGE frames from ``data[pos:]`` as ``message_type``
    (flags 0 or LARGE_PAYLOAD, seq not 0, ASCII text, a payload of at most ``cap``
    bytes), and where they end: :meth:`FrameDecoder.next_messages` in Python. Stops
    before the first frame that is anything else or not whole yet."""
    p = pos
    end = len(data)
    out: list[Message] = []
    last_raw = b""
    last_dest = ""
    head, u32 = _HEAD.unpack_from, _U32.unpack_from
    new = tuple.__new__
    while p < end - 3 and len(out) < limit:
        flags, seq, dlen = head(data, p)
        q = p + 4 + dlen
        if flags & ~_LARGE or not seq or q + 2 > end:
            break
        plen = data[q] << 8 | data[q + 1]
        r = q + 2 + plen
        if flags:
            if r + 4 > end:
                break
            n = u32(data, r)[0]
            r += 4
        else:
            if r >= end:
                break
            n = data[r]
            r += 1
        if n > cap or r + n > end:
            break
        try:
            if dlen != len(last_raw) or not data.startswith(last_raw, p + 4):
                last_raw = bytes(data[p + 4 : q])
                last_dest = last_raw.decode("ascii")
            props = data[q + 2 : q + 2 + plen].decode("ascii") if plen else ""
        except UnicodeDecodeError:
            break
        out.append(new(message_type, (seq, last_dest, props, bytes(data[r : r + n]))))
        p = r + n
    return out, p


#: The scan :meth:`FrameDecoder.next_messages` uses: C's when built, else Python's.
scan_messages = _scan_messages if _speedups is None else _speedups.scan_messages


class FrameDecoder:
    """Whole frames out of received bytes, one direction of one connection.

    It parses in place from a :class:`ReceiveBuffer`: its own, filled by
    :meth:`feed`, or a codec's (``buffer=``), which the codec read the
    handshake from first; the decoder starts at the buffer's current
    position. :meth:`next_frame` returns the next whole frame, or None until
    more bytes come (NEED_DATA). CONTINUED fragments are joined: a MESSAGE's
    later fragments must repeat its sequence number and carry no destination
    or properties, and no other MESSAGE may start before its last fragment;
    other kinds may interleave. What it holds is bounded: one frame's payload
    by ``max_fragment`` (refused from its length field), all fragments being
    joined by ``max_payload``, and the unparsed bytes :meth:`feed` takes by
    :attr:`max_buffer` (feeding past it without draining is the caller's
    error).

    ``extension_count`` (None: any id 1..255, as a relay forwarding unknown
    extensions needs) refuses EXTENSION frames above the negotiated count.
    Errors name a byte by its offset in the stream: ``offset`` is that of
    the first byte the decoder parses (the handshake's length, for a codec
    that wants offsets from the connection's start).
    """

    def __init__(
        self,
        *,
        buffer: ReceiveBuffer | None = None,
        offset: int = 0,
        max_fragment: int = MAX_FRAGMENT,
        max_payload: int = MAX_PAYLOAD,
        extension_count: int | None = None,
    ) -> None:
        self.buffer = ReceiveBuffer() if buffer is None else buffer
        self.max_fragment = max_fragment
        self.max_payload = max_payload
        self.extension_count = extension_count
        #: The most unparsed bytes :meth:`feed` holds: two of the largest frames.
        self.max_buffer = 2 * (MAX_HEADER + max_fragment)
        self._base = offset - self.buffer.pos  # stream offset of buffer.data[0]
        self._pending: dict[tuple[int, int], tuple[_Raw, bytearray]] = {}
        #: Payload bytes of fragments waiting for their last one.
        self.joining = 0

    @property
    def held(self) -> int:
        """Bytes held: unparsed ones and fragments waiting for their last."""
        return len(self.buffer) + self.joining

    def feed(self, data: bytes) -> None:
        """Append received bytes (LocalProtocolError past :attr:`max_buffer`).

        ``b""`` adds nothing: when the peer closes, call :meth:`check_eof`.
        """
        if not data:
            return
        if len(self.buffer) + len(data) > self.max_buffer:
            raise LocalProtocolError(
                f"over {self.max_buffer} unparsed bytes: drain next_frame() before feeding more"
            )
        self.buffer.feed(data)

    def next_frame(self) -> Frame | None:
        """The next whole frame, or None until more bytes are fed."""
        buffer = self.buffer
        while True:
            data = buffer.data
            parsed = _parse_frame(data, buffer.pos, len(data), self._base, self.max_fragment)
            if parsed is None:
                return None
            raw, end = parsed
            before = len(data)
            buffer.advance(end)
            self._base += before - len(buffer.data)  # what advance() dropped
            self._check_extension(raw)
            frame = self._join(raw)
            if frame is not None:
                return frame

    def next_messages(self, limit: int) -> list[Message]:
        """Up to ``limit`` whole MESSAGE frames from the buffer in one pass, for speed.

        Only plain ones (no CONTINUED, nothing being joined, ASCII text, a length
        within the cap): it stops at the first frame that is anything else or is
        not whole yet, which :meth:`next_frame` then takes (and refuses, if it is bad).
        """
        if self._pending:
            return []
        buffer = self.buffer
        out, end = scan_messages(buffer.data, buffer.pos, limit, self.max_fragment, Message)
        if out:
            self._advance(end)
        return out

    def _advance(self, pos: int) -> None:
        """Parsed up to ``pos`` of the buffer's data."""
        buffer = self.buffer
        before = len(buffer.data)
        buffer.advance(pos)
        self._base += before - len(buffer.data)

    def check_eof(self) -> None:
        """The peer closed: RemoteProtocolError if it stopped inside a frame or a payload."""
        if len(self.buffer) or self._pending:
            raise RemoteProtocolError(
                f"connection closed at byte {self._base + len(self.buffer.data)} inside a frame"
                f" ({self.held} bytes of it received)"
            )

    def _check_extension(self, raw: _Raw) -> None:
        count = self.extension_count
        if raw.kind == Flags.EXTENSION and count is not None and raw.ext_id > count:
            raise RemoteProtocolError(
                f"byte {raw.at + 1} (0x{raw.ext_id:02x}): extension id {raw.ext_id},"
                f" but {count} extensions were negotiated"
            )

    def _join(self, raw: _Raw) -> Frame | None:
        """The whole frame once ``raw`` is its last fragment; None before.

        A payload being joined is one ``bytearray`` after its first fragment,
        so even empty fragments cannot grow what is held.
        """
        key = (raw.kind, raw.ext_id)
        joined = self._pending.get(key)
        if joined is None and not raw.more:
            return _build(raw, raw.payload)
        if joined is None:
            joined = self._pending[key] = (raw, bytearray())
        elif raw.kind == 0:
            _check_message_fragment(raw, joined[0])
        self.joining += len(raw.payload)
        if self.joining > self.max_payload:
            raise RemoteProtocolError(
                f"byte {raw.at}: fragments being joined pass {self.max_payload} bytes"
            )
        first, payload = joined
        payload += raw.payload
        if raw.more:
            return None
        del self._pending[key]
        self.joining -= len(payload)
        return _build(first, bytes(payload))


def _check_message_fragment(raw: _Raw, first: _Raw) -> None:
    """Refuse a MESSAGE fragment that does not continue the one ``first`` started."""
    if raw.seq != first.seq:
        raise RemoteProtocolError(
            f"byte {raw.at + 1}: MESSAGE {raw.seq} starts before the last fragment"
            f" of MESSAGE {first.seq}"
        )
    if raw.destination or raw.properties:
        raise RemoteProtocolError(
            f"byte {raw.at + 3}: a later fragment of MESSAGE {raw.seq}"
            " carries a destination or properties"
        )


def _build(raw: _Raw, payload: bytes) -> Frame:
    """The frame ``raw`` (its first fragment) starts, with the joined ``payload``."""
    kind = raw.kind
    if kind == 0:
        return Message(raw.seq, raw.destination, raw.properties, payload)
    if kind == Flags.COMMAND:
        return Command(payload)
    if kind == Flags.EXTENSION:
        return Extension(raw.ext_id, payload)
    return Error(payload.decode("utf-8", errors="replace"))
