"""The hub and its in-memory topics: fan-out, groups, credit, backpressure, redelivery."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing
from harness import Task, receive_now, settle, start
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.destination import Delivery, Subscription
from gateway.core.filters import Filter
from gateway.core.hub import Hub, HubLimits
from gateway.core.model import MESSAGE_OVERHEAD, Message, Outcome
from gateway.core.receipts import Receipt, Result
from gateway.core.routing import Route, Router
from gateway.core.topic import TopicLimits
from gateway.runtime.catalog import Catalog, DestinationSpec

# -- helpers ------------------------------------------------------------------------


def msg(n: int, destination: str = "t", size: int = 0) -> Message:
    """Message number ``n``; ``size`` pads the body so that ``Message.size == size``."""
    body = f"m{n}".encode()
    if size:
        body = body.ljust(size - MESSAGE_OVERHEAD, b".")
    return Message(destination, body)


def number(d: Delivery) -> int:
    return int(d.message.body.split(b".")[0][1:])


def numbers(deliveries: Sequence[Delivery]) -> list[int]:
    return [number(d) for d in deliveries]


async def receive_all(sub: Subscription, n: int) -> list[Delivery]:
    """Receive exactly ``n`` deliveries (fails the test if they do not come)."""
    out: list[Delivery] = []
    with trio.fail_after(5):
        while len(out) < n:
            out += await sub.receive(n - len(out))
    return out


def ack_all(sub: Subscription, deliveries: Sequence[Delivery]) -> None:
    for d in deliveries:
        sub.ack(d.tag)


def group_stats(hub: Hub, destination: str, group: str | None = None) -> dict[str, Any]:
    stats = hub.destination(destination).stats()
    groups: dict[str, dict[str, Any]] = stats["groups"]  # type: ignore[assignment]
    if group is None:
        (only,) = groups.values()
        return only
    return groups[group]


async def publish_each(hub: Hub, messages: Sequence[Message]) -> list[Receipt]:
    return [await hub.publish([m]) for m in messages]


# -- basic delivery -----------------------------------------------------------------


async def test_subscriber_receives_published_message_and_ack_settles() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    receipt = await hub.publish([Message("t", b"hello", {"k": "v"}, "text/plain")])
    assert not receipt.done()
    (d,) = await receive_all(sub, 1)
    assert d.message == Message("t", b"hello", {"k": "v"}, "text/plain")
    assert d.redelivered is False
    assert not receipt.done(), "settled before the subscriber acked"
    sub.ack(d.tag)
    assert receipt.outcome is Outcome.DELIVERED


async def test_one_receipt_covers_every_message_of_a_publish() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg(1), msg(2), msg(3)])
    got = await receive_all(sub, 3)
    assert numbers(got) == [1, 2, 3]
    sub.ack(got[0].tag)
    sub.ack(got[2].tag)
    assert not receipt.done()
    sub.ack(got[1].tag)
    assert receipt.outcome is Outcome.DELIVERED


async def test_empty_publish_settles_delivered() -> None:
    hub = Hub()
    receipt = await hub.publish([])
    assert receipt.outcome is Outcome.DELIVERED
    assert hub.inflight == 0


async def test_fan_out_to_every_group() -> None:
    hub = Hub()
    a = hub.subscribe("t", "a")
    b = hub.subscribe("t", "b")
    anon = hub.subscribe("t")
    receipts = await publish_each(hub, [msg(i) for i in range(5)])
    got = {name: await receive_all(s, 5) for name, s in [("a", a), ("b", b), ("anon", anon)]}
    for deliveries in got.values():
        assert numbers(deliveries) == [0, 1, 2, 3, 4]
    ack_all(a, got["a"])
    ack_all(b, got["b"])
    assert not any(r.done() for r in receipts), "settled before every group acked"
    ack_all(anon, got["anon"])
    assert all(r.outcome is Outcome.DELIVERED for r in receipts)


async def test_two_anonymous_subscribers_each_get_every_message() -> None:
    hub = Hub()
    s1, s2 = hub.subscribe("t"), hub.subscribe("t")
    await publish_each(hub, [msg(1), msg(2)])
    assert numbers(await receive_all(s1, 2)) == [1, 2]
    assert numbers(await receive_all(s2, 2)) == [1, 2]


async def test_competing_consumers_each_message_to_exactly_one_member() -> None:
    hub = Hub()
    a = hub.subscribe("t", "workers")
    b = hub.subscribe("t", "workers")
    receipts = await publish_each(hub, [msg(i) for i in range(10)])
    got_a = await receive_all(a, 3)
    got_b = await receive_all(b, 7)
    assert await receive_now(a) == []
    assert await receive_now(b) == []
    assert sorted(numbers(got_a) + numbers(got_b)) == list(range(10))
    assert numbers(got_a) == [0, 1, 2]
    assert numbers(got_b) == [3, 4, 5, 6, 7, 8, 9]
    ack_all(a, got_a)
    ack_all(b, got_b)
    assert all(r.outcome is Outcome.DELIVERED for r in receipts)


async def test_member_without_credit_gets_nothing_while_one_with_credit_does() -> None:
    hub = Hub()
    starved = hub.subscribe("t", "workers", credit=0)
    fed = hub.subscribe("t", "workers")
    async with trio.open_nursery() as nursery:
        t_starved = start(nursery, starved.receive)
        t_fed = start(nursery, fed.receive)
        await settle()
        await publish_each(hub, [msg(1), msg(2), msg(3)])
        await settle()
        assert t_fed.done
        assert numbers(t_fed.result) == [1, 2, 3]
        assert not t_starved.done, "a member with no credit received"
        starved.grant(1)
        await publish_each(hub, [msg(4)])
        await settle()
        assert t_starved.done
        assert numbers(t_starved.result) == [4]


async def test_routes_fan_out_and_rename() -> None:
    router = Router([Route("logs.*", ("archive.{1}", "all"))])
    hub = Hub(router=router)
    archive = hub.subscribe("archive.web")
    everything = hub.subscribe("all")
    receipt = await hub.publish([Message("logs.web", b"x", {"h": "1"})])
    (d1,) = await receive_all(archive, 1)
    (d2,) = await receive_all(everything, 1)
    assert d1.message == Message("archive.web", b"x", {"h": "1"})
    assert d2.message.destination == "all"
    assert "logs.web" not in hub.destinations()
    archive.ack(d1.tag)
    assert not receipt.done()
    everything.ack(d2.tag)
    assert receipt.outcome is Outcome.DELIVERED


async def test_upstream_target_keeps_the_published_destination() -> None:
    hub = Hub(router=Router([Route("logs.*", ("upstream:central",))]), upstreams=["central"])
    sub = hub.subscribe("upstream:central", "upstream")
    receipt = await hub.publish([msg(1, "logs.web")])
    (d,) = await receive_all(sub, 1)
    assert d.message.destination == "logs.web"
    sub.ack(d.tag)
    assert receipt.outcome is Outcome.DELIVERED


# -- credit and unacked windows -----------------------------------------------------


async def test_credit_zero_blocks_until_granted() -> None:
    hub = Hub()
    sub = hub.subscribe("t", credit=0)
    assert sub.credit == 0
    await publish_each(hub, [msg(i) for i in range(3)])
    async with trio.open_nursery() as nursery:
        task = start(nursery, sub.receive)
        await settle()
        assert not task.done
        sub.grant(2)
        await settle()
        assert task.done
        assert numbers(task.result) == [0, 1]
    assert sub.credit == 0
    assert await receive_now(sub) == []
    sub.grant(5)
    assert numbers(await receive_now(sub)) == [2]
    assert sub.credit == 4


async def test_credit_is_consumed_per_delivery() -> None:
    hub = Hub()
    sub = hub.subscribe("t", credit=3)
    await publish_each(hub, [msg(i) for i in range(5)])
    assert numbers(await receive_now(sub, 2)) == [0, 1]
    assert sub.credit == 1
    assert numbers(await receive_now(sub)) == [2]
    assert sub.credit == 0
    assert await receive_now(sub) == []


async def test_unlimited_credit() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    assert sub.credit is None
    await publish_each(hub, [msg(i) for i in range(50)])
    assert numbers(await receive_now(sub)) == list(range(50))
    sub.grant(10)
    assert sub.credit is None


async def test_grant_rejects_negative_credit() -> None:
    hub = Hub()
    sub = hub.subscribe("t", credit=1)
    with pytest.raises(ValueError):
        sub.grant(-1)
    assert sub.credit == 1


async def test_max_count_limits_one_receive() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    await publish_each(hub, [msg(i) for i in range(5)])
    assert numbers(await receive_now(sub, 2)) == [0, 1]
    assert numbers(await receive_now(sub, 10)) == [2, 3, 4]


async def test_max_unacked_window() -> None:
    hub = Hub()
    sub = hub.subscribe("t", max_unacked=2)
    await publish_each(hub, [msg(i) for i in range(5)])
    first = await receive_now(sub)
    assert numbers(first) == [0, 1]
    assert sub.unacked == 2
    async with trio.open_nursery() as nursery:
        task = start(nursery, sub.receive)
        await settle()
        assert not task.done, "received past max_unacked"
        sub.ack(first[0].tag)
        await settle()
        assert task.done
        assert numbers(task.result) == [2]
    assert sub.unacked == 2
    sub.nack(first[1].tag, requeue=False)
    assert sub.unacked == 1


async def test_max_unacked_bytes_window() -> None:
    hub = Hub()
    sub = hub.subscribe("t", max_unacked_bytes=700)
    await publish_each(hub, [msg(i, size=300) for i in range(4)])
    first = await receive_now(sub)
    assert numbers(first) == [0, 1], "600 of 700 bytes: a third would exceed the window"
    assert await receive_now(sub) == []
    sub.ack(first[0].tag)
    assert numbers(await receive_now(sub)) == [2]


async def test_message_larger_than_unacked_bytes_window_is_still_delivered_alone() -> None:
    """Otherwise a single large message would stall the subscription for ever."""
    hub = Hub()
    sub = hub.subscribe("t", max_unacked_bytes=100)
    await publish_each(hub, [msg(1, size=500), msg(2, size=500)])
    first = await receive_now(sub)
    assert numbers(first) == [1]
    assert await receive_now(sub) == []
    sub.ack(first[0].tag)
    assert numbers(await receive_now(sub)) == [2]


async def test_invalid_max_unacked_raises() -> None:
    hub = Hub()
    with pytest.raises(ValueError):
        hub.subscribe("t", max_unacked=0)


@pytest.mark.parametrize(
    "bad",
    [
        {"max_unacked": 0},
        {"credit": -1},
        {"start": "earliest"},
        {"end": "latest"},
    ],
    ids=["max_unacked", "credit", "start", "end"],
)
async def test_failed_subscribe_leaves_no_group_behind(bad: dict[str, Any]) -> None:
    """A subscribe that raises must not create a memberless group: such a ghost group
    would adopt the backlog and hold its receipt legs for ever, and would make a topic
    nobody listens to collect new publishes instead of discarding them."""
    hub = Hub()
    anon = hub.subscribe("t")
    r1 = await hub.publish([msg(1)])
    anon.close()  # the last group left: message 1 waits in the backlog
    assert hub.destination("t").stats()["backlog"] == 1
    with pytest.raises(ValueError):
        hub.subscribe("t", **bad)
    with pytest.raises(ValueError):
        hub.subscribe("t", "named", **bad)
    stats = hub.destination("t").stats()
    assert stats["groups"] == {}
    assert stats["backlog"] == 1
    r2 = await hub.publish([msg(2)])
    assert r2.outcome is Outcome.DELIVERED, "nobody listens: discarded, not held"
    assert hub.destination("t").stats()["discarded"] == 1
    sub = hub.subscribe("t")
    r3 = await hub.publish([msg(3)])
    got = await receive_now(sub)
    assert numbers(got) == [1, 3]
    ack_all(sub, got)
    assert r1.outcome is Outcome.DELIVERED
    assert r3.outcome is Outcome.DELIVERED


# -- acks, nacks and receipts -------------------------------------------------------


async def test_ack_of_unknown_tag_raises_key_error() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    with pytest.raises(KeyError):
        sub.ack(12345)
    with pytest.raises(KeyError):
        sub.nack(12345)


async def test_double_ack_raises_key_error() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    await hub.publish([msg(1)])
    (d,) = await receive_now(sub)
    sub.ack(d.tag)
    with pytest.raises(KeyError):
        sub.ack(d.tag)
    with pytest.raises(KeyError):
        sub.nack(d.tag)


async def test_nack_requeue_redelivers_first() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg(1), msg(2)])
    d1, d2 = await receive_now(sub)
    sub.nack(d1.tag)
    (again,) = await receive_now(sub)
    assert number(again) == 1
    assert again.redelivered is True
    assert again.tag != d1.tag
    assert not receipt.done()
    sub.ack(again.tag)
    sub.ack(d2.tag)
    assert receipt.outcome is Outcome.DELIVERED


async def test_nack_without_requeue_settles_the_leg() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg(1)])
    (d,) = await receive_now(sub)
    sub.nack(d.tag, requeue=False, outcome=Outcome.REJECTED, reason="malformed")
    assert receipt.outcome is Outcome.REJECTED
    assert receipt.reason == "malformed"
    assert await receive_now(sub) == []
    assert group_stats(hub, "t")["held"] == 0


async def test_nack_without_requeue_defaults_to_failed() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg(1)])
    (d,) = await receive_now(sub)
    sub.nack(d.tag, requeue=False)
    assert receipt.outcome is Outcome.FAILED


async def test_ack_in_one_group_and_reject_in_another_is_rejected() -> None:
    hub = Hub()
    a = hub.subscribe("t", "a")
    b = hub.subscribe("t", "b")
    receipt = await hub.publish([msg(1)])
    (da,) = await receive_now(a)
    (db,) = await receive_now(b)
    a.ack(da.tag)
    assert not receipt.done()
    b.nack(db.tag, requeue=False, outcome=Outcome.REJECTED, reason="no")
    assert receipt.outcome is Outcome.REJECTED
    assert receipt.reason == "no"


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ((Outcome.FAILED, Outcome.REJECTED, None), Outcome.REJECTED),
        ((Outcome.REJECTED, Outcome.FAILED, None), Outcome.REJECTED),
        ((None, Outcome.FAILED, None), Outcome.FAILED),
        ((Outcome.FAILED, None, Outcome.FAILED), Outcome.FAILED),
        ((None, None, None), Outcome.DELIVERED),
    ],
)
async def test_worst_outcome_across_targets(
    outcomes: tuple[Outcome | None, ...], expected: Outcome
) -> None:
    """Three routed targets each settle (None: ack); the receipt reports the worst."""
    hub = Hub(router=Router([Route("in", ("x", "y", "z"))]))
    subs = [hub.subscribe(name) for name in ("x", "y", "z")]
    receipt = await hub.publish([msg(1, "in")])
    for sub, outcome in zip(subs, outcomes, strict=True):
        assert not receipt.done()
        (d,) = await receive_now(sub)
        if outcome is None:
            sub.ack(d.tag)
        else:
            sub.nack(d.tag, requeue=False, outcome=outcome, reason=outcome.name)
    assert receipt.outcome is expected
    if expected is not Outcome.DELIVERED:
        assert receipt.reason == expected.name


async def test_unknown_upstream_target_is_rejected() -> None:
    hub = Hub(upstreams=["central"])
    receipt = await hub.publish([msg(1, "upstream:nowhere")])
    assert receipt.outcome is Outcome.REJECTED
    assert "nowhere" in receipt.reason
    assert "upstream:nowhere" not in hub.destinations()


async def test_routed_unknown_upstream_rejects_but_other_targets_still_deliver() -> None:
    hub = Hub(
        router=Router([Route("logs.*", ("upstream:nowhere", "archive"))]), upstreams=["central"]
    )
    archive = hub.subscribe("archive")
    receipt = await hub.publish([msg(1, "logs.a")])
    assert not receipt.done(), "the archive copy is not acked yet"
    (d,) = await receive_now(archive)
    archive.ack(d.tag)
    assert receipt.outcome is Outcome.REJECTED


async def test_known_upstream_target_collects() -> None:
    hub = Hub(upstreams=["central"])
    receipt = await hub.publish([msg(1, "upstream:central")])
    assert not receipt.done()
    sub = hub.subscribe("upstream:central", "upstream")
    (d,) = await receive_now(sub)
    sub.ack(d.tag)
    assert receipt.outcome is Outcome.DELIVERED


async def test_too_many_destinations_rejected() -> None:
    hub = Hub(limits=HubLimits(max_destinations=2))
    hub.subscribe("a")
    hub.subscribe("b")
    receipt = await hub.publish([msg(1, "c")])
    assert receipt.outcome is Outcome.REJECTED
    assert set(hub.destinations()) == {"a", "b"}


# -- backpressure and bounds --------------------------------------------------------


async def test_publisher_blocks_on_full_buffer_and_resumes_on_ack() -> None:
    hub = Hub(limits=HubLimits(buffer_messages=2))
    sub = hub.subscribe("t")
    await publish_each(hub, [msg(1), msg(2)])
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(3)])
        await settle()
        assert not task.done, "publish did not wait for room"
        got = await receive_now(sub)
        assert numbers(got) == [1, 2]
        await settle()
        assert not task.done, "delivered but unacked copies still take room"
        sub.ack(got[0].tag)
        await settle()
        assert task.done
        assert task.error is None
    got3 = await receive_now(sub)
    assert numbers(got3) == [3]
    assert group_stats(hub, "t")["held"] == 2


async def test_nack_without_requeue_also_makes_room() -> None:
    hub = Hub(limits=HubLimits(buffer_messages=1))
    sub = hub.subscribe("t")
    await hub.publish([msg(1)])
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(2)])
        await settle()
        assert not task.done
        (d,) = await receive_now(sub)
        sub.nack(d.tag)  # requeued: still held
        await settle()
        assert not task.done
        (d,) = await receive_now(sub)
        sub.nack(d.tag, requeue=False)
        await settle()
        assert task.done


async def test_batch_publish_blocks_midway() -> None:
    """A multi-message publish returns its receipt only once every message is queued."""
    hub = Hub(limits=HubLimits(buffer_messages=2))
    sub = hub.subscribe("t")
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(i) for i in range(5)])
        await settle()
        assert not task.done
        for _ in range(3):
            got = await receive_now(sub, 1)
            sub.ack(got[0].tag)
            await settle()
        assert task.done
    receipt: Receipt = task.result
    rest = await receive_now(sub)
    assert numbers(rest) == [3, 4]
    assert not receipt.done()
    ack_all(sub, rest)
    assert receipt.outcome is Outcome.DELIVERED


async def test_slowest_group_holds_back_the_publisher() -> None:
    hub = Hub(limits=HubLimits(buffer_messages=2))
    fast = hub.subscribe("t", "fast")
    slow = hub.subscribe("t", "slow")
    await publish_each(hub, [msg(1), msg(2)])
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(3)])
        ack_all(fast, await receive_now(fast))
        await settle()
        assert not task.done, "the slow group is still full"
        got = await receive_now(slow)
        slow.ack(got[0].tag)
        await settle()
        assert task.done


async def test_byte_bound_holds() -> None:
    """Each 450-byte message: two fit in 1000 bytes, a third must wait."""
    hub = Hub(limits=HubLimits(buffer_bytes=1000))
    sub = hub.subscribe("t")
    await publish_each(hub, [msg(1, size=450), msg(2, size=450)])
    assert group_stats(hub, "t")["held_bytes"] == 900
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(3, size=450)])
        await settle()
        assert not task.done
        assert group_stats(hub, "t")["held_bytes"] <= 1000
        got = await receive_now(sub)
        sub.ack(got[0].tag)
        await settle()
        assert task.done
        assert group_stats(hub, "t")["held_bytes"] == 900
    ack_all(sub, got[1:])
    ack_all(sub, await receive_now(sub))
    assert group_stats(hub, "t")["held_bytes"] == 0
    assert group_stats(hub, "t")["held"] == 0


async def test_byte_bound_with_many_publishers() -> None:
    limit = 2000
    hub = Hub(limits=HubLimits(buffer_bytes=limit))
    sub = hub.subscribe("t")
    sizes = [300 + 97 * (i % 7) for i in range(30)]
    async with trio.open_nursery() as nursery:
        tasks = [start(nursery, hub.publish, [msg(i, size=s)]) for i, s in enumerate(sizes)]
        received: list[int] = []
        for _ in range(200):
            await settle()
            assert group_stats(hub, "t")["held_bytes"] <= limit
            got = await receive_now(sub, 2)
            received += numbers(got)
            ack_all(sub, got)
            if len(received) == len(sizes):
                break
    assert sorted(received) == list(range(30))
    assert all(t.done and t.error is None for t in tasks)
    assert all(t.result.outcome is Outcome.DELIVERED for t in tasks)
    assert group_stats(hub, "t")["held_bytes"] == 0


async def test_oversize_message_rejected_immediately_even_when_full() -> None:
    hub = Hub(limits=HubLimits(buffer_bytes=1000, buffer_messages=1))
    hub.subscribe("t")
    await hub.publish([msg(1)])  # the group is now full
    with trio.fail_after(1):
        receipt = await hub.publish([msg(2, size=1001)])
    assert receipt.outcome is Outcome.REJECTED
    assert "1001" in receipt.reason


async def test_message_exactly_the_buffer_size_is_accepted() -> None:
    hub = Hub(limits=HubLimits(buffer_bytes=1000))
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg(1, size=1000)])
    (d,) = await receive_now(sub)
    sub.ack(d.tag)
    assert receipt.outcome is Outcome.DELIVERED


async def test_oversize_in_a_batch_rejects_only_its_leg() -> None:
    hub = Hub(limits=HubLimits(buffer_bytes=1000))
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg(1), msg(2, size=5000), msg(3)])
    got = await receive_now(sub)
    assert numbers(got) == [1, 3]
    assert not receipt.done()
    ack_all(sub, got)
    assert receipt.outcome is Outcome.REJECTED


# -- subscribers leaving ------------------------------------------------------------


async def test_redelivery_to_another_member_when_one_closes() -> None:
    hub = Hub()
    a = hub.subscribe("t", "g")
    receipts = await publish_each(hub, [msg(i) for i in range(5)])
    got = await receive_now(a, 3)
    assert numbers(got) == [0, 1, 2]
    b = hub.subscribe("t", "g")
    a.close()
    again = await receive_now(b)
    assert numbers(again) == [0, 1, 2, 3, 4]
    assert [d.redelivered for d in again] == [True, True, True, False, False]
    assert not any(r.done() for r in receipts)
    ack_all(b, again)
    assert all(r.outcome is Outcome.DELIVERED for r in receipts)


async def test_anonymous_subscriber_loss_redelivers_to_next_subscriber() -> None:
    hub = Hub()
    first = hub.subscribe("t")
    receipts = await publish_each(hub, [msg(i) for i in range(4)])
    got = await receive_now(first, 2)
    first.ack(got[0].tag)
    first.close()
    assert receipts[0].outcome is Outcome.DELIVERED
    assert not any(r.done() for r in receipts[1:])
    second = hub.subscribe("t")
    again = await receive_now(second)
    assert numbers(again) == [1, 2, 3]
    assert again[0].redelivered is True
    assert not any(r.done() for r in receipts[1:])
    ack_all(second, again)
    assert all(r.outcome is Outcome.DELIVERED for r in receipts)


async def test_redelivery_keeps_order_after_nacks() -> None:
    hub = Hub()
    a = hub.subscribe("t", "g")
    await publish_each(hub, [msg(i) for i in range(4)])
    got = await receive_now(a)
    a.nack(got[2].tag)
    a.ack(got[1].tag)
    a.close()
    b = hub.subscribe("t", "g")
    assert numbers(await receive_now(b)) == [0, 2, 3]


async def test_close_is_idempotent_and_context_manager_closes() -> None:
    hub = Hub()
    with hub.subscribe("t", "g") as sub:
        await hub.publish([msg(1)])
        await receive_now(sub)
    sub.close()
    with pytest.raises(trio.ClosedResourceError):
        await sub.receive()
    other = hub.subscribe("t", "g")
    (d,) = await receive_now(other)
    assert d.redelivered is True


async def test_named_group_keeps_collecting_without_members() -> None:
    hub = Hub()
    hub.destination("t").declare_group("g")
    r1 = await hub.publish([msg(1)])
    member = hub.subscribe("t", "g")
    (d,) = await receive_now(member)
    member.ack(d.tag)
    member.close()
    r2 = await hub.publish([msg(2)])
    assert r1.outcome is Outcome.DELIVERED
    assert not r2.done()
    assert group_stats(hub, "t", "g")["members"] == 0
    late = hub.subscribe("t", "g")
    (d,) = await receive_now(late)
    assert number(d) == 2
    late.ack(d.tag)
    assert r2.outcome is Outcome.DELIVERED


async def test_anonymous_leaving_settles_neutral_when_another_group_has_a_copy() -> None:
    hub = Hub()
    anon = hub.subscribe("t")
    named = hub.subscribe("t", "g")
    receipt = await hub.publish([msg(1), msg(2)])
    await receive_now(anon, 1)  # one delivered and unacked, one still queued
    anon.close()
    assert not receipt.done(), "the named group has not acked yet"
    ack_all(named, await receive_now(named))
    assert receipt.outcome is Outcome.DELIVERED


async def test_anonymous_leaving_unblocks_publisher() -> None:
    hub = Hub(limits=HubLimits(buffer_messages=1))
    anon = hub.subscribe("t")
    named = hub.subscribe("t", "g")
    await hub.publish([msg(1)])
    ack_all(named, await receive_now(named))
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(2)])
        await settle()
        assert not task.done, "the anonymous group is full"
        anon.close()
        await settle()
        assert task.done


async def test_anonymous_leaving_never_settles_an_only_copy_as_delivered() -> None:
    """The leaving subscriber held the only copy (the other group joined after the
    publish): settling it neutral would report DELIVERED for a message nobody got."""
    hub = Hub()
    anon = hub.subscribe("t")
    receipt = await hub.publish([msg(1)])
    other = hub.subscribe("t", "late")
    anon.close()
    assert receipt.outcome is not Outcome.DELIVERED, "lost message reported as delivered"
    got = await receive_now(other)
    assert numbers(got) == [1]
    ack_all(other, got)
    assert receipt.outcome is Outcome.DELIVERED


async def test_backlog_adopted_by_first_group() -> None:
    """Copies the last anonymous group left behind wait in the backlog (new publishes
    never do) and go, whole and in order, to the first group that subscribes."""
    hub = Hub()
    anon = hub.subscribe("t", credit=0)
    receipts = await publish_each(hub, [msg(1), msg(2)])
    anon.close()
    assert hub.destination("t").stats()["backlog"] == 2
    assert not any(r.done() for r in receipts)
    first = hub.subscribe("t", "first")
    second = hub.subscribe("t", "second")
    assert hub.destination("t").stats()["backlog"] == 0
    got = await receive_now(first)
    assert numbers(got) == [1, 2]
    assert [d.redelivered for d in got] == [False, False], "never delivered before"
    assert await receive_now(second) == [], "only the first group adopts the backlog"
    ack_all(first, got)
    assert all(r.outcome is Outcome.DELIVERED for r in receipts)


async def test_backlog_holds_no_publisher_and_counts_against_the_adopting_group() -> None:
    """The backlog never makes a publisher wait (with no group a publish is discarded),
    and the copies it holds take room in the group that adopts them: that group's
    publishers wait as for a full group."""
    hub = Hub(limits=HubLimits(buffer_messages=2))
    anon = hub.subscribe("t", credit=0)
    await publish_each(hub, [msg(1), msg(2)])
    anon.close()
    with trio.fail_after(1):
        discarded = await hub.publish([msg(3)])
    assert discarded.outcome is Outcome.DELIVERED
    stats = hub.destination("t").stats()
    assert (stats["backlog"], stats["discarded"]) == (2, 1)
    sub = hub.subscribe("t")
    assert group_stats(hub, "t")["held"] == 2
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(4)])
        await settle()
        assert not task.done, "the adopted copies fill the group"
        got = await receive_now(sub)
        sub.ack(got[0].tag)
        await settle()
        assert task.done
    ack_all(sub, got[1:])
    assert numbers(await receive_now(sub)) == [4]


async def test_last_anonymous_group_returns_copies_to_the_backlog() -> None:
    hub = Hub()
    a = hub.subscribe("t")
    receipt = await hub.publish([msg(1)])
    await receive_now(a)
    a.close()
    assert hub.destination("t").stats()["backlog"] == 1
    assert not receipt.done()
    b = hub.subscribe("t")
    (d,) = await receive_now(b)
    assert d.redelivered is True
    b.ack(d.tag)
    assert receipt.outcome is Outcome.DELIVERED


# -- a topic nobody listens to ---------------------------------------------------------


async def test_publish_to_a_topic_with_no_group_is_discarded_and_settled() -> None:
    """Nobody listens (as with NATS or MQTT): the publish settles delivered at once,
    even past the buffer's bound, and a later subscriber does not get it."""
    hub = Hub(limits=HubLimits(buffer_messages=2))
    with trio.fail_after(1):
        r1 = await hub.publish([msg(1), msg(2), msg(3)])
        r2 = await hub.publish([msg(4)])
    assert r1.outcome is Outcome.DELIVERED
    assert r1.results() == [Result()] * 3
    assert r2.outcome is Outcome.DELIVERED
    assert hub.inflight == 0
    assert hub.destination("t").stats() == {
        "kind": "topic",
        "backlog": 0,
        "discarded": 4,
        "filtered": 0,
        "groups": {},
    }
    sub = hub.subscribe("t")
    assert await receive_now(sub) == [], "a discarded message was held"
    r3 = await hub.publish([msg(5)])
    got = await receive_now(sub)
    assert numbers(got) == [5]
    ack_all(sub, got)
    assert r3.outcome is Outcome.DELIVERED
    assert hub.destination("t").stats()["discarded"] == 4


async def test_oversize_message_with_no_group_is_rejected_not_discarded() -> None:
    hub = Hub(limits=HubLimits(buffer_bytes=1000))
    receipt = await hub.publish([msg(1), msg(2, size=5000), msg(3)])
    assert receipt.outcome is Outcome.REJECTED
    results = receipt.results()
    assert results[0] == results[2] == Result()
    assert results[1].outcome is Outcome.REJECTED
    assert "5000" in results[1].reason
    assert hub.destination("t").stats()["discarded"] == 2


@pytest.mark.parametrize("how", ["declared", "subscriber_left"])
async def test_named_group_collects_instead_of_discarding(how: str) -> None:
    """A named group outlives its members: with one, nothing is discarded."""
    hub = Hub()
    if how == "declared":
        hub.destination("t").declare_group("g")
    else:
        hub.subscribe("t", "g").close()
    receipt = await hub.publish([msg(1), msg(2)])
    assert not receipt.done(), "the named group holds the copies"
    stats = hub.destination("t").stats()
    assert stats["discarded"] == 0
    assert group_stats(hub, "t", "g") == {
        "queued": 2,
        "held": 2,
        "held_bytes": 2 * msg(1).size,
        "members": 0,
    }
    member = hub.subscribe("t", "g")
    got = await receive_now(member)
    assert numbers(got) == [1, 2]
    ack_all(member, got)
    assert receipt.outcome is Outcome.DELIVERED


async def test_publisher_waiting_on_the_last_anonymous_group_is_released_when_it_leaves() -> None:
    """The group the publisher waited for left: its copies go to the backlog, and the
    waiting message, published to a topic with no group now, is discarded."""
    hub = Hub(limits=HubLimits(buffer_messages=1))
    anon = hub.subscribe("t")
    r1 = await hub.publish([msg(1)])
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(2)])
        await settle()
        assert not task.done
        anon.close()
        await settle()
        assert task.done
        assert task.error is None
    assert task.result.outcome is Outcome.DELIVERED
    stats = hub.destination("t").stats()
    assert (stats["backlog"], stats["discarded"]) == (1, 1)
    assert not r1.done()
    sub = hub.subscribe("t")
    got = await receive_now(sub)
    assert numbers(got) == [1]
    ack_all(sub, got)
    assert r1.outcome is Outcome.DELIVERED


async def test_routed_copy_to_a_topic_nobody_listens_to_is_discarded() -> None:
    """One target has a subscriber, the other none: the receipt waits for the first
    alone, and the second counts the copy as discarded."""
    hub = Hub(router=Router([Route("in", ("x", "nobody"))]))
    x = hub.subscribe("x")
    receipt = await hub.publish([msg(1, "in"), msg(2, "in")])
    assert hub.destination("nobody").stats()["discarded"] == 2
    assert not receipt.done()
    ack_all(x, await receive_now(x))
    assert receipt.outcome is Outcome.DELIVERED
    assert receipt.results() == [Result()] * 2


# -- queues -------------------------------------------------------------------------------


def queue_hub(**kwargs: Any) -> Hub:
    """A hub whose destination ``q`` is a queue, configured as ``[[destinations]]`` is."""
    catalog = Catalog([DestinationSpec("q", kind="queue")], TopicLimits())
    return Hub(providers=[catalog], **kwargs)


async def test_queue_subscribers_share_one_group_whatever_they_name() -> None:
    hub = queue_hub()
    info = hub.info("q")
    assert (info.kind, info.queue_group) == ("queue", "queue")
    a = hub.subscribe("q", "a")
    b = hub.subscribe("q", "b")
    c = hub.subscribe("q")
    assert [s.group for s in (a, b, c)] == ["queue"] * 3
    stats = hub.destination("q").stats()
    assert stats["kind"] == "queue"
    assert list(stats["groups"]) == ["queue"]  # type: ignore[call-overload]
    assert group_stats(hub, "q")["members"] == 3
    receipt = await hub.publish([msg(i, "q") for i in range(9)])
    got_a = await receive_now(a, 2)
    got_b = await receive_now(b, 3)
    got_c = await receive_now(c)
    assert numbers(got_a) == [0, 1]
    assert numbers(got_b) == [2, 3, 4]
    assert numbers(got_c) == [5, 6, 7, 8]
    for sub, got in ((a, got_a), (b, got_b), (c, got_c)):
        assert await receive_now(sub) == [], "a message went to two consumers"
        ack_all(sub, got)
    assert receipt.outcome is Outcome.DELIVERED
    assert hub.destination("q").stats()["discarded"] == 0


async def test_queue_holds_messages_until_a_consumer_comes() -> None:
    hub = queue_hub()
    receipt = await hub.publish([msg(1, "q"), msg(2, "q")])
    assert not receipt.done(), "a queue waits for consumers"
    assert group_stats(hub, "q", "queue")["queued"] == 2
    assert hub.destination("q").stats()["discarded"] == 0
    first = hub.subscribe("q", "whatever")
    (d1,) = await receive_now(first, 1)
    first.close()  # the last consumer left: the queue keeps everything
    later = await hub.publish([msg(3, "q")])
    assert not later.done()
    assert group_stats(hub, "q")["queued"] == 3
    second = hub.subscribe("q")
    got = await receive_now(second)
    assert numbers(got) == [1, 2, 3]
    assert [d.redelivered for d in got] == [True, False, False]
    assert number(d1) == 1
    ack_all(second, got)
    assert receipt.outcome is Outcome.DELIVERED
    assert later.outcome is Outcome.DELIVERED


async def test_queue_takes_a_selector_per_consumer_and_refuses_positions() -> None:
    hub = queue_hub()
    picky = hub.subscribe("q", filter=Filter.equals(kind="a"))
    assert (picky.group, picky.filter) == ("queue", Filter.equals(kind="a"))
    assert "filter" not in group_stats(hub, "q"), "a selector is the consumer's, not the group's"
    with pytest.raises(ValueError):
        hub.subscribe("q", start="earliest")
    assert group_stats(hub, "q")["members"] == 1


async def test_a_topic_in_the_catalog_stays_a_topic() -> None:
    hub = queue_hub()
    assert hub.info("other").kind == "topic"
    await hub.publish([msg(1, "other")])
    assert hub.destination("other").stats()["discarded"] == 1


async def test_upstream_destinations_are_queues() -> None:
    hub = Hub(upstreams=["central"])
    assert hub.info("upstream:central").kind == "queue"
    receipt = await hub.publish([msg(i, "upstream:central") for i in range(4)])
    assert not receipt.done(), "nothing routed to an upstream is dropped while it is down"
    x = hub.subscribe("upstream:central", "upstream")
    y = hub.subscribe("upstream:central", "another-name")
    assert x.group == y.group == "queue"
    got_x = await receive_now(x, 1)
    got_y = await receive_now(y)
    assert numbers(got_x) == [0]
    assert numbers(got_y) == [1, 2, 3]
    ack_all(x, got_x)
    ack_all(y, got_y)
    assert receipt.outcome is Outcome.DELIVERED


# -- per-message results ------------------------------------------------------------------


async def test_results_show_which_message_of_a_batch_was_rejected_for_size() -> None:
    hub = Hub(limits=HubLimits(buffer_bytes=1000))
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg(0), msg(1), msg(2, size=5000), msg(3)])
    got = await receive_now(sub)
    assert numbers(got) == [0, 1, 3]
    ack_all(sub, got)
    assert receipt.outcome is Outcome.REJECTED
    results = receipt.results()
    assert len(results) == 4
    assert results[0] == results[1] == results[3] == Result()
    assert results[2].outcome is Outcome.REJECTED
    assert results[2].reason == receipt.reason
    assert "5000" in results[2].reason


async def test_results_show_which_message_a_subscriber_nacked() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    receipt = await hub.publish([msg(i) for i in range(5)])
    got = await receive_now(sub)
    sub.nack(got[1].tag, requeue=False, outcome=Outcome.FAILED, reason="later")
    sub.nack(got[3].tag, requeue=False, outcome=Outcome.REJECTED, reason="malformed")
    ack_all(sub, [got[0], got[2], got[4]])
    assert receipt.outcome is Outcome.REJECTED
    assert receipt.reason == "malformed"
    assert receipt.results() == [
        Result(),
        Result(Outcome.FAILED, "later"),
        Result(),
        Result(Outcome.REJECTED, "malformed"),
        Result(),
    ]


async def test_batch_for_two_destinations_gets_results_in_publish_order() -> None:
    """A batch mixing destinations is routed run by run; each message's result is
    found at its own index."""
    hub = Hub(upstreams=["central"])
    a = hub.subscribe("a")
    b = hub.subscribe("b")
    batch = [msg(0, "a"), msg(1, "b"), msg(2, "a"), msg(3, "a"), msg(4, "b")]
    receipt = await hub.publish(batch)
    got_a = await receive_now(a)
    got_b = await receive_now(b)
    assert numbers(got_a) == [0, 2, 3]
    assert numbers(got_b) == [1, 4]
    a.nack(got_a[1].tag, requeue=False, outcome=Outcome.FAILED, reason="a2")
    ack_all(a, [got_a[0], got_a[2]])
    b.ack(got_b[0].tag)
    assert not receipt.done()
    b.nack(got_b[1].tag, requeue=False, outcome=Outcome.REJECTED, reason="b4")
    assert receipt.outcome is Outcome.REJECTED
    assert receipt.results() == [
        Result(),
        Result(),
        Result(Outcome.FAILED, "a2"),
        Result(),
        Result(Outcome.REJECTED, "b4"),
    ]


async def test_batch_routed_to_two_targets_gets_the_worst_of_each_message() -> None:
    """Every message goes to both targets: each result is the worst of its two copies,
    and an unknown upstream rejects the messages routed to it, by index."""
    hub = Hub(
        router=Router([Route("in", ("x", "y")), Route("up", ("upstream:nowhere", "x"))]),
        upstreams=["central"],
    )
    x = hub.subscribe("x")
    y = hub.subscribe("y")
    receipt = await hub.publish([msg(0, "in"), msg(1, "in"), msg(2, "up"), msg(3, "in")])
    got_x = await receive_now(x)
    got_y = await receive_now(y)
    assert numbers(got_x) == [0, 1, 2, 3]
    assert numbers(got_y) == [0, 1, 3]
    ack_all(x, got_x)
    y.nack(got_y[1].tag, requeue=False, outcome=Outcome.FAILED, reason="y1")
    ack_all(y, [got_y[0], got_y[2]])
    assert receipt.outcome is Outcome.REJECTED
    results = receipt.results()
    assert results[0] == results[3] == Result()
    assert results[1] == Result(Outcome.FAILED, "y1")
    assert results[2].outcome is Outcome.REJECTED
    assert "nowhere" in results[2].reason


# -- closing, idleness ----------------------------------------------------------------


@pytest.mark.parametrize("group", [None, "g"])
async def test_hub_close_wakes_blocked_receive(group: str | None) -> None:
    hub = Hub()
    sub = hub.subscribe("t", group)
    async with trio.open_nursery() as nursery:
        task = start(nursery, sub.receive)
        await settle()
        assert not task.done
        hub.close()
        await settle()
        assert task.done
        assert isinstance(task.error, trio.ClosedResourceError)


async def test_hub_close_wakes_blocked_publisher() -> None:
    hub = Hub(limits=HubLimits(buffer_messages=1))
    hub.subscribe("t")
    await hub.publish([msg(1)])
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.publish, [msg(2)])
        await settle()
        assert not task.done
        hub.close()
        await settle()
        assert isinstance(task.error, trio.ClosedResourceError)


async def test_closed_hub_refuses_work() -> None:
    hub = Hub()
    hub.subscribe("t")
    hub.close()
    with pytest.raises(trio.ClosedResourceError):
        await hub.publish([msg(1)])
    with pytest.raises(trio.ClosedResourceError):
        hub.subscribe("t")
    with pytest.raises(trio.ClosedResourceError):
        hub.subscribe("other")


@pytest.mark.parametrize("group", [None, "g"])
async def test_subscription_close_wakes_its_blocked_receive(group: str | None) -> None:
    """``receive`` raises ClosedResourceError once the subscription closed, also when
    it was already waiting (e.g. a connection task closing from another task)."""
    hub = Hub()
    sub = hub.subscribe("t", group)
    async with trio.open_nursery() as nursery:
        task = start(nursery, sub.receive)
        await settle()
        sub.close()
        await settle()
        done = task.done
        nursery.cancel_scope.cancel()
    assert done, "receive still blocked after close()"
    assert isinstance(task.error, trio.ClosedResourceError)


async def test_inflight_and_wait_idle() -> None:
    hub = Hub()
    sub = hub.subscribe("t")
    assert hub.inflight == 0
    with trio.fail_after(1):
        await hub.wait_idle()  # nothing pending: returns at once
    await hub.publish([msg(1)])
    await hub.publish([msg(2)])
    assert hub.inflight == 2
    async with trio.open_nursery() as nursery:
        task = start(nursery, hub.wait_idle)
        got = await receive_now(sub)
        sub.ack(got[0].tag)
        await settle()
        assert hub.inflight == 1
        assert not task.done
        sub.ack(got[1].tag)
        await settle()
        assert task.done
    assert hub.inflight == 0


async def test_rejected_publish_is_not_inflight() -> None:
    hub = Hub()
    receipt = await hub.publish([msg(1, "upstream:none")])
    assert receipt.done()
    assert hub.inflight == 0


async def test_destination_is_created_once() -> None:
    hub = Hub()
    d = hub.destination("t")
    assert hub.destination("t") is d
    assert hub.destinations() == {"t": d}
    assert hub.subscribe("t").destination == "t"


# -- property: random operation sequences never lose a message ----------------------

BUFFER_MESSAGES = 4
BUFFER_BYTES = 1200
OVERSIZE = 2000
GROUPS = (None, "g1", "g2")

_sub = st.integers(min_value=0, max_value=7)
_size = st.sampled_from([0, 40, 100, 300, 700, OVERSIZE])
_op = st.one_of(
    st.tuples(st.just("publish"), _size),
    # One publish of several messages: the topic keeps them as one run.
    st.tuples(st.just("publish_many"), st.lists(_size, min_size=2, max_size=5)),
    st.tuples(
        st.just("subscribe"),
        st.sampled_from(GROUPS),
        st.sampled_from([None, 0, 1, 3]),
        st.integers(min_value=1, max_value=6),
        st.sampled_from([None, 500]),
    ),
    st.tuples(st.just("receive"), _sub, st.integers(min_value=1, max_value=5)),
    st.tuples(st.just("ack"), _sub, st.integers(min_value=0, max_value=3)),
    # Several deliveries in one ack_many call, in one of several orders.
    st.tuples(
        st.just("ack_many"),
        _sub,
        st.sampled_from(["all", "reversed", "odd", "even", "shuffled", "middle-reversed"]),
    ),
    st.tuples(
        st.just("nack"),
        _sub,
        st.integers(min_value=0, max_value=3),
        st.sampled_from([None, Outcome.FAILED, Outcome.REJECTED]),
    ),
    st.tuples(st.just("grant"), _sub, st.integers(min_value=0, max_value=3)),
    st.tuples(st.just("close"), _sub),
)


@dataclass
class _Sent:
    receipt: Receipt | None = None
    #: The message's index in its publish (its receipt's per-message result).
    index: int = 0
    oversize: bool = False
    nacked: list[Outcome] = field(default_factory=list)
    acked_by: set[str] = field(default_factory=set)


@dataclass
class _Member:
    sub: Subscription
    group: str
    unacked: list[Delivery] = field(default_factory=list)


class _Harness:
    """Drives a hub with one operation at a time and checks the model after each."""

    def __init__(self) -> None:
        self.hub = Hub(limits=HubLimits(buffer_bytes=BUFFER_BYTES, buffer_messages=BUFFER_MESSAGES))
        self.sent: list[_Sent] = []
        #: Every subscriber so far; None once it closed.
        self.members: list[_Member | None] = []
        self.publishers: list[Task] = []
        # Per group: messages acked or settled there, delivered ever, delivered now.
        self.settled: dict[str, set[int]] = {}
        self.seen: dict[str, set[int]] = {}
        self.outstanding: dict[str, set[int]] = {}
        self.anonymous = 0

    def open_member(self, index: int) -> _Member | None:
        live = [m for m in self.members if m is not None]
        return live[index % len(live)] if live else None

    def join(
        self,
        group: str | None,
        credit: int | None = None,
        max_unacked: int = 1024,
        max_unacked_bytes: int | None = None,
    ) -> None:
        if group is None:
            self.anonymous += 1
            key = f"~anon{self.anonymous}"
        else:
            key = group
        sub = self.hub.subscribe(
            "t",
            group,
            credit=credit,
            max_unacked=max_unacked,
            max_unacked_bytes=max_unacked_bytes,
        )
        self.members.append(_Member(sub, key))
        for table in (self.settled, self.seen, self.outstanding):
            table.setdefault(key, set())

    def record(self, member: _Member, deliveries: list[Delivery]) -> None:
        g = member.group
        for d in deliveries:
            n = number(d)
            assert not self.sent[n].oversize, "an oversize message was queued"
            assert n not in self.settled[g], f"message {n} delivered again after it settled"
            assert n not in self.outstanding[g], f"message {n} delivered twice at once"
            if n in self.seen[g]:
                assert d.redelivered, f"redelivery of {n} not flagged"
            self.seen[g].add(n)
            self.outstanding[g].add(n)
        member.unacked += deliveries

    def finish(self, member: _Member, d: Delivery, outcome: Outcome | None) -> None:
        n = number(d)
        member.unacked.remove(d)
        self.outstanding[member.group].discard(n)
        self.settled[member.group].add(n)
        if outcome is None:
            self.sent[n].acked_by.add(member.group)
        else:
            self.sent[n].nacked.append(outcome)

    def leave(self, member: _Member) -> None:
        member.sub.close()
        for d in member.unacked:
            self.outstanding[member.group].discard(number(d))
        member.unacked.clear()
        self.members[self.members.index(member)] = None

    def check_bounds(self, adopted: tuple[int, int] = (0, 0)) -> None:
        """Every group within its bounds, but for ``adopted`` (copies, bytes): the only
        copies of groups that left, which the group that takes them over holds on top
        (never dropped; its publishers wait until it is back under its bounds)."""
        stats = self.hub.destination("t").stats()
        assert stats["backlog"] <= BUFFER_MESSAGES + adopted[0]  # type: ignore[operator]
        for g in stats["groups"].values():  # type: ignore[attr-defined]
            assert g["held"] <= BUFFER_MESSAGES + adopted[0]
            assert g["held_bytes"] <= BUFFER_BYTES + adopted[1]

    def anonymous_held(self) -> tuple[int, int]:
        """Copies and bytes the groups of one hold now (what their departures hand over)."""
        groups = self.hub.destination("t").stats()["groups"].items()  # type: ignore[attr-defined]
        anonymous = [g for name, g in groups if name.startswith("~")]
        return sum(g["held"] for g in anonymous), sum(g["held_bytes"] for g in anonymous)

    async def apply(self, nursery: trio.Nursery, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "publish":
            n = len(self.sent)
            size = max(op[1], 0) + MESSAGE_OVERHEAD + 8
            self.sent.append(_Sent(oversize=size > BUFFER_BYTES))
            entry = self.sent[n]

            async def publish() -> Receipt:
                entry.receipt = await self.hub.publish([msg(n, size=size)])
                return entry.receipt

            self.publishers.append(start(nursery, publish))
        elif kind == "publish_many":
            messages = []
            entries = []
            for i, pad in enumerate(op[1]):
                n = len(self.sent)
                size = pad + MESSAGE_OVERHEAD + 8
                self.sent.append(_Sent(index=i, oversize=size > BUFFER_BYTES))
                entries.append(self.sent[n])
                messages.append(msg(n, size=size))

            async def publish_many() -> Receipt:
                receipt = await self.hub.publish(messages)
                for entry in entries:
                    entry.receipt = receipt
                return receipt

            self.publishers.append(start(nursery, publish_many))
        elif kind == "subscribe":
            self.join(op[1], op[2], op[3], op[4])
        else:
            member = self.open_member(op[1])
            if member is None:
                return
            if kind == "receive":
                got = await receive_now(member.sub, op[2])
                assert len(got) <= op[2], "received more than max_count"
                self.record(member, got)
            elif kind == "ack" and member.unacked:
                d = member.unacked[op[2] % len(member.unacked)]
                member.sub.ack(d.tag)
                self.finish(member, d, None)
            elif kind == "ack_many" and member.unacked:
                chosen = list(member.unacked)
                if op[2] == "reversed":
                    chosen.reverse()
                elif op[2] == "odd":
                    chosen = chosen[1::2] or chosen
                elif op[2] == "even":
                    chosen = chosen[::2]
                elif op[2] == "shuffled":
                    chosen = chosen[1::2] + chosen[::2]
                elif op[2] == "middle-reversed" and len(chosen) > 2:
                    chosen = chosen[:1] + chosen[1:-1][::-1] + chosen[-1:]
                member.sub.ack_many(d.tag for d in chosen)
                for d in chosen:
                    self.finish(member, d, None)
            elif kind == "nack" and member.unacked:
                d = member.unacked[op[2] % len(member.unacked)]
                if op[3] is None:
                    member.sub.nack(d.tag)
                    member.unacked.remove(d)
                    self.outstanding[member.group].discard(number(d))
                else:
                    member.sub.nack(d.tag, requeue=False, outcome=op[3])
                    self.finish(member, d, op[3])
            elif kind == "grant":
                member.sub.grant(op[2])
            elif kind == "close":
                self.leave(member)
        await settle()
        self.check_bounds()

    async def drain(self) -> None:
        """Close every subscriber, then drain every group until nothing is left."""
        adopted = self.anonymous_held()
        for m in self.members:
            if m is not None:
                self.leave(m)
        for group in GROUPS:
            self.join(group)
        drains = [m for m in self.members if m is not None]
        for _ in range(500):
            await settle()
            self.check_bounds(adopted)
            got_any = False
            for m in drains:
                got = await receive_now(m.sub)
                self.record(m, got)
                m.sub.ack_many(d.tag for d in got)
                for d in got:
                    self.finish(m, d, None)
                got_any = got_any or bool(got)
            if not got_any and all(p.done for p in self.publishers):
                break

    def check_final(self) -> None:
        assert all(p.done and p.error is None for p in self.publishers), "publisher stuck"
        # A publish of several messages settles with the worst of them; each message's
        # own result is its worst nack (REJECTED when oversize).
        worst: dict[int, Outcome] = {}
        expected: list[Outcome] = []
        for s in self.sent:
            assert s.receipt is not None
            mine = max(s.nacked, default=Outcome.DELIVERED)
            if s.oversize:
                mine = Outcome.REJECTED
            expected.append(mine)
            worst[id(s.receipt)] = max(worst.get(id(s.receipt), Outcome.DELIVERED), mine)
        for n, s in enumerate(self.sent):
            assert s.receipt is not None
            assert s.receipt.done(), f"receipt of message {n} never settled"
            assert s.receipt.outcome is worst[id(s.receipt)], f"message {n}"
            assert s.receipt.result(s.index).outcome is expected[n], f"result of message {n}"
        # A message published while no group existed is discarded: delivered, with
        # nobody acking it. Every other one was acked or nacked by some group.
        unseen = [n for n, s in enumerate(self.sent) if not (s.oversize or s.nacked or s.acked_by)]
        stats = self.hub.destination("t").stats()
        assert stats["discarded"] == len(unseen), f"settled with nobody acking: {unseen}"
        assert stats["backlog"] == 0
        for g in stats["groups"].values():  # type: ignore[attr-defined]
            assert g == {**g, "queued": 0, "held": 0, "held_bytes": 0}
        assert self.hub.inflight == 0


def _run_scenario(ops: list[tuple[Any, ...]]) -> None:
    async def main() -> None:
        h = _Harness()
        async with trio.open_nursery() as nursery:
            for op in ops:
                await h.apply(nursery, op)
            with trio.fail_after(5):
                await h.drain()
            h.check_final()
            nursery.cancel_scope.cancel()

    try:
        trio.run(main)
    except BaseExceptionGroup as group:
        # Report the assertion itself, not the nursery's group around it.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, max_size=40))
def test_random_operations_never_lose_a_message(ops: list[tuple[Any, ...]]) -> None:
    """Any interleaving of publish/subscribe/receive/ack/nack/grant/close: every
    receipt settles with the worst nack outcome, and each message's result with its
    own; a message that nobody acked or nacked was discarded (published while no group
    existed) and is counted so; no copy is delivered again after it settled,
    redeliveries are flagged, buffers stay within bounds and every held byte is
    released at the end."""
    _run_scenario(ops)


def test_scenario_harness_smoke() -> None:
    """The harness itself: a plain publish, receive, ack sequence passes."""
    _run_scenario(
        [
            ("subscribe", "g1", None, 3, None),
            ("publish", 40),
            ("publish", OVERSIZE),
            ("receive", 0, 3),
            ("ack", 0, 0),
        ]
    )


async def test_ack_many_settles_a_batch_and_frees_its_space() -> None:
    """Acking a window's deliveries in one call is the same as acking each."""
    hub = Hub(limits=HubLimits(buffer_messages=10))
    sub = hub.subscribe("t", max_unacked=100)
    receipt = await hub.publish([Message("t", b"%d" % i) for i in range(10)])
    got = await sub.receive()
    assert len(got) == 10
    sub.ack_many([d.tag for d in got[:4]])
    assert not receipt.done()
    # Four slots are free again: a publisher of four more does not wait.
    with trio.fail_after(1):
        second = await hub.publish([Message("t", b"x")] * 4)
    sub.ack_many(d.tag for d in got[4:])
    assert receipt.outcome is Outcome.DELIVERED
    with pytest.raises(KeyError):
        sub.ack_many([got[0].tag])
    assert not second.done()


async def test_batch_publish_waits_per_message_when_the_batch_does_not_fit() -> None:
    hub = Hub(limits=HubLimits(buffer_messages=3))
    sub = hub.subscribe("t", max_unacked=100)
    published = trio.Event()

    async def publisher() -> None:
        await hub.publish([Message("t", b"%d" % i) for i in range(5)])
        published.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publisher)
        await trio.testing.wait_all_tasks_blocked()
        first = await sub.receive()
        assert [d.message.body for d in first] == [b"0", b"1", b"2"]
        assert not published.is_set()
        sub.ack_many(d.tag for d in first)
        rest = await sub.receive()
        assert [d.message.body for d in rest] == [b"3", b"4"]
        await published.wait()


# -- a publish of many messages is kept as one run ----------------------------------


async def test_a_run_is_split_across_receives_and_credit() -> None:
    hub = Hub()
    sub = hub.subscribe("t", credit=3, max_unacked=100)
    receipt = await hub.publish([msg(i) for i in range(5)])
    first = await receive_now(sub)
    assert numbers(first) == [0, 1, 2]
    assert sub.credit == 0
    sub.grant(10)
    assert numbers(await receive_now(sub, 1)) == [3]
    rest = await receive_now(sub)
    assert numbers(rest) == [4]
    assert sub.credit == 8
    assert len({d.tag for d in first + rest}) == 4
    assert sub.unacked == 5
    assert not receipt.done()


async def test_receive_spans_runs_but_never_exceeds_max_count() -> None:
    hub = Hub()
    sub = hub.subscribe("t", max_unacked=100)
    await hub.publish([msg(0)])
    await hub.publish([msg(i) for i in range(1, 6)])
    got = await receive_now(sub, 3)
    assert numbers(got) == [0, 1, 2]
    assert numbers(await receive_now(sub)) == [3, 4, 5]


async def test_partly_acked_run_redelivers_only_the_rest_in_order_when_closed() -> None:
    hub = Hub()
    first = hub.subscribe("t", "g", max_unacked=100)
    receipt = await hub.publish([msg(i) for i in range(6)])
    got = await receive_now(first)
    first.ack_many([got[1].tag, got[4].tag])
    first.ack(got[2].tag)
    first.close()
    second = hub.subscribe("t", "g")
    again = await receive_now(second)
    assert numbers(again) == [0, 3, 5]
    assert all(d.redelivered for d in again)
    assert not receipt.done()
    second.ack_many(d.tag for d in again)
    assert receipt.outcome is Outcome.DELIVERED


@pytest.mark.parametrize(
    "order",
    [[0, 1, 2, 3, 4], [4, 3, 2, 1, 0], [0, 2, 1, 3, 4], [1, 3, 0, 2, 4], [0, 3, 2, 1, 4]],
)
async def test_ack_many_in_any_order_settles_exactly_those_tags(order: list[int]) -> None:
    hub = Hub()
    sub = hub.subscribe("t", max_unacked=100)
    receipt = await hub.publish([msg(i) for i in range(6)])
    got = await receive_now(sub)
    sub.ack_many(got[i].tag for i in order)
    assert sub.unacked == 1
    assert not receipt.done()
    assert group_stats(hub, "t")["held"] == 1
    with pytest.raises(KeyError):
        sub.ack(got[order[-1]].tag)
    sub.ack(got[5].tag)
    assert receipt.outcome is Outcome.DELIVERED


async def test_ack_many_stops_at_a_settled_tag_inside_a_run() -> None:
    """Tags before the bad one settle; the bad one and those after it do not."""
    hub = Hub()
    sub = hub.subscribe("t", max_unacked=100)
    await hub.publish([msg(i) for i in range(6)])
    got = await receive_now(sub)
    sub.ack(got[3].tag)
    with pytest.raises(KeyError, match=f"tag {got[3].tag}"):
        sub.ack_many(d.tag for d in got)
    assert sub.unacked == 2  # 4 and 5 are still unacked
    with pytest.raises(KeyError):
        sub.ack(got[0].tag)
    sub.ack_many([got[4].tag, got[5].tag])
    assert sub.unacked == 0


async def test_nack_inside_a_run_requeues_that_copy_first() -> None:
    hub = Hub()
    sub = hub.subscribe("t", max_unacked=100)
    receipt = await hub.publish([msg(i) for i in range(4)])
    got = await receive_now(sub, 3)
    sub.nack(got[1].tag)
    with pytest.raises(KeyError):
        sub.nack(got[1].tag)
    again = await receive_now(sub)
    assert numbers(again) == [1, 3]
    assert [d.redelivered for d in again] == [True, False]
    sub.ack_many(d.tag for d in [got[0], got[2], *again])
    assert receipt.outcome is Outcome.DELIVERED


async def test_byte_window_splits_a_run() -> None:
    hub = Hub()
    sub = hub.subscribe("t", max_unacked_bytes=3 * 300)
    await hub.publish([msg(i, size=300) for i in range(5)])
    got = await receive_now(sub)
    assert numbers(got) == [0, 1, 2]
    assert await receive_now(sub) == []
    sub.ack(got[0].tag)
    assert numbers(await receive_now(sub)) == [3]


async def test_last_group_leaving_moves_a_fanned_out_run_to_the_backlog_keeping_flags() -> None:
    """Copies an earlier group gave up are the only ones left: they move on, flagged
    as redelivered only where they had been delivered."""
    hub = Hub()
    a = hub.subscribe("t")
    b = hub.subscribe("t")
    receipt = await hub.publish([msg(i) for i in range(3)])
    delivered = await receive_now(a, 2)
    b.close()  # b's copies settle neutral: a's are now the only ones
    a.close()  # the last group: a's copies go to the backlog
    c = hub.subscribe("t")
    got = await receive_now(c)
    assert numbers(got) == [0, 1, 2]
    assert [d.redelivered for d in got] == [True, True, False]
    assert numbers(delivered) == [0, 1]
    c.ack_many(d.tag for d in got)
    assert receipt.outcome is Outcome.DELIVERED
