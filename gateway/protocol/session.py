"""The driver skeleton: one connection run by a sans-IO codec, in either role.

Every protocol's trio layer is a :class:`Session` subclass that says what to
do with each event (:meth:`Session.handle`); the skeleton does the rest once:

* **one reader task**: ``receive_some``, feed the codec, handle *every* event
  the bytes hold, then read again. It stops reading while :attr:`answers` is
  full (backpressure reaches the socket) and while :meth:`handle` waits (the
  hub is full);
* **one writer task**: everything sent goes through one output buffer that a
  single task writes, each write bounded by ``write_timeout`` (one timer task
  per session watches it, not a deadline per write); producers that
  must not outrun the peer (subscription pumps, client windows) wait in
  :meth:`write_when_room` above ``high_water`` bytes;
* **answers when receipts settle**: :meth:`submit` hands work to the hub and
  queues its answer in :attr:`answers`, in order or as each settles, with
  optional keepalive frames while the oldest answer waits;
* **deadlines**: a unit (frame, window, line: whatever the codec holds partly
  received) that has started must finish within ``unit_timeout``, however
  slowly it trickles, not counting time the reader spent held up by our own
  backpressure; a protocol sets its own read deadline (:meth:`set_deadline`)
  for "the peer owes us an answer";
* **the runtime's guard** (:mod:`.guard`, found on the stream): useful progress
  (:meth:`useful` events, answers written, :meth:`progress`) restarts the
  idle timeout, bytes alone do not; what the codec holds partly received
  (``held_bytes``, as allocated) is charged to the gateway's memory budget, a
  peer needing more than the connection's limit is refused with a protocol
  error, and while the budget is exhausted a connection holding more than
  ``memory_floor`` of partial input stops reading (a codec that allocates much
  per read, by inflating, asks :meth:`Session.room` before each large step and
  waits too); a peer that hangs up meanwhile is noticed, and its partial input
  dropped;
* **end of input, shutdown and errors**: when the peer closes, what is owed
  is still answered if it settles within ``linger`` seconds; then whatever is
  left is *abandoned* (its receipts settle as failed; nothing more is
  written). A peer that hangs up while the reader is held up by backpressure
  is noticed without reading (:func:`~.guard.hangup_probe`) and treated the
  same way, so a departed peer never keeps its slot. When ``shutdown`` is set
  the session takes no new work (:meth:`draining`), stops reading unless
  :attr:`read_while_draining`, and returns once nothing is owed; when the peer
  breaks the protocol the protocol's error reply (:meth:`error_reply`) is
  flushed and the error raised, with nothing more answered;
* **subscriptions**: a protocol that delivers to its peer gives the session a
  :class:`~.subscriber.Subscriber` (:attr:`Session.subscriber`); its unsettled
  deliveries are work a drain waits for, its pumps stop when the gateway
  drains or the peer breaks the protocol, and it is closed (unacked
  deliveries back to the hub) when :meth:`run` ends;
* :meth:`pending` says whether work is outstanding, for the idle timeout (the
  session hands it to the runtime's guard: a protocol wires nothing).

Errors leave :meth:`run` (inside an ``ExceptionGroup``): ``RemoteProtocolError``,
``trio.TooSlowError`` for a deadline, the stream's own errors. The caller
decides how to log them and closes the stream.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import trio

from gateway.core.budget import Account
from gateway.core.errors import RemoteProtocolError, first_leaf
from gateway.core.receipts import Receipt
from gateway.protocol.answers import AnswerFn, Answers
from gateway.protocol.events import NEED_DATA, ConnectionClosed
from gateway.protocol.guard import guard_of, hangup_probe
from gateway.transports.nowait import NowaitSender, nowait_sender

if TYPE_CHECKING:
    from gateway.protocol.subscriber import Subscriber

__all__ = ["Codec", "NotKept", "Session"]

_UNTIMED = contextlib.nullcontext()

#: Bytes asked of the stream per read.
RECEIVE_SIZE = 65536
#: Unsent output above which :meth:`Session.write_when_room` waits.
HIGH_WATER = 1024 * 1024
#: Seconds a started unit may take to arrive whole, by default.
UNIT_TIMEOUT = 30.0
#: Seconds after the peer closed its side for what is owed to settle, by default.
LINGER = 10.0
#: Seconds between checks for a peer that hung up while the reader is held up.
HANGUP_CHECK = 1.0


class _OverBudget(RemoteProtocolError):
    """The peer needs more memory for partial input than its connection may hold."""


class NotKept(Exception):
    """Work the peer sent was not kept: close without answering it (the peer resends).

    Raise it from an answer function; :meth:`Session.serve` logs its message.
    """


class Codec(Protocol):
    """What the skeleton needs of a sans-IO codec."""

    def receive_data(self, data: bytes | bytearray | memoryview) -> None: ...

    def next_event(self) -> Any: ...

    @property
    def held_bytes(self) -> int:
        """Bytes of received input held and not yet returned as events, as allocated:
        unparsed bytes, a partly received unit (inflated data and the objects built
        for its parts included). 0 when nothing is partly received.

        A codec may also have an attribute ``room``, set to None: the session then
        sets it to :meth:`Session.room`, which the codec asks before a step that
        allocates much (inflating), waiting while it says 0 or less."""
        ...


class Session:
    """One connection: a reader, a writer, and what is owed to the peer."""

    #: Keep reading after ``shutdown`` is set (the peer still sends acks for our
    #: deliveries); False stops reading at once.
    read_while_draining = False
    #: The connection's subscriber side (:mod:`gateway.protocol.subscriber`), once the
    #: protocol made one (in :meth:`started`): deliveries the peer has not settled
    #: are :meth:`busy`, open subscriptions :meth:`pending`; :meth:`draining` stops
    #: its pumps, a protocol error too, and it is closed when :meth:`run` ends (what
    #: the peer did not ack goes back to the hub).
    subscriber: Subscriber | None = None
    #: Reads may be given a deadline (:meth:`set_deadline`). A protocol that never
    #: sets one, and runs without ``unit_timeout``, says False: its reads then go
    #: without a cancel scope each, which costs more than a read of a few frames.
    timed_reads = True

    def __init__(
        self,
        stream: trio.abc.Stream,
        codec: Codec,
        *,
        log: logging.Logger | logging.LoggerAdapter[Any],
        shutdown: trio.Event | None = None,
        max_answers: int = 1000,
        ordered: bool = True,
        keepalive: float = 0.0,
        unit_timeout: float = UNIT_TIMEOUT,
        write_timeout: float = 30.0,
        linger: float = LINGER,
        high_water: int = HIGH_WATER,
        receive_size: int = RECEIVE_SIZE,
        memory_floor: int | None = None,
    ) -> None:
        self.stream = stream
        self.codec = codec
        self.log = log
        self.shutdown = shutdown
        #: Seconds between keepalives while the oldest ordered answer waits (0: none).
        self.keepalive = keepalive
        #: Seconds a started unit (see :meth:`partial`) may take to arrive (0: no limit).
        self.unit_timeout = unit_timeout
        #: Seconds one write may take (0: no limit).
        self.write_timeout = write_timeout
        #: Seconds, after the peer closed its side, for what is owed to settle.
        self.linger = linger
        #: The runtime's protections for this connection (None: a stream of one's own).
        self.guard = guard_of(stream)
        self.high_water = high_water
        self.receive_size = receive_size
        #: Partial input a connection may always hold, whatever the budget says (so
        #: that small units keep flowing while it is exhausted); one read by default.
        self.memory_floor = receive_size if memory_floor is None else memory_floor
        #: The connection's share of the memory budget (None: not counted).
        self._account = self.guard.account if self.guard is not None else None
        if self._account is not None and getattr(codec, "room", False) is None:
            codec.room = self.room  # type: ignore[attr-defined]
        self.answers = Answers(max_answers, ordered=ordered, wake=self._wake_writer)
        #: The session's nursery, for the protocol's own tasks (pumps, send loops).
        self.nursery: trio.Nursery
        self._out = bytearray()
        self._sending = False
        #: Writes what the socket takes without waiting, while the session runs
        #: (None: its stream cannot, see :mod:`gateway.transports.nowait`).
        self._send_nowait: NowaitSender | None = None
        #: When the write in progress started (None: none is), and its bytes.
        self._send_started: float | None = None
        self._send_size = 0
        #: The writer's scope, cancelled by the write timer (:meth:`_watch_writes`).
        self._writing = trio.CancelScope()
        self._failed = False
        self._writer_idle = trio.lowlevel.ParkingLot()
        self._room = trio.lowlevel.ParkingLot()
        #: Woken whenever something owed may have been paid: answers written, output
        #: flushed, :meth:`progress` called.
        self._progress = trio.lowlevel.ParkingLot()
        self._last_write = trio.current_time()
        self._reading = trio.CancelScope()
        #: Reading was stopped (the reader checks it after each event: cheaper than
        #: asking the cancel scope).
        self._stop_reading = False
        self._read_scope: trio.CancelScope | None = None
        self._deadline = math.inf
        self._deadline_reason = ""
        #: When the unit partly received now started (None: none is).
        self._unit_started: float | None = None
        #: Why the unit watchdog cancelled the read ("" while it has not).
        self._unit_expired = ""
        self._unit_begun = trio.lowlevel.ParkingLot()
        #: The reader is waiting in ``receive_some`` (it sees a close by itself).
        self._in_receive = False
        #: The peer closed its side (end of input, or a hang-up seen without reading).
        self._peer_left = False
        #: The reader waits for room in the memory budget.
        self._awaiting_memory = False

    # -- what a protocol overrides ----------------------------------------------------
    async def handle(self, event: Any) -> None:
        """Act on one event from the codec (not ``NEED_DATA`` or ``ConnectionClosed``)."""
        raise NotImplementedError

    def started(self) -> None:
        """The writer runs: start the protocol's own tasks in :attr:`nursery`."""

    def partial(self) -> bool:
        """Whether a unit (frame, window) is partly received (``unit_timeout`` runs).

        By default: whether the codec holds any received bytes it has not
        returned as events.
        """
        return self.codec.held_bytes > 0

    def useful(self, event: Any) -> bool:
        """Whether handling ``event`` is useful progress for the idle timeout.

        True by default; a protocol says False for liveness probes (pings),
        which must not keep an otherwise idle connection open.
        """
        return True

    def received(self) -> None:
        """Every event of one read was handled (a place for per-read bookkeeping)."""

    def end_of_input(self) -> None:
        """The peer closed its side; raise if that is an error in this role."""

    def draining(self) -> None:
        """``shutdown`` was set: take no new work from now on (by default: no new
        deliveries from :attr:`subscriber`)."""
        if self.subscriber is not None:
            self.subscriber.drain()

    def busy(self) -> bool:
        """Work outside :attr:`answers` that a drain waits for (by default: deliveries
        of :attr:`subscriber` not settled)."""
        return self.subscriber is not None and self.subscriber.busy()

    def ended_by(self, error: RemoteProtocolError | NotKept | trio.TooSlowError) -> None:
        """:meth:`serve` is about to log what the peer's side ended the connection with."""

    def error_reply(self, error: RemoteProtocolError) -> bytes | None:
        """The protocol's error frame for ``error``, sent before closing (None: none)."""
        return None

    def finished(self) -> None:
        """:meth:`run` is ending, however it ends (nothing by default).

        The session and its codec often sit in a reference cycle with the
        error that ended them (its traceback's frames) until the garbage
        collector's next full pass: a protocol whose codec may hold much (a
        half-received window) drops it here, so that it is freed at once.
        """

    # -- what a protocol calls ------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data`` for the writer (never waits: for answers and small frames)."""
        self._out += data
        self._wake_writer()

    def write_now(self, data: bytes | bytearray) -> None:
        """Like :meth:`write`, but hand ``data`` to the socket at once when nothing is
        queued before it: what the socket takes without waiting is written here,
        only the rest goes to the writer task.

        For a producer at the end of a batch (a proxy relaying a read's frames to
        another connection): waking the writer costs more than the write. Never
        waits, so a peer that does not read holds up no one but itself (its bytes
        queue as with :meth:`write`). Not for many small writes in a row: each one
        is a system call.
        """
        send = self._send_nowait
        if send is None or self._out or self._sending or self._failed:
            self.write(data)
            return
        try:
            sent = send(data)
        except OSError:
            sent = 0  # the writer meets the error and ends the session as usual
        if sent:
            self._last_write = trio.current_time()
        if sent < len(data):
            self.write(memoryview(data)[sent:])

    async def write_when_room(self, data: bytes | bytearray) -> None:
        """Queue ``data`` once unsent output is under ``high_water`` (for producers)."""
        await self.wait_for_room()
        self.write(data)

    @property
    def unsent(self) -> int:
        """Bytes queued and not yet handed to the stream (the peer's backlog)."""
        return len(self._out)

    @property
    def has_room(self) -> bool:
        """Whether unsent output is within ``high_water`` (:meth:`wait_for_room` would not
        wait)."""
        return len(self._out) <= self.high_water

    async def wait_for_room(self) -> None:
        """Wait until unsent output is under ``high_water``.

        For a producer whose bytes depend on when they are made (a stream id
        handed out in order): wait, then make them and :meth:`write` at once.
        """
        while not self.has_room:
            await self._room.park()

    async def submit(
        self,
        send: Callable[[], Awaitable[Receipt]],
        answer: AnswerFn,
        keepalive: Callable[[], bytes] | None = None,
    ) -> None:
        """Hand work off with ``send()`` and answer it with ``answer(receipt)`` once settled.

        Waits while :attr:`answers` is full. The answer is owed from before the
        hand-off, so keepalives flow while ``send`` waits for room in the hub.
        """
        answers = self.answers
        while answers.full:
            await self._progress.park()
        entry = answers.open(answer, keepalive)
        if len(answers) == 1 and keepalive is not None and self.keepalive:
            # Keepalives are due ``keepalive`` after the oldest answer started waiting.
            self._last_write = trio.current_time()
            self._wake_writer()
        try:
            receipt = await send()
        except BaseException:
            answers.cancel(entry)
            raise
        answers.attach(entry, receipt)
        if answers.has_ready and not (self._out or self._sending or self._failed):
            # Settled at once (stored in memory): answer now, as write_now does, rather
            # than wake the writer task for it. An answer that raises ends the session
            # here, once what it and those before it queued is written.
            try:
                self._take_answers()
            except Exception:
                with trio.move_on_after(self.write_timeout or math.inf):
                    await self.flush()
                raise
            data, self._out = self._out, bytearray()
            self.write_now(data)

    def progress(self) -> None:
        """Something :meth:`busy` counts was paid (a delivery acked): re-check drains.

        It is useful progress for the idle timeout, too.
        """
        if self.guard is not None:
            self.guard.progress()
        if self._progress:
            self._progress.unpark_all()

    def set_deadline(self, deadline: float, reason: str) -> None:
        """Fail reading with ``trio.TooSlowError(reason)`` if no data arrives by ``deadline``."""
        if not self.timed_reads and deadline != math.inf:
            raise RuntimeError(f"{type(self).__name__} reads without deadlines (timed_reads)")
        self._deadline = deadline
        self._deadline_reason = reason
        if self._read_scope is not None:
            self._read_scope.deadline = deadline

    def clear_deadline(self) -> None:
        self.set_deadline(math.inf, "")

    def room(self) -> int:
        """Bytes of partial input the codec may still take on before it must wait for
        memory (``sys.maxsize``: no budget, or this connection is its only holder).

        Charges what the codec holds now first; past the connection's own limit
        it raises the protocol error the reader would (the peer is closed,
        reason ``memory``). A codec asks it before each large allocation; 0 or
        less means: keep the input as it is and return ``NEED_DATA``, the
        reader waits for room and asks the codec again before reading on.
        """
        account = self._account
        if account is None:
            return sys.maxsize
        self._charge(account)
        return account.room(self.memory_floor)

    def _charge(self, account: Account) -> None:
        held = self.codec.held_bytes
        if held > account.limit:
            raise _OverBudget(
                f"{held} bytes of partly received input exceed the connection's"
                f" memory limit of {account.limit} bytes"
            )
        account.hold(held)

    def stop(self) -> None:
        """Stop reading; :meth:`run` returns once every answer owed is written."""
        self._stop_reading = True
        self._reading.cancel()

    def pending(self) -> bool:
        """Whether anything is owed or unsent, or a subscription is open (the idle
        timeout keeps the connection)."""
        if len(self.answers) or self._out or self._sending or self.busy():
            return True
        return self.subscriber is not None and self.subscriber.pending()

    async def flush(self) -> None:
        """Wait until everything queued so far is written."""
        while self._out or self._sending:
            await self._progress.park()

    # -- the skeleton ------------------------------------------------------------------------
    async def serve(self) -> None:
        """:meth:`run` for a server role: what the peer's side ends it with is logged.

        A protocol error, a work item that was not kept, or a deadline missed
        (a unit too slow, a write the peer did not read) is the peer's doing:
        a warning naming it, after :meth:`ended_by` saw it. Anything else
        propagates (the runtime logs it as a fault of ours).
        """
        try:
            await self.run()
        except* RemoteProtocolError as eg:
            self._log_end(eg, "protocol error: %s; closing")
        except* NotKept as eg:
            self._log_end(eg, "%s")
        except* trio.TooSlowError as eg:
            self._log_end(eg, "%s; closing")

    def _log_end(self, group: BaseExceptionGroup[Any], message: str) -> None:
        error = first_leaf(group)
        assert isinstance(error, RemoteProtocolError | NotKept | trio.TooSlowError)
        self.ended_by(error)
        if self.guard is None:
            self.log.warning(message, error)
            return
        reason = (
            "memory"
            if isinstance(error, _OverBudget)
            else "protocol_error"
            if isinstance(error, RemoteProtocolError)
            else "not_kept"
            if isinstance(error, NotKept)
            else "timeout"
        )
        self.guard.refused(reason)
        if not self.guard.warn(reason, message, error):
            self.log.warning(message, error)

    async def run(self) -> None:
        """Serve the connection until the input ends and what is owed is answered."""
        guard = self.guard
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                if guard is not None:
                    guard.pending = self.pending
                    guard.progress()
                nursery.start_soon(self._write_loop)
                self._send_nowait = nowait_sender(self.stream)
                if self.write_timeout:
                    nursery.start_soon(self._watch_writes)
                if self.shutdown is not None:
                    nursery.start_soon(self._watch_shutdown)
                if self.unit_timeout:
                    nursery.start_soon(self._watch_units)
                probe = hangup_probe(self.stream) if guard is not None else None
                if probe is not None:
                    nursery.start_soon(self._watch_hangup, probe)
                self.started()
                with self._reading:
                    try:
                        await self._read_loop()
                    except RemoteProtocolError as e:
                        try:
                            await self._fail(e)
                        except trio.Cancelled:
                            # stop() or a drain ended reading while the error reply was
                            # flushed: the error must still leave (nothing owed is answered).
                            pass
                        raise
                if self._peer_left:
                    await self._linger()
                else:
                    await self._until(self._answered)
                nursery.cancel_scope.cancel()
        finally:
            self._send_nowait = None
            if self.subscriber is not None:
                self.subscriber.close()  # what the peer did not ack goes back to the hub
            self.finished()
            if guard is not None and guard.account is not None:
                guard.account.hold(0)

    async def _read_loop(self) -> None:
        codec = self.codec
        stream = self.stream
        handle = self.handle
        useful = self.useful
        answers = self.answers
        guard = self.guard
        account = self._account
        floor = self.memory_floor
        # A cancel scope per read costs more than the read of a few small frames: only
        # a session whose reads can time out has one.
        timed = self.timed_reads or bool(self.unit_timeout)
        scope: trio.CancelScope | None = None
        data: bytes | bytearray | None
        while True:
            if answers.full:
                await self._pause()
            if timed:
                scope = self._read_scope = trio.CancelScope(deadline=self._deadline)
                if self._unit_expired:
                    # The unit timer fired just as the last read completed: that read won,
                    # and the unit is still partial, so this one loses at once.
                    scope.cancel()
            with scope or _UNTIMED:
                if account is not None and account.must_wait(floor):
                    # Large partial input waits for room; its unit deadline still runs,
                    # so connections that cannot finish in time free what they hold.
                    # A little (a cut ack line) never waits: acks are what free memory.
                    self._awaiting_memory = True
                    try:
                        await account.wait_for_room(floor)
                    finally:
                        self._awaiting_memory = False
                        if self._progress:
                            self._progress.unpark_all()
                    # The codec may have stopped for room with input in hand: it goes
                    # on with that before anything more is read.
                    data = None
                else:
                    self._in_receive = True
                    try:
                        data = await stream.receive_some(self.receive_size)
                    finally:
                        self._in_receive = False
            self._read_scope = None
            if scope is not None and scope.cancelled_caught:
                raise trio.TooSlowError(self._unit_expired or self._deadline_reason)
            if data is not None:
                codec.receive_data(data)
            progressed = False
            while True:
                event = codec.next_event()
                if event is NEED_DATA:
                    break
                if isinstance(event, ConnectionClosed):
                    self._end_of_input()
                    return
                self._unit_started = None  # a unit arrived whole: its clock stops
                self._unit_expired = ""
                await handle(event)
                if self._stop_reading:  # stop() from handle: later events are not taken
                    return
                if not progressed and useful(event):
                    progressed = True
            if data is not None and not data:  # a codec that says nothing more after the end
                self._end_of_input()
                return
            if account is not None:
                self._charge(account)
            if progressed and guard is not None:
                guard.progress()
            self.received()
            if self.unit_timeout:
                self._unit_check()

    def _end_of_input(self) -> None:
        self.end_of_input()  # raises where the peer's close is an error in this role
        self._peer_left = True

    async def _linger(self) -> None:
        """The peer closed its side: what is owed has ``linger`` seconds to settle."""
        with trio.move_on_after(self.linger):
            await self._until(self._answered)
        if not self._answered():
            self._abandon(f"its sender closed the connection; not settled within {self.linger:g}s")

    def _abandon(self, reason: str) -> None:
        """Settle what is owed as failed and stop: nothing can reach the peer any more."""
        self._failed = True
        owed = self.answers.abandon(reason)
        if owed:
            self.log.info("peer gone with %d answers owed; settled them as failed", owed)
            if self.guard is not None:
                self.guard.abandoned(owed)
        self.nursery.cancel_scope.cancel()

    async def _watch_hangup(self, hung_up: Callable[[], bool]) -> None:
        """Notice a peer that hung up while the reader is held up by backpressure (work
        pending, or partial input waiting for memory)."""
        while True:
            await trio.sleep(HANGUP_CHECK)
            if self._peer_left:
                return
            if not self._in_receive and (self._awaiting_memory or self.pending()) and hung_up():
                break
        self._peer_left = True
        self.log.info("the peer hung up while work is pending or input waits for memory")
        await self._linger()
        if self._awaiting_memory:
            # Its partial unit could only be finished, once there is room, by what it sent
            # before leaving; under memory pressure, what it holds is freed now instead
            # (nothing of it was answered: its sender resends it).
            self.log.info(
                "the peer hung up with %d bytes of partial input waiting for memory; dropped",
                self.codec.held_bytes,
            )
            self._abandon("its sender hung up")
            return
        # Everything owed was answered in time: the reader goes on to the end of input.

    def _unit_check(self) -> None:
        """After a read: is a unit partly received, and since when?"""
        if not self.partial():
            self._unit_started = None
            self._unit_expired = ""
        elif self._unit_started is None:  # a unit started in this read
            self._unit_started = trio.current_time()
            if self._unit_begun:
                self._unit_begun.unpark_all()

    async def _watch_units(self) -> None:
        """A unit must be whole ``unit_timeout`` after it started, however it trickles.

        One timer task per session instead of a deadline per read: in steady
        traffic most reads end inside a unit, and re-arming trio's deadline
        on each would cost more than the read. Time the reader spent held up
        by our own backpressure moves the unit's start on (:meth:`_pause`).
        """
        timeout = self.unit_timeout
        while True:
            started = self._unit_started
            if started is None:
                await self._unit_begun.park()
                continue
            now = trio.current_time()
            if now < started + timeout:
                await trio.sleep_until(started + timeout)
                continue
            scope = self._read_scope
            if scope is None:  # held up by our own backpressure: its end moves the start
                await trio.sleep(min(1.0, timeout))
                continue
            self._unit_expired = f"a unit that started arriving did not finish within {timeout:g}s"
            scope.cancel()
            # Usually the read is cancelled and the session ends. But a read that had
            # already completed goes on: if it finished the unit, the next one is timed
            # from its start; if not, the reader's next read is cancelled at once.
            await self._unit_begun.park()

    async def _pause(self) -> None:
        """Wait for room among the answers; the pause does not count against the peer."""
        paused = trio.current_time()
        while self.answers.full:
            await self._progress.park()
        if self._unit_started is not None:
            self._unit_started += trio.current_time() - paused

    async def _fail(self, error: RemoteProtocolError) -> None:
        """Nothing more is answered or delivered; the error reply (if any) goes out, then
        we close."""
        self._failed = True
        if self.subscriber is not None:
            self.subscriber.drain()
        reply = self.error_reply(error)
        if reply:
            self.write(reply)
            with trio.move_on_after(self.write_timeout):
                await self.flush()

    async def _watch_shutdown(self) -> None:
        assert self.shutdown is not None
        await self.shutdown.wait()
        self.draining()
        if not self.read_while_draining:
            self.stop()
            return
        await self._until(self._drained)
        self.nursery.cancel_scope.cancel()

    def _answered(self) -> bool:
        return not (len(self.answers) or self._out or self._sending)

    def _drained(self) -> bool:
        return self._answered() and not self.busy()

    async def _until(self, done: Callable[[], bool]) -> None:
        while not done():
            await self._progress.park()

    def _wake_writer(self) -> None:
        if self._writer_idle:
            self._writer_idle.unpark_all()

    async def _write_loop(self) -> None:
        """Write what is queued; a write still going ``write_timeout`` after it started
        (see :meth:`_watch_writes`) fails the session with ``trio.TooSlowError``."""
        with self._writing:
            await self._write_queued()
        if self._writing.cancelled_caught and not self._failed:
            # (After a protocol error the peer does not read our error reply: what
            # run() raises is that error, not this timeout.)
            raise trio.TooSlowError(
                f"the peer did not read {self._send_size} bytes within {self.write_timeout:g}s"
            )

    async def _write_queued(self) -> None:
        answers = self.answers
        stream = self.stream
        while True:
            if answers.has_ready and not self._failed:
                try:
                    self._take_answers()
                except Exception:
                    # The answers before the one that raised were owed: write them, then close.
                    if self._out:
                        with (
                            trio.move_on_after(self.write_timeout or math.inf),
                            contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
                        ):
                            await stream.send_all(self._out)
                    raise
            if not self._out:
                if self._progress:
                    self._progress.unpark_all()
                await self._idle()
                continue
            data, self._out = self._out, bytearray()
            if self._room:
                self._room.unpark_all()
            self._sending = True
            self._send_size = len(data)
            self._send_started = trio.current_time()
            try:
                await stream.send_all(data)
            finally:
                self._sending = False
                self._send_started = None
            self._last_write = trio.current_time()

    def _take_answers(self) -> None:
        """Queue the bytes of every answer that may be written now. An answer that raises
        leaves those before it (and what it wrote itself) queued, in order."""
        out = self._out
        for answer, receipt in self.answers.ready():
            frame = answer(receipt)
            if frame:
                out += frame
        if self.guard is not None:
            self.guard.progress()
        if self._progress:
            self._progress.unpark_all()

    async def _watch_writes(self) -> None:
        """A write must be done ``write_timeout`` after it started.

        One timer per session instead of a deadline per write: trio's cancel
        scope with a deadline costs more than writing a few small frames. The
        timer wakes at least every ``write_timeout`` and then sleeps until the
        deadline of the write in progress, so a write that started while it
        slept is still caught on time.
        """
        timeout = self.write_timeout
        while True:
            started = self._send_started
            if started is None:
                await trio.sleep(timeout)
                continue
            if trio.current_time() < started + timeout:
                await trio.sleep_until(started + timeout)
                continue  # the same write, or a later one: checked again
            self._writing.cancel()
            return

    async def _idle(self) -> None:
        """Wait for output or a settled answer; send a keepalive when one is due."""
        waiting = self.answers.waiting if self.keepalive else None
        if waiting is None or waiting.keepalive is None:
            await self._writer_idle.park()
            return
        with trio.move_on_at(self._last_write + self.keepalive) as scope:
            await self._writer_idle.park()
        if scope.cancelled_caught and self.answers.waiting is waiting:
            self._out += waiting.keepalive()
