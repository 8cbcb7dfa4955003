"""The segment clients' errors, shared by the trio client and the blocking one.

They live apart from :mod:`.client` so that :mod:`.blocking` can raise the
same classes without importing trio: a Spark executor catches
``SegmentTruncatedError`` whichever client it runs.

:class:`SegmentClientError` is the base of every error a server's answer
causes. :class:`SegmentError` and its subclasses are the server refusing a
request about one segment, after which the connection is fine; a bare
:class:`SegmentClientError` is an answer that makes no sense for the request
(or says the server will close), after which the client drops the connection.
Network failures stay ``OSError`` (``TimeoutError`` for a timeout).
"""

from __future__ import annotations

from gateway.sdk import ProtocolError

from .events import (
    Command,
    ErrorMessage,
    NoSuchSegment,
    SegmentIsSealed,
    SegmentIsTruncated,
)

__all__ = [
    "NoSuchSegmentError",
    "SegmentClientError",
    "SegmentError",
    "SegmentSealedError",
    "SegmentTruncatedError",
    "refusal",
]


class SegmentClientError(ProtocolError):
    """A server answered something a client cannot go on with."""


class SegmentError(SegmentClientError):
    """The server refused a request about :attr:`segment` (the connection is fine)."""

    def __init__(self, segment: str, message: str) -> None:
        super().__init__(message)
        self.segment = segment


class NoSuchSegmentError(SegmentError):
    """The segment does not exist (and the server does not create it)."""


class SegmentSealedError(SegmentError):
    """The segment takes no more appends."""


class SegmentTruncatedError(SegmentError):
    """The offset read is below the segment's retained start, :attr:`start_offset`; or,
    from an Interchange gateway, inside a damaged record it never serves, which ends at
    :attr:`start_offset`. Either way, reading may go on there."""

    def __init__(self, segment: str, message: str, start_offset: int) -> None:
        super().__init__(segment, message)
        self.start_offset = start_offset


def refusal(command: Command) -> SegmentError:
    """The typed error of a server's error reply."""
    segment = getattr(command, "segment", "")
    if isinstance(command, NoSuchSegment):
        return NoSuchSegmentError(segment, f"no segment {segment!r}")
    if isinstance(command, SegmentIsSealed):
        return SegmentSealedError(segment, f"segment {segment!r} is sealed")
    if isinstance(command, SegmentIsTruncated):
        why = f": {command.server_stack_trace}" if command.server_stack_trace else ""
        return SegmentTruncatedError(
            segment,
            f"segment {segment!r} can be read from offset {command.start_offset}, not from "
            f"{command.offset}{why}",
            command.start_offset,
        )
    if isinstance(command, ErrorMessage):
        return SegmentError(segment, f"segment {segment!r}: {command.message}")
    return SegmentError(segment, f"the server refused: {command!r}")
