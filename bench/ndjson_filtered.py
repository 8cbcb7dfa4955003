"""ndjson filtered fan-out: one publisher, N subscribers that each want 1/N of it.

One publisher connection and ``--subscribers`` (default 8) subscriber
connections to one ndjson listener, all subscribed to the same destination,
each with a filter on the ``shard`` header (``{"shard": "k"}``, k = 0..N-1).
The publisher sets ``shard`` to ``n % N`` on message ``n``, so every message
matches exactly one subscriber, and the gateway answers its ``pub`` with
``delivered`` only once that subscriber acked it. As in ``ndjson-pubsub``
(whose publisher, templates and options this reuses) the publisher keeps at
most ``--inflight`` publishes unanswered; what is measured is the rate of
``delivered`` answers, the deliveries per second summed over the
subscribers, the publish→ack latency, and the gateway's CPU time per message
(subprocess mode). Compared with ``ndjson-pubsub`` the difference is the
cost of evaluating N filters per stored message and of N subscriptions.

Self-checks (any failure makes the run exit 1): each subscriber is known to
the gateway (a ``ping`` answered after its ``sub``) before publishing starts;
every delivery has the right body and destination, and belongs to the
receiving subscriber's shard (by its number and by its header); no
duplicates or redeliveries; after the window, every publish is answered
within ``--drain-timeout``; and the union of the subscribers' deliveries is
exactly the set of publishes answered ``delivered``.
"""

from __future__ import annotations

import argparse
import contextlib
import time

import trio
from interchange_ndjson.codec import NEED_DATA, ClientCodec
from interchange_ndjson.events import (
    ConnectionClosed,
    Deliver,
    Error,
    Ping,
    Pong,
    Publish,
    Subscribe,
)

from gateway.core.filters import Filter

from . import Result, int_at_least, register
from ._gateway import RunningGateway, run_gateway
from ._ndjson import add_cpu_metrics, check_gateway, measure
from .ndjson_pubsub import (
    DESTINATION,
    LISTENER,
    RECEIVE_SIZE,
    SEQ_DIGITS,
    Load,
    Templates,
    arguments,
    gateway_config,
)

HEADER = "shard"


def _filtered_arguments(parser: argparse.ArgumentParser) -> None:
    arguments(parser)
    parser.add_argument(
        "--subscribers",
        type=int_at_least(1),
        default=8,
        help="subscriber connections, each taking one shard of the messages (default: %(default)s)",
    )


class ShardTemplates(Templates):
    """``pub`` lines whose ``shard`` header is the message number modulo ``shards``."""

    def __init__(self, size: int, shards: int) -> None:
        # Not super().__init__: it would check publishes() against lines without headers.
        plain = Templates(size)  # checks the body, the ack and the line's head
        self.size, self.padding, self.ack = plain.size, plain.padding, plain.ack
        self.pub_head, self.pub_tail, self.seq = plain.pub_head, plain.pub_tail, plain.seq
        self.shards = shards
        self.tails = [
            self.padding + b'","headers":{"' + HEADER.encode() + b'":"%d"}}\n' % k
            for k in range(shards)
        ]
        codec = ClientCodec()
        for n in (1, shards + 2, 987_654_321):
            headers = {HEADER: str(n % shards)}
            expected = codec.send(Publish(self.body(n), DESTINATION, headers, None, n))
            if self.publishes(n, 1) != expected:
                raise AssertionError(
                    f"publish template gives {self.publishes(n, 1)!r}, not {expected!r}"
                )

    def publishes(self, first: int, count: int) -> bytes:
        head, seq, tails, shards = self.pub_head, self.seq, self.tails, self.shards
        return b"".join(
            [head % n + seq % n + tails[n % shards] for n in range(first, first + count)]
        )


class FilteredLoad(Load):
    """``ndjson-pubsub``'s publisher, and one filtered subscriber per shard."""

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__(args)
        self.shards: int = args.subscribers
        self.templates = ShardTemplates(args.size, self.shards)
        #: Deliveries received by each shard's subscriber (whole run).
        self.by_shard = [0] * self.shards
        self.wrong_shard = 0
        #: Deliveries received during the measured window, all subscribers together.
        self.window_deliveries = 0

    async def subscribe_shard(
        self,
        stream: trio.abc.Stream,
        shard: int,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Subscribe with the filter ``shard == "<shard>"``, then ack whatever arrives.

        Started once the gateway answered a ``ping`` sent after the ``sub``: the
        connection's lines are handled in order, so the subscription exists by then.
        """
        codec = ClientCodec()
        label = str(shard)
        wanted = Filter.equals(**{HEADER: label})
        sub = Subscribe(DESTINATION, None, None, self.window, filter=wanted)
        # Acks go out as templates, so the codec that parses the deliveries must not
        # hold the subscription: it would count each delivery as unsettled.
        sender = ClientCodec()
        await stream.send_all(sender.send(sub) + sender.send(Ping()))
        started = False
        ack, received, size, shards = self.templates.ack, self.received, self.size, self.shards
        padding = self.templates.padding
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data and not self.closing:
                self.fail(f"the gateway closed subscriber {shard}'s connection")
                return
            codec.receive_data(data)
            acks = []
            while (event := codec.next_event()) is not NEED_DATA:
                if type(event) is Deliver:
                    acks.append(ack % event.tag)
                    body = event.body
                    try:
                        n = int(body[:SEQ_DIGITS])
                    except ValueError:
                        n = 0
                    if (
                        len(body) != size
                        or not 0 < n < len(received)
                        or body[SEQ_DIGITS:] != padding
                        or event.destination != DESTINATION
                    ):
                        self.bad_bodies += 1
                        continue
                    if n % shards != shard or event.headers.get(HEADER) != label:
                        self.wrong_shard += 1
                    if received[n]:
                        self.duplicates += 1
                        received[n] = min(received[n] + 1, 255)
                    else:
                        received[n] = 1
                    if event.redelivered:
                        self.redelivered += 1
                elif isinstance(event, Pong) and not started:
                    started = True
                    task_status.started()
                elif isinstance(event, Error):
                    self.fail(
                        f"the gateway reported an error to subscriber {shard}: {event.message}"
                    )
                    return
                elif isinstance(event, ConnectionClosed):
                    return
                else:
                    self.fail(f"unexpected line for subscriber {shard}: {event!r}")
                    return
            if acks:
                self.received_count += len(acks)
                self.by_shard[shard] += len(acks)
                if self.t0 <= time.perf_counter() < self.t1:
                    self.window_deliveries += len(acks)
                await stream.send_all(b"".join(acks))

    def verify(self) -> None:
        super().verify()
        if self.wrong_shard:
            self.problems.append(
                f"{self.wrong_shard} deliveries reached a subscriber whose filter does not match"
            )


async def _run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "mode": args.mode,
            "subscribers": args.subscribers,
            "size": args.size,
            "inflight": args.inflight,
            "batch": args.batch,
            "window": args.window,
            "seconds": args.seconds,
            "warmup": args.warmup,
        }
    )
    if args.profile is not None:
        result.params["profiled"] = True
        if args.mode != "subprocess":
            result.problems.append("--profile needs --mode subprocess")
            return result
    load = FilteredLoad(args)
    config = gateway_config(args)
    result.details["gateway_config"] = config
    async with run_gateway(config, args.mode, profile=args.profile) as gw:
        await _drive(load, gw, args, result)
    check_gateway(gw, result, load.problems)
    result.problems = load.problems
    return result


async def _drive(
    load: FilteredLoad, gw: RunningGateway, args: argparse.Namespace, result: Result
) -> None:
    """Run the load for warm-up + window, drain, check, and fill ``result``."""
    host, port = gw.address(LISTENER)
    async with contextlib.AsyncExitStack() as streams:
        subs = [
            await streams.enter_async_context(await trio.open_tcp_stream(host, port))
            for _ in range(load.shards)
        ]
        pub = await streams.enter_async_context(await trio.open_tcp_stream(host, port))

        async def start(nursery: trio.Nursery) -> None:
            for shard, stream in enumerate(subs):
                await nursery.start(load.subscribe_shard, stream, shard)
            load.start_publishing(nursery, pub)

        window = await measure(load, gw, args, start)
        if window is None:
            return  # stopped by a failure; the problem says why

        elapsed = load.t1 - load.t0
        result.add("acked end to end (delivered)", load.window_acks / elapsed, "msg/s")
        result.add("deliveries, all subscribers", load.window_deliveries / elapsed, "msg/s")
        result.add_latencies("latency", load.latencies)
        result.add("measured window", elapsed, "s")
        result.add("acked in window", load.window_acks, "msg")
        result.add("published (whole run)", load.published, "msg")
        result.add("answered delivered (whole run)", load.delivered, "msg")
        result.add("received by subscribers (whole run)", load.received_count, "msg")
        result.add("fewest received by one subscriber", min(load.by_shard), "msg")
        add_cpu_metrics(result, gw, *window, load.window_acks)
    result.details["received_by_shard"] = load.by_shard
    result.details["latency_samples"] = len(load.latencies)
    result.details["delivered_per_second_from_start"] = load.timeline


@register(
    "ndjson-filtered",
    "ndjson publisher → gateway → 8 subscribers filtering on a header, each taking 1/8: "
    "acked msg/s, deliveries/s and publish→ack latency",
    arguments=_filtered_arguments,
)
def run(args: argparse.Namespace) -> Result:
    return trio.run(_run, args)
