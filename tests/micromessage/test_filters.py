"""Micromessage2 filter expressions: parsing, every operator per type on the core's
filter, absent headers, type mismatches, URL decoding, longest-match operators,
bad expressions as protocol errors, and write/read round trips."""

from __future__ import annotations

from decimal import Decimal
from urllib.parse import unquote

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sdk import Filter, LocalProtocolError, RemoteProtocolError
from protocols.micromessage.filters import (
    OPERATORS,
    Condition,
    decode_text,
    encode_name,
    encode_text,
    format_filter,
    parse_conditions,
    parse_filter,
    to_filter,
)

# Research vector: the subscribe command's filter parameter, as on the wire.
SUBSCRIBE_FILTER_PARAM = "age%3E%3DN18%3Blast-name%3CTgauf"


def matches(expression: str, headers: dict[str, str]) -> bool:
    return parse_filter(expression).matches(headers)


def test_golden_subscribe_vector() -> None:
    expression = unquote(SUBSCRIBE_FILTER_PARAM)
    assert expression == "age>=N18;last-name<Tgauf"
    assert parse_conditions(expression) == (
        Condition("age", ">=", "N", 18),
        Condition("last-name", "<", "T", "gauf"),
    )
    f = parse_filter(expression)
    assert f.matches({"age": "18", "last-name": "gauffin"})
    assert not f.matches({"age": "17", "last-name": "gauffin"})
    assert not f.matches({"age": "40", "last-name": "Gauffin"})
    assert format_filter(parse_conditions(expression)) == expression


# ---- numbers: each operator ---------------------------------------------------

NUMBER_CASES = [
    ("=", [("42", True), ("41", False), ("42.0", True), ("-42", False)]),
    ("!=", [("42", False), ("41", True), ("43", True)]),
    ("<", [("41", True), ("42", False), ("43", False), ("-1000", True)]),
    ("<=", [("41", True), ("42", True), ("43", False)]),
    (">", [("41", False), ("42", False), ("43", True), ("42.5", True)]),
    (">=", [("41", False), ("42", True), ("43", True)]),
]


@pytest.mark.parametrize(("op", "cases"), NUMBER_CASES)
def test_number_operators(op: str, cases: list[tuple[str, bool]]) -> None:
    for header, expected in cases:
        assert matches(f"n{op}N42", {"n": header}) is expected, (op, header)


def test_number_compares_numerically_not_as_text() -> None:
    assert matches("n<N10", {"n": "9"})  # "9" > "10" as text
    assert matches("n>=N-5", {"n": "-4"})


def test_number_int64_extremes() -> None:
    assert parse_conditions(f"n=N{2**63 - 1}")[0].value == 2**63 - 1
    assert parse_conditions(f"n=N{-(2**63)}")[0].value == -(2**63)
    assert matches(f"n=N{2**63 - 1}", {"n": str(2**63 - 1)})
    assert not matches(f"n=N{2**63 - 1}", {"n": str(2**63 - 2)})
    for bad in (2**63, -(2**63) - 1):
        with pytest.raises(RemoteProtocolError, match="64-bit"):
            parse_conditions(f"n=N{bad}")


# ---- dates: each operator -----------------------------------------------------

# 2014-10-13 12:00 UTC+1, the draft's example.
WHEN = "1413198000"
BEFORE = "2014-10-13T10:59:59+00:00"
AT = "2014-10-13T11:00:00Z"
AFTER = "2014-10-13T13:00:01+02:00"

DATE_CASES = [
    ("=", [(AT, True), (WHEN, True), ("1413198000.0", True), (BEFORE, False)]),
    ("!=", [(AT, False), (BEFORE, True), (AFTER, True)]),
    ("<", [(BEFORE, True), (AT, False), (AFTER, False)]),
    ("<=", [(BEFORE, True), (AT, True), (AFTER, False)]),
    (">", [(BEFORE, False), (AT, False), (AFTER, True)]),
    (">=", [(BEFORE, False), (AT, True), (AFTER, True), ("1413198000.5", True)]),
]


@pytest.mark.parametrize(("op", "cases"), DATE_CASES)
def test_date_operators(op: str, cases: list[tuple[str, bool]]) -> None:
    for header, expected in cases:
        assert matches(f"t{op}D{WHEN}.0", {"t": header}) is expected, (op, header)


def test_date_fraction_to_the_microsecond() -> None:
    assert matches("t>D1413198000.25", {"t": "2014-10-13T11:00:00.250001Z"})
    assert not matches("t>D1413198000.25", {"t": "2014-10-13T11:00:00.25Z"})
    assert parse_conditions("t=D-1.5")[0].value == Decimal("-1.5")


# ---- text: each operator -----------------------------------------------------

TEXT_CASES = [
    ("=", [("hello", True), ("Hello", False), ("hello!", False)]),
    ("!=", [("hello", False), ("Hello", True), ("", True)]),
    ("<", [("hello world", True), ("hello", True), ("say hello", False)]),
    (">", [("say hello", True), ("hello", True), ("hello world", False)]),
    ("&", [("oh hello there", True), ("hell", False), ("HELLO", False)]),
    ("~", [("oh hello there", False), ("hell", True), ("HELLO", True)]),
]


@pytest.mark.parametrize(("op", "cases"), TEXT_CASES)
def test_text_operators(op: str, cases: list[tuple[str, bool]]) -> None:
    for header, expected in cases:
        assert matches(f"s{op}Thello", {"s": header}) is expected, (op, header)


@pytest.mark.parametrize("op", ["<=", ">="])
def test_ordering_operators_refused_for_text(op: str) -> None:
    with pytest.raises(RemoteProtocolError, match=f"operator '{op}' is not defined for T"):
        parse_conditions(f"s{op}Tabc")


@pytest.mark.parametrize(("op", "kind"), [(o, k) for o in "&~" for k in ("N1", "D1")])
def test_text_operators_refused_for_numbers_and_dates(op: str, kind: str) -> None:
    with pytest.raises(RemoteProtocolError, match="is not defined for"):
        parse_conditions(f"x{op}{kind}")


# ---- absent properties and type mismatches ----------------------------------

ALL_VALID = [f"x{op}N1" for op in ("=", "!=", "<", "<=", ">", ">=")] + [
    f"x{op}Ta" for op in ("=", "!=", "<", ">", "&", "~")
]


@pytest.mark.parametrize("expression", [*ALL_VALID, "x!=D0", "x<D0"])
def test_absent_property_never_matches(expression: str) -> None:
    assert not matches(expression, {})
    assert not matches(expression, {"y": "1", "X": "1"})


@pytest.mark.parametrize("op", ["=", "!=", "<", "<=", ">", ">="])
def test_number_condition_on_non_number_never_matches(op: str) -> None:
    for header in ("abc", "", "1 ", "0x10", AT, "N1"):
        assert not matches(f"x{op}N1", {"x": header}), (op, header)


@pytest.mark.parametrize("op", ["=", "!=", "<", "<=", ">", ">="])
def test_date_condition_on_non_date_never_matches(op: str) -> None:
    for header in ("abc", "", "yesterday", "D1413198000.0"):
        assert not matches(f"x{op}D1413198000", {"x": header}), (op, header)


def test_text_condition_compares_the_headers_text() -> None:
    assert matches("x=T42", {"x": "42"})
    assert matches("x<T2014", {"x": AT})


# ---- URL decoding ------------------------------------------------------------


def test_text_value_is_url_decoded_once() -> None:
    (c,) = parse_conditions("s=THello%20%22world%22")
    assert c.value == 'Hello "world"'
    assert parse_conditions("s=T%2541")[0].value == "%41"  # once, not twice
    assert parse_conditions("s=Ta+b")[0].value == "a+b"  # '+' is not a space
    assert parse_conditions("s=T%C3%A9t%C3%A9")[0].value == "été"
    assert matches("s&T%3B", {"s": "a;b"})  # an escaped ';' is not a separator


def test_name_is_url_decoded() -> None:
    assert parse_conditions("X%2DLevel=Terror")[0].name == "X-Level"
    assert parse_conditions("first_name=Tjonas")[0].name == "first_name"
    assert parse_conditions("a%3Cb=N1")[0].name == "a<b"
    assert matches("Content%20Type=Ttext", {"Content Type": "text"})


@pytest.mark.parametrize("expression", ["s=T%", "s=T%4", "s=T%zz", "s=T%FF", "a%2=N1", "a%C3=N1"])
def test_bad_escapes_are_protocol_errors(expression: str) -> None:
    with pytest.raises(RemoteProtocolError):
        parse_conditions(expression)


# ---- longest-match operator parsing -------------------------------------------


@pytest.mark.parametrize(
    ("expression", "op", "value"),
    [
        ("a<=N1", "<=", 1),
        ("a<N=1", "<", None),
        ("a>=N1", ">=", 1),
        ("a!=N1", "!=", 1),
        ("a=N1", "=", 1),
        ("a<T=x", "<", "=x"),
        ("a>T>=", ">", ">="),
        ("a&T<=", "&", "<="),
        ("a~T~", "~", "~"),
        ("a=T!=", "=", "!="),
    ],
)
def test_longest_match(expression: str, op: str, value: object) -> None:
    if value is None:  # '<' then 'N=1': the operator is '<', the value malformed
        with pytest.raises(RemoteProtocolError, match="64-bit"):
            parse_conditions(expression)
        return
    (c,) = parse_conditions(expression)
    assert (c.name, c.op, c.value) == ("a", op, value)


def test_operators_listed_longest_first() -> None:
    for i, op in enumerate(OPERATORS):
        for later in OPERATORS[i + 1 :]:
            assert not later.startswith(op), (op, later)


# ---- expressions and bad input --------------------------------------------------


def test_several_conditions_are_anded() -> None:
    f = parse_filter("a=N1;b=Tx;c>D0")
    assert f.matches({"a": "1", "b": "x", "c": "1"})
    assert not f.matches({"a": "1", "b": "x", "c": "0"})
    assert not f.matches({"a": "1", "c": "1"})


def test_empty_and_trailing_separator() -> None:
    assert parse_conditions("") == ()
    assert parse_filter("") == Filter()
    assert parse_conditions("a=N1;") == (Condition("a", "=", "N", 1),)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        (";", "condition 1 is empty"),
        ("a=N1;;b=N2", "condition 2 is empty"),
        (";;", "condition 1 is empty"),
        ("age", "no operator"),
        ("=N1", "no property name"),
        ("a!N1", "unknown operator"),
        ("a!", "unknown operator"),
        ("a=", "must start with N, D or T"),
        ("a=42", "must start with N, D or T"),
        ("a=n42", "must start with N, D or T"),
        ("a=N", "64-bit"),
        ("a=N+1", "64-bit"),
        ("a=N1.5", "64-bit"),
        ("a=N 1", "64-bit"),
        ("a=N" + "9" * 5000, "64-bit"),
        ("a=D", "seconds since the epoch"),
        ("a=D1e3", "seconds since the epoch"),
        ("a=D1.", "seconds since the epoch"),
        ("a=Dnan", "seconds since the epoch"),
        ("a b=N1", "only"),
        ("a:b=N1", "only"),
        ("a,b=N1", "only"),
    ],
)
def test_bad_expressions(expression: str, message: str) -> None:
    with pytest.raises(RemoteProtocolError, match=message):
        parse_filter(expression)


def test_core_limits_become_protocol_errors() -> None:
    with pytest.raises(RemoteProtocolError, match="at most"):
        parse_filter(";".join(["a=N1"] * 65))
    with pytest.raises(RemoteProtocolError, match="out of range"):
        parse_filter("a=D99999999999999999")
    with pytest.raises(RemoteProtocolError, match="out of range"):
        parse_filter("a=D" + "9" * 5000)
    with pytest.raises(RemoteProtocolError, match="longer than"):
        parse_filter("a=T" + "x" * 5000)


def test_error_messages_echo_bounded_input() -> None:
    with pytest.raises(RemoteProtocolError) as info:
        parse_filter("a=" + "Q" * 10_000)
    assert len(str(info.value)) < 200


# ---- writing ----------------------------------------------------------------


def test_format_filter_encodes_names_and_text() -> None:
    conditions = (
        Condition("X-Level", "=", "T", "a;b c"),
        Condition("age", ">=", "N", -3),
        Condition("t", "<", "D", Decimal("1413198000.5")),
    )
    text = format_filter(conditions)
    assert text == "%58-%4Cevel=Ta%3Bb%20c;age>=N-3;t<D1413198000.5"
    assert parse_conditions(text) == conditions


def test_encode_helpers() -> None:
    assert encode_name("last-name") == "last-name"
    assert encode_name("a_b~c") == "a%5Fb%7Ec"
    assert encode_text('Hello "world"') == "Hello%20%22world%22"
    assert decode_text("Hello%20%22world%22", "t") == 'Hello "world"'


@pytest.mark.parametrize(
    "condition",
    [
        Condition("", "=", "N", 1),
        Condition("a", "<=", "T", "x"),
        Condition("a", "&", "N", 1),
        Condition("a", "=", "N", 2**63),
        Condition("a", "=", "N", True),
        Condition("a", "=", "N", "1"),
        Condition("a", "=", "D", Decimal("NaN")),
        Condition("a", "=", "D", 5),
        Condition("a", "=", "T", 5),
        Condition("a", "=", "X", "x"),  # type: ignore[arg-type]
        Condition("a\ud800", "=", "T", "x"),
        Condition("a", "=", "T", "x\ud800"),
    ],
)
def test_format_refuses_what_the_wire_cannot_carry(condition: Condition) -> None:
    with pytest.raises(LocalProtocolError):
        format_filter([condition])


def test_to_filter_matches_parse_filter() -> None:
    conditions = parse_conditions("a=N1;b&Tx")
    assert to_filter(conditions) == parse_filter("a=N1;b&Tx")


# ---- round trips -------------------------------------------------------------

names = st.text(min_size=1, max_size=20)
numbers = st.integers(min_value=-(2**63), max_value=2**63 - 1)
seconds = st.decimals(
    min_value=Decimal(-(10**10)), max_value=Decimal(10**10), allow_nan=False, places=6
)
texts = st.text(max_size=30)
conditions = st.one_of(
    st.builds(
        Condition, names, st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), st.just("N"), numbers
    ),
    st.builds(
        Condition, names, st.sampled_from(["=", "!=", "<", "<=", ">", ">="]), st.just("D"), seconds
    ),
    st.builds(
        Condition, names, st.sampled_from(["=", "!=", "<", ">", "&", "~"]), st.just("T"), texts
    ),
)


@given(st.lists(conditions, max_size=8))
def test_round_trip(items: list[Condition]) -> None:
    text = format_filter(items)
    assert parse_conditions(text) == tuple(items)
    assert text.isascii()


@given(st.text(max_size=60))
def test_arbitrary_input_is_a_filter_or_a_protocol_error(text: str) -> None:
    try:
        parse_filter(text)
    except RemoteProtocolError:
        pass


@given(texts, texts)
def test_text_equality_against_reference(value: str, header: str) -> None:
    f = parse_filter("s=T" + encode_text(value))
    assert f.matches({"s": header}) is (header == value)
    assert parse_filter("s&T" + encode_text(value)).matches({"s": header}) is (value in header)


@given(numbers, numbers)
def test_number_order_against_reference(value: int, header: int) -> None:
    assert parse_filter(f"n<N{value}").matches({"n": str(header)}) is (header < value)
    assert parse_filter(f"n>=N{value}").matches({"n": str(header)}) is (header >= value)
