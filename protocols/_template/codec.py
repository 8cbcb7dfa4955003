"""TEMPLATE: the protocol's codecs, one class per role, sans I/O.

Copy this folder to start a protocol (see ``docs/codecs.md``). Each codec
stands on the toolkit's :class:`~gateway.sdk.Lifecycle`, which gives it its
state (:class:`~gateway.sdk.CodecState`: open, closed, error), its receive
buffer, ``receive_data``, ``held_bytes``, and the same answers as every
other protocol's codec: :class:`~gateway.sdk.ConnectionClosed` every time
once closed, :class:`~gateway.sdk.WrongState` once in error. What is left to
write is what this protocol says:

* ``next_event``: start with the state check, cut one frame from the buffer
  (checking its length against :class:`Limits` *before* waiting for the rest
  of it), parse it (:mod:`.frames`), check it against the protocol's own
  state, and return it; ``self._closed()`` once the input ended and every
  event was returned; the peer's errors go through ``self._fail``;
* ``send``: refuse what the state does not allow (``_check_send`` for
  ``ERROR``, a plain ``LocalProtocolError`` for the protocol's own rules)
  before changing anything, then encode.

The template's state is what each side may still send: a server answers
``OK``/``FAIL`` only while a publish awaits its answer (in order), and may
send ``ERR`` in any state (then it is in ``ERROR``); a client expects one
answer per publish it sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gateway.sdk import (
    NEED_DATA,
    CodecState,
    ConnectionClosed,
    Lifecycle,
    LocalProtocolError,
    NeedData,
    RemoteProtocolError,
)

from .events import Error, Event, Failed, Ok, Publish
from .frames import encode, parse_client_frame, parse_server_frame

__all__ = ["NEED_DATA", "ClientCodec", "CodecState", "Limits", "ServerCodec"]

_OPEN: Final = CodecState.OPEN


@dataclass(frozen=True, slots=True)
class Limits:
    """What a codec accepts; each is checked before anything is buffered for it."""

    #: Longest line, its newline excluded.
    max_line: int = 64 * 1024


class _LineCodec(Lifecycle):
    """What both roles share: lines cut from the buffer, within ``max_line``."""

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__()
        self.limits = Limits() if limits is None else limits

    def _line(self) -> bytes | ConnectionClosed | NeedData:
        """The next whole line, :class:`ConnectionClosed` or :data:`NEED_DATA`."""
        buf = self._buffer
        nl = buf.find(b"\n")
        if nl < 0:
            if len(buf) > self.limits.max_line:  # refused while it is still arriving
                self._fail(f"line longer than {self.limits.max_line} bytes")
            if not buf.eof:
                return NEED_DATA
            return self._closed()  # a line cut by the end of input is dropped
        if nl - buf.pos > self.limits.max_line:
            self._fail(f"line longer than {self.limits.max_line} bytes")
        line = bytes(buf.data[buf.pos : nl])
        buf.advance(nl + 1)
        return line


class ServerCodec(_LineCodec):
    """The gateway's side: publishes in, answers out, in order."""

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__(limits)
        #: Publishes returned and not answered yet.
        self.owed = 0

    def next_event(self) -> Event | ConnectionClosed | NeedData:
        """The next :class:`~.events.Publish`, :class:`ConnectionClosed` or :data:`NEED_DATA`."""
        if self._state is not _OPEN:
            return self._not_open()
        line = self._line()
        if not isinstance(line, bytes):
            return line
        try:
            event = parse_client_frame(line)
        except RemoteProtocolError as e:
            self._fail(e)
        self.owed += 1
        return event

    def send(self, event: Event) -> bytes:
        """``OK``/``FAIL`` for the oldest publish awaiting its answer, or ``ERR`` (in any
        state; the codec is then in ``ERROR``)."""
        if isinstance(event, Error):
            wire = encode(event)
            self._enter_error()
            return wire
        self._check_send(f"send {type(event).__name__}")
        if not isinstance(event, Ok | Failed):
            raise LocalProtocolError(f"a server does not send {type(event).__name__}")
        if not self.owed:
            raise LocalProtocolError(f"{event!r}, but no publish awaits an answer")
        wire = encode(event)
        self.owed -= 1
        return wire


class ClientCodec(_LineCodec):
    """A client's side: publishes out, their answers in."""

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__(limits)
        #: Publishes sent and not answered yet.
        self.unanswered = 0

    def next_event(self) -> Event | ConnectionClosed | NeedData:
        """The next :class:`~.events.Ok`, :class:`~.events.Failed` or
        :class:`~.events.Error`, :class:`ConnectionClosed` or :data:`NEED_DATA`."""
        if self._state is not _OPEN:
            return self._not_open()
        line = self._line()
        if not isinstance(line, bytes):
            return line
        try:
            event = parse_server_frame(line)
            if not isinstance(event, Error):
                if not self.unanswered:
                    raise RemoteProtocolError(f"{event!r} answers no publish")
                self.unanswered -= 1
        except RemoteProtocolError as e:
            self._fail(e)
        return event

    def send(self, event: Event) -> bytes:
        """The line of a :class:`~.events.Publish` (refused in ``ERROR``)."""
        self._check_send(f"send {type(event).__name__}")
        if not isinstance(event, Publish):
            raise LocalProtocolError(f"a client does not send {type(event).__name__}")
        wire = encode(event)
        self.unanswered += 1
        return wire
