"""ttrpc's message frame: a 10-byte header and up to 4 MiB of data.

``[u32 data length][u32 stream id][u8 type][u8 flags][data]``, big-endian
(containerd/ttrpc ``channel.go``). :class:`FrameReader` cuts received bytes
into :class:`Frame` events without I/O. A frame whose declared length is
over :data:`MAX_DATA` is never buffered: the reader reports it as
:class:`Oversize` at once and skips its data as it arrives, and the
connection goes on, as Go's server does (it answers RESOURCE_EXHAUSTED on
that stream and keeps the connection).
"""

from __future__ import annotations

import enum
import struct
from collections import deque
from collections.abc import Iterable
from typing import Final, NamedTuple

from gateway.sdk import NEED_DATA, ConnectionClosed, LocalProtocolError, NeedData, ReceiveBuffer

__all__ = [
    "HEADER",
    "MAX_DATA",
    "Flags",
    "Frame",
    "FrameReader",
    "MessageType",
    "Oversize",
    "encode_frame",
    "frames_size",
]

#: Data length, stream id, message type, flags.
HEADER: Final = struct.Struct(">IIBB")
#: The largest data a frame may carry (``messageLengthMax``); exactly this is accepted.
MAX_DATA: Final = 4 << 20
#: The largest stream id (ids are unsigned 32-bit).
MAX_STREAM_ID: Final = 2**32 - 1


class MessageType(enum.IntEnum):
    REQUEST = 0x01
    RESPONSE = 0x02
    DATA = 0x03


class Flags:
    """Flags of Request and Data frames (a Response has none): plain ints, as every
    frame tests them (an ``enum.IntFlag``'s ``&`` costs a microsecond each)."""

    NONE: Final = 0
    #: Request: non-unary, the client sends no data. Data: the sender's last.
    REMOTE_CLOSED: Final = 0x01
    #: Request: non-unary, the client goes on sending Data.
    REMOTE_OPEN: Final = 0x02
    #: Data (and ttrpc-rust's Request): the frame carries no message, not even an empty one.
    NO_DATA: Final = 0x04


class Frame(NamedTuple):
    """One whole frame. ``type`` stays an int: unknown types are for the caller to
    ignore (Go's server does), not an error here. (A named tuple: made for every
    frame, it costs half of a frozen dataclass.)"""

    stream_id: int
    type: int
    flags: int
    data: bytes


class Oversize(NamedTuple):
    """A frame declared ``length`` > :data:`MAX_DATA` bytes; its data is skipped, not read."""

    stream_id: int
    type: int
    flags: int
    length: int


def encode_frame(stream_id: int, type: int, flags: int, data: bytes = b"") -> bytes:
    """The bytes of one frame; LocalProtocolError for data over :data:`MAX_DATA` or a
    field out of range (never sent, as Go >= 1.2.6 refuses oversize sends)."""
    if len(data) > MAX_DATA:
        raise LocalProtocolError(
            f"message length {len(data)} exceed maximum message size of {MAX_DATA}"
        )
    if not 0 <= stream_id <= MAX_STREAM_ID or not 0 <= type <= 255 or not 0 <= flags <= 255:
        raise LocalProtocolError(
            f"frame fields out of range: id {stream_id} type {type} flags {flags}"
        )
    return HEADER.pack(len(data), stream_id, type, flags) + data


class FrameReader:
    """Received bytes in, :class:`Frame` / :class:`Oversize` events out.

    Feed with :meth:`receive_data` (``b""``: the peer closed its side); take
    every whole frame at once with :meth:`frames` (then :meth:`end` says
    whether more may come), or one at a time with :meth:`next_event` until it
    returns :data:`NEED_DATA`. After the end of input :meth:`next_event`
    returns :class:`ConnectionClosed` (a partial frame is dropped).
    """

    def __init__(self, max_data: int = MAX_DATA, buffer: ReceiveBuffer | None = None) -> None:
        self.max_data = max_data
        #: A codec passes its own (the lifecycle's), so both see the same bytes.
        self._buffer = ReceiveBuffer() if buffer is None else buffer
        #: Bytes of an oversize frame's data still to skip.
        self._skip = 0
        #: Frames cut and not yet returned by :meth:`next_event`.
        self._ready: deque[Frame | Oversize] = deque()

    @property
    def held_bytes(self) -> int:
        """What received bytes not yet returned (a partial frame; whole frames cut and
        not yet taken) really take: the receive buffer's allocation, which the memory
        budget charges, and the frames' bytes; skipped data excluded."""
        return self._buffer.allocated + frames_size(self._ready)

    @property
    def skipping(self) -> int:
        """Bytes of an oversize frame's data still to come and be dropped."""
        return self._skip

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self._buffer.feed(data)

    def frames(self) -> list[Frame | Oversize]:
        """Every frame received whole since the last call, in order (an oversize one as
        :class:`Oversize`, its data skipped as it arrives)."""
        buf = self._buffer
        data, pos = buf.data, buf.pos
        end = len(data)
        skip = self._skip
        max_data = self.max_data
        unpack = HEADER.unpack_from
        new = tuple.__new__
        frames: list[Frame | Oversize] = []
        while True:
            if skip:
                dropped = min(skip, end - pos)
                skip -= dropped
                pos += dropped
                if skip:
                    break
            start = pos + 10  # HEADER.size
            if start > end:
                break
            length, stream_id, type, flags = unpack(data, pos)
            if length > max_data:
                frames.append(Oversize(stream_id, type, flags, length))
                pos, skip = start, length
                continue
            stop = start + length
            if stop > end:
                break
            # tuple.__new__: a named tuple's own __new__ is a Python call, per frame.
            frames.append(new(Frame, (stream_id, type, flags, bytes(data[start:stop]))))
            pos = stop
        self._skip = skip
        buf.advance(pos)
        return frames

    def end(self) -> ConnectionClosed | NeedData:
        """What follows the last whole frame: :class:`ConnectionClosed` once the input
        ended, else :data:`NEED_DATA`."""
        return ConnectionClosed() if self._buffer.eof else NEED_DATA

    def next_event(self) -> Frame | Oversize | ConnectionClosed | NeedData:
        ready = self._ready
        if not ready:
            ready.extend(self.frames())
            if not ready:
                return self.end()
        return ready.popleft()


def frames_size(frames: Iterable[Frame | Oversize]) -> int:
    """Bytes of whole frames held (an oversize frame's data is never held)."""
    return sum(HEADER.size + len(f.data) for f in frames if isinstance(f, Frame))
