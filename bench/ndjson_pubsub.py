"""ndjson end to end: publish → gateway → subscriber ack → publisher ack.

One publisher connection and one subscriber connection to one ndjson
listener. The gateway answers a ``pub`` with ``{"op":"ack","status":
"delivered"}`` only once the subscriber acked the delivery, so the rate of
such answers is the rate of messages that made the whole trip, and the time
from sending a ``pub`` line to parsing its answer is the publisher's view of
end-to-end latency. The publisher keeps at most ``--inflight`` publishes
unanswered (a closed loop): by Little's law the latency at full load is about
``inflight / rate``, so the latency figures at the default in-flight bound
measure queueing; ``--inflight 1`` measures one message's round trip.

Checks that keep the figures honest (any failure makes the run exit 1):
only answers with status ``delivered`` are counted; each answer must match
a publish that is still unanswered; after the measured window publishing
stops and every publish must be answered within ``--drain-timeout``; then
the set of message numbers the subscriber received (each body starts with
its number) must equal the set answered ``delivered``: no loss, no
duplicate, no redelivery, every body intact.

Lines are sent from byte templates, checked once against the plugin's own
codec so they are exactly what ``NdjsonClient`` would send; everything
received is parsed with the codec (``ClientCodec()``), as a real
client does. The load generator stays cheap (about a third of the gateway's
CPU per message) so that, on 2 cores, the gateway in its own process is the
bottleneck. At the default in-flight bound the loop moves in a few large
batches and the gateway idles now and then; ``--inflight 2000 --window 4000``
keeps it saturated, for capacity figures.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio
from interchange_ndjson.codec import NEED_DATA, ClientCodec
from interchange_ndjson.events import (
    Ack,
    ConnectionClosed,
    Deliver,
    Error,
    Publish,
    Published,
    Subscribe,
)

from . import Result, add_warmup, int_at_least, register
from ._gateway import RunningGateway, run_gateway
from ._ndjson import add_cpu_metrics, check_gateway, delivered, measure

DESTINATION = "bench"
LISTENER = "bench"
#: Each body starts with its message number in this many decimal digits.
SEQ_DIGITS = 12
RECEIVE_SIZE = 65536


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        choices=("subprocess", "inprocess"),
        default="subprocess",
        help="run the gateway as `python -m gateway run` in its own process (default), "
        "or in this process's trio loop beside the load generator",
    )
    parser.add_argument(
        "--size",
        type=int_at_least(SEQ_DIGITS),
        default=200,
        help=f"message body in bytes, at least {SEQ_DIGITS} (default: %(default)s)",
    )
    parser.add_argument(
        "--inflight",
        type=int_at_least(1),
        default=500,
        help="publishes sent and not yet answered, at most (default: %(default)s)",
    )
    parser.add_argument(
        "--batch",
        type=int_at_least(1),
        default=1000,
        help="most publishes written in one send (default: %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=int_at_least(1),
        default=1000,
        help="the subscriber's window: deliveries it may hold unacked (default: %(default)s)",
    )
    add_warmup(parser)
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="run the gateway under cProfile and write its stats to PATH (subprocess mode; "
        "profiling slows the gateway, so do not quote the figures of such a run)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for outstanding answers after the window (default: %(default)g)",
    )


#: The ndjson listener's default ``max_inflight`` (unanswered publishes per connection).
LISTENER_MAX_INFLIGHT = 1000


def gateway_config(args: argparse.Namespace) -> dict[str, Any]:
    """One ndjson listener on a port the OS picks; the hub's defaults otherwise.

    The listener's ``max_inflight`` is raised to ``--inflight`` when that is
    larger, so the publisher's bound is the one in force, not the gateway's.
    """
    return {
        # Short drain: a clean run has nothing in flight at shutdown; a failed one
        # should not wait the default 10 s for publishes nobody will ack.
        "gateway": {"log_level": "info", "data_dir": "data", "drain_timeout": "2s"},
        "listeners": [
            {
                "name": LISTENER,
                "protocol": "ndjson",
                "bind": "127.0.0.1:0",
                "destination": DESTINATION,
                "max_inflight": max(args.inflight, LISTENER_MAX_INFLIGHT),
            }
        ],
    }


class Templates:
    """Byte templates for the lines the load generator sends, checked against the codec."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.padding = b"x" * (size - SEQ_DIGITS)
        self.pub_head = b'{"op":"pub","id":%d,"dest":"' + DESTINATION.encode() + b'","body":"'
        self.pub_tail = b'"}\n'
        self.seq = b"%%0%dd" % SEQ_DIGITS
        self.ack = b'{"op":"ack","tag":%d}\n'
        codec = ClientCodec()
        codec.send(Subscribe(DESTINATION))
        for n in (1, 987_654_321):
            expected = codec.send(Publish(self.body(n), DESTINATION, {}, None, n))
            if self.publishes(n, 1) != expected:
                raise AssertionError(
                    f"publish template gives {self.publishes(n, 1)!r}, not {expected!r}"
                )
            # The codec acks only what it was delivered.
            delivered(codec, n, DESTINATION)
            if self.ack % n != codec.send(Ack(n)):
                raise AssertionError("ack template differs from the codec's ack line")

    def body(self, n: int) -> bytes:
        return self.seq % n + self.padding

    def publishes(self, first: int, count: int) -> bytes:
        """The ``pub`` lines of messages ``first`` to ``first + count - 1``."""
        head, seq, tail = self.pub_head, self.seq, self.padding + self.pub_tail
        return b"".join([head % n + seq % n + tail for n in range(first, first + count)])


class Load:
    """The publisher and subscriber tasks and what they counted."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.templates = Templates(args.size)
        self.size: int = args.size
        self.inflight_limit: int = args.inflight
        self.batch: int = args.batch
        self.window: int = args.window
        self.inflight = 0
        self.next_id = 1
        self.stopping = False
        self.closing = False
        #: Start and end of the measured window (perf_counter); nothing counts before t0.
        self.t0 = math.inf
        self.t1 = math.inf
        # Indexed by message number (index 0 unused).
        self.send_times: list[float] = [0.0]
        #: 0 unanswered, 1 answered delivered, 2 answered otherwise.
        self.answered = bytearray(1)
        #: Deliveries of each message number seen by the subscriber (capped at 255).
        self.received = bytearray(1)
        self.published = 0
        self.delivered = 0
        self.not_delivered: Counter[str] = Counter()
        self.received_count = 0
        self.duplicates = 0
        self.redelivered = 0
        self.bad_bodies = 0
        self.window_acks = 0
        self.latencies: list[float] = []
        #: Answers ``delivered`` per second since the load started (warm-up included).
        self.timeline: list[int] = []
        self.started = math.inf
        self.problems: list[str] = []
        self._room = trio.lowlevel.ParkingLot()
        self._idle = trio.lowlevel.ParkingLot()
        self.scope = trio.CancelScope()

    def fail(self, problem: str) -> None:
        """Record a problem that makes the rest of the run meaningless, and stop it."""
        self.problems.append(problem)
        self.scope.cancel()

    # -- publisher ---------------------------------------------------------------
    def start_publishing(self, nursery: trio.Nursery, stream: trio.abc.Stream) -> None:
        """Start the publisher on ``stream``: its sender and its reader of answers."""
        self.started = time.perf_counter()
        nursery.start_soon(self.read_answers, stream)
        nursery.start_soon(self.send_publishes, stream)

    def stop(self) -> None:
        """Publish nothing more (wakes the sender if it waits for room)."""
        self.stopping = True
        self._room.unpark_all()

    async def send_publishes(self, stream: trio.abc.SendStream) -> None:
        templates = self.templates
        while not self.stopping:
            room = min(self.inflight_limit - self.inflight, self.batch)
            if room <= 0:
                await self._room.park()
                continue
            first = self.next_id
            self.next_id += room
            data = templates.publishes(first, room)
            self.answered.extend(bytes(room))
            self.received.extend(bytes(room))
            self.inflight += room
            self.published += room
            self.send_times.extend([time.perf_counter()] * room)
            await stream.send_all(data)

    async def read_answers(self, stream: trio.abc.ReceiveStream) -> None:
        codec = ClientCodec()
        answered, send_times, latencies = self.answered, self.send_times, self.latencies
        timeline = self.timeline
        perf_counter = time.perf_counter
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data and not self.closing:
                self.fail("the gateway closed the publisher's connection")
                return
            codec.receive_data(data)
            settled = 0
            while (event := codec.next_event()) is not NEED_DATA:
                now = perf_counter()
                if type(event) is Published:
                    n = event.id
                    if type(n) is not int or not 0 < n < len(answered) or answered[n]:
                        self.fail(f"answer for an unknown or already answered id: {event!r}")
                        return
                    settled += 1
                    if event.status == "delivered":
                        answered[n] = 1
                        self.delivered += 1
                        second = int(now - self.started)
                        while len(timeline) <= second:
                            timeline.append(0)
                        timeline[second] += 1
                        if self.t0 <= now < self.t1:
                            self.window_acks += 1
                            latencies.append(now - send_times[n])
                    else:
                        answered[n] = 2
                        self.not_delivered[f"{event.status}: {event.reason}"] += 1
                elif isinstance(event, Error):
                    self.fail(f"the gateway reported an error to the publisher: {event.message}")
                    return
                elif isinstance(event, ConnectionClosed):
                    return
                else:
                    self.fail(f"unexpected line for the publisher: {event!r}")
                    return
            if settled:
                self.inflight -= settled
                self._room.unpark_all()
                if self.inflight == 0:
                    self._idle.unpark_all()

    async def wait_answered(self) -> None:
        while self.inflight:
            await self._idle.park()

    # -- subscriber ----------------------------------------------------------------
    async def subscribe(
        self,
        stream: trio.abc.Stream,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        # Acks go out as templates, so the codec that parses the deliveries must not
        # hold the subscription: it would count each delivery as unsettled.
        codec = ClientCodec()
        sub = Subscribe(DESTINATION, None, None, self.window)
        await stream.send_all(ClientCodec().send(sub))
        task_status.started()
        ack, received, size = self.templates.ack, self.received, self.size
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data and not self.closing:
                self.fail("the gateway closed the subscriber's connection")
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
                        or body[SEQ_DIGITS:] != self.templates.padding
                        or event.destination != DESTINATION
                    ):
                        self.bad_bodies += 1
                        continue
                    if received[n]:
                        self.duplicates += 1
                        received[n] = min(received[n] + 1, 255)
                    else:
                        received[n] = 1
                    if event.redelivered:
                        self.redelivered += 1
                elif isinstance(event, Error):
                    self.fail(f"the gateway reported an error to the subscriber: {event.message}")
                    return
                elif isinstance(event, ConnectionClosed):
                    return
                else:
                    self.fail(f"unexpected line for the subscriber: {event!r}")
                    return
            if acks:
                self.received_count += len(acks)
                await stream.send_all(b"".join(acks))

    # -- checks ------------------------------------------------------------------------
    def verify(self) -> None:
        """After draining: what was answered delivered is exactly what was received."""
        if self.inflight:
            self.problems.append(f"{self.inflight} publishes still unanswered after draining")
        if self.not_delivered:
            self.problems.append(f"publishes not delivered: {dict(self.not_delivered)}")
        if self.bad_bodies:
            self.problems.append(f"{self.bad_bodies} deliveries with a wrong body or destination")
        if self.duplicates or self.redelivered:
            self.problems.append(
                f"{self.duplicates} duplicate and {self.redelivered} redelivered deliveries"
            )
        if self.received_count != self.delivered:
            self.problems.append(
                f"the subscriber received {self.received_count} messages but "
                f"{self.delivered} publishes were answered delivered"
            )
        # Message by message: answered delivered ⇔ received.
        was_delivered = bytes(self.answered).translate(_ONE_ONLY)
        was_received = bytes(self.received).translate(_NONZERO)
        if was_delivered != was_received:
            missing = sum(1 for a, r in zip(was_delivered, was_received, strict=True) if a > r)
            extra = sum(1 for a, r in zip(was_delivered, was_received, strict=True) if r > a)
            self.problems.append(
                f"{missing} messages answered delivered were never received; "
                f"{extra} received were not answered delivered"
            )


_ONE_ONLY = bytes(1 if i == 1 else 0 for i in range(256))
_NONZERO = bytes(1 if i else 0 for i in range(256))


async def _run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "mode": args.mode,
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
    load = Load(args)
    config = gateway_config(args)
    result.details["gateway_config"] = config
    async with run_gateway(config, args.mode, profile=args.profile) as gw:
        await _drive(load, gw, args, result)
    check_gateway(gw, result, load.problems)
    result.problems = load.problems
    return result


async def _drive(load: Load, gw: RunningGateway, args: argparse.Namespace, result: Result) -> None:
    """Run the load for warm-up + window, drain, check, and fill ``result``."""
    host, port = gw.address(LISTENER)
    sub_stream = await trio.open_tcp_stream(host, port)
    pub_stream = await trio.open_tcp_stream(host, port)
    async with sub_stream, pub_stream:

        async def start(nursery: trio.Nursery) -> None:
            await nursery.start(load.subscribe, sub_stream)
            load.start_publishing(nursery, pub_stream)

        window = await measure(load, gw, args, start)
        if window is None:
            return  # stopped by a failure; the problem says why

        elapsed = load.t1 - load.t0
        rate = load.window_acks / elapsed
        result.add("acked end to end (delivered)", rate, "msg/s")
        result.add("body throughput", rate * args.size / 2**20, "MiB/s")
        result.add_latencies("latency", load.latencies)
        result.add("measured window", elapsed, "s")
        result.add("acked in window", load.window_acks, "msg")
        result.add("published (whole run)", load.published, "msg")
        result.add("answered delivered (whole run)", load.delivered, "msg")
        result.add("received by subscriber (whole run)", load.received_count, "msg")
        add_cpu_metrics(result, gw, *window, load.window_acks)
    result.details["latency_samples"] = len(load.latencies)
    result.details["delivered_per_second_from_start"] = load.timeline


@register(
    "ndjson-pubsub",
    "ndjson publisher → gateway → acking subscriber: acked msg/s and publish→ack latency",
    arguments=arguments,
)
def run(args: argparse.Namespace) -> Result:
    return trio.run(_run, args)
