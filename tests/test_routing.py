"""Routes: glob patterns, templates, unions of matching routes, bad templates."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.core.routing import UPSTREAM_PREFIX, Route, RouteError, Router


def router(*routes: tuple[str, list[str] | str]) -> Router:
    return Router(
        [Route(pattern, (to,) if isinstance(to, str) else tuple(to)) for pattern, to in routes]
    )


def test_no_routes_delivers_to_itself() -> None:
    assert Router().targets("logs.web") == ("logs.web",)


def test_unmatched_name_is_delivered_to_itself() -> None:
    r = router(("metrics.*", "archive"))
    assert r.targets("logs.web") == ("logs.web",)


def test_exact_name() -> None:
    r = router(("orders", ["billing", "audit"]))
    assert r.targets("orders") == ("billing", "audit")
    assert r.targets("orders2") == ("orders2",)
    assert r.targets("order") == ("order",)


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("logs.*", "logs.web", True),
        ("logs.*", "logs.", True),
        ("logs.*", "logs.web.eu", True),
        ("logs.*", "logs", False),
        ("logs.*", "xlogs.web", False),
        ("*.errors", "web.errors", True),
        ("*.errors", "web.errors.old", False),
        ("*", "", True),
        ("*", "anything at all", True),
        ("a*b*c", "a--b--c", True),
        ("a*b*c", "acb", False),
        ("dev?", "dev1", True),
        ("dev?", "dev", False),
        ("dev?", "dev12", False),
        ("??", "ab", True),
        ("??", "a", False),
        # Regex metacharacters are literal.
        ("a.b", "axb", False),
        ("a.b", "a.b", True),
        ("q[1]+", "q[1]+", True),
        ("q[1]+", "q1", False),
        ("(x)|y", "y", False),
        ("(x)|y", "(x)|y", True),
        # Wildcards span any character, newlines included.
        ("in.*", "in.a\nb", True),
        ("x?y", "x\ny", True),
    ],
)
def test_glob_matching(pattern: str, name: str, matches: bool) -> None:
    r = router((pattern, "hit"))
    assert r.targets(name) == (("hit",) if matches else (name,))


@pytest.mark.parametrize(
    ("pattern", "template", "name", "expected"),
    [
        ("logs.*", "archive.{1}", "logs.web", "archive.web"),
        ("logs.*", "{destination}.copy", "logs.web", "logs.web.copy"),
        ("*.*", "{2}.{1}", "a.b", "b.a"),
        ("*.*", "{1}-{1}", "a.b", "a-a"),
        ("dev?.*", "{2}/{1}", "dev3.cpu", "cpu/3"),
        ("logs.*", "upstream:{1}", "logs.central", "upstream:central"),
        ("logs.*", "all", "logs.web", "all"),
        ("logs.*", "{{literal}}.{1}", "logs.web", "{literal}.web"),
        ("*", "x.{destination}.{1}", "abc", "x.abc.abc"),
    ],
)
def test_templates(pattern: str, template: str, name: str, expected: str) -> None:
    assert router((pattern, template)).targets(name) == (expected,)


def test_multiple_routes_are_unioned_in_order_without_duplicates() -> None:
    r = router(
        ("logs.*", ["archive.{1}", "all"]),
        ("logs.web", ["web", "all"]),
        ("*", ["all", "archive.web", "everything"]),
        ("metrics.*", "metrics"),
    )
    assert r.targets("logs.web") == ("archive.web", "all", "web", "everything")
    assert r.targets("logs.db") == ("archive.db", "all", "archive.web", "everything")
    assert r.targets("other") == ("all", "archive.web", "everything")


def test_duplicates_within_one_route_collapse() -> None:
    r = router(("*", ["a", "a", "{destination}", "x"]))
    assert r.targets("x") == ("a", "x")


def test_route_may_include_the_name_itself() -> None:
    r = router(("orders", ["{destination}", "audit"]))
    assert r.targets("orders") == ("orders", "audit")


def test_results_are_stable_on_repeated_lookups() -> None:
    """The cache must not change answers, also past its size limit."""
    r = router(("n.*", "m.{1}"))
    for i in range(5000):
        assert r.targets(f"n.{i}") == (f"m.{i}",)
    assert r.targets("n.1") == ("m.1",)
    assert r.targets("other") == ("other",)


@pytest.mark.parametrize(
    ("pattern", "template"),
    [
        ("logs.*", "archive.{2}"),  # only one wildcard
        ("logs", "archive.{1}"),  # no wildcard at all
        ("logs.*", "archive.{0}"),
        ("logs.*", "archive.{}"),
        ("logs.*", "archive.{name}"),
        ("logs.*", "archive.{1.x}"),
        ("logs.*", "archive.{1[0]}"),
        ("logs.*", "archive.{"),
        ("logs.*", "archive.}"),
        ("logs.*", "archive.{1"),
        ("logs.*", "{dest}"),
    ],
)
def test_bad_templates_raise_route_error(pattern: str, template: str) -> None:
    with pytest.raises(RouteError):
        router((pattern, template))


def test_route_error_is_a_value_error_naming_the_target() -> None:
    with pytest.raises(ValueError, match=r"archive\.\{3\}"):
        router(("a.*.*", "archive.{3}"))


def test_one_bad_target_fails_the_whole_router() -> None:
    with pytest.raises(RouteError):
        router(("a.*", "ok.{1}"), ("b.*", ["fine", "bad.{x}"]))


def test_upstream_prefix() -> None:
    assert UPSTREAM_PREFIX == "upstream:"


_names = st.text(st.characters(codec="utf-8", exclude_characters="*?{}"), max_size=12)


@given(prefix=_names, rest=_names)
def test_star_suffix_captures_the_rest(prefix: str, rest: str) -> None:
    r = router((prefix + "*", "out.{1}"))
    assert r.targets(prefix + rest) == ("out." + rest,)


@given(name=_names)
def test_destination_template_is_identity(name: str) -> None:
    assert router(("*", "{destination}")).targets(name) == (name,)
