"""Micromessage2 end to end: publisher → gateway → acking subscriber, over real sockets.

One publisher connection and one subscriber connection to one micromessage
listener, both with ``batch-ack`` (``max-count`` = ``--window``, 100 by
default), both driven by the plugin's sans-IO ``ClientCodec``. The
publisher sends MESSAGE frames as fast as its window allows and reads the
gateway's cumulative acks; the subscriber subscribes and, after each read,
acks the last sequence number of that read's ``Messages`` batch (one ack
frame per read).

The destination decides how the two windows interact:

* by default a retained in-memory log (``retain = "256MiB"``): a publish
  settles once stored, so the publisher's window and the subscriber's
  window each run their own loop;
* ``--topic``: a plain in-memory topic: a publish settles only once the
  subscriber acked its delivery, so one loop spans both windows and the
  publisher's ack latency is the whole trip.

Figures: messages delivered per second (counted at the subscriber inside
the measured window), messages acked per second at the publisher, the
publisher's ack latency (from sending a frame to reading the ack that covers
it) and the gateway's CPU per delivered message.

Checks that keep the figures honest (any failure makes the run exit 1):
every ack must cover frames still outstanding; after the window publishing
stops, and within ``--drain-timeout`` every publish must be acked and every
published message received; then each message number must have been
received exactly once with its body intact, and no resend (``Duplicate``)
may have come.

MESSAGE frames are sent from byte templates, checked once against the
codec's own encoding (a codec pair that completed a handshake in memory),
so they are exactly what the codec would send. Since the publisher's codec
does not hold the frames the templates made, its ``Ack`` events settle
nothing in it: the publisher settles its own outstanding frames from each
ack's sequence number, cumulatively, as the codec's send window would.
Everything received is parsed by the codec, as a real client does; the
subscriber's acks go through its codec, whose receive window checks the
gateway's sequence numbers. Both clients propose a resend delay
(``expire-ms``) long enough that a healthy run never resends: the publisher
sends nothing twice, and a gateway resend shows up as a duplicate.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any, Final

import trio

from gateway.sdk import NEED_DATA
from protocols.micromessage.codec import ClientCodec, ServerCodec
from protocols.micromessage.commands import Subscribe
from protocols.micromessage.events import (
    SEQUENCE,
    Ack,
    Answered,
    Duplicate,
    Error,
    Established,
    Message,
    Messages,
    Offered,
)
from protocols.micromessage.frames import encode_frame
from protocols.micromessage.plugin import client_settings, server_settings

from . import Result, add_warmup, int_at_least, register
from ._gateway import RunningGateway, run_gateway
from ._ndjson import add_cpu_metrics, check_gateway, measure

DESTINATION: Final = "bench"
LISTENER: Final = "bench"
#: Each body starts with its message number in this many decimal digits.
SEQ_DIGITS: Final = 12
RECEIVE_SIZE: Final = 65536
#: The resend delay both clients propose (seconds): no resend in a healthy run.
ACK_EXPIRE: Final = 30.0
#: The largest ack window Micromessage2's sequence numbers allow.
MAX_WINDOW: Final = 32767


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        choices=("subprocess", "inprocess"),
        default="subprocess",
        help="run the gateway as `python -m gateway run` in its own process (default), "
        "or in this process's trio loop beside the load generator",
    )
    parser.add_argument(
        "--topic",
        action="store_true",
        help="publish to a plain in-memory topic (a publish settles once the subscriber "
        "acked it) instead of a retained in-memory log (settles once stored)",
    )
    parser.add_argument(
        "--window",
        type=_window,
        default=100,
        help="batch-ack max-count of both connections: MESSAGE frames unacked, at most "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--size",
        type=int_at_least(SEQ_DIGITS),
        default=256,
        help=f"message payload in bytes, at least {SEQ_DIGITS} (default: %(default)s)",
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
        help="seconds to wait, after the window, for every publish to be acked and "
        "received (default: %(default)g)",
    )


def _window(text: str) -> int:
    value = int_at_least(1)(text)
    if value > MAX_WINDOW:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_WINDOW}, not {value}")
    return value


def gateway_config(args: argparse.Namespace) -> dict[str, Any]:
    """One micromessage listener on a port the OS picks, publishing to ``bench``."""
    destination: dict[str, Any] = {"name": DESTINATION}
    if not args.topic:
        destination["retain"] = "256MiB"
    return {
        # Short drain: a clean run has nothing in flight at shutdown.
        "gateway": {"log_level": "info", "data_dir": "data", "drain_timeout": "2s"},
        "listeners": [
            {
                "name": LISTENER,
                "protocol": "micromessage",
                "bind": "127.0.0.1:0",
                "destination": DESTINATION,
                "max_window": args.window,
            }
        ],
        "destinations": [destination],
    }


def _client_codec(window: int, subscribes: bool) -> ClientCodec:
    options = {"identity": "bench", "ack_expire": ACK_EXPIRE, "window": window}
    return ClientCodec(client_settings(options, subscribes))


def seq_of(n: int) -> int:
    """The sequence number message ``n`` (from 1) carries: 1..65535, wrapping."""
    return (n - 1) % SEQUENCE.size + 1 if SEQUENCE.size is not None else n


class Templates:
    """Byte templates for the MESSAGE frames the publisher sends, checked against the codec."""

    def __init__(self, size: int, window: int) -> None:
        self.size = size
        self.padding = b"x" * (size - SEQ_DIGITS)
        self.number = b"%%0%dd" % SEQ_DIGITS
        first = encode_frame(Message(1, DESTINATION, "", self.body(1)))
        head = len(first) - size
        # [flags] [seq:u16] [the rest of the header: destination, properties, length]
        self.flags, self.rest = first[:1], first[3:head]
        codec = _in_memory_client(window)
        wire = codec.send(Message(codec.next_seq, DESTINATION, "", self.body(1)))
        if wire != self.messages(1, 1):
            raise AssertionError(f"template gives {self.messages(1, 1)!r}, not {wire!r}")
        for n in (2, 65535, 65536, 987_654_321):
            expected = encode_frame(Message(seq_of(n), DESTINATION, "", self.body(n)))
            if self.messages(n, 1) != expected:
                raise AssertionError(f"template for message {n} differs from the codec's frame")

    def body(self, n: int) -> bytes:
        return self.number % n + self.padding

    def messages(self, first: int, count: int) -> bytes:
        """The MESSAGE frames of messages ``first`` to ``first + count - 1``."""
        flags, rest, number, padding = self.flags, self.rest, self.number, self.padding
        return b"".join(
            [
                flags + seq_of(n).to_bytes(2, "big") + rest + number % n + padding
                for n in range(first, first + count)
            ]
        )


def _in_memory_client(window: int) -> ClientCodec:
    """A client codec past its handshake with a listener's codec, all in memory."""
    options = {
        "identity": "bench",
        "ack_expire": ACK_EXPIRE,
        "max_window": window,
        "require": [],
    }
    server = ServerCodec(server_settings(options))
    client = _client_codec(window, False)
    server.receive_data(client.send(client.offer))
    offered = server.next_event()
    assert isinstance(offered, Offered)
    client.receive_data(server.send(offered.answer))
    answered = client.next_event()
    assert isinstance(answered, Answered)
    server.receive_data(client.send(answered.final))
    assert isinstance(client.next_event(), Established)
    assert isinstance(server.next_event(), Established)
    return client


async def handshake(stream: trio.abc.Stream, codec: ClientCodec) -> None:
    """Offer, answer, final: the codec is then in its frames phase."""
    await stream.send_all(codec.send(codec.offer))
    while True:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            raise RuntimeError("the gateway closed the connection during the handshake")
        codec.receive_data(data)
        while (event := codec.next_event()) is not NEED_DATA:
            if isinstance(event, Answered):
                await stream.send_all(codec.send(event.final))
            elif isinstance(event, Established):
                return
            else:
                raise RuntimeError(f"unexpected event during the handshake: {event!r}")


class Load:
    """The publisher and subscriber tasks and what they counted."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.window: int = args.window
        self.templates = Templates(args.size, self.window)
        self.size: int = args.size
        self.sent = 0  # messages 1..sent went out
        self.acked = 0  # messages 1..acked are acked
        self.stopping = False
        self.closing = False
        #: Start and end of the measured window (perf_counter); nothing counts before t0.
        self.t0 = math.inf
        self.t1 = math.inf
        #: Send time of each message number (index 0 unused).
        self.send_times: list[float] = [0.0]
        #: Deliveries of each message number seen by the subscriber (capped at 255).
        self.received = bytearray(1)
        self.received_count = 0
        self.window_acks = 0
        self.window_delivered = 0
        self.duplicates = 0
        self.bad_bodies = 0
        self.ack_latencies: list[float] = []
        self.delivery_latencies: list[float] = []
        #: Messages delivered per second since the load started (warm-up included).
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

    def stop(self) -> None:
        """Publish nothing more (wakes the sender if it waits for room)."""
        self.stopping = True
        self._room.unpark_all()

    def done(self) -> bool:
        return self.acked == self.sent and self.received_count >= self.sent

    async def wait_answered(self) -> None:
        """Return once every publish is acked and every message was received."""
        while not self.done():
            await self._idle.park()

    # -- publisher ---------------------------------------------------------------
    async def send_messages(self, stream: trio.abc.SendStream) -> None:
        templates, send_times, received = self.templates, self.send_times, self.received
        perf_counter = time.perf_counter
        while not self.stopping:
            room = self.window - (self.sent - self.acked)
            if room <= 0:
                await self._room.park()
                continue
            data = templates.messages(self.sent + 1, room)
            self.sent += room
            received.extend(bytes(room))
            send_times.extend([perf_counter()] * room)
            await stream.send_all(data)

    async def read_acks(self, stream: trio.abc.ReceiveStream, codec: ClientCodec) -> None:
        perf_counter = time.perf_counter
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data and not self.closing:
                self.fail("the gateway closed the publisher's connection")
                return
            codec.receive_data(data)
            while (event := codec.next_event()) is not NEED_DATA:
                if type(event) is Ack:
                    if not self._settle(event.seq, perf_counter()):
                        return
                elif isinstance(event, Error):
                    self.fail(f"the gateway sent the publisher an ERROR: {event.message}")
                    return
                elif self.closing:
                    return  # ConnectionClosed at the end of the run
                else:
                    self.fail(f"unexpected event for the publisher: {event!r}")
                    return
            self._room.unpark_all()
            self._idle.unpark_all()

    def _settle(self, seq: int, now: float) -> bool:
        """Settle the outstanding messages an ack of ``seq`` covers (cumulative)."""
        outstanding = self.sent - self.acked
        count = SEQUENCE.distance(seq_of(self.acked + 1), seq) + 1
        if not 0 < count <= outstanding:
            self.fail(f"an ack of seq {seq} covers none of the {outstanding} frames outstanding")
            return False
        first, self.acked = self.acked + 1, self.acked + count
        if self.t0 <= now < self.t1:
            self.window_acks += count
            self.ack_latencies.extend([now - t for t in self.send_times[first : self.acked + 1]])
        return True

    # -- subscriber ----------------------------------------------------------------
    async def subscribe(
        self,
        stream: trio.abc.Stream,
        codec: ClientCodec,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        await stream.send_all(codec.send(Subscribe(DESTINATION)))
        task_status.started()
        perf_counter = time.perf_counter
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data and not self.closing:
                self.fail("the gateway closed the subscriber's connection")
                return
            codec.receive_data(data)
            last = 0
            now = perf_counter()
            while (event := codec.next_event()) is not NEED_DATA:
                if type(event) is Messages:
                    self._received(event.frames, now)
                    last = event.frames[-1].seq
                elif type(event) is Duplicate:
                    self.duplicates += 1
                elif isinstance(event, Error):
                    self.fail(f"the gateway sent the subscriber an ERROR: {event.message}")
                    return
                elif self.closing:
                    return  # ConnectionClosed at the end of the run
                else:
                    self.fail(f"unexpected event for the subscriber: {event!r}")
                    return
            if last:
                await stream.send_all(codec.send(Ack(last)))
                self._idle.unpark_all()

    def _received(self, frames: tuple[Message, ...], now: float) -> None:
        """Check and count one read's MESSAGE frames."""
        received, size, padding = self.received, self.size, self.templates.padding
        send_times, in_window = self.send_times, self.t0 <= now < self.t1
        latencies = self.delivery_latencies
        for frame in frames:
            body = frame.payload
            try:
                n = int(body[:SEQ_DIGITS])
            except ValueError:
                n = 0
            if (
                len(body) != size
                or not 0 < n < len(received)
                or body[SEQ_DIGITS:] != padding
                or frame.destination != DESTINATION
            ):
                self.bad_bodies += 1
                continue
            received[n] = min(received[n] + 1, 255)
            if in_window:
                latencies.append(now - send_times[n])
        self.received_count += len(frames)
        if in_window:
            self.window_delivered += len(frames)
        second = int(now - self.started)
        while len(self.timeline) <= second:
            self.timeline.append(0)
        self.timeline[second] += len(frames)

    # -- checks ------------------------------------------------------------------------
    def verify(self) -> None:
        """After draining: every message acked, and received exactly once, intact."""
        if self.acked != self.sent:
            self.problems.append(f"{self.sent - self.acked} publishes unacked after draining")
        if self.bad_bodies:
            self.problems.append(f"{self.bad_bodies} deliveries with a wrong body or destination")
        if self.duplicates:
            self.problems.append(f"{self.duplicates} MESSAGE frames came again (resends)")
        counts = bytes(self.received[1:])
        if counts != b"\x01" * self.sent:
            missing = counts.count(0)
            extra = len(counts) - missing - counts.count(1)
            self.problems.append(
                f"of {self.sent} messages published, {missing} were never received "
                f"and {extra} more than once"
            )
        if self.received_count != self.sent:
            self.problems.append(
                f"the subscriber received {self.received_count} messages, {self.sent} were sent"
            )


async def _run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "mode": args.mode,
            "destination": "topic" if args.topic else "log (retain 256MiB)",
            "window": args.window,
            "size": args.size,
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
    """Connect both clients, run the load for warm-up + window, drain, check, fill ``result``."""
    host, port = gw.address(LISTENER)
    sub_stream = await trio.open_tcp_stream(host, port)
    pub_stream = await trio.open_tcp_stream(host, port)
    async with sub_stream, pub_stream:
        sub_codec = _client_codec(args.window, True)
        pub_codec = _client_codec(args.window, False)
        await handshake(sub_stream, sub_codec)
        await handshake(pub_stream, pub_codec)

        async def start(nursery: trio.Nursery) -> None:
            await nursery.start(load.subscribe, sub_stream, sub_codec)
            # The subscription is in place once the gateway read the command: a
            # message published before would miss a topic subscriber.
            await trio.sleep(0.1)
            load.started = time.perf_counter()
            nursery.start_soon(load.read_acks, pub_stream, pub_codec)
            nursery.start_soon(load.send_messages, pub_stream)

        window = await measure(load, gw, args, start)
        if window is None:
            return  # stopped by a failure; the problem says why
        _add_metrics(load, gw, window, args, result)
    result.details["latency_samples"] = len(load.ack_latencies)
    result.details["delivered_per_second_from_start"] = load.timeline


def _add_metrics(
    load: Load,
    gw: RunningGateway,
    window: tuple[Any, Any],
    args: argparse.Namespace,
    result: Result,
) -> None:
    elapsed = load.t1 - load.t0
    rate = load.window_delivered / elapsed
    result.add("delivered end to end", rate, "msg/s")
    result.add("acked at the publisher", load.window_acks / elapsed, "msg/s")
    result.add("payload throughput", rate * args.size / 2**20, "MiB/s")
    result.add_latencies("ack latency", load.ack_latencies)
    result.add_latencies("publish to delivery", load.delivery_latencies)
    result.add("measured window", elapsed, "s")
    result.add("delivered in window", load.window_delivered, "msg")
    result.add("published (whole run)", load.sent, "msg")
    result.add("received by subscriber (whole run)", load.received_count, "msg")
    add_cpu_metrics(result, gw, *window, load.window_delivered)


@register(
    "micromessage",
    "Micromessage2 publisher → gateway → acking subscriber (batch-ack window): "
    "delivered msg/s and ack latency",
    arguments=arguments,
)
def run(args: argparse.Namespace) -> Result:
    return trio.run(_run, args)
