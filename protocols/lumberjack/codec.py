"""The Lumberjack v1/v2 codec: windows of events parsed without doing any I/O.

:class:`ServerCodec` is the reader (Logstash) side: feed it received bytes
with :meth:`~ServerCodec.receive_data` (``b""`` means the peer closed), call
:meth:`~ServerCodec.next_event` until it returns :data:`NEED_DATA`, and turn
each :class:`Window` into an ``A`` frame with :meth:`~ServerCodec.send` once
its events are safe. :class:`ClientCodec` is the writer (Beats) side.
The window rules are those of DECISIONS.md §1: the ack carries the highest
sequence number seen, ``W 0`` is a window of its own, a new ``W`` flushes a
partial window, and data frames after a full window start a window of the
same ("sticky") size, as v1 streaming writers send ``W`` once.

Parsing strategy: received bytes go to one ``bytearray`` with a read offset
(compacted only when the offset passes half the buffer), and one loop,
:meth:`ServerCodec._parse`, reads frames from it with ``struct.unpack_from``
at an offset: no reslicing per frame and no object per event but the
``(seq, payload)`` tuple. A ``C`` frame is inflated only once all of it is
buffered, with ``decompressobj().decompress(data, max_length)`` in bounded
steps so that a zip bomb is refused after at most ``min(max_inflated,
max_ratio * len)`` bytes; the inflated bytes then go through the same loop
(recursively, for nested ``C``), where a frame cut short is an error; there
a run of whole ``J`` frames, the bulk of any Beats window, is read by a tight
inner loop that leaves every unusual frame to the general one. When a
frame is incomplete the loop records how many bytes it needs, so a large
frame arriving in small pieces is not re-parsed per piece; the length
fields of a ``D`` frame are scanned with a resumable cursor for the same
reason. Every length is checked against :class:`Limits` before anything is
allocated or buffered for it.

A peer breaking the protocol raises :class:`~gateway.errors.RemoteProtocolError`
and puts the codec in :attr:`State.ERROR`; the driver closes the connection
(Lumberjack has no error frame).
"""

from __future__ import annotations

import enum
import operator
import types
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from gateway.errors import LocalProtocolError, RemoteProtocolError

from .events import Ack, ConnectionClosed, Window
from .frames import (
    FRAME_ACK,
    FRAME_COMPRESSED,
    FRAME_DATA,
    FRAME_JSON,
    FRAME_WINDOW,
    HEADER10,
    U32,
    VERSION_1,
    VERSION_2,
    encode_ack,
    encode_window,
)

_inflating: types.ModuleType
try:  # ISA-L inflates zlib streams about twice as fast as zlib does
    from isal import isal_zlib as _inflating
except ImportError:  # pragma: no cover - a platform without an isal wheel
    _inflating = zlib

__all__ = ["NEED_DATA", "ClientCodec", "Limits", "ServerCodec", "State"]


class _NeedData:
    def __repr__(self) -> str:
        return "NEED_DATA"


#: Returned by ``next_event`` when no whole event has arrived yet.
NEED_DATA: Final = _NeedData()

_SEQ: Final = operator.itemgetter(0)

#: Largest piece inflated per ``decompress`` call (the bound is checked per piece).
_INFLATE_STEP: Final = 1 << 20


class State(enum.Enum):
    """Where a codec stands; both codecs use it (a client is never in ``WINDOW``)."""

    #: Open; for a server, no window is partly received.
    OPEN = "open"
    #: Server only: a window (or a frame) is partly received.
    WINDOW = "window"
    #: The peer closed its side and every event was returned.
    CLOSED = "closed"
    #: The peer broke the protocol; the connection must be closed.
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Limits:
    """What a server codec accepts; each is checked before anything is allocated."""

    #: Largest ``W`` (events per window).
    max_window: int = 10_000
    #: Largest ``J`` payload, ``D`` key/value data or ``C`` payload, in bytes.
    max_frame: int = 64 * 2**20
    #: Most bytes one ``C`` frame may inflate to ...
    max_inflated: int = 256 * 2**20
    #: ... and at most this many times its compressed size.
    max_ratio: int = 100
    #: Deepest ``C`` nesting: 1 allows ``C{J}``, 2 also ``C{C{J}}``.
    max_depth: int = 2

    def __post_init__(self) -> None:
        for name in ("max_window", "max_frame", "max_inflated", "max_ratio", "max_depth"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Limits.{name} must be a non-negative integer, not {value!r}")


_VERSION_NAMES: Final = {VERSION_1: 1, VERSION_2: 2}


def _bad_version(byte: int) -> RemoteProtocolError:
    return RemoteProtocolError(f"unknown Lumberjack version byte {byte:#04x}")


def _bad_type(byte: int) -> RemoteProtocolError:
    if byte == FRAME_ACK:
        return RemoteProtocolError("a writer may not send an ack (A) frame")
    return RemoteProtocolError(f"unknown Lumberjack frame type {byte:#04x}")


def _scan_data_frame(
    data: bytes | bytearray, p: int, end: int, r: int, blobs: int, max_frame: int
) -> tuple[int, int, int]:
    """Walk the length fields of the ``D`` frame at ``p``, from offset ``r``.

    ``blobs`` keys and values are left to skip. Returns ``(r, blobs, need)``:
    ``need == 0`` when the frame is whole (it ends at ``p + r``); otherwise the
    frame needs ``need`` bytes from ``p`` and ``(r, blobs)`` resumes the scan.
    """
    limit = max_frame + 10
    unpack = U32.unpack_from
    while blobs:
        if p + r + 4 > end:
            return r, blobs, r + 4
        r += 4 + unpack(data, p + r)[0]
        blobs -= 1
        if r + 4 * blobs > limit:  # the length fields still to come count too
            raise RemoteProtocolError(f"D frame longer than {max_frame} bytes")
    return r, 0, r if p + r > end else 0


def _decode_data_frame(data: bytes | bytearray, q: int, pairs: int) -> dict[str, str]:
    """The key/value pairs of a whole ``D`` frame whose pairs start at ``q``."""
    unpack = U32.unpack_from
    fields: dict[str, str] = {}
    try:
        for _ in range(pairs):
            n = unpack(data, q)[0]
            q += 4
            key = str(data[q : q + n], "utf-8")
            q += n
            n = unpack(data, q)[0]
            q += 4
            fields[key] = str(data[q : q + n], "utf-8")
            q += n
    except UnicodeDecodeError as e:
        raise RemoteProtocolError(f"D frame string is not UTF-8: {e}") from None
    return fields


class _Receiver:
    """The receive buffer both roles share: bytes in, ``b""`` for the end of input."""

    def __init__(self) -> None:
        self._state = State.OPEN
        self._eof = False
        self._buf = bytearray()
        self._pos = 0

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes; ``b""`` means the peer closed its sending side."""
        if not data:
            self._eof = True
        elif self._eof:
            raise LocalProtocolError("data received after end of input")
        elif self._state is State.OPEN:
            self._buf += data


class ServerCodec(_Receiver):
    """The reader side of one Lumberjack connection (v1 and v2 alike).

    ::

        codec.receive_data(data)              # b"" once the peer closed
        while (event := codec.next_event()) is not NEED_DATA:
            ...                               # a Window, or ConnectionClosed
        wire = codec.send(Ack(window.version, window.highest_seq))
    """

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__()
        self.limits = Limits() if limits is None else limits
        #: Bytes needed from ``_pos`` before parsing can make progress.
        self._need = 1
        #: Resume point ``(offset, blobs left)`` of a partly received ``D`` frame.
        self._dscan: tuple[int, int] | None = None
        self._ready: deque[Window] = deque()
        # The window being received; ``_remaining == 0`` means none is.
        self._events: list[tuple[int, bytes | dict[str, str]]] = []
        self._remaining = 0
        self._highest = 0
        self._win_version = VERSION_2
        self._win_size = 0
        #: Size of the last non-empty ``W``: data frames after a full window
        #: start a window of this size. 0 while no ``W`` was seen.
        self._sticky = 0
        #: Bytes inflated from ``C`` frames so far (for metrics).
        self.inflated_bytes = 0

    @property
    def state(self) -> State:
        if self._state is State.OPEN and self.in_window:
            return State.WINDOW
        return self._state

    @property
    def in_window(self) -> bool:
        """True while a window or a frame is partly received (time it out)."""
        return self._state is State.OPEN and (self._remaining > 0 or len(self._buf) > self._pos)

    # -- input ----------------------------------------------------------------
    def next_event(self) -> Window | ConnectionClosed | _NeedData:
        """The next whole window, :class:`ConnectionClosed`, or :data:`NEED_DATA`.

        After the end of input, a partly received window is dropped (it must
        not be acked) and :class:`ConnectionClosed` is returned, every time.
        """
        if self._state is State.ERROR:
            raise LocalProtocolError("the connection is in the ERROR state")
        ready = self._ready
        if ready:
            return ready.popleft()
        if self._state is State.CLOSED:
            return ConnectionClosed()
        buf = self._buf
        pos = self._pos
        if len(buf) - pos >= self._need:
            try:
                pos = self._parse(buf, pos, len(buf), 0)
            except RemoteProtocolError:
                self._fail()
                raise
            if pos > len(buf) >> 1:
                del buf[:pos]
                pos = 0
            self._pos = pos
            if ready:
                return ready.popleft()
        if self._eof:
            self._state = State.CLOSED
            self._discard()
            return ConnectionClosed()
        return NEED_DATA

    def _fail(self) -> None:
        self._state = State.ERROR
        self._discard()
        self._ready.clear()

    def _discard(self) -> None:
        self._buf = bytearray()
        self._pos = 0
        self._events = []
        self._remaining = 0
        self._dscan = None

    # -- output ---------------------------------------------------------------
    def send(self, event: Ack) -> bytes:
        """The 6 bytes of ``event``'s ``A`` frame.

        Allowed in every state: a window already returned stays valid (and
        ackable) even if the input after it was bad.
        """
        if not isinstance(event, Ack):
            raise LocalProtocolError(f"a Lumberjack server only sends Ack, not {event!r}")
        return encode_ack(event.version, event.seq)

    # -- parsing ----------------------------------------------------------------
    def _parse(self, data: bytes | bytearray, p: int, end: int, depth: int) -> int:
        """Read whole frames from ``data[p:end]``; return where reading stopped.

        ``depth`` 0: ``data`` is the receive buffer; stop after a window is
        ready or at an incomplete frame (setting ``_need``). ``depth`` ≥ 1:
        ``data`` is an inflated ``C`` payload, read to its end, where a cut
        frame is an error. The window in progress lives in locals here and
        is saved to ``self`` around nested ``C`` frames and on the way out.
        """
        limits = self.limits
        max_frame = limits.max_frame
        ready = self._ready
        events = self._events
        remaining = self._remaining
        highest = self._highest
        win_version = self._win_version
        win_size = self._win_size
        sticky = self._sticky
        top = depth == 0
        unpack10 = HEADER10.unpack_from
        append = events.append
        need = 0
        while True:
            avail = end - p
            if avail >= 10:
                ver, typ, a, b = unpack10(data, p)
                if ver != VERSION_2 and ver != VERSION_1:
                    raise _bad_version(ver)
            else:  # the last few bytes: a short frame (W, C header) or a cut one
                if not avail:
                    need = 1
                    break
                ver = data[p]
                if ver != VERSION_2 and ver != VERSION_1:
                    raise _bad_version(ver)
                if avail < 2:
                    need = 2
                    break
                typ = data[p + 1]
                a = b = 0
                if typ in (FRAME_WINDOW, FRAME_COMPRESSED):
                    if avail < 6:
                        need = 6
                        break
                    a = U32.unpack_from(data, p + 2)[0]
                elif typ in (FRAME_JSON, FRAME_DATA):
                    need = 10
                    break

            if typ == FRAME_JSON and remaining and not top and b <= max_frame and p + 10 + b <= end:
                # The common case, a run of whole J frames inside an inflated C payload,
                # in a tight loop; anything unusual is left to the general one below.
                first = len(events)
                while True:
                    q = p + 10 + b
                    append((a, data[p + 10 : q]))  # type: ignore[arg-type]
                    p = q
                    remaining -= 1
                    if not remaining or end - p < 10:
                        break
                    next_ver, typ, a, b = unpack10(data, p)
                    if typ != FRAME_JSON or next_ver != ver or b > max_frame or p + 10 + b > end:
                        break
                seq = max(map(_SEQ, events[first:]))
                if seq > highest:
                    highest = seq
                if not remaining:
                    ready.append(Window(win_version - 0x30, win_size, events, highest, True))
                    events = []
                    append = events.append
                continue

            if typ == FRAME_JSON:  # seq = a, length = b
                if b > max_frame:
                    raise RemoteProtocolError(f"J frame of {b} bytes (limit {max_frame})")
                q = p + 10 + b
                if q > end:
                    need = 10 + b
                    break
                if not remaining:
                    if not sticky:
                        raise RemoteProtocolError("data frame before any W frame")
                    win_version = ver
                    win_size = remaining = sticky
                    highest = 0
                if top:  # the receive buffer: copy the payload out of the bytearray
                    append((a, bytes(data[p + 10 : q])))
                else:  # an inflated payload is bytes already: slice it
                    append((a, data[p + 10 : q]))  # type: ignore[arg-type]
                if a > highest:
                    highest = a
                p = q
                remaining -= 1
                if not remaining:
                    ready.append(Window(win_version - 0x30, win_size, events, highest, True))
                    events = []
                    append = events.append
                    if top:
                        break

            elif typ == FRAME_COMPRESSED:  # length = a
                if depth >= limits.max_depth:
                    raise RemoteProtocolError(f"C frames nested deeper than {limits.max_depth}")
                if a > max_frame:
                    raise RemoteProtocolError(f"C frame of {a} bytes (limit {max_frame})")
                q = p + 6 + a
                if q > end:
                    need = 6 + a
                    break
                inflated = self._inflate(data, p + 6, q)
                self._events = events
                self._remaining = remaining
                self._highest = highest
                self._win_version = win_version
                self._win_size = win_size
                self._parse(inflated, 0, len(inflated), depth + 1)
                events = self._events
                append = events.append
                remaining = self._remaining
                highest = self._highest
                win_version = self._win_version
                win_size = self._win_size
                sticky = self._sticky
                p = q
                if top and ready:
                    break

            elif typ == FRAME_WINDOW:  # size = a
                if a > limits.max_window:
                    raise RemoteProtocolError(f"window of {a} events (limit {limits.max_window})")
                if remaining:  # flush the partial window
                    ready.append(Window(win_version - 0x30, win_size, events, highest, False))
                    events = []
                    append = events.append
                    remaining = 0
                if a:
                    sticky = self._sticky = a
                    win_version = ver
                    win_size = remaining = a
                    highest = 0
                else:  # a liveness probe: answered at once, the sticky size is kept
                    ready.append(Window(ver - 0x30, 0, [], 0, True))
                p += 6
                if top and ready:
                    break

            elif typ == FRAME_DATA:  # seq = a, pairs = b
                if b > max_frame >> 3:
                    raise RemoteProtocolError(f"D frame of {b} pairs (limit {max_frame} bytes)")
                scan = self._dscan if top else None
                r, blobs = scan if scan is not None else (10, 2 * b)
                r, blobs, dneed = _scan_data_frame(data, p, end, r, blobs, max_frame)
                if dneed:
                    if top:
                        self._dscan = (r, blobs)
                    need = dneed
                    break
                self._dscan = None
                if not remaining:
                    if not sticky:
                        raise RemoteProtocolError("data frame before any W frame")
                    win_version = ver
                    win_size = remaining = sticky
                    highest = 0
                append((a, _decode_data_frame(data, p + 10, b)))
                if a > highest:
                    highest = a
                p += r
                remaining -= 1
                if not remaining:
                    ready.append(Window(win_version - 0x30, win_size, events, highest, True))
                    events = []
                    append = events.append
                    if top:
                        break

            else:
                raise _bad_type(typ)

        self._events = events
        self._remaining = remaining
        self._highest = highest
        self._win_version = win_version
        self._win_size = win_size
        if top:
            self._need = need
        elif p != end:
            raise RemoteProtocolError("a frame is cut short at the end of a C frame")
        return p

    def _inflate(self, data: bytes | bytearray, start: int, stop: int) -> bytes:
        """Inflate the zlib stream ``data[start:stop]``, refusing to exceed the bound."""
        limits = self.limits
        bound = min(limits.max_inflated, limits.max_ratio * (stop - start))
        step = max(_INFLATE_STEP, bound >> 3)
        inflater = _inflating.decompressobj()
        parts: list[bytes] = []
        total = 0
        with memoryview(data) as whole, whole[start:stop] as view:
            src: bytes | memoryview = view
            try:
                while True:
                    chunk = inflater.decompress(src, min(bound - total + 1, step))
                    total += len(chunk)
                    if total > bound:
                        raise RemoteProtocolError(
                            f"C frame of {stop - start} bytes inflates past {bound} bytes"
                        )
                    parts.append(chunk)
                    if inflater.eof:
                        break
                    if not chunk:
                        raise RemoteProtocolError("truncated zlib stream in a C frame")
                    src = inflater.unconsumed_tail
            except (zlib.error, _inflating.error) as e:
                raise RemoteProtocolError(f"bad zlib stream in a C frame: {e}") from None
            finally:
                src = b""
        if inflater.unused_data:
            raise RemoteProtocolError("bytes after the zlib stream in a C frame")
        self.inflated_bytes += total
        return b"".join(parts)


class ClientCodec(_Receiver):
    """The writer side of one Lumberjack connection: windows out, acks in.

    Only ``A`` frames carrying this codec's version byte are accepted; matching
    acks to the windows in flight (and refusing an ack beyond them) is the
    driver's job, since a driver may also send windows built elsewhere.
    """

    def __init__(self, version: int = 2) -> None:
        if version not in (1, 2):
            raise ValueError(f"Lumberjack version must be 1 or 2, not {version!r}")
        super().__init__()
        self.version = version
        self._version_byte = version + 0x30

    @property
    def state(self) -> State:
        return self._state

    def send_window(self, payloads: Sequence[bytes], *, compression_level: int = 3) -> bytes:
        """``W n`` + one ``C`` of ``J`` frames numbered 1..n (level 0: bare ``J``)."""
        if self._state is State.ERROR:
            raise LocalProtocolError("the connection is in the ERROR state")
        return encode_window(self.version, payloads, compression_level)

    def next_event(self) -> Ack | ConnectionClosed | _NeedData:
        """The next :class:`Ack`, :class:`ConnectionClosed`, or :data:`NEED_DATA`."""
        if self._state is State.ERROR:
            raise LocalProtocolError("the connection is in the ERROR state")
        if self._state is State.CLOSED:
            return ConnectionClosed()
        buf = self._buf
        pos = self._pos
        avail = len(buf) - pos
        if avail >= 1 and buf[pos] != self._version_byte:
            self._fail()
            byte = buf[pos]
            if byte in _VERSION_NAMES:
                raise RemoteProtocolError(
                    f"ack with version {_VERSION_NAMES[byte]} on a v{self.version} connection"
                )
            raise _bad_version(byte)
        if avail >= 2 and buf[pos + 1] != FRAME_ACK:
            typ = buf[pos + 1]
            self._fail()
            raise RemoteProtocolError(f"a reader may only send A frames, not {typ:#04x}")
        if avail >= 6:
            seq = U32.unpack_from(buf, pos + 2)[0]
            pos += 6
            if pos > len(buf) >> 1:
                del buf[:pos]
                pos = 0
            self._pos = pos
            return Ack(self.version, seq)
        if self._eof:
            self._state = State.CLOSED
            self._buf = bytearray()
            self._pos = 0
            return ConnectionClosed()
        return NEED_DATA

    def _fail(self) -> None:
        self._state = State.ERROR
        self._buf = bytearray()
        self._pos = 0
