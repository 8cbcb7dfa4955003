"""Durations and sizes as written in config files."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config.units import parse_duration, parse_size


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("500ms", 0.5),
        ("1ms", 0.001),
        ("10s", 10.0),
        ("0s", 0.0),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("1.5h", 5400.0),
        ("0.25s", 0.25),
        ("10", 10.0),
        ("0", 0.0),
        (" 10s ", 10.0),
        ("10 s", 10.0),
        (10, 10.0),
        (0, 0.0),
        (2.5, 2.5),
    ],
)
def test_parse_duration(value: object, seconds: float) -> None:
    result = parse_duration(value)
    assert isinstance(result, float)
    assert result == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    [
        "",
        " ",
        "s",
        "ms",
        "10x",
        "10 sec",
        "10seconds",
        "1,5s",
        "10s 5m",
        "s10",
        "0x10",
        "ten seconds",
        "nan",
        "inf",
        True,
        False,
        None,
        [],
        {},
        b"10s",
    ],
)
def test_parse_duration_rejects_bad_values(value: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(value)


@pytest.mark.parametrize("value", [-1, -0.5, "-1s", "-5m", "-0.1"])
def test_parse_duration_rejects_negatives(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize("value", [-1, -0.001])
def test_negative_duration_message(value: float) -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_duration(value)


def test_parse_duration_rejects_nan() -> None:
    """TOML has ``nan``: a NaN timeout must not pass as a duration."""
    with pytest.raises(ValueError):
        parse_duration(math.nan)


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("512B", 512),
        ("0B", 0),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("10MB", 10_000_000),
        ("64MiB", 64 * 2**20),
        ("1GB", 10**9),
        ("2GiB", 2 * 2**30),
        ("1TB", 10**12),
        ("1TiB", 2**40),
        ("64mib", 64 * 2**20),
        ("64MIB", 64 * 2**20),
        ("1kb", 1000),
        ("1.5KiB", 1536),
        ("100", 100),
        (" 2 KiB ", 2048),
        (0, 0),
        (1024, 1024),
    ],
)
def test_parse_size(value: object, size: int) -> None:
    result = parse_size(value)
    assert type(result) is int
    assert result == size


@pytest.mark.parametrize(
    "value",
    [
        "",
        "B",
        "KiB",
        "64XB",
        "64 MiBs",
        "1,5MB",
        "lots",
        "64MiB 1KiB",
        1.5,
        1024.0,
        True,
        False,
        None,
        [],
        b"64MiB",
    ],
)
def test_parse_size_rejects_bad_values(value: object) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(value)


@pytest.mark.parametrize("value", [-1, -1024, "-1KiB", "-5"])
def test_parse_size_rejects_negatives(value: object) -> None:
    with pytest.raises(ValueError):
        parse_size(value)


def test_negative_size_message() -> None:
    with pytest.raises(ValueError, match="negative"):
        parse_size(-1)


def test_parse_size_absurdly_large_string_is_a_value_error() -> None:
    """Config code catches ValueError only; anything else would crash ``gateway check``."""
    with pytest.raises(ValueError):
        parse_size("1" + "0" * 400 + "KiB")


@given(n=st.integers(min_value=0, max_value=2**20))
def test_size_units_multiply(n: int) -> None:
    assert parse_size(f"{n}KiB") == n * 1024
    assert parse_size(f"{n}MB") == n * 10**6
    assert parse_size(f"{n}B") == n
    assert parse_size(n) == n


@given(n=st.integers(min_value=0, max_value=10**6))
def test_duration_units_multiply(n: int) -> None:
    assert parse_duration(f"{n}ms") == pytest.approx(n / 1000)
    assert parse_duration(f"{n}m") == pytest.approx(n * 60)
    assert parse_duration(f"{n}h") == pytest.approx(n * 3600)
    assert parse_duration(n) == float(n)


@given(text=st.text(max_size=12))
def test_parsers_fail_only_with_value_error(text: str) -> None:
    for parse in (parse_duration, parse_size):
        try:
            result = parse(text)
        except ValueError:
            continue
        assert result >= 0
