"""Errors shared by every protocol codec (importing this pulls in no I/O library).

As in h11: a :class:`RemoteProtocolError` means the peer broke the protocol
(answer with the protocol's error reply if it has one, then close); a
:class:`LocalProtocolError` means our side tried something the protocol does
not allow in the current state (a bug, or a misused API).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

__all__ = [
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "StorageFull",
    "first_leaf",
]


class ProtocolError(Exception):
    """A protocol rule was broken; the connection cannot go on as it was."""


class LocalProtocolError(ProtocolError):
    """We (the caller of a codec) broke the protocol."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol."""


class StorageFull(Exception):
    """The disk under durable storage has no room for a write now; nothing was written.

    Not a fault of the caller nor of its peer: the write is to be tried again, whole,
    once ``await error.room()`` returns (the storage believes there is room again).
    Whoever meets it holds its work meanwhile (a publisher is not acked, a connection
    stops being read), so a full disk is backpressure, never loss and never a
    disconnect.
    """

    def __init__(self, message: str, room: Callable[[], Awaitable[None]]) -> None:
        super().__init__(message)
        self.room = room


def first_leaf(error: BaseException) -> BaseException:
    """The first leaf exception of a (possibly nested) group, for a one-line log."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
