"""The Lumberjack v1/v2 codec: windows of events parsed without doing any I/O.

:class:`ServerCodec` is the reader (Logstash) side: feed it received bytes
with :meth:`~ServerCodec.receive_data` (``b""`` means the peer closed), call
:meth:`~ServerCodec.next_event` until it returns :data:`NEED_DATA`, and turn
each :class:`Window` into an ``A`` frame with :meth:`~ServerCodec.send` once
its events are safe; like h11, ``send`` refuses an ack that no returned
window awaits. :class:`ClientCodec` is the writer (Beats) side: it remembers
the windows it sent and turns each ``A`` frame into a
:class:`~protocols.lumberjack.events.Progress` saying what it acks. Both
stand on the toolkit's :class:`~gateway.protocol.lifecycle.Lifecycle` (its
states, its receive buffer, the same answers after close and after an
error; see ``docs/codecs.md``). The window rules, where the
specification is silent: the ack carries the highest sequence number seen
(sequences need not start at 1 nor be contiguous), ``W 0`` is a window of
its own answered with ``A 0``, a new ``W`` flushes a partial window, and data
frames after a full window start a window of the same ("sticky") size, as
v1 streaming writers send ``W`` once.

Parsing strategy: :meth:`ServerCodec._parse` reads frame headers from the
receive buffer with ``struct.unpack_from`` at an offset (no reslicing per
frame, no object per event but the ``(seq, payload)`` tuple) and hands each
frame to its step. ``_json_run`` reads a whole run of ``J`` frames, the bulk
of any Beats window, in one tight loop; ``_data`` reads a ``D`` frame,
``_window`` a ``W``. A ``C`` frame is inflated as its bytes arrive
(``_stream``), never buffered whole: each read's compressed bytes go through
one ``decompressobj`` in pieces of at most 256 KiB
(``decompress(data, max_length)``), so that a zip bomb is refused after at
most ``min(max_inflated, max_ratio * len)`` bytes and a window never inflates
past ``max_window_bytes``, and each piece is parsed with the same loop; a
frame cut between two pieces is completed in a small carry. Windows that
complete inside a ``C`` frame are returned once its zlib stream has ended and
checked out. A ``C`` frame nested in another is inflated whole. With
:attr:`ServerCodec.offload_at` set, a top-level ``C`` frame at least that
large (and at most :data:`OFFLOAD_MAX_FRAME`) waits until it is whole and is
handed out as an :class:`~protocols.lumberjack.events.Inflate` event, for the
driver to run in a thread; its first :data:`OFFLOAD_STEP` bytes come back
through the streamed frame's state, checked as an inline piece is, and the
rest, if any, is inflated inline. A step that
meets an incomplete frame says how many bytes it needs, so a large frame
arriving in small pieces is not re-parsed per piece; the length fields of a
``D`` frame are scanned with a resumable cursor for the same reason. Every
length is checked against :class:`Limits` before anything is allocated or
buffered for it.

Memory: :attr:`ServerCodec.held_bytes` is what the codec really holds for a
window that is not whole (the receive buffer as allocated, the events' bytes
and their Python objects, the decompressor's state, what waits for room),
measured with tracemalloc (tests/lumberjack/test_lumberjack_memory.py). A
driver that charges a memory budget sets :attr:`ServerCodec.room`; the codec
asks it before reading frames into events and before each inflated piece,
and while it says 0 or less keeps its input as it is (compressed) and returns
``NEED_DATA``; asked again once there is room, it goes on with no new input.

A peer breaking the protocol raises :class:`~gateway.core.errors.RemoteProtocolError`
and puts the codec in :attr:`~gateway.protocol.lifecycle.CodecState.ERROR`; the
driver closes the connection (Lumberjack has no error frame).
"""

from __future__ import annotations

import operator
import types
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn

from gateway.sdk import (
    NEED_DATA,
    CodecState,
    ConnectionClosed,
    Lifecycle,
    LocalProtocolError,
    NeedData,
    RemoteProtocolError,
)

from .events import Ack, Inflate, Progress, Window
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

__all__ = [
    "EVENT_OVERHEAD",
    "INFLATER_STATE",
    "NEED_DATA",
    "OFFLOAD_MAX_FRAME",
    "OFFLOAD_STEP",
    "ClientCodec",
    "CodecState",
    "Limits",
    "ServerCodec",
]


_SEQ: Final = operator.itemgetter(0)
_OPEN: Final = CodecState.OPEN
_CLOSED: Final = CodecState.CLOSED

#: Largest piece inflated per ``decompress`` call: the bounds, and the driver's
#: room (:attr:`ServerCodec.room`), are checked before each piece.
_INFLATE_STEP: Final = 256 * 1024
#: Largest ``C`` frame (compressed bytes) handed out as an :class:`Inflate` event;
#: larger ones are inflated inline as they arrive, never buffered whole.
OFFLOAD_MAX_FRAME: Final = 1024 * 1024
#: Most bytes an :class:`Inflate` event inflates (a Beats window of 2048 events of
#: 1 KB fits); what the frame inflates to beyond it is inflated inline, in pieces.
OFFLOAD_STEP: Final = 4 * 1024 * 1024

# What the objects the codec builds cost beyond the frame bytes it counts, measured
# with CPython 3.11's allocators (see docs/limits.md): an event of a window being
# received is a tuple (56 bytes), a sequence number (28) and a bytes object's
# header (33) or a dict, in a list (8), each rounded up to 16 bytes; 125 to 141
# bytes were measured, less the 10-byte frame header already counted.
EVENT_OVERHEAD: Final = 144
#: A ``D`` event's dict ...
D_OVERHEAD: Final = 160
#: ... and per key/value pair, two str objects and the dict's entry (an event of
#: 1, 4 and 16 pairs took 397, 665 and 2222 bytes beyond its frame bytes).
PAIR_OVERHEAD: Final = 120
#: What a decompressor holds while a ``C`` frame is inflated piece by piece:
#: zlib's state and 32 KiB window come to about 41 KiB, ISA-L's to about 56.
INFLATER_STATE: Final = 64 * 1024


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


class ServerCodec(Lifecycle):
    """The reader side of one Lumberjack connection (v1 and v2 alike).

    ::

        codec.receive_data(data)              # b"" once the peer closed
        while (event := codec.next_event()) is not NEED_DATA:
            ...                               # a Window, or ConnectionClosed
        wire = codec.send(Ack(window.version, window.highest_seq))

    A driver that charges a memory budget sets :attr:`room`: the codec asks it
    before each step that allocates much (reading a run of frames into events,
    inflating the next piece of a ``C`` frame) and waits, keeping what it
    received as it is, while it says 0 or less.
    """

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__()
        self.limits = Limits() if limits is None else limits
        #: How many more bytes the codec may hold (see :attr:`held_bytes`) before it
        #: must wait; asked before each large step. None: no limit. While it says 0
        #: or less, :meth:`next_event` returns NEED_DATA with the input kept; call it
        #: again once there is room (no new data is needed).
        self.room: Callable[[], int] | None = None
        #: ``C`` frames of at least this many compressed bytes (and at most
        #: :data:`OFFLOAD_MAX_FRAME`) are handed out whole as an :class:`Inflate` event
        #: for the driver to inflate, in a thread, instead of inline (0: never).
        self.offload_at = 0
        #: The :class:`Inflate` event handed out and not taken back yet.
        self._offload: Inflate | None = None
        #: Bytes needed from the buffer's ``pos`` before parsing can make progress
        #: (0: parse at the next call whatever arrived, to resume after a wait for room).
        self._need = 1
        #: Resume point ``(offset, blobs left)`` of a partly received ``D`` frame.
        self._dscan: tuple[int, int] | None = None
        #: Windows parsed and not yet returned, and what they hold ...
        self._ready: deque[Window] = deque()
        self._ready_bytes = 0
        #: ... of which the last ones completed inside the ``C`` frame being inflated:
        #: returned only once its zlib stream ended and checked out.
        self._unchecked = 0
        #: ``(version, highest_seq)`` of the windows returned and not yet acked, oldest
        #: first (not the windows: their events are freed once handed off).
        self._awaiting: deque[tuple[int, int]] = deque()
        # The window being received; ``_remaining == 0`` means none is.
        self._events: list[tuple[int, bytes | dict[str, str]]] = []
        self._remaining = 0
        self._highest = 0
        #: Frame bytes of the events of the window being received (``max_window_bytes``) ...
        self._window_bytes = 0
        #: ... and what their Python objects cost beyond those bytes.
        self._overhead = 0
        self._win_version = VERSION_2
        self._win_size = 0
        #: Size of the last non-empty ``W``: data frames after a full window
        #: start a window of this size. 0 while no ``W`` was seen.
        self._sticky = 0
        # The C frame being inflated as it arrives (``_inflater is None``: none is).
        self._inflater: Any = None
        #: Its compressed bytes still to come from the buffer, and its inflation bound.
        self._c_left = 0
        self._c_bound = 0
        self._c_size = 0
        #: Bytes inflated from it so far.
        self._c_out = 0
        #: Compressed bytes taken from the buffer and not inflated yet (waiting for room).
        self._tail: bytes = b""
        #: The last piece filled its limit: more may come out without more input.
        self._more = False
        #: Inflated bytes not parsed yet (a frame cut between two pieces) ...
        self._carry = bytearray()
        #: ... and how many it needs before parsing it can make progress.
        self._carry_need = 0
        #: Bytes inflated from ``C`` frames so far (for metrics).
        self.inflated_bytes = 0
        #: Events of the window being received that arrived before the ``C`` frame
        #: being inflated: only those may be taken (:meth:`take_part`).
        self._c_mark = 0
        #: Events of the window being received already taken as parts, and the
        #: highest sequence among them (later events must be above it).
        self._taken = 0
        self._floor = 0

    @property
    def in_window(self) -> bool:
        """True while a window or a frame is partly received (time it out)."""
        return self._state is _OPEN and (
            self._remaining > 0 or len(self._buffer) > 0 or self._inflater is not None
        )

    @property
    def part_ready(self) -> int:
        """Events of the unfinished window that :meth:`take_part` would take now: those
        received outside a ``C`` frame still arriving (0 while no window is unfinished)."""
        if not self._remaining or self._ready:
            return 0
        return len(self._events) if self._inflater is None else self._c_mark

    @property
    def window_progress(self) -> tuple[int, int, int] | None:
        """``(size, arrived, taken)`` of the unfinished window, None if none is: its
        announced size, the events received of it (those of a ``C`` frame still
        arriving included) and how many were taken as parts."""
        if not self._remaining:
            return None
        return self._win_size, self._win_size - self._remaining, self._taken

    def take_part(self) -> Window | None:
        """The events received so far of the unfinished window, as a part of it.

        For a slow writer: its window is published in parts, each acked with its
        highest sequence once safe (acks are cumulative), instead of waiting for
        the whole. The part is a :class:`Window` with ``part=True``, answered like
        any returned window (:meth:`send`); the rest of the window comes later
        (``highest_seq`` of the whole). Events inside a ``C`` frame still arriving
        are not taken (they are not received until it has ended and checked out),
        nor anything while a parsed window waits to be returned. None when there
        is nothing to take.
        """
        count = self.part_ready
        if not count or self._state is not _OPEN:
            return None
        events = self._events
        taken, rest = (events, []) if count == len(events) else (events[:count], events[count:])
        highest = max(map(_SEQ, taken))
        if self._floor and min(map(_SEQ, taken)) <= self._floor:
            self._fail(self._not_rising())
        held = (self._window_bytes + self._overhead) * count // len(events)
        share_bytes = self._window_bytes * count // len(events)
        self._window_bytes -= share_bytes
        self._overhead -= held - share_bytes
        self._events = rest
        if self._inflater is not None:
            self._c_mark -= count
        self._taken += count
        self._floor = highest
        version = self._win_version - 0x30
        self._awaiting.append((version, highest))
        return Window(version, self._win_size, taken, highest, False, held, part=True)

    def _not_rising(self) -> RemoteProtocolError:
        return RemoteProtocolError(
            f"event sequence numbers of a window must rise once part of it was acked"
            f" (up to {self._floor})"
        )

    @property
    def held_bytes(self) -> int:
        """What the codec holds of received input before a window is returned, as
        allocated: the receive buffer, the window being received (its frame bytes and
        the objects built for its events), windows parsed and not returned, and for a
        ``C`` frame being inflated its decompressor, its compressed bytes waiting for
        room and the inflated bytes of a frame cut between two pieces."""
        held = self._buffer.allocated + self._window_bytes + self._overhead + self._ready_bytes
        if self._inflater is not None:
            held += INFLATER_STATE + len(self._tail) + len(self._carry)
        offload = self._offload
        if offload is not None:
            held += len(offload.data) + len(offload.piece or b"")
        return held

    # -- input ----------------------------------------------------------------
    def next_event(self) -> Window | Inflate | ConnectionClosed | NeedData:
        """The next whole window, :class:`ConnectionClosed`, or :data:`NEED_DATA`
        (or, with :attr:`offload_at` set, an :class:`Inflate` to run before the next call).

        After the end of input, a partly received window is dropped (it must
        not be acked) and :class:`ConnectionClosed` is returned, every time.
        """
        ready = self._ready
        if len(ready) <= self._unchecked:  # (none is ready once CLOSED or ERROR)
            if self._state is not _OPEN:
                return self._not_open()
            offload = self._offload
            if offload is not None and not offload.done:
                raise LocalProtocolError("next_event before the Inflate event handed out ran")
            buf = self._buffer
            data = buf.data
            if len(data) - buf.pos >= self._need:
                try:
                    buf.advance(self._parse(data, buf.pos, len(data), 0))
                except RemoteProtocolError as e:
                    self._fail(e)
            if len(ready) <= self._unchecked:
                offload = self._offload
                if offload is not None and not offload.done:
                    return offload
                if not buf.eof:
                    return NEED_DATA
                return self._closed()
        window = ready.popleft()
        self._ready_bytes -= window.held
        self._awaiting.append((window.version, window.highest_seq))
        return window

    def discard(self) -> None:
        """Drop everything received and held, and whatever is received from now on
        (the connection is over; windows already returned can still be acked)."""
        if self._state is _OPEN:
            self._state = _CLOSED
        self._release()

    def _release(self) -> None:
        """Drop the input held: the buffer, the window being received, the windows
        parsed and not returned, a ``C`` frame being inflated."""
        super()._release()
        self._events = []
        self._window_bytes = self._overhead = 0
        self._remaining = 0
        self._dscan = None
        self._end_stream()
        self._ready.clear()
        self._ready_bytes = self._unchecked = 0
        self._taken = self._floor = self._c_mark = 0

    # -- output ---------------------------------------------------------------
    def send(self, event: Ack) -> bytes:
        """The 6 bytes of ``event``'s ``A`` frame, for the oldest window awaiting an ack.

        ``Ack(window.version, window.highest_seq)`` acks that window (the next
        ack is for the next one); ``Ack(window.version, 0)`` while its highest
        sequence is above 0 is a keepalive that acks nothing, as is any lower
        sequence. Refused with :class:`~gateway.core.errors.LocalProtocolError`: an
        ack when no window returned by :meth:`next_event` awaits one, in
        another version than that window's, or beyond its highest sequence.
        Allowed in every state, ``ERROR`` included: a window already returned
        stays ackable even if the input after it was bad (its answer may be on
        its way while the driver closes).
        """
        if not isinstance(event, Ack):
            raise LocalProtocolError(f"a Lumberjack server only sends Ack, not {event!r}")
        awaiting = self._awaiting
        if not awaiting:
            raise LocalProtocolError(f"{event!r}, but no window awaits an ack")
        version, highest_seq = awaiting[0]
        if event.version != version:
            raise LocalProtocolError(f"{event!r} for a window of version {version}")
        if event.seq > highest_seq:
            raise LocalProtocolError(
                f"{event!r} beyond the window's highest sequence {highest_seq}"
            )
        wire = encode_ack(event.version, event.seq)
        if event.seq == highest_seq:
            awaiting.popleft()
        return wire

    # -- parsing ----------------------------------------------------------------
    def _parse(self, data: bytes | bytearray, p: int, end: int, depth: int) -> int:
        """Read whole frames from ``data[p:end]``; return where reading stopped.

        ``depth`` 0: ``data`` is the receive buffer; stop after a window is
        ready, at an incomplete frame (setting ``_need``) or when :attr:`room`
        says to wait (``_need`` 0); a ``C`` frame is inflated as its bytes
        arrive (:meth:`_stream`). ``depth`` 1: ``data`` is a piece of such a
        frame's inflated bytes (or the carry); stop at a frame cut at its end
        (setting ``_carry_need``). ``depth`` ≥ 2: ``data`` is a nested ``C``
        payload inflated whole, read to its end, where a cut frame is an error.
        Each frame's step returns the offset after what it read, or minus the
        bytes its frame needs from ``p``.
        """
        top = not depth
        ready = self._ready
        if top:
            if self.room is not None and self.room() <= 0:
                self._need = 0
                return p
            if self._inflater is not None:
                p = self._stream(data, p, end)
                if self._inflater is not None or ready:
                    return p
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
                q = self._json_run(data, p, end, ver, a, b)
            elif typ == FRAME_COMPRESSED:  # length = a
                if top and self.offload_at and self.offload_at <= a <= OFFLOAD_MAX_FRAME:
                    q = self._hand_out(data, p, end, a)
                    if q < 0:
                        need = -q
                        break
                    if q == p:  # waits for room
                        break
                    return q
                if top:  # inflated as it arrives
                    self._start_stream(a)
                    p = self._stream(data, p + 6, end)
                    if self._inflater is not None or ready:
                        return p
                    continue
                q = self._compressed(data, p, end, a, depth)
            elif typ == FRAME_WINDOW:  # size = a
                self._window(ver, a)
                q = p + 6
            elif typ == FRAME_DATA:  # seq = a, pairs = b
                q = self._data(data, p, end, ver, a, b, depth < 2)
            else:
                raise _bad_type(typ)
            if q < 0:
                need = -q
                break
            p = q
            if top and ready:  # (none is unchecked outside a C frame)
                break
        if top:
            self._need = need
        elif depth == 1:
            self._carry_need = need
        elif p != end:
            raise RemoteProtocolError("a frame is cut short at the end of a C frame")
        return p

    def _json_run(
        self, data: bytes | bytearray, p: int, end: int, ver: int, seq: int, n: int
    ) -> int:
        """The ``J`` frame at ``p`` and the whole ``J`` frames of its version after it.

        Stops at the end of the window, at any other frame or at a frame not
        all here, which the general loop then reads. A payload in a
        ``bytearray`` (the receive buffer, the carry) is copied out as bytes;
        one in inflated bytes is sliced from them.
        """
        max_frame = self.limits.max_frame
        if n > max_frame:
            raise RemoteProtocolError(f"J frame of {n} bytes (limit {max_frame})")
        if self._window_bytes + 10 + n > self.limits.max_window_bytes:
            self._too_big()
        q = p + 10 + n
        if q > end:
            return -(10 + n)
        start = p
        remaining = self._remaining or self._open_sticky(ver)
        events = self._events
        append = events.append
        first = len(events)
        unpack10 = HEADER10.unpack_from
        if type(data) is bytearray:
            while True:
                append((seq, bytes(data[p + 10 : q])))
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
        else:
            while True:
                append((seq, data[p + 10 : q]))  # type: ignore[arg-type]
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
        self._hold(p - start, (len(events) - first) * EVENT_OVERHEAD)
        self._remaining = remaining
        if not remaining:
            self._flush(True)
        return p

    def _data(
        self,
        data: bytes | bytearray,
        p: int,
        end: int,
        ver: int,
        seq: int,
        pairs: int,
        resumable: bool,
    ) -> int:
        """The ``D`` frame at ``p`` (its length fields resume where a short read left them)."""
        max_frame = self.limits.max_frame
        if pairs > max_frame >> 3:
            raise RemoteProtocolError(f"D frame of {pairs} pairs (limit {max_frame} bytes)")
        scan = self._dscan if resumable else None
        r, blobs = scan if scan is not None else (10, 2 * pairs)
        r, blobs, need = _scan_data_frame(data, p, end, r, blobs, max_frame)
        if need:
            if resumable:
                self._dscan = (r, blobs)
            return -need
        self._dscan = None
        if self._window_bytes + r > self.limits.max_window_bytes:
            self._too_big()
        if not self._remaining:
            self._open_sticky(ver)
        self._events.append((seq, _decode_data_frame(data, p + 10, pairs)))
        if seq > self._highest:
            self._highest = seq
        self._hold(r, EVENT_OVERHEAD + D_OVERHEAD + PAIR_OVERHEAD * pairs)
        self._remaining -= 1
        if not self._remaining:
            self._flush(True)
        return p + r

    def _compressed(self, data: bytes | bytearray, p: int, end: int, size: int, depth: int) -> int:
        """A ``C`` frame nested in an inflated one, at ``p``: inflated whole (once
        :attr:`room` has room) and parsed to its end.

        Beats never nests them; one that does may take the budget past its
        limit by what one nested frame inflates to, one at a time: what it
        holds is charged (by asking :attr:`room` again) before anything else runs.
        """
        self._check_compressed(size, depth)
        q = p + 6 + size
        if q > end:
            return -(6 + size)
        room = self.room
        if room is not None and room() <= 0:
            # Waits whole in the carry until there is room (:meth:`_stream` resumes it).
            return -(6 + size)
        inflated = self._inflate(data, p + 6, q, self._inflation_bound(size))
        self._parse(inflated, 0, len(inflated), depth + 1)
        if room is not None:
            room()
        return q

    def _check_compressed(self, size: int, depth: int) -> None:
        limits = self.limits
        if depth >= limits.max_depth:
            raise RemoteProtocolError(f"C frames nested deeper than {limits.max_depth}")
        if size > limits.max_frame:
            raise RemoteProtocolError(f"C frame of {size} bytes (limit {limits.max_frame})")

    def _inflation_bound(self, size: int) -> int:
        """The most a ``C`` frame of ``size`` compressed bytes may inflate to."""
        limits = self.limits
        return min(limits.max_inflated, limits.max_ratio * size, limits.max_window_bytes)

    # -- a C frame inflated as it arrives ----------------------------------------------
    def _start_stream(self, size: int) -> None:
        """A ``C`` frame's header at the top: inflate its bytes as they arrive."""
        self._check_compressed(size, 0)
        self._c_mark = len(self._events)
        self._inflater = _inflating.decompressobj()
        self._c_size = self._c_left = size
        self._c_bound = self._inflation_bound(size)
        self._c_out = 0

    def _stream(self, data: bytes | bytearray, p: int, end: int) -> int:
        """Inflate the streamed ``C`` frame: first what waited for room, then its
        compressed bytes in ``data[p:end]``, piece by piece while :attr:`room`
        allows; return the offset after the bytes taken. Sets ``_need``: 1 when
        it needs more input, 0 when it waits for room (or a window is ready)."""
        if self._offload is not None:
            self._take_back()
        carry = self._carry
        if carry and len(carry) >= self._carry_need:  # a nested C frame waited for room
            self._parse_piece(b"")
        if self._tail or self._more:
            self._inflate_pieces(None)
        take = min(end - p, self._c_left)
        if take and not self._tail and not self._more and self._carry_ready():
            self._c_left -= take
            with memoryview(data) as whole, whole[p : p + take] as src:
                self._inflate_pieces(src)
            p += take
        inflater = self._inflater
        if self._tail or self._more or not self._carry_ready():
            self._need = 0  # waiting for room (a nested C frame in the carry, maybe the last)
        elif inflater.eof:
            if inflater.unused_data or self._c_left:
                raise RemoteProtocolError("bytes after the zlib stream in a C frame")
            if self._carry:
                raise RemoteProtocolError("a frame is cut short at the end of a C frame")
            self._end_stream()
            self._unchecked = 0  # the windows it completed are good: returned now
            self._need = 0 if self._ready else 1
        elif not self._c_left:
            raise RemoteProtocolError("truncated zlib stream in a C frame")
        else:
            self._need = 1
        return p

    def _hand_out(self, data: bytes | bytearray, p: int, end: int, size: int) -> int:
        """The ``C`` frame at ``p``, once whole, as an :class:`Inflate` event to run.

        Returns the offset after it, ``p`` while :attr:`room` says to wait, or minus
        the bytes it needs. Its decompressor is the one a streamed frame uses, so
        what the event does not inflate (beyond :data:`OFFLOAD_STEP`) is inflated
        inline by :meth:`_stream`, within the same bounds.
        """
        self._check_compressed(size, 0)
        q = p + 6 + size
        if q > end:
            return -(6 + size)
        if self.room is not None and self.room() <= 0:
            return p
        self._start_stream(size)
        self._c_left = 0
        window_left = self.limits.max_window_bytes - self._window_bytes
        limit = max(1, min(OFFLOAD_STEP, self._c_bound + 1, window_left + 1))
        payload = bytes(data[p + 6 : q])
        self._offload = Inflate(payload, limit, self._inflater.decompress)
        self._need = 0
        return q

    def _take_back(self) -> None:
        """The :class:`Inflate` event ran: its piece, checked as an inline one is, parsed."""
        offload = self._offload
        assert offload is not None
        self._offload = None
        error = offload.error
        if error is not None:
            if isinstance(error, (zlib.error, _inflating.error)):
                raise RemoteProtocolError(f"bad zlib stream in a C frame: {error}") from None
            raise error
        piece = offload.piece
        assert piece is not None
        inflater = self._inflater
        self._c_out += len(piece)
        self.inflated_bytes += len(piece)
        if self._c_out > self._c_bound:
            raise RemoteProtocolError(
                f"C frame of {self._c_size} bytes inflates past {self._c_bound} bytes"
            )
        self._more = len(piece) == offload.limit and not inflater.eof
        self._tail = bytes(inflater.unconsumed_tail)
        if piece:
            self._parse_piece(piece)

    def _carry_ready(self) -> bool:
        """Whether the carry is not a whole nested ``C`` frame waiting for room."""
        carry = self._carry
        return not carry or len(carry) < self._carry_need

    def _inflate_pieces(self, src: memoryview | None) -> None:
        """Inflate ``src`` (None: what waited) in pieces of at most ``_INFLATE_STEP``,
        parsing each; stop early when :attr:`room` says to wait, keeping the rest."""
        inflater = self._inflater
        room = self.room
        limits = self.limits
        pending: bytes | memoryview = self._tail if src is None else src
        more = self._more
        bound = self._c_bound
        try:
            while pending or more:
                if (room is not None and room() <= 0) or not self._carry_ready():
                    break
                window_left = limits.max_window_bytes - self._window_bytes - len(self._carry)
                limit = max(1, min(_INFLATE_STEP, bound - self._c_out + 1, window_left + 1))
                piece = inflater.decompress(pending, limit)
                pending = inflater.unconsumed_tail
                self._c_out += len(piece)
                self.inflated_bytes += len(piece)
                if self._c_out > bound:
                    raise RemoteProtocolError(
                        f"C frame of {self._c_size} bytes inflates past {bound} bytes"
                    )
                more = len(piece) == limit and not inflater.eof
                if piece:
                    self._parse_piece(piece)
                if inflater.eof or (not piece and not pending):
                    break
        except (zlib.error, _inflating.error) as e:
            raise RemoteProtocolError(f"bad zlib stream in a C frame: {e}") from None
        self._more = more
        self._tail = bytes(pending)

    def _parse_piece(self, piece: bytes) -> None:
        """Parse a piece of inflated bytes; a frame cut at its end is carried.

        A frame cut between pieces is completed in the carry with just the bytes
        it needs, so the rest of the piece is read in place (its payloads sliced
        once); what waits for room (a nested ``C`` frame) keeps the rest after it.
        """
        carry = self._carry
        start = 0
        with memoryview(piece) as view:
            while carry:
                short = self._carry_need - len(carry)
                if short > 0:
                    take = min(short, len(piece) - start)
                    carry += view[start : start + take]
                    start += take
                    if take < short:
                        break
                p = self._parse(carry, 0, len(carry), 1)
                del carry[:p]
                if carry and len(carry) >= self._carry_need:  # a nested C waits for room
                    carry += view[start:]
                    start = len(piece)
                    break
            if start < len(piece):
                p = self._parse(piece, start, len(piece), 1)
                carry += view[p:]
        if self._window_bytes + len(carry) > self.limits.max_window_bytes:
            self._too_big()

    def _end_stream(self) -> None:
        self._inflater = None
        self._offload = None
        self._c_left = self._c_out = 0
        self._tail = b""
        self._more = False
        self._carry = bytearray()
        self._carry_need = 0

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
            if self._inflater is not None:
                self._unchecked += 1

    def _open_sticky(self, ver: int) -> int:
        """A data frame with no window open starts one of the last ``W``'s size."""
        if not self._sticky:
            raise RemoteProtocolError("data frame before any W frame")
        self._win_version = ver
        self._win_size = self._remaining = self._sticky
        self._highest = 0
        return self._sticky

    def _hold(self, nbytes: int, overhead: int) -> None:
        """The window being received holds ``nbytes`` more frame bytes, within
        ``max_window_bytes``, in objects costing ``overhead`` more."""
        self._window_bytes += nbytes
        self._overhead += overhead
        if self._window_bytes > self.limits.max_window_bytes:
            self._too_big()

    def _too_big(self) -> NoReturn:
        raise RemoteProtocolError(
            f"a window holding more than {self.limits.max_window_bytes} bytes of events"
        )

    def _flush(self, complete: bool) -> None:
        """The window being received is ready: whole, or cut short by a new ``W``."""
        version = self._win_version - 0x30
        held = self._window_bytes + self._overhead
        if self._floor:  # parts of it were taken: the rest must come after them
            if self._events and min(map(_SEQ, self._events)) <= self._floor:
                raise self._not_rising()
            self._taken = self._floor = 0
        self._ready.append(
            Window(version, self._win_size, self._events, self._highest, complete, held)
        )
        self._ready_bytes += held
        if self._inflater is not None:
            self._unchecked += 1
            self._c_mark = 0
        self._events = []
        self._window_bytes = self._overhead = 0
        self._remaining = 0

    def _inflate(self, data: bytes | bytearray, start: int, stop: int, bound: int) -> bytes:
        """Inflate the nested zlib stream ``data[start:stop]`` whole, within ``bound``."""
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


class ClientCodec(Lifecycle):
    """The writer side of one Lumberjack connection: windows out, acks matched to them.

    :meth:`send_window` (or :meth:`window_sent`, for a window encoded
    elsewhere) puts a window in flight; :meth:`next_event` matches each ``A``
    frame to the oldest window in flight and returns a
    :class:`~protocols.lumberjack.events.Progress`. An ``A`` frame of another
    version, with no window in flight (but ``A 0``) or beyond the window is
    a :class:`~gateway.core.errors.RemoteProtocolError`.
    """

    def __init__(self, version: int = 2) -> None:
        if version not in (1, 2):
            raise ValueError(f"Lumberjack version must be 1 or 2, not {version!r}")
        super().__init__()
        self.version = version
        self._version_byte = version + 0x30
        #: ``[size, events acked]`` of each window in flight, oldest first.
        self._inflight: deque[list[int]] = deque()

    @property
    def windows_in_flight(self) -> int:
        """Windows sent and not yet acked whole."""
        return len(self._inflight)

    @property
    def events_in_flight(self) -> int:
        """Events sent and not yet acked."""
        return sum(size - acked for size, acked in self._inflight)

    def send_window(self, payloads: Sequence[bytes], *, compression_level: int = 3) -> bytes:
        """``W n`` + one ``C`` of ``J`` frames numbered 1..n (level 0: bare ``J``), in flight."""
        wire = encode_window(self.version, payloads, compression_level)
        self.window_sent(len(payloads))
        return wire

    def window_sent(self, size: int) -> None:
        """A window of ``size`` events numbered 1..size, encoded elsewhere, is in flight
        (refused in ``ERROR``)."""
        self._check_send("window_sent")
        self._inflight.append([size, 0])

    def next_event(self) -> Progress | ConnectionClosed | NeedData:
        """The next :class:`Progress`, :class:`ConnectionClosed`, or :data:`NEED_DATA`."""
        if self._state is not _OPEN:
            return self._not_open()
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
            return self._closed()
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
