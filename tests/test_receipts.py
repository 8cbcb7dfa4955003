"""Receipts: legs, sealing, worst-outcome-wins, neutral legs, callbacks and wait()."""

from __future__ import annotations

import itertools

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from gateway.model import Outcome
from gateway.receipts import Receipt


def test_new_receipt_is_pending() -> None:
    r = Receipt()
    assert r.outcome is None
    assert not r.done()
    assert r.reason == ""


def test_seal_without_legs_settles_delivered() -> None:
    r = Receipt()
    r.seal()
    assert r.done()
    assert r.outcome is Outcome.DELIVERED


def test_settles_only_when_sealed_and_every_leg_settled() -> None:
    r = Receipt()
    r.add_legs(2)
    r.add_legs()
    r.settle_leg(Outcome.DELIVERED)
    r.settle_leg(Outcome.DELIVERED)
    r.seal()
    assert not r.done(), "one of three legs is still pending"
    r.settle_leg(Outcome.DELIVERED)
    assert r.outcome is Outcome.DELIVERED


def test_all_legs_settled_before_seal_waits_for_seal() -> None:
    """A publish may still add copies: settling every leg so far is not enough."""
    r = Receipt()
    r.add_legs()
    r.settle_leg(Outcome.DELIVERED)
    assert not r.done()
    r.add_legs()
    r.settle_leg(Outcome.FAILED, "later leg")
    assert not r.done()
    r.seal()
    assert r.outcome is Outcome.FAILED


def test_add_legs_after_seal_raises() -> None:
    r = Receipt()
    r.add_legs()
    r.seal()
    with pytest.raises(RuntimeError):
        r.add_legs()


@pytest.mark.parametrize(
    "outcomes",
    list(itertools.permutations([Outcome.DELIVERED, Outcome.FAILED, Outcome.REJECTED])),
)
def test_worst_outcome_wins_in_any_order(outcomes: tuple[Outcome, ...]) -> None:
    r = Receipt()
    r.add_legs(len(outcomes))
    r.seal()
    for o in outcomes:
        r.settle_leg(o, f"reason {o.name}")
    assert r.outcome is Outcome.REJECTED
    assert r.reason == "reason REJECTED"


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
    r = Receipt()
    r.add_legs(len(legs))
    for o in legs:
        r.settle_leg(o)
    r.seal()
    assert r.outcome is expected


def test_reason_is_the_worst_legs_reason() -> None:
    r = Receipt()
    r.add_legs(3)
    r.settle_leg(Outcome.FAILED, "try again")
    r.settle_leg(Outcome.REJECTED, "too large")
    r.settle_leg(Outcome.FAILED, "try again later")
    r.seal()
    assert r.outcome is Outcome.REJECTED
    assert r.reason == "too large"


def test_delivered_leg_reason_is_ignored() -> None:
    r = Receipt()
    r.add_legs()
    r.settle_leg(Outcome.DELIVERED, "fine")
    r.seal()
    assert r.outcome is Outcome.DELIVERED
    assert r.reason == ""


def test_only_neutral_legs_settle_delivered() -> None:
    r = Receipt()
    r.add_legs(2)
    r.seal()
    r.settle_leg(None)
    assert not r.done()
    r.settle_leg(None)
    assert r.outcome is Outcome.DELIVERED


def test_neutral_leg_does_not_hide_a_failure() -> None:
    r = Receipt()
    r.add_legs(3)
    r.seal()
    r.settle_leg(Outcome.FAILED, "nope")
    r.settle_leg(None)
    r.settle_leg(Outcome.DELIVERED)
    assert r.outcome is Outcome.FAILED
    assert r.reason == "nope"


def test_neutral_leg_still_counts_as_pending_until_settled() -> None:
    r = Receipt()
    r.add_legs(2)
    r.seal()
    r.settle_leg(Outcome.DELIVERED)
    assert not r.done()
    r.settle_leg(None)
    assert r.done()


@pytest.mark.parametrize("outcome", list(Outcome))
def test_settled_constructor(outcome: Outcome) -> None:
    r = Receipt.settled(outcome, "why")
    assert r.done()
    assert r.outcome is outcome
    assert r.reason == "why"
    with pytest.raises(RuntimeError):
        r.add_legs()


def test_callback_runs_once_at_settlement() -> None:
    seen: list[Receipt] = []
    r = Receipt()
    r.add_legs()
    r.add_done_callback(seen.append)
    r.seal()
    assert seen == []
    r.settle_leg(Outcome.DELIVERED)
    assert seen == [r]
    r.seal()  # sealing again must not call back a second time
    assert seen == [r]


def test_callbacks_run_in_registration_order_and_see_the_outcome() -> None:
    calls: list[tuple[str, Outcome | None]] = []
    r = Receipt()
    r.add_legs()
    r.add_done_callback(lambda rc: calls.append(("a", rc.outcome)))
    r.add_done_callback(lambda rc: calls.append(("b", rc.outcome)))
    r.seal()
    r.settle_leg(Outcome.REJECTED)
    assert calls == [("a", Outcome.REJECTED), ("b", Outcome.REJECTED)]


def test_callback_on_settled_receipt_runs_immediately() -> None:
    seen: list[Outcome | None] = []
    r = Receipt.settled(Outcome.FAILED)
    r.add_done_callback(lambda rc: seen.append(rc.outcome))
    assert seen == [Outcome.FAILED]


async def test_wait_returns_outcome_once_settled() -> None:
    r = Receipt()
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
        r.settle_leg(Outcome.FAILED)
    assert results == [Outcome.FAILED, Outcome.FAILED]


async def test_wait_on_settled_receipt_returns_at_once() -> None:
    r = Receipt.settled(Outcome.REJECTED)
    with trio.fail_after(1):
        assert await r.wait() is Outcome.REJECTED


def test_repr_shows_state() -> None:
    r = Receipt()
    r.add_legs(2)
    assert "pending=2" in repr(r)
    r.settle_leg(Outcome.DELIVERED)
    r.settle_leg(Outcome.DELIVERED)
    r.seal()
    assert "DELIVERED" in repr(r)


@given(
    legs=st.lists(st.sampled_from([None, *Outcome]), max_size=8),
    seal_at=st.integers(min_value=0, max_value=8),
)
def test_outcome_is_max_of_non_neutral_legs(legs: list[Outcome | None], seal_at: int) -> None:
    """Whatever the order of settling and sealing, the receipt settles exactly when
    the last pending leg settles after the seal, with the worst non-neutral outcome."""
    seal_at = min(seal_at, len(legs))
    r = Receipt()
    r.add_legs(len(legs))
    for i, o in enumerate(legs):
        if i == seal_at:
            r.seal()
        assert not r.done()
        r.settle_leg(o)
    if seal_at == len(legs):
        assert not r.done()
        r.seal()
    expected = max((o for o in legs if o is not None), default=Outcome.DELIVERED)
    assert r.outcome is expected
