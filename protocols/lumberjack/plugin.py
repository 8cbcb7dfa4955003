"""Lumberjack v2 (and v1) as a gateway protocol, in both roles.

Listener: a Beats-compatible server. Each window becomes one hub publish; its
ack (the window's highest sequence) goes out only when the receipt settled as
delivered or durably stored; a window that cannot be handed off is never
acked, the connection is closed instead. Upstream: a Logstash-compatible client sending what
is routed to ``upstream:NAME`` as windows, acking the hub per covered event.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

import trio

from gateway.sdk import (
    ConnectionInfo,
    Metrics,
    Option,
    ProtocolPlugin,
    Receipt,
    ServerConnection,
    UpstreamContext,
)

from . import Limits, Window
from .client import ClientSettings, forward
from .mapping import beats_metadata, enrichment, to_messages
from .metrics import ClientMetrics, ServerMetrics
from .server import ServerSession, ServerSettings

__all__ = ["LumberjackPlugin"]

_DEFAULT_LIMITS = Limits()


class LumberjackPlugin(ProtocolPlugin):
    """Beats ⇄ Logstash: windows of JSON events, acked by highest sequence."""

    name = "lumberjack"
    roles = frozenset({"server", "client"})
    default_port = 5044
    summary = "Lumberjack v1/v2 (Beats, Logstash): windows acked once safe"
    listener_options = {
        "destination_field": Option(
            "str", "", "dotted event field naming the destination (e.g. fields.topic)"
        ),
        "validate_json": Option(
            "bool", True, "refuse (close, never ack) windows whose events are not JSON objects"
        ),
        "enrich": Option(
            "str",
            "none",
            "add lumberjack.peer and TLS subject/fingerprint headers to each event",
            choices=("none", "headers"),
        ),
        "max_window": Option("int", _DEFAULT_LIMITS.max_window, "events per window", 1),
        "max_frame": Option("size", _DEFAULT_LIMITS.max_frame, "bytes per frame", 1024),
        "max_inflated": Option(
            "size", _DEFAULT_LIMITS.max_inflated, "inflated bytes per compressed frame", 1024
        ),
        "max_ratio": Option(
            "int", _DEFAULT_LIMITS.max_ratio, "inflated/compressed size ratio per frame", 1
        ),
        "max_window_bytes": Option(
            "size",
            _DEFAULT_LIMITS.max_window_bytes,
            "bytes of events a window may hold before it is whole (inflated ones included)",
            1024,
        ),
        "keepalive": Option("duration", 5.0, "keepalive ack interval while a window waits", 0.01),
        "window_timeout": Option(
            "duration", 30.0, "time for the rest of a started window to arrive (0: none)"
        ),
        "max_pending_windows": Option("int", 4, "unacked windows before reading pauses", 1),
        "partial_after": Option(
            "duration", 1.0, "publish and ack a trickling window's events after this (0: off)", 0.0
        ),
        "inflate_in_thread": Option(
            "size", 0, "inflate C frames at least this large (compressed) in a thread (0: never)", 0
        ),
    }
    upstream_options = {
        "bulk_max_size": Option("int", 2048, "events per window", 1),
        "pipelining": Option("int", 2, "windows in flight", 1),
        "compression_level": Option("int", 3, "zlib level 0-9 (0: uncompressed)", 0, maximum=9),
        "timeout": Option("duration", 30.0, "read timeout, reset by any ack", 0.01),
        "stall_timeout": Option(
            "duration", 300.0, "fail over when only keepalives arrive for this long", 0.01
        ),
        "ttl": Option("duration", 0.0, "reconnect after this long (0: never)"),
        "metadata_beat": Option(
            "str", "interchange", "@metadata.beat added to events without @metadata ('': none)"
        ),
        "metadata_type": Option("str", "_doc", "@metadata.type added with it"),
    }

    @classmethod
    def default_listener(cls) -> dict[str, Any]:
        return {"destination": "logs"}

    async def serve(self, conn: ServerConnection) -> None:
        o = conn.options
        settings = ServerSettings(
            limits=Limits(
                max_window=o["max_window"],
                max_frame=o["max_frame"],
                max_inflated=o["max_inflated"],
                max_ratio=o["max_ratio"],
                max_window_bytes=o["max_window_bytes"],
            ),
            keepalive=o["keepalive"],
            max_pending_windows=o["max_pending_windows"],
            window_timeout=o["window_timeout"],
            partial_after=o["partial_after"],
            inflate_in_thread=o["inflate_in_thread"],
        )
        field = o["destination_field"]
        validate = o["validate_json"]
        enrich = o["enrich"] == "headers"
        destination = conn.listener.destination
        hub = conn.hub

        async def sink(window: Window) -> Receipt:
            source = conn.source()
            messages = to_messages(
                window.events,
                source,
                destination,
                destination_field=field,
                validate=validate,
                extra_headers=enrichment(source) if enrich else None,
            )
            return await hub.publish(messages)

        session = ServerSession(
            conn.stream,
            sink,
            settings,
            logger=conn.log,
            shutdown=conn.shutdown,
            metrics=server_metrics(conn.metrics, conn.listener.name),
        )
        await session.serve()

    async def run_upstream(self, ctx: UpstreamContext) -> None:
        o = ctx.options
        level = o["compression_level"]
        settings = ClientSettings(
            bulk_max_size=o["bulk_max_size"],
            pipelining=o["pipelining"],
            compression_level=level,
            timeout=o["timeout"],
            stall_timeout=o["stall_timeout"],
            ttl=o["ttl"],
            metadata=(
                beats_metadata(o["metadata_beat"], o["metadata_type"], _version())
                if o["metadata_beat"]
                else b""
            ),
        )

        metrics = client_metrics(ctx.metrics, ctx.name)

        async def session(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
            with ctx.subscribe(max_unacked=settings.bulk_max_size * settings.pipelining) as sub:
                acked = await forward(stream, sub, settings, logger=ctx.log, metrics=metrics)
            ctx.log.info("closed after its TTL (%d events acked); reconnecting", acked)

        await ctx.run_sessions(session)


def server_metrics(metrics: Metrics, listener: str) -> ServerMetrics:
    """The listener's families in the gateway's metrics (created on first use)."""
    labels = ["listener"]
    ack_latency = metrics.histogram(
        "lumberjack_ack_latency_seconds",
        "Time from a window's last byte to its ack on the wire.",
        labels,
    )
    return ServerMetrics(
        windows=metrics.counter("lumberjack_windows", "Windows received.", labels).labels(listener),
        events=metrics.counter("lumberjack_events", "Events received.", labels).labels(listener),
        keepalives=metrics.counter(
            "lumberjack_keepalives", "Keepalive acks (A 0) sent while a window waited.", labels
        ).labels(listener),
        inflated_bytes=metrics.counter(
            "lumberjack_inflated_bytes", "Bytes inflated from C frames.", labels
        ).labels(listener),
        protocol_errors=metrics.counter(
            "lumberjack_protocol_errors",
            "Connections closed for breaking the protocol or timing out.",
            labels,
        ).labels(listener),
        refused_windows=metrics.counter(
            "lumberjack_refused_windows",
            "Windows not delivered to every target (closed without an ack).",
            labels,
        ).labels(listener),
        ack_latency=ack_latency.labels(listener),
    )


def client_metrics(metrics: Metrics, upstream: str) -> ClientMetrics:
    """The upstream's families in the gateway's metrics (created on first use)."""
    labels = ["upstream"]

    def counter(name: str, doc: str) -> Any:
        return metrics.counter(f"lumberjack_upstream_{name}", doc, labels).labels(upstream)

    return ClientMetrics(
        windows=counter("windows", "Windows sent."),
        events_acked=counter("events_acked", "Events the server acked."),
        events_resent=counter("events_resent", "Events sent again after a failed connection."),
        events_failed=counter(
            "events_failed", "Events unacked when a connection failed (they are resent)."
        ),
        window_events=metrics.histogram(
            "lumberjack_upstream_window_events",
            "Events per window sent.",
            labels,
            buckets=(1, 8, 64, 256, 512, 1024, 2048, 4096, 10_000),
        ).labels(upstream),
        ack_latency=metrics.histogram(
            "lumberjack_upstream_ack_latency_seconds",
            "Time from a window going out to the ack covering all of it.",
            labels,
        ).labels(upstream),
    )


def _version() -> str:
    """The gateway's version, sent as ``@metadata.version``."""
    try:
        return importlib.metadata.version("interchange-gateway")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a bare tree
        return "0"
