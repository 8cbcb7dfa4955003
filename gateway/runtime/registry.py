"""Plugin discovery through entry points.

Protocols register in ``interchange.protocols`` (the entry point names a
:class:`~gateway.protocol.plugin.ProtocolPlugin` subclass: each gateway makes its own
instance) and transports in ``interchange.transports``; the built-in
protocols and the bundled plugins register exactly as a third party's
package would. A plugin that fails
to import is reported (by ``gateway plugins`` and by config checks that name
it) instead of taking the gateway down.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from gateway.protocol.plugin import ProtocolPlugin
from gateway.transports.base import StreamLayer, Transport, address_scheme

__all__ = [
    "BUILTIN_DISTRIBUTION",
    "PROTOCOLS_GROUP",
    "TRANSPORTS_GROUP",
    "Registered",
    "Registry",
    "default_registry",
]

PROTOCOLS_GROUP = "interchange.protocols"
TRANSPORTS_GROUP = "interchange.transports"
#: The distribution of the built-in transports and layers; any other one's win over them.
BUILTIN_DISTRIBUTION = "interchange-gateway"


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
        #: Transports and layers by entry-point name (a registered class is instantiated once).
        self.transports = {name: _instantiated(reg) for name, reg in transports.items()}

    @classmethod
    def discover(cls) -> Registry:
        protocols = {
            ep.name: _load(ep, (ProtocolPlugin,), keep_class=True)
            for ep in entry_points(group=PROTOCOLS_GROUP)
        }
        transports = {
            ep.name: _load(ep, (Transport, StreamLayer))
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

    def transport_for(self, address: str) -> Transport:
        """The transport that claims ``address`` (a ``bind`` or ``connect`` string).

        Transports that claim it by scheme come before the fallback (tcp). If
        several claim it, a third party's wins over the built-in one; two
        third-party transports claiming it are a ``LookupError`` naming both.
        """
        loaded = [
            r
            for r in self.transports.values()
            if r.error is None and isinstance(r.plugin, Transport)
        ]
        for fallback in (False, True):
            claimants = [
                r
                for r in loaded
                if bool(r.plugin.fallback) is fallback and r.plugin.claims(address)
            ]
            if claimants:
                plugin: Transport = _pick(claimants, f"address {address!r}").plugin
                return plugin
        schemes = sorted({scheme for r in loaded for scheme in r.plugin.schemes})
        known = f"known schemes: {', '.join(schemes) or 'none'}"
        for r in loaded:
            if r.plugin.fallback:
                known += f"; else host:port for {r.plugin.name}"
        scheme = address_scheme(address)
        what = f"{scheme}:// addresses" if scheme else f"address {address!r}"
        raise LookupError(f"no transport handles {what} ({known})")

    def socket_transport(self, address: str) -> Transport:
        """The former name of :meth:`transport_for`."""
        return self.transport_for(address)

    def layer_for(self, role: str) -> StreamLayer:
        """The layer with ``role`` (``"tls"``): a third party's wins over the built-in one.

        ``LookupError`` if none is loaded, or if two third-party layers claim the role.
        """
        layers = [
            r
            for r in self.transports.values()
            if r.error is None and isinstance(r.plugin, StreamLayer) and r.plugin.role == role
        ]
        if not layers:
            broken = [f"{n} ({r.error})" for n, r in self.transports.items() if r.error is not None]
            raise LookupError(
                f"no transport layer has the role {role!r}"
                + (f"; failed to load: {', '.join(broken)}" if broken else "")
            )
        plugin: StreamLayer = _pick(layers, f"the layer role {role!r}").plugin
        return plugin

    def layer(self, name: str) -> StreamLayer:
        """The layer registered as ``name`` (the runtime looks layers up by role instead)."""
        reg = self.transports.get(name)
        if reg is None or reg.error is not None or not isinstance(reg.plugin, StreamLayer):
            why = reg.error if reg is not None and reg.error else "not registered"
            raise LookupError(f"transport layer {name!r} is unavailable: {why}")
        return reg.plugin

    def loaded_protocols(self) -> dict[str, type[ProtocolPlugin]]:
        return {n: _class_of(r.plugin) for n, r in self.protocols.items() if r.error is None}


def _instantiated(reg: Registered) -> Registered:
    """A transport registration holding a class, made to hold one instance of it."""
    if reg.error is not None or not isinstance(reg.plugin, type):
        return reg
    try:
        return dataclasses.replace(reg, plugin=reg.plugin())
    except Exception as e:
        return dataclasses.replace(reg, plugin=None, error=f"{type(e).__name__}: {e}")


def _pick(claimants: list[Registered], what: str) -> Registered:
    """One of several registrations claiming ``what``: the single third-party one, if any."""
    third_party = [r for r in claimants if r.distribution != BUILTIN_DISTRIBUTION]
    if len(third_party) > 1:
        names = " and ".join(f"{r.name!r} ({r.distribution} {r.version})" for r in third_party[:2])
        raise LookupError(f"{what} is claimed by both {names}; uninstall one of them")
    return (third_party or claimants)[0]


def _class_of(plugin: Any) -> type[ProtocolPlugin]:
    return plugin if isinstance(plugin, type) else type(plugin)


@functools.cache
def default_registry() -> Registry:
    """The registry of installed entry points, discovered once per process."""
    return Registry.discover()
