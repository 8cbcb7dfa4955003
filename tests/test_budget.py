"""The gateway-wide memory budget: destinations share it, so their count cannot
multiply ``buffer_bytes``, and nothing is dropped when it runs out."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from harness import receive_now, settle, start
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.budget import MemoryBudget
from gateway.destination import Subscription
from gateway.hub import Hub, HubLimits
from gateway.model import MESSAGE_OVERHEAD, Message, Outcome
from gateway.topic import Topic, TopicLimits

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
    from gateway.receipts import Receipt

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
        from gateway.receipts import Receipt

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
