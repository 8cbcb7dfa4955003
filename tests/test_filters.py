"""Subscription filters: every operator per type, absent and unreadable headers,
number and date parsing, the JSON form and its errors, and properties against a
reference evaluator."""

from __future__ import annotations

import json
import operator
import pickle
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.filters import Condition, Filter, FilterError, Op
from gateway.core.model import Message

TEXT_OPS = (Op.PREFIX, Op.SUFFIX, Op.CONTAINS, Op.NOT_CONTAINS)
ORDER_OPS = (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE)
NEW_YEAR = datetime(2026, 1, 1, tzinfo=UTC)  # 1767225600 seconds since the epoch
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COMPARE: dict[Op, Callable[[Any, Any], bool]] = {
    Op.EQ: operator.eq,
    Op.NE: operator.ne,
    Op.LT: operator.lt,
    Op.LE: operator.le,
    Op.GT: operator.gt,
    Op.GE: operator.ge,
}


def holds(op: Op, value: Any, header: str) -> bool:
    return Condition("h", op, value).matches({"h": header})


@pytest.mark.parametrize(
    ("value", "header", "sign"),  # sign: how the header compares with the value
    [
        # Strings: as is, case-sensitive, code-point order.
        ("web", "web", 0),
        ("web", "wea", -1),
        ("web", "webs", 1),
        ("web", "Web", -1),
        ("10", "9", 1),
        # Numbers: numerically, whatever the spelling.
        (9, "10", 1),
        (1000, "1e3", 0),
        (1000, "1E+3", 0),
        (1000, "1000.0", 0),
        (0.1, "0.1", 0),
        (7, "007", 0),
        (0, "-0", 0),
        (0, "-0.5", -1),
        (-1, "-0.5", 1),
        (-0.5, "-0.5", 0),
        (1, "1e-3", -1),
        (2**64, str(2**64 + 1), 1),  # integers compare exactly
        (10**308, "9" * 5000, 1),  # longer than int() reads: still a number
        (1e308, "1e999", 1),
        # Dates: as instants; ISO 8601 (Z, offsets, naive is UTC) or epoch seconds.
        (NEW_YEAR, "2026-01-01T00:00:00Z", 0),
        (NEW_YEAR, "2026-01-01T00:00:00", 0),
        (NEW_YEAR, "2026-01-01", 0),
        (NEW_YEAR, "2026-01-01T01:00:00+01:00", 0),
        (NEW_YEAR, "2025-12-31T19:00:00-05:00", 0),
        (NEW_YEAR, "2026-01-01T00:30:00+01:00", -1),
        (NEW_YEAR, "2026-01-01T00:00:00.000001Z", 1),
        (NEW_YEAR, "2025-12-31T23:59:59.999999", -1),
        (NEW_YEAR, "1767225600", 0),
        (NEW_YEAR, "1.7672256e9", 0),
        (NEW_YEAR, "1767225600.000001", 1),
        (NEW_YEAR, "1767225599.999999", -1),
        (NEW_YEAR, "-1", -1),
        (NEW_YEAR, "20260101", -1),  # a plain number is epoch seconds, not a basic ISO date
    ],
)
def test_order_operators(value: Any, header: str, sign: int) -> None:
    got = {op: holds(op, value, header) for op in ORDER_OPS}
    assert got == {op: _COMPARE[op](sign, 0) for op in ORDER_OPS}


def test_text_operators() -> None:
    assert holds(Op.PREFIX, "web-", "web-01")
    assert not holds(Op.PREFIX, "web-", "xweb-01")
    assert holds(Op.SUFFIX, "-01", "web-01")
    assert not holds(Op.SUFFIX, "-01", "web-01x")
    assert holds(Op.CONTAINS, "eb", "web-01")
    assert not holds(Op.CONTAINS, "EB", "web-01")
    assert holds(Op.NOT_CONTAINS, "db", "web-01")
    assert not holds(Op.NOT_CONTAINS, "eb", "web-01")
    assert holds(Op.CONTAINS, "", "")  # an empty needle is in any present header
    assert not holds(Op.NOT_CONTAINS, "", "anything")


UNREADABLE_NUMBERS = [" 1", "1 ", "+1", "1_000", "NaN", "nan", "inf", "-Infinity", "0x10", "abc"]
UNREADABLE_NUMBERS += ["", "-", "1.", ".5", "1e", "1e+", "--1", "1.2.3", "\u0661", "\uff11", "1,5"]
UNREADABLE_DATES = ["yesterday", "", "2026-13-01", " 2026-01-01", "2026-01-01T25:00", "+1767225600"]


@pytest.mark.parametrize("header", UNREADABLE_NUMBERS)
@pytest.mark.parametrize("op", ORDER_OPS)
def test_unreadable_number_never_matches(op: Op, header: str) -> None:
    assert not holds(op, 1, header)
    assert not holds(op, 1.5, header)


@pytest.mark.parametrize("header", UNREADABLE_DATES)
@pytest.mark.parametrize("op", ORDER_OPS)
def test_unreadable_date_never_matches(op: Op, header: str) -> None:
    assert not holds(op, NEW_YEAR, header)


def test_date_condition_values() -> None:
    naive = Condition("ts", Op.EQ, datetime(2026, 1, 1))
    assert naive.value == NEW_YEAR
    assert naive.value.tzinfo is UTC  # type: ignore[union-attr]
    paris = timezone(timedelta(hours=1))
    aware = Condition("ts", Op.EQ, datetime(2026, 1, 1, 1, tzinfo=paris))
    assert aware == naive
    assert aware.matches({"ts": "1767225600"})


@pytest.mark.parametrize(
    ("op", "value"),
    [(op, v) for op in ORDER_OPS for v in ("x", 1, 2.5, NEW_YEAR)] + [(op, "x") for op in TEXT_OPS],
)
def test_absent_header_never_matches(op: Op, value: Any) -> None:
    c = Condition("h", op, value)
    assert not c.matches({})
    assert not c.matches({"other": "x"})
    assert not Filter((c,)).matches({})


@pytest.mark.parametrize(
    ("key", "op", "value", "message"),
    [
        ("h", Op.EQ, True, "not bool"),
        ("h", Op.EQ, float("nan"), "finite"),
        ("h", Op.LT, float("inf"), "finite"),
        ("h", Op.EQ, None, "not null"),
        ("h", Op.EQ, [1], "not list"),
        ("h", Op.EQ, datetime(2026, 1, 1).date(), "not date"),
        ("h", Op.PREFIX, 1, "needs a string"),
        ("h", Op.CONTAINS, NEW_YEAR, "needs a string"),
        ("h", Op.NOT_CONTAINS, 1.5, "needs a string"),
        ("", Op.EQ, "x", "non-empty"),
        ("k" * 257, Op.EQ, "x", "longer than 256"),
        ("h", Op.EQ, "v" * 4097, "longer than 4096"),
        ("h", "=", "x", "unknown operator"),
    ],
)
def test_condition_rejects(key: str, op: Any, value: Any, message: str) -> None:
    with pytest.raises(FilterError, match=message):
        Condition(key, op, value)
    Condition("k" * 256, Op.EQ, "v" * 4096)  # the limits are inclusive


def test_empty_filter_matches_everything() -> None:
    f = Filter()
    assert f.matches({})
    assert f.matches({"a": "b"})
    assert f.select([Message("t", b""), Message("t", b"", {"a": "b"})]) == [0, 1]
    assert str(f) == "true"


def test_filter_is_and_of_conditions() -> None:
    f = Filter((Condition("level", Op.EQ, "error"), Condition("size", Op.GT, 100)))
    assert f.matches({"level": "error", "size": "101"})
    assert not f.matches({"level": "error", "size": "100"})
    assert not f.matches({"level": "warn", "size": "101"})
    assert not f.matches({"level": "error"})
    three = Filter((*f.conditions, Condition("host", Op.PREFIX, "web-")))
    assert three.matches({"level": "error", "size": "101", "host": "web-1"})
    assert not three.matches({"level": "error", "size": "101", "host": "db-1"})


def test_filter_construction() -> None:
    c = Condition("a", Op.EQ, "1")
    assert Filter([c]) == Filter((c,))  # type: ignore[arg-type]
    assert hash(Filter((c,))) == hash(Filter((Condition("a", Op.EQ, "1"),)))
    Filter((c,) * 64)
    with pytest.raises(FilterError, match="at most 64"):
        Filter((c,) * 65)
    with pytest.raises(FilterError, match="condition 2: expected a Condition"):
        Filter((c, "a = 1"))  # type: ignore[arg-type]
    with pytest.raises(FilterError, match="tuple of Condition"):
        Filter("a")  # type: ignore[arg-type]


def test_select_returns_matching_indices_in_order() -> None:
    messages = [
        Message("t", b"0", {"level": "error"}),
        Message("t", b"1"),
        Message("t", b"2", {"level": "info"}),
        Message("t", b"3", {"level": "error", "x": "y"}),
    ]
    assert Filter.equals(level="error").select(messages) == [0, 3]
    assert Filter.equals(level="debug").select(messages) == []
    assert Filter.equals(level="error").select([]) == []


def test_equals() -> None:
    f = Filter.equals(level="error", host="web")
    assert f.conditions == (Condition("level", Op.EQ, "error"), Condition("host", Op.EQ, "web"))
    assert Filter.equals() == Filter()
    with pytest.raises(FilterError, match="expected a string"):
        Filter.equals(code=500)  # type: ignore[arg-type]


def test_json_forms_and_str() -> None:
    shorthand = Filter.from_json({"level": "error", "code": 500})
    assert shorthand == Filter((Condition("level", Op.EQ, "error"), Condition("code", Op.EQ, 500)))
    assert shorthand.matches({"level": "error", "code": "5e2"})
    assert Filter.from_json({}) == Filter() == Filter.from_json([])
    f = Filter.from_json(
        [
            ["level", "=", "error"],
            ["size", ">", 100],
            ["ts", ">=", {"date": "2026-01-01T00:00:00Z"}],
            ["host name", "prefix", 'web"'],
            ["ratio", "!=", 0.5],
        ]
    )
    assert f.conditions[2] == Condition("ts", Op.GE, NEW_YEAR)
    headers = {
        "level": "error",
        "size": "101",
        "ts": "2026-06-01",
        "host name": 'web"1',
        "ratio": "1",
    }
    assert f.matches(headers)
    assert not f.matches({**headers, "ts": "2025-06-01"})
    assert str(f) == (
        'level = "error" and size > 100 and ts >= date("2026-01-01T00:00:00+00:00") and '
        '"host name" prefix "web\\"" and ratio != 0.5'
    )
    g = pickle.loads(pickle.dumps(f))  # the compiled predicates are rebuilt
    assert g == f
    assert g.matches(headers)


@pytest.mark.parametrize(
    ("when", "expected"),
    [
        ("2026-01-01T00:00:00Z", NEW_YEAR),
        ("2026-01-01T01:00:00+01:00", NEW_YEAR),
        ("2026-01-01T00:00:00", NEW_YEAR),
        (1767225600, NEW_YEAR),
        (1767225600.5, NEW_YEAR + timedelta(seconds=0.5)),
        ("1767225600.000001", NEW_YEAR + timedelta(microseconds=1)),
        (-86400, EPOCH - timedelta(days=1)),
    ],
)
def test_json_dates(when: Any, expected: datetime) -> None:
    (c,) = Filter.from_json([["ts", "=", {"date": when}]]).conditions
    assert c.value == expected
    assert isinstance(c.value, datetime)
    assert c.value.tzinfo is not None


@pytest.mark.parametrize(
    ("obj", "message"),
    [
        (None, "object or an array of conditions, not null"),
        ("level = error", "object or an array of conditions, not str"),
        (5, "not int"),
        ({"level": True}, "key 'level': .*string or a number, not bool"),
        ({"level": ["a"]}, "key 'level': .*not list"),
        ({"level": {"date": 0}}, "key 'level': .*not dict"),
        ({"": "x"}, "key '': .*non-empty"),
        ({"k" * 1000: 1}, r"key 'k{56}\.\.\.: .*longer than 256"),  # echoes of input are cut
        ({"n": float("nan")}, "key 'n': .*finite"),
        ([["a", "=", "b"], ["a", "==", "b"]], "condition 2: unknown operator '=='"),
        ([["a", "=", "b"], "a = b"], r"condition 2: expected \[key, op, value\], not str"),
        ([["a", "="]], r"condition 1: expected \[key, op, value\], not an array of 2"),
        ([["a", "=", "b", "c"]], r"condition 1: expected \[key, op, value\]"),
        ([[1, "=", "b"]], "condition 1: the key must be a string, not int"),
        ([["a", 1, "b"]], "condition 1: the operator must be a string, not int"),
        ([["a", "=", True]], "condition 1: a value must be .*not bool"),
        ([["a", "=", [1]]], "condition 1: a value must be .*not list"),
        ([["a", "prefix", 1]], "condition 1: .*'prefix' needs a string value, not int"),
        ([["a", "contains", {"date": 0}]], "condition 1: .*needs a string value, not datetime"),
        ([["a", "=", {"when": 0}]], r"condition 1: an object value must be \{\"date\""),
        ([["a", "=", {"date": 0, "tz": "Z"}]], r"condition 1: an object value must be"),
        ([["a", "=", {"date": "yesterday"}]], "condition 1: date 'yesterday' is neither ISO"),
        ([["a", "=", {"date": True}]], "condition 1: a date must be .*not bool"),
        ([["a", "=", {"date": float("inf")}]], "condition 1: date inf is not a finite number"),
        ([["a", "=", {"date": 1e20}]], "condition 1: date .* is out of range"),
        ([["a", "=", {"date": "1e999999999"}]], "condition 1: date .* is out of range"),
        ([["", "=", "x"]], "condition 1: .*non-empty"),
        ([["a", "=", "x" * 4097]], "condition 1: .*longer than 4096"),
        ([["a", "=", "x"]] * 65, "65 conditions; a filter has at most 64"),
        ({f"k{i}": "x" for i in range(65)}, "at most 64"),
    ],
)
def test_json_errors(obj: Any, message: str) -> None:
    with pytest.raises(FilterError, match=message):
        Filter.from_json(obj)


def test_json_round_trip_examples() -> None:
    f = Filter.from_json(
        [["a", op.value, "x"] for op in Op]
        + [["n", op.value, v] for op in ORDER_OPS for v in (-3, 2.5, 10**30)]
        + [["ts", "<", {"date": "1969-07-20T20:17:40.5-04:00"}]]
    )
    assert f.to_json()[-1] == ["ts", "<", {"date": "1969-07-20T20:17:40.500000-04:00"}]
    assert Filter.from_json(f.to_json()) == f
    assert Filter.from_json(json.loads(json.dumps(f.to_json()))) == f


# A reference evaluator, written separately from gateway/core/filters.py, for the properties.


def ref_number(s: str) -> int | float | None:
    def digits(x: str) -> bool:
        return x != "" and all(ch in "0123456789" for ch in x)

    mantissa, e, exponent = (s[1:] if s.startswith("-") else s).replace("E", "e").partition("e")
    whole, dot, fraction = mantissa.partition(".")
    if not digits(whole) or (dot and not digits(fraction)):
        return None
    if e and not digits(exponent[1:] if exponent[:1] in ("+", "-") else exponent):
        return None
    return float(s) if dot or e else int(s)


def ref_instant(s: str) -> Fraction | None:
    if ref_number(s) is not None:
        return Fraction(s)
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    return instant(dt if dt.tzinfo else dt.replace(tzinfo=UTC))


def instant(dt: datetime) -> Fraction:
    return Fraction((dt - EPOCH) // timedelta(microseconds=1), 1_000_000)


def reference(conditions: list[Condition], headers: Mapping[str, str]) -> bool:
    for c in conditions:
        header = headers.get(c.key)
        if header is None:
            return False
        value = c.value
        if isinstance(value, str):
            ok = {
                Op.PREFIX: lambda h, v: h.startswith(v),
                Op.SUFFIX: lambda h, v: h.endswith(v),
                Op.CONTAINS: lambda h, v: v in h,
                Op.NOT_CONTAINS: lambda h, v: v not in h,
                **_COMPARE,
            }[c.op](header, value)
        elif isinstance(value, datetime):
            x = ref_instant(header)
            ok = x is not None and _COMPARE[c.op](x, instant(value))
        else:
            n = ref_number(header)
            ok = n is not None and _COMPARE[c.op](n, value)
        if not ok:
            return False
    return True


KEYS = ("a", "b", "c")
NUMBERISH = r"-?[0-9]{1,3}(\.[0-9]{0,2})?(e-?[0-9])?"
zones = st.sampled_from([None, UTC, timezone(timedelta(hours=5.5)), timezone(-timedelta(hours=8))])
dates = st.datetimes(datetime(1900, 1, 1), datetime(2100, 1, 1), timezones=zones)  # type: ignore[arg-type]
numbers = st.integers(-(10**20), 10**20) | st.floats(allow_nan=False, allow_infinity=False)
texts = st.text("ab-1.eZ", max_size=5)
values = numbers | texts | dates


@st.composite
def conditions(draw: st.DrawFn) -> Condition:
    value = draw(values)
    ops = list(Op) if isinstance(value, str) else list(ORDER_OPS)
    return Condition(draw(st.sampled_from(KEYS)), draw(st.sampled_from(ops)), value)


def renderings(value: Any) -> list[str]:
    """Header strings that read as ``value`` or nearly: conditions often sit on the edge."""
    if isinstance(value, str):
        return [value, value + "a", value[1:]]
    if isinstance(value, datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=UTC)
        micros = (aware - EPOCH) // timedelta(microseconds=1)
        iso = aware.astimezone(UTC).isoformat()
        return [
            iso,
            iso.replace("+00:00", "Z"),
            iso.removesuffix("+00:00"),
            (aware + timedelta(microseconds=1)).isoformat(),
            format(Decimal(micros).scaleb(-6), "f"),
            str(micros // 1_000_000),
        ]
    return [str(value), repr(float(value)), f"{value}e0", f"{value}1"]


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[Condition], dict[str, str]]:
    conds = draw(st.lists(conditions(), max_size=4))
    pool = [r for c in conds for r in renderings(c.value)] + ["", "abc", "NaN", " 1", "+1", "1_0"]
    header = st.sampled_from(pool) | st.from_regex(NUMBERISH, fullmatch=True)
    header |= st.builds(str, numbers) | st.builds(datetime.isoformat, dates) | texts
    headers = draw(st.dictionaries(st.sampled_from(KEYS), header))
    return conds, headers


@given(cases())
def test_matches_agrees_with_reference(case: tuple[list[Condition], dict[str, str]]) -> None:
    conds, headers = case
    assert Filter(tuple(conds)).matches(headers) == reference(conds, headers)
    for c in conds:
        assert c.matches(headers) == reference([c], headers)


@given(st.lists(conditions(), max_size=8).map(tuple))
def test_json_round_trip(conds: tuple[Condition, ...]) -> None:
    f = Filter(conds)
    assert Filter.from_json(f.to_json()) == f
    assert Filter.from_json(json.loads(json.dumps(f.to_json()))) == f


@given(cases(), st.lists(st.dictionaries(st.sampled_from(KEYS), values.map(str)), max_size=20))
def test_select_is_matches_over_messages(
    case: tuple[list[Condition], dict[str, str]], more: list[dict[str, str]]
) -> None:
    conds, headers = case
    f = Filter(tuple(conds))
    messages = [Message("t", b"", h) for h in [headers, *more, headers]]
    assert f.select(messages) == [i for i, m in enumerate(messages) if f.matches(m.headers)]
