"""The Lumberjack codec's events, as frozen data.

A server codec turns the frames a Beats-style writer sends into whole
:class:`Window` events (one per acknowledgeable window, never one per data
frame, so the per-event cost stays at one tuple) and answers them with
:class:`Ack`. A client codec matches the reader's ``A`` frames to the windows
it sent and says what each one means with a :class:`Progress`.
:class:`ConnectionClosed` (the toolkit's, shared by every protocol) marks the
end of input on either side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.sdk import ConnectionClosed

__all__ = ["Ack", "ConnectionClosed", "Event", "Inflate", "Progress", "Window"]


class Event:
    """Base of every Lumberjack event; never instantiated itself."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Window(Event):
    """One window of data frames, as the writer announced it with ``W``.

    Answer it with ``Ack(window.version, window.highest_seq)`` once its events
    are safely handed off. A window that ends early (the input ended) is never
    emitted.
    """

    #: 1 or 2: the version byte of the window's ``W`` frame (or of the first
    #: data frame, for a sticky v1 window that had no ``W`` of its own).
    version: int
    #: The announced window size (for a sticky window, the last ``W``'s size).
    size: int
    #: ``(seq, payload)`` in wire order: the JSON bytes of a ``J`` frame (not
    #: parsed), or the key/value dict of a ``D`` frame.
    events: list[tuple[int, bytes | dict[str, str]]]
    #: The largest sequence number in ``events``; 0 for an empty window.
    highest_seq: int
    #: False when a new ``W`` arrived before ``size`` events (a partial window,
    #: acked like any other).
    complete: bool
    #: Bytes the window holds as allocated (its frame bytes and the objects of its
    #: events), as the codec charged them while it was received; 0 if not counted.
    held: int = field(default=0, compare=False, repr=False)
    #: True for the events received so far of a window still arriving, taken after
    #: a linger (:meth:`~protocols.lumberjack.codec.ServerCodec.take_part`): acked
    #: with ``highest_seq`` like a window, and more of the same window follows.
    part: bool = False


@dataclass(eq=False, slots=True)
class Inflate(Event):
    """A ``C`` frame's compressed bytes, handed out to be inflated off the event loop.

    Returned by a server codec whose
    :attr:`~protocols.lumberjack.codec.ServerCodec.offload_at` is set, for a
    ``C`` frame at least that large: call :meth:`run` (in a thread: it touches
    nothing but this event and its decompressor, and zlib releases the GIL
    while it inflates), then ``next_event`` again, which checks the piece
    against the same bounds as an inline one and parses it. The codec does
    nothing else meanwhile; calling ``next_event`` before :meth:`run` is an
    error. Not frozen: :meth:`run` fills in its outcome.
    """

    #: The frame's compressed bytes, whole.
    data: bytes
    #: The most bytes to inflate here (the codec inflates the rest, if any, inline).
    limit: int
    #: The frame's decompressor's ``decompress``.
    decompress: Callable[[bytes, int], bytes] = field(repr=False)
    #: What :meth:`run` inflated (None until it ran) ...
    piece: bytes | None = field(default=None, repr=False)
    #: ... or the error it met (a bad zlib stream).
    error: Exception | None = field(default=None, repr=False)

    @property
    def done(self) -> bool:
        """Whether :meth:`run` ran."""
        return self.piece is not None or self.error is not None

    def run(self) -> None:
        """Inflate up to :attr:`limit` bytes of :attr:`data`; safe in any thread."""
        try:
            self.piece = self.decompress(self.data, self.limit)
        except Exception as e:  # the codec says what it means, from next_event
            self.error = e


@dataclass(frozen=True, slots=True)
class Ack(Event):
    """An ``A`` frame: every event up to and including ``seq`` is acknowledged."""

    #: 1 or 2: must be the version of the window it answers.
    version: int
    seq: int


@dataclass(frozen=True, slots=True)
class Progress(Event):
    """What one ``A`` frame means for the oldest window in flight (the client side).

    Windows are numbered 1..n, so ``seq`` also counts the window's events
    acknowledged so far: its events ``[seq - acked : seq]`` are the newly
    acknowledged ones. ``acked == 0`` is a keepalive (``A 0``) or a repeated ack.
    """

    #: The ``A`` frame's sequence number.
    seq: int
    #: Events newly acknowledged by this frame.
    acked: int
    #: The window is acknowledged whole and no longer in flight: the next ``A``
    #: frame answers the next window.
    window_done: bool
