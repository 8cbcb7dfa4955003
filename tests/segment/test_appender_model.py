"""The segment writers' :class:`~protocols.segment.client.Appender`, against a plain model.

The Appender keeps a lane's unacked events in runs (one per ``add``), numbers a whole run
when any of it is first taken, and acks, rewinds and refuses run by run. The runs are an
optimization: what a session and the producers can observe must be what a plain list of
events per segment gives. So random sequences of operations -- adds to one or two segments
(with tokens or without), takes with any event and byte limits, acks up to any number sent
on the connection, reconnects whose setups say the server stored anything from what it
acked up to what was sent, refusals, and ``fail_all`` -- go to an Appender and to such a
list (:class:`_LaneModel`), and each step must give what the list says:

- ``take`` continues exactly where the connection's last take stopped, in add order across
  adds, with at least one event if any is left, at most ``max_events``, and as many as
  ``max_bytes`` allows (more only when a single event is larger);
- the event at index ``i`` of a lane (in add order, acked or not) is numbered
  ``base + 1 + i``, ``base`` being what the lane's first setup said the server stored (0:
  nothing), and keeps that number on every resend; ``resent`` (and ``on_resend``) count
  exactly the events taken again;
- ``on_acked`` gets exactly the tokens and numbers of the events an ack or a setup covers,
  ``on_refused`` and ``fail_all`` those of the events not acked;
- after every step ``events``, ``bytes``, ``in_flight``, ``room()``/``has_room()`` and each
  lane's ``count``, ``nbytes``, ``sent``, ``sent_bytes`` (and a ``next_number`` past what
  was taken, within what was added) are the list's.

The model never looks at runs. The Appender is driven as
:class:`~protocols.segment.client.AppendSession` drives it: a lane is set up on each
connection before it is taken from or acked, a reconnect is ``disconnected()`` and new
setups, acks never go past what the connection sent. A loop of weighted operations (not
a state machine: takes and acks must be frequent, refusals rare) draws the steps. Nothing
here awaits, so no trio run is needed.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID, uuid4

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.segment.client import Appender, Lane, SegmentError

SEGMENTS = ("s0", "s1")
#: Long.MIN_VALUE: an AppendSetup's "nothing stored for this writer".
NOTHING = -(2**63)
MAX_EVENTS = 120
MAX_BYTES = 2500


@dataclass
class _Event:
    payload: bytes
    token: int | None
    #: Position in the lane's events, counting from the first ever added (acked or not).
    index: int
    #: The number ``take`` first gave it (None: not taken yet).
    seen: int | None = None
    #: Taken on some connection already (taking it again is a resend).
    sent_before: bool = False


@dataclass
class _LaneModel:
    """One segment's writer: a list of its unacked events, oldest first."""

    lane: Lane
    events: list[_Event] = field(default_factory=list)
    #: Events ever added to this lane, and those acked (dropped from ``events``' front).
    added: int = 0
    dropped: int = 0
    #: What the lane's first setup said the server stored (None: not set up yet).
    base: int | None = None
    #: The highest number ever taken (``base`` while nothing was).
    high: int = 0
    #: Set up on the current connection, and how many of ``events`` (from the front)
    #: were taken on it.
    ready: bool = False
    sent: int = 0

    def number(self, event: _Event) -> int:
        assert self.base is not None
        return self.base + 1 + event.index

    @property
    def acked(self) -> int:
        """The highest number acked (``base`` while none was)."""
        return (self.base or 0) + self.dropped

    @property
    def nbytes(self) -> int:
        return sum(len(e.payload) for e in self.events)

    @property
    def sent_bytes(self) -> int:
        return sum(len(e.payload) for e in self.events[: self.sent])

    def tokens(self, events: Sequence[_Event]) -> list[int]:
        return [e.token for e in events if e.token is not None]

    def marked(self, events: Sequence[_Event]) -> list[tuple[Any, int]]:
        return [(e.token, self.number(e)) for e in events if e.token is not None]


@dataclass
class _Acked:
    segment: str
    writer_id: UUID
    acked: list[tuple[Any, int]]
    offset: int


class _Driver:
    """An Appender and the model, side by side; each operation draws its arguments."""

    def __init__(self) -> None:
        self.acked: list[_Acked] = []
        self.refused: list[tuple[str, list[Any], SegmentError]] = []
        self.resends: list[int] = []
        self.appender = Appender(
            lambda s, w, acked, offset: self.acked.append(_Acked(s, w, acked, offset)),
            lambda s, tokens, error: self.refused.append((s, tokens, error)),
            writer_id=lambda _segment: uuid4(),
            max_events=MAX_EVENTS,
            max_bytes=MAX_BYTES,
        )
        self.appender.on_resend = self.resends.append
        self.lanes: dict[str, _LaneModel] = {}
        #: Lanes refused or failed: a segment's next add must get a new one.
        self.gone: list[Lane] = []
        self.counter = 0  # payloads and tokens are unique (token 0 is falsy on purpose)
        self.resent = 0

    # -- helpers ----------------------------------------------------------------------------
    def next_id(self) -> int:
        self.counter += 1
        return self.counter - 1

    def enabled(self, operations: Sequence[str]) -> list[str]:
        """Those of ``operations`` that the session could do now."""
        lanes = self.lanes.values()
        possible = {
            "add": True,
            "set_up": any(not m.ready for m in lanes),
            "take": any(m.ready for m in lanes),
            "acknowledge": any(m.ready and m.sent for m in lanes),
            "reconnect": True,
            "refuse": bool(self.lanes),
            "fail_all": bool(self.lanes),
        }
        return [op for op in operations if possible[op]]

    def ready(self) -> list[str]:
        return [s for s, m in self.lanes.items() if m.ready]

    def expect_acked(self, model: _LaneModel, events: Sequence[_Event], offset: int) -> None:
        """``on_acked`` got exactly ``events``' tokens and numbers (in one or more calls)."""
        calls, self.acked = self.acked, []
        for call in calls:
            assert (call.segment, call.writer_id, call.offset) == (
                model.lane.name,
                model.lane.writer_id,
                offset,
            )
        assert [x for call in calls for x in call.acked] == model.marked(events)

    def pop(self, model: _LaneModel, last: int, offset: int) -> None:
        """The model's side of an ack (or a setup) up to ``last``."""
        assert model.base is not None
        k = 0
        while k < len(model.events) and model.number(model.events[k]) <= last:
            k += 1
        done, model.events = model.events[:k], model.events[k:]
        model.dropped += k
        model.sent = max(0, model.sent - k)
        self.expect_acked(model, done, offset)

    # -- operations -------------------------------------------------------------------------
    def add(self, data: st.DataObject) -> None:
        segment = data.draw(st.sampled_from(SEGMENTS), label="segment")
        sizes = data.draw(st.lists(st.integers(0, 50), min_size=1, max_size=30), label="sizes")
        n = len(sizes)
        payloads = []
        for size in sizes:
            # Unique for all but the shortest payloads (the first bytes are the counter).
            payloads.append((self.next_id().to_bytes(4, "little") + b"x" * 50)[:size])
        tokens: list[int | None] = []
        if data.draw(st.booleans(), label="with tokens"):
            marked = data.draw(st.sets(st.integers(0, n - 1), max_size=1 + n // 3), label="marked")
            tokens = [self.next_id() if k in marked else None for k in range(n)]
        self.appender.add(segment, payloads, tokens)
        lane = self.appender.lane(segment)
        model = self.lanes.get(segment)
        if model is None:
            assert all(lane is not old for old in self.gone)
            assert lane.next_number == 1
            model = self.lanes[segment] = _LaneModel(lane)
        assert lane is model.lane
        for k, payload in enumerate(payloads):
            token = tokens[k] if tokens else None
            model.events.append(_Event(payload, token, model.added))
            model.added += 1

    def set_up(self, data: st.DataObject) -> None:
        """An ``AppendSetup`` answers the lane's setup on this connection."""
        waiting = [s for s, m in self.lanes.items() if not m.ready]
        model = self.lanes[data.draw(st.sampled_from(waiting), label="segment")]
        if model.base is None:
            # A writer id the server may know from before: numbers start after its last.
            last = data.draw(
                st.sampled_from([NOTHING, 0]) | st.integers(1, 2**40), label="known last"
            )
            model.base = model.high = max(last, 0)
        else:
            # The server stored at least what it acked, at most what was sent.
            last = data.draw(st.integers(model.acked, model.high), label="last")
            if last == 0:
                last = data.draw(st.sampled_from([NOTHING, 0]), label="nothing")
        self.appender.set_up(model.lane, last)
        model.ready = True
        self.pop(model, max(last, 0), -1)

    def take(self, data: st.DataObject) -> None:
        model = self.lanes[data.draw(st.sampled_from(self.ready()), label="segment")]
        max_events = data.draw(st.integers(1, 40), label="max_events")
        max_bytes = data.draw(st.integers(1, 400) | st.just(10**9), label="max_bytes")
        unsent = model.events[model.sent :]
        payloads, last = self.appender.take(model.lane, max_events, max_bytes)
        n = len(payloads)
        if not unsent:
            assert payloads == []
            return
        assert 1 <= n <= min(max_events, len(unsent))
        taken = unsent[:n]
        assert payloads == [e.payload for e in taken]  # exactly where the last take stopped
        size = sum(map(len, payloads))
        assert size <= max_bytes or n == 1
        if n < min(max_events, len(unsent)):  # as many as the bytes allow
            assert size + len(unsent[n].payload) > max_bytes
        for k, event in enumerate(taken):
            number = last - n + 1 + k
            assert number == model.number(event)
            assert number > model.acked
            if event.seen is not None:
                assert number == event.seen  # a number once given is kept for good
            event.seen = number
        resent = sum(e.sent_before for e in taken)
        self.resent += resent
        assert self.resends == ([resent] if resent else [])
        self.resends.clear()
        for event in taken:
            event.sent_before = True
        model.sent += n
        model.high = max(model.high, last)

    def acknowledge(self, data: st.DataObject) -> None:
        """A ``DataAppended`` up to any number sent on this connection (or a repeat)."""
        segments = [s for s, m in self.lanes.items() if m.ready and m.sent]
        model = self.lanes[data.draw(st.sampled_from(segments), label="segment")]
        top = model.number(model.events[model.sent - 1])
        last = data.draw(st.integers(model.acked, top), label="event_number")
        offset = data.draw(st.integers(0, 2**40), label="offset")
        self.appender.acknowledge(model.lane, last, offset)
        self.pop(model, last, offset)

    def reconnect(self, data: st.DataObject) -> None:
        self.appender.disconnected()
        for model in self.lanes.values():
            model.ready = False
            model.sent = 0

    def refuse(self, data: st.DataObject) -> None:
        """The server refused the segment (a session sees this answering a setup; here
        it may come at any time, events in flight or not)."""
        segment = data.draw(st.sampled_from(sorted(self.lanes)), label="segment")
        model = self.lanes.pop(segment)
        self.gone.append(model.lane)
        error = SegmentError(segment, "no such segment")
        self.appender.refuse(model.lane, error)
        assert self.refused == [(segment, model.tokens(model.events), error)]
        self.refused.clear()

    def fail_all(self, data: st.DataObject) -> None:
        tokens = self.appender.fail_all(RuntimeError("closed"))
        expected = [t for m in self.lanes.values() for t in m.tokens(m.events)]
        assert sorted(tokens) == sorted(expected)  # the order across lanes is not said
        self.gone += [m.lane for m in self.lanes.values()]
        self.lanes.clear()

    # -- what must hold after every step ----------------------------------------------------
    def check(self) -> None:
        # Each operation took the callbacks it expected: no other was made.
        assert self.acked == []
        assert self.refused == []
        assert self.resends == []
        a = self.appender
        events = sum(len(m.events) for m in self.lanes.values())
        nbytes = sum(m.nbytes for m in self.lanes.values())
        assert (a.events, a.bytes) == (events, nbytes)
        assert a.in_flight == sum(m.sent for m in self.lanes.values())
        assert a.resent == self.resent
        assert a.room() == (MAX_EVENTS - events, MAX_BYTES - nbytes)
        # Around the window's edges (it may be overfull: add does not wait).
        room, room_bytes = max(MAX_EVENTS - events, 0), max(MAX_BYTES - nbytes, 0)
        for more, more_bytes in itertools.product(
            (1, room, room + 1), (0, room_bytes, room_bytes + 1)
        ):
            fits = events + more <= MAX_EVENTS and nbytes + more_bytes <= MAX_BYTES
            assert a.has_room(more, more_bytes) == (not events or fits)
        for model in self.lanes.values():
            lane = model.lane
            assert (lane.count, lane.nbytes) == (len(model.events), model.nbytes)
            assert (lane.sent, lane.sent_bytes) == (model.sent, model.sent_bytes)
            # Whole runs are numbered at once: past what was taken, within what was added.
            if model.base is not None:
                assert model.high + 1 <= lane.next_number <= model.base + model.added + 1


#: Operations, by weight: mostly takes, acks, setups and adds; now and then a reconnect;
#: rarely a refusal or the writer failing (each drops lanes, and what was built up).
OPERATIONS = (
    ("take",) * 10
    + ("acknowledge",) * 7
    + ("set_up",) * 5
    + ("add",) * 6
    + ("reconnect",) * 3
    + ("refuse", "fail_all")
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_appender_matches_a_list_per_segment(data: st.DataObject) -> None:
    driver = _Driver()
    driver.check()
    for _ in range(data.draw(st.integers(1, 80), label="steps")):
        operation = data.draw(st.sampled_from(driver.enabled(OPERATIONS)), label="operation")
        getattr(driver, operation)(data)
        driver.check()
