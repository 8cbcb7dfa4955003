"""Micromessage2 as a gateway protocol, in both roles.

Listener (``protocol = "micromessage"``): clients publish MESSAGE frames
(acked in batches once safe) and subscribe with ``subscribe`` COMMAND
frames, filters included; the ack window binds each connection both ways.
Upstream: the gateway as a client of a Micromessage2 server, sending what
is routed to ``upstream:NAME`` and, with ``subscribe`` tables, feeding
local destinations from the server's.
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

from .client import ClientSession, subscriptions_of
from .codec import Limits, Settings
from .events import MAX_FRAGMENT, MAX_PAYLOAD
from .handshake import ExtensionSpec
from .server import ServerSession
from .windows import AckSettings, ack_spec

__all__ = ["MicromessagePlugin"]

#: The most MESSAGE frames unacked at once that sequence numbers allow.
MAX_WINDOW = 32767


def _names(names: list[str]) -> None:
    known = {"ack", "batch-ack", "json", "dotnet", "pubsub"}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown extensions {unknown} (known: {', '.join(sorted(known))})")


def _limits(options: dict[str, Any]) -> Limits:
    return Limits(max_fragment=MAX_FRAGMENT, max_payload=options["max_payload"])


def server_settings(options: dict[str, Any]) -> Settings:
    """The listener's handshake offer: every extension we know, as optional, unless
    ``require`` lists it."""
    ack = AckSettings(options["max_window"], round(options["ack_expire"] * 1000))
    required = tuple(options["require"])

    def spec(name: str) -> ExtensionSpec:
        return ack_spec(name, ack) if name == "batch-ack" else ExtensionSpec(name)

    return Settings(
        identity=options["identity"],
        required=tuple(spec(n) for n in required),
        optional=tuple(spec(n) for n in ("batch-ack", "dotnet", "pubsub") if n not in required),
        ack=ack,
    )


def client_settings(options: dict[str, Any], subscribes: bool) -> Settings:
    """The upstream's offer: batch-ack required with the window it wants; pubsub when it
    subscribes; json and dotnet optional."""
    ack = AckSettings(options["window"], round(options["ack_expire"] * 1000))
    required = [ack_spec("batch-ack", ack)]
    if subscribes:
        required.append(ExtensionSpec("pubsub"))
    optional = (ExtensionSpec("dotnet"),)
    return Settings(
        identity=options["identity"], required=tuple(required), optional=optional, ack=ack
    )


_COMMON = {
    "identity": Option("str", "interchange", "the identity sent in the handshake"),
    "ack_expire": Option(
        "duration", 0.5, "MESSAGE frames not acked within this are sent again", 0.001, 3600.0
    ),
    "max_payload": Option(
        "size", MAX_PAYLOAD, "largest message payload (joined from CONTINUED fragments)", 1024
    ),
    "untyped_properties": Option(
        "bool", False, "take property values without an N/D/T type as text (SharpMessaging)"
    ),
    "handshake_timeout": Option("duration", 10.0, "time for the handshake to complete", 0.001),
}


class MicromessagePlugin(ProtocolPlugin):
    """Micromessage2: MESSAGE frames acked in windows, pub/sub with typed filters."""

    name = "micromessage"
    roles = frozenset({"server", "client"})
    default_port = 7072
    summary = "Micromessage2: messages in ack windows, topics and queues with filters"
    listener_options = {
        **_COMMON,
        "max_window": Option(
            "int", 1000, "largest ack window granted (MESSAGE frames unacked)", 1, MAX_WINDOW
        ),
        "require": Option(
            "str_list", [], "extensions a client must agree to (e.g. batch-ack)", check=_names
        ),
        "max_inflight": Option("int", 64, "batches published and not yet acked", 1),
    }
    upstream_options = {
        **_COMMON,
        "window": Option(
            "int", 100, "ack window asked for (MESSAGE frames unacked)", 1, MAX_WINDOW
        ),
        "destination": Option(
            "str", "", "publish under this destination instead of each message's own"
        ),
        "subscribe": Option(
            "tables",
            [],
            "remote destinations to subscribe to, published locally",
            fields={
                "destination": Option("str", REQUIRED, "the server's destination"),
                "into": Option("str", "", "local destination (default: the upstream's)"),
                "filter": Option("str", "", "filter expression, e.g. age>=N18;name<Tgauf"),
                "group": Option("str", "", "a named, resumable subscription"),
                "start": Option("str", "", "earliest, latest or an offset (log destinations)"),
            },
        ),
    }

    @classmethod
    def default_listener(cls) -> dict[str, Any]:
        return {"destination": "logs"}

    @classmethod
    def upstream_receives(cls, options: dict[str, Any]) -> str | None:
        return "subscribe" if options.get("subscribe") else None

    async def serve(self, conn: ServerConnection) -> None:
        o = conn.options
        session = ServerSession(
            conn,
            server_settings(o),
            _limits(o),
            untyped_as_text=o["untyped_properties"],
            handshake_timeout=o["handshake_timeout"],
            max_answers=o["max_inflight"],
        )
        await session.serve()

    async def run_upstream(self, ctx: UpstreamContext) -> None:
        o = ctx.options
        subscriptions = subscriptions_of(o["subscribe"], ctx.ingress)
        settings = client_settings(o, bool(subscriptions))

        async def session(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
            with ctx.subscribe(max_unacked=o["window"]) as egress:
                await ClientSession(
                    stream,
                    ctx.hub,
                    lambda: ctx.source(info),
                    settings=settings,
                    limits=_limits(o),
                    egress=egress,
                    rename=o["destination"],
                    subscriptions=subscriptions,
                    handshake_timeout=o["handshake_timeout"],
                    log=ctx.log,
                ).run()

        await ctx.run_sessions(session)
