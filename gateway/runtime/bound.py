"""The listening sockets of ``gateway run --workers N``, bound once by the supervisor.

By default every worker serves the same listening sockets, so that the kernel
hands each new connection to whichever worker accepts first. The supervisor
binds them before it starts any worker (:func:`bind_listeners`), with each
transport's own ``listen`` so that a wildcard or port 0 gives the sockets a
single gateway would have, and takes them out of the trio listeners as plain
sockets whose descriptors it passes down (:mod:`gateway.runtime.supervisor`).

With ``[gateway] reuse_port``, a listener whose sockets are all TCP (IPv4 or
IPv6: ``tcp``, TLS over it, ``ws``) gets one set of sockets per worker
instead, all on the same addresses with ``SO_REUSEPORT``, and the kernel
hashes each new connection to one of them. The addresses are the ones the
transport's ``listen`` resolved to (its host, a wildcard's families, port 0
made one port), read from its sockets, which are then closed: Linux adds a
socket to a ``SO_REUSEPORT`` group only if every socket of the group had the
option set before its bind (``socket(7)``), so the transport's own socket,
bound without it, cannot be one of them. The group is then bound
(:func:`_bind_group`): ``SO_REUSEADDR`` and ``SO_REUSEPORT`` (and
``IPV6_V6ONLY`` as the transport had it) set before each bind, and the
listen backlog trio's listeners use.

This choice keeps every transport's resolution of its addresses (the
supervisor parses none), at the price of one gap between closing the
transport's sockets and binding the group, in which another process could
take the port. It cannot go unnoticed: a bind then fails with
``EADDRINUSE``, the sockets bound so far are closed, and the listener is
bound again from the transport's ``listen`` (port 0 gets a new port), up to
:data:`GROUP_ATTEMPTS` times; a fixed port that stays taken fails the start
as it would for one gateway. Either every worker has its socket on the
address, or the listener is not bound.
"""

from __future__ import annotations

import errno
import os
import socket
from collections.abc import Container

import trio

from gateway.config.loader import Config
from gateway.protocol.plugin import ListenerSettings
from gateway.runtime.registry import Registry

__all__ = ["GROUP_ATTEMPTS", "bind_listeners", "describe_address"]

#: Times a listener's per-worker sockets are bound afresh when their port was taken.
GROUP_ATTEMPTS = 3
#: The listen backlog of a per-worker socket: trio's listeners' (the kernel caps it
#: at ``net.core.somaxconn``).
BACKLOG = 0xFFFF
#: The families that get a socket per worker with ``reuse_port``.
_INET = (socket.AF_INET, socket.AF_INET6)


async def bind_listeners(
    config: Config, registry: Registry, workers: int = 1, shared: Container[str] = ()
) -> dict[str, list[list[socket.socket]]]:
    """Bind every listener of ``config``: its name → its sets of listening sockets.

    One set, which every worker serves; or, with ``reuse_port`` and more than
    one worker, ``workers`` sets, worker ``i`` serving set ``i``, for each
    listener that is not in ``shared`` and whose sockets are all TCP.
    """
    per_worker = workers if config.gateway.reuse_port and workers > 1 else 1
    bound: dict[str, list[list[socket.socket]]] = {}
    try:
        for ls in config.listeners:
            sets = 1 if ls.name in shared else per_worker
            bound[ls.name] = await _bind_listener(ls, registry, sets)
    except BaseException:
        for sets_of in bound.values():
            _close(sets_of)
        raise
    return bound


async def _bind_listener(
    ls: ListenerSettings, registry: Registry, sets: int
) -> list[list[socket.socket]]:
    """``ls``'s sets of sockets: the transport's (``sets`` is 1, or they are not all
    TCP), else ``sets`` groups on the transport's addresses."""
    for attempt in range(GROUP_ATTEMPTS):
        sockets = await _listen(ls, registry)
        if sets == 1 or not all(s.family in _INET for s in sockets):
            return [sockets]
        addresses = [_address_of(s) for s in sockets]
        for sock in sockets:
            sock.close()
        try:
            return _bind_group(addresses, sets)
        except OSError as e:
            if e.errno != errno.EADDRINUSE or attempt == GROUP_ATTEMPTS - 1:
                raise OSError(
                    e.errno,
                    f"listener {ls.name!r} cannot bind {ls.bind} (reuse_port): {e.strerror or e}",
                ) from None
    raise AssertionError("unreachable")


async def _listen(ls: ListenerSettings, registry: Registry) -> list[socket.socket]:
    """``ls`` bound by its transport: its listening sockets, as plain sockets."""
    try:
        listeners = await registry.transport_for(ls.bind).listen(ls.bind)
    except OSError as e:
        raise OSError(
            e.errno, f"listener {ls.name!r} cannot bind {ls.bind}: {e.strerror or e}"
        ) from None
    return [_take_socket(sl) for sl in listeners]


#: A socket's family, address and ``IPV6_V6ONLY`` (None: IPv4).
_Address = tuple[int, tuple[object, ...], int | None]


def _address_of(sock: socket.socket) -> _Address:
    v6only = None
    if sock.family == socket.AF_INET6:
        v6only = sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)
    return sock.family, tuple(sock.getsockname()), v6only


def _bind_group(addresses: list[_Address], sets: int) -> list[list[socket.socket]]:
    """``sets`` sets of listening sockets, one socket on each of ``addresses`` in each,
    with ``SO_REUSEPORT`` (all closed again if one cannot bind)."""
    groups: list[list[socket.socket]] = []
    try:
        for _ in range(sets):
            group: list[socket.socket] = []
            groups.append(group)
            for family, address, v6only in addresses:
                group.append(_reuse_port_socket(family, address, v6only))
    except BaseException:
        _close(groups)
        raise
    return groups


def _reuse_port_socket(
    family: int, address: tuple[object, ...], v6only: int | None
) -> socket.socket:
    """A TCP socket listening on ``address`` with ``SO_REUSEADDR`` and ``SO_REUSEPORT``,
    both set before the bind (as Linux requires of every socket of the group)."""
    reuse_port = getattr(socket, "SO_REUSEPORT", None)
    if reuse_port is None:
        raise OSError(errno.ENOPROTOOPT, "SO_REUSEPORT is not available on this platform")
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, reuse_port, 1)
        if v6only is not None:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, v6only)
        sock.bind(address)
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def _close(sets: list[list[socket.socket]]) -> None:
    for sockets in sets:
        for sock in sockets:
            sock.close()


def _take_socket(listener: trio.abc.Listener[trio.abc.Stream]) -> socket.socket:
    """The listening socket under ``listener`` as a plain socket (the listener is left
    without it). Looks through wrappers that keep theirs as ``inner`` (``ws``)."""
    wrapped: object = listener
    for _ in range(4):
        sock = getattr(wrapped, "socket", None)
        if sock is not None:
            return socket.socket(fileno=sock.detach())
        wrapped = getattr(wrapped, "inner", None)
        if wrapped is None:
            break
    raise TypeError("the transport's listener has no socket to hand to workers")


def describe_address(sock: socket.socket) -> str:
    """``127.0.0.1:5044``, ``[::1]:5044`` or ``unix:/path``, for the log."""
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return "unix:" + (os.fsdecode(name) if isinstance(name, bytes) else str(name))
    host = f"[{name[0]}]" if sock.family == socket.AF_INET6 else name[0]
    return f"{host}:{name[1]}"
