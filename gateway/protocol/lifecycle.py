"""The lifecycle every sans-IO codec shares: open, closed, error.

Each protocol's codecs (``ServerCodec``, ``ClientCodec``, ...; see
``docs/codecs.md``) subclass :class:`Lifecycle`, so one driver and one
conformance suite (:mod:`gateway.protocol.conformance`) can rely on the same
answers everywhere, in the manner of h11's ``_state.py`` and wsproto's
``Connection``:

============  ==================================  ===========================================
state         ``next_event()``                    sending
============  ==================================  ===========================================
``OPEN``      an event, :data:`NEED_DATA`, or     what the protocol's own state allows
              :class:`ConnectionClosed` (→CLOSED)
``CLOSED``    :class:`ConnectionClosed`, every    what the protocol's own state allows (the
              time                                peer closed its side; what we owe it goes)
``ERROR``     raises :class:`WrongState`, every   refused with :class:`WrongState`, but the
              time                                error reply and what the codec documents
============  ==================================  ===========================================

* The peer breaking the protocol is a
  :class:`~gateway.core.errors.RemoteProtocolError` raised through
  :meth:`Lifecycle._fail`, the only way into ``ERROR``: it drops what is held,
  so :attr:`~Lifecycle.held_bytes` is 0 from then on, and input received later
  is dropped unparsed. The error is *sticky*: nothing brings the codec back.
* Going to ``CLOSED`` (:meth:`Lifecycle._closed`) also drops what is held: a
  unit the peer did not finish is never returned.
* An action a state does not allow raises :class:`WrongState`, a
  :class:`~gateway.core.errors.LocalProtocolError` naming the state and the
  action. Refusals that depend on the protocol's own state (an ack for a
  window never returned, a reply with no call awaiting it) stay plain
  ``LocalProtocolError`` with their own message; either way a refused send
  changes nothing.

No I/O library is imported here, so a codec stays free of trio.
"""

from __future__ import annotations

import enum
from typing import NoReturn

from gateway.core.errors import LocalProtocolError, RemoteProtocolError
from gateway.protocol.buffer import ReceiveBuffer
from gateway.protocol.events import ConnectionClosed

__all__ = ["CodecState", "Lifecycle", "WrongState"]


class CodecState(enum.Enum):
    """Where a codec stands, for every protocol and role (see the module's table)."""

    #: Events flow both ways; a unit may be partly received.
    OPEN = "open"
    #: The peer closed its side and every event before that was returned.
    CLOSED = "closed"
    #: The peer broke the protocol: nothing more is parsed; the driver sends the
    #: protocol's error reply, if it has one, and closes.
    ERROR = "error"


_OPEN = CodecState.OPEN
_CLOSED = CodecState.CLOSED
_ERROR = CodecState.ERROR


class WrongState(LocalProtocolError):
    """The codec's state does not allow this action: a bug of the caller, not the peer.

    ``state`` is the state the codec was in and ``action`` what was asked of it
    (``"next_event"``, ``"send Ack"``, ...).
    """

    def __init__(self, state: CodecState, action: str) -> None:
        super().__init__(f"{action}: refused in the {state.name} state")
        self.state = state
        self.action = action


class Lifecycle:
    """Base of every codec: the state, the receive buffer, and the moves between states.

    A subclass parses from :attr:`_buffer` (a :class:`ReceiveBuffer`) in its
    ``next_event``, which starts with::

        if self._state is not CodecState.OPEN:
            return self._not_open()

    returns :meth:`_closed` once the input ended and every event was
    returned, and raises the peer's errors through :meth:`_fail`. It
    overrides :meth:`_release` when it holds more than the buffer (a unit
    being assembled) and :attr:`held_bytes` to count it.
    """

    def __init__(self) -> None:
        self._state = _OPEN
        self._buffer = ReceiveBuffer()

    @property
    def state(self) -> CodecState:
        """:attr:`CodecState.OPEN`, :attr:`~CodecState.CLOSED` or :attr:`~CodecState.ERROR`."""
        return self._state

    @property
    def held_bytes(self) -> int:
        """What the codec holds of received input not yet returned as events, as
        allocated (what a memory budget charges): here the receive buffer's
        allocation; a codec that builds more for a partial unit counts that too.
        0 once ``CLOSED`` or ``ERROR``."""
        return self._buffer.allocated

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add received bytes; ``b""`` means the peer closed its sending side.

        Bytes after ``b""`` are a :class:`LocalProtocolError`; bytes received
        in ``ERROR`` are dropped unparsed.
        """
        self._buffer.feed(data)

    # -- for subclasses ------------------------------------------------------------------
    def _not_open(self) -> ConnectionClosed:
        """What ``next_event`` answers outside ``OPEN``: :class:`ConnectionClosed` once
        closed, every time; in ``ERROR`` it refuses."""
        if self._state is _CLOSED:
            return ConnectionClosed()
        raise WrongState(self._state, "next_event")

    def _closed(self) -> ConnectionClosed:
        """The input ended and every event was returned: ``CLOSED``, what is held dropped
        (a unit the peer did not finish is never returned)."""
        self._state = _CLOSED
        self._release()
        return ConnectionClosed()

    def _fail(self, error: RemoteProtocolError | str) -> NoReturn:
        """The peer broke the protocol: ``ERROR`` for good, what is held dropped, and
        ``error`` (a message makes a :class:`RemoteProtocolError`) raised."""
        self._state = _ERROR
        self._release()
        raise RemoteProtocolError(error) if isinstance(error, str) else error

    def _enter_error(self) -> None:
        """Our side ends the connection with the protocol's error reply: ``ERROR``, as
        after the peer's error, but nothing is raised."""
        self._state = _ERROR
        self._release()

    def _refuse(self, action: str) -> NoReturn:
        """Raise :class:`WrongState`: ``action`` is not allowed in the current state."""
        raise WrongState(self._state, action)

    def _check_send(self, action: str) -> None:
        """Refuse ``action`` (a send) in ``ERROR``, where only the error reply may go."""
        if self._state is _ERROR:
            raise WrongState(_ERROR, action)

    def _release(self) -> None:
        """Drop what is held of received input, and whatever is received from now on
        (a subclass that assembles units drops those too, then calls this)."""
        self._buffer.discard()
