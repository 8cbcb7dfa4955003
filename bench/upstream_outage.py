"""How fast traffic resumes after the upstream's server comes back from an outage.

``upstream-outage``: a Lumberjack sender → a gateway (``python -m gateway
run``: a Lumberjack listener, the route ``logs`` → ``upstream:sink``, a
Lumberjack upstream) → a Lumberjack *sink* in the benchmark process
(:class:`bench._sink.KillableSink`, which the fault suite uses too; it
records each event, then lets its window be acked).

Once traffic has flowed for ``--seconds``, the sink is killed abruptly: its
listening socket is closed and its connections are reset, windows read and
not acked included. It stays down for ``--outage`` seconds and is started
again on the same port. Meanwhile the sender's windows wait in the gateway
(the listener sends keepalives; nothing is acked while the sink is down), and
the upstream retries with its backoff (``backoff_initial``, doubling up to
``backoff_max``; the defaults are 0.5 s and 5 s). The benchmark reports the
time from the restart to the first event the sink receives (the upstream's
reconnect) and to the first event acked to the sender, then lets traffic run
``--seconds`` more.

Self-checks (any failure makes the run exit 1): every event acked to the
sender reached the sink (numbered events; duplicates are allowed, as the
windows the sink held at the kill are resent); nothing was acked while the
sink was down; traffic resumed within ``--recovery-timeout``; the sender's
connection survived the outage; every window was acked once sending stopped;
the gateway exited with status 0 and logged no warning other than the
upstream's own reconnect warnings.
"""

from __future__ import annotations

import argparse
import math
import re
from collections import deque
from typing import Any

import trio

from protocols.lumberjack import NEED_DATA, ClientCodec, ConnectionClosed, Progress

from . import Result, int_at_least, register
from ._gateway import RunningGateway, run_gateway
from ._sink import KillableSink

LISTENER = "beats"
DESTINATION = "logs"
UPSTREAM = "sink"
RECEIVE_SIZE = 65536
#: Acks already on their way when the sink died may still arrive for this long.
ACK_GRACE = 0.5
#: The upstream's warnings an outage is expected to cause.
_EXPECTED_WARNINGS = re.compile(rf"\[upstream {UPSTREAM}\] (cannot connect|connection to \S+ lost)")
_CANNOT_CONNECT = re.compile(rf"\[upstream {UPSTREAM}\] cannot connect")


def make_event(n: int, size: int) -> bytes:
    """Event ``n``: a JSON object of ``size`` bytes or a little more, with ``@metadata``
    (so the upstream forwards it byte for byte)."""
    head = b'{"n":%d,"@metadata":{"beat":"bench","type":"_doc"},"message":"' % n
    return head + b"m" * max(0, size - len(head) - 2) + b'"}'


def event_number(payload: bytes) -> int:
    return int(payload[5 : payload.index(b",")])


class Sender:
    """One Lumberjack connection: numbered windows out, at most ``inflight`` unacked."""

    def __init__(self, events: int, size: int, inflight: int, level: int) -> None:
        self.events, self.size, self.limit, self.level = events, size, inflight, level
        self.codec = ClientCodec(version=2)
        self.next_n = 0
        #: The numbers of each window in flight, oldest first.
        self.inflight: deque[list[int]] = deque()
        self.acked: list[int] = []
        #: ``(trio time, events acked)`` of every ack that acked something.
        self.acks: list[tuple[float, int]] = []
        self.keepalives = 0
        self.stopping = False
        self.closed_by_gateway = False
        self._room = trio.lowlevel.ParkingLot()
        self._acked = trio.lowlevel.ParkingLot()

    def first_ack_after(self, t: float) -> float:
        return next((at for at, _ in self.acks if at >= t), math.nan)

    def acked_between(self, t0: float, t1: float) -> int:
        return sum(n for at, n in self.acks if t0 <= at < t1)

    async def wait_ack_after(self, t: float) -> None:
        """Wait for an ack (one that acks events) at trio time ``t`` or later."""
        while not (self.acks and self.acks[-1][0] >= t):
            await self._acked.park()

    def stop(self) -> None:
        self.stopping = True
        self._room.unpark_all()

    async def run(self, stream: trio.abc.Stream) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send, stream)
            await self._read(stream)
            nursery.cancel_scope.cancel()

    async def wait_acked(self) -> None:
        while self.inflight:
            await self._room.park()

    async def _send(self, stream: trio.abc.SendStream) -> None:
        while not self.stopping:
            if len(self.inflight) >= self.limit:
                await self._room.park()
                continue
            numbers = list(range(self.next_n, self.next_n + self.events))
            self.next_n += self.events
            payloads = [make_event(n, self.size) for n in numbers]
            self.inflight.append(numbers)
            await stream.send_all(self.codec.send_window(payloads, compression_level=self.level))

    async def _read(self, stream: trio.abc.ReceiveStream) -> None:
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            now = trio.current_time()
            self.codec.receive_data(data)
            while (event := self.codec.next_event()) is not NEED_DATA:
                if isinstance(event, ConnectionClosed):
                    self.closed_by_gateway = True
                    return
                assert isinstance(event, Progress)
                if not event.acked:
                    self.keepalives += 1
                    continue
                self.acked += self.inflight[0][event.seq - event.acked : event.seq]
                self.acks.append((now, event.acked))
                self._acked.unpark_all()
                if event.window_done:
                    self.inflight.popleft()
                    self._room.unpark_all()


def _config(args: argparse.Namespace, sink_port: int) -> dict[str, Any]:
    upstream: dict[str, Any] = {
        "name": UPSTREAM,
        "protocol": "lumberjack",
        "connect": [f"127.0.0.1:{sink_port}"],
    }
    if args.backoff_initial is not None:
        upstream["backoff_initial"] = args.backoff_initial
    if args.backoff_max is not None:
        upstream["backoff_max"] = args.backoff_max
    return {
        "gateway": {"log_level": "info", "drain_timeout": "2s"},
        "listeners": [
            {
                "name": LISTENER,
                "protocol": "lumberjack",
                "bind": "127.0.0.1:0",
                "destination": DESTINATION,
            }
        ],
        "upstreams": [upstream],
        "routes": [{"from": DESTINATION, "to": [f"upstream:{UPSTREAM}"]}],
    }


async def _run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "mode": args.mode,
            "outage": args.outage,
            "seconds": args.seconds,
            "events": args.events,
            "size": args.size,
            "inflight": args.inflight,
            "level": args.level,
            "backoff_initial": args.backoff_initial or "default (0.5s)",
            "backoff_max": args.backoff_max or "default (5s)",
        }
    )
    problems = result.problems
    sender = Sender(args.events, args.size, args.inflight, args.level)
    t: dict[str, float] = {}
    gw: RunningGateway | None = None
    async with trio.open_nursery() as nursery:
        sink = KillableSink(nursery, number=event_number)
        await sink.start()
        config = _config(args, sink.port)
        result.details["gateway_config"] = config
        async with run_gateway(config, args.mode) as gw:
            stream = await trio.open_tcp_stream(*gw.address(LISTENER))
            try:
                async with trio.open_nursery() as sending:
                    sending.start_soon(sender.run, stream)
                    with trio.move_on_after(args.recovery_timeout) as waited:
                        await sender.wait_ack_after(-math.inf)
                    if waited.cancelled_caught:
                        problems.append("no event was acked before the outage")
                        sending.cancel_scope.cancel()
                        return result
                    t["flowing"] = trio.current_time()
                    await trio.sleep(args.seconds)
                    t["kill"] = trio.current_time()
                    await sink.kill()
                    await trio.sleep(args.outage)
                    t["restart"] = trio.current_time()
                    await sink.start()
                    with trio.move_on_after(args.recovery_timeout):
                        await sink.wait_first_event()
                        await sender.wait_ack_after(t["restart"])
                    t["recovered"] = trio.current_time()
                    await trio.sleep(args.seconds)
                    t["stop"] = trio.current_time()
                    sender.stop()
                    with trio.move_on_after(args.recovery_timeout):
                        await sender.wait_acked()
                    sending.cancel_scope.cancel()
            finally:
                await trio.aclose_forcefully(stream)
        await sink.kill()

    first_event = (math.nan if sink.first_event_at is None else sink.first_event_at) - t["restart"]
    first_ack = sender.first_ack_after(t["restart"]) - t["restart"]
    received = set(sink.received)
    lost = sum(1 for n in sender.acked if n not in received)
    during = sender.acked_between(t["kill"] + ACK_GRACE, t["restart"])
    before = sender.acked_between(t["flowing"], t["kill"])
    after = sender.acked_between(t["recovered"], t["stop"])
    retries = sum(1 for line in gw.log if _CANNOT_CONNECT.search(line))

    result.add("outage", t["restart"] - t["kill"], "s")
    result.add("restart → first event at the sink", first_event, "s")
    result.add("restart → first event acked to the sender", first_ack, "s")
    result.add("acked events/s before the outage", before / (t["kill"] - t["flowing"]), "events/s")
    result.add("acked events/s after recovery", after / (t["stop"] - t["recovered"]), "events/s")
    result.add("acked while the sink was down", during, "events")
    if args.mode == "subprocess":  # counted from the gateway's log
        result.add("upstream connect attempts refused", retries)
    result.add("events acked (whole run)", len(sender.acked), "events")
    result.add("events received at the sink", len(sink.received), "events")
    result.add("duplicates at the sink", len(sink.received) - len(received), "events")
    result.add("acked but not received (lost)", lost, "events")
    result.add("keepalive acks (A 0)", sender.keepalives)
    result.details["sink_connections"] = sink.connections
    result.details["timeline_s"] = {k: round(v - t["flowing"], 3) for k, v in t.items()}

    if lost:
        problems.append(f"{lost} events acked to the sender never reached the sink")
    if during:
        problems.append(f"{during} events were acked while the sink was down")
    if math.isnan(first_ack):
        problems.append(f"no event acked within {args.recovery_timeout:g}s of the restart")
    if sender.closed_by_gateway:
        problems.append("the gateway closed the sender's connection")
    if sender.inflight:
        problems.append(f"{len(sender.inflight)} windows still unacked after sending stopped")
    if gw.returncode != 0:
        problems.append(f"the gateway exited with status {gw.returncode}")
    unexpected = [line for line in gw.problems_logged() if not _EXPECTED_WARNINGS.search(line)]
    if unexpected:
        result.details["gateway_warnings"] = unexpected[-20:]
        problems.append(f"the gateway logged {len(unexpected)} unexpected warnings (see JSON)")
    result.details["upstream_log"] = [line for line in gw.log if f"[upstream {UPSTREAM}]" in line][
        -30:
    ]
    return result


def _seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--outage",
        type=_seconds,
        default=20.0,
        help="seconds the sink stays down (default: %(default)g)",
    )
    parser.add_argument(
        "--mode",
        choices=("subprocess", "inprocess"),
        default="subprocess",
        help="the gateway as `python -m gateway run` (default) or in this trio loop",
    )
    parser.add_argument(
        "--backoff-initial",
        metavar="DURATION",
        help="the upstream's backoff_initial, e.g. 0.5s (default: the gateway's default)",
    )
    parser.add_argument(
        "--backoff-max",
        metavar="DURATION",
        help="the upstream's backoff_max, e.g. 5s (default: the gateway's default)",
    )
    parser.add_argument(
        "--events",
        type=int_at_least(1),
        default=500,
        help="events per window (default: %(default)s)",
    )
    parser.add_argument(
        "--size",
        type=int_at_least(64),
        default=200,
        help="bytes of JSON per event (default: %(default)s)",
    )
    parser.add_argument(
        "--inflight",
        type=int_at_least(1),
        default=2,
        help="windows sent and not yet acked (default: %(default)s)",
    )
    parser.add_argument(
        "--level",
        type=int,
        choices=range(10),
        default=3,
        metavar="0-9",
        help="zlib level of the sender's windows (default: %(default)s)",
    )
    parser.add_argument(
        "--recovery-timeout",
        type=_seconds,
        default=30.0,
        help="how long to wait for traffic, before and after the outage (default: %(default)g)",
    )


@register(
    "upstream-outage",
    "Lumberjack sender → gateway → upstream sink that dies for --outage s: time to recover",
    arguments=_arguments,
    default_seconds=3.0,
)
def run(args: argparse.Namespace) -> Result:
    return trio.run(_run, args)
