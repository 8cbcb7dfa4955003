"""The Micromessage2 codecs, one per role, sans I/O, on the toolkit's lifecycle.

Both roles send and receive MESSAGE frames (a client publishes, a server
delivers to subscribers), so both hold the same frame machinery and the two
ack windows (:mod:`.windows`); they differ in the handshake and in who may
send COMMAND frames (the client). Each codec walks one table of phases:

=========  ===================================  =====================================
phase      server                               client
=========  ===================================  =====================================
OFFER      awaits the client's offer            owes its offer (``send(Handshake)``)
ANSWER     owes its answer (``send``)           awaits the server's answer
FINAL      awaits the client's final message    owes its final message (``send``)
FRAMES     frames both ways                     frames both ways
=========  ===================================  =====================================

An ERROR frame may replace any handshake step; it is returned as
:class:`~.events.Error` and nothing may follow it. After the handshake:

* new MESSAGE frames come out as one :class:`~.events.Messages` event for
  all the codec holds whole (one read's worth), so a receiver hands them off
  together and acks the last once they are safe (``send(Ack(seq))``);
  resent ones it returned before come out as :class:`~.events.Duplicate`
  (the driver re-acks those it had acked: :meth:`reack`) or are dropped
  (their ack is coming);
* ack extension frames settle our outstanding MESSAGE frames
  (:class:`~.events.Ack` with how many); ``dotnet`` frames are
  :class:`~.events.TypeName`; COMMAND frames (server, ``pubsub`` negotiated)
  are :class:`~.commands.Subscribe` / :class:`~.commands.Unsubscribe`; an
  EXTENSION frame whose id was not negotiated is skipped by its length and
  returned as :class:`~.events.Extension` for the driver to count;
* sending a MESSAGE takes a place in the ack window (refused when it is
  full: :attr:`window_room`); :meth:`due` gives the bytes of those to resend.

Time comes from ``clock`` (seconds, monotonic), given by the driver.
"""

from __future__ import annotations

import enum
import struct
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.sdk import (
    NEED_DATA,
    CodecState,
    Lifecycle,
    LocalProtocolError,
    RemoteProtocolError,
)

from . import negotiation
from .commands import Subscribe, Unsubscribe, encode_command, parse_command
from .events import (
    MAX_FRAGMENT,
    MAX_PAYLOAD,
    SEQUENCE,
    Ack,
    Answered,
    Command,
    Duplicate,
    Error,
    Established,
    Extension,
    Flags,
    Message,
    Messages,
    Offered,
    TypeName,
)
from .frames import FrameDecoder, encode_frame, encode_messages
from .handshake import (
    MAJOR,
    MAX_HANDSHAKE,
    Handshake,
    Refusal,
    decode_handshake,
    encode_handshake,
)
from .negotiation import Negotiated, Settings
from .windows import ACK_EXTENSIONS, Received, ReceiveWindow, SendWindow

__all__ = ["ClientCodec", "Limits", "Phase", "ServerCodec", "Settings"]

_U16: Final = struct.Struct(">H")
_OPEN: Final = CodecState.OPEN
#: One past the last sequence number.
_WRAP: Final = 65536
#: MESSAGE frames parsed in one pass of the fast path.
MAX_BATCH: Final = 1024


class Phase(enum.Enum):
    """Where the handshake stands (see the module's table)."""

    OFFER = "offer"
    ANSWER = "answer"
    FINAL = "final"
    FRAMES = "frames"


@dataclass(frozen=True, slots=True)
class Limits:
    """What a codec accepts, each checked from length fields before the bytes arrive."""

    #: Largest payload of one frame (received), and the fragment size we send.
    max_fragment: int = MAX_FRAGMENT
    #: Largest payload joined from CONTINUED fragments.
    max_payload: int = MAX_PAYLOAD
    #: Largest handshake message.
    max_handshake: int = MAX_HANDSHAKE


class _Codec(Lifecycle):
    """What both roles share: handshake parsing, frames, windows, extensions."""

    #: The phases in which we await a handshake message (else we owe one).
    _AWAITS: frozenset[Phase]

    def __init__(
        self,
        settings: Settings | None = None,
        limits: Limits | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.settings = Settings() if settings is None else settings
        self.limits = Limits() if limits is None else limits
        self.clock = clock
        self.phase = Phase.OFFER
        #: The outcome of the handshake (None before it completes).
        self.negotiated: Negotiated | None = None
        self.send_window: SendWindow | None = None
        self.receive_window: ReceiveWindow | None = None
        self._decoder: FrameDecoder | None = None
        self._queued: deque[Any] = deque()
        self._peer_errored = False
        self._ack_id = 0
        self._dotnet_id = 0
        self._offset = 0  # stream offset where the frames start
        self._kinds: dict[int, str] = {}
        self._seq = SEQUENCE.first  # without a window: the next MESSAGE's number

    # -- state ------------------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        joining = self._decoder.joining if self._decoder is not None else 0
        return self._buffer.allocated + joining

    def _release(self) -> None:
        if self._decoder is not None:
            self._decoder._pending.clear()
            self._decoder.joining = 0
        super()._release()

    @property
    def next_seq(self) -> int:
        """The sequence number of the next new MESSAGE we send."""
        return self._seq if self.send_window is None else self.send_window.next_seq

    @property
    def window_room(self) -> int | None:
        """MESSAGE frames we may send now (None: no ack window was negotiated)."""
        return None if self.send_window is None else self.send_window.room

    def has(self, name: str) -> bool:
        """Whether extension ``name`` was negotiated."""
        return self.negotiated is not None and self.negotiated.has(name)

    def _establish(self, negotiated: Negotiated) -> Established:
        self.negotiated = negotiated
        agreement = negotiated.agreement
        if negotiated.ack is not None:
            self.send_window = SendWindow(negotiated.ack)
            self.receive_window = ReceiveWindow(negotiated.ack)
        self._kinds = {i + 1: e.name for i, e in enumerate(agreement.extensions)}
        self._ack_id = next((i for i, n in self._kinds.items() if n in ACK_EXTENSIONS), 0)
        self._dotnet_id = agreement.extension_id("dotnet") or 0
        self._decoder = FrameDecoder(
            buffer=self._buffer,
            offset=self._offset,
            max_fragment=self.limits.max_fragment,
            max_payload=self.limits.max_payload,
        )
        self.phase = Phase.FRAMES
        return Established(agreement)

    # -- receiving ----------------------------------------------------------------------
    def next_event(self) -> Any:
        """The next event, :class:`ConnectionClosed` or :data:`NEED_DATA`."""
        if self._state is not _OPEN:
            return self._not_open()
        if self._queued:
            return self._queued.popleft()
        try:
            if self._peer_errored:
                return self._after_error()
            if self.phase is Phase.FRAMES:
                return self._next_frames()
            return self._next_handshake()
        except RemoteProtocolError as e:
            self._fail(e)

    def _after_error(self) -> Any:
        """The peer sent an ERROR frame: nothing may follow it but the end of input."""
        buf = self._buffer
        if len(buf):
            raise RemoteProtocolError("bytes after the peer's ERROR frame")
        return self._closed() if buf.eof else NEED_DATA

    def _next_handshake(self) -> Any:
        buf = self._buffer
        if self.phase not in self._AWAITS:
            return self._closed() if buf.eof else NEED_DATA
        if len(buf) >= 2 and not buf.data[buf.pos] & Flags.ERROR and buf.data[buf.pos] != MAJOR:
            # Judged from the first bytes, so that anything but a handshake (a MESSAGE
            # sent too early, another protocol) is refused at once.
            major, minor = buf.data[buf.pos], buf.data[buf.pos + 1]
            raise RemoteProtocolError(
                f"version {major}.{minor} is not supported: major must be {MAJOR}"
            )
        parsed = decode_handshake(buf.data, buf.pos, limit=self.limits.max_handshake)
        if parsed is None:
            return self._closed() if buf.eof else NEED_DATA
        message, end = parsed
        self._offset += end - buf.pos
        buf.advance(end)
        if isinstance(message, Error):
            self._peer_errored = True
            return message
        return self._on_handshake(message)

    def _on_handshake(self, message: Handshake) -> Any:
        raise NotImplementedError

    def _next_frames(self) -> Any:
        decoder = self._decoder
        assert decoder is not None
        batch: list[Message] = []
        queued = self._queued
        while True:
            fast = decoder.next_messages(MAX_BATCH)
            if fast:
                self._take_new(fast, batch)
                continue
            frame = decoder.next_frame()
            if frame is None:
                break
            if type(frame) is Message:
                self._take_new([frame], batch)
                continue
            queued.append(self._on_frame(frame))
            break
        if batch:
            return Messages(tuple(batch))
        if queued:
            return queued.popleft()
        if self._buffer.eof:
            decoder.check_eof()
            return self._closed()
        return NEED_DATA

    def _take_new(self, frames: list[Message], batch: list[Message]) -> None:
        """Add the new ones of ``frames`` to ``batch``; resends whose ack is coming are
        dropped; one we acked stops there (queued as a Duplicate after the batch)."""
        window = self.receive_window
        if window is None:
            batch += frames
            return
        first, k = frames[0].seq, len(frames)
        if (
            first + k <= _WRAP
            and [f.seq for f in frames] == list(range(first, first + k))
            and window.receive_run(first, k)
        ):
            batch += frames  # the usual case: exactly the next ones, all new
            return
        receive = window.receive
        for frame in frames:
            seen = receive(frame.seq)
            if seen is Received.NEW:
                batch.append(frame)
            elif seen is Received.ACKED:
                # One re-ack answers a whole resent run: the ack is cumulative.
                queued = self._queued
                ack = window.acked_through
                if not (queued and type(queued[-1]) is Duplicate and queued[-1].ack == ack):
                    queued.append(Duplicate(frame.seq, True, ack))

    def _on_frame(self, frame: Any) -> Any:
        if isinstance(frame, Extension):
            return self._on_extension(frame)
        if isinstance(frame, Command):
            return self._on_command(frame)
        self._peer_errored = True  # an ERROR frame: the peer disconnects after it
        return frame

    def _on_extension(self, frame: Extension) -> Any:
        kind = self._kinds.get(frame.ext_id)
        if kind in ACK_EXTENSIONS:
            if len(frame.payload) != 2:
                raise RemoteProtocolError(
                    f"an ack frame carries a 2-byte sequence number, not {len(frame.payload)} bytes"
                )
            seq = _U16.unpack(frame.payload)[0]
            window = self.send_window
            return Ack(seq, window.acked(seq) if window is not None else 0)
        if kind == "dotnet":
            try:
                return TypeName(frame.payload.decode("utf-8"))
            except UnicodeDecodeError:
                raise RemoteProtocolError("a dotnet type name must be UTF-8") from None
        if kind is not None:
            raise RemoteProtocolError(f"the {kind} extension has no frames (id {frame.ext_id})")
        return frame  # not negotiated: skipped by its length, the driver counts it

    def _on_command(self, frame: Command) -> Any:
        raise RemoteProtocolError("a server sends no COMMAND frames")

    # -- sending ------------------------------------------------------------------------
    def send(self, event: Any) -> bytes:
        """The bytes of ``event``; refused (LocalProtocolError) where the phase forbids it."""
        if isinstance(event, Error):
            wire = encode_frame(event)
            self._enter_error()
            return wire
        self._check_send(f"send {type(event).__name__}")
        if isinstance(event, Handshake):
            return self._send_handshake(event)
        if self.phase is not Phase.FRAMES:
            raise LocalProtocolError(f"send {type(event).__name__}: the handshake is not done")
        if isinstance(event, Message):
            return self.send_messages((event,))
        if isinstance(event, Ack):
            return self._send_ack(event.seq)
        if isinstance(event, TypeName):
            if not self._dotnet_id:
                raise LocalProtocolError("send TypeName: dotnet was not negotiated")
            return encode_frame(Extension(self._dotnet_id, event.name.encode("utf-8")))
        return self._send_other(event)

    def _send_handshake(self, message: Handshake) -> bytes:
        raise NotImplementedError

    def _send_other(self, event: Any) -> bytes:
        raise LocalProtocolError(f"a {type(self).__name__} does not send {type(event).__name__}")

    def send_bodies(self, items: Sequence[tuple[str, str, bytes]]) -> bytes:
        """MESSAGE frames for ``items`` of (destination, properties, payload), numbered
        from :attr:`next_seq`: what :meth:`send_messages` makes of them, made faster."""
        self._check_send("send Message")
        if self.phase is not Phase.FRAMES:
            raise LocalProtocolError("send Message: the handshake is not done")
        window = self.send_window
        if window is not None and len(items) > window.room:
            raise LocalProtocolError(
                f"send Message: the ack window of {window.settings.max_count} full"
                f" ({len(items)} frames, room for {window.room})"
            )
        first = self.next_seq
        blob, ends = encode_messages(first, items, max_fragment=self.limits.max_fragment)
        if window is None:
            self._seq = SEQUENCE.after(first, len(items))
        else:
            window.sent_blob(blob, ends, self.clock())
        return blob

    def send_messages(self, frames: Sequence[Message]) -> bytes:
        """The bytes of several MESSAGE frames, as ``send`` makes them one by one, made at
        once. Their sequence numbers must follow on from :attr:`next_seq` (MESSAGE
        frames are numbered in order in each direction)."""
        expected = self.next_seq
        for frame in frames:
            if frame.seq != expected:
                raise LocalProtocolError(f"MESSAGE seq {frame.seq}: the next one is {expected}")
            expected = SEQUENCE.after(expected)
        return self.send_bodies([(f.destination, f.properties, f.payload) for f in frames])

    def _send_ack(self, seq: int) -> bytes:
        window = self.receive_window
        if window is None:
            raise LocalProtocolError("send Ack: no ack extension was negotiated")
        if not window.acked(seq):
            return b""  # acked already, or rewound past: nothing (more) to ack
        return encode_frame(Extension(self._ack_id, _U16.pack(seq)))

    def reack(self, event: Duplicate) -> bytes:
        """Our ack again, for a resend of what we acked (the peer missed the ack)."""
        self._check_send("send Ack")
        if self.receive_window is None or not event.acked:
            return b""
        return encode_frame(Extension(self._ack_id, _U16.pack(event.ack)))

    def due(self) -> bytes:
        """The MESSAGE frames not acked within the expiry, to send again now (b"": none)."""
        window = self.send_window
        if window is None or self._state is not _OPEN:
            return b""
        return b"".join(window.due(self.clock()))

    @property
    def next_due(self) -> float | None:
        """When :meth:`due` will next have something (``clock`` time; None: never)."""
        return None if self.send_window is None else self.send_window.next_due

    def rewind(self, seq: int) -> None:
        """The received MESSAGE frames from ``seq`` on were not kept: their resends will
        be new again, and no ack covers them meanwhile."""
        if self.receive_window is not None:
            self.receive_window.rewind(seq)


class ServerCodec(_Codec):
    """The gateway's side: answers the handshake, receives commands."""

    _AWAITS = frozenset({Phase.OFFER, Phase.FINAL})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._offer: Handshake | None = None
        self._answer: Handshake | None = None

    def _on_handshake(self, message: Handshake) -> Any:
        if self.phase is Phase.OFFER:
            out = negotiation.answer(message, self.settings)
            if isinstance(out, Refusal):
                raise RemoteProtocolError(out.reason)
            self._offer, self._answer = message, out
            self.phase = Phase.ANSWER
            return Offered(message, out)
        assert self._offer is not None
        assert self._answer is not None
        agreed = negotiation.confirm(self._offer, self._answer, message)
        if isinstance(agreed, Refusal):
            raise RemoteProtocolError(agreed.reason)
        return self._establish(agreed)

    def _send_handshake(self, message: Handshake) -> bytes:
        if self.phase is not Phase.ANSWER or message != self._answer:
            raise LocalProtocolError(
                "send Handshake: a server sends only the answer its Offered event holds"
            )
        self.phase = Phase.FINAL
        return encode_handshake(message)

    def _on_command(self, frame: Command) -> Any:
        if not self.has("pubsub"):
            raise RemoteProtocolError("COMMAND frame, but pubsub was not negotiated")
        return parse_command(frame.payload)


class ClientCodec(_Codec):
    """A client's side: offers, then confirms; may send commands."""

    _AWAITS = frozenset({Phase.ANSWER})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.offer = negotiation.offer(self.settings)
        self._answer: Handshake | None = None
        self._final: Handshake | None = None

    def _on_handshake(self, message: Handshake) -> Any:
        out = negotiation.final(self.offer, message, self.settings)
        if isinstance(out, Refusal):
            raise RemoteProtocolError(out.reason)
        self._answer, self._final = message, out
        self.phase = Phase.FINAL
        return Answered(message, out)

    def _send_handshake(self, message: Handshake) -> bytes:
        if self.phase is Phase.OFFER and message == self.offer:
            self.phase = Phase.ANSWER
            return encode_handshake(message)
        if self.phase is Phase.FINAL and message == self._final:
            assert self._answer is not None
            wire = encode_handshake(message)
            self._queued.append(self._establish(negotiation.established(message, self._answer)))
            return wire
        raise LocalProtocolError(
            "send Handshake: a client sends its offer, then the final its Answered event holds"
        )

    def _send_other(self, event: Any) -> bytes:
        if isinstance(event, Subscribe | Unsubscribe):
            if not self.has("pubsub"):
                raise LocalProtocolError(f"send {type(event).__name__}: pubsub was not negotiated")
            return encode_frame(Command(encode_command(event)))
        return super()._send_other(event)
