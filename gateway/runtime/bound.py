"""The listening sockets of ``gateway run --workers N``, bound once by the supervisor.

Every worker serves the same listening sockets, so that the kernel hands each
new connection to whichever worker accepts first. The supervisor binds them
before it starts any worker (:func:`bind_listeners`), with each transport's
own ``listen`` so that a wildcard or port 0 gives the sockets a single gateway
would have, and takes them out of the trio listeners as plain sockets whose
descriptors it passes down (:mod:`gateway.runtime.supervisor`).
"""

from __future__ import annotations

import os
import socket

import trio

from gateway.config.loader import Config
from gateway.runtime.registry import Registry

__all__ = ["bind_listeners", "describe_address"]


async def bind_listeners(config: Config, registry: Registry) -> dict[str, list[socket.socket]]:
    """Bind every listener of ``config`` once: its name → its listening sockets.

    Each listener is bound by its transport's ``listen`` (so a wildcard or
    port 0 gives the same sockets a single gateway would have) and its
    sockets are taken out of the trio listeners as plain sockets.
    """
    bound: dict[str, list[socket.socket]] = {}
    try:
        for ls in config.listeners:
            try:
                listeners = await registry.transport_for(ls.bind).listen(ls.bind)
            except OSError as e:
                raise OSError(
                    e.errno, f"listener {ls.name!r} cannot bind {ls.bind}: {e.strerror or e}"
                ) from None
            bound[ls.name] = [_take_socket(sl) for sl in listeners]
    except BaseException:
        for sockets in bound.values():
            for sock in sockets:
                sock.close()
        raise
    return bound


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
