"""``gateway config schema``: a JSON Schema of the config file, for editors and CI.

The schema is generated from the declarations ``gateway check`` reads, never
written by hand, so that it cannot drift from the loader:

- the core tables: each of the loader's readers (``[gateway]``, ``[store]``,
  ``[metrics]``, ``[admin]``, ``[[listeners]]``, ``[[upstreams]]``,
  ``[[routes]]``, ``[[destinations]]``) is run once on a :class:`_Recorder`, a
  table that remembers every key it is asked for, with its kind, default,
  bounds and choices, instead of reading a file;
- the protocol options: the :class:`~gateway.protocol.options.Option`
  declarations of every registered protocol (``listener_options``,
  ``upstream_options``), chosen by the entry's ``protocol`` key.

What a schema cannot say is left to ``gateway check``: relations between keys
(``partition_key`` needs ``partitions``), names that must be unique, addresses
and certificates that must work, and the bounds of sizes and durations written
as strings ("64MiB"). A config the schema accepts may still fail the check;
one it refuses always does.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gateway import __version__
from gateway.config import loader
from gateway.protocol.options import REQUIRED, Option
from gateway.runtime.registry import Registry, default_registry

__all__ = ["config_schema"]

#: What ``parse_duration`` accepts as a string ("500ms", "10s", "5m", "1h", "1d").
DURATION_PATTERN = r"^\s*\d+(\.\d+)?\s*(ms|s|m|h|d)?\s*$"
#: What ``parse_size`` accepts as a string ("512B", "64KiB", "10MB"; any case).
SIZE_PATTERN = r"^\s*\d+(\.\d+)?\s*([KkMmGgTt][Ii]?[Bb]|[Bb])?\s*$"


class _Recorder(loader._Table):
    """A table that records what a loader function asks of it, and holds nothing.

    ``get`` answers with the default (None for a required key), so that the
    reader goes on to its next key; ``table`` answers with a nested recorder.
    """

    def __init__(self, path: str = "") -> None:
        super().__init__(loader._Errors("<schema>"), path, {})
        self.keys: dict[str, dict[str, Any]] = {}
        self.tables: dict[str, _Recorder] = {}

    def get(
        self,
        name: str,
        kind: str,
        default: Any = REQUIRED,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        choices: tuple[str, ...] = (),
        check: Any = None,
    ) -> Any:
        self.keys[name] = _scalar(kind, minimum, maximum, choices)
        if default is REQUIRED:
            self.keys[name]["required"] = True
            return None
        return default

    def table(self, name: str) -> loader._Table:
        sub = self.tables.setdefault(name, _Recorder(self.key(name)))
        return sub

    def finish(self, hint: str = "") -> None:
        """Nothing to report: a recorder has no data, so no unknown keys."""

    def schema(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The recorded keys (and nested tables) as a closed JSON object schema."""
        properties: dict[str, Any] = {}
        required = []
        for name, spec in self.keys.items():
            spec = dict(spec)
            if spec.pop("required", False):
                required.append(name)
            properties[name] = spec
        for name, sub in self.tables.items():
            properties[name] = sub.schema()
        properties.update(extra or {})
        return _object(properties, required)


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = required
    return schema


def _bounded(base: dict[str, Any], minimum: float | None, maximum: float | None) -> dict[str, Any]:
    if minimum is not None:
        base["minimum"] = minimum
    if maximum is not None:
        base["maximum"] = maximum
    return base


def _scalar(
    kind: str,
    minimum: float | None = None,
    maximum: float | None = None,
    choices: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The schema of one value of a loader kind (``_convert``'s kinds)."""
    strings = {"type": "array", "items": {"type": "string"}}
    if kind in ("str", "upstream"):
        return {"type": "string", "enum": list(choices)} if choices else {"type": "string"}
    if kind == "int":
        return _bounded({"type": "integer"}, minimum, maximum)
    if kind == "float":
        return _bounded({"type": "number"}, minimum, maximum)
    if kind == "bool":
        return {"type": "boolean"}
    if kind == "duration":
        number = _bounded({"type": "number", "minimum": 0}, minimum, maximum)
        text = {"type": "string", "pattern": DURATION_PATTERN}
        return {"anyOf": [number, text], "description": 'seconds, or "500ms", "10s", "5m"...'}
    if kind == "size":
        number = _bounded({"type": "integer", "minimum": 0}, minimum, maximum)
        text = {"type": "string", "pattern": SIZE_PATTERN}
        return {"anyOf": [number, text], "description": 'bytes, or "512KiB", "64MiB"...'}
    if kind == "workers":
        count = _bounded({"type": "integer"}, minimum, maximum)
        return {"anyOf": [count, {"const": "auto"}], "description": 'a number, or "auto"'}
    if kind == "str_list":
        return strings
    if kind == "str_or_list":
        return {"anyOf": [{"type": "string"}, strings]}
    raise AssertionError(f"unknown kind {kind}")


def _option(opt: Option) -> dict[str, Any]:
    """The schema of a plugin-declared option, tables and arrays of tables included."""
    if opt.kind in ("table", "tables"):
        table = _options(opt.fields)
        schema = table if opt.kind == "table" else {"type": "array", "items": table}
    else:
        schema = _scalar(opt.kind, opt.minimum, opt.maximum, opt.choices)
    if opt.help:
        schema["description"] = opt.help
    return schema


def _options(options: Mapping[str, Option]) -> dict[str, Any]:
    properties = {name: _option(opt) for name, opt in options.items()}
    return _object(properties, [name for name, opt in options.items() if opt.required])


def _entries(core: dict[str, Any], by_protocol: dict[str, Mapping[str, Option]]) -> dict[str, Any]:
    """An array of listener or upstream tables: the core keys, plus the options of the
    protocol each entry names (one ``if``/``then`` per protocol)."""
    protocol = {"type": "string", "enum": sorted(by_protocol)}
    cases = []
    for name, options in sorted(by_protocol.items()):
        properties = {**core["properties"], **_options(options)["properties"], "protocol": protocol}
        then = _object(properties, core.get("required", []))
        cases.append({"if": {"properties": {"protocol": {"const": name}}}, "then": then})
    entry = {
        "type": "object",
        "properties": {**core["properties"], "protocol": protocol},
        "required": core.get("required", []),
        "allOf": cases,
    }
    return {"type": "array", "items": entry}


def _record(read: Any) -> dict[str, Any]:
    recorder = _Recorder()
    read(recorder)
    return recorder.schema()


def config_schema(registry: Registry | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a config file, for the registered protocols."""
    registry = registry or default_registry()
    with tempfile.TemporaryDirectory() as where:
        # Where relative paths would resolve: a reader that looks at the disk finds nothing.
        schema = _tables(registry, Path(where))
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Interchange gateway config ({__version__})",
        "description": "Generated by `gateway config schema` from the declarations "
        "`gateway check` reads; `gateway check` is the final word.",
        **schema,
    }


def _tables(registry: Registry, base: Path) -> dict[str, Any]:
    """Every table of a config file, as the loader's readers ask for them."""
    root = _Recorder()
    loader._gateway(root, base)
    loader._store(root)
    loader._http_endpoint(root, "metrics", registry, [])
    loader._http_endpoint(root, "admin", registry, [])
    protocols = registry.loaded_protocols()
    servers = {n: p.listener_options for n, p in protocols.items() if "server" in p.roles}
    clients = {n: p.upstream_options for n, p in protocols.items() if "client" in p.roles}
    arrays = {
        "listeners": _entries(_record(lambda t: loader._listener(t, base, registry)), servers),
        "upstreams": _entries(_record(lambda t: loader._upstream(t, base, registry)), clients),
        "routes": {"type": "array", "items": _record(lambda t: loader._route(t, set()))},
        "destinations": {
            "type": "array",
            "items": _record(
                lambda t: loader._destination(t, loader.HubLimits(), loader.StoreSettings())
            ),
        },
    }
    return root.schema(arrays)
