"""The shape of the imports: no circles in ``gateway/``, one surface for protocols.

The graph is read from the source with :mod:`ast`, not by importing: every
``import`` and ``from … import`` counts wherever it is written, at module
level, under ``if TYPE_CHECKING:`` or inside a function. A type-only import
is still a dependency a reader has to follow, and a function-level one is a
circle that was merely postponed.

An edge goes from a module to the module it names: ``from gateway.a import b``
is an edge to ``gateway.a.b`` when that is a module, otherwise to
``gateway.a`` (``b`` is a name defined there). Importing a submodule also runs
its package's ``__init__``, but that is not counted as an edge: a package
whose ``__init__`` re-exports its own modules would otherwise be a circle of
every module in it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = ROOT / "gateway"
#: The one module of ``gateway`` that protocols and plugins may import from.
SURFACE = "gateway.sdk"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its ``__init__``)."""
    return {_module_name(p, package.parent): p for p in sorted(package.rglob("*.py"))}


def _imported(path: Path, name: str) -> Iterator[tuple[str, tuple[str, ...], int]]:
    """``(module, names, line)`` of every import in the file, relative ones resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, (), node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base, tuple(a.name for a in node.names), node.lineno


def _targets(module: str, names: tuple[str, ...], known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that one import statement depends on."""
    out = set()
    for name in names:
        if f"{module}.{name}" in known:
            out.add(f"{module}.{name}")
        elif module in known:
            out.add(module)
    if not names:
        # ``import a.b.c``: the longest prefix that is a module of ours.
        parts = module.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        if parts:
            out.add(".".join(parts))
    return out


def import_graph(package: Path = GATEWAY) -> dict[str, set[str]]:
    """Module → the modules of the same package it imports (any kind of import)."""
    known = _modules(package)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        for module, names, _ in _imported(path, name):
            graph[name] |= _targets(module, names, known) - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` as a path that ends where it starts, or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        # Iterative depth-first search; ``path`` is the grey chain from ``start``.
        path = [start]
        stack = [iter(sorted(graph[start]))]
        colour[start] = GREY
        while stack:
            child = next(stack[-1], None)
            if child is None:
                colour[path.pop()] = BLACK
                stack.pop()
            elif colour[child] == GREY:
                return [*path[path.index(child) :], child]
            elif colour[child] == WHITE:
                colour[child] = GREY
                path.append(child)
                stack.append(iter(sorted(graph[child])))
    return None


def test_find_cycle_reports_the_circle_as_a_path() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_graph_counts_type_only_and_function_level_imports(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n"
    )
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("import pkg.a\n")
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]


def test_gateway_has_no_import_circles() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def _plugin_sources() -> Iterator[Path]:
    """The non-test Python files of ``protocols/`` and every plugin under ``plugins/``."""
    for top in (ROOT / "protocols", ROOT / "plugins"):
        for path in sorted(top.rglob("*.py")):
            rel = path.relative_to(top).parts
            if "tests" in rel or path.name.startswith("test_") or path.name == "conftest.py":
                continue
            if any(part.endswith(".egg-info") or part == "build" for part in rel):
                continue
            yield path


def test_protocols_and_plugins_import_gateway_only_through_the_sdk() -> None:
    wrong = []
    sources = list(_plugin_sources())
    assert sources, "no protocol sources found"
    for path in sources:
        for module, names, line in _imported(path, _module_name(path, ROOT)):
            if module != "gateway" and not module.startswith("gateway."):
                continue
            if module == SURFACE or (module == "gateway" and names == ("sdk",)):
                continue
            wrong.append(f"{path.relative_to(ROOT)}:{line}: {module}")
    assert not wrong, "imports from gateway other than gateway.sdk:\n" + "\n".join(wrong)
