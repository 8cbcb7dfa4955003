"""Segment append (Pravega's segment-store wire protocol) as a gateway protocol, in both roles.

Listener: a segment store over the gateway's embedded store. Appends are
acked with ``DataAppended`` only once durable under ``[store] fsync``
(an ack always means "durably stored"); segments named ``<destination>/<partition>`` are the durable
destinations' own, so their subscribers see the events as messages. Upstream:
a writer appending what is routed to ``upstream:NAME`` to a remote segment,
exactly once while the gateway runs.
"""

from __future__ import annotations

import uuid
from typing import Any

from gateway.sdk import (
    REQUIRED,
    Metrics,
    Option,
    PluginEnv,
    PluginError,
    ProtocolPlugin,
    ServerConnection,
    Store,
    UpstreamContext,
)

from .codec import Limits
from .events import MAX_EVENT_PAYLOAD, MAX_WIRECOMMAND_SIZE
from .server import ServerMetrics, ServerSession, ServerSettings
from .upstream import run_upstream

__all__ = ["SegmentPlugin"]

_DEFAULTS = ServerSettings()
#: The largest read reply that fits in a command with the longest segment name.
_MAX_READ = MAX_WIRECOMMAND_SIZE - 65535 - 32


def _uuid_or_empty(value: str) -> None:
    if value:
        try:
            uuid.UUID(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a UUID") from None


class SegmentPlugin(ProtocolPlugin):
    """Pravega segment append: durable appends acked once safe, reads from any offset."""

    name = "segment"
    roles = frozenset({"server", "client"})
    default_port = 12345
    summary = "segment append (Pravega segment store): appends acked once durable"
    needs_store = True
    listener_options = {
        "auto_create": Option(
            "bool", True, "create a segment a SetupAppend names (else: NoSuchSegment)"
        ),
        "max_segments": Option(
            "int",
            _DEFAULTS.max_segments,
            "segments the store may hold (all count) for auto_create to make another;"
            " beyond it: NoSuchSegment",
            0,
        ),
        "retain": Option(
            "size",
            _DEFAULTS.retain_bytes,
            "bytes each segment this listener creates keeps (oldest chunk files go)",
            1024,
        ),
        "retain_age": Option(
            "duration",
            0.0,
            "the longest each segment this listener creates keeps data (0: [store] retain_age)",
            0,
        ),
        "max_outstanding_bytes": Option(
            "size",
            _DEFAULTS.max_outstanding_bytes,
            "bytes appended and not yet acked before reading pauses",
            1,
        ),
        "max_read_bytes": Option(
            "size", _DEFAULTS.max_read_bytes, "bytes one SegmentRead returns at most", 1, _MAX_READ
        ),
        "read_wait": Option(
            "duration", _DEFAULTS.read_wait, "how long a read at the tail waits for data", 0
        ),
        "max_writers": Option("int", Limits().max_writers, "writers one connection may set up", 1),
        "command_timeout": Option(
            "duration",
            _DEFAULTS.unit_timeout,
            "time for the rest of a started command or block to arrive (0: none)",
        ),
    }
    upstream_options = {
        "segment": Option("str", REQUIRED, "the remote segment to append to"),
        "writer_id": Option(
            "str",
            "",
            "writer id (UUID; default: derived from the upstream's name)",
            check=_uuid_or_empty,
        ),
        "payload": Option(
            "str",
            "body",
            "what each event holds: the message body, or the stored envelope",
            choices=("body", "envelope"),
        ),
        "max_unacked": Option("int", 1000, "events sent and not yet acknowledged", 1),
        "block_size": Option(
            "size",
            256 * 1024,
            "bytes per batched append block (0: unbatched)",
            0,
            MAX_EVENT_PAYLOAD,
        ),
        "timeout": Option(
            "duration", 30.0, "reconnect when the server does not answer for this long", 0.01
        ),
    }

    def __init__(self) -> None:
        self.store: Store | None = None

    @classmethod
    def default_listener(cls) -> dict[str, Any]:
        # Appends go to segments, not to a destination: name one that exists anyway.
        return {"destination": "logs"}

    async def setup(self, env: PluginEnv) -> None:
        if env.store is None and env.listeners:
            raise PluginError("segment listeners need the embedded store, which is not open")
        self.store = env.store

    async def serve(self, conn: ServerConnection) -> None:
        assert self.store is not None, "setup() gives the store first"
        o = conn.options
        settings = ServerSettings(
            limits=Limits(max_writers=o["max_writers"]),
            auto_create=o["auto_create"],
            max_segments=o["max_segments"],
            retain_bytes=o["retain"],
            retain_age=o["retain_age"] or None,
            max_outstanding_bytes=o["max_outstanding_bytes"],
            max_read_bytes=o["max_read_bytes"],
            read_wait=o["read_wait"],
            unit_timeout=o["command_timeout"],
        )
        session = ServerSession(
            conn.stream,
            self.store,
            settings,
            logger=conn.log,
            shutdown=conn.shutdown,
            metrics=server_metrics(conn.metrics, conn.listener.name),
        )
        await session.serve()

    async def run_upstream(self, ctx: UpstreamContext) -> None:
        await run_upstream(ctx)


def server_metrics(metrics: Metrics, listener: str) -> ServerMetrics:
    """The listener's counters in the gateway's metrics (created on first use)."""
    labels = ["listener"]
    return ServerMetrics(
        events=metrics.messages_received.labels(listener),
        appended_bytes=metrics.tally(
            "segment_appended_bytes", "Bytes of event frames appended to segments.", labels
        ).labels(listener),
        read_bytes=metrics.tally(
            "segment_read_bytes", "Bytes of segment data returned by reads.", labels
        ).labels(listener),
        protocol_errors=metrics.counter(
            "segment_protocol_errors",
            "Connections closed for breaking the protocol or timing out.",
            labels,
        ).labels(listener),
        damaged_reads=metrics.counter(
            "segment_damaged_reads",
            "Reads that started in a damaged record, answered SegmentIsTruncated past it.",
            labels,
        ).labels(listener),
        segments_refused=metrics.counter(
            "segment_creations_refused",
            "SetupAppends for a new segment refused: the store holds max_segments segments.",
            labels,
        ).labels(listener),
    )
