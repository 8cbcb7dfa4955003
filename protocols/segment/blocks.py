"""Append blocks: how a writer's events are cut into blocks, and put back together.

A client appends event frames (``[0][len][payload]``) in blocks. An
``AppendBlock`` header announces the whole block's length, the events follow
it on the wire, and an ``AppendBlockEnd`` closes it:

* **unbatched** (the block size is not above the event's size): one block
  holds exactly the events written at once, and its end says all of it is
  whole events;
* **batched** (block size ``B`` above the event's size): the header announces
  ``16 + B + 8`` bytes (the 8 reserve room for one more command header) and
  events stream into it. An event that does not fit fills the block with a
  ``PartialEvent`` of its first bytes and closes it, the rest of the event
  travelling in the end's ``data``; an event that fits exactly takes the same
  path with an empty rest. A block closed early (the caller decides when) is
  filled with ``Padding``.

:class:`BlockWriter` does that, byte for byte as Pravega's client
``CommandEncoder``. On the server, :func:`read_block_end` and
:func:`assemble` check a received block and its end (the checks Pravega's
segment store makes on a block) and rebuild the events' bytes
``block[:sizeOfWholeEvents] ‖ partial ‖ end.data``, which must be exactly
``numEvents`` event frames; the server codec returns them as one
:class:`~.events.Append`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Final, NamedTuple
from uuid import UUID

from gateway.sdk import LocalProtocolError, RemoteProtocolError

from .events import (
    MAX_EVENT_PAYLOAD,
    MAX_WIRECOMMAND_SIZE,
    AppendBlockEnd,
    CommandType,
)
from .frames import HEADER, count_events, encode, type_name

__all__ = ["BlockEnd", "BlockWriter", "assemble", "read_block_end"]

#: The fixed fields of an ``AppendBlockEnd`` around its data: writer id,
#: ``sizeOfWholeEvents`` and ``dataLength`` before it, ``numEvents`` and
#: ``lastEventNumber`` after it (the request id after them is optional).
_END_HEAD: Final = 16 + 4 + 4
_END_TAIL: Final = struct.Struct(">iq")
_END_MIN: Final = _END_HEAD + _END_TAIL.size
_I64: Final = struct.Struct(">q")
_I32X2: Final = struct.Struct(">ii")
#: A block's header announces the writer id too.
_WRITER: Final = 16
_APPEND_BLOCK: Final = int(CommandType.APPEND_BLOCK)
_PARTIAL: Final = int(CommandType.PARTIAL_EVENT)
_PADDING: Final = int(CommandType.PADDING)


class BlockWriter:
    """The client's block writer: events in, ``AppendBlock``… ``AppendBlockEnd`` bytes out.

    At most one batched block is open at a time (for one writer); writing
    for another writer, or :meth:`close`, closes it with ``Padding``.
    """

    def __init__(self, max_command: int = MAX_WIRECOMMAND_SIZE) -> None:
        self.max_command = max_command
        # The open batched block (writer None: none is open).
        self._writer: UUID | None = None
        self._size = 0
        self._left = 0
        self._count = 0
        self._last = 0
        self._request_id = -1

    @property
    def open_writer(self) -> UUID | None:
        """The writer whose batched block is open, or None."""
        return self._writer

    def write(
        self,
        writer_id: UUID,
        payloads: Sequence[bytes],
        last_event_number: int,
        *,
        block_size: int = 0,
        request_id: int = -1,
    ) -> bytes:
        """The bytes that append ``payloads``, numbered up to ``last_event_number``.

        Events go into the open block of ``writer_id`` while they fit; else a
        batched block of ``block_size`` starts for each event smaller than it,
        and consecutive events that are not smaller share one unbatched block.
        A batched block may stay open after the call.
        """
        out = self._begin(writer_id, payloads, block_size, request_id)
        put = out.append
        header = HEADER.pack
        # The open batched block, in locals for the loop (written back at the end).
        is_open = self._writer is not None
        left, count, last = self._left, self._count, self._last
        run = _Run(self, writer_id)  # the events of an unbatched block being gathered
        number = last_event_number - len(payloads)
        for payload in payloads:
            number += 1
            length = len(payload)
            size = 8 + length
            if is_open:
                if left > size:
                    put(header(0, length))
                    put(payload)
                    left, count, last = left - size, count + 1, number
                    continue
                # The event does not fit (or fits exactly): a partial event fills the block.
                out += self._fill(writer_id, left, count + 1, number, header(0, length) + payload)
                is_open = False
            elif block_size > size:
                run.flush(out, number - 1)
                out += self._start(writer_id, block_size, payload)
                is_open = True
                left, count, last = block_size - size, 1, number
            else:
                run.add(out, payload, number)
        run.flush(out, number)
        self._writer = writer_id if is_open else None
        self._left, self._count, self._last = left, count, last
        return b"".join(out)

    def _begin(
        self, writer_id: UUID, payloads: Sequence[bytes], block_size: int, request_id: int
    ) -> list[bytes]:
        """Refuse a block size or an event this writer cannot send; else the output so
        far: another writer's open block, closed."""
        if not 0 <= block_size <= self.max_command - _WRITER - 8:
            raise LocalProtocolError(
                f"block size {block_size} outside 0..{self.max_command - _WRITER - 8}"
            )
        for payload in payloads:
            if len(payload) > MAX_EVENT_PAYLOAD:
                raise LocalProtocolError(
                    f"event of {len(payload)} bytes exceeds {MAX_EVENT_PAYLOAD} bytes"
                )
        out = [self.close()] if self._writer is not None and self._writer != writer_id else []
        self._request_id = request_id  # (after: the block closed is another append's)
        return out

    def _start(self, writer_id: UUID, block_size: int, payload: bytes) -> tuple[bytes, ...]:
        """A batched block of ``block_size`` opens with its first event."""
        self._size = block_size
        return (
            HEADER.pack(_APPEND_BLOCK, _WRITER + block_size + 8) + writer_id.bytes,
            HEADER.pack(0, len(payload)),
            payload,
        )

    def _fill(
        self, writer_id: UUID, left: int, count: int, number: int, frame: bytes
    ) -> tuple[bytes, ...]:
        """The open block's last ``left`` bytes take the start of ``frame`` as a
        ``PartialEvent``; its end carries the rest, ``count`` events up to ``number``."""
        return (
            HEADER.pack(_PARTIAL, left),
            frame[:left],
            self._end(writer_id, self._size - left, frame[left:], count, number),
        )

    def close(self) -> bytes:
        """Close the open batched block with ``Padding`` and its end (``b""`` if none)."""
        writer = self._writer
        if writer is None:
            return b""
        left = self._left
        self._writer = None
        return b"".join(
            (
                HEADER.pack(_PADDING, left),
                bytes(left),
                self._end(writer, self._size - left, b"", self._count, self._last),
            )
        )

    def _unbatched(
        self, writer_id: UUID, frames: list[bytes], size: int, count: int, last: int
    ) -> bytes:
        head = HEADER.pack(_APPEND_BLOCK, _WRITER + size) + writer_id.bytes
        end = encode(AppendBlockEnd(writer_id, size, b"", count, last, self._request_id))
        return b"".join((head, *frames, end))

    def _end(self, writer_id: UUID, whole: int, data: bytes, count: int, last: int) -> bytes:
        return encode(AppendBlockEnd(writer_id, whole, data, count, last, self._request_id))


class _Run:
    """The event frames of one unbatched block being gathered by :meth:`BlockWriter.write`."""

    __slots__ = ("blocks", "count", "frames", "size", "writer_id")

    def __init__(self, blocks: BlockWriter, writer_id: UUID) -> None:
        self.blocks = blocks
        self.writer_id = writer_id
        self.frames: list[bytes] = []
        self.size = self.count = 0

    def add(self, out: list[bytes], payload: bytes, number: int) -> None:
        """Gather event ``number``; a block that would pass the command size goes first."""
        size = 8 + len(payload)
        if self.frames and _WRITER + self.size + size > self.blocks.max_command:
            self.flush(out, number - 1)
        self.frames += (HEADER.pack(0, len(payload)), payload)
        self.size += size
        self.count += 1

    def flush(self, out: list[bytes], last: int) -> None:
        """The gathered events, up to event ``last``, as one block (if any)."""
        if self.frames:
            out.append(
                self.blocks._unbatched(self.writer_id, self.frames, self.size, self.count, last)
            )
            self.frames = []
            self.size = self.count = 0


class BlockEnd(NamedTuple):
    """A received ``AppendBlockEnd``'s fields; its data is ``buffer[data : data + data_length]``."""

    size_of_whole_events: int
    data: int
    data_length: int
    num_events: int
    last_event_number: int
    request_id: int


def read_block_end(buffer: bytes | bytearray, start: int, stop: int) -> BlockEnd:
    """The fields of the ``AppendBlockEnd`` body ``buffer[start:stop]`` (writer id first)."""
    if stop - start < _END_MIN:
        raise RemoteProtocolError("AppendBlockEnd ends inside its fields")
    whole, data_length = _I32X2.unpack_from(buffer, start + _WRITER)
    data = start + _END_HEAD
    if data_length < 0 or data_length > stop - data - _END_TAIL.size:
        raise RemoteProtocolError(f"AppendBlockEnd data length {data_length} outside its body")
    p = data + data_length
    num_events, last = _END_TAIL.unpack_from(buffer, p)
    p += _END_TAIL.size
    request_id = _I64.unpack_from(buffer, p)[0] if stop - p >= 8 else -1
    return BlockEnd(whole, data, data_length, num_events, last, request_id)


def assemble(
    buffer: bytes | bytearray,
    block: int,
    block_stop: int,
    end: BlockEnd,
    max_payload: int = MAX_EVENT_PAYLOAD,
) -> bytes:
    """The events of the block ``buffer[block:block_stop]`` (after its writer id) and its end.

    Checks ``0 <= sizeOfWholeEvents <= block``, that the rest of the block is
    exactly one ``PartialEvent`` or ``Padding`` (a ``Padding`` with an empty
    end data), and that the result is exactly ``numEvents`` event frames of
    at most ``max_payload`` bytes each.
    """
    whole = end.size_of_whole_events
    if not 0 <= whole <= block_stop - block:
        raise RemoteProtocolError(
            f"sizeOfWholeEvents {whole} outside the block's {block_stop - block} bytes"
        )
    rest = block + whole
    spans = [(block, rest)]
    if rest < block_stop:
        if block_stop - rest < 8:
            raise RemoteProtocolError(
                f"{block_stop - rest} bytes after the whole events: not a command header"
            )
        code, length = HEADER.unpack_from(buffer, rest)
        if code != _PARTIAL and code != _PADDING:
            raise RemoteProtocolError(
                f"{type_name(code)} after the whole events of a block"
                " (expected PARTIAL_EVENT or PADDING)"
            )
        if length != block_stop - rest - 8:
            raise RemoteProtocolError(
                f"{type_name(code)} of {length} bytes in the {block_stop - rest - 8}"
                " bytes left in the block"
            )
        if code == _PARTIAL:
            spans.append((rest + 8, block_stop))
        elif end.data_length:
            raise RemoteProtocolError(
                f"a padded block's end carries {end.data_length} bytes of data"
            )
    if end.data_length:
        spans.append((end.data, end.data + end.data_length))
    # The views are gone before this returns: a bytearray with a view cannot be resized.
    with memoryview(buffer) as view:
        if len(spans) == 1:
            data = view[block:rest].tobytes()
        else:
            data = b"".join([view[a:b] for a, b in spans])
    count = count_events(data, 0, len(data), max_payload)
    if count != end.num_events:
        raise RemoteProtocolError(
            f"a block of {count} events says it holds {end.num_events} (numEvents)"
        )
    return data
