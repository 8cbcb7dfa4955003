"""A listener: bind its address, accept, admit or refuse, run each connection.

Each listener has its own task and two nurseries: one of accept loops (one
per socket the transport bound), one of connections. Stopping accepting
(the drain, a reload that removes the listener) cancels only the first:
connections go on until they finish or the listener's task is cancelled.

Admission is decided synchronously in the accept loop: over
``max_connections``, or over ``max_connections_per_address`` for the peer's
IP address, a connection is closed at once, counted and logged
(rate-limited). Handshakes never run in the accept loop: they are the
connection's own (:class:`~gateway.runtime.connection.Connection`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence

import trio

from gateway.core.facade import HubFacade
from gateway.ops.loglines import Throttled
from gateway.protocol.plugin import ListenerSettings, ProtocolPlugin
from gateway.runtime.accept import accept_forever
from gateway.runtime.connection import Connection
from gateway.runtime.registry import Registry
from gateway.runtime.state import ListenerState, Shared

__all__ = ["adopt_sockets", "serve_listener"]

#: Sockets a supervisor bound, by listener name: the bind they are for and the
#: sockets (see :func:`adopt_sockets`).
_INHERITED: dict[str, tuple[str, list[socket.socket]]] = {}


def adopt_sockets(name: str, bind: str, sockets: list[socket.socket]) -> None:
    """Serve listener ``name`` on ``sockets`` (bound for ``bind``) instead of binding.

    A worker of ``gateway run --workers N`` calls it before its gateway starts.
    Each start of the listener (a reload restarts it) gets duplicates of the
    sockets, so that closing one listener never closes what the next one
    serves; a reload that changes the listener's ``bind`` binds as usual.
    """
    _INHERITED[name] = (bind, list(sockets))


def listener_state(
    ls: ListenerSettings, plugin: ProtocolPlugin, registry: Registry, shared: Shared
) -> ListenerState:
    """A listener's state before it binds: its transport, TLS, log throttle and facade."""
    metrics = shared.metrics
    tls_layer = registry.layer_for("tls") if ls.tls else None
    return ListenerState(
        settings=ls,
        plugin=plugin,
        transport=registry.transport_for(ls.bind),
        tls_context=tls_layer.server_context(ls.tls) if tls_layer and ls.tls else None,
        tls_layer=tls_layer,
        throttle=Throttled(
            logging.getLogger(f"gateway.protocol.{ls.protocol}"),
            suppressed=metrics.log_lines_suppressed,
        ),
        facade=HubFacade(
            shared.hub,
            received=metrics.messages_received.labels(listener=ls.name),
            sent=metrics.messages_sent.labels(listener=ls.name),
        ),
    )


async def serve_listener(
    ls: ListenerSettings,
    plugin: ProtocolPlugin,
    registry: Registry,
    shared: Shared,
    table: dict[str, ListenerState],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``ls`` and serve it until cancelled; started once bound.

    The listener's state is entered in ``table`` (the gateway's listeners by
    name) once bound, and taken out when it ends if a reload removed it.
    """
    state = listener_state(ls, plugin, registry, shared)
    try:
        listeners = await _open(state, ls)
    except OSError as e:
        raise OSError(e.errno, f"listener {ls.name!r} cannot bind {ls.bind}: {e.strerror or e}")
    state.addresses = [state.transport.listener_name(sl) for sl in listeners]
    table[ls.name] = state
    _count_from_zero(shared, ls.name)
    try:
        with state.scope:
            async with trio.open_nursery() as connections:
                with state.accept_scope:
                    async with trio.open_nursery() as accepting:
                        for sl in listeners:
                            accepting.start_soon(_accept_loop, state, shared, sl, connections)
                        task_status.started()
                # Accepting stopped; connections go on until cancelled.
                for sl in listeners:
                    await trio.aclose_forcefully(sl)
                state.closed.set()
    finally:
        for sl in listeners:
            await trio.aclose_forcefully(sl)
        state.closed.set()
        if state.removed and table.get(ls.name) is state:
            del table[ls.name]


async def _open(
    state: ListenerState, ls: ListenerSettings
) -> Sequence[trio.abc.Listener[trio.abc.Stream]]:
    """The listener's sockets: adopted if a supervisor bound them, else bound now."""
    inherited = _INHERITED.get(ls.name)
    if inherited is not None and inherited[0] == ls.bind:
        return await state.transport.adopt(ls.bind, [s.dup() for s in inherited[1]])
    return await state.transport.listen(ls.bind)


def _count_from_zero(shared: Shared, name: str) -> None:
    """Every series of the listener from 0, before any connection."""
    metrics = shared.metrics
    for family in (
        metrics.connections,
        metrics.connections_open,
        metrics.connection_errors,
        metrics.bytes_received,
        metrics.bytes_sent,
        metrics.abandoned_publishes,
        metrics.messages_received,
        metrics.messages_sent,
    ):
        family.labels(listener=name)


async def _accept_loop(
    state: ListenerState,
    shared: Shared,
    listener: trio.abc.Listener[trio.abc.Stream],
    nursery: trio.Nursery,
) -> None:
    """Accept on one socket: admit each stream as a :class:`Connection`, or refuse it."""
    ls = state.settings

    def handle(stream: trio.abc.Stream) -> None:
        host = _peer_host(stream) if ls.max_connections_per_address else None
        refusal = state.admit(host)
        if refusal is not None:
            _refuse(state, shared, stream, refusal)
            nursery.start_soon(trio.aclose_forcefully, stream)
            return
        nursery.start_soon(Connection(state, shared, stream, host).run)

    await accept_forever(
        listener,
        handle,
        name=ls.name,
        log=state.throttle,
        errors=shared.metrics.accept_errors,
    )


def _refuse(state: ListenerState, shared: Shared, stream: trio.abc.Stream, reason: str) -> None:
    """Count and log a connection a limit refuses (its stream is closed by the caller)."""
    ls = state.settings
    limit = ls.max_connections if reason == "max_connections" else ls.max_connections_per_address
    peer = state.transport.peer_name(stream)
    shared.metrics.refused_connections.labels(listener=ls.name, reason=reason).inc()
    state.throttle.warning(
        f"{ls.name}:{reason}",
        "listener %s: %d connections (%s); refusing %s",
        ls.name,
        limit,
        reason,
        peer,
    )
    state.throttle.logger.debug(
        "[%s %s] connection refused: %s",
        ls.name,
        peer,
        reason.replace("_", " "),
        extra={"listener": ls.name, "close_reason": reason.replace("_", " ")},
    )


def _peer_host(stream: trio.abc.Stream) -> str | None:
    """The peer's IP address, for per-address limits (None: not an IP connection)."""
    sock = getattr(stream, "socket", None)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None
    try:
        return str(sock.getpeername()[0])
    except OSError:
        return None
