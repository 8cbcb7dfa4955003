"""Reactive streams over the network as a gateway protocol, in both roles.

Listener (``protocol = "reactive"``): a peer subscribes with a publisher
string (:mod:`.publisher_names`) naming a destination the listener exposes
and gets its messages as elements, never more than it requested; the
listener's ``subscriptions`` subscribe to each peer's publishers and publish
what they send. Upstream: the gateway connects out, subscribes to the peer's
publishers, and publishes what is routed to ``upstream:NAME`` to the peer
(:mod:`.client`).
"""

from __future__ import annotations

from typing import Any

import trio

from gateway.sdk import (
    REQUIRED,
    ConnectionInfo,
    Option,
    ProtocolPlugin,
    ServerConnection,
    UpstreamContext,
)

from .client import UpstreamSession
from .incoming import DEFAULT_DEMAND, RemoteSubscription
from .messages import MAX_DEMAND
from .metrics import peer_metrics
from .server import ReactiveSession

__all__ = ["ReactivePlugin"]


def _globs(patterns: list[str]) -> None:
    if any(not p for p in patterns):
        raise ValueError("a publisher glob must not be empty")


def _subscriptions_option(default_into: str) -> Option:
    return Option(
        "tables",
        [],
        "the peer's publishers to subscribe to, published locally",
        fields={
            "publisher": Option("str", REQUIRED, "the publisher's name on the peer"),
            "destination": Option("str", "", f"local destination (default: {default_into})"),
            "demand": Option(
                "int", DEFAULT_DEMAND, "elements requested and not yet safe here", 1, MAX_DEMAND
            ),
        },
    )


def subscriptions_of(tables: list[dict[str, Any]], into: str) -> list[RemoteSubscription]:
    """The ``subscriptions`` tables as subscriptions (``destination`` defaults to ``into``)."""
    return [
        RemoteSubscription(t["publisher"], t["destination"] or into, t["demand"]) for t in tables
    ]


_COMMON = {
    "part_size": Option(
        "size", 64 * 1024, "elements larger than this are sent in parts", 1024, 16 * 1024**2
    ),
    "handshake_timeout": Option("duration", 10.0, "time for the peer's hello to arrive", 0.001),
    "keepalive": Option(
        "duration", 30.0, "ping a peer silent for this long (0: never; needs the extension)", 0.0
    ),
    "keepalive_timeout": Option(
        "duration", 10.0, "close the connection when nothing answers a ping within this", 0.001
    ),
}


class ReactivePlugin(ProtocolPlugin):
    """Reactive streams (MessagePack framing): destinations as publishers, with demand."""

    name = "reactive"
    roles = frozenset({"server", "client"})
    default_port = 7073
    summary = "Reactive streams over the network: destinations as publishers, with demand"
    listener_options = {
        "publishers": Option(
            "str_list",
            [],
            "destinations peers may subscribe to: shell-style globs (default: none)",
            check=_globs,
        ),
        "ack": Option(
            "str",
            "written",
            "when a delivery is acked to the hub: once written (at most once) or once the"
            " peer's demand passes it (at least once)",
            choices=("written", "demand"),
        ),
        "max_unacked": Option(
            "int", 1024, "deliveries of one subscription not yet acked to the hub", 1
        ),
        "subscriptions": _subscriptions_option("the listener's destination"),
        **_COMMON,
    }
    upstream_options = {
        "publisher": Option(
            "str",
            "",
            "the name the peer subscribes to for what routes send here"
            " (default: the upstream's name)",
        ),
        "max_unacked": Option(
            "int", 1024, "deliveries sent to the peer and not yet passed by its demand", 1
        ),
        "subscriptions": _subscriptions_option("the upstream's destination"),
        **_COMMON,
    }

    @classmethod
    def default_listener(cls) -> dict[str, Any]:
        # Like every default listener it publishes into "logs" (what a peer offers as
        # the publisher "logs"), and peers may subscribe to "logs" and "alerts".
        return {
            "destination": "logs",
            "publishers": ["logs", "alerts"],
            "subscriptions": [{"publisher": "logs"}],
        }

    @classmethod
    def upstream_receives(cls, options: dict[str, Any]) -> str | None:
        return "subscriptions" if options.get("subscriptions") else None

    async def serve(self, conn: ServerConnection) -> None:
        o = conn.options
        await ReactiveSession(
            conn,
            publishers=tuple(o["publishers"]),
            subscriptions=subscriptions_of(o["subscriptions"], conn.listener.destination),
            ack_on_demand=o["ack"] == "demand",
            part_size=o["part_size"],
            max_unacked=o["max_unacked"],
            handshake_timeout=o["handshake_timeout"],
            keepalive=o["keepalive"],
            keepalive_timeout=o["keepalive_timeout"],
            metrics=peer_metrics(conn.metrics, "listener", conn.listener.name),
        ).serve()

    async def run_upstream(self, ctx: UpstreamContext) -> None:
        o = ctx.options
        subscriptions = subscriptions_of(o["subscriptions"], ctx.ingress)
        publisher = o["publisher"] or ctx.name
        metrics = peer_metrics(ctx.metrics, "upstream", ctx.name)

        async def session(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
            await UpstreamSession(
                stream,
                ctx.hub,
                lambda: ctx.source(info),
                publisher=publisher,
                egress=lambda: ctx.subscribe(max_unacked=o["max_unacked"]),
                subscriptions=subscriptions,
                part_size=o["part_size"],
                handshake_timeout=o["handshake_timeout"],
                keepalive=o["keepalive"],
                keepalive_timeout=o["keepalive_timeout"],
                metrics=metrics,
                log=ctx.log,
            ).run()

        await ctx.run_sessions(session)
