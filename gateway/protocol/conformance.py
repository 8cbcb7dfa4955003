"""The codec conformance suite: what every sans-IO codec must do, checked the same way.

A protocol's codec joins by describing itself in a :class:`CodecCase`: how to
make a fresh codec, its golden byte vectors and the events they make,
input that breaks the protocol, sends that a fresh codec refuses, and a
flood of hostile input with the bound its ``held_bytes`` must keep. Each
function in :data:`CHECKS` then checks one rule of the shared lifecycle
(:mod:`gateway.protocol.lifecycle`) on it:

* :func:`check_goldens`: every golden vector, split at every byte (and in
  one-byte pieces), makes exactly its events, and nothing is held after;
* :func:`check_cut_input`: input that ends inside a unit never yields a
  partial event: the events before the cut, then ``ConnectionClosed`` (or the
  peer's error, for a protocol where an unfinished unit is one);
* :func:`check_same_answer_after_close`: once closed, ``next_event`` answers
  ``ConnectionClosed`` every time, holds nothing, and takes no more bytes;
* :func:`check_errors_sticky`: bad input raises ``RemoteProtocolError``; the
  codec is then in ``ERROR`` for good (``next_event`` refuses, naming the
  state), holds nothing, and refuses the sends it documents;
* :func:`check_sends_refused`: what a fresh codec's state does not allow is
  refused with ``LocalProtocolError``, and the refusal changes nothing;
* :func:`check_held_bytes_bounded`: while a flood arrives, ``held_bytes``
  never exceeds the case's bound (or the codec refuses the flood).

It imports neither pytest nor trio; a failed rule is an ``AssertionError``.
A test module runs the checks with::

    @pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
    def test_conformance(check):
        check(MY_CASE)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.core.errors import LocalProtocolError, RemoteProtocolError
from gateway.protocol.events import NEED_DATA, ConnectionClosed
from gateway.protocol.lifecycle import CodecState, WrongState

__all__ = [
    "CHECKS",
    "Check",
    "CodecCase",
    "Golden",
    "check_cut_input",
    "check_errors_sticky",
    "check_goldens",
    "check_held_bytes_bounded",
    "check_same_answer_after_close",
    "check_sends_refused",
    "drain",
    "splits",
]


class Codec(Protocol):
    """What the suite needs of a codec: the lifecycle's surface."""

    @property
    def state(self) -> CodecState: ...

    @property
    def held_bytes(self) -> int: ...

    def receive_data(self, data: bytes | bytearray | memoryview) -> None: ...

    def next_event(self) -> Any: ...


def splits(data: bytes) -> Iterator[list[bytes]]:
    """``data`` in two pieces at every split point, then one byte at a time.

    Whatever the pieces, a codec must make the same events of them: this is
    how a unit cut anywhere between two reads is tested.
    """
    for i in range(len(data) + 1):
        yield [data[:i], data[i:]]
    yield [data[i : i + 1] for i in range(len(data))]


def drain(codec: Codec) -> list[Any]:
    """Every event the codec makes from what it was given, up to :data:`NEED_DATA`
    or :class:`ConnectionClosed` (included)."""
    events: list[Any] = []
    while True:
        event = codec.next_event()
        if event is NEED_DATA:
            return events
        events.append(event)
        if isinstance(event, ConnectionClosed):
            return events


def _identity(event: Any) -> Any:
    return event


@dataclass(frozen=True)
class Golden:
    """A byte vector and the events a fresh codec makes of it (``ConnectionClosed``
    not included: the suite adds the end of input itself)."""

    name: str
    data: bytes
    events: Sequence[Any]


@dataclass(frozen=True)
class CodecCase:
    """One codec, described for the conformance suite.

    ``make`` returns a fresh codec, set up as the vectors expect (a role
    whose peer must first be answered, such as a segment store before an
    append, does that here). ``normalize`` maps each event before it is
    compared (e.g. to drop what a test need not pin).
    """

    name: str
    make: Callable[[], Codec]
    #: At least one; the first is also fed after a refused send.
    goldens: Sequence[Golden]
    #: Input that breaks the protocol (each a RemoteProtocolError at some point).
    bad: Sequence[bytes] = ()
    #: Sends a fresh codec's state does not allow: each is called with the codec and
    #: must raise LocalProtocolError.
    refused: Sequence[Callable[[Any], object]] = ()
    #: Sends allowed while ``OPEN`` that ``ERROR`` refuses with WrongState.
    refused_after_error: Sequence[Callable[[Any], object]] = ()
    #: Hostile input that keeps a unit growing, fed in ``flood_step`` pieces ...
    flood: bytes = b""
    flood_step: int = 4096
    #: ... during which ``held_bytes`` stays at or below this.
    max_held: int = 0
    normalize: Callable[[Any], Any] = field(default=_identity)


Check = Callable[[CodecCase], None]


def _feed(case: CodecCase, pieces: Iterable[bytes], *, eof: bool) -> tuple[Codec, list[Any]]:
    """A fresh codec fed ``pieces`` (then the end of input if ``eof``), and its events
    (normalized; ``ConnectionClosed`` kept)."""
    codec = case.make()
    events: list[Any] = []
    for piece in pieces:
        if piece:  # b"" would mean the end of input
            codec.receive_data(piece)
            events += drain(codec)
    if eof:
        codec.receive_data(b"")
        events += drain(codec)
    return codec, [e if isinstance(e, ConnectionClosed) else case.normalize(e) for e in events]


def _expected(case: CodecCase, golden: Golden) -> list[Any]:
    return [case.normalize(e) for e in golden.events]


def check_goldens(case: CodecCase) -> None:
    """Each golden vector, cut at every byte, makes its events and leaves nothing held."""
    assert case.goldens, f"{case.name}: a case needs at least one golden vector"
    for golden in case.goldens:
        expected = [*_expected(case, golden), ConnectionClosed()]
        for pieces in splits(golden.data):
            codec, events = _feed(case, pieces, eof=True)
            where = f"{case.name}/{golden.name} in pieces of {[len(p) for p in pieces]}"
            assert events == expected, where
            assert codec.state is CodecState.CLOSED, where
            assert codec.held_bytes == 0, where


def check_cut_input(case: CodecCase) -> None:
    """Input cut at any byte, then closed, makes only whole events: a prefix of the
    golden's, then ``ConnectionClosed`` (or the peer's error), never a partial one."""
    for golden in case.goldens:
        expected = _expected(case, golden)
        for cut in range(len(golden.data)):
            where = f"{case.name}/{golden.name} cut at {cut}"
            try:
                _, events = _feed(case, [golden.data[:cut]], eof=True)
            except RemoteProtocolError:
                continue  # an unfinished unit is the peer's error in this protocol
            assert events[-1:] == [ConnectionClosed()], where
            assert events[:-1] == expected[: len(events) - 1], where


def check_same_answer_after_close(case: CodecCase) -> None:
    """Closed is closed: ``ConnectionClosed`` every time, nothing held, no more input."""
    for golden in case.goldens:
        codec, events = _feed(case, [golden.data], eof=True)
        assert events[-1:] == [ConnectionClosed()], case.name
        for _ in range(3):
            assert codec.next_event() == ConnectionClosed(), case.name
        assert codec.state is CodecState.CLOSED, case.name
        assert codec.held_bytes == 0, case.name
        try:
            codec.receive_data(b"more")
        except LocalProtocolError:
            pass
        else:
            raise AssertionError(f"{case.name}: bytes after the end of input were taken")
        assert codec.next_event() == ConnectionClosed(), case.name


def check_errors_sticky(case: CodecCase) -> None:
    """Bad input: RemoteProtocolError, then ``ERROR`` for good, nothing held."""
    for i, bad in enumerate(case.bad):
        where = f"{case.name}: bad input #{i}"
        codec = case.make()
        codec.receive_data(bad)
        try:
            drain(codec)
            codec.receive_data(b"")
            drain(codec)
        except RemoteProtocolError:
            pass
        else:
            raise AssertionError(f"{where} was not refused")
        assert codec.state is CodecState.ERROR, where
        assert codec.held_bytes == 0, where
        for _ in range(2):
            _raises(WrongState, _next_event, codec, where)
            assert codec.state is CodecState.ERROR, where
        for send in case.refused_after_error:
            _raises(WrongState, send, codec, f"{where}, a send after it")
        assert codec.state is CodecState.ERROR, where


def check_sends_refused(case: CodecCase) -> None:
    """Sends a fresh codec's state does not allow are refused and change nothing."""
    golden = case.goldens[0]
    expected = [*_expected(case, golden), ConnectionClosed()]
    for i, send in enumerate(case.refused):
        where = f"{case.name}: refused send #{i}"
        codec = case.make()
        _raises(LocalProtocolError, send, codec, where)
        assert codec.state is CodecState.OPEN, where
        codec.receive_data(golden.data)
        events = drain(codec)
        codec.receive_data(b"")
        events += drain(codec)
        got = [e if isinstance(e, ConnectionClosed) else case.normalize(e) for e in events]
        assert got == expected, f"{where} changed what the codec makes of its golden vector"


def check_held_bytes_bounded(case: CodecCase) -> None:
    """While a flood arrives, ``held_bytes`` stays within the case's bound."""
    if not case.flood:
        return
    codec = case.make()
    flood, step = case.flood, case.flood_step
    for start in range(0, len(flood), step):
        try:
            codec.receive_data(flood[start : start + step])
            drain(codec)
        except RemoteProtocolError:
            assert codec.held_bytes == 0, f"{case.name}: bytes held after refusing the flood"
            return
        held = codec.held_bytes
        assert held <= case.max_held, f"{case.name}: {held} bytes held, over {case.max_held}"


def _next_event(codec: Codec) -> object:
    return codec.next_event()


def _raises(kind: type[Exception], call: Callable[[Any], object], arg: Any, where: str) -> None:
    try:
        call(arg)
    except kind:
        return
    raise AssertionError(f"{where}: {kind.__name__} not raised")


#: Every check, in the order the suite runs them.
CHECKS: tuple[Check, ...] = (
    check_goldens,
    check_cut_input,
    check_same_answer_after_close,
    check_errors_sticky,
    check_sends_refused,
    check_held_bytes_bounded,
)
