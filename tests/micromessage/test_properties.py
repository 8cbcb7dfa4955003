"""Micromessage2 properties <-> gateway headers: typed values into header text the
core's filters compare as numbers and times, headers of other protocols back into
typed properties, names outside the field syntax, and bad property lists."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sdk import Filter, LocalProtocolError, RemoteProtocolError
from protocols.micromessage.filters import parse_filter
from protocols.micromessage.properties import (
    format_properties,
    header_to_value,
    parse_properties,
    value_to_header,
)

# Research vector 8, the recommended typed form.
TYPED = "first-name:Tjonas;age:N42;"
# Research vector 7, from SharpMessaging's tests: untyped, with '_' in the name.
SHARP = "last_name:kalle;"


def test_golden_typed_properties() -> None:
    headers = parse_properties(TYPED)
    assert headers == {"first-name": "jonas", "age": "42"}
    assert format_properties(headers) == TYPED


def test_golden_sharpmessaging_properties_need_compat() -> None:
    with pytest.raises(RemoteProtocolError, match="must start with N, D or T"):
        parse_properties(SHARP)
    assert parse_properties(SHARP, untyped_as_text=True) == {"last_name": "kalle"}


def test_golden_date_value() -> None:
    # 2014-10-13 12:00 UTC+1
    assert value_to_header("D1413198000.0", "t") == "2014-10-13T11:00:00Z"
    assert header_to_value("2014-10-13T11:00:00Z") == "D1413198000.0"


@pytest.mark.parametrize(
    ("value", "header"),
    [
        ("N0", "0"),
        ("N-7", "-7"),
        ("N007", "7"),
        (f"N{2**63 - 1}", str(2**63 - 1)),
        (f"N{-(2**63)}", str(-(2**63))),
        ("D0", "1970-01-01T00:00:00Z"),
        ("D-1.5", "1969-12-31T23:59:58.500000Z"),
        ("D1413198000.25", "2014-10-13T11:00:00.250000Z"),
        ("D1413198000.0000004", "2014-10-13T11:00:00Z"),
        ("D1." + "0" * 5000, "1970-01-01T00:00:01Z"),
        ("T", ""),
        ("THello%20%22world%22", 'Hello "world"'),
        ("Ta+b", "a+b"),
        ("T%C3%A9", "é"),
        ("T%3B%3A", ";:"),
    ],
)
def test_value_to_header(value: str, header: str) -> None:
    assert value_to_header(value, "p") == header


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "must start with N, D or T"),
        ("kalle", "must start with N, D or T"),
        ("N", "64-bit"),
        ("N1.5", "64-bit"),
        ("N+1", "64-bit"),
        (f"N{2**63}", "64-bit"),
        ("N" + "9" * 5000, "64-bit"),
        ("D", "seconds"),
        ("D1e3", "seconds"),
        ("D99999999999999", "seconds"),
        ("D" + "9" * 5000, "seconds"),
        ("D-" + "9" * 5000, "seconds"),
        ("T%", "%XX"),
        ("T%FF", "UTF-8"),
    ],
)
def test_bad_values(value: str, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        value_to_header(value, "p")


def test_compat_takes_unparsed_values_as_text() -> None:
    assert value_to_header("Nelson", "p", untyped_as_text=True) == "Nelson"
    assert value_to_header("Dave%20X", "p", untyped_as_text=True) == "Dave X"
    assert value_to_header("kalle%21", "p", untyped_as_text=True) == "kalle!"
    assert value_to_header("N42", "p", untyped_as_text=True) == "42"
    with pytest.raises(RemoteProtocolError):
        value_to_header("%zz", "p", untyped_as_text=True)


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("42", "N42"),
        ("-42", "N-42"),
        ("0", "N0"),
        ("007", "T007"),
        ("-0", "T-0"),
        ("+1", "T%2B1"),
        ("4.5", "T4.5"),
        (str(2**63), f"T{2**63}"),
        ("2014-10-13T11:00:00.250000Z", "D1413198000.25"),
        ("1969-12-31T23:59:58.500000Z", "D-1.5"),
        ("2014-10-13T11:00:00+00:00", "T2014-10-13T11%3A00%3A00%2B00%3A00"),
        ("2014-10-13T11:00:00.000000Z", "T2014-10-13T11%3A00%3A00.000000Z"),
        ("2014-13-13T11:00:00Z", "T2014-13-13T11%3A00%3A00Z"),
        ("hello world", "Thello%20world"),
        ("", "T"),
    ],
)
def test_header_to_value(header: str, value: str) -> None:
    assert header_to_value(header) == value


def test_names_outside_the_field_syntax() -> None:
    text = format_properties({"X-Level": "error", "a_b": "1", "a b": "x", "é": "y"})
    assert text == "%58-%4Cevel:Terror;a%5Fb:N1;a%20b:Tx;%C3%A9:Ty;"
    assert parse_properties(text) == {"X-Level": "error", "a_b": "1", "a b": "x", "é": "y"}
    assert parse_properties("Level:N1;a.b:N2") == {"Level": "1", "a.b": "2"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (";", "property 1 is empty"),
        ("a:N1;;b:N2;", "property 2 is empty"),
        ("a;", "has no ':'"),
        (":N1;", "only"),
        ("a b:N1;", "only"),
        ("a=b:N1;", "only"),
        ("a%4:N1;", "only"),
        ("a:N1;a:N2;", "given twice"),
        ("a:N1;%61:N2;", "given twice"),
        ("a:x;", "must start with N, D or T"),
    ],
)
def test_bad_property_lists(text: str, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        parse_properties(text)


def test_list_edges() -> None:
    assert parse_properties("") == {}
    assert parse_properties("a:N1") == {"a": "1"}
    assert parse_properties("a:T%3A%3B;b:Tx%3Ay") == {"a": ":;", "b": "x:y"}
    assert format_properties({}) == ""


@pytest.mark.parametrize("headers", [{"": "x"}, {"a": "\ud800"}, {"\ud800": "x"}])
def test_format_refuses_what_the_wire_cannot_carry(headers: dict[str, str]) -> None:
    with pytest.raises(LocalProtocolError):
        format_properties(headers)


# ---- across protocols, through the core's filters ---------------------------


def test_ndjson_header_matched_by_micromessage_filter() -> None:
    ndjson_headers = {"age": "42"}
    assert parse_filter("age>=N18").matches(ndjson_headers)
    assert not parse_filter("age>=N43").matches(ndjson_headers)


def test_micromessage_number_matched_by_ndjson_filter() -> None:
    headers = parse_properties("age:N42;")
    assert Filter.from_json([["age", ">=", 18]]).matches(headers)
    assert not Filter.from_json([["age", ">", 42]]).matches(headers)
    assert Filter.from_json({"age": 42}).matches(headers)


def test_micromessage_date_compared_as_time() -> None:
    headers = parse_properties("at:D1413198000.5;")
    assert Filter.from_json([["at", ">", {"date": "2014-10-13T11:00:00Z"}]]).matches(headers)
    assert Filter.from_json([["at", "<", {"date": "1413198001"}]]).matches(headers)
    assert parse_filter("at=D1413198000.5").matches(headers)
    assert not parse_filter("at>D1413198000.5").matches(headers)


def test_date_property_does_not_match_a_number_filter() -> None:
    headers = parse_properties("at:D1413198000;")
    for op in ("=", "!=", "<", "<=", ">", ">="):
        assert not parse_filter(f"at{op}N0").matches(headers), op


def test_text_property_compared_as_text() -> None:
    headers = parse_properties("name:TGauffin%20J;")
    assert parse_filter("name<TGauf").matches(headers)
    assert not parse_filter("name<Tgauf").matches(headers)
    assert not parse_filter("name>=N0").matches(headers)


# ---- round trips -------------------------------------------------------------

header_maps = st.dictionaries(
    st.text(min_size=1, max_size=12),
    st.one_of(
        st.text(max_size=20),
        st.integers(min_value=-(2**64), max_value=2**64).map(str),
        st.datetimes().map(lambda d: d.isoformat() + "Z"),
    ),
    max_size=6,
)


@given(header_maps)
def test_headers_survive_the_trip(headers: dict[str, str]) -> None:
    text = format_properties(headers)
    assert text.isascii()
    assert parse_properties(text) == headers


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_numbers_stay_numbers(n: int) -> None:
    assert header_to_value(value_to_header(f"N{n}", "p")) == f"N{n}"


@given(st.datetimes())
def test_dates_stay_dates(dt: datetime) -> None:
    header = dt.isoformat() + "Z"
    value = header_to_value(header)
    assert value.startswith("D")
    assert value_to_header(value, "p") == header
