"""Letting work finish: the whole gateway at shutdown, one listener a reload removed.

At shutdown (:func:`drain`): every listener stops accepting; the gateway's
and every listener's ``draining`` event is set, after which protocols refuse
new publishes but keep reading acks; then the hub's unsettled receipts and
the open connections get ``drain_timeout`` to finish (a protocol sends its
last acks and closes by itself once nothing is pending). What is still
unsettled at the deadline is abandoned: its senders were never acked, so
they send it again.

A removed listener (:func:`retire`) has stopped accepting already; its
connections get ``drain_timeout`` to finish, then its task is cancelled.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import trio

from gateway.runtime.state import ListenerState, Shared

__all__ = ["drain", "retire"]

log = logging.getLogger("gateway.runtime")


async def drain(listeners: Collection[ListenerState], shared: Shared, deadline: float) -> int:
    """Stop taking work and wait for what is in flight; the publishes abandoned (0: none)."""
    log.info("shutting down: no new connections; draining in-flight work")
    for state in listeners:
        state.accept_scope.cancel()
    shared.draining.set()
    for state in listeners:
        state.draining.set()
    hub = shared.hub
    with trio.move_on_after(deadline):
        await hub.wait_idle()
        # Settled work still has to reach the senders: protocols send their
        # last acks and close by themselves once nothing is pending.
        while any(s.connections for s in listeners):
            await shared.connection_ended.park()
    abandoned = hub.inflight
    if not abandoned:
        still_open = sum(s.connections for s in listeners)
        log.info("drained; closing%s", f" {still_open} connections" * bool(still_open))
    else:
        log.warning(
            "%d publishes still unsettled after %gs; abandoning them, their senders get"
            " no ack (exit status 3)",
            abandoned,
            deadline,
        )
    for state in listeners:
        state.throttle.flush()
    return abandoned


async def retire(state: ListenerState, shared: Shared, deadline: float) -> None:
    """A removed listener's connections get ``deadline`` seconds to finish, then stop."""
    with trio.move_on_after(deadline):
        while state.connections:
            await shared.connection_ended.park()
    state.scope.cancel()
