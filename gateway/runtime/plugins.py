"""The gateway's protocol plugins: one instance of each it uses, set up and torn down.

Every plugin's ``setup`` runs, in name order, before any listener binds; a
plugin that fails to set up undoes those set up before it (in reverse order)
and the gateway does not start (:class:`~gateway.protocol.plugin.PluginError`).
``teardown`` runs in reverse order after the drain, each within
``drain_timeout``; a teardown that fails or times out is logged, and the
others still run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from gateway.protocol.plugin import PluginEnv, PluginError, ProtocolPlugin

__all__ = ["set_up", "tear_down"]

log = logging.getLogger("gateway.runtime")


async def set_up(
    plugins: dict[str, ProtocolPlugin], env: Callable[[str], PluginEnv], timeout: float
) -> list[str]:
    """Await every plugin's ``setup`` with ``env(name)``; the names set up, in order.

    On a failure, those already set up are torn down (``timeout`` each) and
    :class:`PluginError` says which plugin failed and how.
    """
    ready: list[str] = []
    for name, plugin in plugins.items():
        try:
            await plugin.setup(env(name))
        except Exception as e:
            with trio.CancelScope(shield=True):
                await tear_down(plugins, ready, timeout)
            raise PluginError(
                f"protocol plugin {name!r} failed to set up: {type(e).__name__}: {e}"
            ) from e
        ready.append(name)
    return ready


async def tear_down(plugins: dict[str, ProtocolPlugin], names: list[str], timeout: float) -> None:
    """Await ``teardown`` of ``names`` in reverse order; a failure is logged, not fatal."""
    for name in reversed(names):
        try:
            with trio.move_on_after(timeout) as scope:
                await plugins[name].teardown()
            if scope.cancelled_caught:
                log.error("protocol plugin %r: teardown timed out", name)
        except Exception:
            log.exception("protocol plugin %r: teardown failed", name)
