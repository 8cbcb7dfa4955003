"""The TOML configuration: parsed, validated and defaulted in one pass.

Every error names the file and the key path (``listeners[0].tls.cert``), and
all errors of a file are reported together. Unknown keys are errors, so a
typo never silently falls back to a default. Relative paths are resolved
against the config file's folder. Nothing here binds or connects; files the
config names are read (TLS certificates), and a ``data_dir`` the config needs
is probed (see :func:`data_dir_problem`), so that ``gateway check`` finds what
start-up would.
"""

from __future__ import annotations

import copy
import math
import os
import re
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from gateway.config.units import parse_duration, parse_size
from gateway.core.hub import HubLimits
from gateway.core.model import MESSAGE_OVERHEAD
from gateway.core.routing import UPSTREAM_PREFIX, Route, RouteError, Router
from gateway.ops.logsetup import check_format, check_level
from gateway.protocol.options import REQUIRED, Option
from gateway.protocol.plugin import ListenerSettings, ProtocolPlugin, UpstreamSettings
from gateway.runtime.catalog import DestinationSpec
from gateway.runtime.registry import Registry, default_registry
from gateway.transports.base import TlsClientSettings, TlsServerSettings

__all__ = [
    "Config",
    "ConfigError",
    "GatewaySettings",
    "data_dir_problem",
    "default_config",
    "load",
    "parse",
    "usable_cores",
]

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")
_REQUIRED = REQUIRED
_INDEX = re.compile(r"\[\d+\]")
_T = TypeVar("_T")
LOG_LEVELS = ("debug", "info", "warning", "error")
#: The metrics endpoint's port in the embedded default (Prometheus exporters' 9464).
DEFAULT_METRICS_PORT = 9464
#: The admin API's and status page's port in the embedded default.
DEFAULT_ADMIN_PORT = 9465


class ConfigError(Exception):
    """One or more problems in a config file; ``str()`` lists them, one a line."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


@dataclass(slots=True)
class GatewaySettings:
    data_dir: Path = Path("data")
    drain_timeout: float = 10.0
    log_level: str = "info"
    #: ``text`` or ``json`` (one JSON object per line).
    log_format: str = "text"
    limits: HubLimits = field(default_factory=HubLimits)
    #: Worker processes ``gateway run`` starts (``"auto"``: the usable cores); 1: no supervisor.
    workers: int = 1
    #: With workers > 1: a listening socket per worker with ``SO_REUSEPORT`` for TCP
    #: listeners (the kernel hashes connections over them) instead of shared ones.
    reuse_port: bool = False


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """The ``[store]`` table: the embedded segment store under ``<data_dir>/store``."""

    #: ``always``, ``interval`` (group commit, the default) or ``never``.
    fsync: Literal["always", "interval", "never"] = "interval"
    #: Seconds between group commits under ``interval``.
    fsync_interval: float = 0.005
    #: Bytes per chunk file of a segment.
    chunk_bytes: int = 64 * 1024 * 1024
    #: Bytes a durable destination keeps by default (its ``retain`` overrides).
    retain_bytes: int = 1024 * 1024 * 1024
    #: Seconds data is kept at most (None: no age limit); a destination's ``retain_age`` overrides.
    retain_age: float | None = None


@dataclass(slots=True)
class Config:
    gateway: GatewaySettings
    listeners: list[ListenerSettings]
    upstreams: list[UpstreamSettings]
    routes: list[Route]
    #: The ``[[destinations]]`` table, in the order written (the first match wins).
    destinations: list[DestinationSpec] = field(default_factory=list)
    #: The file it came from; None for the embedded default.
    path: Path | None = None
    #: Where ``GET /metrics`` is served (``[metrics] bind``); None: nowhere.
    metrics_bind: str | None = None
    #: Connections the metrics endpoint serves at once (``[metrics] max_connections``).
    metrics_max_connections: int = 16
    #: Seconds a metrics client has to send each request (``[metrics] idle_timeout``).
    metrics_idle_timeout: float = 10.0
    #: Where the admin API and status page are served (``[admin] bind``); None: nowhere.
    admin_bind: str | None = None
    #: Connections the admin endpoint serves at once (``[admin] max_connections``).
    admin_max_connections: int = 16
    #: Seconds an admin client has to send each request (``[admin] idle_timeout``).
    admin_idle_timeout: float = 10.0
    #: The ``[store]`` table.
    store: StoreSettings = field(default_factory=StoreSettings)


class _Errors:
    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[str] = []
        #: ``upstream`` options read so far, as (key path, upstream name, protocol of
        #: the declaring listener or upstream): resolved once every upstream is read.
        self.refs: list[tuple[str, str, str]] = []

    def add(self, key: str, message: str) -> None:
        self.items.append(
            f"{self.source}: {key}: {message}" if key else f"{self.source}: {message}"
        )


def _convert(kind: str, value: Any) -> Any:
    """Convert ``value`` to ``kind`` or raise ValueError with the reason."""
    if kind == "str":
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {_describe(value)}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {_describe(value)}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {_describe(value)}")
        if not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value!r}")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {_describe(value)}")
        return value
    if kind == "duration":
        return parse_duration(value)
    if kind == "size":
        return parse_size(value)
    if kind in ("str_list", "str_or_list"):
        if kind == "str_or_list" and isinstance(value, str):
            return [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ValueError(f"expected a list of strings, got {_describe(value)}")
        return list(value)
    if kind == "workers":
        if value == "auto":
            return usable_cores()
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f'expected a number of workers or "auto", got {_describe(value)}')
        return value
    raise AssertionError(f"unknown option kind {kind}")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), what ``workers = "auto"`` means."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


def _describe(value: Any) -> str:
    kind = {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "a table",
    }.get(type(value), type(value).__name__)
    return f"{kind} ({value!r})" if not isinstance(value, dict | list) else kind


class _Table:
    """Reads keys from one TOML table, recording errors and unknown keys."""

    def __init__(self, errors: _Errors, path: str, data: Any) -> None:
        self.errors = errors
        self.path = path
        self.ok = isinstance(data, dict)
        if not self.ok:
            errors.add(path, f"expected a table, got {_describe(data)}")
        self.data: dict[str, Any] = data if self.ok else {}
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def get(
        self,
        name: str,
        kind: str,
        default: Any = _REQUIRED,
        *,
        minimum: float | None = None,
        maximum: float | None = None,
        choices: tuple[str, ...] = (),
        check: Callable[[Any], object] | None = None,
    ) -> Any:
        self.used.add(name)
        if name not in self.data:
            if default is _REQUIRED:
                self.errors.add(self.key(name), "is required")
                return None
            return default
        try:
            value = _convert(kind, self.data[name])
            if minimum is not None and value < minimum:
                raise ValueError(f"must be at least {minimum:g}")
            if maximum is not None and value > maximum:
                raise ValueError(f"must be at most {maximum:g}")
            if choices and value not in choices:
                raise ValueError(f"must be one of {', '.join(map(repr, choices))}, got {value!r}")
            if check is not None:
                check(value)
        except ValueError as e:
            self.errors.add(self.key(name), str(e))
            return None if default is _REQUIRED else default
        return value

    def table(self, name: str) -> _Table | None:
        self.used.add(name)
        if name not in self.data:
            return None
        return _Table(self.errors, self.key(name), self.data[name])

    def options(self, schema: Mapping[str, Option], protocol: str) -> dict[str, Any]:
        """The plugin-declared keys of ``schema``: converted and defaulted, tables too.

        The one validator of plugin options, recursive for ``table``/``tables``.
        ``protocol`` is that of the listener or upstream declaring them: an
        ``upstream`` option must name an upstream speaking it, which
        :func:`_check_upstream_refs` checks once every upstream is read.
        """
        return {name: self._option(name, opt, protocol) for name, opt in schema.items()}

    def _option(self, name: str, opt: Option, protocol: str) -> Any:
        if opt.kind == "table":
            return self._table_option(name, opt, protocol)
        if opt.kind == "tables":
            return self._tables_option(name, opt, protocol)
        errors_before = len(self.errors.items)
        value = self.get(
            name,
            "str" if opt.kind == "upstream" else opt.kind,
            _fresh(opt.default),
            minimum=opt.minimum,
            maximum=opt.maximum,
            choices=opt.choices,
            check=opt.check,
        )
        written = name in self.data and len(self.errors.items) == errors_before
        if opt.kind == "upstream" and written:
            self.errors.refs.append((self.key(name), value, protocol))
        return value

    def _absent(self, name: str, opt: Option) -> Any:
        if opt.required:
            self.errors.add(self.key(name), "is required")
            return None
        return _fresh(opt.default)

    def _table_option(self, name: str, opt: Option, protocol: str) -> Any:
        sub = self.table(name)
        if sub is None:
            return self._absent(name, opt)
        if not sub.ok:
            return None if opt.required else _fresh(opt.default)
        value, clean = sub._fields(opt, protocol)
        if clean:
            self._check(name, opt, value)
        return value

    def _tables_option(self, name: str, opt: Option, protocol: str) -> Any:
        self.used.add(name)
        if name not in self.data:
            return self._absent(name, opt)
        entries = self.data[name]
        key = self.key(name)
        if not isinstance(entries, list):
            got = _describe(entries)
        else:
            got = next((_describe(e) for e in entries if not isinstance(e, dict)), "")
            got = got and f"a list holding {got}"
        if got:
            # How the user writes one entry: [[listeners.services]], without indexes.
            header = _INDEX.sub("", key)
            self.errors.add(key, f"expected an array of tables ([[{header}]]), got {got}")
            return None if opt.required else _fresh(opt.default)
        value = []
        clean = True
        for i, entry in enumerate(entries):
            fields, ok = _Table(self.errors, f"{key}[{i}]", entry)._fields(opt, protocol)
            value.append(fields)
            clean = clean and ok
        if clean:
            self._check(name, opt, value)
        return value

    def _fields(self, opt: Option, protocol: str) -> tuple[dict[str, Any], bool]:
        """This table as an entry of ``opt``; and whether it had no errors."""
        errors_before = len(self.errors.items)
        value = self.options(opt.fields, protocol)
        self.finish(_keys_hint(list(opt.fields)))
        return value, len(self.errors.items) == errors_before

    def _check(self, name: str, opt: Option, value: Any) -> None:
        if opt.check is None:
            return
        try:
            opt.check(value)
        except ValueError as e:
            self.errors.add(self.key(name), str(e))

    def finish(self, hint: str = "") -> None:
        for name in self.data:
            if name not in self.used:
                self.errors.add(self.key(name), "unknown key" + (f" ({hint})" if hint else ""))


def _keys_hint(names: list[str]) -> str:
    """The hint an unknown key's error gives: which keys there are."""
    if len(names) > 1:
        return f"keys are {', '.join(names[:-1])} and {names[-1]}"
    return f"the only key is {names[0]}"


def _fresh(default: Any) -> Any:
    """A default to hand out: a copy when mutable, so no two settings share one."""
    return copy.deepcopy(default) if isinstance(default, list | dict) else default


def _path(base: Path, value: str | None) -> Path | None:
    if value is None:
        return None
    p = Path(value).expanduser()
    return p if p.is_absolute() else base / p


def _check_name(value: str) -> None:
    if not _NAME.match(value):
        raise ValueError(
            f"{value!r} is not a valid name (letters, digits, '_', '.', '-'; at most 64)"
        )


def parse(
    data: Mapping[str, Any],
    *,
    source: str = "<config>",
    base_dir: Path | None = None,
    registry: Registry | None = None,
) -> Config:
    """Validate ``data`` (a parsed TOML document) into a :class:`Config`.

    Raises :class:`ConfigError` listing every problem found. The tables are read
    in a fixed order (each after those its checks need), so the errors come in
    the same order every time.
    """
    registry = registry or default_registry()
    base = base_dir or Path.cwd()
    errors = _Errors(source)
    root = _Table(errors, "", dict(data))
    gateway = _gateway(root, base)
    listeners, upstreams = _peers(root, base, registry)
    routes = _routes(root, {up.name for up in upstreams})
    store = _store(root)
    destinations = _destinations(root, gateway.limits, store)
    metrics, admin = _endpoints(root, registry, listeners)
    if _needs_data_dir(destinations, [ls for _, ls in listeners], registry):
        problem = data_dir_problem(gateway.data_dir)
        if problem is not None:
            errors.add("gateway.data_dir", problem)
    root.finish(
        "top-level tables are gateway, store, metrics, admin, listeners, upstreams, routes"
        " and destinations"
    )
    if errors.items:
        raise ConfigError(errors.items)
    config = Config(
        gateway,
        [ls for _, ls in listeners],
        upstreams,
        routes,
        destinations,
        metrics_bind=metrics.bind,
        metrics_max_connections=metrics.max_connections,
        metrics_idle_timeout=metrics.idle_timeout,
        admin_bind=admin.bind,
        admin_max_connections=admin.max_connections,
        admin_idle_timeout=admin.idle_timeout,
        store=store,
    )
    return config


def _gateway(root: _Table, base: Path) -> GatewaySettings:
    """The ``[gateway]`` table (its defaults when it is absent)."""
    gw = root.table("gateway") or _Table(root.errors, "gateway", {})
    limits = _limits(gw)
    gateway = GatewaySettings(
        data_dir=_path(base, gw.get("data_dir", "str", "data")) or base / "data",
        drain_timeout=gw.get("drain_timeout", "duration", 10.0),
        log_level=str(gw.get("log_level", "str", "info", check=check_level)).lower(),
        log_format=str(gw.get("log_format", "str", "text", check=check_format)).lower(),
        limits=limits,
        workers=gw.get("workers", "workers", 1, minimum=1),
        reuse_port=gw.get("reuse_port", "bool", False),
    )
    gw.finish()
    return gateway


def _needs_data_dir(
    destinations: list[DestinationSpec], listeners: list[ListenerSettings], registry: Registry
) -> bool:
    """The gateway will open its store: a durable destination, or a protocol that
    stores segments (the same test as the runtime's)."""
    if any(d.store for d in destinations):
        return True
    for ls in listeners:
        try:
            if registry.protocol(ls.protocol).needs_store:
                return True
        except LookupError:
            continue  # reported with the listener
    return False


def data_dir_problem(path: Path) -> str | None:
    """Why the gateway could not create ``path`` or write in it (None: it can).

    Probed, not assumed (a root process passes every permission check, yet
    cannot create a directory under ``/proc`` or on a read-only mount): a
    temporary file in ``path`` if it exists, else a temporary directory in
    its nearest existing parent, each removed at once. ``path`` itself is
    not created.
    """
    existing = path
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    try:
        if existing == path:
            if not path.is_dir():
                return f"'{path}' is not a directory"
            with tempfile.TemporaryFile(dir=path, prefix=".interchange-check-"):
                pass
            return None
        if not existing.is_dir():
            return f"cannot create '{path}': '{existing}' is not a directory"
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".interchange-check-"))
    except OSError as e:
        verb = "write in" if existing == path else "create"
        return f"cannot {verb} '{path}': {e.strerror or e}"
    return None


def _limits(gw: _Table) -> HubLimits:
    """The hub's limits, kept in the ``[gateway]`` table."""
    d = HubLimits()
    limits = HubLimits(
        buffer_bytes=gw.get("buffer_bytes", "size", d.buffer_bytes, minimum=1024),
        buffer_messages=gw.get("buffer_messages", "int", d.buffer_messages, minimum=1),
        max_destinations=gw.get("max_destinations", "int", d.max_destinations, minimum=1),
        memory_budget=gw.get("memory_budget", "size", d.memory_budget, minimum=1024 * 1024),
        connection_memory=gw.get(
            "connection_memory", "size", d.connection_memory, minimum=64 * 1024
        ),
    )
    if limits.connection_memory > limits.memory_budget:
        gw.errors.add(
            gw.key("connection_memory"),
            f"{limits.connection_memory} bytes is more than memory_budget"
            f" ({limits.memory_budget} bytes)",
        )
    return limits


def _entries(root: _Table, name: str, read: Callable[[_Table], _T | None]) -> list[tuple[int, _T]]:
    """The entries of the array of tables ``name`` that ``read`` accepts, each with its
    index in the file, so that later errors name the entry as written."""
    return [
        (i, value)
        for i, item in enumerate(_array(root, name, root.errors))
        if (value := read(_Table(root.errors, f"{name}[{i}]", item)))
    ]


def _peers(
    root: _Table, base: Path, registry: Registry
) -> tuple[list[tuple[int, ListenerSettings]], list[UpstreamSettings]]:
    """``[[listeners]]`` (with their indexes in the file) and ``[[upstreams]]``.

    Both are read before names and binds are compared, and the listeners'
    ``upstream`` options are checked against the upstreams as written.
    """
    errors = root.errors
    listeners = _entries(root, "listeners", lambda t: _listener(t, base, registry))
    upstreams = _entries(root, "upstreams", lambda t: _upstream(t, base, registry))
    _unique(errors, "listeners", [(i, ls.name) for i, ls in listeners], "name")
    # Port 0 asks the OS for a free port: several such binds never collide.
    fixed_binds = [(i, ls.bind) for i, ls in listeners if not _any_port(ls.bind)]
    _unique(errors, "listeners", fixed_binds, "bind")
    _unique(errors, "upstreams", [(i, up.name) for i, up in upstreams], "name")
    _check_upstream_refs(errors, root.data.get("upstreams"))
    return listeners, [up for _, up in upstreams]


def _routes(root: _Table, upstream_names: set[str]) -> list[Route]:
    """The ``[[routes]]`` array: the valid ones, in the order written."""
    return [route for _, route in _entries(root, "routes", lambda t: _route(t, upstream_names))]


def _route(t: _Table, upstream_names: set[str]) -> Route | None:
    """One ``[[routes]]`` entry; None if it has an error."""
    pattern = t.get("from", "str")
    to = t.get("to", "str_or_list")
    t.finish()
    if pattern is None or to is None:
        return None
    if not to:
        t.errors.add(t.key("to"), "must name at least one target")
        return None
    for target in to:
        if target.startswith(UPSTREAM_PREFIX):
            up = target[len(UPSTREAM_PREFIX) :]
            if up not in upstream_names:
                t.errors.add(t.key("to"), f"no upstream named {up!r} is configured")
    route = Route(pattern, tuple(to))
    try:
        Router([route])
    except RouteError as e:
        t.errors.add(t.key("to"), str(e))
        return None
    return route


def _destinations(root: _Table, limits: HubLimits, store: StoreSettings) -> list[DestinationSpec]:
    """The ``[[destinations]]`` array, names unique."""
    indexed = _entries(root, "destinations", lambda t: _destination(t, limits, store))
    _unique(root.errors, "destinations", [(i, d.name) for i, d in indexed], "name")
    return [spec for _, spec in indexed]


@dataclass(frozen=True, slots=True)
class _Endpoint:
    """An HTTP endpoint's table (``[metrics]``, ``[admin]``); ``bind`` None: not served."""

    bind: str | None = None
    max_connections: int = 16
    idle_timeout: float = 10.0


def _endpoints(
    root: _Table, registry: Registry, listeners: list[tuple[int, ListenerSettings]]
) -> tuple[_Endpoint, _Endpoint]:
    """The ``[metrics]`` and ``[admin]`` tables, their binds checked against each other
    and every listener's."""
    metrics = _http_endpoint(root, "metrics", registry, listeners)
    admin = _http_endpoint(root, "admin", registry, listeners)
    if admin.bind is not None and admin.bind == metrics.bind and not _any_port(admin.bind):
        root.errors.add("admin.bind", "is also the bind of metrics")
    _overlapping_binds(
        root.errors,
        [(f"listeners[{i}].bind", ls.bind) for i, ls in listeners]
        + [("metrics.bind", metrics.bind), ("admin.bind", admin.bind)],
    )
    return metrics, admin


def _http_endpoint(
    root: _Table, name: str, registry: Registry, listeners: list[tuple[int, ListenerSettings]]
) -> _Endpoint:
    """The ``[metrics]`` or ``[admin]`` table."""
    table = root.table(name)
    if table is None or not table.ok:
        return _Endpoint()
    bind = table.get("bind", "str", check=_check_address(registry, plain=True, what=name))
    max_connections = table.get("max_connections", "int", 16, minimum=1)
    idle_timeout = table.get("idle_timeout", "duration", 10.0, minimum=0.01)
    table.finish()
    if bind is not None and not _any_port(bind):
        for i, ls in listeners:
            if ls.bind == bind:
                root.errors.add(table.key("bind"), f"is also the bind of listeners[{i}]")
    return _Endpoint(bind, max_connections, idle_timeout)


def _check_destination_name(value: str) -> None:
    if not value:
        raise ValueError("must not be empty")
    if value.startswith(UPSTREAM_PREFIX):
        raise ValueError(f"{value!r}: upstream destinations are queues and cannot be configured")


#: Values of a destination's ``store`` key: where its log is kept.
STORES = ("embedded",)


def _store(root: _Table) -> StoreSettings:
    """The ``[store]`` table."""
    d = StoreSettings()
    t = root.table("store")
    if t is None or not t.ok:
        return d
    settings = StoreSettings(
        fsync=t.get("fsync", "str", d.fsync, choices=("always", "interval", "never")),
        fsync_interval=t.get("fsync_interval", "duration", d.fsync_interval, minimum=0.0001),
        chunk_bytes=t.get("chunk_bytes", "size", d.chunk_bytes, minimum=64 * 1024),
        retain_bytes=t.get("retain_bytes", "size", d.retain_bytes, minimum=1024),
        retain_age=t.get("retain_age", "duration", d.retain_age, minimum=1.0),
    )
    t.finish("keys are fsync, fsync_interval, chunk_bytes, retain_bytes and retain_age")
    return settings


def _check_groups(groups: list[str]) -> None:
    for g in groups:
        _check_name(g)


#: A ``[[destinations]]`` entry's keys, in the order they are read: key -> (kind,
#: default, bounds as :meth:`_Table.get` takes them).
_DESTINATION_KEYS: dict[str, tuple[str, Any, dict[str, Any]]] = {
    "name": ("str", _REQUIRED, {"check": _check_destination_name}),
    "kind": ("str", "topic", {"choices": ("topic", "queue")}),
    "store": ("str", None, {"choices": STORES}),
    "retain": ("size", None, {"minimum": 1024}),
    "retain_age": ("duration", None, {"minimum": 1.0}),
    "partitions": ("int", None, {"minimum": 1, "maximum": 1024}),
    "partition_key": ("str", None, {}),
    "overflow": ("str", None, {"choices": ("block", "drop_oldest")}),
    "element_size": ("int", None, {"minimum": 1, "maximum": 16 * 1024 * 1024}),
    "groups": ("str_list", (), {"check": _check_groups}),
    "buffer_bytes": ("size", None, {"minimum": 1024}),
    "buffer_messages": ("int", None, {"minimum": 1}),
}


def _not_durable(v: dict[str, Any]) -> bool:
    return v["store"] is None


def _not_a_log(v: dict[str, Any]) -> bool:
    return v["retain"] is None and v["store"] is None


def _a_log(v: dict[str, Any]) -> bool:
    return not _not_a_log(v)


_DURABLE_ONLY = "applies to durable destinations only: set 'store' too"
_NOT_FOR_LOGS = "does not apply to a log, which 'retain' bounds"

#: Keys that do not fit every destination, checked in this order: (key, whether a
#: destination's keys ``v`` rule it out when it is set, why).
_MISFITS: tuple[tuple[str, Callable[[dict[str, Any]], bool], str], ...] = (
    ("retain_age", _not_durable, _DURABLE_ONLY),
    ("partitions", _not_durable, _DURABLE_ONLY),
    ("partition_key", _not_durable, _DURABLE_ONLY),
    ("partition_key", lambda v: v["partitions"] in (None, 1), "needs 'partitions' above 1"),
    ("overflow", _not_a_log, "applies to logs only: set 'retain' or 'store' too"),
    ("buffer_bytes", _a_log, _NOT_FOR_LOGS),
    ("buffer_messages", _a_log, _NOT_FOR_LOGS),
    (
        "groups",
        lambda v: v["kind"] == "queue" and bool(v["groups"]),
        "a queue has one group, which every subscriber joins",
    ),
)


def _destination(t: _Table, limits: HubLimits, store: StoreSettings) -> DestinationSpec | None:
    """One ``[[destinations]]`` entry, checked for keys that do not fit its kind."""
    if not t.ok:
        return None
    v = {
        key: t.get(key, kind, default, **bounds)
        for key, (kind, default, bounds) in _DESTINATION_KEYS.items()
    }
    t.finish(_keys_hint(list(_DESTINATION_KEYS)))
    for key, misfits, why in _MISFITS:
        if v[key] is not None and misfits(v):
            t.errors.add(t.key(key), why)
    retain = store.retain_bytes if v["store"] is not None and v["retain"] is None else v["retain"]
    if v["element_size"] is not None:
        bound = retain if retain is not None else v["buffer_bytes"] or limits.buffer_bytes
        if v["element_size"] + MESSAGE_OVERHEAD > bound:
            t.errors.add(t.key("element_size"), f"does not fit the buffer of {bound} bytes")
    if v["name"] is None:
        return None
    return DestinationSpec(
        name=v["name"],
        kind=v["kind"],
        retain=retain,
        overflow=v["overflow"] or "block",
        element_size=v["element_size"],
        groups=tuple(v["groups"]),
        buffer_bytes=v["buffer_bytes"],
        buffer_messages=v["buffer_messages"],
        store=v["store"],
        retain_age=v["retain_age"] if v["retain_age"] is not None else store.retain_age,
        partitions=v["partitions"] or 1,
        partition_key=v["partition_key"],
    )


_WILDCARDS = {"", "*", "0.0.0.0", "::", "[::]"}


def _overlapping_binds(errors: _Errors, binds: list[tuple[str, str | None]]) -> None:
    """Refuse a TCP port bound twice where the addresses overlap.

    ``127.0.0.1:7070`` beside ``0.0.0.0:7070`` passes on some systems and
    fails on others (or takes traffic away from one of them): a wildcard
    address covers every specific one on the same port. Identical binds are
    reported where they are checked already.
    """
    seen: list[tuple[str, str, int]] = []
    for key, bind in binds:
        if bind is None or bind.startswith("unix:") or _any_port(bind):
            continue
        host, _, port_text = bind.rpartition(":")
        if not port_text.isdigit():
            continue
        port = int(port_text)
        for other_key, other_host, other_port in seen:
            if (
                port == other_port
                and host != other_host
                and (host in _WILDCARDS or other_host in _WILDCARDS)
            ):
                errors.add(
                    key,
                    f"{bind} overlaps {other_key} ({other_host or '*'}:{other_port}):"
                    " a wildcard address already covers every address on that port",
                )
        seen.append((key, host, port))


def _any_port(bind: str) -> bool:
    """A TCP bind to port 0 (the OS picks a free port); ``unix:/x:0`` is a path."""
    return bind.endswith(":0") and not bind.startswith("unix:")


def _array(root: _Table, name: str, errors: _Errors) -> list[Any]:
    root.used.add(name)
    value = root.data.get(name, [])
    if not isinstance(value, list):
        errors.add(name, f"expected an array of tables ([[{name}]]), got {_describe(value)}")
        return []
    return value


def _check_upstream_refs(errors: _Errors, upstreams: Any) -> None:
    """Check the ``upstream`` options read so far against ``[[upstreams]]`` as written.

    An upstream with errors of its own still counts as configured here, so
    that a reference to it adds no second error.
    """
    speaks: dict[str, Any] = {}
    for item in upstreams if isinstance(upstreams, list) else []:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            speaks.setdefault(item["name"], item.get("protocol"))
    for key, name, protocol in errors.refs:
        if name not in speaks:
            errors.add(key, f"no upstream named {name!r} is configured")
        elif isinstance(speaks[name], str) and speaks[name] != protocol:
            errors.add(key, f"upstream {name!r} speaks {speaks[name]!r}, not {protocol!r}")


def _unique(errors: _Errors, table: str, values: list[tuple[int, str]], key: str) -> None:
    seen: set[str] = set()
    for i, v in values:
        if v in seen:
            errors.add(f"{table}[{i}].{key}", f"duplicate {key} {v!r}")
        seen.add(v)


def _check_address(
    registry: Registry, *, plain: bool = False, what: str = "metrics"
) -> Callable[[str], None]:
    """Check an address with the transport that claims it (``plain``: one without a handshake,
    for the ``what`` endpoint)."""

    def check(address: str) -> None:
        try:
            transport = registry.transport_for(address)
        except LookupError as e:
            raise ValueError(str(e)) from None
        transport.check_address(address)
        if plain and transport.handshakes:
            raise ValueError(
                f"the {transport.name} transport has a handshake of its own, and the "
                f"{what} endpoint is plain HTTP (use host:port or unix:)"
            )

    return check


def _protocol(
    t: _Table, registry: Registry, role: str
) -> tuple[str | None, type[ProtocolPlugin] | None]:
    """The ``protocol`` key: its name, and the plugin if it is loaded and has ``role``."""
    protocol_name = t.get("protocol", "str")
    if protocol_name is None:
        return None, None
    try:
        plugin = registry.protocol(protocol_name)
    except LookupError as e:
        t.errors.add(t.key("protocol"), str(e))
        return protocol_name, None
    if role not in plugin.roles:
        t.errors.add(t.key("protocol"), f"protocol {protocol_name!r} has no {role} role")
        return protocol_name, None
    return protocol_name, plugin


def _listener(t: _Table, base: Path, registry: Registry) -> ListenerSettings | None:
    if not t.ok:
        return None
    name = t.get("name", "str", check=_check_name)
    protocol_name, plugin = _protocol(t, registry, "server")
    bind = t.get("bind", "str", check=_check_address(registry))
    settings = ListenerSettings(
        name=name,
        protocol=protocol_name or "",
        bind=bind,
        destination=t.get("destination", "str", name or ""),
        max_connections=t.get("max_connections", "int", 1024, minimum=1),
        max_connections_per_address=t.get("max_connections_per_address", "int", 256, minimum=0),
        handshake_timeout=t.get("handshake_timeout", "duration", 10.0),
        idle_timeout=t.get("idle_timeout", "duration", 60.0),
    )
    tls = t.table("tls")
    if tls is not None and tls.ok:
        cert = _path(base, tls.get("cert", "str"))
        key = _path(base, tls.get("key", "str"))
        client_auth = tls.get(
            "client_auth", "str", "none", choices=("none", "optional", "required")
        )
        client_ca = _path(base, tls.get("client_ca", "str", None))
        min_version = tls.get("min_version", "str", "1.2", choices=("1.2", "1.3"))
        tls.finish()
        if client_auth != "none" and client_ca is None:
            t.errors.add(tls.key("client_ca"), f"is required when client_auth = {client_auth!r}")
        elif cert is not None and key is not None:
            settings.tls = TlsServerSettings(cert, key, client_ca, client_auth, min_version)
            _try_tls(t, tls.path, lambda: registry.layer_for("tls").server_context(settings.tls))
    if plugin is not None:
        settings.options = t.options(plugin.listener_options, protocol_name or "")
    t.finish(f"see the {protocol_name!r} protocol's listener options" if plugin else "")
    if None in (name, protocol_name, bind) or plugin is None:
        return None
    return settings


def _upstream(t: _Table, base: Path, registry: Registry) -> UpstreamSettings | None:
    if not t.ok:
        return None
    name = t.get("name", "str", check=_check_name)
    protocol_name, plugin = _protocol(t, registry, "client")
    check = _check_address(registry)

    def check_all(addresses: list[str]) -> None:
        if not addresses:
            raise ValueError("needs at least one address")
        for a in addresses:
            check(a)

    settings = UpstreamSettings(
        name=name,
        protocol=protocol_name or "",
        connect=t.get("connect", "str_or_list", check=check_all),
        connect_timeout=t.get("connect_timeout", "duration", 10.0),
        handshake_timeout=t.get("handshake_timeout", "duration", 10.0),
        backoff_initial=t.get("backoff_initial", "duration", 0.5),
        backoff_max=t.get("backoff_max", "duration", 5.0),
        destination=t.get("destination", "str", name or ""),
    )
    tls = t.table("tls")
    if tls is not None and tls.ok:
        settings.tls = TlsClientSettings(
            ca=_path(base, tls.get("ca", "str", None)),
            cert=_path(base, tls.get("cert", "str", None)),
            key=_path(base, tls.get("key", "str", None)),
            server_name=tls.get("server_name", "str", None),
            verify=tls.get("verify", "bool", True),
            min_version=tls.get("min_version", "str", "1.2", choices=("1.2", "1.3")),
        )
        tls.finish()
        _try_tls(t, tls.path, lambda: registry.layer_for("tls").client_context(settings.tls))
    if plugin is not None:
        settings.options = t.options(plugin.upstream_options, protocol_name or "")
    t.finish(f"see the {protocol_name!r} protocol's upstream options" if plugin else "")
    if None in (name, protocol_name, settings.connect) or plugin is None:
        return None
    return settings


def _try_tls(t: _Table, key: str, build: Callable[[], object]) -> None:
    try:
        build()
    except (ValueError, LookupError, OSError) as e:
        t.errors.add(key, str(e))


def load(path: str | Path, registry: Registry | None = None) -> Config:
    """Read and validate the config file at ``path``."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"{path}: cannot read: {e.strerror or e}"]) from None
    except UnicodeDecodeError as e:
        raise ConfigError([f"{path}: not UTF-8 text: {e}"]) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError([f"{path}: invalid TOML: {e}"]) from None
    config = parse(data, source=str(path), base_dir=path.parent.resolve(), registry=registry)
    config.path = path
    return config


def default_config(registry: Registry | None = None, base_dir: Path | None = None) -> Config:
    """The embedded default: every registered server protocol on loopback, own port,
    publishing into durable queues kept under ``./data``."""
    registry = registry or default_registry()
    data = default_data(registry)
    return parse(data, source="<embedded default>", base_dir=base_dir, registry=registry)


def default_data(registry: Registry) -> dict[str, Any]:
    """The embedded default as the config table it stands for (see :func:`default_config`)."""
    listeners = []
    for name, plugin in registry.loaded_protocols().items():
        if "server" not in plugin.roles or plugin.default_port is None:
            continue
        item: dict[str, Any] = {
            "name": name,
            "protocol": name,
            "bind": f"127.0.0.1:{plugin.default_port}",
        }
        item.update(plugin.default_listener())
        listeners.append(item)
    # What the default listeners publish is kept on disk (a durable queue): a
    # sender is acked once it is stored, and a consumer gets each message once
    # it comes, across restarts.
    queues = sorted({item.get("destination", item["name"]) for item in listeners})
    destinations = [{"name": name, "kind": "queue", "store": "embedded"} for name in queues]
    # Where `gateway pipeline`'s example job writes its alerts: a durable topic, so
    # every subscriber of any protocol gets each alert.
    destinations.append({"name": "alerts", "kind": "topic", "store": "embedded"})
    return {
        "gateway": {"data_dir": "data"},
        "metrics": {"bind": f"127.0.0.1:{DEFAULT_METRICS_PORT}"},
        "admin": {"bind": f"127.0.0.1:{DEFAULT_ADMIN_PORT}"},
        "listeners": listeners,
        "destinations": destinations,
    }
