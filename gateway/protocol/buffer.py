"""A receive buffer parsed in place: one ``bytearray`` and a read offset.

Codecs parse frames from :attr:`ReceiveBuffer.data` at :attr:`ReceiveBuffer.pos`
(``struct.unpack_from(data, pos)``, ``data.find(sep, pos)``) instead of
reslicing per frame, then :meth:`~ReceiveBuffer.advance` past what they
consumed. Consumed bytes are dropped only once they are more than half the
buffer, so the cost of compaction stays linear in the bytes received.
"""

from __future__ import annotations

from gateway.core.errors import LocalProtocolError

__all__ = ["ReceiveBuffer"]


class ReceiveBuffer:
    """Bytes received and not yet parsed, plus whether the peer closed its side."""

    __slots__ = ("_sep", "data", "discarding", "eof", "pos", "searched")

    def __init__(self) -> None:
        self.data = bytearray()
        #: Where unparsed bytes start in :attr:`data`.
        self.pos = 0
        #: True once the peer closed its side (``feed(b"")``).
        self.eof = False
        #: :meth:`find` has searched ``data[pos:searched]`` already (for ``_sep``).
        self.searched = 0
        self._sep = b""
        #: After :meth:`discard`: received bytes are dropped, never parsed.
        self.discarding = False

    def __len__(self) -> int:
        """How many received bytes are not parsed yet."""
        return len(self.data) - self.pos

    @property
    def allocated(self) -> int:
        """Bytes the buffer really holds while any are unparsed: the unparsed ones, the
        parsed ones not dropped yet (fewer than those) and the ``bytearray``'s spare
        room. 0 when nothing is unparsed (the buffer is then empty). What a codec
        charges to the memory budget, not :func:`len`, which can be half of it."""
        data = self.data
        return data.__alloc__() if len(data) > self.pos else 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes; ``b""`` means the peer closed its sending side."""
        if not data:
            self.eof = True
        elif self.eof:
            raise LocalProtocolError("data received after end of input")
        elif not self.discarding:
            self.data += data

    def advance(self, pos: int) -> None:
        """Mark ``data[:pos]`` as parsed (compacting when that is half the buffer)."""
        data = self.data
        if pos > len(data) >> 1:
            del data[:pos]
            self.searched = max(0, self.searched - pos)
            pos = 0
        self.pos = pos

    def find(self, sep: bytes) -> int:
        """Index in :attr:`data` of the next ``sep`` after :attr:`pos`, or -1.

        Remembers how far it searched, so a long unit arriving in small pieces
        is scanned once, not once per piece.
        """
        data = self.data
        if sep != self._sep:  # the mark is only good for the separator it was made for
            self._sep = sep
            self.searched = 0
        start = self.searched if self.searched > self.pos else self.pos
        found = data.find(sep, start)
        if found < 0:
            self.searched = max(self.pos, len(data) - len(sep) + 1)
        return found

    def take(self, n: int) -> bytes:
        """The next ``n`` unparsed bytes (fewer if fewer arrived), consumed."""
        start = self.pos
        out = bytes(self.data[start : start + n])
        self.advance(start + len(out))
        return out

    def discard(self) -> None:
        """Drop everything buffered and everything received from now on (after an error)."""
        self.data = bytearray()
        self.pos = self.searched = 0
        self.discarding = True
