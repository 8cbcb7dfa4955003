"""``gateway config default``: the embedded default config written out as TOML.

An operator who starts from the default (``gateway run`` without a file) and
wants to change one thing needs the default as a file: this module writes the
same table :func:`gateway.config.loader.default_data` builds, so the printed
file loads to the same config as the embedded default.

The writer covers what a config holds (tables, arrays of tables, strings,
numbers, booleans and arrays of those) and needs no TOML library at run time.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

from gateway.config.loader import default_data
from gateway.runtime.registry import Registry, default_registry

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+\Z")

_HEADER = """\
# The embedded default config of Interchange, as `gateway run` without a file uses it.
# Every registered server protocol listens on loopback on its own port and
# publishes into a durable queue kept under data_dir (relative to this file).
# Edit and run it with: gateway check FILE && gateway run FILE
"""


def default_toml(registry: Registry | None = None) -> str:
    """The embedded default config as a commented TOML document."""
    data = default_data(registry or default_registry())
    return _HEADER + "\n" + to_toml(data)


def to_toml(data: Mapping[str, Any]) -> str:
    """Write a config table as TOML: scalars first, then tables, then arrays of tables."""
    lines: list[str] = []
    _table(lines, (), data)
    return "\n".join(lines).strip("\n") + "\n"


def _table(lines: list[str], path: tuple[str, ...], data: Mapping[str, Any]) -> None:
    for key, value in data.items():
        if not _is_table(value) and not _is_table_array(value):
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in data.items():
        if _is_table(value):
            lines.extend(["", f"[{_dotted((*path, key))}]"])
            _table(lines, (*path, key), value)
        elif _is_table_array(value):
            for item in value:
                lines.extend(["", f"[[{_dotted((*path, key))}]]"])
                _table(lines, (*path, key), item)


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(_key(part) for part in path)


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else _string(name)


def _string(text: str) -> str:
    # A JSON string is a TOML basic string: the same quotes and escapes.
    return json.dumps(text, ensure_ascii=False)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return ("-" if value < 0 else "") + ("nan" if math.isnan(value) else "inf")
        return repr(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")
