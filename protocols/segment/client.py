"""Segment-append clients over trio: a writer whose appends are exactly-once, and a reader.

:class:`SegmentWriter` appends events to one or more segments over one
connection, each segment with a writer id of its own. ``await
writer.append(segment, payload)`` returns once the server acknowledged the
event, which a gateway does only once it is durable. Events are numbered from
1 (or from the last number the server stored for a writer id it knows), sent
in append blocks (a block still open 20 ms after it started is closed), and a
bounded number may be in flight. When the connection fails the writer
reconnects with a backoff, sets each writer up again, and resends exactly the
events the server did not store durably, with their original numbers: the
``AppendSetup`` answer says how far each writer got, and the server refuses
numbers it has stored, so nothing is lost or duplicated. The caller may number
the events itself (``first_event_number``), so that a retried process's events
that the server has already are skipped, and a writer may append message
envelopes (``envelope=True``) that the server stores as messages.

:class:`SegmentReader` reads a segment from an offset as ``(offset, payload)``
pairs, following the tail if asked, whatever the server's replies look like
(several per request, cut inside an event); ``read_stored`` adds each event's
payload format. ``info`` tells a segment's retained start and durable end, and
``locate`` finds event boundaries from the server's index.

:class:`Appender` and :func:`run_appender` are what both the writer and the
gateway's segment upstream are made of: the writers' state that outlives a
connection (numbers, unacked events), and one connection's session.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import logging
import operator
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, cast
from uuid import UUID, uuid4

import trio

from gateway.sdk import (
    NEED_DATA,
    Backoff,
    ConnectionClosed,
    ProtocolError,
    RemoteProtocolError,
    Session,
    TcpTransport,
    UnixTransport,
    address_host,
    describe_error,
    first_leaf,
    start_tls,
)

from .blocking import SegmentInfo, StoredEvent
from .codec import ClientCodec
from .codec import EventReassembler as Reassembler
from .errors import (
    NoSuchSegmentError,
    SegmentClientError,
    SegmentError,
    SegmentSealedError,
    SegmentTruncatedError,
    refusal,
)
from .events import (
    MAX_EVENT_PAYLOAD,
    READ_FORMATS,
    AppendSetup,
    AuthTokenCheckFailed,
    Command,
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
    SetupAppend,
    StreamSegmentInfo,
    WrongHost,
)

__all__ = [
    "Acked",
    "Appender",
    "NoSuchSegmentError",
    "PendingAppend",
    "SegmentClientError",
    "SegmentError",
    "SegmentInfo",
    "SegmentReader",
    "SegmentSealedError",
    "SegmentTruncatedError",
    "SegmentWriter",
    "StoredEvent",
    "StoredEvents",
    "WriterSettings",
    "open_stream",
    "run_appender",
]

log = logging.getLogger(__name__)

RECEIVE_SIZE = 65536
#: Events and bytes one lane sends before the send loop turns to the next.
_BATCH_EVENTS = 1000
_BATCH_BYTES = 2**20
_REFUSALS = (
    NoSuchSegment,
    SegmentIsSealed,
    SegmentAlreadyExists,
    AuthTokenCheckFailed,
    OperationUnsupported,
    ErrorMessage,
)
#: Answers after which the server closes; a new connection sets every writer up again.
_CLOSING = (InvalidEventNumber, WrongHost, *_REFUSALS)
_MAX_EVENT_NUMBER = 2**63 - 1


# -- errors and results ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acked:
    """An event the server acknowledged (stored durably, for a gateway)."""

    segment: str
    writer_id: UUID
    event_number: int
    #: The segment's length after the append that covered the event (-1: not said,
    #: as when a reconnect's ``AppendSetup`` covered it).
    segment_write_offset: int


class PendingAppend:
    """An event (or the last of a batch) on its way; :meth:`wait` until it is acked."""

    __slots__ = ("_done", "_error", "_result")

    def __init__(self) -> None:
        self._done = trio.Event()
        self._result: Acked | None = None
        self._error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self._done.is_set()

    async def wait(self) -> Acked:
        """The ack; raises what failed the event (a :class:`SegmentError`, or
        ``trio.ClosedResourceError`` when the writer closed first)."""
        await self._done.wait()
        return self.result()

    def result(self) -> Acked:
        if self._error is not None:
            raise self._error
        if self._result is None:
            raise RuntimeError("the append is not acknowledged yet")
        return self._result

    def _resolve(self, acked: Acked) -> None:
        if not self._done.is_set():
            self._result = acked
            self._done.set()

    def _fail(self, error: BaseException) -> None:
        if not self._done.is_set():
            self._error = error
            self._done.set()


# -- state that outlives a connection ---------------------------------------------------------

#: ``(segment, [(token, event number), ...], segment write offset)``: events the server
#: acknowledged (only those added with a token are listed).
OnAcked = Callable[[str, UUID, list[tuple[Any, int]], int], None]
#: ``(segment, tokens, error)``: the server refused the segment; its events are dropped.
OnRefused = Callable[[str, list[Any], SegmentError], None]


class _Run:
    """Events added together (one ``add``): kept, numbered and acked as a run, so that
    a writer's bookkeeping costs a few operations per run rather than per event."""

    __slots__ = ("ends", "first", "marks", "payloads", "tokens")

    def __init__(self, payloads: list[bytes], ends: list[int], tokens: Sequence[Any]) -> None:
        self.payloads = payloads
        #: ends[k]: payload bytes of events 0..k of the run (for byte windows).
        self.ends = ends
        #: The events that have a token (positions in the run, rising), and their tokens.
        n = len(payloads)
        self.marks = list(
            itertools.compress(range(n), map(operator.is_not, tokens[:n], itertools.repeat(None)))
        )
        self.tokens = [tokens[k] for k in self.marks]
        #: The number of payloads[0]: 0 until the run is first sent, then kept for
        #: every resend (the whole run is numbered at once, consecutively).
        self.first = 0

    def nbytes(self, start: int, stop: int) -> int:
        """Payload bytes of events ``start..stop-1``."""
        ends = self.ends
        return ends[stop - 1] - (ends[start - 1] if start else 0) if stop > start else 0

    def marked(self, start: int, stop: int) -> list[tuple[Any, int]]:
        """``(token, event number)`` of the events ``start..stop-1`` that have a token."""
        a = bisect.bisect_left(self.marks, start)
        b = bisect.bisect_left(self.marks, stop, a)
        first = self.first
        return [(self.tokens[i], first + self.marks[i]) for i in range(a, b)]


class Lane:
    """One segment's writer: its events not acked yet, oldest first, in runs."""

    __slots__ = (
        "at",
        "chosen",
        "count",
        "cursor",
        "head",
        "high",
        "name",
        "nbytes",
        "next_number",
        "runs",
        "sent",
        "sent_bytes",
        "stored",
        "writer_id",
    )

    def __init__(self, name: str, writer_id: UUID) -> None:
        self.name = name
        self.writer_id = writer_id
        self.runs: deque[_Run] = deque()
        #: Events of ``runs[0]`` already acked (dropped from the front).
        self.head = 0
        #: Events (and their payload bytes) not acked.
        self.count = 0
        self.nbytes = 0
        #: Events at the front sent on the current connection (and not acked), and
        #: their payload bytes.
        self.sent = 0
        self.sent_bytes = 0
        #: Where the next event to send is: ``runs[cursor]``, event ``at``.
        self.cursor = 0
        self.at = 0
        self.next_number = 1
        #: The highest event number ever sent (what is sent again counts as resent).
        self.high = 0
        #: Whether the caller numbers this lane's events (None: no event added yet).
        self.chosen: bool | None = None
        #: The highest event number the server is known to have stored (its
        #: ``AppendSetup`` or an ack said so; 0: none known).
        self.stored = 0

    def rewind(self) -> None:
        """Nothing is sent on the connection now: the next send starts at the front."""
        self.sent = self.sent_bytes = 0
        self.cursor, self.at = 0, self.head

    def tokens(self) -> list[Any]:
        """The tokens of the events not acked."""
        out: list[Any] = []
        for i, run in enumerate(self.runs):
            start = bisect.bisect_left(run.marks, self.head) if i == 0 else 0
            out += run.tokens[start:]
        return out


class Appender:
    """Writers' state across connections: event numbers, unacked events, the window.

    ``add`` queues events (with an optional *token* each, handed back to
    ``on_acked`` once acknowledged); a session sends them and feeds back what
    the server answers. ``on_refused`` gets the tokens of a segment the server
    refused (None: the refusal is raised, ending the connection).
    """

    def __init__(
        self,
        on_acked: OnAcked,
        on_refused: OnRefused | None = None,
        *,
        writer_id: Callable[[str], UUID] | None = None,
        max_events: int = 1000,
        max_bytes: int = 16 * 2**20,
        payload_format: int = PayloadFormat.RAW,
    ) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ValueError("the window must hold at least one event and one byte")
        self.on_acked = on_acked
        #: What every writer's ``SetupAppend`` asks for: raw payloads, or envelopes
        #: the server checks and stores as messages.
        self.payload_format = payload_format
        self.on_refused = on_refused
        self.writer_id = writer_id or (lambda _segment: uuid4())
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.lanes: dict[str, Lane] = {}
        #: Events (and their payload bytes) added and not acked.
        self.events = 0
        self.bytes = 0
        #: Events sent on the current connection and not acked.
        self.in_flight = 0
        #: Events sent again on a new connection, in all.
        self.resent = 0
        #: Called with the number of events each send repeats (for metrics).
        self.on_resend: Callable[[int], None] | None = None
        #: Woken when events are added (the send loop waits here).
        self.changed = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()

    # -- the producer's side ----------------------------------------------------------------
    def lane(self, segment: str) -> Lane:
        lane = self.lanes.get(segment)
        if lane is None:
            lane = self.lanes[segment] = Lane(segment, self.writer_id(segment))
        return lane

    def has_room(self, events: int = 1, nbytes: int = 0) -> bool:
        """Whether ``events`` more fit in the window (one always fits an empty window)."""
        return not self.events or (
            self.events + events <= self.max_events and self.bytes + nbytes <= self.max_bytes
        )

    def room(self) -> tuple[int, int]:
        """How many events and payload bytes the window has room for now."""
        return self.max_events - self.events, self.max_bytes - self.bytes

    async def wait_for_room(self, events: int = 1, nbytes: int = 0) -> None:
        while not self.has_room(events, nbytes):
            await self._room.park()

    async def wait_empty(self) -> None:
        """Until every event added is acked or refused."""
        while self.events:
            await self._room.park()

    def add(
        self,
        segment: str,
        payloads: Sequence[bytes],
        tokens: Sequence[Any] = (),
        first_event_number: int | None = None,
    ) -> None:
        """Queue ``payloads`` for ``segment`` (``tokens`` in step, or none), without waiting.

        With ``first_event_number`` the events carry the caller's numbers (rising
        from one add to the next); those the server has stored already for the
        writer id are acked at once, or at its ``AppendSetup``, without being sent.
        A lane is numbered by the caller or by the appender, never both."""
        if not payloads:
            return
        lane = self.lane(segment)
        if first_event_number is not None:
            self._numbering(lane, chosen=True)
            payloads, tokens, first_event_number = self._skip_stored(
                lane, payloads, tokens, first_event_number
            )
            if not payloads:
                return
        payloads = list(payloads)
        sizes = list(map(len, payloads))
        if max(sizes) > MAX_EVENT_PAYLOAD:
            raise ValueError(f"an event of {max(sizes)} bytes exceeds {MAX_EVENT_PAYLOAD}")
        ends = list(itertools.accumulate(sizes))
        n = len(payloads)
        run = _Run(payloads, ends, tokens)
        self._number(lane, run, first_event_number)
        lane.runs.append(run)
        lane.count += n
        lane.nbytes += ends[-1]
        self.events += n
        self.bytes += ends[-1]
        if self.changed:
            self.changed.unpark_all()

    @staticmethod
    def _numbering(lane: Lane, *, chosen: bool) -> None:
        if lane.chosen is not None and lane.chosen != chosen:
            raise ValueError(
                f"segment {lane.name!r}: a writer's events are numbered by the caller or by"
                " the writer, not both"
            )
        lane.chosen = chosen

    def _skip_stored(
        self, lane: Lane, payloads: Sequence[bytes], tokens: Sequence[Any], first: int
    ) -> tuple[Sequence[bytes], Sequence[Any], int]:
        """Ack at once the leading events the server is known to have (a retry's)."""
        skip = min(max(lane.stored - first + 1, 0), len(payloads))
        if not skip:
            return payloads, tokens, first
        done = [(t, first + i) for i, t in enumerate(tokens[:skip]) if t is not None]
        if done:
            self.on_acked(lane.name, lane.writer_id, done, -1)
        return payloads[skip:], tokens[skip:], first + skip

    def _number(self, lane: Lane, run: _Run, first: int | None) -> None:
        """Number ``run`` now with the caller's numbers, or leave it to ``take``."""
        self._numbering(lane, chosen=first is not None)
        if first is None:
            return
        last = first + len(run.payloads) - 1
        if first < max(lane.next_number, 1) or last > _MAX_EVENT_NUMBER:
            raise ValueError(
                f"segment {lane.name!r}: event numbers {first}..{last} must lie above"
                f" {lane.next_number - 1} (the last one this writer used) and below 2**63"
            )
        run.first = first
        lane.next_number = last + 1

    def fail_all(self, error: BaseException) -> list[Any]:
        """Drop every event; the tokens of those not acked."""
        tokens = [t for lane in self.lanes.values() for t in lane.tokens()]
        self.lanes.clear()
        self.events = self.bytes = self.in_flight = 0
        self._room.unpark_all()
        return tokens

    # -- the session's side -----------------------------------------------------------------
    def take(self, lane: Lane, max_events: int, max_bytes: int) -> tuple[list[bytes], int]:
        """Events to send next (numbered now if new), at most ``max_events``/``max_bytes``
        (at least one, if any is left): their payloads and the last one's number."""
        out: list[bytes] = []
        size = 0
        last = 0
        resent = 0
        runs = lane.runs
        i, at = lane.cursor, lane.at
        while i < len(runs) and len(out) < max_events:
            run = runs[i]
            n = len(run.payloads)
            stop = min(n, at + max_events - len(out))
            if size + run.nbytes(at, stop) > max_bytes:
                # As many as the bytes allow (at least one in all).
                base = run.ends[at - 1] if at else 0
                stop = bisect.bisect_right(run.ends, base + max_bytes - size, at, stop)
                if stop == at and not out:
                    stop = at + 1
                if stop == at:
                    break
            if not run.first:
                run.first = lane.next_number
                lane.next_number += n
            first, last = run.first + at, run.first + stop - 1
            if first <= lane.high:
                resent += min(last, lane.high) - first + 1
            lane.high = max(lane.high, last)
            out += run.payloads[at:stop]
            size += run.nbytes(at, stop)
            if stop < n:
                at = stop
                break
            i, at = i + 1, 0
        lane.cursor, lane.at = i, at
        lane.sent += len(out)
        lane.sent_bytes += size
        self.in_flight += len(out)
        if resent:
            self.resent += resent
            if self.on_resend is not None:
                self.on_resend(resent)
        return out, last

    def set_up(self, lane: Lane, last_event_number: int) -> None:
        """The server stored the lane's events up to ``last_event_number`` (durably):
        they are acked; the rest are sent again, with their numbers."""
        last = max(last_event_number, 0)  # Long.MIN_VALUE (or a draft peer's 0): none
        self.in_flight -= lane.sent
        lane.rewind()
        self._pop(lane, last, -1)
        lane.next_number = max(lane.next_number, last + 1)
        lane.stored = max(lane.stored, last)

    def acknowledge(self, lane: Lane, event_number: int, offset: int) -> None:
        """``DataAppended``: every event of the lane up to ``event_number`` is stored."""
        self.in_flight -= self._pop(lane, event_number, offset)
        lane.stored = max(lane.stored, event_number)

    def _pop(self, lane: Lane, last: int, offset: int) -> int:
        """Drop the lane's events numbered up to ``last``; how many."""
        runs = lane.runs
        acked: list[tuple[Any, int]] = []
        count = size = 0
        while runs:
            run = runs[0]
            head = lane.head
            if not run.first or run.first + head > last:
                break
            n = len(run.payloads)
            stop = min(n, last - run.first + 1)
            count += stop - head
            size += run.nbytes(head, stop)
            if run.marks:
                acked += run.marked(head, stop)
            if stop < n:
                lane.head = stop
                if lane.cursor == 0 and lane.at < stop:
                    lane.at = stop
                break
            runs.popleft()
            lane.head = 0
            if lane.cursor:
                lane.cursor -= 1
            else:
                lane.at = 0
        if not count:
            return 0
        if lane.sent:
            lane.sent -= count
            lane.sent_bytes -= size
        lane.count -= count
        lane.nbytes -= size
        self.events -= count
        self.bytes -= size
        if self._room:
            self._room.unpark_all()
        if acked:
            self.on_acked(lane.name, lane.writer_id, acked, offset)
        return count

    def refuse(self, lane: Lane, error: SegmentError) -> None:
        """The server refused the lane's segment: drop its events (or raise ``error``)."""
        if self.on_refused is None:
            raise error
        if self.lanes.get(lane.name) is lane:
            del self.lanes[lane.name]
        self.events -= lane.count
        self.bytes -= lane.nbytes
        self.in_flight -= lane.sent
        tokens = lane.tokens()
        lane.runs.clear()
        lane.head = lane.count = lane.nbytes = 0
        lane.rewind()
        self._room.unpark_all()
        self.on_refused(lane.name, tokens, error)

    def disconnected(self) -> None:
        """The connection ended: nothing is in flight any more (all is resent)."""
        for lane in self.lanes.values():
            lane.rewind()
        self.in_flight = 0


# -- one connection ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WriterSettings:
    """How a writer connection behaves; the defaults are Pravega's client's."""

    #: The largest batched append block (0: none, every batch is one unbatched block);
    #: a block is as large as the bytes in flight, up to this.
    block_size: int = 256 * 1024
    #: A batched block still open this long after it started is closed (padded).
    block_timeout: float = 0.02
    #: Seconds the server may take to answer (an ack, a setup, a keepalive) before
    #: the connection counts as lost.
    timeout: float = 30.0
    #: A ``KeepAlive`` goes out when nothing was received for this long ...
    keepalive_initial: float = 20.0
    #: ... and then every this long while that stays so.
    keepalive_interval: float = 10.0


class AppendSession(Session):
    """One connection of an :class:`Appender`: setups, blocks out, acks in."""

    codec: ClientCodec

    def __init__(
        self,
        stream: trio.abc.Stream,
        appender: Appender,
        settings: WriterSettings,
        *,
        logger: logging.Logger | logging.LoggerAdapter[Any],
    ) -> None:
        super().__init__(
            stream,
            ClientCodec(block_size=settings.block_size),
            log=logger,
            write_timeout=settings.timeout,
        )
        self.appender = appender
        self.settings = settings
        self._ids = itertools.count(1)
        #: Lanes set up on this connection, by writer id.
        self._ready: dict[UUID, Lane] = {}
        #: Setups sent and not answered: request id → lane.
        self._setups: dict[int, Lane] = {}
        #: The setup request id of each lane set up (its blocks carry it).
        self._lane_ids: dict[int, Lane] = {}
        self._setting_up: set[str] = set()
        self._heard_at = trio.current_time()
        self._keepalive_owed = False
        #: When the open batched block must be closed (None: none is open).
        self._block_deadline: float | None = None

    def started(self) -> None:
        self.write(self.codec.send(Hello()))
        self.nursery.start_soon(self._send_loop)
        self.nursery.start_soon(self._keepalive_loop)

    def end_of_input(self) -> None:
        raise trio.BrokenResourceError("the server closed the connection")

    def received(self) -> None:
        self._heard_at = trio.current_time()
        self._keepalive_owed = False
        self._arm()

    async def handle(self, event: object) -> None:
        if isinstance(event, DataAppended):
            lane = self._ready[event.writer_id]
            self.appender.acknowledge(lane, event.event_number, event.current_segment_write_offset)
        elif isinstance(event, AppendSetup):
            # The codec checked that it answers our setup of this writer (request ids
            # are the server's to echo, and old servers may not).
            rid = next((r for r, x in self._setups.items() if x.writer_id == event.writer_id), 0)
            if rid not in self._setups:
                raise RemoteProtocolError(f"{event!r} answers no setup of ours")
            lane = self._setups.pop(rid)
            self._setting_up.discard(lane.name)
            if not self._accepts_format(lane, event):
                return
            self.appender.set_up(lane, event.last_event_number)
            if self.appender.lanes.get(lane.name) is lane:
                self._ready[lane.writer_id] = lane
                self._lane_ids[rid] = lane
                self.appender.changed.unpark_all()
        elif isinstance(event, Hello):
            if not event.compatible:
                self.log.warning(
                    "the server speaks versions %d..%d, we %d..%d",
                    event.low_version,
                    event.high_version,
                    Hello().low_version,
                    Hello().high_version,
                )
        elif isinstance(event, KeepAlive):
            pass
        elif isinstance(event, _REFUSALS) and event.request_id in self._setups:
            lane = self._setups.pop(event.request_id)
            self._setting_up.discard(lane.name)
            self.appender.refuse(lane, refusal(event))
        elif isinstance(event, ErrorMessage) and event.request_id in self._lane_ids:
            # A block the server refused (an envelope that does not decode): retrying
            # cannot help, so the lane's events fail; the server closes the connection.
            lane = self._lane_ids.pop(event.request_id)
            self._ready.pop(lane.writer_id, None)
            self.appender.refuse(lane, refusal(event))
            raise RemoteProtocolError(f"the server refused a block: {event.message}")
        elif isinstance(event, _CLOSING):
            raise RemoteProtocolError(f"the server answered {event!r}")
        else:
            raise RemoteProtocolError(f"unexpected {type(event).__name__} on a writer connection")

    def _accepts_format(self, lane: Lane, setup: AppendSetup) -> bool:
        """Whether the server took the payload format asked for; if not, the lane's
        events fail (a server too old for envelopes would store them as raw bytes)."""
        wanted = self.appender.payload_format
        if wanted == PayloadFormat.RAW or setup.payload_format == wanted:
            return True
        error = SegmentError(
            lane.name,
            f"segment {lane.name!r}: the server did not accept payload format {wanted} (its"
            " AppendSetup did not echo it): the gateway is too old for envelope writers",
        )
        self.appender.refuse(lane, error)
        return False

    # -- sending ---------------------------------------------------------------------------
    def _owed(self) -> bool:
        return bool(self.appender.in_flight or self._setups or self._keepalive_owed)

    def _owe(self) -> None:
        """Something is about to be sent that the server must answer."""
        if not self._owed():
            self._heard_at = trio.current_time()

    def _arm(self) -> None:
        if self._owed():
            self.set_deadline(
                self._heard_at + self.settings.timeout,
                f"no answer from the server for {self.settings.timeout:g}s",
            )
        else:
            self.clear_deadline()

    def _set_up_new_lanes(self) -> None:
        for lane in list(self.appender.lanes.values()):
            if lane.writer_id in self._ready or lane.name in self._setting_up:
                continue
            if not lane.count:
                continue
            self._owe()
            rid = next(self._ids)
            self._setups[rid] = lane
            self._setting_up.add(lane.name)
            fmt = self.appender.payload_format
            self.write(self.codec.send(SetupAppend(rid, lane.writer_id, lane.name, "", fmt)))
            self._arm()

    async def _send_loop(self) -> None:
        codec = self.codec
        appender = self.appender
        settings = self.settings
        while True:
            self._set_up_new_lanes()
            sent = False
            for lane in list(self._ready.values()):
                if lane.sent >= lane.count:
                    continue
                await self.write_when_room(b"")  # bytes are made only once they can go out
                if appender.lanes.get(lane.name) is not lane:
                    continue  # refused meanwhile
                # Batch into blocks about as large as what is in flight (Pravega's
                # tracker does the same): what arrives before the next ack shares a
                # block, an event with nothing in flight goes out at once, and a block
                # closed early wastes little padding.
                block_size = min(settings.block_size, lane.sent_bytes)
                payloads, last = appender.take(lane, _BATCH_EVENTS, _BATCH_BYTES)
                if not payloads:
                    continue
                self._owe()
                self.write(codec.append(lane.writer_id, payloads, last, block_size=block_size))
                self._arm()
                sent = True
                if codec.block_open:
                    if self._block_deadline is None:
                        self._block_deadline = trio.current_time() + settings.block_timeout
                else:
                    self._block_deadline = None
            deadline = self._block_deadline
            if deadline is not None and (not codec.block_open or trio.current_time() >= deadline):
                self.write(codec.close_block())
                self._block_deadline = deadline = None
            if sent:
                continue
            if deadline is None:
                await appender.changed.park()
            else:
                with trio.move_on_at(deadline):
                    await appender.changed.park()

    async def _keepalive_loop(self) -> None:
        """Pravega's client: after ``keepalive_initial``, a ``KeepAlive`` whenever nothing
        was received for a ``keepalive_interval``; its echo is owed within ``timeout``."""
        await trio.sleep(self.settings.keepalive_initial)
        last_tick = trio.current_time() - self.settings.keepalive_interval
        while True:
            if self._heard_at <= last_tick:
                self._owe()
                self._keepalive_owed = True
                self.write(self.codec.send(KeepAlive()))
                self._block_deadline = None  # the codec closed any open block first
                self._arm()
            last_tick = trio.current_time()
            await trio.sleep(self.settings.keepalive_interval)


async def run_appender(
    stream: trio.abc.Stream,
    appender: Appender,
    settings: WriterSettings | None = None,
    *,
    logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
) -> None:
    """Send ``appender``'s events over ``stream`` until the connection fails.

    Raises what ended it (inside an ``ExceptionGroup``): the server closing,
    a timeout, a protocol error. Events not acked are sent again by the next
    call, on a new connection, after their writer's new ``AppendSetup``.
    """
    session = AppendSession(stream, appender, settings or WriterSettings(), logger=logger or log)
    try:
        await session.run()
    finally:
        appender.disconnected()


async def open_stream(
    address: str,
    *,
    ssl_context: ssl.SSLContext | None = None,
    server_hostname: str | None = None,
) -> trio.abc.Stream:
    """A connection to ``address`` (``host:port`` or ``unix:/path``), with TLS if asked."""
    transport = UnixTransport() if address.startswith("unix:") else TcpTransport()
    stream = await transport.connect(address)
    if ssl_context is None:
        return stream
    return await start_tls(stream, ssl_context, server_hostname or address_host(address))


# -- the writer --------------------------------------------------------------------------------

_CONNECTION_LOST = (OSError, trio.BrokenResourceError, trio.TooSlowError, ProtocolError)


class SegmentWriter:
    """Append events to segments; open it with :meth:`connect`.

    ``await writer.append(segment, payload)`` returns the :class:`Acked` once
    the server stored the event. Several segments share the connection, each
    with its own writer id (``writer_id``: a function of the segment name, a
    UUID for a writer of one segment, or None for random ones). While
    ``max_inflight`` events (or ``max_inflight_bytes``) are not acked,
    appending waits.
    """

    def __init__(
        self,
        connect: Callable[[], Any],
        settings: WriterSettings,
        *,
        writer_id: UUID | Callable[[str], UUID] | None,
        max_inflight: int,
        max_inflight_bytes: int,
        backoff: Backoff,
        envelope: bool = False,
    ) -> None:
        self._connect = connect
        self.settings = settings
        self._fixed_id = writer_id if isinstance(writer_id, UUID) else None
        ids = writer_id if callable(writer_id) else None
        self.appender = Appender(
            self._acked,
            self._refused,
            writer_id=ids or self._writer_id,
            max_events=max_inflight,
            max_bytes=max_inflight_bytes,
            payload_format=PayloadFormat.ENVELOPE if envelope else PayloadFormat.RAW,
        )
        self.backoff = backoff
        #: Connections made, and the last failure (for callers that watch).
        self.connections = 0
        self.last_error: str | None = None
        self.connected = trio.Event()
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        address: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        writer_id: UUID | Callable[[str], UUID] | None = None,
        settings: WriterSettings | None = None,
        max_inflight: int = 1000,
        max_inflight_bytes: int = 16 * 2**20,
        backoff_initial: float = 0.1,
        backoff_max: float = 5.0,
        envelope: bool = False,
    ) -> AsyncIterator[SegmentWriter]:
        """Connect to ``address`` (``host:port`` or ``unix:/path``; TLS with
        ``ssl_context``) and append while the block runs.

        The first connection must succeed (``OSError`` otherwise); later ones
        are retried for ever with a backoff. Leaving the block closes the
        connection: events not acked by then fail with ``trio.ClosedResourceError``
        (call :meth:`flush` first to wait for them).

        With ``envelope`` every event is a message envelope (as
        ``gateway.durable.envelope`` encodes them), which the server checks and
        stores as a message: subscribers of the durable destination receive its
        headers, content type and source. A server too old for it fails the
        appends with :class:`SegmentError`; a payload that is not an envelope fails
        its segment's appends with the server's reason.
        """

        async def connect() -> trio.abc.Stream:
            return await open_stream(
                address, ssl_context=ssl_context, server_hostname=server_hostname
            )

        first = await connect()
        writer = cls(
            connect,
            settings or WriterSettings(),
            writer_id=writer_id,
            max_inflight=max_inflight,
            max_inflight_bytes=max_inflight_bytes,
            backoff=Backoff(backoff_initial, backoff_max),
            envelope=envelope,
        )
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer._run, first)
                try:
                    yield writer
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            writer._close()

    # -- appending -------------------------------------------------------------------------
    async def submit(
        self, segment: str, payload: bytes, *, event_number: int | None = None
    ) -> PendingAppend:
        """Queue one event once the window has room; await the handle's ``wait()``.
        ``event_number``: the caller's number for it (see :meth:`append_many`)."""
        self._check_open()
        await self.appender.wait_for_room(1, len(payload))
        self._check_open()
        handle = PendingAppend()
        self.appender.add(segment, [payload], [handle], event_number)
        return handle

    async def append(
        self, segment: str, payload: bytes, *, event_number: int | None = None
    ) -> Acked:
        """Append one event; return once the server acknowledged it."""
        return await (await self.submit(segment, payload, event_number=event_number)).wait()

    async def append_many(
        self, segment: str, payloads: Sequence[bytes], *, first_event_number: int | None = None
    ) -> Acked | None:
        """Append events in order; return once the server acknowledged the last
        (the :class:`Acked` of the last one; None for no payloads).

        Events are handed over in chunks of as many as the window has room for
        (at least one, at most 1000), each sliced from ``payloads`` once.

        With ``first_event_number`` the events are numbered ``first_event_number``,
        ``+1``, … by the caller instead of the writer: a process that appends the
        same events with the same numbers again (a retried task, with the same
        writer id) has those the server stored already skipped, and acked with
        ``segment_write_offset`` -1, in as many calls as it likes. A number still
        queued or in flight may not be used again (ValueError), and a segment's
        events are numbered by the caller or by the writer, not both."""
        last: PendingAppend | None = None
        appender = self.appender
        total = len(payloads)
        i = 0
        while i < total:
            self._check_open()
            size = len(payloads[i])
            await appender.wait_for_room(1, size)
            self._check_open()
            events, nbytes = appender.room()
            # Slice as many as the room allows if the rest are the size of this one;
            # then keep those that fit (at least one: it had room, or the window is empty).
            n = min(total - i, _BATCH_EVENTS, max(events, 1), max(nbytes // max(size, 1), 1))
            chunk = list(payloads[i : i + n])
            fit = bisect.bisect_right(list(itertools.accumulate(map(len, chunk))), nbytes)
            del chunk[max(fit, 1) :]
            last = PendingAppend()
            first = None if first_event_number is None else first_event_number + i
            appender.add(segment, chunk, [None] * (len(chunk) - 1) + [last], first)
            i += len(chunk)
        return await last.wait() if last is not None else None

    async def flush(self) -> None:
        """Wait until every event appended so far is acknowledged (or refused)."""
        await self.appender.wait_empty()

    # -- internals -------------------------------------------------------------------------
    def _writer_id(self, segment: str) -> UUID:
        if self._fixed_id is None:
            return uuid4()
        if any(lane.writer_id == self._fixed_id for lane in self.appender.lanes.values()):
            raise ValueError(
                f"writer id {self._fixed_id} is in use for another segment; pass a function"
                " of the segment name to write to several"
            )
        return self._fixed_id

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the writer is closed")

    @staticmethod
    def _acked(segment: str, writer_id: UUID, acked: list[tuple[Any, int]], offset: int) -> None:
        for handle, number in acked:
            handle._resolve(Acked(segment, writer_id, number, offset))

    @staticmethod
    def _refused(segment: str, tokens: list[Any], error: SegmentError) -> None:
        for handle in tokens:
            handle._fail(error)

    def _close(self) -> None:
        self._closed = True
        error = trio.ClosedResourceError("the writer closed before the server acknowledged")
        for handle in self.appender.fail_all(error):
            handle._fail(error)

    async def _run(self, stream: trio.abc.Stream | None) -> None:
        """Connect, run a session, and after a loss back off and do it again, for ever."""
        backoff = self.backoff
        while True:
            if stream is None:
                try:
                    stream = await self._connect()
                except (OSError, trio.BrokenResourceError, trio.TooSlowError) as e:
                    self.last_error = describe_error(e)
                    delay = backoff.next_delay()
                    log.warning("cannot connect (%s); retrying in %gs", self.last_error, delay)
                    await trio.sleep(delay)
                    continue
            self.connections += 1
            self.connected.set()
            connected_at = trio.current_time()
            try:
                async with stream:
                    await run_appender(stream, self.appender, self.settings, logger=log)
            except* _CONNECTION_LOST as group:
                self.last_error = describe_error(first_leaf(group))
                log.warning("connection lost: %s; reconnecting", self.last_error)
            stream = None
            if trio.current_time() - connected_at >= backoff.maximum:
                backoff.reset()
            await backoff.sleep()


# -- the reader --------------------------------------------------------------------------------


class SegmentReader:
    """Read segments over one connection; open it with :meth:`connect`.

    One :meth:`read` runs at a time; open more readers to read several
    segments at once.
    """

    def __init__(self, stream: trio.abc.Stream, *, timeout: float = 30.0) -> None:
        self.stream = stream
        #: Seconds a request may wait for its reply (a server holds a read at the
        #: tail for its ``read_wait``, 10 s on a gateway).
        self.timeout = timeout
        self.codec = ClientCodec()
        self._ids = itertools.count(1)
        self._hello_sent = False
        self._busy = False

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        address: str,
        *,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
        timeout: float = 30.0,
    ) -> AsyncIterator[SegmentReader]:
        """Connect to ``address`` (``host:port`` or ``unix:/path``; TLS with ``ssl_context``)."""
        stream = await open_stream(
            address, ssl_context=ssl_context, server_hostname=server_hostname
        )
        async with stream:
            yield cls(stream, timeout=timeout)

    def read(
        self,
        segment: str,
        offset: int = 0,
        *,
        follow: bool = True,
        suggested_length: int = 2**20,
    ) -> SegmentEvents:
        """The events of ``segment`` from byte ``offset`` (an event's start), as
        ``(offset, payload)``; with ``follow`` it waits at the tail for more,
        without it the iteration ends there. Raises :class:`NoSuchSegmentError`,
        :class:`SegmentTruncatedError` (below the retained start), ``trio.TooSlowError``
        when the server does not answer within ``timeout``."""
        return SegmentEvents(self, segment, offset, follow, suggested_length)

    def read_stored(
        self,
        segment: str,
        offset: int = 0,
        *,
        follow: bool = True,
        suggested_length: int = 2**20,
    ) -> StoredEvents:
        """As :meth:`read`, but each event as a :class:`StoredEvent` that also says its
        payload format: 0 raw (a writer's own bytes), 1 envelope (a message the
        hub stored, or an envelope writer's: decode it with
        ``gateway.durable.envelope.decode``)."""
        events = SegmentEvents(self, segment, offset, follow, suggested_length, READ_FORMATS)
        return StoredEvents(events)

    async def info(self, segment: str) -> SegmentInfo:
        """What ``segment`` holds: its retained start, durable end and event indexes
        (``exists`` false, and zeros, for a segment that does not exist)."""
        reply = await self._call(GetStreamSegmentInfo(next(self._ids), segment))
        if not isinstance(reply, StreamSegmentInfo):
            raise refusal(reply)
        return SegmentInfo(
            reply.segment,
            reply.exists,
            reply.is_sealed,
            reply.start_offset,
            reply.write_offset,
            reply.first_event,
            reply.next_event,
            reply.last_modified,
        )

    async def locate(self, segment: str, target: int, events: int | None = None) -> tuple[int, int]:
        """``(offset, event_index)`` of the last event boundary at or before ``target``
        (clamped into the retained, durable bytes), or with ``events`` the boundary
        that many events after it (at most the durable end), from the store's index.
        Raises :class:`NoSuchSegmentError` for a missing segment."""
        n = -1 if events is None else events
        reply = await self._call(LocateOffset(next(self._ids), segment, target, "", n))
        if not isinstance(reply, OffsetLocated):
            raise refusal(reply)
        return reply.offset, reply.event_index

    async def _call(self, request: GetStreamSegmentInfo | LocateOffset) -> Command:
        """Send ``request`` and return its reply (a refusal included)."""
        if self._busy:
            raise trio.BusyResourceError("another request is running on this reader")
        self._busy = True
        try:
            await self._send(request)
            while True:
                event = await self._next_event()
                if isinstance(event, Hello | KeepAlive | SegmentRead):
                    continue  # a SegmentRead answers a read given up earlier
                if getattr(event, "request_id", None) == request.request_id:
                    return cast(Command, event)
                raise RemoteProtocolError(f"unexpected {event!r} answering {request!r}")
        finally:
            self._busy = False

    async def _send(self, command: Command) -> None:
        wire = b"" if self._hello_sent else self.codec.send(Hello())
        self._hello_sent = True
        await self.stream.send_all(wire + self.codec.send(command))

    async def _next_event(self) -> object:
        codec = self.codec
        while (event := codec.next_event()) is NEED_DATA:
            with trio.move_on_after(self.timeout) as timer:
                data = await self.stream.receive_some(RECEIVE_SIZE)
            if timer.cancelled_caught:
                raise trio.TooSlowError(f"no answer from the server for {self.timeout:g}s")
            codec.receive_data(data)
        if isinstance(event, ConnectionClosed):
            raise trio.BrokenResourceError("the server closed the connection")
        return event


class SegmentEvents:
    """An ongoing read: iterate for ``(offset, payload)``; :attr:`position` is where
    the next event starts (read from there to resume)."""

    def __init__(
        self,
        reader: SegmentReader,
        segment: str,
        offset: int,
        follow: bool,
        length: int,
        flags: int = 0,
    ) -> None:
        self.reader = reader
        self.segment = segment
        self.follow = follow
        self.length = length
        self.flags = flags
        self._events = Reassembler(offset)
        self._ready: deque[tuple[int, bytes]] = deque()
        self._request = 0
        self._done = False
        #: ``(offset, format)`` where the payload format changes (with READ_FORMATS),
        #: from the run of the next event not yet returned on.
        self._formats: deque[tuple[int, int]] = deque()

    def format_at(self, offset: int) -> int:
        """The payload format of the event at ``offset``; offsets must not go back."""
        runs = self._formats
        while len(runs) > 1 and runs[1][0] <= offset:
            runs.popleft()
        return runs[0][1] if runs else PayloadFormat.RAW

    @property
    def position(self) -> int:
        """Where the next event not yet returned starts."""
        if self._ready:
            return self._ready[0][0]
        return self._events.position

    @property
    def at_tail(self) -> bool:
        """Whether the last reply reached the segment's (durable) end."""
        return self._events.at_tail

    def __aiter__(self) -> SegmentEvents:
        return self

    async def __anext__(self) -> tuple[int, bytes]:
        while not self._ready:
            if self._done:
                raise StopAsyncIteration
            await self._fetch()
        return self._ready.popleft()

    async def _fetch(self) -> None:
        """One request and the replies up to its answer."""
        reader = self.reader
        if reader._busy:
            raise trio.BusyResourceError("another read is running on this reader")
        reader._busy = True
        try:
            self._request = rid = next(reader._ids)
            offset = self._events.offset
            await reader._send(ReadSegment(self.segment, offset, self.length, "", rid, self.flags))
            while True:
                event = await reader._next_event()
                if isinstance(event, SegmentRead):
                    if event.segment != self.segment:
                        continue  # the reply to a read given up earlier
                    self._take(event)
                    if event.request_id in (rid, -1):
                        if event.at_tail and not self.follow:
                            self._done = True
                        return
                elif isinstance(event, NoSuchSegment | SegmentIsTruncated | ErrorMessage):
                    if event.request_id in (rid, -1):
                        raise refusal(event)
                elif isinstance(event, Hello | KeepAlive):
                    continue
                else:
                    raise RemoteProtocolError(f"unexpected {event!r} on a reader connection")
        finally:
            reader._busy = False

    def _take(self, read: SegmentRead) -> None:
        """Feed a reply, dropping what an earlier one already gave (replies may overlap)."""
        expected = self._events.offset
        if read.offset < expected:
            skip = expected - read.offset
            if skip >= len(read.data):
                return
            read = dataclasses.replace(read, offset=expected, data=read.data[skip:])
        if self.flags & READ_FORMATS and read.data:
            runs = self._formats
            for at, fmt in read.format_runs or [(read.offset, PayloadFormat.RAW)]:
                if not runs or runs[-1][1] != fmt:
                    runs.append((at, fmt))
        self._ready.extend(self._events.feed(read))


class StoredEvents:
    """An ongoing :meth:`SegmentReader.read_stored`: iterate for :class:`StoredEvent`."""

    def __init__(self, events: SegmentEvents) -> None:
        self.events = events

    @property
    def position(self) -> int:
        """Where the next event not yet returned starts."""
        return self.events.position

    @property
    def at_tail(self) -> bool:
        return self.events.at_tail

    def __aiter__(self) -> StoredEvents:
        return self

    async def __anext__(self) -> StoredEvent:
        offset, payload = await self.events.__anext__()
        return StoredEvent(offset, self.events.format_at(offset), payload)
