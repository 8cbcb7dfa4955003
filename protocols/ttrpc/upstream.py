"""A ttrpc upstream's client role: each message routed to ``upstream:NAME`` becomes a call.

With ``service`` and ``method`` set, every delivery of the upstream's queue
is sent as one unary call, its body as the request payload and its headers
as metadata, up to ``max_inflight`` at once on one connection. A delivery
is acked only once the server answered OK; a call (request/reply) gets the
response as its reply, errors included, with the server's status. A plain
message the server refuses is settled REJECTED with the server's status as
the reason (sending again what the server refused would loop forever),
unless the status means "not now" (:data:`RETRYABLE`): then it is sent again
after the upstream's initial backoff. One whose connection was lost goes
back to the queue and is sent again on the next connection (at least once).

Without them the upstream only serves as the destination of proxy routes
(:mod:`.proxy`): this role keeps one of the proxy pool's connections open
(reconnecting with the upstream's backoff), so the status page shows whether
the upstream is reachable before the first call needs it.
"""

from __future__ import annotations

import trio

from gateway.sdk import ConnectionInfo, Delivery, Outcome, Reply, Subscription, UpstreamContext

from .client import Client, open_client
from .proxy import Pool
from .status import Code, TtrpcError

__all__ = ["RETRYABLE", "run_upstream"]

#: Statuses that say "not now" rather than "not this": the message is sent again.
RETRYABLE = frozenset(
    {Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED, Code.RESOURCE_EXHAUSTED, Code.ABORTED}
)


def _name(code: int) -> str:
    try:
        return Code(code).name
    except ValueError:
        return f"code {code}"


async def run_upstream(ctx: UpstreamContext, pool: Pool | None = None) -> None:
    """Call ``service``/``method`` with what is routed to ``upstream:NAME`` until cancelled.

    Without them, keep one connection of ``pool`` (the proxy's, for routes that
    lead here) open, so its state shows and the first call finds it ready; or,
    with no pool either, nothing is asked of this upstream: idle.
    """
    o = ctx.options
    service: str = o["service"]
    method: str = o["method"]
    if not service or not method:
        if pool is None:
            ctx.state = "idle"
            await trio.sleep_forever()
        await ctx.run_sessions(lambda stream, info: pool.adopt(stream, info.peer))
    timeout: float = o["timeout"]

    async def call_one(client: Client, sub: Subscription, delivery: Delivery) -> None:
        message = delivery.message
        try:
            body = await client.call(
                service, method, message.body, timeout=timeout, metadata=dict(message.headers)
            )
        except TtrpcError as e:
            if client.is_closed:
                sub.nack(delivery.tag)  # lost with the connection: sent again on the next
            elif delivery.reply_by is not None:
                sub.reply(delivery.tag, Reply(status=int(e.code), message=e.message))
            elif e.code in RETRYABLE:
                # Held for a while (and its slot with it), then sent again.
                await trio.sleep(ctx.backoff.initial)
                sub.nack(delivery.tag)
            else:
                reason = f"{service}/{method}: {_name(e.code)} {e.message}"
                sub.nack(delivery.tag, requeue=False, outcome=Outcome.REJECTED, reason=reason)
            return
        if delivery.reply_by is not None:
            sub.reply(delivery.tag, Reply(body=body))
        else:
            sub.ack(delivery.tag)

    async def session(stream: trio.abc.Stream, info: ConnectionInfo) -> None:
        async with open_client(stream) as client:
            with ctx.subscribe(max_unacked=o["max_inflight"]) as sub:
                async with trio.open_nursery() as nursery:

                    async def pump() -> None:
                        while True:
                            for delivery in await sub.receive():
                                nursery.start_soon(call_one, client, sub, delivery)

                    nursery.start_soon(pump)
                    await client.wait_closed()
                    nursery.cancel_scope.cancel()
        raise ConnectionError(f"connection to {info.peer} lost: {client.closed_reason}")

    await ctx.run_sessions(session)
