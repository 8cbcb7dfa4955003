"""What the server and client codecs share: a frame reader, a queue of decided events,
and the loop that turns frames into events (each role says how, in ``_frame``)."""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from gateway.sdk import ConnectionClosed, NeedData

from .frames import MAX_DATA, Frame, FrameReader, Oversize, frames_size

__all__ = ["FramedConnection"]

E = TypeVar("E")


class FramedConnection(Generic[E]):
    """A sans-IO ttrpc connection of either role; subclasses implement :meth:`_frame`."""

    def __init__(self, max_data: int = MAX_DATA) -> None:
        self._reader = FrameReader(max_data)
        #: Events decided and not yet returned (a close after its last message).
        self._queued: deque[E] = deque()
        #: Frames cut from what was received, and the index of the next to decide.
        self._frames: list[Frame | Oversize] = []
        self._next = 0

    @property
    def held_bytes(self) -> int:
        """Received bytes not yet decided: a partial frame, whole frames not yet turned
        into events (skipped oversize data excluded)."""
        return self._reader.held_bytes + frames_size(self._frames[self._next :])

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes; ``b""`` means the peer closed its side."""
        self._reader.receive_data(data)

    def next_event(self) -> E | ConnectionClosed | NeedData:
        """The next event, :data:`~gateway.protocol.NEED_DATA`, or :class:`ConnectionClosed`
        once the peer closed its side."""
        if self._queued:
            return self._queued.popleft()
        frames, decide = self._frames, self._frame
        i = self._next
        while True:
            if i >= len(frames):
                # Cut every whole frame at once: many small frames arrive in one read.
                frames = self._frames = self._reader.frames()
                i = 0
                if not frames:
                    self._next = 0
                    return self._reader.end()
            frame = frames[i]
            i += 1
            event = decide(frame)
            if event is not None:
                self._next = i
                return event

    def _frame(self, frame: Frame | Oversize) -> E | None:
        """The event a frame makes (None: it makes none)."""
        raise NotImplementedError
