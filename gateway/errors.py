"""Errors shared by every protocol codec (importing this pulls in no I/O library).

As in h11: a :class:`RemoteProtocolError` means the peer broke the protocol
(answer with the protocol's error reply if it has one, then close); a
:class:`LocalProtocolError` means our side tried something the protocol does
not allow in the current state (a bug, or a misused API).
"""

from __future__ import annotations

__all__ = ["LocalProtocolError", "ProtocolError", "RemoteProtocolError", "first_leaf"]


class ProtocolError(Exception):
    """A protocol rule was broken; the connection cannot go on as it was."""


class LocalProtocolError(ProtocolError):
    """We (the caller of a codec) broke the protocol."""


class RemoteProtocolError(ProtocolError):
    """The peer broke the protocol."""


def first_leaf(error: BaseException) -> BaseException:
    """The first leaf exception of a (possibly nested) group, for a one-line log."""
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
