"""The gateway's own HTTP endpoints, bound and served: ``[metrics]`` and ``[admin]``.

Both are plain HTTP (:mod:`gateway.ops.http_server`). What they show they
reach through narrow interfaces, never the runtime's objects: the metrics
registry, and for the admin API an :class:`~gateway.ops.admin.Admin` (a
view to take snapshots of, a reload to ask for, taps to open).

In a worker of ``gateway run --workers N`` neither is bound: each answers
the supervisor on its control channel (:mod:`gateway.ops.control`), and the
supervisor serves both for the whole gateway.
"""

from __future__ import annotations

import logging
from typing import cast

import trio

from gateway.ops.admin import Admin, serve_admin
from gateway.ops.control import admin_answers, metrics_answers, serve_channel
from gateway.ops.metrics import Metrics
from gateway.ops.metrics_http import serve_metrics
from gateway.runtime.registry import Registry
from gateway.runtime.worker import take_channel

__all__ = ["serve_admin_endpoint", "serve_metrics_endpoint"]

log = logging.getLogger("gateway.runtime")


async def listen_plain(
    registry: Registry, bind: str, what: str
) -> tuple[list[trio.SocketListener], list[str]]:
    """Bind an HTTP endpoint (``what``: metrics, admin): its listeners and their names."""
    transport = registry.transport_for(bind)
    if transport.handshakes:
        # Plain HTTP: the transport's handshake would never run.
        raise OSError(
            f"{what} cannot bind {bind}: the {transport.name} transport has a handshake "
            f"of its own, and the {what} endpoint is plain HTTP (use host:port or unix:)"
        )
    try:
        listeners = await transport.listen(bind)
    except OSError as e:
        raise OSError(e.errno, f"{what} cannot bind {bind}: {e.strerror or e}") from None
    # The endpoints only accept and read bytes: any listener of a plain transport does.
    plain = cast("list[trio.SocketListener]", list(listeners))
    return plain, [transport.listener_name(sl) for sl in listeners]


async def serve_admin_endpoint(
    registry: Registry,
    bind: str,
    admin: Admin,
    metrics: Metrics,
    *,
    max_connections: int,
    idle_timeout: float,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``[admin] bind`` and serve the admin API; started with the bound addresses
    (none in a worker, which answers its supervisor instead)."""
    channel = take_channel("admin")
    if channel is not None:
        task_status.started([])
        await serve_channel(channel, admin_answers(admin))
        return
    listeners, addresses = await listen_plain(registry, bind, "admin")
    log.info("admin: status page and /api/status on %s", " ".join(addresses))
    task_status.started(addresses)
    await serve_admin(
        admin,
        listeners,
        metrics=metrics,
        max_connections=max_connections,
        idle_timeout=idle_timeout,
    )


async def serve_metrics_endpoint(
    registry: Registry,
    bind: str,
    metrics: Metrics,
    *,
    max_connections: int,
    idle_timeout: float,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Bind ``[metrics] bind`` and serve ``GET /metrics``; started with the bound addresses
    (none in a worker, which answers its supervisor instead)."""
    channel = take_channel("metrics")
    if channel is not None:
        task_status.started([])
        await serve_channel(channel, metrics_answers(metrics))
        return
    listeners, addresses = await listen_plain(registry, bind, "metrics")
    log.info("metrics: GET /metrics on %s", " ".join(addresses))
    task_status.started(addresses)
    await serve_metrics(
        metrics, listeners, max_connections=max_connections, idle_timeout=idle_timeout
    )
