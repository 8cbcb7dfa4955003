"""What a config reload changes in a running gateway, decided before anything changes.

A reload (SIGHUP, ``gateway reload``, ``POST /api/reload``) must never drop a
connection that the new config does not concern. So the new config is
checked first (a bad one is refused and the running one stays), then
compared with the running one, entry by entry, by name:

* a listener whose settings are all the same is **kept**: its sockets and
  connections are untouched; if it has TLS, its certificate files are read
  again, so that rotated certificates take effect for new connections;
* a listener only in the new config is **added**; one only in the old is
  **removed** (it stops accepting and its connections drain); one whose
  settings changed (other than TLS files) is removed and added again;
* upstreams likewise (a changed upstream reconnects with its new settings);
* routes and destination declarations are replaced (existing destinations
  keep their buffers; new declarations apply to destinations created later);
* what cannot change without a restart (the memory budget and buffer
  limits, the metrics and admin binds, a protocol no running plugin serves)
  refuses the reload, saying which key.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from gateway.config.loader import Config, ConfigError
from gateway.protocol.plugin import ListenerSettings, UpstreamSettings

__all__ = ["Plan", "ReloadRefused", "Reloadable", "plan", "reload_file"]

log = logging.getLogger("gateway.reload")


class ReloadRefused(Exception):
    """The new config cannot be applied without a restart (the message says why)."""


@dataclass
class Plan:
    """The changes a reload makes, by name."""

    keep_listeners: list[ListenerSettings] = field(default_factory=list)
    add_listeners: list[ListenerSettings] = field(default_factory=list)
    remove_listeners: list[str] = field(default_factory=list)
    keep_upstreams: list[str] = field(default_factory=list)
    add_upstreams: list[UpstreamSettings] = field(default_factory=list)
    remove_upstreams: list[str] = field(default_factory=list)
    routes_changed: bool = False
    destinations_changed: bool = False

    def summary(self) -> str:
        parts = [
            f"{label} {', '.join(names)}"
            for label, names in (
                ("added listeners", [ls.name for ls in self.add_listeners]),
                ("removed listeners", self.remove_listeners),
                ("added upstreams", [up.name for up in self.add_upstreams]),
                ("removed upstreams", self.remove_upstreams),
            )
            if names
        ]
        if self.routes_changed:
            parts.append("routes replaced")
        if self.destinations_changed:
            parts.append("destination declarations replaced")
        return "; ".join(parts) or "nothing changed but certificates were read again"


def _without_tls_files(settings: Any) -> Any:
    """Settings compared for "the same listener": TLS files may change (rotation)."""
    return dataclasses.replace(settings, tls=None) if settings.tls is not None else settings


def plan(old: Config, new: Config, protocols: set[str]) -> Plan:
    """What reloading ``old`` into ``new`` does; :class:`ReloadRefused` if it cannot.

    ``protocols`` are those whose plugins run now (set up at start): a
    listener or upstream of another protocol needs a restart.
    """
    restart = _needs_restart(old, new, protocols)
    if restart:
        raise ReloadRefused("needs a restart to change: " + "; ".join(restart))
    result = Plan()
    running = {ls.name: ls for ls in old.listeners}
    for ls in new.listeners:
        before = running.pop(ls.name, None)
        if before is not None and _without_tls_files(before) == _without_tls_files(ls):
            result.keep_listeners.append(ls)
        else:
            if before is not None:
                result.remove_listeners.append(ls.name)
            result.add_listeners.append(ls)
    result.remove_listeners.extend(running)

    upstreams = {up.name: up for up in old.upstreams}
    for up in new.upstreams:
        previous = upstreams.pop(up.name, None)
        if previous == up:
            result.keep_upstreams.append(up.name)
        else:
            if previous is not None:
                result.remove_upstreams.append(up.name)
            result.add_upstreams.append(up)
    result.remove_upstreams.extend(upstreams)
    result.routes_changed = old.routes != new.routes
    result.destinations_changed = old.destinations != new.destinations
    return result


def _needs_restart(old: Config, new: Config, protocols: set[str]) -> list[str]:
    """What differs between ``old`` and ``new`` that only a restart can change."""
    restart = [
        key
        for key, a, b in (
            (
                "[gateway] memory_budget, connection_memory and buffer limits",
                old.gateway.limits,
                new.gateway.limits,
            ),
            ("[gateway] data_dir", old.gateway.data_dir, new.gateway.data_dir),
            ("[store]", old.store, new.store),
            (
                "whether any destination is durable (the store opens at start)",
                any(d.store for d in old.destinations),
                any(d.store for d in new.destinations),
            ),
            ("[metrics]", _metrics(old), _metrics(new)),
            ("[admin]", _admin(old), _admin(new)),
        )
        if a != b
    ]
    for ls in new.listeners:
        if ls.protocol not in protocols:
            restart.append(f"listener {ls.name!r} of protocol {ls.protocol!r} (not running)")
    for up in new.upstreams:
        if up.protocol not in protocols:
            restart.append(f"upstream {up.name!r} of protocol {up.protocol!r} (not running)")
    return restart


def _metrics(config: Config) -> tuple[Any, ...]:
    return (config.metrics_bind, config.metrics_max_connections, config.metrics_idle_timeout)


def _admin(config: Config) -> tuple[Any, ...]:
    return tuple(
        getattr(config, name, None)
        for name in ("admin_bind", "admin_max_connections", "admin_idle_timeout")
    )


class Reloadable(Protocol):
    """What a reload acts on: the running config's file, how to read one, how to apply it.

    The runtime's :class:`~gateway.runtime.gateway.Gateway` is one. A control
    plane that runs the gateway in other processes would read the file once
    and send the checked :class:`Config` to each of them.
    """

    @property
    def config_path(self) -> Path | None:
        """The file the running config came from (None: the embedded default)."""
        ...

    def read_config(self, path: Path) -> Config:
        """Read and check ``path`` with the plugins the running gateway knows.

        Raises :class:`~gateway.config.loader.ConfigError` or ``OSError``.
        """
        ...

    async def reload(self, config: Config) -> Plan:
        """Apply ``config``; :class:`ReloadRefused` (and nothing changed) if it cannot."""
        ...


async def reload_file(target: Reloadable, via: str = "reload") -> str:
    """Re-read the running gateway's config file, check it, apply it; what changed.

    Raises :class:`ReloadRefused` with the reason: no file (the embedded
    default), a config error (every problem, one a line, each naming the key
    and the file), or a change that needs a restart. The running config
    stays in every one of these cases, and the refusal is logged here, as one
    WARNING of ``gateway.reload`` saying how the reload was asked for
    (``via``: ``SIGHUP``, ``POST /api/reload``), so the gateway's own log has
    it whoever asked (``gateway reload`` prints it only on its own terminal).
    """
    try:
        return await _reload_file(target)
    except ReloadRefused as e:
        log.warning("reload (%s) refused: %s", via, e)
        raise


async def _reload_file(target: Reloadable) -> str:
    path = target.config_path
    if path is None:
        raise ReloadRefused("running the embedded default config: there is no file to re-read")
    try:
        config = target.read_config(path)
    except ConfigError as e:
        raise ReloadRefused(f"{path} has errors; keeping the running config:\n{e}") from e
    except OSError as e:
        raise ReloadRefused(f"cannot read {path}: {e}") from e
    return (await target.reload(config)).summary()
