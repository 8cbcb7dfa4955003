"""Reactive streams over the network as a gateway listener (the publisher role).

A peer subscribes with a publisher string (:mod:`.publisher_names`) naming a
destination the listener exposes; the listener answers ``subscribed`` and
sends that destination's messages as elements, never more than the peer
requested. See :mod:`.server` for the session.
"""

from __future__ import annotations

from typing import Any

from gateway.sdk import Option, ProtocolPlugin, ServerConnection

from .server import ReactiveSession

__all__ = ["ReactivePlugin"]


def _globs(patterns: list[str]) -> None:
    if any(not p for p in patterns):
        raise ValueError("a publisher glob must not be empty")


class ReactivePlugin(ProtocolPlugin):
    """Reactive streams (MessagePack framing): the gateway publishes destinations."""

    name = "reactive"
    roles = frozenset({"server"})
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
        "part_size": Option(
            "size", 64 * 1024, "elements larger than this are sent in parts", 1024, 16 * 1024**2
        ),
        "max_unacked": Option(
            "int", 1024, "deliveries of one subscription not yet acked to the hub", 1
        ),
        "handshake_timeout": Option(
            "duration", 10.0, "time for the client's hello to arrive", 0.001
        ),
    }

    @classmethod
    def default_listener(cls) -> dict[str, Any]:
        return {"destination": "stream", "publishers": ["stream"]}

    async def serve(self, conn: ServerConnection) -> None:
        o = conn.options
        await ReactiveSession(
            conn,
            publishers=tuple(o["publishers"]),
            ack_on_demand=o["ack"] == "demand",
            part_size=o["part_size"],
            max_unacked=o["max_unacked"],
            handshake_timeout=o["handshake_timeout"],
        ).serve()
