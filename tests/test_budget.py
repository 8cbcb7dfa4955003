"""The gateway-wide memory budget: destinations share it, so their count cannot
multiply ``buffer_bytes``, and nothing is dropped when it runs out."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from harness import receive_now, settle, start
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gateway.core.budget
from gateway.core.budget import MemoryBudget
from gateway.core.destination import Subscription
from gateway.core.hub import Hub, HubLimits
from gateway.core.model import MESSAGE_OVERHEAD, Message, Outcome
from gateway.core.topic import Topic, TopicLimits

KIB = 1024


def msg(destination: str, size: int = KIB) -> Message:
    return Message(destination, b"x" * (size - MESSAGE_OVERHEAD))


def test_an_account_charges_what_it_holds_and_releases_it() -> None:
    budget = MemoryBudget(100)
    a, b = budget.account(80), budget.account(80)
    a.hold(60)
    b.hold(30)
    assert (budget.used, budget.exhausted) == (90, False)
    a.hold(75)
    assert (budget.used, budget.exhausted, budget.peak) == (105, True, 105)
    a.close()
    b.hold(0)
    assert (budget.used, budget.peak) == (0, 105)
    with pytest.raises(ValueError, match="at least 1 byte"):
        MemoryBudget(0)


def test_anything_fits_an_empty_budget() -> None:
    """A message larger than the whole budget must not wait forever."""
    budget = MemoryBudget(10)
    assert budget.fits(1000)
    budget.charge(1)
    assert not budget.fits(10)
    assert budget.fits(9)


async def test_many_destinations_share_one_budget() -> None:
    """100 destinations of 64 KiB each (6.4 MiB) hold at most the 256 KiB budget."""
    budget = MemoryBudget(256 * KIB)
    hub = Hub(limits=HubLimits(buffer_bytes=64 * KIB), budget=budget)
    subs = {f"d{i}": hub.subscribe(f"d{i}", max_unacked=10_000) for i in range(100)}
    async with trio.open_nursery() as nursery:
        tasks = [start(nursery, hub.publish, [msg(name)] * 8) for name in subs]
        await settle()
        assert budget.used <= budget.limit
        waiting = [t for t in tasks if not t.done]
        assert waiting, "the budget never made a publisher wait"
        # Consumers take and ack everything, so each waiting publisher gets in.
        while not all(t.done for t in tasks):
            for sub in subs.values():
                for d in await receive_now(sub):
                    sub.ack(d.tag)
            await settle()
            assert budget.used <= budget.limit
        for sub in subs.values():
            for d in await receive_now(sub):
                sub.ack(d.tag)
        receipts = [t.result for t in tasks]
        assert all(r.outcome is Outcome.DELIVERED for r in receipts)
        assert budget.used == 0
        assert budget.peak <= budget.limit


async def test_a_full_budget_holds_publishes_never_drops_them() -> None:
    budget = MemoryBudget(8 * KIB)
    hub = Hub(limits=HubLimits(buffer_bytes=64 * KIB), budget=budget)
    sub = hub.subscribe("a", max_unacked=1000)
    other = hub.subscribe("b", max_unacked=1000)
    async with trio.open_nursery() as nursery:
        first = start(nursery, hub.publish, [msg("a")] * 8)
        await settle()
        assert first.done
        blocked = start(nursery, hub.publish, [msg("b")])
        await settle()
        assert not blocked.done  # another destination, but the same budget
        deliveries = await receive_now(sub, 1)
        sub.ack(deliveries[0].tag)
        await settle()
        assert blocked.done
        assert len(await receive_now(other)) == 1


async def test_a_group_leaving_keeps_the_count_exact() -> None:
    """Copies handed over to the backlog or another group are charged once."""
    budget = MemoryBudget(10**9)
    topic = Topic("t", TopicLimits(64 * KIB, 1000, budget))
    first = topic.subscribe(None)
    second = topic.subscribe("g")
    from gateway.core.receipts import Receipt

    receipt = Receipt()
    await topic.put_many([msg("t")] * 4, receipt)
    receipt.seal()
    assert budget.used == 8 * KIB  # two groups, four copies each
    first.close()  # an anonymous group leaves: its copies also held by "g" are dropped
    assert budget.used == 4 * KIB
    for d in await receive_now(second):
        second.ack(d.tag)
    assert budget.used == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["pub", "take", "ack", "nack", "close", "join"]),
            st.integers(0, 2),
            st.integers(1, 5),
        ),
        max_size=40,
    )
)
def test_the_budget_always_equals_what_groups_hold(ops: list[tuple[str, int, int]]) -> None:
    async def main() -> None:
        budget = MemoryBudget(10**9)
        topic = Topic("t", TopicLimits(64 * KIB, 1000, budget))
        subs: list[Subscription | None] = [topic.subscribe(None), topic.subscribe("g"), None]
        from gateway.core.receipts import Receipt

        for op, i, n in ops:
            sub = subs[i]
            if op == "pub":
                receipt = Receipt()
                with trio.move_on_after(0):
                    await topic.put_many([msg("t")] * n, receipt)
                receipt.seal()
            elif op == "join" and sub is None:
                subs[i] = topic.subscribe(None if i == 0 else f"g{i}")
            elif sub is None:
                continue
            elif op == "take":
                for d in await receive_now(sub, n):
                    if n % 2:
                        sub.ack(d.tag)
            elif op == "ack":
                for d in await receive_now(sub):
                    sub.ack(d.tag)
            elif op == "nack":
                for d in await receive_now(sub, n):
                    sub.nack(d.tag)
            elif op == "close":
                sub.close()
                subs[i] = None
            held = sum(g["held_bytes"] for g in topic.stats()["groups"].values())  # type: ignore[attr-defined]
            held += topic._backlog.used_bytes
            assert budget.used == held

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# -- what a connection may take on -----------------------------------------------------


def test_room_is_what_the_budget_has_left_but_never_less_than_the_floor() -> None:
    budget = MemoryBudget(100)
    a, b = budget.account(100), budget.account(100)
    assert a.room() > budget.limit  # an empty budget: anything fits
    a.hold(30)
    assert a.room() > budget.limit  # its only holder is bounded by its own limit alone
    b.hold(60)
    assert (a.room(), b.room(), a.room(floor=50)) == (10, 10, 20)
    b.hold(90)
    assert (a.room(), a.room(floor=50), a.room(floor=10)) == (-20, 20, -20)


def test_only_a_holder_above_its_floor_in_an_exhausted_budget_waits() -> None:
    budget = MemoryBudget(100)
    a, b = budget.account(100), budget.account(100)
    a.hold(120)
    assert not a.must_wait()  # alone: nothing else could ever make room for it
    b.hold(1)
    assert a.must_wait()
    assert a.must_wait(floor=119)
    assert not a.must_wait(floor=120)
    assert not b.must_wait(floor=1)
    a.hold(90)
    assert not a.must_wait()  # 91 < 100


async def test_a_waiting_holder_goes_on_once_another_releases() -> None:
    budget = MemoryBudget(100)
    a, b = budget.account(100), budget.account(100)
    a.hold(60)
    b.hold(50)
    async with trio.open_nursery() as nursery:
        waiting = start(nursery, a.wait_for_room, 10)
        await settle()
        assert not waiting.done
        b.hold(30)
        await settle()
        assert waiting.done


# -- giving freed memory back ----------------------------------------------------------


async def test_a_large_release_trims_the_heap_once_per_interval(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    trims: list[float] = []
    monkeypatch.setattr(gateway.core.budget, "trim_heap", lambda: trims.append(trio.current_time()))
    budget = MemoryBudget(10**9, trim_after=100)
    account = budget.account(10**9)
    account.hold(1000)
    account.hold(950)  # 50 below the level: no trim
    await trio.sleep(5)
    assert trims == []
    assert budget.trims == 0
    start_at = trio.current_time()
    account.hold(800)  # 200 below the level of 1000: trimmed after the interval
    account.hold(0)  # the same burst: trimmed once
    await trio.sleep(gateway.core.budget.TRIM_INTERVAL / 2)
    assert trims == []
    await trio.sleep(gateway.core.budget.TRIM_INTERVAL)
    assert trims == [start_at + gateway.core.budget.TRIM_INTERVAL]
    assert budget.trims == 1
    account.hold(1000)
    account.hold(0)  # a new level, a new release: trimmed again, a second later
    await trio.sleep(5 * gateway.core.budget.TRIM_INTERVAL)
    assert len(trims) == 2
    account.hold(50)
    account.hold(0)  # small: not trimmed
    await trio.sleep(5 * gateway.core.budget.TRIM_INTERVAL)
    assert len(trims) == 2


def test_the_heap_can_be_trimmed() -> None:
    assert gateway.core.budget.trim_heap() is (gateway.core.budget._TRIM is not None)


def test_a_budget_outside_trio_releases_without_trimming() -> None:
    budget = MemoryBudget(10**9, trim_after=1)
    budget.charge(100)
    budget.release(100)
    assert (budget.used, budget.trims) == (0, 0)


def test_a_receive_buffer_says_what_it_really_holds() -> None:
    """Parsed bytes stay until they are half the buffer: what it holds is up to twice
    what is left to parse, and that is what a codec charges."""
    from gateway.sdk import ReceiveBuffer

    buf = ReceiveBuffer()
    assert buf.allocated == 0
    buf.feed(b"x" * 1000)
    buf.advance(400)  # under half: kept
    assert len(buf) == 600
    assert buf.allocated >= 1000
    buf.advance(1000)  # all parsed: dropped
    assert (len(buf), buf.allocated) == (0, 0)
