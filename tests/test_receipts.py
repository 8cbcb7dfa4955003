"""Receipts: legs, sealing, worst-outcome-wins per message and overall, neutral legs,
positions, codes and details, calls, callbacks and wait()."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.model import Outcome, Position, Reply
from gateway.core.receipts import Receipt, Result

# -- legs and sealing ---------------------------------------------------------------


def test_new_receipt_is_pending() -> None:
    r = Receipt(2)
    assert r.outcome is None
    assert not r.done()
    assert r.reason == ""
    assert r.count == 2
    assert not r.is_call
    assert r.reply is None
    assert r.reply_by is None


def test_seal_without_legs_settles_delivered() -> None:
    r = Receipt()
    r.seal()
    assert r.done()
    assert r.outcome is Outcome.DELIVERED
    assert r.results() == []


def test_seal_without_legs_settles_every_message_delivered() -> None:
    """A publish none of whose messages got a copy (nobody listens) is delivered."""
    r = Receipt(3)
    r.seal()
    assert r.outcome is Outcome.DELIVERED
    assert r.results() == [Result()] * 3


def test_settles_only_when_sealed_and_every_leg_settled() -> None:
    r = Receipt(2)
    r.add_legs(2)
    r.add_legs()
    r.settle(0, Outcome.DELIVERED)
    r.settle(1, Outcome.DELIVERED)
    r.seal()
    assert not r.done(), "one of three legs is still pending"
    r.settle(1, Outcome.DELIVERED)
    assert r.outcome is Outcome.DELIVERED


def test_all_legs_settled_before_seal_waits_for_seal() -> None:
    """A publish may still add copies: settling every leg so far is not enough."""
    r = Receipt(2)
    r.add_legs()
    r.settle(0, Outcome.DELIVERED)
    assert not r.done()
    r.add_legs()
    r.settle(1, Outcome.FAILED, "later leg")
    assert not r.done()
    r.seal()
    assert r.outcome is Outcome.FAILED
    assert r.reason == "later leg"
    assert r.results() == [Result(), Result(Outcome.FAILED, "later leg")]


def test_add_legs_after_seal_raises() -> None:
    r = Receipt(1)
    r.add_legs()
    r.seal()
    with pytest.raises(RuntimeError):
        r.add_legs()


def test_settle_range_settles_one_leg_of_each_message() -> None:
    r = Receipt(5)
    r.add_legs(5)
    r.seal()
    r.settle_range(0, 2, Outcome.DELIVERED)
    assert not r.done()
    r.settle_range(2, 4, Outcome.FAILED, "busy")
    assert not r.done(), "message 4 is pending"
    r.settle_range(4, 4, Outcome.REJECTED, "empty range")  # settles nothing
    assert not r.done()
    r.settle_range(4, 5, Outcome.DELIVERED)
    assert r.outcome is Outcome.FAILED
    assert r.reason == "busy"
    assert [res.outcome for res in r.results()] == [
        Outcome.DELIVERED,
        Outcome.DELIVERED,
        Outcome.FAILED,
        Outcome.FAILED,
        Outcome.DELIVERED,
    ]
    assert [res.reason for res in r.results()] == ["", "", "busy", "busy", ""]


# -- the worst outcome wins, per message and overall ----------------------------------


@pytest.mark.parametrize(
    "outcomes",
    list(itertools.permutations([Outcome.DELIVERED, Outcome.FAILED, Outcome.REJECTED])),
)
def test_worst_outcome_wins_in_any_order(outcomes: tuple[Outcome, ...]) -> None:
    """Three legs of one message (three targets): its result and the receipt report
    the worst, with that leg's reason."""
    r = Receipt(1)
    r.add_legs(len(outcomes))
    r.seal()
    for o in outcomes:
        r.settle(0, o, f"reason {o.name}")
    assert r.outcome is Outcome.REJECTED
    assert r.reason == "reason REJECTED"
    assert r.result(0) == Result(Outcome.REJECTED, "reason REJECTED")


@pytest.mark.parametrize(
    "outcomes",
    list(itertools.permutations([Outcome.DELIVERED, Outcome.FAILED, Outcome.REJECTED])),
)
def test_each_message_keeps_its_own_outcome_in_any_order(outcomes: tuple[Outcome, ...]) -> None:
    """One leg per message: the receipt reports the worst, each message its own."""
    r = Receipt(3)
    r.add_legs(3)
    r.seal()
    for i, o in enumerate(outcomes):
        r.settle(i, o, f"reason {o.name}")
    assert r.outcome is Outcome.REJECTED
    assert r.reason == "reason REJECTED"
    assert [res.outcome for res in r.results()] == list(outcomes)
    for i, o in enumerate(outcomes):
        assert r.result(i).reason == ("" if o is Outcome.DELIVERED else f"reason {o.name}")


@pytest.mark.parametrize(
    ("legs", "expected"),
    [
        ([Outcome.DELIVERED, Outcome.FAILED], Outcome.FAILED),
        ([Outcome.FAILED, Outcome.DELIVERED], Outcome.FAILED),
        ([Outcome.FAILED, Outcome.REJECTED], Outcome.REJECTED),
        ([Outcome.REJECTED, Outcome.FAILED], Outcome.REJECTED),
        ([Outcome.DELIVERED, Outcome.DELIVERED], Outcome.DELIVERED),
    ],
)
def test_fan_out_reports_worst(legs: list[Outcome], expected: Outcome) -> None:
    r = Receipt(1)
    r.add_legs(len(legs))
    for o in legs:
        r.settle(0, o)
    r.seal()
    assert r.outcome is expected
    assert r.result(0).outcome is expected


def test_worst_outcome_and_reason_per_message_and_overall() -> None:
    """Two legs per message (two groups, say): each message reports its own worst
    leg and reason; the receipt reports the worst of all."""
    r = Receipt(4)
    r.add_legs(8)
    r.seal()
    r.settle_range(0, 4, Outcome.DELIVERED)  # the first group acked everything
    r.settle(0, Outcome.FAILED, "m0 timed out")
    r.settle(1, Outcome.REJECTED, "m1 malformed")
    r.settle(2, Outcome.DELIVERED, "fine")
    assert not r.done()
    r.settle(3, Outcome.FAILED, "m3 busy")
    assert r.outcome is Outcome.REJECTED
    assert r.reason == "m1 malformed"
    assert r.results() == [
        Result(Outcome.FAILED, "m0 timed out"),
        Result(Outcome.REJECTED, "m1 malformed"),
        Result(),
        Result(Outcome.FAILED, "m3 busy"),
    ]


def test_reason_is_the_worst_legs_reason() -> None:
    r = Receipt(3)
    r.add_legs(3)
    r.settle(0, Outcome.FAILED, "try again")
    r.settle(1, Outcome.REJECTED, "too large")
    r.settle(2, Outcome.FAILED, "try again later")
    r.seal()
    assert r.outcome is Outcome.REJECTED
    assert r.reason == "too large"
    assert [res.reason for res in r.results()] == ["try again", "too large", "try again later"]


def test_delivered_leg_reason_is_ignored() -> None:
    r = Receipt(1)
    r.add_legs()
    r.settle(0, Outcome.DELIVERED, "fine")
    r.seal()
    assert r.outcome is Outcome.DELIVERED
    assert r.reason == ""
    assert r.result(0) == Result()


def test_result_index_out_of_range_raises() -> None:
    r = Receipt(2)
    r.seal()
    assert r.result(1) == Result()
    with pytest.raises(IndexError):
        r.result(2)
    with pytest.raises(IndexError):
        r.result(-1)


# -- the fast path: nothing per message while everything is delivered ------------------


def test_all_delivered_needs_no_per_message_objects() -> None:
    """A large window that settles plainly delivered: every result is the one shared
    ``Result()``, not an object per message."""
    n = 10_000
    r = Receipt(n)
    r.add_legs(2 * n)
    r.seal()
    r.settle_range(0, n, Outcome.DELIVERED)
    for lo in range(0, n, 1000):
        r.settle_range(lo, lo + 1000, Outcome.DELIVERED)
    assert r.outcome is Outcome.DELIVERED
    results = r.results()
    assert len(results) == n
    assert results[0] == Result()
    assert all(res is results[0] for res in results), "a result object per message"
    res = results[0]
    assert (res.outcome, res.reason, res.code, res.reply) == (Outcome.DELIVERED, "", None, None)
    assert dict(res.details) == {}
    assert dict(res.positions) == {}
    assert res.position is None


def test_one_failure_in_a_large_window_marks_only_its_message() -> None:
    n = 5000
    r = Receipt(n)
    r.add_legs(n)
    r.seal()
    r.settle_range(0, 1234, Outcome.DELIVERED)
    r.settle(1234, Outcome.FAILED, "disk full")
    r.settle_range(1235, n, Outcome.DELIVERED)
    assert r.outcome is Outcome.FAILED
    results = r.results()
    assert results[1234] == Result(Outcome.FAILED, "disk full")
    assert results[:1234] == [Result()] * 1234
    assert results[1235:] == [Result()] * (n - 1235)


def test_failed_and_positions_in_agree_with_the_results() -> None:
    """What a worker answers another with is read without a result per message."""
    r = Receipt(6)
    r.add_legs(12)  # two targets: a log and a topic
    r.seal()
    r.settle_stored(0, "log", [Position(10 + i, 1) for i in range(3)])
    r.settle_stored(4, "log", [Position(20, 1), Position(21, 1)])
    r.settle(3, Outcome.REJECTED, "too large")
    r.settle_range(0, 2, Outcome.DELIVERED)  # the topic's leg of each
    r.settle(2, Outcome.FAILED, "busy")
    r.settle_range(3, 6, Outcome.DELIVERED)
    results = r.results()
    undelivered = [i for i, res in enumerate(results) if res.outcome is not Outcome.DELIVERED]
    assert r.failed() == undelivered
    assert r.failed() == [2, 3]
    assert r.positions_in("log") == [res.positions.get("log") for res in results]
    assert r.positions_in("topic") == [None] * 6
    clean = Receipt(2)
    clean.add_legs(2)
    clean.seal()
    clean.settle_range(0, 2, Outcome.DELIVERED)
    assert clean.failed() == []


# -- neutral legs ---------------------------------------------------------------------


def test_only_neutral_legs_settle_delivered() -> None:
    r = Receipt(1)
    r.add_legs(2)
    r.seal()
    r.settle(0, None)
    assert not r.done()
    r.settle(0, None)
    assert r.outcome is Outcome.DELIVERED
    assert r.result(0) == Result()


def test_neutral_leg_does_not_hide_a_failure() -> None:
    r = Receipt(1)
    r.add_legs(3)
    r.seal()
    r.settle(0, Outcome.FAILED, "nope")
    r.settle(0, None)
    r.settle(0, Outcome.DELIVERED)
    assert r.outcome is Outcome.FAILED
    assert r.reason == "nope"
    assert r.result(0) == Result(Outcome.FAILED, "nope")


def test_neutral_leg_still_counts_as_pending_until_settled() -> None:
    r = Receipt(1)
    r.add_legs(2)
    r.seal()
    r.settle(0, Outcome.DELIVERED)
    assert not r.done()
    r.settle(0, None)
    assert r.done()


def test_neutral_range_settles_legs_without_an_outcome() -> None:
    r = Receipt(3)
    r.add_legs(6)
    r.seal()
    r.settle_range(0, 3, None)  # one group left: its copies were not needed
    assert not r.done()
    r.settle_range(0, 3, Outcome.DELIVERED)
    assert r.outcome is Outcome.DELIVERED
    assert r.results() == [Result()] * 3


# -- positions, codes and details -------------------------------------------------------


def test_settle_stored_records_each_messages_position() -> None:
    r = Receipt(3)
    r.add_legs(3)
    r.seal()
    r.settle_stored(0, "events", [Position(10), Position(11), Position(12, partition=1)])
    assert r.outcome is Outcome.DELIVERED
    for i, expected in enumerate([Position(10), Position(11), Position(12, partition=1)]):
        res = r.result(i)
        assert res.outcome is Outcome.DELIVERED
        assert res.position == expected
        assert dict(res.positions) == {"events": expected}


def test_settle_stored_from_an_offset_covers_only_its_messages() -> None:
    """A log stored messages 1 and 2 of the publish; message 0 went elsewhere."""
    r = Receipt(3)
    r.add_legs(3)
    r.settle(0, Outcome.DELIVERED)
    r.settle_stored(1, "events", [Position(7), Position(8)])
    r.seal()
    assert r.outcome is Outcome.DELIVERED
    assert r.result(0) == Result()
    assert r.result(0).position is None
    assert [r.result(i).position for i in (1, 2)] == [Position(7), Position(8)]


def test_positions_in_two_destinations() -> None:
    """Routed to two logs: each message has a position in each, so no single one."""
    r = Receipt(2)
    r.add_legs(4)
    r.seal()
    r.settle_stored(0, "a", [Position(1), Position(2)])
    r.settle_stored(0, "b", [Position(40), Position(41)])
    assert r.outcome is Outcome.DELIVERED
    for i in range(2):
        res = r.result(i)
        assert dict(res.positions) == {"a": Position(1 + i), "b": Position(40 + i)}
        assert res.position is None


def test_stored_message_that_failed_elsewhere_keeps_its_position() -> None:
    r = Receipt(2)
    r.add_legs(4)
    r.seal()
    r.settle_stored(0, "log", [Position(5), Position(6)])
    r.settle(0, Outcome.DELIVERED)
    r.settle(1, Outcome.FAILED, "the topic's subscriber gave up")
    assert r.outcome is Outcome.FAILED
    assert r.result(0) == Result(positions={"log": Position(5)})
    res = r.result(1)
    assert (res.outcome, res.reason, res.position) == (
        Outcome.FAILED,
        "the topic's subscriber gave up",
        Position(6),
    )


def test_code_and_details_are_kept_per_message() -> None:
    r = Receipt(3)
    r.add_legs(3)
    r.seal()
    r.settle(0, Outcome.DELIVERED)
    r.settle(1, Outcome.REJECTED, "bad field", code=3, details={"field": "ts"})
    r.settle(2, Outcome.DELIVERED, code=0)
    assert r.outcome is Outcome.REJECTED
    assert r.result(0) == Result()
    res = r.result(1)
    assert (res.outcome, res.reason, res.code) == (Outcome.REJECTED, "bad field", 3)
    assert dict(res.details) == {"field": "ts"}
    assert r.result(2).code == 0
    assert r.result(2).outcome is Outcome.DELIVERED
    assert dict(r.result(2).details) == {}


# -- settled up front ---------------------------------------------------------------------


@pytest.mark.parametrize("outcome", list(Outcome))
def test_settled_constructor(outcome: Outcome) -> None:
    r = Receipt.settled(outcome, "why")
    assert r.done()
    assert r.outcome is outcome
    assert r.reason == "why"
    with pytest.raises(RuntimeError):
        r.add_legs()


@pytest.mark.parametrize("outcome", [Outcome.FAILED, Outcome.REJECTED])
def test_settled_constructor_gives_every_message_the_outcome(outcome: Outcome) -> None:
    r = Receipt.settled(outcome, "refused up front", count=3)
    assert r.outcome is outcome
    assert r.count == 3
    assert r.results() == [Result(outcome, "refused up front")] * 3


def test_settled_delivered_with_a_count_has_plain_results() -> None:
    r = Receipt.settled(Outcome.DELIVERED, count=3)
    assert r.outcome is Outcome.DELIVERED
    assert r.results() == [Result()] * 3


# -- calls ----------------------------------------------------------------------------------


def test_call_receipt() -> None:
    r = Receipt.for_call(12.5)
    assert r.is_call
    assert r.reply_by == 12.5
    assert r.count == 1
    assert not r.done()


def test_first_reply_settles_a_call_at_once_with_legs_pending() -> None:
    seen: list[Reply | None] = []
    r = Receipt.for_call(10.0)
    r.add_done_callback(lambda rc: seen.append(rc.reply))
    r.add_legs(3)
    answer = Reply(b"42", {"k": "v"}, "text/plain")
    r.settle(0, Outcome.DELIVERED, reply=answer)
    assert r.outcome is Outcome.DELIVERED, "the first reply answers the call"
    assert r.reply == answer
    assert r.result(0) == Result(reply=answer)
    assert seen == [answer]
    # The other copies settle later (or are dropped): nothing changes.
    r.settle(0, Outcome.DELIVERED, reply=Reply(b"second"))
    r.settle(0, Outcome.FAILED, "the other group gave up")
    r.seal()
    assert r.outcome is Outcome.DELIVERED
    assert r.reason == ""
    assert r.reply == answer
    assert r.result(0).reply == answer
    assert seen == [answer]


def test_reply_after_other_legs_settled_still_wins() -> None:
    r = Receipt.for_call(10.0)
    r.add_legs(2)
    r.seal()
    r.settle(0, Outcome.DELIVERED)  # acked without a reply
    assert not r.done()
    r.settle(0, Outcome.DELIVERED, reply=Reply(b"ok"))
    assert r.outcome is Outcome.DELIVERED
    assert r.reply == Reply(b"ok")


@pytest.mark.parametrize("legs", [[Outcome.DELIVERED], [Outcome.DELIVERED, None], [None]])
def test_call_whose_legs_all_settle_without_a_reply_fails(legs: list[Outcome | None]) -> None:
    r = Receipt.for_call(10.0)
    r.add_legs(len(legs))
    r.seal()
    for o in legs:
        assert not r.done()
        r.settle(0, o)
    assert r.outcome is Outcome.FAILED
    assert r.reason == "the call was settled without a reply"
    assert r.reply is None
    assert r.result(0) == Result(Outcome.FAILED, "the call was settled without a reply")


def test_call_nacked_without_a_reply_fails_with_the_nacks_reason() -> None:
    r = Receipt.for_call(10.0)
    r.add_legs()
    r.seal()
    r.settle(0, Outcome.REJECTED, "no such method")
    assert r.outcome is Outcome.REJECTED
    assert r.reason == "no such method"


def test_call_with_no_legs_fails_no_subscriber() -> None:
    r = Receipt.for_call(10.0)
    r.seal()
    assert r.outcome is Outcome.FAILED
    assert r.reason == "no subscriber to answer the call"
    assert r.result(0) == Result(Outcome.FAILED, "no subscriber to answer the call")


def test_expire_fails_the_call_at_once_and_later_legs_change_nothing() -> None:
    seen: list[Outcome | None] = []
    r = Receipt.for_call(10.0)
    r.add_done_callback(lambda rc: seen.append(rc.outcome))
    r.add_legs(2)
    r.expire("no reply within 10s")
    assert r.outcome is Outcome.FAILED
    assert r.reason == "no reply within 10s"
    assert r.result(0) == Result(Outcome.FAILED, "no reply within 10s")
    assert seen == [Outcome.FAILED]
    # A late reply, a late ack, more legs and the seal: nothing changes.
    r.settle(0, Outcome.DELIVERED, reply=Reply(b"too late"))
    r.add_legs()
    r.settle_range(0, 1, Outcome.REJECTED, "late rejection")
    r.settle(0, Outcome.DELIVERED)
    r.seal()
    r.expire("again")
    assert r.outcome is Outcome.FAILED
    assert r.reason == "no reply within 10s"
    assert r.reply is None
    assert r.result(0) == Result(Outcome.FAILED, "no reply within 10s")
    assert seen == [Outcome.FAILED]


def test_expire_after_the_reply_changes_nothing() -> None:
    r = Receipt.for_call(10.0)
    r.add_legs()
    r.settle(0, Outcome.DELIVERED, reply=Reply(b"in time"))
    r.expire("no reply within 10s")
    assert r.outcome is Outcome.DELIVERED
    assert r.reply == Reply(b"in time")
    assert r.result(0).reply == Reply(b"in time")


async def test_wait_returns_when_a_call_expires() -> None:
    r = Receipt.for_call(10.0)
    r.add_legs()
    r.seal()
    async with trio.open_nursery() as nursery:
        results: list[Outcome] = []

        async def waiter() -> None:
            results.append(await r.wait())

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert results == []
        r.expire("deadline")
    assert results == [Outcome.FAILED]


# -- callbacks, wait, repr ------------------------------------------------------------------


def test_callback_runs_once_at_settlement() -> None:
    seen: list[Receipt] = []
    r = Receipt(1)
    r.add_legs()
    r.add_done_callback(seen.append)
    r.seal()
    assert seen == []
    r.settle(0, Outcome.DELIVERED)
    assert seen == [r]
    r.seal()  # sealing again must not call back a second time
    assert seen == [r]


def test_callbacks_run_in_registration_order_and_see_the_outcome() -> None:
    calls: list[tuple[str, Outcome | None]] = []
    r = Receipt(1)
    r.add_legs()
    r.add_done_callback(lambda rc: calls.append(("a", rc.outcome)))
    r.add_done_callback(lambda rc: calls.append(("b", rc.outcome)))
    r.seal()
    r.settle(0, Outcome.REJECTED)
    assert calls == [("a", Outcome.REJECTED), ("b", Outcome.REJECTED)]


def test_callback_on_settled_receipt_runs_immediately() -> None:
    seen: list[Outcome | None] = []
    r = Receipt.settled(Outcome.FAILED)
    r.add_done_callback(lambda rc: seen.append(rc.outcome))
    assert seen == [Outcome.FAILED]


async def test_wait_returns_outcome_once_settled() -> None:
    r = Receipt(1)
    r.add_legs()
    r.seal()
    results: list[Outcome] = []

    async def waiter() -> None:
        results.append(await r.wait())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        assert results == [], "wait() returned before the receipt settled"
        r.settle(0, Outcome.FAILED)
    assert results == [Outcome.FAILED, Outcome.FAILED]


async def test_wait_on_settled_receipt_returns_at_once() -> None:
    r = Receipt.settled(Outcome.REJECTED)
    with trio.fail_after(1):
        assert await r.wait() is Outcome.REJECTED


def test_repr_shows_state() -> None:
    r = Receipt(2)
    r.add_legs(2)
    assert "pending=2" in repr(r)
    r.settle_range(0, 2, Outcome.DELIVERED)
    r.seal()
    assert "DELIVERED" in repr(r)


# -- property: the worst leg wins, per message and overall -----------------------------------

_LEG = st.sampled_from([None, *Outcome])


@st.composite
def _settlements(draw: st.DrawFn) -> tuple[int, list[list[Outcome | None]], list[int], int]:
    """Messages, the legs of each, an order to settle them in, and when to seal."""
    count = draw(st.integers(min_value=1, max_value=5))
    legs = [draw(st.lists(_LEG, max_size=3)) for _ in range(count)]
    total = sum(map(len, legs))
    order = draw(st.permutations(range(total)))
    seal_at = draw(st.integers(min_value=0, max_value=total))
    return count, legs, order, seal_at


@given(_settlements())
def test_outcome_is_max_of_non_neutral_legs(
    case: tuple[int, list[list[Outcome | None]], list[int], int],
) -> None:
    """Whatever the order of settling and sealing, the receipt settles exactly when the
    last pending leg settles after the seal; each message's result is the worst of its
    non-neutral legs, with the reason of such a leg, and the receipt's the worst of all."""
    count, legs, order, seal_at = case
    flat = [(i, k, o) for i, ls in enumerate(legs) for k, o in enumerate(ls)]
    r = Receipt(count)
    r.add_legs(len(flat))
    for step, j in enumerate(order):
        if step == seal_at:
            r.seal()
        assert not r.done()
        i, k, o = flat[j]
        r.settle(i, o, f"{i}.{k}")
    if seal_at == len(flat):
        assert not r.done()
        r.seal()
    assert r.done()

    def worst(outcomes: list[Outcome | None]) -> Outcome:
        return max((o for o in outcomes if o is not None), default=Outcome.DELIVERED)

    assert r.outcome is worst([o for _, _, o in flat])
    if r.outcome is not Outcome.DELIVERED:
        assert r.reason in {f"{i}.{k}" for i, k, o in flat if o is r.outcome}
    results = r.results()
    assert len(results) == count
    for i, res in enumerate(results):
        assert res.outcome is worst(legs[i]), f"message {i}"
        if res.outcome is Outcome.DELIVERED:
            assert res == Result()
        else:
            assert res.reason in {f"{i}.{k}" for k, o in enumerate(legs[i]) if o is res.outcome}


@given(
    count=st.integers(min_value=1, max_value=6),
    ranges=st.lists(
        st.tuples(st.integers(0, 6), st.integers(0, 6), _LEG),
        max_size=6,
    ),
)
def test_ranges_settle_like_single_legs(
    count: int, ranges: list[tuple[int, int, Outcome | None]]
) -> None:
    """``settle_range`` is one ``settle`` per message of the range."""
    ranges = [(min(a, count), min(max(a, b), count), o) for a, b, o in ranges]
    by_range, by_leg = Receipt(count), Receipt(count)
    legs = sum(b - a for a, b, _ in ranges)
    for r in (by_range, by_leg):
        r.add_legs(legs)
        r.seal()
    for a, b, o in ranges:
        by_range.settle_range(a, b, o, "why")
        for i in range(a, b):
            by_leg.settle(i, o, "why")
    assert by_range.done()
    assert by_leg.done()
    assert by_range.outcome is by_leg.outcome
    assert by_range.results() == by_leg.results()
