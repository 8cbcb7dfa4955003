"""The protocol toolkit (:mod:`gateway.protocol`), through its public interfaces.

* :class:`ReceiveBuffer`: offsets, compaction, ``find`` with its search mark
  (and a hypothesis test: any chunking of a byte string yields the lines of
  ``split``), ``take``, end of input, ``discard``;
* :class:`Answers`: ordered and unordered answers, the limit, ``cancel``,
  ``waiting``;
* :class:`Session`, driven over an in-memory stream pair by a toy line
  protocol defined here, on trio's mock clock: ``pub <x>`` is answered
  ``ok <x>`` once a receipt the test holds settles, ``bad`` breaks the protocol
  (error reply ``err``), ``ask`` sets a read deadline, ``clear`` clears it,
  ``ack`` pays one unacked delivery (for drains), ``quit`` stops the session.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.model import Outcome
from gateway.core.receipts import Receipt
from gateway.protocol.answers import Answers
from gateway.sdk import (
    NEED_DATA,
    ConnectionClosed,
    LocalProtocolError,
    NotKept,
    ReceiveBuffer,
    RemoteProtocolError,
    Session,
)

# -- helpers --------------------------------------------------------------------------


def unsettled() -> Receipt:
    """A receipt with one leg that the test settles with :func:`settle`."""
    receipt = Receipt(1)
    receipt.add_legs(1)
    receipt.seal()
    return receipt


def settle(receipt: Receipt, outcome: Outcome = Outcome.DELIVERED) -> None:
    receipt.settle(0, outcome, "" if outcome == Outcome.DELIVERED else "refused")
    assert receipt.done()


# -- ReceiveBuffer --------------------------------------------------------------------


def lines_of(buf: ReceiveBuffer, sep: bytes) -> list[bytes]:
    """Every whole line buffered, consumed; checks that a miss is a true miss."""
    out = []
    while (i := buf.find(sep)) >= 0:
        assert bytes(buf.data[i : i + len(sep)]) == sep
        out.append(bytes(buf.data[buf.pos : i]))
        buf.advance(i + len(sep))
    assert sep not in buf.data[buf.pos :], "find said -1 with a separator buffered"
    assert buf.searched <= len(buf.data)
    return out


def test_feed_len_and_advance() -> None:
    buf = ReceiveBuffer()
    assert len(buf) == 0
    buf.feed(b"hello ")
    buf.feed(memoryview(b"world"))
    assert len(buf) == 11
    buf.advance(buf.pos + 2)
    assert (len(buf), bytes(buf.data[buf.pos :])) == (9, b"llo world")


def test_compaction_keeps_what_is_unparsed() -> None:
    buf = ReceiveBuffer()
    buf.feed(b"0123456789")
    buf.advance(5)  # not more than half: nothing moves
    assert (buf.pos, bytes(buf.data)) == (5, b"0123456789")
    buf.advance(6)  # more than half: the parsed bytes are dropped
    assert (buf.pos, bytes(buf.data), len(buf)) == (0, b"6789", 4)
    buf.feed(b"ab")
    assert bytes(buf.data[buf.pos :]) == b"6789ab"
    buf.advance(buf.pos + len(buf))  # everything parsed
    assert (len(buf), bytes(buf.data[buf.pos :])) == (0, b"")


def test_find_a_separator_split_across_feeds() -> None:
    buf = ReceiveBuffer()
    buf.feed(b"abc\r")
    assert buf.find(b"\r\n") == -1
    buf.feed(b"\ndef\r")
    assert buf.find(b"\r\n") == 3
    buf.advance(5)
    assert buf.find(b"\r\n") == -1
    buf.feed(b"\n")
    assert buf.find(b"\r\n") == buf.pos + 3
    assert bytes(buf.data[buf.pos : buf.find(b"\r\n")]) == b"def"


def test_find_after_compaction_moves_its_mark() -> None:
    buf = ReceiveBuffer()
    buf.feed(b"first line\nsecond li")
    first = buf.find(b"\n")
    buf.advance(first + 1)  # 11 of 20: compacts
    assert buf.pos == 0
    assert buf.find(b"\n") == -1
    assert buf.searched == len(buf.data)
    buf.feed(b"ne\nthird")
    assert bytes(buf.data[: buf.find(b"\n")]) == b"second line"


class _CountingBytes(bytearray):
    """A ``bytearray`` that counts the bytes ``find`` scans."""

    scanned = 0

    def find(self, sub: Any, start: Any = None, end: Any = None) -> int:
        self.scanned += len(self) - (start or 0)
        return super().find(sub, start, end)


def test_find_scans_a_long_unit_arriving_in_pieces_once() -> None:
    buf = ReceiveBuffer()
    spy = buf.data = _CountingBytes()
    n = 2000
    for _ in range(n):
        buf.feed(b"x")
        assert buf.find(b"\r\n") == -1
    buf.feed(b"\r\n")
    assert buf.find(b"\r\n") == n
    # Each byte is looked at about once (plus the separator's overlap), not n/2 times.
    assert spy.scanned <= 3 * n


def test_take() -> None:
    buf = ReceiveBuffer()
    buf.feed(b"abcdef")
    assert buf.take(2) == b"ab"
    assert buf.take(10) == b"cdef"
    assert (len(buf), buf.take(1)) == (0, b"")
    buf.feed(b"gh")
    assert buf.take(2) == b"gh"


def test_end_of_input_then_data_is_a_local_error() -> None:
    buf = ReceiveBuffer()
    buf.feed(b"tail")
    assert not buf.eof
    buf.feed(b"")
    assert buf.eof
    with pytest.raises(LocalProtocolError):
        buf.feed(b"more")
    assert bytes(buf.data[buf.pos :]) == b"tail"
    buf.feed(b"")  # end of input twice is harmless
    assert buf.eof


def test_discard_drops_buffered_and_later_data() -> None:
    buf = ReceiveBuffer()
    buf.feed(b"line\npartial")
    buf.advance(buf.find(b"\n") + 1)
    buf.discard()
    assert (len(buf), buf.discarding) == (0, True)
    buf.feed(b"more\n")
    assert (len(buf), bytes(buf.data), buf.find(b"\n")) == (0, b"", -1)
    buf.feed(b"")
    assert buf.eof


@given(
    words=st.lists(st.binary(max_size=12), max_size=12),
    tail=st.binary(max_size=6),
    sep=st.sampled_from([b"\n", b"\r\n", b"\r\n\r\n"]),
    cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=20),
)
def test_any_chunking_gives_the_lines_of_split(
    words: list[bytes], tail: bytes, sep: bytes, cuts: list[int]
) -> None:
    # Pieces must not hold the separator themselves (nor end/start in a part of it
    # that would make one across a boundary): strip its bytes from them.
    words = [w.replace(sep[:1], b"") for w in words]
    tail = tail.replace(sep[:1], b"")
    stream = b"".join(w + sep for w in words) + tail
    buf = ReceiveBuffer()
    got: list[bytes] = []
    start = 0
    for cut in [*sorted({min(c, len(stream)) for c in cuts}), len(stream)]:
        if cut > start:  # b"" would be the end of input
            buf.feed(stream[start:cut])
            start = cut
        got += lines_of(buf, sep)
    assert got == stream.split(sep)[:-1] == words
    assert bytes(buf.data[buf.pos :]) == tail


# -- Answers --------------------------------------------------------------------------


class Wakes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def answer_fn(name: str) -> Callable[[Receipt], bytes]:
    return lambda receipt: name.encode()


def produced(answers: Answers) -> list[bytes]:
    return [fn(receipt) or b"" for fn, receipt in answers.ready()]


def test_ordered_answers_come_out_in_arrival_order() -> None:
    wakes = Wakes()
    answers = Answers(10, ordered=True, wake=wakes)
    receipts = [unsettled() for _ in range(3)]
    for i, receipt in enumerate(receipts):
        answers.attach(answers.open(answer_fn(f"a{i}")), receipt)
    assert len(answers) == 3
    settle(receipts[2])
    settle(receipts[1])
    assert wakes.count == 2
    assert (answers.has_ready, produced(answers), len(answers)) == (False, [], 3)
    settle(receipts[0])
    assert answers.has_ready
    assert produced(answers) == [b"a0", b"a1", b"a2"]
    assert (len(answers), answers.has_ready) == (0, False)


def test_unordered_answers_come_out_in_settling_order() -> None:
    wakes = Wakes()
    answers = Answers(10, ordered=False, wake=wakes)
    receipts = [unsettled() for _ in range(3)]
    for i, receipt in enumerate(receipts):
        answers.attach(answers.open(answer_fn(f"a{i}")), receipt)
    assert not answers.has_ready
    settle(receipts[2])
    settle(receipts[0])
    assert (wakes.count, len(answers)) == (2, 3)
    assert produced(answers) == [b"a2", b"a0"]
    assert len(answers) == 1
    settle(receipts[1], Outcome.FAILED)
    [(fn, receipt)] = answers.ready()
    assert (fn(receipt), receipt.outcome, len(answers)) == (b"a1", Outcome.FAILED, 0)


@pytest.mark.parametrize("ordered", [True, False])
def test_an_already_settled_receipt_is_ready_at_once(ordered: bool) -> None:
    wakes = Wakes()
    answers = Answers(10, ordered=ordered, wake=wakes)
    answers.attach(answers.open(answer_fn("x")), Receipt.settled(Outcome.DELIVERED))
    assert (wakes.count, answers.has_ready, produced(answers)) == (1, True, [b"x"])


@pytest.mark.parametrize("ordered", [True, False])
def test_the_limit(ordered: bool) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Answers(0, ordered=ordered, wake=Wakes())
    answers = Answers(2, ordered=ordered, wake=Wakes())
    first = unsettled()
    answers.attach(answers.open(answer_fn("a")), first)
    assert not answers.full
    answers.open(answer_fn("b"))  # owed from before the hand-off
    assert answers.full
    settle(first)
    assert answers.full, "an answer settled but not yet taken is still owed"
    assert produced(answers) == [b"a"]
    assert not answers.full


@pytest.mark.parametrize("ordered", [True, False])
def test_cancel(ordered: bool) -> None:
    wakes = Wakes()
    answers = Answers(2, ordered=ordered, wake=wakes)
    head = answers.open(answer_fn("head"))
    second = unsettled()
    answers.attach(answers.open(answer_fn("second")), second)
    settle(second)
    assert answers.full
    woken = wakes.count
    answers.cancel(head)
    assert wakes.count == woken + 1
    assert (len(answers), answers.full, answers.has_ready) == (1, False, True)
    assert produced(answers) == [b"second"]
    assert len(answers) == 0


def test_waiting_is_the_unsettled_ordered_head() -> None:
    answers = Answers(10, ordered=True, wake=Wakes())
    assert answers.waiting is None
    head = answers.open(answer_fn("a"), lambda: b"keepalive")
    assert answers.waiting is head, "owed before the hand-off"
    r1 = unsettled()
    answers.attach(head, r1)
    r2 = unsettled()
    second = answers.open(answer_fn("b"))
    answers.attach(second, r2)
    assert answers.waiting is head
    settle(r2)
    assert answers.waiting is head
    settle(r1)
    assert answers.waiting is None, "a settled head waits for the writer, not the peer"
    assert produced(answers) == [b"a", b"b"]
    assert answers.waiting is None

    unordered = Answers(10, ordered=False, wake=Wakes())
    unordered.open(answer_fn("a"), lambda: b"keepalive")
    assert unordered.waiting is None


# -- Session: a toy line protocol -----------------------------------------------------


class LineCodec:
    """Lines ending in ``\\n``; ``bad`` breaks the protocol."""

    def __init__(self) -> None:
        self.buf = ReceiveBuffer()
        #: Every byte the session fed us, to see what it read.
        self.received = bytearray()

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        self.received += data
        self.buf.feed(data)

    @property
    def held_bytes(self) -> int:
        return len(self.buf)

    def next_event(self) -> Any:
        buf = self.buf
        i = buf.find(b"\n")
        if i < 0:
            if buf.eof:
                return ConnectionClosed()
            return NEED_DATA
        line = bytes(buf.data[buf.pos : i])
        buf.advance(i + 1)
        if line == b"bad":
            raise RemoteProtocolError("a bad line")
        return line


class Toy(Session):
    """``pub <x>`` is answered ``ok <x>`` (``no <x>`` unless delivered) once its receipt settles."""

    def __init__(self, stream: trio.abc.Stream, **kwargs: Any) -> None:
        self.lines = LineCodec()
        super().__init__(stream, self.lines, log=logging.getLogger("test.toy"), **kwargs)
        #: The receipt of each ``pub``, by its argument, for the test to settle.
        self.receipts: dict[bytes, Receipt] = {}
        #: Receipts settle as soon as they are made.
        self.settle_at_once = False
        self.events: list[bytes] = []
        #: Deliveries the peer has not acked (``busy``).
        self.unacked = 0
        self.drained_at: float | None = None
        self.ended_input = False
        #: What :meth:`ended_by` saw (``serve`` only).
        self.ends: list[BaseException] = []

    async def handle(self, event: Any) -> None:
        self.events.append(event)
        if event.startswith(b"pub "):
            arg = event[4:]

            async def send() -> Receipt:
                at_once = self.settle_at_once
                receipt = Receipt.settled(Outcome.DELIVERED) if at_once else unsettled()
                self.receipts[arg] = receipt
                return receipt

            def answer(receipt: Receipt) -> bytes:
                if arg == b"boom":
                    raise ValueError("the answer function broke")
                if arg == b"lost":
                    raise NotKept("pub lost was not kept; closing without an answer")
                word = b"ok" if receipt.outcome == Outcome.DELIVERED else b"no"
                return word + b" " + arg + b"\n"

            await self.submit(send, answer, lambda: b"ka\n")
        elif event == b"ask":
            self.set_deadline(trio.current_time() + 7, "no reply to ask")
        elif event == b"clear":
            self.clear_deadline()
        elif event == b"ack":
            self.unacked -= 1
            self.progress()
        elif event == b"quit":
            self.stop()

    def partial(self) -> bool:
        return len(self.lines.buf) > 0

    def end_of_input(self) -> None:
        self.ended_input = True

    def ended_by(self, error: Exception) -> None:
        self.ends.append(error)

    def draining(self) -> None:
        self.drained_at = trio.current_time()

    def busy(self) -> bool:
        return self.unacked > 0

    def error_reply(self, error: RemoteProtocolError) -> bytes | None:
        return b"err\n"


@dataclass
class Run:
    """A session running against a peer that records what it receives."""

    session: Toy
    peer: trio.abc.HalfCloseableStream
    #: What the peer received, and when each piece arrived.
    got: bytearray = field(default_factory=bytearray)
    arrivals: list[tuple[float, bytes]] = field(default_factory=list)
    error: BaseException | None = None
    ended_at: float | None = None
    done: trio.Event = field(default_factory=trio.Event)

    async def send(self, data: bytes, *, at: float | None = None) -> None:
        if at is not None:
            await trio.sleep_until(at)
        await self.peer.send_all(data)

    async def close(self, *, at: float | None = None) -> None:
        if at is not None:
            await trio.sleep_until(at)
        await self.peer.send_eof()

    def settle(self, arg: bytes, outcome: Outcome = Outcome.DELIVERED) -> None:
        settle(self.session.receipts[arg], outcome)

    async def wait(self, timeout: float = 1000) -> None:
        with trio.fail_after(timeout):
            await self.done.wait()

    def raised(self, *expected: Any) -> None:
        """``run()`` raised an ExceptionGroup of ``expected``."""
        assert self.error is not None, "run() returned"
        with pytest.RaisesGroup(*expected):
            raise self.error


@asynccontextmanager
async def running(
    session_factory: Callable[[trio.abc.Stream], Toy],
    *,
    lockstep: bool = False,
    peer_reads: bool = True,
) -> AsyncIterator[Run]:
    ours, theirs = (
        trio.testing.lockstep_stream_pair() if lockstep else trio.testing.memory_stream_pair()
    )
    run = Run(session_factory(ours), theirs)

    async def serve() -> None:
        try:
            await run.session.run()
        except BaseExceptionGroup as e:
            if e.split(trio.Cancelled)[1] is None:
                raise  # the test is over
            run.error = e
        run.ended_at = trio.current_time()
        run.done.set()

    async def read() -> None:
        while data := await theirs.receive_some():
            run.got += data
            run.arrivals.append((trio.current_time(), bytes(data)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        if peer_reads:
            nursery.start_soon(read)
        yield run
        nursery.cancel_scope.cancel()


def toy(**kwargs: Any) -> Callable[[trio.abc.Stream], Toy]:
    return lambda stream: Toy(stream, **kwargs)


MockClock = trio.testing.MockClock


# -- Session: answers -----------------------------------------------------------------


async def test_ordered_answers_wait_for_the_head(autojump_clock: MockClock) -> None:
    async with running(toy()) as run:
        await run.send(b"pub 1\npub 2\npub 3\n")
        await trio.sleep(1)
        run.settle(b"3")
        run.settle(b"2", Outcome.FAILED)
        await trio.sleep(1)
        assert (run.got, len(run.session.answers)) == (b"", 3)
        run.settle(b"1")
        await trio.sleep(1)
        assert run.got == b"ok 1\nno 2\nok 3\n"
        assert len(run.session.answers) == 0


async def test_unordered_answers_go_out_as_they_settle(autojump_clock: MockClock) -> None:
    async with running(toy(ordered=False)) as run:
        await run.send(b"pub 1\npub 2\npub 3\n")
        await trio.sleep(1)
        for arg in (b"3", b"1", b"2"):
            run.settle(arg)
            await trio.sleep(1)
        assert [data for _, data in run.arrivals] == [b"ok 3\n", b"ok 1\n", b"ok 2\n"]


async def test_reading_pauses_while_max_answers_are_owed(autojump_clock: MockClock) -> None:
    async with running(toy(max_answers=2)) as run:
        lines = run.session.lines
        await run.send(b"pub 1\npub 2\n")
        await trio.sleep(1)
        await run.send(b"pub 3\npub 4\n")
        await trio.sleep(10)
        assert lines.received == b"pub 1\npub 2\n", "the peer's further bytes stay unread"
        run.settle(b"1")
        await trio.sleep(1)
        assert lines.received == b"pub 1\npub 2\npub 3\npub 4\n"
        assert run.got == b"ok 1\n"
        # pub 4 waits in submit (two owed again) until the next answer goes out.
        assert set(run.session.receipts) == {b"1", b"2", b"3"}
        run.settle(b"2")
        await trio.sleep(1)
        assert set(run.session.receipts) == {b"1", b"2", b"3", b"4"}
        assert run.got == b"ok 1\nok 2\n"


async def test_keepalives_while_the_head_waits(autojump_clock: MockClock) -> None:
    async with running(toy(keepalive=5)) as run:
        await trio.sleep(20)  # nothing owed: no keepalive
        assert run.got == b""
        await run.send(b"pub 1\n")  # at 20
        await trio.sleep_until(32)
        run.settle(b"1")
        await trio.sleep_until(60)
    assert run.arrivals == [(25, b"ka\n"), (30, b"ka\n"), (32, b"ok 1\n")]


async def test_keepalives_follow_the_head_and_the_last_write(autojump_clock: MockClock) -> None:
    async with running(toy(keepalive=5)) as run:
        await run.send(b"pub 1\n")  # at 0
        await run.send(b"pub 2\n", at=3)
        run.settle(b"1", Outcome.DELIVERED)  # at 3: pub 2 is the head now
        await trio.sleep_until(14)
        run.settle(b"2")
        await trio.sleep_until(40)
    assert run.arrivals == [(3, b"ok 1\n"), (8, b"ka\n"), (13, b"ka\n"), (14, b"ok 2\n")]


# -- Session: deadlines ---------------------------------------------------------------


async def test_a_trickling_unit_times_out_from_when_it_started(
    autojump_clock: MockClock,
) -> None:
    async with running(toy(unit_timeout=10)) as run:
        run.session.settle_at_once = True
        await run.send(b"pub 1\n")
        await run.send(b"p", at=2)
        for i, byte in enumerate(b"ub 123456789012345\n"):
            if run.done.is_set():
                break
            await run.send(bytes([byte]), at=3 + i)
        await run.wait()
    run.raised(pytest.RaisesExc(trio.TooSlowError, match="did not finish within 10s"))
    assert run.ended_at == 12
    assert run.got == b"ok 1\n"


class _HandedStream(trio.abc.Stream):
    """Bytes handed straight to a waiting reader, which wakes in the feeder's own
    scheduling batch (memory streams checkpoint first, so they cannot race a timer)."""

    def __init__(self) -> None:
        self._data = bytearray()
        self._arrived = trio.lowlevel.ParkingLot()

    def feed(self, data: bytes) -> None:
        self._data += data
        self._arrived.unpark_all()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while not self._data:
            await self._arrived.park()
        data = bytes(self._data)
        self._data.clear()
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_a_read_that_lands_as_the_unit_times_out_does_not_cancel_the_timeout(
    autojump_clock: MockClock,
) -> None:
    """A read completing in the very batch the unit timer fired in escaped the
    timer's cancel, and the timer never looked again: the connection (and the
    memory its unit held) stayed forever. Trio orders a batch at random, so
    the race is run often enough that the old code fails it for certain."""
    for attempt in range(24):
        stream = _HandedStream()
        session = Toy(stream, unit_timeout=10)
        start = trio.current_time()

        async def feed(stream: _HandedStream = stream, start: float = start) -> None:
            stream.feed(b"pu")  # a unit starts now and must be whole at start + 10
            await trio.sleep_until(start + 10)
            stream.feed(b"b")  # lands exactly as the timer fires; still no "\n"

        timed_out = pytest.RaisesExc(trio.TooSlowError, match="within 10s")
        with trio.fail_after(60), pytest.RaisesGroup(timed_out, flatten_subgroups=True):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(feed)
                await session.run()
        assert trio.current_time() == start + 10, attempt


async def test_units_finished_in_time_do_not_time_out(autojump_clock: MockClock) -> None:
    """Each unit takes 3s of a 10s limit, though every read ends inside a unit."""
    async with running(toy(unit_timeout=10)) as run:
        run.session.settle_at_once = True
        await run.send(b"pu")
        for i in range(1, 11):
            await run.send(b"b %d\npu" % i, at=3 * i)
        await run.send(b"b 11\n", at=33)
        await trio.sleep(30)
        assert not run.done.is_set(), run.error
    assert run.session.events == [b"pub %d" % i for i in range(1, 12)]


async def test_a_unit_after_a_pause_gets_its_full_time(autojump_clock: MockClock) -> None:
    async with running(toy(unit_timeout=10, max_answers=1)) as run:
        await run.send(b"pub 1\npu")  # at 0: a unit starts, and one answer is owed
        await trio.sleep_until(20)
        assert run.session.lines.received == b"pub 1\npu"
        run.session.settle_at_once = True
        run.settle(b"1")  # reading resumes at 20, with 10 - 0 seconds left for "pu..."
        await run.send(b"b 2\npub", at=25)
        await run.wait()
    run.raised(pytest.RaisesExc(trio.TooSlowError, match="within 10s"))
    # "pub 2" came at 25 after 5s of reading; "pub" started at 25 and had until 35.
    assert run.ended_at == 35
    assert run.session.events == [b"pub 1", b"pub 2"]


async def test_time_paused_by_backpressure_is_not_counted(autojump_clock: MockClock) -> None:
    async with running(toy(unit_timeout=10, max_answers=1)) as run:
        await run.send(b"pub 1\npu")
        await trio.sleep_until(20)
        run.settle(b"1")
        await run.wait()
    run.raised(pytest.RaisesExc(trio.TooSlowError, match="within 10s"))
    assert run.ended_at == 30, "10s of reading, not counting the 20s paused"


async def test_a_protocol_read_deadline(autojump_clock: MockClock) -> None:
    async with running(toy()) as run:
        await run.send(b"ask\n", at=1)
        await run.send(b"clear\n", at=5)
        await run.send(b"ask\n", at=10)
        await run.wait()
    run.raised(pytest.RaisesExc(trio.TooSlowError, match="^no reply to ask$"))
    assert run.ended_at == 17


async def test_a_read_deadline_set_while_reading(autojump_clock: MockClock) -> None:
    """A protocol's own task (a pump, say) sets the deadline while the reader waits."""
    async with running(toy()) as run:
        await trio.sleep_until(2)
        run.session.set_deadline(trio.current_time() + 3, "the peer owes a pong")
        await run.wait()
    run.raised(pytest.RaisesExc(trio.TooSlowError, match="owes a pong"))
    assert run.ended_at == 5


async def test_the_write_timeout(autojump_clock: MockClock) -> None:
    async with running(toy(write_timeout=5), lockstep=True, peer_reads=False) as run:
        run.session.settle_at_once = True
        await run.send(b"pub 1\n", at=1)
        await run.wait()
    run.raised(pytest.RaisesExc(trio.TooSlowError, match="did not read 5 bytes within 5s"))
    assert run.ended_at == 6


async def test_a_write_that_starts_while_the_write_timer_sleeps_is_caught_on_time(
    autojump_clock: MockClock,
) -> None:
    """The timer wakes every ``write_timeout`` while idle; a write starting in between
    still fails exactly ``write_timeout`` after it started, not at the next wake."""
    async with running(toy(write_timeout=5), lockstep=True, peer_reads=False) as run:
        run.session.settle_at_once = True
        await run.send(b"pub 1\n", at=7)
        await run.wait()
    run.raised(pytest.RaisesExc(trio.TooSlowError, match="did not read 5 bytes within 5s"))
    assert run.ended_at == 12


async def test_writes_that_each_finish_in_time_do_not_time_out(autojump_clock: MockClock) -> None:
    """The bound is per write: a peer that reads every 4 s keeps a 5 s write timeout."""
    async with running(toy(write_timeout=5), lockstep=True, peer_reads=False) as run:
        run.session.settle_at_once = True
        for n in range(6):
            await run.send(b"pub %d\n" % n, at=1 + 6 * n)
            await trio.sleep(4)
            assert await run.peer.receive_some() == b"ok %d\n" % n
        await trio.sleep(20)
        assert not run.done.is_set()


class Untimed(Toy):
    timed_reads = False


async def test_a_session_that_does_not_time_reads_refuses_a_deadline(
    autojump_clock: MockClock,
) -> None:
    async with running(lambda stream: Untimed(stream)) as run:
        await run.send(b"clear\n")  # clearing is allowed: there is nothing to clear
        with pytest.raises(RuntimeError, match="reads without deadlines"):
            run.session.set_deadline(trio.current_time() + 3, "never")
        run.session.settle_at_once = True
        await run.send(b"pub 1\npub 2\n", at=1)
        await trio.sleep(1)
        assert run.got == b"ok 1\nok 2\n"
        assert not run.done.is_set()


def socket_session(**kwargs: Any) -> tuple[Toy, socket.socket]:
    """A session on one end of a real socket pair; the other end, a plain socket."""
    ours, peer = socket.socketpair()
    peer.setblocking(False)
    return Toy(trio.SocketStream(trio.socket.from_stdlib_socket(ours)), **kwargs), peer


async def test_write_now_writes_at_once_in_order_with_what_is_queued() -> None:
    session, peer = socket_session()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(session.run)
        await trio.testing.wait_all_tasks_blocked()
        session.write_now(b"one ")
        # Written here, not by the writer task: the peer has it before anyone yields.
        assert peer.recv(100) == b"one "
        session.write(b"two ")  # queued for the writer: what follows waits behind it
        session.write_now(b"three")
        assert session.unsent == len(b"two three")
        await trio.testing.wait_all_tasks_blocked()
        assert peer.recv(100) == b"two three"
        nursery.cancel_scope.cancel()
    peer.close()


async def test_write_now_never_waits_for_a_peer_that_does_not_read(
    autojump_clock: MockClock,
) -> None:
    """What the socket does not take queues as with write(), under the write timeout."""
    session, peer = socket_session(write_timeout=5)
    errors: list[BaseException] = []

    async def run() -> None:
        try:
            await session.run()
        except BaseExceptionGroup as e:
            errors.extend(e.exceptions)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await trio.testing.wait_all_tasks_blocked()
        started = trio.current_time()
        for _ in range(64):
            session.write_now(bytes(1 << 16))  # returns at once, every time
        assert trio.current_time() == started
        assert session.unsent > 0
    assert [type(e) for e in errors] == [trio.TooSlowError]
    assert trio.current_time() == started + 5
    peer.close()


async def test_producers_wait_for_room_below_high_water(autojump_clock: MockClock) -> None:
    async with running(toy(high_water=10), lockstep=True, peer_reads=False) as run:
        session = run.session
        await trio.sleep(1)
        session.write(b"x" * 11)  # the writer takes it: unsent output is empty again
        await trio.sleep(1)
        session.write(b"y" * 11)  # stays unsent while the peer does not read
        made: list[float] = []

        async def producer() -> None:
            await session.wait_for_room()
            made.append(trio.current_time())
            await session.write_when_room(b"z")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(producer)
            await trio.sleep(5)
            assert made == []
            assert await run.peer.receive_some() == b"x" * 11
            await trio.sleep(1)
            assert made == [7]  # when the peer took the x: the y left unsent output
        assert await run.peer.receive_some() == b"y" * 11
        assert await run.peer.receive_some() == b"z"


# -- Session: how it ends -------------------------------------------------------------


async def test_end_of_input_answers_what_is_owed(autojump_clock: MockClock) -> None:
    async with running(toy()) as run:
        await run.send(b"pub 1\npub 2\n")
        await run.close(at=1)
        await trio.sleep_until(4)
        assert run.session.ended_input
        assert not run.done.is_set()
        run.settle(b"2")
        run.settle(b"1")
        await run.wait()
    assert (run.error, run.ended_at, run.got) == (None, 4, b"ok 1\nok 2\n")


async def test_end_of_input_mid_line(autojump_clock: MockClock) -> None:
    async with running(toy()) as run:
        await run.send(b"pub 1\npub")
        await run.close(at=1)
        await trio.sleep_until(2)
        run.settle(b"1")
        await run.wait()
    assert (run.error, run.ended_at, run.got) == (None, 2, b"ok 1\n")
    assert run.session.events == [b"pub 1"]


async def test_shutdown_stops_reading_and_answers_what_is_owed(
    autojump_clock: MockClock,
) -> None:
    shutdown = trio.Event()
    async with running(toy(shutdown=shutdown)) as run:
        await run.send(b"pub 1\n")
        await trio.sleep_until(1)
        shutdown.set()
        await run.send(b"pub 2\n", at=2)
        await trio.sleep_until(5)
        assert run.session.lines.received == b"pub 1\n"
        assert run.session.drained_at == 1
        run.settle(b"1")
        await run.wait()
    assert (run.error, run.ended_at, run.got) == (None, 5, b"ok 1\n")


async def test_shutdown_with_read_while_draining_waits_for_busy(
    autojump_clock: MockClock,
) -> None:
    shutdown = trio.Event()

    def make(stream: trio.abc.Stream) -> Toy:
        session = Toy(stream, shutdown=shutdown)
        session.read_while_draining = True
        session.unacked = 2
        return session

    async with running(make) as run:
        await run.send(b"pub 1\n")
        await trio.sleep_until(1)
        shutdown.set()
        await run.send(b"ack\n", at=2)
        run.settle(b"1")  # at 2: nothing owed, one delivery still unacked
        await trio.sleep_until(3)
        assert not run.done.is_set()
        assert run.got == b"ok 1\n"
        await run.send(b"ack\n", at=6)
        await run.wait()
    assert (run.error, run.ended_at, run.session.drained_at) == (None, 6, 1)
    assert run.session.lines.received == b"pub 1\nack\nack\n"


async def test_a_remote_protocol_error(autojump_clock: MockClock) -> None:
    async with running(toy()) as run:
        await run.send(b"pub 1\n")
        await trio.sleep(1)
        run.settle(b"1")
        await trio.sleep(1)
        run.session.settle_at_once = True  # pub 2's answer is ready before "bad" is read
        await run.send(b"pub 2\nbad\npub 3\n")
        await run.wait()
    run.raised(pytest.RaisesExc(RemoteProtocolError, match="a bad line"))
    # An answer settled at once is written at once; nothing after the bad line is taken.
    assert run.got == b"ok 1\nok 2\nerr\n"
    assert run.session.events == [b"pub 1", b"pub 2"]


async def test_a_remote_protocol_error_when_the_peer_does_not_read(
    autojump_clock: MockClock,
) -> None:
    """The error reply times out; what ``run()`` raises is still the protocol error."""
    async with running(toy(write_timeout=5), lockstep=True, peer_reads=False) as run:
        await run.send(b"bad\n", at=1)
        await run.wait()
    run.raised(pytest.RaisesExc(RemoteProtocolError, match="a bad line"))
    assert run.ended_at == 6


@pytest.mark.parametrize("how", ["stop", "shutdown"])
async def test_a_remote_protocol_error_is_not_lost_to_a_stop(
    autojump_clock: MockClock, how: str
) -> None:
    """Reading is stopped while the error reply waits for the peer: the error still leaves."""
    shutdown = trio.Event()
    async with running(
        toy(write_timeout=5, shutdown=shutdown), lockstep=True, peer_reads=False
    ) as run:
        await run.send(b"pub 1\n")  # owed, never settled
        await run.send(b"bad\n", at=1)
        await trio.sleep_until(2)
        if how == "stop":
            run.session.stop()
        else:
            shutdown.set()
        await run.wait()
    run.raised(pytest.RaisesExc(RemoteProtocolError, match="a bad line"))
    assert run.ended_at == 2


async def test_an_answer_function_that_raises_closes_the_session(
    autojump_clock: MockClock,
) -> None:
    async with running(toy()) as run:
        await run.send(b"pub boom\npub 2\n")
        await trio.sleep(1)
        run.settle(b"2")
        await trio.sleep(1)
        assert not run.done.is_set()
        run.settle(b"boom")
        await run.wait()
    run.raised(pytest.RaisesExc(ValueError, match="broke"))
    assert (run.ended_at, run.got) == (2, b"")


async def test_stop_ends_run_after_the_answers(autojump_clock: MockClock) -> None:
    async with running(toy()) as run:
        await run.send(b"pub 1\n")
        await trio.sleep_until(1)
        run.session.stop()
        await run.send(b"pub 2\n", at=2)
        await trio.sleep_until(5)
        assert not run.done.is_set()
        run.settle(b"1")
        await run.wait()
    assert (run.error, run.ended_at, run.got) == (None, 5, b"ok 1\n")
    assert run.session.lines.received == b"pub 1\n"


async def test_stop_from_handle(autojump_clock: MockClock) -> None:
    async with running(toy()) as run:
        await run.send(b"pub 1\nquit\n")
        await run.send(b"pub 2\n", at=1)
        await trio.sleep_until(3)
        run.settle(b"1")
        await run.wait()
    assert (run.error, run.ended_at, run.got) == (None, 3, b"ok 1\n")
    assert run.session.events == [b"pub 1", b"quit"]


async def test_pending(autojump_clock: MockClock) -> None:
    async with running(toy(), lockstep=True, peer_reads=False) as run:
        session = run.session
        await trio.sleep(1)
        assert not session.pending()
        await run.send(b"pub 1\n")
        await trio.sleep(1)
        assert session.pending(), "an answer is owed"
        run.settle(b"1")
        await trio.sleep(1)
        assert len(session.answers) == 0
        assert session.pending(), "the answer is not sent yet"
        assert await run.peer.receive_some() == b"ok 1\n"
        await trio.sleep(1)
        assert not session.pending()
        session.unacked = 1
        assert session.pending(), "busy() counts"


# -- serve(): what the peer's side ends a connection with is logged, not raised ------------


@pytest.mark.parametrize(
    ("lines", "kind", "logged"),
    [
        (b"bad\n", RemoteProtocolError, "protocol error: a bad line; closing"),
        (b"pub lost\n", NotKept, "pub lost was not kept; closing without an answer"),
        (b"ask\n", trio.TooSlowError, "no reply to ask; closing"),
    ],
)
async def test_serve_logs_what_the_peer_ended_the_connection_with(
    autojump_clock: MockClock,
    caplog: pytest.LogCaptureFixture,
    lines: bytes,
    kind: type[BaseException],
    logged: str,
) -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    session = Toy(ours)
    session.settle_at_once = True
    await theirs.send_all(lines)
    with caplog.at_level(logging.WARNING, logger="test.toy"), trio.fail_after(100):
        await session.serve()  # returns: nothing propagates
    [end] = session.ends
    assert isinstance(end, kind)
    assert [r.getMessage() for r in caplog.records] == [logged]


async def test_serve_lets_a_fault_of_ours_propagate(autojump_clock: MockClock) -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    session = Toy(ours)
    session.settle_at_once = True
    await theirs.send_all(b"pub boom\n")
    with pytest.RaisesGroup(pytest.RaisesExc(ValueError, match="answer function broke")):
        await session.serve()
    assert session.ends == []
