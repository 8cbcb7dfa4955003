"""ndjson request/reply: caller → gateway → service → gateway → caller.

A service connection subscribes to ``svc`` in the group ``svc-pool`` and
answers each call it is delivered (``{"op":"msg","call":true,…}``) with a
``reply`` whose body is the request's. A caller connection keeps
``--concurrency`` calls outstanding (a closed loop: each answer is followed
at once by a new call); the gateway routes each ``call`` to the service and
answers the caller with the service's ``reply``. Measured: completed calls
per second, the round-trip latency from writing a ``call`` line to parsing
its ``reply``, and the gateway's CPU time per call (subprocess mode).
``--concurrency 1`` measures one call's round trip; at the default 64 the
latency is mostly queueing (Little's law: about ``concurrency / rate``).

Self-checks (any failure makes the run exit 1): the service is known to the
gateway (a ``ping`` answered after its ``sub``) before the first call; every
delivery to the service is a call with a deadline, with an intact body, seen
once (no redelivery); every call id is answered exactly once, by a
``reply`` with code 0 whose body equals the request's (an ``ack`` saying the
call failed is a problem); after the window, every call is answered within
``--drain-timeout``, and the service replied to exactly the calls answered.

Lines are sent from byte templates checked against the plugin's codec and
everything received is parsed with it, as in ``ndjson-pubsub``.
"""

from __future__ import annotations

import argparse
import math
import time
from collections import Counter
from typing import Any

import trio
from interchange_ndjson.codec import NEED_DATA, ClientCodec
from interchange_ndjson.events import (
    Call,
    ConnectionClosed,
    Deliver,
    Error,
    Ping,
    Pong,
    Published,
    Replied,
    ReplyTo,
    Subscribe,
)

from . import Result, add_warmup, int_at_least, register
from ._gateway import RunningGateway, run_gateway
from ._ndjson import add_cpu_metrics, check_gateway, delivered, measure
from .ndjson_pubsub import (
    LISTENER,
    RECEIVE_SIZE,
    SEQ_DIGITS,
    gateway_config,
)

SERVICE = "svc"
GROUP = "svc-pool"


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        choices=("subprocess", "inprocess"),
        default="subprocess",
        help="run the gateway as `python -m gateway run` in its own process (default), "
        "or in this process's trio loop beside the load generator",
    )
    parser.add_argument(
        "--concurrency",
        type=int_at_least(1),
        default=64,
        help="calls sent and not yet answered, always (default: %(default)s)",
    )
    parser.add_argument(
        "--size",
        type=int_at_least(SEQ_DIGITS),
        default=200,
        help=f"request (and reply) body in bytes, at least {SEQ_DIGITS} (default: %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=int_at_least(1),
        default=1000,
        help="the service's window: calls it may hold unanswered (default: %(default)s)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=10.0,
        help="each call's timeout in seconds; one that expires fails the run "
        "(default: %(default)g)",
    )
    add_warmup(parser)
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for outstanding replies after the window (default: %(default)g)",
    )


class Templates:
    """Byte templates for the ``call`` and ``reply`` lines, checked against the codec."""

    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.padding = b"x" * (size - SEQ_DIGITS)
        self.seq = b"%%0%dd" % SEQ_DIGITS
        codec = ClientCodec()
        codec.send(Subscribe(SERVICE, GROUP))
        # The timeout as the codec writes it (5, not 5.0), cut out of a real line.
        timeout_json = codec.send(Call(b"", SERVICE, timeout=timeout)).rsplit(b":", 1)[1][:-2]
        self.call_head = b'{"op":"call","id":%d,"dest":"' + SERVICE.encode() + b'","body":"'
        self.call_tail = self.padding + b'","timeout":' + timeout_json + b"}\n"
        #: ``% (tag, body)``; bodies are digits and ``x``, which JSON takes as they are.
        self.reply = b'{"op":"reply","tag":%d,"body":"%s"}\n'
        #: ``% tag``: the answer to a delivery that is not what was called.
        self.failed = b'{"op":"reply","tag":%d,"code":13}\n'
        for n in (1, 987_654_321):
            expected = codec.send(Call(self.body(n), SERVICE, {}, None, n, timeout))
            if self.calls([n]) != expected:
                raise AssertionError(f"call template gives {self.calls([n])!r}, not {expected!r}")
            delivered(codec, n, SERVICE, call=True)  # the codec replies only to a call
            if self.reply % (n, self.body(n)) != codec.send(ReplyTo(n, self.body(n))):
                raise AssertionError("reply template differs from the codec's reply line")
            delivered(codec, n, SERVICE, call=True)
            if self.failed % n != codec.send(ReplyTo(n, code=13)):
                raise AssertionError("failed-reply template differs from the codec's line")

    def body(self, n: int) -> bytes:
        return self.seq % n + self.padding

    def calls(self, numbers: list[int] | range) -> bytes:
        """The ``call`` lines of the calls ``numbers`` (the body starts with the number)."""
        head, seq, tail = self.call_head, self.seq, self.call_tail
        return b"".join([head % n + seq % n + tail for n in numbers])


class Load:
    """The caller and service tasks and what they counted."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.templates = Templates(args.size, args.timeout)
        self.size: int = args.size
        self.concurrency: int = args.concurrency
        self.window: int = args.window
        self.timeout: float = args.timeout
        self.next_id = 1
        self.outstanding = 0
        self.stopping = False
        self.closing = False
        #: Start and end of the measured window (perf_counter); nothing counts before t0.
        self.t0 = math.inf
        self.t1 = math.inf
        # Indexed by call number (index 0 unused).
        self.send_times: list[float] = [0.0]
        #: 0 unanswered, 1 replied with the request's body, 2 answered otherwise.
        self.answered = bytearray(1)
        #: Times the service was delivered each call (capped at 255).
        self.served = bytearray(1)
        self.calls_sent = 0
        self.replied = 0
        self.failed: Counter[str] = Counter()
        self.served_count = 0
        self.duplicates = 0
        self.bad_deliveries = 0
        self.window_replies = 0
        self.latencies: list[float] = []
        self.problems: list[str] = []
        self._idle = trio.lowlevel.ParkingLot()
        self.scope = trio.CancelScope()

    def fail(self, problem: str) -> None:
        """Record a problem that makes the rest of the run meaningless, and stop it."""
        self.problems.append(problem)
        self.scope.cancel()

    # -- caller --------------------------------------------------------------------
    async def send_calls(self, stream: trio.abc.SendStream, count: int) -> None:
        """Write ``count`` new calls (none once stopping)."""
        if self.stopping or count <= 0:
            return
        first = self.next_id
        self.next_id += count
        self.answered.extend(bytes(count))
        self.served.extend(bytes(count))
        self.outstanding += count
        self.calls_sent += count
        self.send_times.extend([time.perf_counter()] * count)
        await stream.send_all(self.templates.calls(range(first, first + count)))

    async def call(self, stream: trio.abc.Stream) -> None:
        """Keep ``concurrency`` calls outstanding: send them, and one more per answer."""
        await self.send_calls(stream, self.concurrency)
        codec = ClientCodec()
        answered, send_times, latencies = self.answered, self.send_times, self.latencies
        body = self.templates.body
        perf_counter = time.perf_counter
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data and not self.closing:
                self.fail("the gateway closed the caller's connection")
                return
            codec.receive_data(data)
            settled = 0
            while (event := codec.next_event()) is not NEED_DATA:
                now = perf_counter()
                if type(event) is Replied or type(event) is Published:
                    n = event.id
                    if type(n) is not int or not 0 < n < len(answered) or answered[n]:
                        self.fail(f"answer for an unknown or already answered call: {event!r}")
                        return
                    settled += 1
                    if type(event) is Replied and event.code == 0 and event.body == body(n):
                        answered[n] = 1
                        self.replied += 1
                        if self.t0 <= now < self.t1:
                            self.window_replies += 1
                            latencies.append(now - send_times[n])
                    else:
                        answered[n] = 2
                        self.failed[_why(event)] += 1
                elif isinstance(event, Error):
                    self.fail(f"the gateway reported an error to the caller: {event.message}")
                    return
                elif isinstance(event, ConnectionClosed):
                    return
                else:
                    self.fail(f"unexpected line for the caller: {event!r}")
                    return
            if settled:
                self.outstanding -= settled
                if self.outstanding == 0:
                    self._idle.unpark_all()
                await self.send_calls(stream, settled)

    def stop(self) -> None:
        """Send no new calls from now on."""
        self.stopping = True

    async def wait_answered(self) -> None:
        while self.outstanding:
            await self._idle.park()

    # -- service -------------------------------------------------------------------
    async def serve(
        self,
        stream: trio.abc.Stream,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Subscribe to the service; reply to each call with its body.

        Started once the gateway answered a ``ping`` sent after the ``sub``: the
        connection's lines are handled in order, so the subscription exists by then.
        """
        codec = ClientCodec()
        sub = Subscribe(SERVICE, GROUP, None, self.window)
        # Replies go out as templates, so the codec that parses the deliveries must not
        # hold the subscription: it would count each delivery as unsettled.
        sender = ClientCodec()
        await stream.send_all(sender.send(sub) + sender.send(Ping()))
        started = False
        reply, failed, served, size = (
            self.templates.reply,
            self.templates.failed,
            self.served,
            self.size,
        )
        padding, timeout = self.templates.padding, self.timeout
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data and not self.closing:
                self.fail("the gateway closed the service's connection")
                return
            codec.receive_data(data)
            replies = []
            while (event := codec.next_event()) is not NEED_DATA:
                if type(event) is Deliver:
                    body = event.body
                    try:
                        n = int(body[:SEQ_DIGITS])
                    except ValueError:
                        n = 0
                    if (
                        len(body) != size
                        or not 0 < n < len(served)
                        or body[SEQ_DIGITS:] != padding
                        or event.destination != SERVICE
                        or not event.call
                        or event.reply_within is None
                        or event.reply_within > timeout
                        or event.redelivered
                    ):
                        # Answered anyway (code 13, no body), so nothing waits for it.
                        self.bad_deliveries += 1
                        replies.append(failed % event.tag)
                        continue
                    replies.append(reply % (event.tag, body))
                    if served[n]:
                        self.duplicates += 1
                    served[n] = min(served[n] + 1, 255)
                elif isinstance(event, Pong) and not started:
                    started = True
                    task_status.started()
                elif isinstance(event, Error):
                    self.fail(f"the gateway reported an error to the service: {event.message}")
                    return
                elif isinstance(event, ConnectionClosed):
                    return
                else:
                    self.fail(f"unexpected line for the service: {event!r}")
                    return
            if replies:
                self.served_count += len(replies)
                await stream.send_all(b"".join(replies))

    # -- checks --------------------------------------------------------------------
    def verify(self) -> None:
        """After draining: each call replied to once, with its body, by one service reply."""
        if self.outstanding:
            self.problems.append(f"{self.outstanding} calls still unanswered after draining")
        if self.failed:
            self.problems.append(f"calls not answered with their body: {dict(self.failed)}")
        if self.bad_deliveries:
            self.problems.append(
                f"{self.bad_deliveries} deliveries to the service were not an intact, "
                "first-time call with a deadline"
            )
        if self.duplicates:
            self.problems.append(f"{self.duplicates} calls were delivered to the service again")
        if self.served_count != self.replied:
            self.problems.append(
                f"the service answered {self.served_count} calls but the caller got "
                f"{self.replied} replies"
            )
        was_replied = bytes(self.answered).translate(_ONE_ONLY)
        was_served = bytes(self.served).translate(_NONZERO)
        if was_replied != was_served:
            self.problems.append("the calls replied to are not the calls the service answered")


_ONE_ONLY = bytes(1 if i == 1 else 0 for i in range(256))
_NONZERO = bytes(1 if i else 0 for i in range(256))


def _why(event: Replied | Published) -> str:
    """Why an answer does not count as a reply: a failed call, an error, another body."""
    if isinstance(event, Published):
        return f"{event.status}: {event.reason}"
    if event.code:
        return f"reply code {event.code}: {event.error}"
    return "reply body differs from the request's"


def _config(args: argparse.Namespace) -> dict[str, Any]:
    """``ndjson-pubsub``'s gateway: its listener admits ``--concurrency`` calls."""
    return gateway_config(argparse.Namespace(inflight=args.concurrency))


async def _run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "mode": args.mode,
            "concurrency": args.concurrency,
            "size": args.size,
            "window": args.window,
            "timeout": args.timeout,
            "seconds": args.seconds,
            "warmup": args.warmup,
        }
    )
    load = Load(args)
    config = _config(args)
    result.details["gateway_config"] = config
    async with run_gateway(config, args.mode) as gw:
        await _drive(load, gw, args, result)
    check_gateway(gw, result, load.problems)
    result.problems = load.problems
    return result


async def _drive(load: Load, gw: RunningGateway, args: argparse.Namespace, result: Result) -> None:
    """Run the calls for warm-up + window, drain, check, and fill ``result``."""
    host, port = gw.address(LISTENER)
    service = await trio.open_tcp_stream(host, port)
    caller = await trio.open_tcp_stream(host, port)
    async with service, caller:

        async def start(nursery: trio.Nursery) -> None:
            await nursery.start(load.serve, service)
            nursery.start_soon(load.call, caller)

        window = await measure(load, gw, args, start)
        if window is None:
            return  # stopped by a failure; the problem says why

        elapsed = load.t1 - load.t0
        result.add("calls replied", load.window_replies / elapsed, "calls/s")
        result.add_latencies("round trip", load.latencies)
        result.add("measured window", elapsed, "s")
        result.add("replied in window", load.window_replies, "calls")
        result.add("calls (whole run)", load.calls_sent, "calls")
        result.add("answered by the service (whole run)", load.served_count, "calls")
        add_cpu_metrics(result, gw, *window, load.window_replies, per="call")
    result.details["latency_samples"] = len(load.latencies)


@register(
    "ndjson-calls",
    "ndjson call → gateway → service reply → caller: calls/s and round-trip latency",
    arguments=_arguments,
)
def run(args: argparse.Namespace) -> Result:
    return trio.run(_run, args)
