"""The hub alone: publish one message, receive it, ack it; no sockets, no codec.

What every single-message protocol frame costs in the core (``Hub.publish``
into a topic with one subscriber, ``Subscription.receive(1)``, ``ack``), so a
change to the model can be weighed without the VM's noise on socket I/O. It
runs in this process: ``--messages`` publishes, then as many receives, then
as many acks, timed separately and repeated ``--rounds`` times; the best
round counts. Self-check: every message is received once, in order, and
every receipt settles delivered.
"""

from __future__ import annotations

import argparse
import time

import trio

from gateway.core.hub import Hub
from gateway.core.model import Message, Outcome, Source

from . import Result, int_at_least, register


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--messages", type=int_at_least(1), default=20_000, help="messages per round"
    )
    parser.add_argument("--rounds", type=int_at_least(1), default=7, help="rounds; the best counts")
    parser.add_argument("--size", type=int_at_least(0), default=180, help="body bytes")


async def _round(args: argparse.Namespace, result: Result) -> tuple[float, float, float]:
    hub = Hub()
    sub = hub.subscribe("bench", max_unacked=args.messages)
    source = Source("bench", "bench", "127.0.0.1:1")
    messages = [
        Message("bench", b"%d." % i + b"x" * args.size, {}, None, source)
        for i in range(args.messages)
    ]
    t0 = time.perf_counter()
    receipts = [await hub.publish([m]) for m in messages]
    t1 = time.perf_counter()
    deliveries = []
    while len(deliveries) < len(messages):
        deliveries += await sub.receive(1)
    t2 = time.perf_counter()
    for d in deliveries:
        sub.ack(d.tag)
    t3 = time.perf_counter()
    if [d.message for d in deliveries] != messages:
        result.problems.append("deliveries differ from what was published")
    if any(r.outcome is not Outcome.DELIVERED for r in receipts):
        result.problems.append("a receipt did not settle delivered")
    return t1 - t0, t2 - t1, t3 - t2


@register(
    "hub-roundtrip",
    "the hub alone: publish one message, receive it, ack it (µs per message, no sockets)",
    arguments=_arguments,
    default_seconds=0,
)
def run(args: argparse.Namespace) -> Result:
    result = Result(params={"messages": args.messages, "rounds": args.rounds, "size": args.size})
    rounds = [trio.run(_round, args, result) for _ in range(args.rounds)]
    n = args.messages
    best = [min(r[i] for r in rounds) / n * 1e6 for i in range(3)]
    result.add("publish", best[0], "us/msg")
    result.add("receive(1)", best[1], "us/msg")
    result.add("ack", best[2], "us/msg")
    result.add("publish + receive + ack", min(sum(r) for r in rounds) / n * 1e6, "us/msg")
    return result
