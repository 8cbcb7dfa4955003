"""The segment-append codecs: bytes in, checked events out; no I/O.

:class:`ServerCodec` is the segment-store side, :class:`ClientCodec` the
appender/reader side. Both stand on the toolkit's
:class:`~gateway.protocol.lifecycle.Lifecycle` and work as h11 does: feed
received bytes with ``receive_data`` (``b""`` means the peer closed), call
``next_event`` until it returns :data:`~gateway.sdk.NEED_DATA` (or a
:class:`~gateway.sdk.ConnectionClosed` once the peer closed and every
event before it was returned, then every time), and turn commands into bytes
with ``send``, which refuses with
:class:`~gateway.core.errors.LocalProtocolError` what the connection's state
does not allow.

The server reassembles append blocks itself: an ``AppendBlock`` and the
``AppendBlockEnd`` that must follow it become one
:class:`~protocols.segment.events.Append` once both are received whole and
every rule is checked (see :mod:`.blocks`); nothing of a block that is not
whole or not valid is ever returned. It keeps, per writer, the last event
number it received and the last it acknowledged, starting from what its own
``AppendSetup`` told the writer, so that a stale block (its last event number
not above the writer's last) and a wrong ``DataAppended`` are caught.

A peer breaking the protocol raises :class:`SegmentProtocolError`, whose
``reply`` is the command to send before closing (server side:
``InvalidEventNumber`` for a stale event number, ``Hello(17, 5)`` for a
client whose version range is incompatible, ``ErrorMessage`` for anything
else; client side: none). The codec is then in
:attr:`~gateway.protocol.lifecycle.CodecState.ERROR` for good: nothing more
is parsed and every writer is forgotten, so a client has to set up again on
a new connection.

Parsing strategy: command headers are read with ``struct.unpack_from`` at an
offset of the :class:`~gateway.sdk.ReceiveBuffer`; a command is
decoded only once it is whole, and a connection remembers how many bytes it
needs before trying again, so a large block arriving in small pieces is not
re-parsed per piece. Lengths are checked against :class:`Limits` as soon as
a header arrives, before the body is waited for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, NoReturn, cast
from uuid import UUID

from gateway.sdk import (
    NEED_DATA,
    CodecState,
    ConnectionClosed,
    Lifecycle,
    LocalProtocolError,
    NeedData,
    RemoteProtocolError,
)

from .blocks import BlockWriter, assemble, read_block_end
from .events import (
    MAX_EVENT_PAYLOAD,
    MAX_WIRECOMMAND_SIZE,
    NULL_EVENT_NUMBER,
    Append,
    AppendSetup,
    AuthTokenCheckFailed,
    ClientEvent,
    Command,
    CommandType,
    DataAppended,
    ErrorMessage,
    GetStreamSegmentInfo,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    LocateOffset,
    NoSuchSegment,
    OffsetLocated,
    OperationUnsupported,
    PayloadFormat,
    ReadSegment,
    SegmentAlreadyExists,
    SegmentIsSealed,
    SegmentIsTruncated,
    SegmentRead,
    ServerEvent,
    SetupAppend,
    StreamSegmentInfo,
    WrongHost,
)
from .frames import HEADER, decode, encode, type_name

__all__ = [
    "ClientCodec",
    "CodecState",
    "EventReassembler",
    "Limits",
    "SegmentProtocolError",
    "ServerCodec",
]

_T = CommandType
#: What a client may send a server, and what a server may send a client.
_CLIENT_SENDS: Final = frozenset(
    {_T.HELLO, _T.KEEP_ALIVE, _T.SETUP_APPEND, _T.APPEND_BLOCK, _T.READ_SEGMENT}
    | {_T.GET_STREAM_SEGMENT_INFO, _T.LOCATE_OFFSET}
)
_ERROR_REPLIES: Final = (
    WrongHost,
    SegmentIsSealed,
    SegmentAlreadyExists,
    NoSuchSegment,
    InvalidEventNumber,
    SegmentIsTruncated,
    OperationUnsupported,
    AuthTokenCheckFailed,
    ErrorMessage,
)
_SERVER_SENDS: Final = frozenset(
    {_T.HELLO, _T.KEEP_ALIVE, _T.APPEND_SETUP, _T.DATA_APPENDED, _T.SEGMENT_READ}
    | {_T.STREAM_SEGMENT_INFO, _T.OFFSET_LOCATED}
    | {cls.TYPE for cls in _ERROR_REPLIES}
)
_IN_BLOCK_ONLY: Final = frozenset({_T.EVENT, _T.PARTIAL_EVENT, _T.PADDING})
_MIN_I64: Final = -(2**63)
_MAX_I64: Final = 2**63 - 1
_OPEN: Final = CodecState.OPEN


class SegmentProtocolError(RemoteProtocolError):
    """The peer broke the protocol; send it :attr:`reply` (if any), then close."""

    def __init__(self, message: str, reply: Command | None = None) -> None:
        super().__init__(message)
        #: The command the peer should get before the connection closes.
        self.reply = reply


@dataclass(frozen=True, slots=True)
class Limits:
    """What a connection accepts; each is checked as soon as a header says it."""

    #: Largest command body (the protocol's own maximum is 0x00FFFFFF).
    max_command: int = MAX_WIRECOMMAND_SIZE
    #: Largest event frame, its 8-byte header included (8 MiB of payload).
    max_event: int = MAX_EVENT_PAYLOAD + 8
    #: Most writers one connection may set up (server side).
    max_writers: int = 4096

    def __post_init__(self) -> None:
        for name in ("max_command", "max_event", "max_writers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Limits.{name} must be a non-negative integer, not {value!r}")
        if self.max_command > MAX_WIRECOMMAND_SIZE:
            raise ValueError(f"Limits.max_command may not exceed {MAX_WIRECOMMAND_SIZE}")
        if self.max_event < 8:
            raise ValueError("Limits.max_event counts the 8-byte event header")


def _none(number: int) -> bool:
    """Whether an ack level means "no event yet": ``Long.MIN_VALUE``, or a draft-literal 0."""
    return number == NULL_EVENT_NUMBER or number == 0


def _check_i64(value: int, what: str) -> None:
    if not _MIN_I64 <= value <= _MAX_I64:
        raise LocalProtocolError(f"{what} {value} does not fit in 64 bits")


class _Writer:
    """What a connection knows of one set-up writer."""

    __slots__ = ("acked", "acked_level", "format", "id", "received", "request_id", "segment")

    def __init__(
        self, writer_id: UUID, segment: str, last: int, request_id: int, fmt: int = 0
    ) -> None:
        level = _MIN_I64 if _none(last) else last
        self.id = writer_id
        self.segment = segment
        #: The payload format the AppendSetup accepted.
        self.format = fmt
        #: Server: the last event number received; client: the last sent
        #: (initially what AppendSetup said, "none" being below every number).
        self.received = level
        #: The last event number acknowledged, as the next ``previous_event_number``
        #: says it (initially what AppendSetup said) ...
        self.acked = last
        #: ... and as a number the next ack must be above.
        self.acked_level = level
        self.request_id = request_id

    def ack(self, number: int) -> None:
        self.acked = self.acked_level = number

    def follows(self, previous: int) -> bool:
        """Whether an ack whose previous event number is ``previous`` follows the last one."""
        return previous == self.acked or (_none(previous) and _none(self.acked))


class _SegmentCodec(Lifecycle):
    """What both roles share: the lifecycle, the writers, the parse loop."""

    #: Types this role accepts from its peer.
    _accepts: frozenset[int]
    _peer = ""

    def __init__(self, limits: Limits | None) -> None:
        super().__init__()
        self.limits = Limits() if limits is None else limits
        #: Bytes needed from the buffer's ``pos`` before parsing can make progress.
        self._need = 8
        self._writers: dict[bytes, _Writer] = {}
        #: Setup requests not answered yet, by writer id.
        self._pending: dict[bytes, SetupAppend] = {}

    # (held_bytes is the lifecycle's: the receive buffer's allocation, as no event
    # object is built before a command or a block is whole.)

    def _next(self) -> object:
        """The next event, :class:`ConnectionClosed`, or :data:`NEED_DATA`.

        After the end of input, a partly received command or block is dropped
        and :class:`ConnectionClosed` is returned, every time.
        """
        if self._state is not _OPEN:
            return self._not_open()
        buf = self._buffer
        data = buf.data
        if len(data) - buf.pos >= self._need:
            try:
                event = self._parse(data, buf.pos, len(data))
            except SegmentProtocolError as e:
                self._fail(e)
            if event is not None:
                return event
        if buf.eof:
            return self._closed()
        return NEED_DATA

    def _fail(self, error: RemoteProtocolError | str) -> NoReturn:
        """The peer broke the protocol: every writer is forgotten too."""
        self._writers.clear()
        self._pending.clear()
        super()._fail(error)

    def _header(self, data: bytearray, pos: int) -> tuple[int, int]:
        """The type and length of the command at ``pos``, checked for this role."""
        code, length = HEADER.unpack_from(data, pos)
        if code not in self._accepts:
            raise self._error(self._refusal(code))
        if not 0 <= length <= self.limits.max_command:
            raise self._error(
                f"{type_name(code)} of length {length}: outside 0..{self.limits.max_command}"
            )
        return code, length

    def _refusal(self, code: int) -> str:
        try:
            name = CommandType(code).name
        except ValueError:
            return f"unknown command type {code}"
        if code in _IN_BLOCK_ONLY:
            return f"{name} outside an append block"
        return f"a {self._peer} may not send {name}"

    def _parse(self, data: bytearray, pos: int, end: int) -> object | None:
        """The command at ``pos`` as an event, or None (``_need`` says what is missing)."""
        if end - pos < 8:
            self._need = 8
            return None
        code, length = self._header(data, pos)
        stop = pos + 8 + length
        if code == _T.APPEND_BLOCK:
            return self._block(data, pos, end, length)
        if end < stop:
            self._need = stop - pos
            return None
        try:
            command = decode(code, data, pos + 8, stop)
        except RemoteProtocolError as e:
            raise self._error(str(e)) from None
        event = self._received(command)
        self._buffer.advance(stop)
        self._need = 8
        return event

    def _block(self, data: bytearray, pos: int, end: int, length: int) -> object | None:
        """An ``AppendBlock`` (only a server accepts one: see ServerCodec)."""
        raise self._error(self._refusal(code=_T.APPEND_BLOCK))

    def _received(self, command: Command) -> object:
        """Check ``command`` against the state and update it; the event to return."""
        return command

    def _error(self, message: str, reply: Command | None = None) -> SegmentProtocolError:
        return SegmentProtocolError(message, reply)


class ServerCodec(_SegmentCodec):
    """The segment-store side of one connection.

    Events: :class:`~.events.Hello` (a compatible one: an incompatible
    range raises with the reply ``Hello(17, 5)``), :class:`~.events.KeepAlive`
    (echo it), :class:`~.events.SetupAppend`,
    :class:`~.events.ReadSegment`, :class:`~.events.Append` (its
    ``payload_format`` the one the writer's ``AppendSetup`` accepted),
    :class:`~.events.GetStreamSegmentInfo`, :class:`~.events.LocateOffset`.

    ::

        conn.receive_data(data)
        while (event := conn.next_event()) is not NEED_DATA: ...
        wire = conn.send(AppendSetup(setup.request_id, setup.segment, setup.writer_id, last))
        wire = conn.acknowledge(append, segment_length)
    """

    _accepts = _CLIENT_SENDS
    _peer = "client"

    def __init__(self, limits: Limits | None = None) -> None:
        super().__init__(limits)

    def next_event(self) -> ServerEvent | ConnectionClosed | NeedData:
        """The next event, :class:`ConnectionClosed`, or :data:`NEED_DATA`.

        After the end of input, a partly received command or block is dropped
        and :class:`ConnectionClosed` is returned, every time.
        """
        return cast(ServerEvent | ConnectionClosed | NeedData, self._next())

    @property
    def writers(self) -> int:
        """Writers set up on this connection."""
        return len(self._writers)

    # -- input ---------------------------------------------------------------------------
    def _received(self, command: Command) -> object:
        if isinstance(command, SetupAppend):
            key = command.writer_id.bytes
            self._writers.pop(key, None)  # set up again: nothing is appended until answered
            self._pending[key] = command
            if len(self._writers) + len(self._pending) > self.limits.max_writers:
                raise self._error(
                    f"more than {self.limits.max_writers} writers on one connection",
                    ErrorMessage(command.request_id, command.segment, "too many writers"),
                )
        elif isinstance(command, Hello) and not command.compatible:
            raise self._error(
                f"client versions {command.low_version}..{command.high_version} are not"
                " compatible with ours",
                Hello(),
            )
        return command

    def _error(self, message: str, reply: Command | None = None) -> SegmentProtocolError:
        return SegmentProtocolError(message, reply or ErrorMessage(-1, "", message))

    def _block(self, data: bytearray, pos: int, end: int, length: int) -> object | None:
        """An ``AppendBlock`` at ``pos`` and the ``AppendBlockEnd`` after it, as one Append."""
        if length < 16:
            raise self._error(f"APPEND_BLOCK of length {length} cannot hold a writer id")
        if end - pos < 24:
            self._need = 24
            return None
        key = bytes(data[pos + 8 : pos + 24])
        writer = self._writers.get(key)
        if writer is None:
            raise self._error(f"AppendBlock for writer {UUID(bytes=key)}, which is not set up")
        block_stop = pos + 8 + length
        if end - block_stop < 8:
            self._need = block_stop + 8 - pos
            return None
        code, end_length = HEADER.unpack_from(data, block_stop)
        if code != _T.APPEND_BLOCK_END:
            raise self._error(
                f"{type_name(code)} following an append block (expected APPEND_BLOCK_END)",
                ErrorMessage(-1, writer.segment, "expected APPEND_BLOCK_END"),
            )
        if not 0 <= end_length <= self.limits.max_command:
            raise self._error(
                f"APPEND_BLOCK_END of length {end_length}: outside 0..{self.limits.max_command}"
            )
        stop = block_stop + 8 + end_length
        if end < stop:
            self._need = stop - pos
            return None
        try:
            if data[block_stop + 8 : block_stop + 24] != key:
                raise RemoteProtocolError("the block's end names another writer than the block")
            fields = read_block_end(data, block_stop + 8, stop)
            if fields.num_events <= 0:
                raise RemoteProtocolError(f"a block of {fields.num_events} events (numEvents)")
            if fields.last_event_number <= writer.received:
                raise SegmentProtocolError(
                    f"writer {writer.id}: event number {fields.last_event_number} is not above"
                    f" {writer.received}, the last one received or stored",
                    InvalidEventNumber(writer.id, fields.request_id, "", fields.last_event_number),
                )
            events = assemble(data, pos + 24, block_stop, fields, self.limits.max_event - 8)
        except SegmentProtocolError:
            raise
        except RemoteProtocolError as e:
            raise self._error(
                f"writer {writer.id}: {e}", ErrorMessage(-1, writer.segment, str(e))
            ) from None
        writer.received = fields.last_event_number
        self._buffer.advance(stop)
        self._need = 8
        return Append(
            writer.id,
            fields.request_id,
            events,
            fields.num_events,
            fields.last_event_number,
            writer.segment,
            writer.format,
        )

    # -- output --------------------------------------------------------------------------
    def send(self, command: Command) -> bytes:
        """The bytes of ``command``, a reply this connection's state allows.

        * ``AppendSetup`` answers a ``SetupAppend`` returned by :meth:`next_event`
          (same writer, segment and request id) and sets the writer up: its
          appends must be numbered above ``last_event_number``
          (:data:`~.events.NULL_EVENT_NUMBER`, or 0, for none); its
          ``payload_format`` is raw (0, or -1 absent) or the one the setup
          asked for, and the writer's appends carry it;
        * ``DataAppended`` for a set-up writer: its event number above the
          last one acknowledged and not above the last one received, and its
          ``previous_event_number`` the last one acknowledged (or what the
          ``AppendSetup`` said);
        * an error reply answering a pending setup drops it;
          ``InvalidEventNumber`` forgets its writer;
        * ``Hello``, ``KeepAlive``, ``SegmentRead``, ``StreamSegmentInfo``,
          ``OffsetLocated``: always.
        """
        if isinstance(command, AppendSetup):
            key = command.writer_id.bytes
            setup = self._pending.get(key)
            if setup is None:
                raise LocalProtocolError(
                    f"AppendSetup for writer {command.writer_id}, which sent no SetupAppend"
                )
            if (setup.segment, setup.request_id) != (command.segment, command.request_id):
                raise LocalProtocolError(
                    f"{command!r} does not answer {setup!r} (segment or request id differ)"
                )
            fmt = max(command.payload_format, PayloadFormat.RAW)
            if fmt not in (PayloadFormat.RAW, setup.payload_format):
                raise LocalProtocolError(
                    f"AppendSetup payload format {fmt}: the writer asked for {setup.payload_format}"
                )
            wire = encode(command)
            del self._pending[key]
            self._writers[key] = _Writer(
                command.writer_id,
                command.segment,
                command.last_event_number,
                command.request_id,
                fmt,
            )
            return wire
        if isinstance(command, DataAppended):
            writer = self._writers.get(command.writer_id.bytes)
            if writer is None:
                raise LocalProtocolError(f"DataAppended for writer {command.writer_id}: not set up")
            number = command.event_number
            if number <= writer.acked_level or number > writer.received:
                raise LocalProtocolError(
                    f"DataAppended({number}) for writer {writer.id}: acks must rise above"
                    f" {writer.acked} and not pass {writer.received}, the last event received"
                )
            if not writer.follows(command.previous_event_number):
                raise LocalProtocolError(
                    f"DataAppended previous event number {command.previous_event_number}:"
                    f" the last ack was {writer.acked}"
                )
            wire = encode(command)
            writer.ack(number)
            return wire
        if isinstance(command, _ERROR_REPLIES):
            wire = encode(command)
            if isinstance(command, InvalidEventNumber):
                self._writers.pop(command.writer_id.bytes, None)
                self._pending.pop(command.writer_id.bytes, None)
            else:
                for key, setup in list(self._pending.items()):
                    if setup.request_id == command.request_id:
                        del self._pending[key]
            return wire
        if isinstance(command, Hello | KeepAlive | SegmentRead | StreamSegmentInfo | OffsetLocated):
            return encode(command)
        raise LocalProtocolError(f"a server does not send {type(command).__name__}")

    def acknowledge(self, append: Append, current_segment_write_offset: int = -1) -> bytes:
        """``DataAppended`` for every event of the writer up to ``append``'s last one."""
        writer = self._writers.get(append.writer_id.bytes)
        if writer is None:
            raise LocalProtocolError(f"acknowledge: writer {append.writer_id} is not set up")
        return self.send(
            DataAppended(
                append.writer_id,
                append.last_event_number,
                writer.acked,
                append.request_id,
                current_segment_write_offset,
            )
        )


class ClientCodec(_SegmentCodec):
    """The appender/reader side of one connection; several writers may share it.

    Events: :class:`~.events.Hello` (log an incompatible one),
    :class:`~.events.KeepAlive`, :class:`~.events.AppendSetup` (the
    writer may append events numbered above its ``last_event_number``;
    resend those; its ``payload_format`` says what the server accepted),
    :class:`~.events.DataAppended` (checked: it acks the
    writer's events up to ``event_number``), :class:`~.events.SegmentRead`
    (:class:`EventReassembler` turns its data into events; a ``formats``
    blob is checked to be whole entries),
    :class:`~.events.StreamSegmentInfo`, :class:`~.events.OffsetLocated`, and
    the error replies.

    ``block_size`` is the default size of batched blocks (0: every append is
    one unbatched block).
    """

    _accepts = _SERVER_SENDS
    _peer = "server"

    def __init__(self, limits: Limits | None = None, *, block_size: int = 0) -> None:
        super().__init__(limits)
        self.block_size = block_size
        self._blocks = BlockWriter(self.limits.max_command)

    def next_event(self) -> ClientEvent | ConnectionClosed | NeedData:
        """The next event, :class:`ConnectionClosed`, or :data:`NEED_DATA`."""
        return cast(ClientEvent | ConnectionClosed | NeedData, self._next())

    @property
    def block_open(self) -> bool:
        """Whether a batched block is open (:meth:`close_block` closes it)."""
        return self._blocks.open_writer is not None

    # -- input ---------------------------------------------------------------------------
    def _received(self, command: Command) -> object:
        if isinstance(command, AppendSetup):
            key = command.writer_id.bytes
            setup = self._pending.get(key)
            if setup is None or setup.segment != command.segment:
                raise self._error(f"{command!r} answers no SetupAppend of ours")
            del self._pending[key]
            self._writers[key] = _Writer(
                command.writer_id,
                command.segment,
                command.last_event_number,
                setup.request_id,
                max(command.payload_format, PayloadFormat.RAW),
            )
        elif isinstance(command, SegmentRead) and command.formats is not None:
            if len(command.formats) % 9:
                raise self._error(
                    f"SegmentRead formats of {len(command.formats)} bytes: not 9-byte entries"
                )
        elif isinstance(command, DataAppended):
            writer = self._writers.get(command.writer_id.bytes)
            if writer is None:
                raise self._error(f"DataAppended for writer {command.writer_id}: not set up")
            number = command.event_number
            if number <= writer.acked_level or number > writer.received:
                raise self._error(
                    f"DataAppended({number}) for writer {writer.id}: acked up to"
                    f" {writer.acked}, sent up to {writer.received}"
                )
            previous = command.previous_event_number
            if previous != -1 and not writer.follows(previous):  # -1: a server too old to say
                raise self._error(
                    f"DataAppended previous event number {previous}: the last ack was"
                    f" {writer.acked}"
                )
            writer.ack(number)
        elif isinstance(command, InvalidEventNumber):
            self._writers.pop(command.writer_id.bytes, None)
            self._pending.pop(command.writer_id.bytes, None)
        elif isinstance(command, _ERROR_REPLIES):
            for key, setup in list(self._pending.items()):
                if setup.request_id == command.request_id:
                    del self._pending[key]
        return command

    # -- output --------------------------------------------------------------------------
    def send(self, command: Command) -> bytes:
        """The bytes of ``Hello``, ``KeepAlive``, ``SetupAppend``, ``ReadSegment``,
        ``GetStreamSegmentInfo`` or ``LocateOffset``.

        An open batched block is closed first (its ``Padding`` and end lead
        the bytes returned): nothing may come between a block and its end.
        A ``SetupAppend`` is refused while the same writer's previous one is
        unanswered; once sent, the writer appends only after its
        ``AppendSetup`` arrives. Refused in ``ERROR``.
        """
        self._check_send(f"send {type(command).__name__}")
        if isinstance(command, SetupAppend):
            key = command.writer_id.bytes
            if key in self._pending:
                raise LocalProtocolError(f"writer {command.writer_id} is being set up already")
            wire = encode(command)
            self._writers.pop(key, None)
            self._pending[key] = command
            return self._blocks.close() + wire
        if isinstance(
            command, Hello | KeepAlive | ReadSegment | GetStreamSegmentInfo | LocateOffset
        ):
            wire = encode(command)
            return self._blocks.close() + wire
        raise LocalProtocolError(
            f"a client does not send {type(command).__name__} with send()"
            " (appends go through append())"
        )

    def append(
        self,
        writer_id: UUID,
        payloads: Sequence[bytes],
        last_event_number: int,
        *,
        block_size: int | None = None,
        request_id: int | None = None,
    ) -> bytes:
        """The bytes that append ``payloads`` as the writer's events
        ``last_event_number - len(payloads) + 1 .. last_event_number``.

        The writer must be set up, and its event numbers rise. With a
        ``block_size`` (default: :attr:`block_size`) above an event's size the
        events stream into a batched block that may stay open: append more,
        or :meth:`close_block` when no more comes soon. The block end carries
        ``request_id`` (default: the writer's ``SetupAppend`` request id).
        Refused in ``ERROR``.
        """
        self._check_send("append")
        writer = self._writers.get(writer_id.bytes)
        if writer is None:
            raise LocalProtocolError(f"writer {writer_id} is not set up (no AppendSetup yet)")
        if not payloads:
            raise LocalProtocolError("an append needs at least one event")
        _check_i64(last_event_number, "event number")
        first = last_event_number - len(payloads) + 1
        if first <= writer.received:
            raise LocalProtocolError(
                f"writer {writer_id}: event number {first} is not above {writer.received},"
                " the last one sent or stored"
            )
        rid = writer.request_id if request_id is None else request_id
        _check_i64(rid, "request id")
        wire = self._blocks.write(
            writer_id,
            payloads,
            last_event_number,
            block_size=self.block_size if block_size is None else block_size,
            request_id=rid,
        )
        writer.received = last_event_number
        return wire

    def close_block(self) -> bytes:
        """Close the open batched block with ``Padding`` and its end (``b""`` if none)."""
        return self._blocks.close()


class EventReassembler:
    """Event payloads, with their offsets, out of the data of ``SegmentRead`` replies.

    A segment holds event frames ``[0][len][payload]``; a server cuts its
    replies anywhere, so a frame may start in one reply and end in a later
    one. Each :meth:`feed` returns the events completed by one reply as
    ``(offset, payload)``, ``offset`` being where the event's frame starts in
    the segment. Replies must follow each other (each starts where the
    previous one ended); a frame that is not an event, an event over
    ``max_payload`` bytes, or a segment that ends inside an event is a
    :class:`~gateway.core.errors.RemoteProtocolError`.
    """

    def __init__(self, offset: int = 0, *, max_payload: int = MAX_EVENT_PAYLOAD) -> None:
        self.max_payload = max_payload
        #: Where the first byte of ``_partial`` lies in the segment.
        self._start = offset
        self._partial = bytearray()
        #: What the last reply said.
        self.at_tail = False
        self.end_of_segment = False

    @property
    def offset(self) -> int:
        """Where the next reply must start (the end of the data received)."""
        return self._start + len(self._partial)

    @property
    def position(self) -> int:
        """Where the next event not yet returned starts: where to read again from."""
        return self._start

    @property
    def held_bytes(self) -> int:
        """Bytes of an event received in part."""
        return len(self._partial)

    def feed(self, read: SegmentRead) -> list[tuple[int, bytes]]:
        """The events that ``read`` completes, in order."""
        if read.offset != self.offset:
            raise RemoteProtocolError(
                f"SegmentRead at offset {read.offset}, where {self.offset} was next"
            )
        if self.end_of_segment and read.data:
            raise RemoteProtocolError("SegmentRead data after the end of the segment")
        if self._partial:
            self._partial += read.data
            data: bytes | bytearray = self._partial
        else:
            data = read.data
        events: list[tuple[int, bytes]] = []
        unpack = HEADER.unpack_from
        limit = self.max_payload
        start = self._start
        end = len(data)
        p = 0
        while end - p >= 8:
            code, length = unpack(data, p)
            if code or length < 0 or length > limit:
                what = type_name(code) if code else f"an event of {length} bytes"
                raise RemoteProtocolError(f"{what} at segment offset {start + p}")
            stop = p + 8 + length
            if stop > end:
                break
            events.append((start + p, bytes(data[p + 8 : stop])))
            p = stop
        self._partial = bytearray(data[p:])
        self._start = start + p
        self.at_tail = read.at_tail
        self.end_of_segment = read.end_of_segment
        if read.end_of_segment and self._partial:
            raise RemoteProtocolError(f"the segment ends inside the event at offset {self._start}")
        return events
