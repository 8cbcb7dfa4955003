"""The Lumberjack v1/v2 codec: windows of events parsed without doing any I/O.

:class:`ServerCodec` is the reader (Logstash) side: feed it received bytes
with :meth:`~ServerCodec.receive_data` (``b""`` means the peer closed), call
:meth:`~ServerCodec.next_event` until it returns :data:`NEED_DATA`, and turn
each :class:`Window` into an ``A`` frame with :meth:`~ServerCodec.send` once
its events are safe; like h11, ``send`` refuses an ack that no returned
window awaits. :class:`ClientCodec` is the writer (Beats) side: it remembers
the windows it sent and turns each ``A`` frame into a
:class:`~protocols.lumberjack.events.Progress` saying what it acks. Both
speak the toolkit's vocabulary (:data:`~gateway.protocol.NEED_DATA`,
:class:`~gateway.protocol.ConnectionClosed`) and keep their bytes in its
:class:`~gateway.protocol.ReceiveBuffer`. The window rules are those of
DECISIONS.md §1: the ack carries the highest sequence number seen, ``W 0``
is a window of its own, a new ``W`` flushes a partial window, and data
frames after a full window start a window of the same ("sticky") size, as
v1 streaming writers send ``W`` once.

Parsing strategy: :meth:`ServerCodec._parse` reads frame headers from the
receive buffer with ``struct.unpack_from`` at an offset (no reslicing per
frame, no object per event but the ``(seq, payload)`` tuple) and hands each
frame to its step. ``_json_run`` reads a whole run of ``J`` frames, the bulk
of any Beats window, in one tight loop; ``_data`` reads a ``D`` frame,
``_window`` a ``W``; ``_compressed`` inflates a ``C`` frame once all of it
is buffered, with ``decompressobj().decompress(data, max_length)`` in
bounded steps so that a zip bomb is refused after at most
``min(max_inflated, max_ratio * len)`` bytes, and parses the inflated bytes
with the same loop (recursively, for nested ``C``), where a frame cut short
is an error. A step that meets an incomplete frame says how many bytes it
needs, so a large frame arriving in small pieces is not re-parsed per piece;
the length fields of a ``D`` frame are scanned with a resumable cursor for
the same reason. Every length is checked against :class:`Limits` before
anything is allocated or buffered for it.

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
from typing import Final, NoReturn

from gateway.protocol import (
    NEED_DATA,
    ConnectionClosed,
    LocalProtocolError,
    NeedData,
    ReceiveBuffer,
    RemoteProtocolError,
)

from .events import Ack, Progress, Window
from .frames import (
    FRAME_ACK,
    FRAME_COMPRESSED,
    FRAME_DATA,
    FRAME_JSON,
    FRAME_WINDOW,
    HEADER6,
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
    #: Most bytes of events one window may hold before it is whole (inflated
    #: events included): the memory one half-received window can take.
    max_window_bytes: int = 64 * 2**20

    def __post_init__(self) -> None:
        for name in (
            "max_window",
            "max_frame",
            "max_inflated",
            "max_ratio",
            "max_depth",
            "max_window_bytes",
        ):
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


def _short_frame_need(data: bytes | bytearray, p: int, end: int) -> int:
    """With under 10 bytes left at ``p``: the bytes its frame needs, 0 for a whole ``W``/``C``."""
    avail = end - p
    if not avail:
        return 1
    if data[p] != VERSION_2 and data[p] != VERSION_1:
        raise _bad_version(data[p])
    if avail < 2:
        return 2
    typ = data[p + 1]
    if typ in (FRAME_WINDOW, FRAME_COMPRESSED):
        return 6 if avail < 6 else 0
    if typ in (FRAME_JSON, FRAME_DATA):
        return 10
    raise _bad_type(typ)


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


class ServerCodec:
    """The reader side of one Lumberjack connection (v1 and v2 alike).

    ::

        codec.receive_data(data)              # b"" once the peer closed
        while (event := codec.next_event()) is not NEED_DATA:
            ...                               # a Window, or ConnectionClosed
        wire = codec.send(Ack(window.version, window.highest_seq))
    """

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = Limits() if limits is None else limits
        self._state = State.OPEN
        self._buffer = ReceiveBuffer()
        #: Bytes needed from the buffer's ``pos`` before parsing can make progress.
        self._need = 1
        #: Resume point ``(offset, blobs left)`` of a partly received ``D`` frame.
        self._dscan: tuple[int, int] | None = None
        #: Windows parsed and not yet returned.
        self._ready: deque[Window] = deque()
        #: Windows returned and not yet acked, oldest first.
        self._awaiting: deque[Window] = deque()
        # The window being received; ``_remaining == 0`` means none is.
        self._events: list[tuple[int, bytes | dict[str, str]]] = []
        self._remaining = 0
        self._highest = 0
        #: Frame bytes of the events of the window being received.
        self._window_bytes = 0
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
        return self._state is State.OPEN and (self._remaining > 0 or len(self._buffer) > 0)

    @property
    def held_bytes(self) -> int:
        """Bytes held before a window is returned: unparsed input and the events of
        the window being received (inflated ones included)."""
        return len(self._buffer) + self._window_bytes

    # -- input ----------------------------------------------------------------
    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes; ``b""`` means the peer closed its sending side."""
        self._buffer.feed(data)

    def next_event(self) -> Window | ConnectionClosed | NeedData:
        """The next whole window, :class:`ConnectionClosed`, or :data:`NEED_DATA`.

        After the end of input, a partly received window is dropped (it must
        not be acked) and :class:`ConnectionClosed` is returned, every time.
        """
        if self._state is State.ERROR:
            raise LocalProtocolError("the connection is in the ERROR state")
        ready = self._ready
        if not ready:
            if self._state is State.CLOSED:
                return ConnectionClosed()
            buf = self._buffer
            data = buf.data
            if len(data) - buf.pos >= self._need:
                try:
                    buf.advance(self._parse(data, buf.pos, len(data), 0))
                except RemoteProtocolError:
                    self._fail()
                    raise
            if not ready:
                if not buf.eof:
                    return NEED_DATA
                self._state = State.CLOSED
                self._discard()
                return ConnectionClosed()
        window = ready.popleft()
        self._awaiting.append(window)
        return window

    def _fail(self) -> None:
        self._state = State.ERROR
        self._discard()
        self._ready.clear()

    def _discard(self) -> None:
        self._buffer.discard()
        self._events = []
        self._window_bytes = 0
        self._remaining = 0
        self._dscan = None

    # -- output ---------------------------------------------------------------
    def send(self, event: Ack) -> bytes:
        """The 6 bytes of ``event``'s ``A`` frame, for the oldest window awaiting an ack.

        ``Ack(window.version, window.highest_seq)`` acks that window (the next
        ack is for the next one); ``Ack(window.version, 0)`` while its highest
        sequence is above 0 is a keepalive that acks nothing, as is any lower
        sequence. Refused with :class:`~gateway.errors.LocalProtocolError`: an
        ack when no window returned by :meth:`next_event` awaits one, in
        another version than that window's, or beyond its highest sequence.
        Allowed in every state: a window already returned stays ackable even
        if the input after it was bad.
        """
        if not isinstance(event, Ack):
            raise LocalProtocolError(f"a Lumberjack server only sends Ack, not {event!r}")
        awaiting = self._awaiting
        if not awaiting:
            raise LocalProtocolError(f"{event!r}, but no window awaits an ack")
        window = awaiting[0]
        if event.version != window.version:
            raise LocalProtocolError(f"{event!r} for a window of version {window.version}")
        if event.seq > window.highest_seq:
            raise LocalProtocolError(
                f"{event!r} beyond the window's highest sequence {window.highest_seq}"
            )
        wire = encode_ack(event.version, event.seq)
        if event.seq == window.highest_seq:
            awaiting.popleft()
        return wire

    # -- parsing ----------------------------------------------------------------
    def _parse(self, data: bytes | bytearray, p: int, end: int, depth: int) -> int:
        """Read whole frames from ``data[p:end]``; return where reading stopped.

        ``depth`` 0: ``data`` is the receive buffer; stop after a window is
        ready or at an incomplete frame (setting ``_need``). ``depth`` ≥ 1:
        ``data`` is an inflated ``C`` payload, read to its end, where a cut
        frame is an error. Each frame's step returns the offset after what it
        read, or minus the bytes its frame needs from ``p``.
        """
        top = not depth
        ready = self._ready
        unpack10 = HEADER10.unpack_from
        need = 0
        while True:
            if end - p >= 10:
                ver, typ, a, b = unpack10(data, p)
                if ver != VERSION_2 and ver != VERSION_1:
                    raise _bad_version(ver)
            else:  # the last few bytes: a short frame (W, C header) or a cut one
                need = _short_frame_need(data, p, end)
                if need:
                    break
                ver, typ, a = HEADER6.unpack_from(data, p)
                b = 0
            if typ == FRAME_JSON:  # seq = a, length = b
                q = self._json_run(data, p, end, ver, a, b, top)
            elif typ == FRAME_COMPRESSED:  # length = a
                q = self._compressed(data, p, end, a, depth)
            elif typ == FRAME_WINDOW:  # size = a
                self._window(ver, a)
                q = p + 6
            elif typ == FRAME_DATA:  # seq = a, pairs = b
                q = self._data(data, p, end, ver, a, b, top)
            else:
                raise _bad_type(typ)
            if q < 0:
                need = -q
                break
            p = q
            if top and ready:
                break
        if top:
            self._need = need
        elif p != end:
            raise RemoteProtocolError("a frame is cut short at the end of a C frame")
        return p

    def _json_run(
        self, data: bytes | bytearray, p: int, end: int, ver: int, seq: int, n: int, top: bool
    ) -> int:
        """The ``J`` frame at ``p`` and the whole ``J`` frames of its version after it.

        Stops at the end of the window, at any other frame or at a frame not
        all here, which the general loop then reads. At the top the payload is
        copied out of the receive buffer; an inflated payload is bytes already.
        """
        max_frame = self.limits.max_frame
        if n > max_frame:
            raise RemoteProtocolError(f"J frame of {n} bytes (limit {max_frame})")
        q = p + 10 + n
        if q > end:
            return -(10 + n)
        start = p
        remaining = self._remaining or self._open_sticky(ver)
        events = self._events
        append = events.append
        first = len(events)
        unpack10 = HEADER10.unpack_from
        while True:
            append((seq, bytes(data[p + 10 : q]) if top else data[p + 10 : q]))  # type: ignore[arg-type]
            p = q
            remaining -= 1
            if not remaining or end - p < 10:
                break
            next_ver, typ, seq, n = unpack10(data, p)
            if typ != FRAME_JSON or next_ver != ver or n > max_frame:
                break
            q = p + 10 + n
            if q > end:
                break
        highest = max(map(_SEQ, events[first:]))
        if highest > self._highest:
            self._highest = highest
        self._hold(p - start)
        self._remaining = remaining
        if not remaining:
            self._flush(True)
        return p

    def _data(
        self, data: bytes | bytearray, p: int, end: int, ver: int, seq: int, pairs: int, top: bool
    ) -> int:
        """The ``D`` frame at ``p`` (its length fields resume where a short read left them)."""
        max_frame = self.limits.max_frame
        if pairs > max_frame >> 3:
            raise RemoteProtocolError(f"D frame of {pairs} pairs (limit {max_frame} bytes)")
        scan = self._dscan if top else None
        r, blobs = scan if scan is not None else (10, 2 * pairs)
        r, blobs, need = _scan_data_frame(data, p, end, r, blobs, max_frame)
        if need:
            if top:
                self._dscan = (r, blobs)
            return -need
        self._dscan = None
        if not self._remaining:
            self._open_sticky(ver)
        self._events.append((seq, _decode_data_frame(data, p + 10, pairs)))
        if seq > self._highest:
            self._highest = seq
        self._hold(r)
        self._remaining -= 1
        if not self._remaining:
            self._flush(True)
        return p + r

    def _compressed(self, data: bytes | bytearray, p: int, end: int, size: int, depth: int) -> int:
        """The ``C`` frame at ``p``: inflated (within the limits) and parsed to its end."""
        limits = self.limits
        if depth >= limits.max_depth:
            raise RemoteProtocolError(f"C frames nested deeper than {limits.max_depth}")
        if size > limits.max_frame:
            raise RemoteProtocolError(f"C frame of {size} bytes (limit {limits.max_frame})")
        q = p + 6 + size
        if q > end:
            return -(6 + size)
        inflated = self._inflate(data, p + 6, q)
        self._parse(inflated, 0, len(inflated), depth + 1)
        return q

    def _window(self, ver: int, size: int) -> None:
        """A ``W`` frame: flush a partial window, then start one (``W 0``: answer at once)."""
        if size > self.limits.max_window:
            raise RemoteProtocolError(f"window of {size} events (limit {self.limits.max_window})")
        if self._remaining:
            self._flush(False)
        if size:
            self._sticky = self._win_size = self._remaining = size
            self._win_version = ver
            self._highest = 0
        else:  # a liveness probe: answered at once, the sticky size is kept
            self._ready.append(Window(ver - 0x30, 0, [], 0, True))

    def _open_sticky(self, ver: int) -> int:
        """A data frame with no window open starts one of the last ``W``'s size."""
        if not self._sticky:
            raise RemoteProtocolError("data frame before any W frame")
        self._win_version = ver
        self._win_size = self._remaining = self._sticky
        self._highest = 0
        return self._sticky

    def _hold(self, nbytes: int) -> None:
        """The window being received holds ``nbytes`` more, within ``max_window_bytes``."""
        self._window_bytes += nbytes
        if self._window_bytes > self.limits.max_window_bytes:
            raise RemoteProtocolError(
                f"a window holding more than {self.limits.max_window_bytes} bytes of events"
            )

    def _flush(self, complete: bool) -> None:
        """The window being received is ready: whole, or cut short by a new ``W``."""
        version = self._win_version - 0x30
        self._ready.append(Window(version, self._win_size, self._events, self._highest, complete))
        self._events = []
        self._window_bytes = 0
        self._remaining = 0

    def _inflate(self, data: bytes | bytearray, start: int, stop: int) -> bytes:
        """Inflate the zlib stream ``data[start:stop]``, refusing to exceed the bound."""
        limits = self.limits
        bound = min(limits.max_inflated, limits.max_ratio * (stop - start), limits.max_window_bytes)
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


class ClientCodec:
    """The writer side of one Lumberjack connection: windows out, acks matched to them.

    :meth:`send_window` (or :meth:`window_sent`, for a window encoded
    elsewhere) puts a window in flight; :meth:`next_event` matches each ``A``
    frame to the oldest window in flight and returns a
    :class:`~protocols.lumberjack.events.Progress`. An ``A`` frame of another
    version, with no window in flight (but ``A 0``) or beyond the window is
    a :class:`~gateway.errors.RemoteProtocolError`.
    """

    def __init__(self, version: int = 2) -> None:
        if version not in (1, 2):
            raise ValueError(f"Lumberjack version must be 1 or 2, not {version!r}")
        self.version = version
        self._version_byte = version + 0x30
        self._state = State.OPEN
        self._buffer = ReceiveBuffer()
        #: ``[size, events acked]`` of each window in flight, oldest first.
        self._inflight: deque[list[int]] = deque()

    @property
    def state(self) -> State:
        return self._state

    @property
    def windows_in_flight(self) -> int:
        """Windows sent and not yet acked whole."""
        return len(self._inflight)

    @property
    def events_in_flight(self) -> int:
        """Events sent and not yet acked."""
        return sum(size - acked for size, acked in self._inflight)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes; ``b""`` means the peer closed its sending side."""
        self._buffer.feed(data)

    @property
    def held_bytes(self) -> int:
        """Received bytes not yet parsed (a partial ack)."""
        return len(self._buffer)

    def send_window(self, payloads: Sequence[bytes], *, compression_level: int = 3) -> bytes:
        """``W n`` + one ``C`` of ``J`` frames numbered 1..n (level 0: bare ``J``), in flight."""
        wire = encode_window(self.version, payloads, compression_level)
        self.window_sent(len(payloads))
        return wire

    def window_sent(self, size: int) -> None:
        """A window of ``size`` events numbered 1..size, encoded elsewhere, is in flight."""
        if self._state is State.ERROR:
            raise LocalProtocolError("the connection is in the ERROR state")
        self._inflight.append([size, 0])

    def next_event(self) -> Progress | ConnectionClosed | NeedData:
        """The next :class:`Progress`, :class:`ConnectionClosed`, or :data:`NEED_DATA`."""
        if self._state is State.ERROR:
            raise LocalProtocolError("the connection is in the ERROR state")
        if self._state is State.CLOSED:
            return ConnectionClosed()
        buf = self._buffer
        data = buf.data
        pos = buf.pos
        avail = len(data) - pos
        if avail >= 1 and data[pos] != self._version_byte:
            byte = data[pos]
            if byte in _VERSION_NAMES:
                self._fail(
                    f"ack with version {_VERSION_NAMES[byte]} on a v{self.version} connection"
                )
            self._fail(str(_bad_version(byte)))
        if avail >= 2 and data[pos + 1] != FRAME_ACK:
            self._fail(f"a reader may only send A frames, not {data[pos + 1]:#04x}")
        if avail >= 6:
            seq = U32.unpack_from(data, pos + 2)[0]
            buf.advance(pos + 6)
            return self._match(seq)
        if buf.eof:
            self._state = State.CLOSED
            buf.discard()
            return ConnectionClosed()
        return NEED_DATA

    def _match(self, seq: int) -> Progress:
        """What ``A seq`` means for the oldest window in flight."""
        inflight = self._inflight
        if not inflight:
            if not seq:
                return Progress(0, 0, False)  # a keepalive while nothing is in flight
            self._fail(f"ack {seq} with no window in flight")
        head = inflight[0]
        size, acked = head
        if seq > size:
            self._fail(f"ack {seq} beyond the window of {size} events")
        if seq == size:
            inflight.popleft()
            return Progress(seq, seq - acked, True)
        if seq <= acked:
            return Progress(seq, 0, False)
        head[1] = seq
        return Progress(seq, seq - acked, False)

    def _fail(self, message: str) -> NoReturn:
        self._state = State.ERROR
        self._buffer.discard()
        raise RemoteProtocolError(message)
