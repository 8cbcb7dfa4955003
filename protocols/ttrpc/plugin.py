"""ttrpc as a gateway protocol: the messaging service, a transparent proxy, and a client role.

Listener (``protocol = "ttrpc"``): serves ``interchange.v1.Messaging``
(:mod:`.messaging`: publish, subscribe, consume and call on the hub) and
relays the calls of the services its ``[[listeners.services]]`` routes name
to ttrpc upstreams (:mod:`.proxy`), through pools of connections shared by
the whole gateway. On a unix socket it may admit only some users or groups
(``allowed_uids`` / ``allowed_gids``, checked with ``SO_PEERCRED``).

Upstream: the place those routes lead; and, with ``service`` and ``method``
set, a client role calling that method with each message routed to
``upstream:NAME`` (:mod:`.upstream`).
"""

from __future__ import annotations

import grp
import pwd
from collections.abc import Sequence
from typing import Any

from gateway.sdk import (
    REQUIRED,
    Option,
    PluginEnv,
    PluginError,
    ProtocolPlugin,
    ServerConnection,
    UpstreamContext,
    peer_credentials,
)

from .messaging import messaging_service
from .proxy import MAX_BACKLOG, Pool, ProxySession, Route, Routes
from .server import MAX_CALLS, Service
from .upstream import run_upstream

__all__ = ["TtrpcPlugin"]


def _ids(names: Sequence[str], lookup: Any, what: str) -> frozenset[int]:
    """Numeric ids of ``names`` (numbers, or names looked up in the system's database)."""
    ids = set()
    for name in names:
        if name.isdigit():
            ids.add(int(name))
            continue
        try:
            ids.add(lookup(name))
        except KeyError:
            raise ValueError(f"no {what} named {name!r} on this system") from None
    return frozenset(ids)


def _uids(names: Sequence[str]) -> frozenset[int]:
    return _ids(names, lambda n: pwd.getpwnam(n).pw_uid, "user")


def _gids(names: Sequence[str]) -> frozenset[int]:
    return _ids(names, lambda n: grp.getgrnam(n).gr_gid, "group")


def _methods(names: Sequence[str]) -> None:
    """Each of ``client_streaming`` is a full method name, ``service/method``."""
    for name in names:
        service, slash, method = name.partition("/")
        if not service or not slash or not method or "/" in method:
            raise ValueError(
                f"{name!r} is not a full method name, service/method"
                " (e.g. containerd.services.streaming.v1.Streaming/Stream)"
            )


class TtrpcPlugin(ProtocolPlugin):
    """ttrpc (containerd's RPC): the messaging service, a proxy by service name, a client."""

    name = "ttrpc"
    roles = frozenset({"server", "client"})
    default_port = 7071
    summary = "ttrpc: interchange.v1.Messaging, and a transparent proxy by service name"
    listener_options = {
        "messaging": Option("bool", True, "serve interchange.v1.Messaging on this listener"),
        "services": Option(
            "tables",
            [],
            "routes: calls of services matching `match` (a glob) go to `upstream`",
            fields={
                "match": Option("str", REQUIRED, "service names, e.g. containerd.task.v2.*"),
                "upstream": Option("upstream", REQUIRED, "the ttrpc upstream to relay them to"),
            },
        ),
        "max_calls": Option("int", MAX_CALLS, "calls one connection may have open at once", 1),
        "max_backlog": Option(
            "size", MAX_BACKLOG, "bytes relayed to a client and unread before it is closed", 1
        ),
        "allowed_uids": Option(
            "str_list", [], "unix sockets: users (names or uids) admitted", check=_uids
        ),
        "allowed_gids": Option(
            "str_list", [], "unix sockets: groups (names or gids) admitted", check=_gids
        ),
    }
    upstream_options = {
        "max_connections": Option("int", 4, "connections the proxy opens to it at most", 1),
        "streams_per_connection": Option(
            "int", 256, "active calls on each connection before another is opened", 1
        ),
        "client_streaming": Option(
            "str_list",
            [],
            "methods (service/method) taking the client's messages (client-streaming, bidi);"
            " the proxy relays no client Data for any other",
            check=_methods,
        ),
        "service": Option("str", "", "client role: the service to call with each message"),
        "method": Option("str", "", "client role: the method to call with each message"),
        "timeout": Option("duration", 30.0, "client role: deadline of each call", 0.001),
        "max_inflight": Option("int", 64, "client role: calls in flight at once", 1),
    }

    def __init__(self) -> None:
        self._pools: dict[str, Pool] = {}
        self._routes: dict[str, Routes] = {}
        self._admitted: dict[str, tuple[frozenset[int], frozenset[int]]] = {}

    async def setup(self, env: PluginEnv) -> None:
        for listener in env.listeners:
            o = listener.options
            routes = []
            for entry in o["services"]:
                name = entry["upstream"]
                if name not in self._pools:
                    upstream = env.upstreams[name]
                    self._pools[name] = Pool(
                        upstream,
                        env.nursery,
                        max_connections=upstream.options["max_connections"],
                        streams_per_connection=upstream.options["streams_per_connection"],
                        client_streaming=upstream.options["client_streaming"],
                    )
                routes.append(Route(entry["match"], name))
            self._routes[listener.name] = Routes(routes, self._pools)
            uids, gids = _uids(o["allowed_uids"]), _gids(o["allowed_gids"])
            if (uids or gids) and not listener.bind.startswith("unix:"):
                raise PluginError(
                    f"listener {listener.name!r}: allowed_uids/allowed_gids need a unix: bind"
                    f" (the peer's credentials come from SO_PEERCRED), not {listener.bind!r}"
                )
            self._admitted[listener.name] = (uids, gids)

    async def teardown(self) -> None:
        for pool in self._pools.values():
            await pool.aclose()

    def _admits(self, conn: ServerConnection) -> bool:
        uids, gids = self._admitted.get(conn.listener.name, (frozenset(), frozenset()))
        if not uids and not gids:
            return True
        creds = peer_credentials(conn.stream)
        if creds is not None and (creds.uid in uids or creds.gid in gids):
            return True
        who = "unknown" if creds is None else f"uid {creds.uid} gid {creds.gid} pid {creds.pid}"
        conn.log.warning("refused: the peer (%s) is not among the allowed users/groups", who)
        return False

    async def serve(self, conn: ServerConnection) -> None:
        if not self._admits(conn):
            return
        o = conn.options
        services: dict[str, Service] = {}
        if o["messaging"]:
            service = messaging_service(
                conn.hub, conn.source, destination=conn.listener.destination, shutdown=conn.shutdown
            )
            services[service.name] = service
        session = ProxySession(
            conn.stream,
            services,
            self._routes[conn.listener.name],
            max_backlog=o["max_backlog"],
            max_calls=o["max_calls"],
            log=conn.log,
            shutdown=conn.shutdown,
        )
        await session.serve()

    async def run_upstream(self, ctx: UpstreamContext) -> None:
        await run_upstream(ctx, self._pools.get(ctx.name))
