"""The segment-store role over a trio stream: appends stored durably, reads served.

:class:`ServerSession` is a :class:`~gateway.sdk.Session` over the
sans-IO :class:`~protocols.segment.codec.ServerCodec`, backed by an
embedded :class:`~gateway.store.Store`:

* ``Hello`` is answered with ours (an incompatible range gets it too, then
  the connection closes); ``KeepAlive`` is echoed and counts as progress.
* ``SetupAppend`` answers ``AppendSetup`` with the writer's last *durable*
  event number, but only once everything already written to the segment is
  durable: a writer reconnecting while its previous connection's appends
  still await their fsync must learn about them, or it would send them again.
  A missing segment is created when ``auto_create`` allows and the store
  holds fewer than ``max_segments`` segments, else the answer is
  ``NoSuchSegment``. A segment the listener creates, or a plain one (no
  durable destination's) it sets up without a retention of its own, gets the
  listener's ``retain_bytes`` and ``retain_age``.
* An append block is checked against the segment's writer ledger, which all
  connections share (a block whose first event number is not above the last
  one written gets ``InvalidEventNumber``, then the connection closes: a
  duplicate is never stored), then written, and answered with
  ``DataAppended`` only once it is durable, in order. While more than
  ``max_outstanding_bytes`` are appended and not yet acked, reading stops.
* ``ReadSegment`` returns durable bytes only (a crash can never take back
  what a reader saw). A read at the durable end is held in a task of its own,
  so the connection keeps reading, until data becomes durable or
  ``read_wait`` passes (then an empty ``SegmentRead`` at the tail). Damaged
  records are never read: a read reaching one returns the bytes before it, a
  read starting in one is answered ``SegmentIsTruncated`` whose start offset
  is the end of the damaged record, where the reader goes on. A read whose
  ``flags`` ask for :data:`~.events.READ_FORMATS` also gets the payload
  formats of the bytes returned (``SegmentRead.formats``).
* A writer set up with ``payload_format`` 1 (envelopes) has each event of
  each block checked as a hub message envelope (:mod:`gateway.durable.envelope`)
  before anything of the block is stored, and a source identity in it is
  refused (only the gateway's TLS layer verifies an identity); the block is
  stored as records of format ``ENVELOPE``, which every subscriber of the
  durable destination reads as messages. A bad block gets ``ErrorMessage``
  ("event K of the block: why", K from 0), then the connection closes. An
  unknown payload format is refused with ``ErrorMessage`` (the connection
  stays open).
* ``GetStreamSegmentInfo`` is answered ``StreamSegmentInfo`` from the
  segment's durable state (its write offset is the durable end, what reads
  can return); a missing segment is ``exists=false`` with zeros, and is
  never created by asking. ``LocateOffset`` is answered ``OffsetLocated``
  (:meth:`~gateway.store.segment.Segment.locate`), a missing segment
  ``NoSuchSegment``.
* Any other broken rule gets the codec's error reply, then the connection
  closes; other connections are not affected.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import trio

from gateway.sdk import (
    NOTHING,
    Count,
    NotKept,
    Outcome,
    Receipt,
    RecordFormat,
    RemoteProtocolError,
    Segment,
    SegmentDamaged,
    SegmentTruncated,
    Session,
    StorageFull,
    Store,
    envelope,
)

from .codec import Limits, SegmentProtocolError, ServerCodec
from .events import (
    NULL_EVENT_NUMBER,
    READ_FORMATS,
    Append,
    AppendSetup,
    ErrorMessage,
    GetStreamSegmentInfo,
    Hello,
    InvalidEventNumber,
    KeepAlive,
    LocateOffset,
    NoSuchSegment,
    OffsetLocated,
    PayloadFormat,
    ReadSegment,
    SegmentIsTruncated,
    SegmentRead,
    SetupAppend,
    StreamSegmentInfo,
)
from .frames import HEADER, encode

__all__ = ["ServerMetrics", "ServerSession", "ServerSettings"]

log = logging.getLogger(__name__)

#: Append blocks read and not yet acked before reading pauses, whatever their size.
MAX_PENDING_BLOCKS = 4096
#: Reads held at the tail at once per connection; a further one waits (reading pauses).
MAX_HELD_READS = 256
#: Bytes asked of the socket per read. Appends arrive as blocks of 256 KiB or more
#: (a writer's ``block_size``, up to the 8 MiB command limit): reading them in
#: 64 KiB pieces cost a scheduler round and a cancel scope per piece, about a sixth
#: of the listener's time (docs/performance.md, "Segment store").
RECEIVE_SIZE = 1 << 20
#: ``ErrorMessage.error_code`` for an argument the server refuses (Pravega's ILLEGAL_ARGUMENT).
ILLEGAL_ARGUMENT = 0
#: The store's record format of each payload format a writer may ask for.
_RECORD_FORMATS: dict[int, RecordFormat] = {
    PayloadFormat.RAW: RecordFormat.RAW,
    PayloadFormat.ENVELOPE: RecordFormat.ENVELOPE,
}
_FORMATS = frozenset(_RECORD_FORMATS)


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """Where a connection counts its work (per append block or read, never per event)."""

    #: Events appended (the gateway passes its per-listener messages-received tally).
    events: Count = NOTHING
    #: Bytes appended (event frames, as stored).
    appended_bytes: Count = NOTHING
    #: Bytes returned by reads.
    read_bytes: Count = NOTHING
    #: Connections closed for breaking the protocol or timing out.
    protocol_errors: Count = NOTHING
    #: Reads that started in a damaged record (answered ``SegmentIsTruncated`` past it).
    damaged_reads: Count = NOTHING
    #: ``SetupAppend``s refused because the store holds ``max_segments`` segments.
    segments_refused: Count = NOTHING


@dataclass(frozen=True, slots=True)
class ServerSettings:
    limits: Limits = field(default_factory=Limits)
    #: Create a segment a ``SetupAppend`` names when it does not exist.
    auto_create: bool = True
    #: Segments the store may hold (all of them count) for ``auto_create`` to make another.
    max_segments: int = 1000
    #: Bytes each segment the listener creates keeps (None: no bound); whole chunk
    #: files go, oldest first.
    retain_bytes: int | None = 2**30
    #: Seconds each segment the listener creates keeps data (None: the store's).
    retain_age: float | None = None
    #: Bytes appended and not yet acked above which reading stops.
    max_outstanding_bytes: int = 16 * 2**20
    #: The most bytes one ``SegmentRead`` returns (the client's suggestion may be lower).
    max_read_bytes: int = 2**20
    #: Seconds a read at the tail is held for new data before an empty reply.
    read_wait: float = 10.0
    #: Seconds a started command may take to arrive whole (0: no limit).
    unit_timeout: float = 30.0
    #: Seconds one write may take (0: no limit).
    write_timeout: float = 30.0


class _Block:
    """One append block between its arrival and its ack."""

    __slots__ = ("append", "end", "setup", "size")

    def __init__(self, append: Append, setup: int | None, size: int) -> None:
        self.append = append
        #: Which setup of its writer it was sent under.
        self.setup = setup
        self.size = size
        #: The segment's length after it (known once written).
        self.end = -1


class ServerSession(Session):
    """One segment-append connection, server side; :meth:`serve` runs it."""

    codec: ServerCodec

    def __init__(
        self,
        stream: trio.abc.Stream,
        store: Store,
        settings: ServerSettings | None = None,
        *,
        logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
        shutdown: trio.Event | None = None,
        metrics: ServerMetrics | None = None,
    ) -> None:
        settings = settings or ServerSettings()
        super().__init__(
            stream,
            ServerCodec(settings.limits),
            log=logger or log,
            shutdown=shutdown,
            max_answers=MAX_PENDING_BLOCKS,
            ordered=True,
            unit_timeout=settings.unit_timeout,
            write_timeout=settings.write_timeout,
            receive_size=RECEIVE_SIZE,
        )
        self.store = store
        self.settings = settings
        self.metrics = metrics or ServerMetrics()
        #: Each writer's current setup on this connection: answers of an earlier one
        #: are dropped (the new ``AppendSetup`` already told what is durable).
        self._setups: dict[UUID, int] = {}
        self._setup_count = 0
        #: Bytes appended and not yet acked; reading stops above the limit.
        self.outstanding_bytes = 0
        self._acked = trio.lowlevel.ParkingLot()
        self._held_reads = 0
        self._read_done = trio.lowlevel.ParkingLot()

    # -- Session hooks ---------------------------------------------------------------------
    def ended_by(self, error: Exception) -> None:
        self.metrics.protocol_errors.inc()

    def error_reply(self, error: RemoteProtocolError) -> bytes | None:
        if isinstance(error, SegmentProtocolError) and error.reply is not None:
            return encode(error.reply)
        return encode(ErrorMessage(-1, "", str(error), -1))

    async def handle(self, event: object) -> None:
        if isinstance(event, Append):
            await self._append(event)
        elif isinstance(event, ReadSegment):
            await self._read(event)
        elif isinstance(event, SetupAppend):
            await self._setup(event)
        elif isinstance(event, GetStreamSegmentInfo):
            await self.write_when_room(self.codec.send(self._info(event)))
        elif isinstance(event, LocateOffset):
            await self.write_when_room(self.codec.send(self._locate(event)))
        elif isinstance(event, KeepAlive):
            self.write(self.codec.send(KeepAlive()))
        elif isinstance(event, Hello):
            self.write(self.codec.send(Hello()))
        else:  # pragma: no cover - the codec returns nothing else to a server
            raise AssertionError(f"unexpected event {event!r}")

    # -- appends ---------------------------------------------------------------------------
    async def _setup(self, setup: SetupAppend) -> None:
        if setup.payload_format not in _FORMATS:
            message = f"unknown payload format {setup.payload_format} (0 raw, 1 envelope)"
            self.write(
                self.codec.send(
                    ErrorMessage(setup.request_id, setup.segment, message, ILLEGAL_ARGUMENT)
                )
            )
            return
        segment = self._segment(setup.segment, create=self.settings.auto_create, request=setup)
        if segment is None:
            return
        self._setup_count += 1
        self._setups[setup.writer_id] = self._setup_count
        # Whatever this writer (or anyone) wrote before must be durable before we say
        # how far it got: a writer reconnecting while its earlier appends await their
        # fsync would otherwise send them again.
        await segment.durable(segment.end)
        last = segment.last_event_number(setup.writer_id, durable=True)
        self.write(
            self.codec.send(
                AppendSetup(
                    setup.request_id,
                    setup.segment,
                    setup.writer_id,
                    NULL_EVENT_NUMBER if last is None else last,
                    # echoed when asked for: a raw writer's answer is Pravega's, byte for byte
                    setup.payload_format or -1,
                )
            )
        )

    def _segment(self, name: str, *, create: bool, request: SetupAppend) -> Segment | None:
        """The segment a setup names (created if allowed, with the listener's retention);
        None once refused on the wire."""
        rid = request.request_id
        if not name:
            self.write(self.codec.send(NoSuchSegment(rid, name, "", -1)))
            return None
        store = self.store
        segment = store.segment(name, create=False)
        if segment is None and create:
            held = len(store.names())
            if held >= self.settings.max_segments:
                self.metrics.segments_refused.inc()
                self.log.warning(
                    "segment %r not created: the store holds %d segments (max_segments %d)",
                    name,
                    held,
                    self.settings.max_segments,
                )
                reason = (
                    f"not created: the store holds {held} segments, this listener's "
                    f"max_segments is {self.settings.max_segments}"
                )
                self.write(self.codec.send(NoSuchSegment(rid, name, reason, -1)))
                return None
            try:
                segment = store.segment(name)
            except OSError as e:
                self.log.warning("cannot create segment %r: %s", name, e)
                self.write(
                    self.codec.send(
                        ErrorMessage(rid, name, f"cannot create the segment: {e.strerror or e}", -1)
                    )
                )
                return None
            except trio.ClosedResourceError:
                raise NotKept("the store is closed") from None
            self._retain(segment)
        elif segment is not None and segment.retain_bytes is None and not segment.observed:
            self._retain(segment)  # a plain segment, from before a restart
        if segment is None:
            self.write(self.codec.send(NoSuchSegment(rid, name, "", -1)))
        return segment

    def _retain(self, segment: Segment) -> None:
        """Bound ``segment`` by the listener's retention, as any segment is bounded."""
        settings = self.settings
        segment.retain_bytes = settings.retain_bytes
        if settings.retain_age is not None:
            segment.retain_age = settings.retain_age

    async def _append(self, append: Append) -> None:
        segment = self.store.segment(append.segment, create=False)
        if segment is None:  # pragma: no cover - segments are never deleted while running
            raise NotKept(f"segment {append.segment!r} is gone")
        writer = append.writer_id
        _check_numbers(segment, append)
        if append.payload_format == PayloadFormat.ENVELOPE:
            _check_envelopes(append)
        block = _Block(append, self._setups.get(writer), len(append.data))
        await self.submit(
            functools.partial(self._store, segment, block), functools.partial(self._answer, block)
        )
        self.outstanding_bytes += block.size
        self.metrics.events.inc(append.event_count)
        self.metrics.appended_bytes.inc(block.size)
        while self.outstanding_bytes > self.settings.max_outstanding_bytes:
            await self._acked.park()

    async def _store(self, segment: Segment, block: _Block) -> Receipt:
        """Write the block; its receipt settles once it is durable. While the disk is
        full the block waits for room (the connection is not read meanwhile, its writer
        not acked), then it is written; numbers another connection of the same writer
        stored meanwhile are refused as they would have been at once."""
        append = block.append
        while True:
            try:
                appended = segment.append(
                    append.data,
                    append.event_count,
                    writer=append.writer_id,
                    last_event_number=append.last_event_number,
                    verified=True,  # the codec counted its frames (assemble)
                    format=_RECORD_FORMATS[append.payload_format],
                )
                break
            except trio.ClosedResourceError:
                raise NotKept("the store is closed") from None
            except StorageFull as full:
                await full.room()
                _check_numbers(segment, append)
        block.end = appended.end
        receipt = Receipt(1)
        receipt.add_legs()
        receipt.seal()
        segment.when_durable(appended.end, functools.partial(receipt.settle, 0, Outcome.DELIVERED))
        return receipt

    def _answer(self, block: _Block, receipt: Receipt) -> bytes | None:
        self.outstanding_bytes -= block.size
        if self._acked:
            self._acked.unpark_all()
        append = block.append
        if receipt.outcome is not Outcome.DELIVERED:
            raise NotKept(
                f"writer {append.writer_id}: events up to {append.last_event_number} were not"
                f" stored durably ({receipt.reason or 'failed'}); closing without an ack"
            )
        if self._setups.get(append.writer_id) != block.setup:
            return None  # set up again since: its AppendSetup covered this block
        return self.codec.acknowledge(append, block.end)

    # -- info and locate -------------------------------------------------------------------
    def _info(self, ask: GetStreamSegmentInfo) -> StreamSegmentInfo:
        """What the segment holds durably; ``exists=false`` and zeros when missing (a
        probe for ``NAME/0 .. NAME/N-1`` ends at the first one missing, without an
        error reply that a client would have to tell from a failure)."""
        rid, name = ask.request_id, ask.segment
        segment = self.store.segment(name, create=False) if name else None
        if segment is None:
            return StreamSegmentInfo(rid, name, False, False, False, 0, 0, 0, 0, 0)
        return StreamSegmentInfo(
            rid,
            name,
            True,
            False,
            False,
            segment.last_modified_us // 1000,
            max(segment.durable_end, segment.start),
            segment.start,
            segment.first_event,
            segment.durable_next_event,
        )

    def _locate(self, ask: LocateOffset) -> OffsetLocated | NoSuchSegment:
        """The boundary ``ask`` names (:meth:`Segment.locate`), or ``NoSuchSegment``."""
        rid, name = ask.request_id, ask.segment
        segment = self.store.segment(name, create=False) if name else None
        if segment is None:
            return NoSuchSegment(rid, name, "", ask.target_offset)
        offset, index = segment.locate(ask.target_offset, ask.events if ask.events >= 0 else None)
        return OffsetLocated(rid, name, offset, index)

    # -- reads -----------------------------------------------------------------------------
    async def _read(self, read: ReadSegment) -> None:
        name, offset, rid = read.segment, read.offset, read.request_id
        if offset < 0:
            message = f"negative read offset {offset}"
            raise SegmentProtocolError(message, ErrorMessage(rid, name, message, ILLEGAL_ARGUMENT))
        segment = self.store.segment(name, create=False) if name else None
        if segment is None:
            await self.write_when_room(self.codec.send(NoSuchSegment(rid, name, "", offset)))
            return
        if offset < segment.durable_end or offset < segment.start:
            await self.write_when_room(self._reply(segment, read))
            return
        while self._held_reads >= MAX_HELD_READS:
            await self._read_done.park()
        self._held_reads += 1
        self.nursery.start_soon(self._held_read, segment, read)

    async def _held_read(self, segment: Segment, read: ReadSegment) -> None:
        """A read at the tail: answered once data past it is durable, or empty at ``read_wait``."""
        try:
            with trio.move_on_after(self.settings.read_wait):
                await segment.wait_for(read.offset)
                await segment.durable(read.offset + 1)
            reply = self._reply(segment, read)
        except trio.ClosedResourceError:
            return  # the store closed: the gateway is stopping
        finally:
            self._held_reads -= 1
            if self._read_done:
                self._read_done.unpark_all()
        await self.write_when_room(reply)

    def _reply(self, segment: Segment, read: ReadSegment) -> bytes:
        """The ``SegmentRead`` (or ``SegmentIsTruncated``) answering ``read`` now."""
        name, offset, rid = read.segment, read.offset, read.request_id
        if offset < segment.start:
            return self.codec.send(SegmentIsTruncated(rid, name, segment.start, "", offset))
        durable = segment.durable_end
        limit = self.settings.max_read_bytes
        if read.suggested_length > 0:
            limit = min(limit, read.suggested_length)
        data = b""
        if offset < durable:
            try:
                data = segment.read(offset, min(limit, durable - offset))
            except SegmentTruncated as e:  # retention moved the start since it was checked
                return self.codec.send(SegmentIsTruncated(rid, name, e.start, "", offset))
            except SegmentDamaged as e:
                # Never served: the reader goes on after it, as after a truncation (the
                # store logged the record once, and counts it in corrupt_records).
                self.metrics.damaged_reads.inc()
                return self.codec.send(SegmentIsTruncated(rid, name, e.end, str(e), offset))
        self.metrics.read_bytes.inc(len(data))
        at_tail = offset + len(data) >= durable
        formats = None
        if read.flags & READ_FORMATS:
            formats = SegmentRead.pack_formats(segment.formats(offset, offset + len(data)))
        return self.codec.send(SegmentRead(name, offset, at_tail, False, data, rid, formats))


def _check_envelopes(append: Append) -> None:
    """Refuse a block of an envelope writer unless every event is an envelope this
    gateway reads and claims no verified identity (nothing of the block is stored)."""
    data = append.data
    unpack = HEADER.unpack_from
    pos = 0
    for k in range(append.event_count):
        length = unpack(data, pos)[1]
        payload = memoryview(data)[pos + 8 : pos + 8 + length]
        pos += 8 + length
        try:
            message = envelope.decode(payload, append.segment)
        except ValueError as e:
            why = str(e)
        else:
            if message.source is None or message.source.identity is None:
                continue
            why = "a source identity ('o'.'i') is the gateway's to verify, not a writer's claim"
        text = f"event {k} of the block: {why}"
        raise SegmentProtocolError(
            f"writer {append.writer_id}: {text}",
            ErrorMessage(append.request_id, append.segment, text, ILLEGAL_ARGUMENT),
        )


def _check_numbers(segment: Segment, append: Append) -> None:
    """Refuse an append whose events are not above the last number its writer stored:
    another connection of the same writer (or an earlier one on this) stored them
    already, and storing them again would duplicate events."""
    writer = append.writer_id
    first = append.last_event_number - append.event_count + 1
    last = segment.last_event_number(writer, durable=False)
    if last is not None and first <= last:
        raise SegmentProtocolError(
            f"writer {writer}: events {first}..{append.last_event_number} are not above"
            f" {last}, the last event number stored in segment {append.segment!r}",
            InvalidEventNumber(writer, append.request_id, "", append.last_event_number),
        )
