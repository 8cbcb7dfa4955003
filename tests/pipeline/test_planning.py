"""Offset, limit and partition planning of the ``interchange`` data source, over a
segment service in memory: no Spark, no gateway."""

from __future__ import annotations

import itertools
import logging

import pytest

from gateway.pipeline.planning import (
    LATEST,
    DataLossError,
    Planner,
    SegmentRange,
    offsets_from_json,
    offsets_to_json,
    parse_offsets,
    share,
)
from tests.pipeline.fakes import FakeSegment, FakeService

# Events of 92-byte payloads take 100 bytes each with their header.
E = 100


def events(n: int) -> FakeSegment:
    return FakeSegment([92] * n)


# -- offset JSON ---------------------------------------------------------------


def test_offsets_round_trip_through_their_json_form() -> None:
    offsets = {"parts": {2: 96, 0: 0, 1: 880}, "logs": {0: 1234}}
    doc = offsets_to_json(offsets)
    assert doc == {"logs": {"0": 1234}, "parts": {"0": 0, "1": 880, "2": 96}}
    assert list(doc) == ["logs", "parts"]
    assert list(doc["parts"]) == ["0", "1", "2"]
    assert offsets_from_json(doc) == offsets


def test_parse_offsets_words_and_json() -> None:
    assert parse_offsets("earliest", option="startingOffsets") == "earliest"
    assert parse_offsets(" Latest ", option="startingOffsets") == "latest"
    spec = parse_offsets('{"logs": {"0": -2, "1": -1, "2": 500}}', option="startingOffsets")
    assert spec == {"logs": {0: -2, 1: -1, 2: 500}}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("soonest", "expected earliest, latest or JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"logs": 5}', "logs: expected an object"),
        ('{"logs": {"x": 5}}', "partition index"),
        ('{"logs": {"0": "5"}}', "integer offset"),
        ('{"logs": {"0": -3}}', "offset -3"),
    ],
)
def test_parse_offsets_says_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(ValueError, match="option endingOffsets") as info:
        parse_offsets(text, option="endingOffsets")
    assert why in str(info.value)


def test_resolve_earliest_latest_given_and_missing() -> None:
    logs = events(10)
    logs.dropped = 2
    service = FakeService(logs=[logs], parts=[events(3), events(4)])
    planner = Planner(service, ["logs", "parts"])
    layout = planner.layout()
    assert planner.resolve("earliest", layout) == {"logs": {0: 2 * E}, "parts": {0: 0, 1: 0}}
    assert planner.resolve("latest", layout) == {"logs": {0: 10 * E}, "parts": {0: 3 * E, 1: 4 * E}}
    spec = parse_offsets('{"parts": {"0": -1, "1": 150}, "other": {"0": 7}}', option="s")
    # 150 is inside the second event: its boundary is 100; logs is left out: earliest.
    assert planner.resolve(spec, layout) == {"logs": {0: 2 * E}, "parts": {0: 3 * E, 1: E}}
    # An end left out is the durable end.
    ends = planner.resolve(spec, layout, missing=LATEST)
    assert ends == {"logs": {0: 10 * E}, "parts": {0: 3 * E, 1: E}}
    # Past the durable end is the end; below the retained start is kept for the loss check.
    spec = parse_offsets('{"logs": {"0": 50}, "parts": {"0": 9999}}', option="s")
    assert planner.resolve(spec, layout) == {"logs": {0: 50}, "parts": {0: 3 * E, 1: 0}}


def test_a_destination_never_written_has_no_partitions() -> None:
    planner = Planner(FakeService(), ["nothing"])
    layout = planner.layout()
    assert layout == {"nothing": []}
    assert planner.resolve("earliest", layout) == {"nothing": {}}
    assert planner.ranges({"nothing": {}}, {"nothing": {}}) == []


# -- sharing a limit -----------------------------------------------------------


def test_share_is_even_and_gives_what_small_partitions_leave_to_the_others() -> None:
    a, b, c = ("d", 0), ("d", 1), ("d", 2)
    assert share(9, {a: 100, b: 100, c: 100}) == {a: 3, b: 3, c: 3}
    assert share(10, {a: 100, b: 100, c: 100}) == {a: 4, b: 3, c: 3}
    assert share(10, {a: 1, b: 100, c: 100}) == {a: 1, b: 5, c: 4}
    assert share(10, {a: 2, b: 3, c: 0}) == {a: 2, b: 3, c: 0}


def test_share_gives_every_partition_with_data_at_least_one() -> None:
    a, b, c = ("d", 0), ("d", 1), ("d", 2)
    assert share(1, {a: 5, b: 5, c: 5}) == {a: 1, b: 1, c: 1}
    assert share(0, {a: 5, b: 0, c: 5}) == {a: 1, b: 0, c: 1}


# -- streaming triggers --------------------------------------------------------


def test_max_rows_is_shared_across_partitions() -> None:
    service = FakeService(parts=[events(10), events(2), events(10)])
    planner = Planner(service, ["parts"])
    start = {"parts": {0: 0, 1: 0, 2: 0}}
    end = planner.latest(start, max_rows=8)
    # Partition 1 has 2 events: the other two share the remaining 6.
    assert end == {"parts": {0: 3 * E, 1: 2 * E, 2: 3 * E}}
    assert planner.latest(end, max_rows=8) == {"parts": {0: 7 * E, 1: 2 * E, 2: 7 * E}}
    assert planner.latest(start) == {"parts": {0: 10 * E, 1: 2 * E, 2: 10 * E}}


def test_max_rows_counts_from_the_start_offset_event() -> None:
    service = FakeService(logs=[events(10)])
    planner = Planner(service, ["logs"])
    assert planner.latest({"logs": {0: 7 * E}}, max_rows=2) == {"logs": {0: 9 * E}}
    assert planner.latest({"logs": {0: 9 * E}}, max_rows=2) == {"logs": {0: 10 * E}}
    assert planner.latest({"logs": {0: 10 * E}}, max_rows=2) == {"logs": {0: 10 * E}}


def test_max_bytes_cuts_at_the_last_boundary_within_each_share() -> None:
    service = FakeService(parts=[events(10), events(10)])
    planner = Planner(service, ["parts"])
    start = {"parts": {0: 0, 1: 0}}
    assert planner.latest(start, max_bytes=650) == {"parts": {0: 3 * E, 1: 3 * E}}
    # A share smaller than the next event still reads that one event.
    assert planner.latest(start, max_bytes=20) == {"parts": {0: E, 1: E}}


def test_max_bytes_reads_one_big_event_whole() -> None:
    service = FakeService(logs=[FakeSegment([5000, 92])])
    planner = Planner(service, ["logs"])
    assert planner.latest({"logs": {0: 0}}, max_bytes=1000) == {"logs": {0: 5008}}


def test_available_now_never_passes_the_frozen_target() -> None:
    logs = events(10)
    service = FakeService(logs=[logs])
    planner = Planner(service, ["logs"])
    target = planner.bounds(planner.layout())
    logs.sizes.extend([92] * 10)  # written after the trigger started
    end = planner.latest({"logs": {0: 0}}, max_rows=6, target=target)
    assert end == {"logs": {0: 6 * E}}
    end = planner.latest(end, max_rows=6, target=target)
    assert end == {"logs": {0: 10 * E}}
    assert planner.latest(end, max_rows=6, target=target) == end
    assert planner.latest(end, max_bytes=10_000, target=target) == end
    assert planner.latest(end, target=target) == end
    assert planner.latest(end) == {"logs": {0: 20 * E}}


def test_a_new_partition_joins_at_its_retained_start_reading_nothing_yet() -> None:
    service = FakeService(parts=[events(3)])
    planner = Planner(service, ["parts"])
    start = planner.latest({"parts": {0: 0}})
    assert start == {"parts": {0: 3 * E}}
    late = service.add("parts/1", *[92] * 5)
    late.dropped = 1
    end = planner.latest(start)
    assert end == {"parts": {0: 3 * E, 1: E}}
    assert planner.ranges(start, end) == []
    assert planner.latest(end) == {"parts": {0: 3 * E, 1: 5 * E}}
    assert planner.ranges(end, planner.latest(end)) == [
        SegmentRange("parts", 1, "parts/1", E, 5 * E)
    ]


# -- ranges and splitting ------------------------------------------------------


def test_ranges_one_per_partition_with_data() -> None:
    service = FakeService(parts=[events(3), events(0), events(2)])
    planner = Planner(service, ["parts"])
    start = {"parts": {0: E, 1: 0, 2: 2 * E}}
    end = {"parts": {0: 3 * E, 1: 0, 2: 2 * E}}
    assert planner.ranges(start, end) == [SegmentRange("parts", 0, "parts/0", E, 3 * E)]


def test_large_ranges_are_split_at_event_boundaries() -> None:
    service = FakeService(logs=[FakeSegment([92, 92, 92, 2000, 92, 92])])
    planner = Planner(service, ["logs"], max_bytes_per_partition=250)
    got = planner.ranges({"logs": {0: 0}}, {"logs": {0: 2408}})
    assert [(r.start, r.end) for r in got] == [(0, 200), (200, 300), (300, 2308), (2308, 2408)]
    assert all(r.segment == "logs/0" for r in got)


def test_min_partitions_halves_the_largest_ranges_at_boundaries() -> None:
    service = FakeService(parts=[events(10), events(3), FakeSegment([5000])])
    planner = Planner(service, ["parts"], min_partitions=6)
    end = {"parts": {0: 10 * E, 1: 3 * E, 2: 5008}}
    got = planner.ranges({"parts": {0: 0, 1: 0, 2: 0}}, end)
    # Partition 2 is one event: never cut. Partition 0 is halved, then its halves.
    assert [(r.partition, r.start, r.end) for r in got] == [
        (0, 0, 2 * E),
        (0, 2 * E, 5 * E),
        (0, 5 * E, 7 * E),
        (0, 7 * E, 10 * E),
        (1, 0, 3 * E),
        (2, 0, 5008),
    ]
    assert planner.ranges({"parts": {0: 0, 1: 0, 2: 0}}, end) == got
    few = Planner(service, ["parts"], min_partitions=100).ranges(
        {"parts": {1: 0}}, {"parts": {1: 3 * E}}
    )
    assert [(r.start, r.end) for r in few] == [(0, E), (E, 2 * E), (2 * E, 3 * E)]


def test_a_range_under_the_split_size_asks_nothing() -> None:
    service = FakeService(logs=[events(10)])
    planner = Planner(service, ["logs"], max_bytes_per_partition=10 * E)
    service.calls.clear()
    assert len(planner.ranges({"logs": {0: 0}}, {"logs": {0: 10 * E}})) == 1
    assert [c for c in service.calls if c[0] == "locate"] == []


# -- data loss -----------------------------------------------------------------


def truncated() -> FakeService:
    logs = events(10)
    logs.dropped = 4  # retention dropped bytes 0..400
    return FakeService(logs=[logs])


def test_a_start_below_the_retained_start_fails_naming_segment_and_bytes() -> None:
    planner = Planner(truncated(), ["logs"])
    for plan in (
        lambda: planner.latest({"logs": {0: E}}),
        lambda: planner.ranges({"logs": {0: E}}, {"logs": {0: 10 * E}}),
    ):
        with pytest.raises(DataLossError) as info:
            plan()
        message = str(info.value)
        assert "segment 'logs/0'" in message
        assert "bytes 100 to 400 (300 bytes)" in message
        assert "failOnDataLoss" in message


def test_without_fail_on_data_loss_the_start_skips_and_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    planner = Planner(truncated(), ["logs"], fail_on_data_loss=False)
    end = planner.latest({"logs": {0: E}}, max_rows=3)
    assert end == {"logs": {0: 7 * E}}
    with caplog.at_level(logging.WARNING, logger="gateway.pipeline"):
        got = planner.ranges({"logs": {0: E}}, end)
    assert got == [SegmentRange("logs", 0, "logs/0", 4 * E, 7 * E)]
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "segment 'logs/0': bytes 100 to 400 (300 bytes)" in record.getMessage()
    assert "skipping to byte 400" in record.getMessage()


def test_a_batch_wholly_dropped_reads_nothing() -> None:
    planner = Planner(truncated(), ["logs"], fail_on_data_loss=False)
    assert planner.ranges({"logs": {0: 0}}, {"logs": {0: 2 * E}}) == []


def test_split_pieces_are_even_and_fill_whole_waves_of_min_partitions() -> None:
    """50 events over a 16-event bound: 4 pieces, not 16+16+16+2; with two cores,
    4 stays 4 (two full waves), and with three it becomes 6."""
    service = FakeService(logs=[events(50)])
    for cores, sizes in ((1, [12, 13, 12, 13]), (2, [12, 13, 12, 13]), (3, [8, 8, 9, 8, 8, 9])):
        planner = Planner(service, ["logs"], max_bytes_per_partition=16 * E, min_partitions=cores)
        got = planner.ranges({"logs": {0: 0}}, {"logs": {0: 50 * E}})
        assert [(r.end - r.start) // E for r in got] == sizes
        assert got[0].start == 0
        assert got[-1].end == 50 * E
        assert all(a.end == b.start for a, b in itertools.pairwise(got))
