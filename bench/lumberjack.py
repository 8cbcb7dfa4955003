"""Lumberjack v2 (Beats) listener throughput: replayed windows → gateway → acking consumer.

Two benchmarks, both driven by a *replay client* in the benchmark process:

``lumberjack``
    One gateway with one Lumberjack listener on ``127.0.0.1:0`` whose
    destination (``logs``, an in-memory topic) has one consuming subscriber
    that acks everything it receives. The gateway and that consumer run in
    one process of their own, started as ``python -m bench.lumberjack serve
    CONFIG``: a :class:`~gateway.runtime.gateway.Gateway` built from the TOML file, plus
    a trio task that does ``hub.subscribe("logs")``, ``await sub.receive()``
    and ``sub.ack_many(tags)`` in a loop, counting what it got. A window is
    acked to the replay client only once the consumer has acked all of its
    events, so the rate of full acks is the rate of events that made the
    whole trip. ``--mode inprocess`` runs gateway and consumer in the
    benchmark's own trio loop instead (gateway, consumer and replay share
    one core).

``lumberjack-relay``
    Gateway A (``python -m gateway run``: Lumberjack listener, route ``logs``
    → ``upstream:b``, a Lumberjack upstream) in front of gateway B (the sink
    above). A acks the replay client only once B acked the relayed window,
    and B only once its consumer acked, so the figure is end-to-end.
    ``--workers N`` runs A as ``gateway run --workers N`` (a supervisor and N
    worker processes on one listening socket; A's CPU is their sum, and each
    worker's share is reported); the load starts once every worker serves.
    ``--direct`` then replays the same load straight to B for as long, and
    reports the relay's rate as a share of that (``relay / direct``).

The replay client does what the reference measurements of go-lumber and an
asyncio reference server did:
one Beats-shaped window, ``2W n`` + one ``2C`` (zlib, ``--level``) of ``n``
``2J`` events of exactly ``--size`` bytes of JSON, is encoded once with
:func:`~protocols.lumberjack.encode_window` and sent again and again, with at
most ``--inflight`` windows unacked per connection. Acks are parsed with
:class:`~protocols.lumberjack.ClientCodec`, which matches them to the windows
in flight: ``A 0`` (a keepalive) is counted and ignored, a partial ack counts
the events it covers, and a window counts as done when its last sequence
number is acked. The ack latency of a window is the time from just before
its bytes are handed to the socket to the moment the ack covering its last
event is parsed.

Self-checks (any failure makes the run exit 1): every ack must match a
window in flight and stay within it; after the measured window sending stops
and every window must be acked within ``--drain-timeout``; after the
gateways exit, the events the consumer received must equal the events acked
to the replay client (more only if the relay reconnected, which is
reported), with every body of the expected size and content type and none
redelivered; every gateway must exit with status 0 and log no warning.

CPU: each gateway process's user + system time in the measured window from
``/proc/<pid>/stat``, per event and as a share of a core; the rest of the
machine's load from ``/proc/stat``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import operator
import random
import re
import signal
import ssl
import sys
import tempfile
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from gateway.core.errors import RemoteProtocolError
from protocols.lumberjack import NEED_DATA, ClientCodec, ConnectionClosed, Progress, encode_window

from . import Result, add_warmup, int_at_least, register
from ._gateway import START_TIMEOUT, RunningGateway, peak_rss_mib, supervise, to_toml
from ._process import cpu_times
from ._system import busy_seconds

#: The repository root: where ``python -m bench.lumberjack`` finds the package.
ROOT = Path(__file__).resolve().parent.parent
LISTENER = "beats"
DESTINATION = "logs"
UPSTREAM = "b"
RECEIVE_SIZE = 65536
#: Smallest event ``--size``: ``{"message":""}`` plus a little text.
MIN_SIZE = 16
#: The listener's default ``max_window``; raised when ``--events`` is larger.
LISTENER_MAX_WINDOW = 10_000
#: The line the consumer logs when the sink gateway exits.
_CONSUMED = re.compile(
    r"bench\.consumer: consumed (\d+) events, (\d+) bytes, (\d+) bad, (\d+) redelivered, "
    r"(\d+) batches, busy ([0-9.]+)s"
)
_UPSTREAM_CONNECTED = re.compile(rf"\[upstream {UPSTREAM}\] connected to ")


# -- the events ------------------------------------------------------------------------

_VOCABULARY = (
    "GET POST PUT DELETE /api/v1/items /api/v1/users /static/app.js /healthz /login "
    "200 201 204 301 404 500 503 HTTP/1.1 HTTP/2.0 ms bytes upstream cache hit miss "
    "session user agent Mozilla/5.0 curl/8.5 request served from backend pool timeout "
    "retry connection reset accepted queued worker shard replica primary index"
)
_WORDS = _VOCABULARY.split()


def make_events(count: int, size: int, seed: int = 5044) -> list[bytes]:
    """``count`` distinct Filebeat-like JSON objects of exactly ``size`` bytes each.

    Deterministic (seeded), so every run compresses alike: the fields Beats
    adds and an access-log ``message`` (a random request id, then words from a
    small vocabulary and numbers). A window of 2048 such 200-byte events is
    430 080 bytes of frames, 88 710 on the wire at zlib level 3 (4.8 times
    smaller; the reference figures' generator made 4.3).
    """
    if size < MIN_SIZE:
        raise ValueError(f"an event needs at least {MIN_SIZE} bytes, not {size}")
    rng = random.Random(seed)
    out = []
    for i in range(count):
        head = (
            f'{{"@timestamp":"2026-11-22T04:{i // 3600 % 60:02d}:{i // 60 % 60:02d}.'
            f'{i % 1000:03d}Z","@metadata":{{"beat":"filebeat","type":"_doc"}},'
            f'"host":{{"name":"web-{rng.randrange(16):02d}"}},'
            f'"log":{{"offset":{rng.randrange(10**7)}}},"message":"'
        )
        if len(head) + 2 > size:
            head = '{"message":"'
        room = size - len(head) - 2
        words = [f"id={rng.getrandbits(64):016x}"]
        length = len(words[0])
        while length < room:
            word = rng.choice(_WORDS) if rng.random() < 0.6 else str(rng.randrange(100_000))
            words.append(word)
            length += 1 + len(word)
        event = (head + " ".join(words)[:room] + '"}').encode("ascii")
        assert len(event) == size, (len(event), size)
        out.append(event)
    return out


# -- the consumer (runs in the sink gateway's process) -----------------------------------


JSON = "application/json"
_JSON_ONLY = {JSON}
# Fields of gateway.core.destination.Delivery and gateway.core.model.Message (named tuples).
_TAG = operator.itemgetter(0)
_MESSAGE = operator.itemgetter(1)
_REDELIVERED = operator.itemgetter(2)
_BODY = operator.attrgetter("body")
_CONTENT_TYPE = operator.attrgetter("content_type")


class Consumer:
    """The in-memory destination's subscriber: receive, count, ack every batch at once."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.consumed = 0
        self.bytes = 0
        #: Deliveries whose body is not ``size`` bytes of JSON.
        self.bad = 0
        self.redelivered = 0
        self.batches = 0
        #: Wall time spent between ``receive`` returning and the acks (the consumer's work).
        self.busy = 0.0

    async def run(self, hub: Any, destination: str, max_unacked: int) -> None:
        """Consume ``destination`` until the hub closes."""
        with hub.subscribe(destination, max_unacked=max_unacked) as sub:
            await self.consume(sub)

    async def consume(self, sub: Any) -> None:
        size, perf_counter = self.size, time.perf_counter
        while True:
            try:
                deliveries = await sub.receive()
            except trio.ClosedResourceError:
                return
            started = perf_counter()
            # Checked and counted with C-level loops (map), so that the consumer,
            # which is part of the gateway process here, costs as little as it can.
            messages = list(map(_MESSAGE, deliveries))
            lengths = list(map(len, map(_BODY, messages)))
            nbytes = sum(lengths)
            if (
                min(lengths) != size
                or max(lengths) != size
                or set(map(_CONTENT_TYPE, messages)) != _JSON_ONLY
            ):
                self.bad += sum(
                    1
                    for n, m in zip(lengths, messages, strict=True)
                    if n != size or m.content_type != JSON
                )
            redelivered = sum(map(_REDELIVERED, deliveries))
            tags = list(map(_TAG, deliveries))
            sub.ack_many(tags)
            self.consumed += len(tags)
            self.bytes += nbytes
            self.redelivered += redelivered
            self.batches += 1
            self.busy += perf_counter() - started

    def summary(self) -> str:
        """The line :data:`_CONSUMED` parses."""
        return (
            f"consumed {self.consumed} events, {self.bytes} bytes, {self.bad} bad, "
            f"{self.redelivered} redelivered, {self.batches} batches, busy {self.busy:.3f}s"
        )

    def stats(self) -> dict[str, Any]:
        return {
            "consumed": self.consumed,
            "bytes": self.bytes,
            "bad": self.bad,
            "redelivered": self.redelivered,
            "batches": self.batches,
            "busy_s": self.busy,
        }


def _parse_consumed(lines: Sequence[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        m = _CONSUMED.search(line)
        if m:
            keys = ("consumed", "bytes", "bad", "redelivered", "batches")
            stats: dict[str, Any] = {k: int(v) for k, v in zip(keys, m.groups(), strict=False)}
            stats["busy_s"] = float(m.group(6))
            return stats
    return None


def serve_main(argv: Sequence[str]) -> int:
    """``python -m bench.lumberjack serve CONFIG``: a gateway plus an acking consumer.

    Logs like ``python -m gateway run`` (so the ``serving:`` line gives the
    addresses), drains and stops on SIGTERM or SIGINT, and logs the
    consumer's counts as its last line.
    """
    from gateway.config.loader import ConfigError, load

    parser = argparse.ArgumentParser(prog="python -m bench.lumberjack serve")
    parser.add_argument("config", help="the gateway's TOML config")
    parser.add_argument("--destination", default=DESTINATION, help="what to consume")
    parser.add_argument("--max-unacked", type=int, default=8192, help="the consumer's window")
    parser.add_argument("--size", type=int, default=200, help="the expected body size")
    args = parser.parse_args(argv)
    try:
        config = load(args.config)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1
    logging.basicConfig(
        level=getattr(logging, config.gateway.log_level.upper()),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    consumer = Consumer(args.size)
    from gateway.runtime.collector import tune_collector

    tune_collector()  # as `gateway run` does
    trio.run(_serve, config, consumer, args.destination, args.max_unacked)
    logging.getLogger("bench.consumer").info("%s", consumer.summary())
    return 0


async def _serve(config: Any, consumer: Consumer, destination: str, max_unacked: int) -> None:
    from gateway.runtime.gateway import Gateway

    gateway = Gateway(config)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, gateway, nursery.cancel_scope)
        nursery.start_soon(consumer.run, gateway.hub, destination, max_unacked)
        await gateway.run()
        nursery.cancel_scope.cancel()


async def _watch_signals(gateway: Any, scope: trio.CancelScope) -> None:
    """First SIGTERM/SIGINT: drain and stop (as ``gateway run``); a second: stop now."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for _ in signals:
            if gateway.draining.is_set():
                scope.cancel()
                return
            gateway.shutdown()


# -- starting the sink gateway --------------------------------------------------------------


@dataclass
class Sink:
    """A running sink gateway and, once it stopped, what its consumer counted."""

    running: RunningGateway
    consumer: Consumer | None = None
    stats: dict[str, Any] | None = None


@contextlib.asynccontextmanager
async def start_sink(
    config: Mapping[str, Any],
    mode: str,
    tmp: Path,
    *,
    size: int,
    max_unacked: int,
    profile: Path | None = None,
) -> AsyncIterator[Sink]:
    """Run a gateway with ``config`` plus a consumer of ``logs`` for the body of the block.

    ``subprocess``: ``python -m bench.lumberjack serve`` (optionally under
    cProfile); ``inprocess``: in this trio loop. ``sink.stats`` is filled on
    the way out, once the gateway has drained and stopped.
    """
    if mode == "inprocess":
        async with _inprocess_sink(config, tmp, size, max_unacked) as sink:
            yield sink
        return
    command = ["-m", "bench.lumberjack", "serve", "{config}"]
    command += ["--size", str(size), "--max-unacked", str(max_unacked)]
    sink = Sink(RunningGateway("subprocess"))
    async with gateway_process(config, tmp / "sink.toml", command, sink.running, profile):
        yield sink
    sink.stats = _parse_consumed(list(sink.running.log))


@contextlib.asynccontextmanager
async def gateway_process(
    config: Mapping[str, Any],
    path: Path,
    command: list[str],
    running: RunningGateway,
    profile: Path | None = None,
) -> AsyncIterator[None]:
    """Write ``config`` to ``path`` and run ``python COMMAND`` (``{config}`` → ``path``).

    Like ``_gateway.run_gateway`` in subprocess mode, but with any command that
    logs like ``python -m gateway run``, and with the config in a folder the
    caller chose (so relative certificate paths work). Run from the repository
    root, where ``bench`` is importable. The process runs until the block
    ends, then is stopped with SIGTERM; ``running`` has its addresses, pid,
    log and exit status.
    """
    async with supervise(_prepare(config, path, command, profile), running, cwd=ROOT, log_grace=5):
        yield


def _prepare(
    config: Mapping[str, Any], path: Path, command: list[str], profile: Path | None
) -> list[str]:
    """Write the config file; the full command line to run."""
    path.write_text(to_toml(config), encoding="utf-8")
    argv = [sys.executable, *(str(path) if a == "{config}" else a for a in command)]
    if profile is not None:
        argv[1:1] = ["-m", "cProfile", "-o", str(profile.resolve())]
    return argv


@contextlib.asynccontextmanager
async def _inprocess_sink(
    config: Mapping[str, Any], tmp: Path, size: int, max_unacked: int
) -> AsyncIterator[Sink]:
    from gateway.config.loader import parse
    from gateway.runtime.gateway import Gateway

    gateway = Gateway(parse(config, source="<benchmark>", base_dir=tmp))
    consumer = Consumer(size)
    sink = Sink(RunningGateway("inprocess"), consumer)
    # Warnings go to the running gateway's log, as a subprocess's stderr does.
    handler = _LogTail(sink.running)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consumer.run, gateway.hub, DESTINATION, max_unacked)
            await nursery.start(gateway.run)
            sink.running.addresses = gateway.addresses
            try:
                yield sink
            finally:
                gateway.shutdown()
    finally:
        root.removeHandler(handler)
    # In process there is no exit status: a drain that left work unsettled counts as failed.
    sink.running.returncode = 0 if gateway.drained_cleanly else 1
    sink.stats = consumer.stats()


class _LogTail(logging.Handler):
    """Keeps warnings and errors in ``running.log``, formatted like the gateway's log."""

    def __init__(self, running: RunningGateway) -> None:
        super().__init__(logging.WARNING)
        self.running = running
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.running.log.append(self.format(record))


# -- configs --------------------------------------------------------------------------------


def _gateway_table() -> dict[str, Any]:
    # A short drain: a clean run has nothing in flight at shutdown.
    return {"log_level": "info", "data_dir": "data", "drain_timeout": "2s"}


def _listener(args: argparse.Namespace, tls: bool) -> dict[str, Any]:
    listener: dict[str, Any] = {
        "name": LISTENER,
        "protocol": "lumberjack",
        "bind": "127.0.0.1:0",
        "destination": DESTINATION,
        "validate_json": args.validate_json,
        "max_window": max(args.events, LISTENER_MAX_WINDOW),
    }
    if tls:
        listener["tls"] = {"cert": "certs/server.pem", "key": "certs/server.key"}
    return listener


def sink_config(args: argparse.Namespace, tls: bool) -> dict[str, Any]:
    """One Lumberjack listener whose destination ``logs`` the consumer drains."""
    return {"gateway": _gateway_table(), "listeners": [_listener(args, tls)]}


def relay_config(args: argparse.Namespace, tls: bool, sink_address: str) -> dict[str, Any]:
    """A Lumberjack listener whose events all go to a Lumberjack upstream (the sink).

    A relay config in the sense of ``gateway run --workers N`` (route ``from =
    "*"`` to an upstream only, no destination, no metrics), so the same config
    serves one process or a supervisor and its workers.
    """
    upstream: dict[str, Any] = {
        "name": UPSTREAM,
        "protocol": "lumberjack",
        "connect": [sink_address],
    }
    if tls:
        upstream["tls"] = {"ca": "certs/ca.pem"}
    return {
        "gateway": _gateway_table(),
        "listeners": [_listener(args, tls)],
        "upstreams": [upstream],
        # Every name, not just ``logs``: the rule a config must meet to run with workers.
        "routes": [{"from": "*", "to": [f"upstream:{UPSTREAM}"]}],
    }


def _make_certs(tmp: Path) -> Path:
    """A development CA and a server certificate for 127.0.0.1 in ``tmp/certs``; the CA path."""
    from gateway.config.certs import init_dir

    return init_dir(tmp / "certs")["ca_cert"]


def _client_context(ca: Path) -> ssl.SSLContext:
    """Verify the gateway's certificate against the benchmark's own CA, host name included."""
    return ssl.create_default_context(cafile=str(ca))


# -- the replay client ------------------------------------------------------------------------


class Replay:
    """Replays one pre-encoded window on every connection, and counts the acks."""

    def __init__(self, window: bytes, events: int, inflight: int) -> None:
        self.window = window
        self.events = events
        self.limit = inflight
        self.stopping = False
        self.closing = False
        #: Start and end of the measured window (perf_counter); nothing counts outside it.
        self.t0 = math.inf
        self.t1 = math.inf
        self.started = math.inf
        self.windows_sent = 0
        #: Events covered by acks, partial acks included (whole run).
        self.acked_events = 0
        #: The same, counted only for acks parsed inside the measured window.
        self.window_events = 0
        self.full_acks = 0
        self.partial_acks = 0
        self.keepalives = 0
        #: Non-zero acks that covered nothing new (a repeated or stale sequence).
        self.stale_acks = 0
        #: Windows sent and not yet fully acked, over all connections.
        self.unacked = 0
        #: Ack latency of each window fully acked inside the measured window (s).
        self.latencies: list[float] = []
        #: Events acked per second since the load started (warm-up included).
        self.timeline: list[int] = []
        self.problems: list[str] = []
        self.scope = trio.CancelScope()
        self._rooms: list[trio.lowlevel.ParkingLot] = []
        self._idle = trio.lowlevel.ParkingLot()

    def fail(self, problem: str) -> None:
        """Record a problem that makes the rest of the run meaningless, and stop it."""
        self.problems.append(problem)
        self.scope.cancel()

    def stop(self) -> None:
        """Send no more windows (the ones in flight are still acked)."""
        self.stopping = True
        for room in self._rooms:
            room.unpark_all()

    async def wait_acked(self) -> None:
        while self.unacked:
            await self._idle.park()

    async def connection(self, stream: trio.abc.Stream) -> None:
        """Drive one connection: a sender and an ack reader sharing its in-flight windows."""
        #: The send time of each window in flight, oldest first.
        inflight: deque[float] = deque()
        room = trio.lowlevel.ParkingLot()
        self._rooms.append(room)
        codec = ClientCodec(version=2)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._send, stream, codec, inflight, room)
            await self._read(stream, codec, inflight, room)
            nursery.cancel_scope.cancel()

    async def _send(
        self, stream: trio.abc.SendStream, codec: ClientCodec, inflight: deque[float], room: Any
    ) -> None:
        window, limit, perf_counter = self.window, self.limit, time.perf_counter
        while not self.stopping:
            if len(inflight) >= limit:
                await room.park()
                continue
            inflight.append(perf_counter())
            codec.window_sent(self.events)
            self.unacked += 1
            self.windows_sent += 1
            await stream.send_all(window)

    async def _read(
        self, stream: trio.abc.ReceiveStream, codec: ClientCodec, inflight: deque[float], room: Any
    ) -> None:
        latencies, timeline, perf_counter = self.latencies, self.timeline, time.perf_counter
        while True:
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data and not self.closing:
                self.fail("the gateway closed a replay connection")
                return
            now = perf_counter()
            in_window = self.t0 <= now < self.t1
            codec.receive_data(data)
            progress = 0
            try:
                # The codec raises for an ack with no window in flight or beyond it.
                while (event := codec.next_event()) is not NEED_DATA:
                    if isinstance(event, ConnectionClosed):
                        return
                    assert isinstance(event, Progress)
                    if not event.acked:
                        if event.seq:
                            self.stale_acks += 1
                        else:
                            self.keepalives += 1
                        continue
                    progress += event.acked
                    if not event.window_done:
                        self.partial_acks += 1
                        continue
                    sent_at = inflight.popleft()
                    self.full_acks += 1
                    self.unacked -= 1
                    if in_window:
                        latencies.append(now - sent_at)
                    room.unpark_all()
            except RemoteProtocolError as e:
                self.fail(f"the gateway sent a bad ack: {e}")
                return
            if progress:
                self.acked_events += progress
                if in_window:
                    self.window_events += progress
                second = int(now - self.started)
                while len(timeline) <= second:
                    timeline.append(0)
                timeline[second] += progress
                if not self.unacked:
                    self._idle.unpark_all()


async def _connect(host: str, port: int, context: ssl.SSLContext | None) -> trio.abc.Stream:
    stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
    if context is not None:
        tls = trio.SSLStream(stream, context, server_hostname=host)
        try:
            await tls.do_handshake()
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        stream = tls
    return stream


@dataclass
class Measured:
    """What the machine did during the measured window."""

    elapsed: float = math.nan
    own_cpu: float = math.nan
    busy: float | None = None
    #: Per gateway process: (user, system) CPU seconds in the window, None in process.
    gateway_cpu: list[tuple[float, float] | None] = field(default_factory=list)
    #: Cores' worth of CPU other processes used in each second since the load started.
    others_per_second: list[float] = field(default_factory=list)


async def _sample_load(gateways: Sequence[RunningGateway], out: list[float]) -> None:
    """Append, each second, how busy the rest of the machine was (cores), to place dips."""

    def ours() -> float:
        return time.process_time() + sum(g.cpu_seconds() or 0.0 for g in gateways)

    before, own = busy_seconds(), ours()
    if before is None:
        return
    while True:
        await trio.sleep(1)
        after, own_after = busy_seconds(), ours()
        assert after is not None
        out.append(round(max(0.0, (after - before) - (own_after - own)), 2))
        before, own = after, own_after


async def drive(
    replay: Replay,
    gateways: Sequence[RunningGateway],
    host: str,
    port: int,
    context: ssl.SSLContext | None,
    args: argparse.Namespace,
) -> Measured | None:
    """Warm up, measure, stop, drain, close; None when a failure stopped the run."""
    streams: list[trio.abc.Stream] = []
    measured = Measured()
    try:
        for _ in range(args.connections):
            streams.append(await _connect(host, port, context))
        with replay.scope:
            async with trio.open_nursery() as nursery:
                replay.started = time.perf_counter()
                for stream in streams:
                    nursery.start_soon(replay.connection, stream)
                nursery.start_soon(_sample_load, gateways, measured.others_per_second)
                await trio.sleep(args.warmup)
                cpu0 = [g.cpu_times() for g in gateways]
                own0, busy0 = time.process_time(), busy_seconds()
                replay.t0 = time.perf_counter()
                await trio.sleep(args.seconds)
                replay.t1 = time.perf_counter()
                cpu1 = [g.cpu_times() for g in gateways]
                own1, busy1 = time.process_time(), busy_seconds()
                replay.stop()
                with trio.move_on_after(args.drain_timeout):
                    await replay.wait_acked()
                replay.closing = True
                nursery.cancel_scope.cancel()
    finally:
        for stream in streams:
            with trio.move_on_after(2):
                await stream.aclose()
            await trio.aclose_forcefully(stream)
    if replay.t1 == math.inf:
        return None
    measured.elapsed = replay.t1 - replay.t0
    measured.own_cpu = own1 - own0
    if busy0 is not None and busy1 is not None:
        measured.busy = busy1 - busy0
    measured.gateway_cpu = [
        None if a is None or b is None else (b[0] - a[0], b[1] - a[1])
        for a, b in zip(cpu0, cpu1, strict=True)
    ]
    return measured


# -- results ------------------------------------------------------------------------------------


def _params(args: argparse.Namespace, mode: str, window: bytes) -> dict[str, Any]:
    return {
        "mode": mode,
        "connections": args.connections,
        "events": args.events,
        "size": args.size,
        "level": args.level,
        "inflight": args.inflight,
        "tls": args.tls,
        "validate_json": args.validate_json,
        "seconds": args.seconds,
        "warmup": args.warmup,
        "window_bytes": len(window),
    }


def report(
    result: Result,
    replay: Replay,
    measured: Measured,
    gateways: Sequence[tuple[str, RunningGateway]],
    args: argparse.Namespace,
) -> None:
    """The figures of a completed run (self-checks are the caller's)."""
    elapsed = measured.elapsed
    rate = replay.window_events / elapsed
    result.add("acked events", rate, "events/s")
    result.add("JSON throughput", rate * args.size / 2**20, "MiB/s")
    result.add("wire throughput", rate / args.events * len(replay.window) / 2**20, "MiB/s")
    result.add_latencies("window ack latency", replay.latencies)
    result.add("measured window", elapsed, "s")
    result.add("acked in window", replay.window_events, "events")
    result.add("windows sent (whole run)", replay.windows_sent, "windows")
    result.add("acked (whole run)", replay.acked_events, "events")
    result.add("keepalive acks (A 0)", replay.keepalives)
    result.add("partial acks", replay.partial_acks)
    ours = measured.own_cpu
    for (name, gw), cpu in zip(gateways, measured.gateway_cpu, strict=True):
        if cpu is None:
            continue
        total = cpu[0] + cpu[1]
        ours += total
        result.details[f"{name}_cpu_in_window_s"] = {"user": cpu[0], "system": cpu[1]}
        result.add(f"{name} cpu load in window", 100 * total / elapsed, "% of a core")
        if replay.window_events:
            result.add(f"{name} cpu per event", 1e6 * total / replay.window_events, "us")
            if total > 0:
                result.add(f"events per {name} cpu-second", replay.window_events / total, "events")
        rss = gw.max_rss_mib()
        if rss is not None:
            result.add(f"{name} max rss", rss, "MiB")
    if all(cpu is None for cpu in measured.gateway_cpu):
        label = "process cpu load in window (gateway + consumer + replay)"
        result.add(label, 100 * measured.own_cpu / elapsed, "% of a core")
        if replay.window_events:
            per_event = 1e6 * measured.own_cpu / replay.window_events
            result.add("process cpu per event", per_event, "us")
    else:
        own_load = 100 * measured.own_cpu / elapsed
        result.add("replay client cpu load in window", own_load, "% of a core")
    if measured.busy is not None:
        others = max(0.0, measured.busy - ours)
        result.add("other processes' cpu load in window", 100 * others / elapsed, "% of a core")
        if others / elapsed > 0.15:
            result.details["warning"] = (
                "other processes used the CPU during the window: figures are not comparable"
            )
    result.details["others_cores_per_second_from_start"] = measured.others_per_second
    result.details["latency_samples"] = len(replay.latencies)
    result.details["acked_events_per_second_from_start"] = replay.timeline
    result.details["stale_acks"] = replay.stale_acks


def check_replay(replay: Replay) -> None:
    """Every window sent was acked in full, and nothing odd came back."""
    if replay.unacked:
        replay.problems.append(
            f"{replay.unacked} of {replay.windows_sent} windows sent still unacked after draining"
        )
    if replay.acked_events != replay.full_acks * replay.events:
        replay.problems.append(
            f"{replay.acked_events} events acked but {replay.full_acks} full windows of "
            f"{replay.events} (a window was left partly acked)"
        )


def check_consumed(
    problems: list[str], stats: dict[str, Any] | None, acked: int, size: int, duplicates_ok: bool
) -> None:
    """The consumer got exactly what was acked (more only if ``duplicates_ok``), intact."""
    if stats is None:
        problems.append("the sink gateway did not report what its consumer received")
        return
    consumed = stats["consumed"]
    if stats["bad"]:
        problems.append(f"{stats['bad']} events with a wrong size or content type")
    if stats["bytes"] != consumed * size:
        problems.append(f"{stats['bytes']} body bytes for {consumed} events of {size} bytes")
    if consumed < acked:
        problems.append(f"{acked} events acked to the replay client but only {consumed} consumed")
    elif consumed > acked and not duplicates_ok:
        problems.append(f"{consumed} events consumed but {acked} acked to the replay client")
    if stats["redelivered"] and not duplicates_ok:
        problems.append(f"{stats['redelivered']} events redelivered to the consumer")


def check_gateway(problems: list[str], result: Result, name: str, gw: RunningGateway) -> None:
    if gw.returncode != 0:
        problems.append(f"the {name} exited with status {gw.returncode}")
    logged = gw.problems_logged()
    if logged:
        result.details[f"{name}_warnings"] = logged[-20:]
        problems.append(f"the {name} logged {len(logged)} warnings or errors (see JSON)")


# -- the benchmarks ----------------------------------------------------------------------------


async def _run_lumberjack(args: argparse.Namespace) -> Result:
    window = encode_window(
        2, make_events(args.events, args.size), args.level, compress=zlib.compress
    )
    result = Result(params=_params(args, args.mode, window))
    if args.profile is not None:
        result.params["profiled"] = True
        if args.mode != "subprocess":
            result.problems.append("--profile needs --mode subprocess")
            return result
    replay = Replay(window, args.events, args.inflight)
    config = sink_config(args, args.tls)
    result.details["gateway_config"] = config
    with tempfile.TemporaryDirectory(prefix="interchange-bench-") as tmp_name:
        tmp = Path(tmp_name)
        context = _client_context(_make_certs(tmp)) if args.tls else None
        async with start_sink(
            config,
            args.mode,
            tmp,
            size=args.size,
            max_unacked=args.max_unacked,
            profile=args.profile,
        ) as sink:
            host, port = sink.running.address(LISTENER)
            measured = await drive(replay, [sink.running], host, port, context, args)
    problems = replay.problems
    if measured is not None:
        check_replay(replay)
        check_consumed(problems, sink.stats, replay.acked_events, args.size, duplicates_ok=False)
        report(result, replay, measured, [("gateway", sink.running)], args)
        if sink.stats is not None:
            result.add("consumed (whole run)", sink.stats["consumed"], "events")
            result.details["consumer"] = sink.stats
    check_gateway(problems, result, "gateway", sink.running)
    result.problems += problems
    return result


class SupervisedGateway(RunningGateway):
    """Gateway A as ``gateway run --workers N``: its CPU is the whole process tree's.

    With N > 1 the started process is the supervisor and the work is done by
    its children, so CPU and memory are summed over the supervisor and its
    workers. Each :meth:`cpu_times` call also keeps the per-process figures
    (``snapshots``), so the window's first and last calls give each worker's
    share; :meth:`cpu_seconds` (the per-second load sampler) keeps nothing.
    """

    def __init__(self, workers: int) -> None:
        super().__init__("subprocess")
        self.workers = workers
        self.snapshots: list[dict[int, tuple[float, float]]] = []

    def tree(self) -> list[int]:
        """The supervisor's pid, then its children's (the workers); empty once it is gone."""
        if self.pid is None:
            return []
        # Every thread's list: trio starts processes from a thread of its own.
        children: set[int] = set()
        for task in Path(f"/proc/{self.pid}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                children.update(map(int, task.read_text(encoding="ascii").split()))
        return [self.pid, *sorted(children)]

    def _per_process(self) -> dict[int, tuple[float, float]]:
        return {pid: t for pid in self.tree() if (t := cpu_times(pid)) is not None}

    def cpu_times(self) -> tuple[float, float] | None:
        times = self._per_process()
        self.snapshots.append(times)
        return _sum_times(times)

    def cpu_seconds(self) -> float | None:
        total = _sum_times(self._per_process())
        return None if total is None else total[0] + total[1]

    def max_rss_mib(self) -> float | None:
        """The peaks (VmHWM) of the supervisor and its workers, added up."""
        peaks = [peak_rss_mib(pid) for pid in self.tree()]
        known = [p for p in peaks if p is not None]
        return sum(known) if known else None

    def serving_lines(self) -> int:
        return sum(1 for line in self.log if _SERVING_LINE.search(line))

    async def wait_for_workers(self, timeout: float) -> bool:
        """Until every worker logged ``serving:`` (so none is left to take every connection)."""
        if self.workers == 1:
            return True
        with trio.move_on_after(timeout):
            # The log is filled by _gateway's reader, which sets no event per line: poll it.
            while self.serving_lines() < 1 + self.workers:  # noqa: ASYNC110
                await trio.sleep(0.05)
            return True
        return False

    def listener_address(self, name: str = LISTENER) -> tuple[str, int]:
        """The listener's address; the supervisor's line ends ``; N workers``, not an address."""
        first = self.addresses[name][0].rstrip(";")
        host, _, port = first.rpartition(":")
        return host.strip("[]"), int(port)

    def window_per_process(self) -> list[tuple[int, float]]:
        """``(pid, user + system seconds)`` between the window's first and last CPU reading."""
        if len(self.snapshots) < 2:
            return []
        first, last = self.snapshots[0], self.snapshots[-1]
        return [(pid, sum(last[pid]) - sum(first.get(pid, (0.0, 0.0)))) for pid in sorted(last)]


#: ``serving:`` as the supervisor (``gateway.supervisor``) and each worker log it.
_SERVING_LINE = re.compile(r"gateway[\w.]*: serving: ")


def _sum_times(times: Mapping[int, tuple[float, float]]) -> tuple[float, float] | None:
    if not times:
        return None
    return sum(t[0] for t in times.values()), sum(t[1] for t in times.values())


async def _run_relay(args: argparse.Namespace) -> Result:
    window = encode_window(
        2, make_events(args.events, args.size), args.level, compress=zlib.compress
    )
    result = Result(params=_params(args, "subprocess", window))
    result.params["workers"] = args.workers
    result.params["direct"] = args.direct
    if args.profile is not None:
        result.params["profiled"] = True
    replay = Replay(window, args.events, args.inflight)
    direct = Replay(window, args.events, args.inflight)
    relay = SupervisedGateway(args.workers)
    with tempfile.TemporaryDirectory(prefix="interchange-bench-") as tmp_name:
        tmp = Path(tmp_name)
        context = _client_context(_make_certs(tmp)) if args.tls else None
        b_config = sink_config(args, args.tls)
        b_profile = None if args.profile is None else args.profile.with_suffix(".sink.prof")
        async with start_sink(
            b_config,
            "subprocess",
            tmp,
            size=args.size,
            max_unacked=args.max_unacked,
            profile=b_profile,
        ) as sink:
            b_host, b_port = sink.running.address(LISTENER)
            a_config = relay_config(args, args.tls, f"{b_host}:{b_port}")
            result.details["gateway_configs"] = {"relay": a_config, "sink": b_config}
            command = ["-m", "gateway", "run", "{config}", "--workers", str(args.workers)]
            async with gateway_process(a_config, tmp / "relay.toml", command, relay, args.profile):
                measured = None
                if await relay.wait_for_workers(START_TIMEOUT):
                    host, port = relay.listener_address()
                    measured = await drive(replay, [relay, sink.running], host, port, context, args)
                else:
                    replay.problems.append(f"not every worker served within {START_TIMEOUT:g}s")
            direct_measured = None
            if args.direct and measured is not None:
                direct_measured = await drive(direct, [sink.running], b_host, b_port, context, args)
    _relay_results(result, args, replay, measured, relay, sink, direct, direct_measured)
    return result


def _relay_results(
    result: Result,
    args: argparse.Namespace,
    replay: Replay,
    measured: Measured | None,
    relay: SupervisedGateway,
    sink: Sink,
    direct: Replay,
    direct_measured: Measured | None,
) -> None:
    """The relay run's figures and self-checks (the direct run's too, when there was one)."""
    problems = replay.problems + direct.problems
    connected = sum(1 for line in relay.log if _UPSTREAM_CONNECTED.search(line))
    reconnects = max(0, connected - args.workers)
    if measured is not None:
        check_replay(replay)
        acked = replay.acked_events
        if args.direct:
            check_replay(direct)
            acked += direct.acked_events
        check_consumed(problems, sink.stats, acked, args.size, duplicates_ok=reconnects > 0)
        report(result, replay, measured, [("relay", relay), ("sink", sink.running)], args)
        _report_workers(result, relay, replay, measured.elapsed)
        if sink.stats is not None:
            result.add("consumed at the sink (whole run)", sink.stats["consumed"], "events")
            result.add("duplicates at the sink", sink.stats["consumed"] - acked, "events")
            result.details["consumer"] = sink.stats
        result.add("relay upstream reconnects", reconnects)
    if direct_measured is not None:
        _report_direct(result, replay, measured, direct, direct_measured)
    elif args.direct and measured is not None:
        problems.append("the direct run (replay client straight to the sink) did not complete")
    check_gateway(problems, result, "relay", relay)
    check_gateway(problems, result, "sink", sink.running)
    result.problems += problems


def _report_workers(
    result: Result, relay: SupervisedGateway, replay: Replay, elapsed: float
) -> None:
    """Each process of gateway A: its load in the window, and the work spread over workers."""
    per_process = relay.window_per_process()
    result.details["relay_cpu_per_process_s"] = {str(pid): s for pid, s in per_process}
    if relay.workers == 1 or not per_process:
        return
    (_, supervisor), *workers = per_process
    result.add("relay supervisor cpu load", 100 * supervisor / elapsed, "% of a core")
    for i, (_, seconds) in enumerate(sorted(workers, key=lambda w: -w[1])):
        result.add(
            f"relay worker {i + 1} (busiest first) cpu load", 100 * seconds / elapsed, "% of a core"
        )
    total = sum(seconds for _, seconds in workers)
    if replay.window_events and total > 0:
        per_worker = 1e6 * total / replay.window_events
        result.add("relay workers' cpu per event (supervisor excluded)", per_worker, "us")


def _report_direct(
    result: Result, replay: Replay, measured: Measured | None, direct: Replay, d: Measured
) -> None:
    """The replay client straight to the sink, right after the relay: the relay's reference."""
    rate = direct.window_events / d.elapsed
    result.add("direct to the sink: acked events", rate, "events/s")
    cpu = d.gateway_cpu[0]
    if cpu is not None and direct.window_events:
        result.add(
            "direct to the sink: sink cpu per event", 1e6 * sum(cpu) / direct.window_events, "us"
        )
    if measured is not None and rate > 0:
        result.add("relay / direct", replay.window_events / measured.elapsed / rate)


# -- options --------------------------------------------------------------------------------------


def _level(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 9:
        raise argparse.ArgumentTypeError(f"a zlib level is 0..9, not {value}")
    return value


def _common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--events",
        type=int_at_least(1),
        default=2048,
        help="events per window (default: %(default)s, Beats' bulk_max_size)",
    )
    parser.add_argument(
        "--size",
        type=int_at_least(MIN_SIZE),
        default=200,
        help="bytes of JSON per event, exactly (default: %(default)s)",
    )
    parser.add_argument(
        "--level",
        type=_level,
        default=3,
        help="zlib level of the window's C frame; 0 sends bare J frames (default: %(default)s)",
    )
    parser.add_argument(
        "--inflight",
        type=int_at_least(1),
        default=2,
        help="windows sent and not yet acked per connection (default: %(default)s)",
    )
    parser.add_argument(
        "--connections",
        type=int_at_least(1),
        default=1,
        help="replay connections, each with its own windows in flight (default: %(default)s)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="TLS on every hop (a CA made for the run; the replay client verifies it)",
    )
    parser.add_argument(
        "--validate-json",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the listener option validate_json: parse every event (default: on)",
    )
    parser.add_argument(
        "--max-unacked",
        type=int_at_least(1),
        default=8192,
        help="events the consumer may hold unacked (default: %(default)s)",
    )
    add_warmup(parser)
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        help="seconds to wait for the windows in flight after the window (default: %(default)g)",
    )


def _lumberjack_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode",
        choices=("subprocess", "inprocess"),
        default="subprocess",
        help="run gateway + consumer as `python -m bench.lumberjack serve` in a process of "
        "their own (default), or in this process's trio loop beside the replay client",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="run the gateway under cProfile and write its stats to PATH (subprocess mode; "
        "do not quote the figures of such a run)",
    )
    _common_arguments(parser)


def _relay_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="run the relay gateway under cProfile, stats to PATH, and the sink gateway too, "
        "stats to PATH with the suffix .sink.prof (do not quote the figures of such a run)",
    )
    parser.add_argument(
        "--workers",
        type=int_at_least(1),
        default=1,
        help="run gateway A as `gateway run --workers N`: N > 1 is a supervisor and N worker "
        "processes, its CPU their sum (default: %(default)s, one plain gateway process)",
    )
    parser.add_argument(
        "--direct",
        action="store_true",
        help="then replay the same load straight to the sink for as long, and report the "
        "relay's rate as a share of that (relay / direct)",
    )
    _common_arguments(parser)


@register(
    "lumberjack",
    "Beats windows replayed → Lumberjack listener → acking consumer: events/s, ack latency",
    arguments=_lumberjack_arguments,
)
def run(args: argparse.Namespace) -> Result:
    return trio.run(_run_lumberjack, args)


@register(
    "lumberjack-relay",
    "Beats windows replayed → gateway A → Lumberjack upstream → gateway B → acking consumer",
    arguments=_relay_arguments,
)
def run_relay(args: argparse.Namespace) -> Result:
    return trio.run(_run_relay, args)


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        print("usage: python -m bench.lumberjack serve CONFIG [options]", file=sys.stderr)
        sys.exit(2)
    sys.exit(serve_main(sys.argv[2:]))
