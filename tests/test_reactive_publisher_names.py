"""Reactive streams' publisher strings: what a remote subscriber may ask for, and which
names a listener exposes (protocols/reactive/publisher_names.py)."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sdk import Filter, Positions
from protocols.reactive.publisher_names import PublisherName, exposed, parse_publisher


def test_a_bare_name_is_a_destination_with_the_defaults() -> None:
    assert parse_publisher("logs") == PublisherName("logs")


def test_every_key() -> None:
    got = parse_publisher('logs?group=g1&from=earliest&to=42&filter={"level":"error"}')
    assert got == PublisherName(
        "logs", group="g1", start="earliest", end=42, filter=Filter.equals(level="error")
    )
    assert parse_publisher("logs?from=17&to=latest") == PublisherName(
        "logs", start=17, end="latest"
    )
    assert parse_publisher("logs?from=latest").start == "latest"


def test_positions_in_every_partition_for_a_reconnecting_subscriber() -> None:
    got = parse_publisher("logs?group=g&from=0:17,1:4&to=0:20,1:9")
    assert got.start == Positions({0: 17, 1: 4})
    assert got.end == Positions({0: 20, 1: 9})
    assert parse_publisher("logs?from=0%3A17%2C1%3A4").start == Positions({0: 17, 1: 4})


def test_names_and_values_are_percent_decoded() -> None:
    got = parse_publisher("a%3Fb?group=x%26y&filter=%5B%5B%22n%22%2C%22%3E%3D%22%2C18%5D%5D")
    assert (got.destination, got.group) == ("a?b", "x&y")
    assert got.filter == Filter.from_json([["n", ">=", 18]])


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "no destination"),
        ("?group=g", "no destination"),
        ("logs?group", "has no '='"),
        ("logs?grp=g", "unknown publisher query key 'grp'"),
        ("logs?group=a&group=b", "given twice"),
        ("logs?group=", "group must not be empty"),
        ("logs?from=soon", "from must be earliest, latest, an offset"),
        ("logs?from=-1", "from must be earliest, latest, an offset"),
        ("logs?to=earliest", "to must be latest, an offset"),
        ("logs?from=0:1,0:2", "from: "),
        ("logs?filter={", "filter is not JSON"),
        ('logs?filter=["x"]', "filter: "),
        ("logs%FF", "can't decode"),
        ("x" * (64 * 1024 + 1), "at most 65536"),
    ],
)
def test_what_is_refused_says_why(text: str, words: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_publisher(text)
    assert words in str(raised.value)


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=20))
def test_any_name_and_group_survive_quoting(name: str, group: str) -> None:
    got = parse_publisher(f"{quote(name, safe='')}?group={quote(group, safe='')}")
    assert (got.destination, got.group) == (name, group)


def test_only_names_a_glob_matches_are_exposed() -> None:
    publishers = ["logs", "metrics/*", "team-[ab]"]
    assert exposed("logs", publishers)
    assert exposed("metrics/cpu", publishers)
    assert exposed("team-a", publishers)
    assert not exposed("Logs", publishers)  # case matters
    assert not exposed("team-c", publishers)
    assert not exposed("logs2", publishers)
    assert not exposed("anything", [])
