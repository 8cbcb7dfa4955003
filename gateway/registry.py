"""Plugin discovery through entry points.

Protocols register in ``interchange.protocols`` (the entry point names a
:class:`~gateway.plugin.ProtocolPlugin` subclass: each gateway makes its own
instance) and transports in ``interchange.transports``; the built-in
protocols and the bundled plugins register exactly as a third party's
package would. A plugin that fails
to import is reported (by ``gateway plugins`` and by config checks that name
it) instead of taking the gateway down.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from .plugin import ProtocolPlugin
from .transports.base import SocketTransport, StreamLayer

__all__ = ["PROTOCOLS_GROUP", "TRANSPORTS_GROUP", "Registered", "Registry", "default_registry"]

PROTOCOLS_GROUP = "interchange.protocols"
TRANSPORTS_GROUP = "interchange.transports"


@dataclass(frozen=True, slots=True)
class Registered:
    """One entry point: what it loaded, or why it could not."""

    name: str
    target: str
    distribution: str
    version: str
    plugin: Any = None
    error: str | None = None


def _load(ep: EntryPoint, expected: tuple[type, ...], *, keep_class: bool = False) -> Registered:
    """Load ``ep``: a class (instantiated unless ``keep_class``) or an instance."""
    dist = ep.dist
    name, version = (dist.name, dist.version) if dist is not None else ("?", "?")
    try:
        obj = ep.load()
        kinds = " or ".join(t.__name__ for t in expected)
        if keep_class:
            cls = obj if isinstance(obj, type) else type(obj)
            if not issubclass(cls, expected):
                raise TypeError(f"{ep.value} is not a {kinds} subclass")
            obj = cls
        elif isinstance(obj, type):
            obj = obj()
        if not keep_class and not isinstance(obj, expected):
            raise TypeError(f"{ep.value} is a {type(obj).__name__}, not a {kinds}")
    except Exception as e:
        return Registered(ep.name, ep.value, name, version, error=f"{type(e).__name__}: {e}")
    return Registered(ep.name, ep.value, name, version, plugin=obj)


class Registry:
    """The protocols and transports available to this gateway."""

    def __init__(self, protocols: dict[str, Registered], transports: dict[str, Registered]) -> None:
        self.protocols = protocols
        self.transports = transports

    @classmethod
    def discover(cls) -> Registry:
        protocols = {
            ep.name: _load(ep, (ProtocolPlugin,), keep_class=True)
            for ep in entry_points(group=PROTOCOLS_GROUP)
        }
        transports = {
            ep.name: _load(ep, (SocketTransport, StreamLayer))
            for ep in entry_points(group=TRANSPORTS_GROUP)
        }
        return cls(dict(sorted(protocols.items())), dict(sorted(transports.items())))

    def protocol(self, name: str) -> type[ProtocolPlugin]:
        """The class of protocol ``name``; ``LookupError`` says why it is unavailable.

        (A registration holding an instance stands for that instance's class:
        gateways never share a plugin instance.)
        """
        reg = self.protocols.get(name)
        if reg is None:
            known = ", ".join(n for n, r in self.protocols.items() if r.error is None)
            raise LookupError(f"unknown protocol {name!r} (registered: {known or 'none'})")
        if reg.error is not None:
            raise LookupError(f"protocol {name!r} failed to load: {reg.error}")
        return _class_of(reg.plugin)

    def socket_transport(self, address: str) -> SocketTransport:
        """The socket transport that claims ``address``; specific schemes before tcp."""
        candidates = [
            r.plugin
            for r in self.transports.values()
            if r.error is None and isinstance(r.plugin, SocketTransport)
        ]
        # The catch-all (tcp) is asked last so that a scheme like "unix:" wins.
        candidates.sort(key=lambda t: t.name == "tcp")
        for t in candidates:
            if t.claims(address):
                return t
        raise LookupError(f"no transport handles address {address!r}")

    def layer(self, name: str) -> StreamLayer:
        reg = self.transports.get(name)
        if reg is None or reg.error is not None or not isinstance(reg.plugin, StreamLayer):
            why = reg.error if reg is not None and reg.error else "not registered"
            raise LookupError(f"transport layer {name!r} is unavailable: {why}")
        return reg.plugin

    def loaded_protocols(self) -> dict[str, type[ProtocolPlugin]]:
        return {n: _class_of(r.plugin) for n, r in self.protocols.items() if r.error is None}


def _class_of(plugin: Any) -> type[ProtocolPlugin]:
    return plugin if isinstance(plugin, type) else type(plugin)


@functools.cache
def default_registry() -> Registry:
    """The registry of installed entry points, discovered once per process."""
    return Registry.discover()
