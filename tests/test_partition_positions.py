"""Resumable positions on partitioned destinations: ``Positions`` names a position in
every partition, is accepted as ``start`` and ``end`` through the hub, and a
subscription's ``resume_positions()`` says where to subscribe again so that nothing is
delivered twice and nothing is lost. Through the model's and the hub's public API, on
durable logs of three partitions and of one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from harness import receive_now, settle
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.destination import Delivery, Destination, EndOfStream, Subscription
from gateway.core.filters import Filter
from gateway.core.hub import Hub
from gateway.core.memory_log import MemoryLog
from gateway.core.model import MAX_POSITION, Message, Outcome, Position, Positions
from gateway.durable.log import DurableLog
from gateway.durable.partitioned import PartitionedLog
from gateway.store import Store

BIG = 10**9


class Provider:
    """The hub's logs: durable ``t`` of three partitions and ``one`` of one, and
    ``mem`` kept in memory."""

    def __init__(self, logs: dict[str, Destination]) -> None:
        self.logs = logs

    def open(self, name: str) -> Destination | None:
        return self.logs.get(name)


@asynccontextmanager
async def hub_with_logs(directory: Path) -> AsyncIterator[Hub]:
    async with Store.open(directory, fsync="never") as store:
        parts = [
            DurableLog("t", store.segment(f"t/{p}"), store, partition=p, retain_bytes=BIG)
            for p in range(3)
        ]
        one = DurableLog("one", store.segment("one"), store, retain_bytes=BIG)
        logs: dict[str, Destination] = {
            "t": PartitionedLog("t", parts),
            "one": one,
            "mem": MemoryLog("mem", retain_bytes=BIG),
        }
        hub = Hub(providers=[Provider(logs)])
        try:
            yield hub
        finally:
            for log in logs.values():
                log.close()
            await settle()


async def spread(hub: Hub, runs: int, size: int, name: str = "t") -> list[Position]:
    """``runs`` keyless publishes of ``size`` messages: run ``k`` goes whole to partition
    ``k % 3`` (sticky round-robin); every message's position."""
    placed: list[Position] = []
    for k in range(runs):
        receipt = await hub.publish([Message(name, f"r{k}.{i}".encode()) for i in range(size)])
        assert await receipt.wait() == Outcome.DELIVERED
        placed += [r.position for r in receipt.results() if r.position is not None]
    return placed


def where(deliveries: Sequence[Delivery]) -> list[Position]:
    found = [d.position for d in deliveries]
    assert all(p is not None for p in found)
    return sorted(p for p in found if p is not None)


async def drain(sub: Subscription, max_count: int | None = None) -> list[Delivery]:
    """What the subscription has now (up to ``max_count``; to the end of a finite
    read), acked."""
    got: list[Delivery] = []
    try:
        while chunk := await receive_now(sub, None if max_count is None else max_count - len(got)):
            got += chunk
            sub.ack_many([d.tag for d in chunk])
            if max_count is not None and len(got) >= max_count:
                break
    except EndOfStream:
        pass
    return got


def resume_of(sub: Subscription) -> Positions:
    resume = getattr(sub, "resume_positions", None)
    assert resume is not None, f"{type(sub).__name__} has no resume_positions"
    positions = resume()
    assert isinstance(positions, Positions)
    return positions


# -- the value and its text form -----------------------------------------------------------


def test_the_text_form_names_each_partition_once_in_ascending_order() -> None:
    positions = Positions({2: 0, 0: 17, 1: 4})
    assert positions.format() == str(positions) == "0:17,1:4,2:0"
    assert Positions.parse("0:17,1:4,2:0") == positions
    assert hash(Positions.parse("0:17,1:4,2:0")) == hash(positions)
    assert list(positions) == [Position(17, 0), Position(4, 1), Position(0, 2)]
    assert positions.partitions == (0, 1, 2)
    assert len(positions) == 3
    assert dict(positions.offsets) == {0: 17, 1: 4, 2: 0}
    assert positions.get(1) == Position(4, 1)
    assert positions.get(3) is None
    assert Positions.of([Position(4, 1), Position(17, 0)]) == Positions({0: 17, 1: 4})
    assert Positions.parse("5:0") == Positions({5: 0})
    assert repr(positions) == "Positions('0:17,1:4,2:0')"
    with pytest.raises(AttributeError):
        positions._items = ()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty"),
        ("0", "item 0 '0' is not PARTITION:OFFSET"),
        ("0:1,", "item 1 '' is not"),
        ("0:1,,1:2", "item 1 '' is not"),
        (" 0:1", "item 0"),
        ("0:1 ", "item 0"),
        ("0:-1", "no sign"),
        ("+0:1", "no sign"),
        ("0:01", "no leading zero"),
        ("00:1", "no leading zero"),
        ("0:1_000", "item 0"),
        ("0:\u0661", "item 0"),  # an Arabic-Indic digit: int() would read it
        ("0:1:2", "item 0"),
        ("a:1", "item 0"),
        ("0:12345678901234567890", "at most 19 digits"),
        ("0:9223372036854775808", "offset must be 0 to 9223372036854775807"),
        ("1:0,0:0", "item 1 '0:0': partitions must ascend, each once"),
        ("0:0,0:1", "partitions must ascend"),
        ("0:1;1:2", "item 0"),
    ],
)
def test_bad_text_is_a_value_error_saying_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        Positions.parse(text)


def test_bad_values_are_value_errors() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        Positions({})
    with pytest.raises(ValueError, match="offset must be 0 to"):
        Positions({0: -1})
    with pytest.raises(ValueError, match="partition must be 0 to"):
        Positions({-1: 0})
    with pytest.raises(ValueError, match="offset must be an int"):
        Positions({0: True})
    with pytest.raises(ValueError, match="offset must be an int"):
        Positions({0: 1.0})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="partition 1 is named twice"):
        Positions.of([Position(0, 1), Position(3, 1)])


values = st.integers(0, MAX_POSITION)


@given(st.dictionaries(values, values, min_size=1, max_size=20))
def test_the_text_form_round_trips(offsets: dict[int, int]) -> None:
    positions = Positions(offsets)
    text = positions.format()
    assert Positions.parse(text) == positions
    assert Positions.parse(text).format() == text
    assert dict(Positions.parse(text).offsets) == offsets


@given(st.text(alphabet="0123456789:,-+ ", max_size=30))
def test_any_text_parses_to_its_canonical_form_or_is_a_value_error(text: str) -> None:
    try:
        positions = Positions.parse(text)
    except ValueError:
        return
    assert positions.format() == text


@given(
    st.dictionaries(st.integers(0, 5), st.integers(0, 100), min_size=1),
    st.lists(st.builds(Position, st.integers(0, 100), st.integers(0, 7))),
)
def test_advanced_moves_each_partition_past_its_deliveries(
    start: dict[int, int], delivered: list[Position]
) -> None:
    after = Positions(start).advanced(delivered)
    for p in set(start) | {d.partition for d in delivered}:
        mine = [d.offset + 1 for d in delivered if d.partition == p]
        assert after.offsets[p] == max([start.get(p, 0), *mine])
    assert set(after.partitions) == set(start) | {d.partition for d in delivered}


# -- resuming a partitioned log through the hub ---------------------------------------------


async def test_resuming_delivers_exactly_the_rest_in_every_partition(tmp_path: Path) -> None:
    async with hub_with_logs(tmp_path) as hub:
        placed = await spread(hub, 6, 3)  # partitions 0, 1, 2 each get two runs of three
        sub = hub.subscribe("t", start="earliest", max_unacked=100)
        assert resume_of(sub) == Positions({0: 0, 1: 0, 2: 0})  # nothing delivered yet
        first = await drain(sub, 7)
        assert len(first) == 7
        resume = resume_of(sub)
        assert resume == Positions({0: 0, 1: 0, 2: 0}).advanced(where(first))
        # The resume point goes through text (as a protocol carries it).
        text = resume.format()
        sub.close()
        again = hub.subscribe("t", start=Positions.parse(text), max_unacked=100)
        rest = await drain(again)
        assert sorted(where(first) + where(rest)) == sorted(placed)  # all, once each
        assert not set(where(first)) & set(where(rest))
        for p in range(3):  # per partition: exactly the offsets after the resume point
            assert [q.offset for q in where(rest) if q.partition == p] == list(
                range(resume.offsets[p], 6)
            )
        assert resume_of(again) == Positions({0: 6, 1: 6, 2: 6})


async def test_resume_starts_from_latest_where_nothing_came(tmp_path: Path) -> None:
    """A subscription from ``"latest"`` resumes at the tails it started at: what came
    before it is not delivered on resuming, what came after it is."""
    async with hub_with_logs(tmp_path) as hub:
        await spread(hub, 3, 2)
        sub = hub.subscribe("t", max_unacked=100)  # from "latest"
        assert resume_of(sub) == Positions({0: 2, 1: 2, 2: 2})
        later = await spread(hub, 1, 2)  # partition 0 (the fourth run)
        got = await drain(sub, 1)
        resume = resume_of(sub)
        assert resume == Positions({0: 3, 1: 2, 2: 2})
        sub.close()
        rest = await drain(hub.subscribe("t", start=resume))
        assert where(got) + where(rest) == later


async def test_a_resumed_finite_read_ends_where_the_first_would_have(tmp_path: Path) -> None:
    async with hub_with_logs(tmp_path) as hub:
        await spread(hub, 6, 2)  # four messages in each partition
        end = Positions({0: 3, 1: 1, 2: 4})
        sub = hub.subscribe("t", start="earliest", end=end, max_unacked=100)
        first = await drain(sub, 3)
        resume = resume_of(sub)
        sub.close()
        again = hub.subscribe("t", start=resume, end=end, max_unacked=100)
        rest = await drain(again)
        with pytest.raises(EndOfStream):
            await receive_now(again)
        everything = where(first) + where(rest)
        assert sorted(everything) == sorted(
            Position(o, p) for p, stop in end.offsets.items() for o in range(stop)
        )
        assert len(set(everything)) == len(everything)


async def test_partitions_not_named_take_the_defaults(tmp_path: Path) -> None:
    """A partition that Positions do not name starts at "earliest" and reads to
    "latest" (a resume point taken before the log gained partitions still applies)."""
    async with hub_with_logs(tmp_path) as hub:
        await spread(hub, 6, 2)
        got = await drain(hub.subscribe("t", start=Positions({1: 3}), max_unacked=100))
        assert sorted(where(got)) == sorted(
            [Position(o, 0) for o in range(4)]
            + [Position(3, 1)]
            + [Position(o, 2) for o in range(4)]
        )
        got = await drain(hub.subscribe("t", start="earliest", end=Positions({2: 1, 0: 2})))
        assert sorted(where(got)) == sorted(
            [Position(0, 0), Position(1, 0), Position(0, 2)] + [Position(o, 1) for o in range(4)]
        )


async def test_refusals_name_the_partition(tmp_path: Path) -> None:
    async with hub_with_logs(tmp_path) as hub:
        await spread(hub, 3, 2)
        with pytest.raises(ValueError, match="names partition 3: log 't' has partitions 0 to 2"):
            hub.subscribe("t", start=Positions({0: 0, 3: 0}))
        with pytest.raises(ValueError, match="names partition 5"):
            hub.subscribe("t", start="earliest", end=Positions({5: 0}))
        with pytest.raises(ValueError, match="start 3 is past the tail of partition 1 of log 't'"):
            hub.subscribe("t", "g", start=Positions({0: 1, 1: 3}))
        groups = hub.destination("t").stats()["groups"]
        assert isinstance(groups, dict)
        assert "g" not in groups  # no partition kept the group
        assert await drain(hub.subscribe("t", start=Positions({0: 2, 1: 2, 2: 2}))) == []
        with pytest.raises(ValueError, match="is a topic: it keeps no log"):
            hub.subscribe("plain", start=Positions({0: 0}))
        with pytest.raises(ValueError, match="is a topic: it keeps no log"):
            hub.subscribe("plain", end=Positions({0: 0}))


async def test_a_named_group_resumes_at_its_own_position_not_the_start(tmp_path: Path) -> None:
    """As with every start: Positions place a new group; an existing one goes on."""
    async with hub_with_logs(tmp_path) as hub:
        await spread(hub, 3, 2)
        sub = hub.subscribe("t", "readers", start="earliest", max_unacked=100)
        assert len(await drain(sub)) == 6
        sub.close()
        again = hub.subscribe("t", "readers", start=Positions({0: 0, 1: 0, 2: 0}))
        assert await drain(again) == []
        assert resume_of(again) == Positions({0: 2, 1: 2, 2: 2})


# -- a log of one partition ----------------------------------------------------------------


async def test_a_log_of_one_partition_takes_positions_of_partition_0(tmp_path: Path) -> None:
    async with hub_with_logs(tmp_path) as hub:
        placed = await spread(hub, 2, 3, name="one")
        assert placed == [Position(o, 0) for o in range(6)]
        sub = hub.subscribe("one", start=Positions.parse("0:1"), end=Positions({0: 5}))
        first = await drain(sub, 2)
        assert where(first) == [Position(1, 0), Position(2, 0)]
        resume = resume_of(sub)
        assert resume == Positions({0: 3})
        sub.close()
        again = hub.subscribe("one", start=resume, end=Positions({0: 5}))
        assert where(await drain(again)) == [Position(3, 0), Position(4, 0)]
        with pytest.raises(EndOfStream):
            await receive_now(again)
        with pytest.raises(ValueError, match="this log is partition 0 only"):
            hub.subscribe("one", start=Positions({0: 0, 1: 0}))
        with pytest.raises(ValueError, match="'1:0': this log is partition 0 only"):
            hub.subscribe("one", end=Positions({1: 0}))
        with pytest.raises(ValueError, match="start 7 is past the tail of log 'one'"):
            hub.subscribe("one", start=Positions({0: 7}))


async def test_resume_points_survive_more_publishing_between(tmp_path: Path) -> None:
    """Messages published while the subscriber was away are all delivered on resuming."""
    async with hub_with_logs(tmp_path) as hub:
        await spread(hub, 3, 1)
        sub = hub.subscribe("t", start="earliest")
        first = await drain(sub)
        resume = resume_of(sub)
        sub.close()
        await trio.lowlevel.checkpoint()
        away = await spread(hub, 4, 2)
        rest = await drain(hub.subscribe("t", start=resume, max_unacked=100))
        assert sorted(where(rest)) == sorted(away)
        assert len(first) == 3


async def test_the_resume_point_is_after_deliveries_received_unacked(tmp_path: Path) -> None:
    """Received is what counts, not acked: resuming after closing with deliveries
    unacked (or nacked for redelivery) does not deliver them again."""
    async with hub_with_logs(tmp_path) as hub:
        placed = await spread(hub, 3, 2)
        sub = hub.subscribe("t", start="earliest", max_unacked=100)
        first = await receive_now(sub, 4)
        assert len(first) == 4
        sub.nack(first[0].tag)  # given back to the group: delivered all the same
        resume = resume_of(sub)
        assert resume == Positions({0: 0, 1: 0, 2: 0}).advanced(where(first))
        sub.close()
        rest = await drain(hub.subscribe("t", start=resume, max_unacked=100))
        assert sorted(where(first) + where(rest)) == sorted(placed)


async def test_a_log_in_memory_resumes_the_same_way(tmp_path: Path) -> None:
    async with hub_with_logs(tmp_path) as hub:
        placed = await spread(hub, 2, 3, name="mem")
        sub = hub.subscribe("mem", start=Positions({0: 0}), end=Positions.parse("0:5"))
        first = await drain(sub, 3)
        sub.close()
        again = hub.subscribe("mem", start=resume_of(sub), end=Positions.parse("0:5"))
        assert where(first) + where(await drain(again)) == placed[:5]
        with pytest.raises(ValueError, match="this log is partition 0 only"):
            hub.subscribe("mem", start=Positions({2: 0}))


async def test_a_filtered_subscription_resumes_past_what_it_skipped(tmp_path: Path) -> None:
    """Messages the filter skipped lie below the resume point: they would not match."""
    async with hub_with_logs(tmp_path) as hub:
        wanted = Filter.equals(level="error")
        for k in range(6):
            level = "error" if k % 2 else "info"
            receipt = await hub.publish([Message("t", b"m%d" % k, {"level": level})])
            assert await receipt.wait() == Outcome.DELIVERED
        sub = hub.subscribe("t", start="earliest", filter=wanted, max_unacked=100)
        first = await drain(sub, 1)
        assert [d.message.headers["level"] for d in first] == ["error"]
        resume = resume_of(sub)
        sub.close()
        again = hub.subscribe("t", start=resume, filter=wanted, max_unacked=100)
        rest = await drain(again)
        assert sorted(d.message.body for d in first + rest) == [b"m1", b"m3", b"m5"]
