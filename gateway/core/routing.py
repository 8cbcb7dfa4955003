"""Routes: which destinations (and upstreams) a published message goes to.

A route matches destination names with a glob (``*`` any run of characters,
``?`` one character) and lists targets. A target is a destination name or
``upstream:NAME``, and may be a template: ``{destination}`` is the published
name and ``{1}``, ``{2}``… what each wildcard matched, so
``from = "logs.*"`` with ``to = ["archive.{1}"]`` renames ``logs.web`` to
``archive.web``. Every matching route contributes its targets; a name no
route matches is delivered to itself.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["UPSTREAM_PREFIX", "Route", "RouteError", "Router", "compile_glob"]

UPSTREAM_PREFIX = "upstream:"
_CACHE_LIMIT = 4096


class RouteError(ValueError):
    """A route that can never work (bad pattern or template)."""


@dataclass(frozen=True, slots=True)
class Route:
    pattern: str
    to: tuple[str, ...]


def compile_glob(pattern: str) -> re.Pattern[str]:
    """A regex for a name glob: ``*`` any run of characters (a group), ``?`` one."""
    parts = []
    for ch in pattern:
        if ch == "*":
            parts.append("(.*)")
        elif ch == "?":
            parts.append("(.)")
        else:
            parts.append(re.escape(ch))
    return re.compile("".join(parts) + r"\Z", re.DOTALL)


def _check_template(template: str, wildcards: int) -> None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise RouteError(f"target {template!r}: {e}") from None
    for f in fields:
        if f == "destination":
            continue
        if not f.isdigit() or not 1 <= int(f) <= wildcards:
            raise RouteError(
                f"target {template!r}: unknown placeholder {{{f}}}; use {{destination}}"
                + (f" or {{1}}..{{{wildcards}}}" if wildcards else "")
            )


class Router:
    """Maps a destination name to its target names, caching the answer."""

    def __init__(self, routes: Iterable[Route] = ()) -> None:
        self._routes: list[tuple[re.Pattern[str], tuple[str, ...]]] = []
        for route in routes:
            wildcards = route.pattern.count("*") + route.pattern.count("?")
            for target in route.to:
                _check_template(target, wildcards)
            self._routes.append((compile_glob(route.pattern), route.to))
        self._cache: dict[str, tuple[str, ...]] = {}

    def targets(self, destination: str) -> tuple[str, ...]:
        """Target names for ``destination``, in route order, without duplicates."""
        hit = self._cache.get(destination)
        if hit is not None:
            return hit
        out: dict[str, None] = {}
        for regex, to in self._routes:
            m = regex.match(destination)
            if m is None:
                continue
            groups: Sequence[str] = m.groups()
            for template in to:
                if "{" in template:
                    name = template.format("", *groups, destination=destination)
                else:
                    name = template
                out[name] = None
        result = tuple(out) if out else (destination,)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[destination] = result
        return result
