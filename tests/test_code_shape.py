"""The shape the code keeps: functions a reader can take in at once.

No function or method in ``gateway/``, ``protocols/`` or ``plugins/`` (tests
and generated protobuf modules aside) is longer than 80 lines, docstring
included. A longer one is a sign that it does two things: split it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 80


def _sources() -> list[Path]:
    found = []
    for top in ("gateway", "protocols", "plugins"):
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).parts
            if "tests" in parts or path.name.endswith("_pb2.py"):
                continue
            found.append(path)
    return found


def _long_functions(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    where = path.relative_to(root)
    return [
        f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > LIMIT
    ]


def test_the_sources_are_found() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in _sources()}
    assert "gateway/core/hub.py" in names
    assert "protocols/lumberjack/codec.py" in names
    assert not any(name.endswith("_pb2.py") for name in names)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_function_is_longer_than_80_lines(path: Path) -> None:
    assert _long_functions(path) == []


def test_the_check_finds_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n")
    assert _long_functions(tmp_path / "long.py", tmp_path) == ["long.py:1 long (81 lines)"]
