"""A segment-append upstream: what is routed to ``upstream:NAME`` appended to a remote segment.

Each delivery of the upstream's queue becomes one event (the message body,
or the gateway's stored envelope of the whole message), appended by one
writer whose id is stable across restarts (by default a UUID5 of the
upstream's name). A delivery is acked to the hub only once the server
acknowledged its event number, by ``DataAppended`` or, after a reconnect, by
the ``AppendSetup`` that says how far the writer got; the rest are resent
with their original numbers, so while the gateway runs every message is
appended exactly once. The subscription is held across connections for that
reason: handing unacked deliveries back on each lost connection would give
them new numbers. (Across a restart of this gateway, deliveries unacked at
the time come back and get new numbers: at least once.)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import trio

from gateway.sdk import ConnectionInfo, Message, Outcome, UpstreamContext, envelope

from .client import Appender, WriterSettings, run_appender
from .events import MAX_EVENT_PAYLOAD

__all__ = ["NAMESPACE", "default_writer_id", "payload_encoder", "run_upstream"]

#: The UUID5 namespace of upstream writer ids.
NAMESPACE = uuid.UUID("6f1c3a52-2f5b-5c7e-9a59-9b0d1e8c4a10")


def default_writer_id(upstream: str) -> uuid.UUID:
    """The writer id of an upstream named ``upstream``: the same on every start."""
    return uuid.uuid5(NAMESPACE, upstream)


def payload_encoder(kind: str) -> Callable[[Message], bytes]:
    """How a message becomes an event: ``body`` as it is, or ``envelope``."""
    if kind == "body":
        return _body
    if kind == "envelope":
        return envelope.encode
    raise ValueError(f"payload must be body or envelope, not {kind!r}")


def _body(message: Message) -> bytes:
    return message.body


async def run_upstream(ctx: UpstreamContext) -> None:
    """Forward ``upstream:NAME`` to the configured segment until cancelled."""
    o = ctx.options
    segment: str = o["segment"]
    writer_id = uuid.UUID(o["writer_id"]) if o["writer_id"] else default_writer_id(ctx.name)
    encode = payload_encoder(o["payload"])
    settings = WriterSettings(block_size=o["block_size"], timeout=o["timeout"])
    labels = ["upstream"]
    sent = ctx.metrics.tally(
        "segment_upstream_events_acked", "Events the remote segment acknowledged.", labels
    ).labels(ctx.name)
    resent = ctx.metrics.tally(
        "segment_upstream_events_resent",
        "Events sent again on a new connection (with their original event numbers).",
        labels,
    ).labels(ctx.name)

    with ctx.subscribe(max_unacked=o["max_unacked"]) as sub:

        def acked(_segment: str, _writer: uuid.UUID, tokens: list[tuple[Any, int]], _: int) -> None:
            sub.ack_many([tag for tag, _number in tokens])
            sent.inc(len(tokens))

        appender = Appender(
            acked, writer_id=lambda _segment: writer_id, max_events=o["max_unacked"]
        )
        appender.on_resend = resent.inc

        async def pump() -> None:
            while True:
                try:
                    deliveries = await sub.receive()
                except trio.ClosedResourceError:
                    return  # the gateway is stopping
                payloads, tags = [], []
                for delivery in deliveries:
                    payload = encode(delivery.message)
                    if len(payload) > MAX_EVENT_PAYLOAD:
                        sub.nack(
                            delivery.tag,
                            requeue=False,
                            outcome=Outcome.REJECTED,
                            reason=f"an event of {len(payload)} bytes exceeds the"
                            f" {MAX_EVENT_PAYLOAD} bytes segment append allows",
                        )
                        continue
                    payloads.append(payload)
                    tags.append(delivery.tag)
                if payloads:
                    appender.add(segment, payloads, tags)

        async def session(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
            await run_appender(stream, appender, settings, logger=ctx.log)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump)
            await ctx.run_sessions(session)
