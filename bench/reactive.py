"""Reactive streams out of the gateway: 16-byte elements to one subscriber, against rsocket.

One gateway process with two reactive listeners (plain TCP and ``ws://``)
publishing two retained in-memory logs, pre-filled with ``--elements``
16-byte elements each before anything is measured: ``var`` (elements of any
size, sent as one ``onNext`` each) and ``packed`` (``element_size = 16``,
sent as ``onNextPacked``). A subscriber in this process subscribes with
``NAME?from=earliest&to=latest``, initial demand ``--window`` (1024), and
sends ``request(window)`` after each ``window`` elements received, so never
more than ``window`` elements are in flight. Each mode (``tcp-var``,
``tcp-packed``, ``ws-var``, ``ws-packed``) streams for ``--warmup`` +
``--seconds``, or until the log's end (``onComplete``), then cancels.

The reference is the ``rsocket`` package (asyncio RSocket) doing the same: a
request-stream server process with ``--elements`` 16-byte payloads made
before it is ready, and a client process requesting ``request_n`` windows of
``--window`` the same way (``bench/_rsocket_peer.py``). Gateway blocks (A)
and rsocket blocks (B) run ABBA in one run; each figure is the mean of its
two blocks, and the ratios are gateway / rsocket.

Figures per mode: elements per second received in the measured window, the
server's CPU per element (the gateway's, or the rsocket server's) and the
client's.

Elements are their index (8 bytes, big-endian) and ``rstreams``. Checks that
make the run fail: every element received exactly once, in order, intact
(compared byte for byte with what was published), nothing but elements and
at most an ``onComplete`` after ``subscribed``, the gateway exiting cleanly
with no warning logged, the rsocket client reporting the same.

The client (``--client fast``, the default) checks the bytes rather than
parsing them: an ``onNext`` of 16 bytes for subscription 1 always has the
same 5 header bytes, so the variable-size stream from ``subscribed`` on is
exactly the concatenation the codec encodes, known in advance (checked
against ``Connection``'s own encoding once); packed messages are cut with
msgpack's ``Unpacker`` and their ``bin`` compared. The handshake goes
through a client ``Connection``. ``--client codec`` feeds everything to a
client ``Connection`` instead (its ``Elements`` events checked), which shows
what a subscriber built on the codec takes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgpack
import trio
from interchange_websocket.address import parse_ws_address
from interchange_websocket.handshake import client_handshake

from gateway.sdk import NEED_DATA
from protocols.micromessage.codec import ClientCodec
from protocols.micromessage.events import SEQUENCE, Ack, Error
from protocols.micromessage.events import Message as MmMessage
from protocols.micromessage.frames import encode_frame
from protocols.micromessage.plugin import client_settings
from protocols.reactive import messages as m
from protocols.reactive.codec import Connection, Role
from protocols.reactive.events import Accepted, Completed, Elements, Hello

from . import Result, add_warmup, int_at_least, register
from ._gateway import RunningGateway, run_gateway
from ._ndjson import check_gateway
from ._process import ready_process
from .micromessage import handshake

ELEMENT_SIZE: Final = 16
MARK: Final = b"rstreams"
SUBSCRIBER: Final = 1
RECEIVE_SIZE: Final = 65536
MODES: Final = ("tcp-var", "tcp-packed", "ws-var", "ws-packed")
#: The pre-filling publisher's ack window (Micromessage2's largest).
FILL_WINDOW: Final = 32767
#: Per-element share of a log's retention (the hub counts 200 bytes per message).
RETAIN_PER_ELEMENT: Final = 256


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--elements",
        type=int_at_least(1024),
        default=5_000_000,
        help="elements pre-filled in each log and made by the rsocket server; a mode "
        "that reaches the end stops there (default: %(default)s)",
    )
    parser.add_argument(
        "--window",
        type=int_at_least(1),
        default=1024,
        help="initial demand, and request(n) after each n elements (default: %(default)s)",
    )
    parser.add_argument(
        "--modes",
        default=",".join(MODES),
        help=f"comma-separated gateway modes among {', '.join(MODES)} (default: all)",
    )
    parser.add_argument(
        "--client",
        choices=("fast", "codec"),
        default="fast",
        help="the subscriber checks bytes against the codec's encoding (fast), or runs "
        "everything through a client Connection (codec)",
    )
    parser.add_argument("--no-rsocket", action="store_true", help="skip the rsocket reference")
    add_warmup(parser, "of each block")
    parser.add_argument(
        "--block-timeout",
        type=float,
        default=60.0,
        help="seconds a block may take beyond warm-up + measured time (default: %(default)g)",
    )


# -- the elements -----------------------------------------------------------------------------
def element(i: int) -> bytes:
    """Element ``i`` (from 0): its index and a mark, 16 bytes."""
    return i.to_bytes(8, "big") + MARK


def all_elements(count: int) -> bytes:
    """Elements 0 to ``count - 1`` back to back: what a subscriber must receive."""
    return b"".join([i.to_bytes(8, "big") + MARK for i in range(count)])


# -- the gateway -------------------------------------------------------------------------------
def gateway_config(args: argparse.Namespace) -> dict[str, Any]:
    """A Micromessage2 listener to pre-fill, the reactive listeners, the two logs."""
    retain = max(2**20, args.elements * RETAIN_PER_ELEMENT)
    reactive = {"protocol": "reactive", "publishers": ["var", "packed"]}
    return {
        "gateway": {"log_level": "info", "data_dir": "data", "drain_timeout": "2s"},
        "listeners": [
            {
                "name": "fill",
                "protocol": "micromessage",
                "bind": "127.0.0.1:0",
                "max_window": FILL_WINDOW,
            },
            {"name": "tcp", "bind": "127.0.0.1:0", **reactive},
            {"name": "ws", "bind": "ws://127.0.0.1:0", **reactive},
        ],
        "destinations": [
            {"name": "var", "retain": retain},
            {"name": "packed", "retain": retain, "element_size": ELEMENT_SIZE},
        ],
    }


def seq_of(n: int) -> int:
    """The Micromessage2 sequence number of publish ``n`` (from 1), wrapping."""
    return (n - 1) % SEQUENCE.size + 1 if SEQUENCE.size is not None else n


class FillFrames:
    """MESSAGE frames of the elements to one destination, from a template checked
    against ``encode_frame``."""

    def __init__(self, destination: str) -> None:
        first = encode_frame(MmMessage(1, destination, "", element(0)))
        self.flags, self.rest = first[:1], first[3 : len(first) - ELEMENT_SIZE]
        for n in (1, 2, 65535, 65536, 3_000_001):
            wire = encode_frame(MmMessage(seq_of(n), destination, "", element(n - 1)))
            if self.frames(n, 1) != wire:
                raise AssertionError(f"the fill template differs from encode_frame at {n}")

    def frames(self, first: int, count: int) -> bytes:
        """Frames of publishes ``first`` to ``first + count - 1`` (element n - 1 each)."""
        flags, rest = self.flags, self.rest
        return b"".join(
            [
                flags + seq_of(n).to_bytes(2, "big") + rest + (n - 1).to_bytes(8, "big") + MARK
                for n in range(first, first + count)
            ]
        )


async def prefill(address: tuple[str, int], destination: str, count: int) -> float:
    """Publish elements 0 to ``count - 1`` to ``destination``; every one acked (stored).
    Returns the seconds it took."""
    started = time.perf_counter()
    frames = FillFrames(destination)
    options = {"identity": "fill", "ack_expire": 60.0, "window": FILL_WINDOW}
    codec = ClientCodec(client_settings(options, False))
    async with await trio.open_tcp_stream(*address) as stream:
        await handshake(stream, codec)
        sent = acked = 0
        while acked < count:
            room = min(FILL_WINDOW - (sent - acked), count - sent)
            if room > 0:
                await stream.send_all(frames.frames(sent + 1, room))
                sent += room
            acked = await _read_acks(stream, codec, acked, sent)
    return time.perf_counter() - started


async def _read_acks(stream: trio.abc.Stream, codec: ClientCodec, acked: int, sent: int) -> int:
    """Read once; the new count of publishes acked (acks are cumulative)."""
    data = await stream.receive_some(RECEIVE_SIZE)
    if not data:
        raise RuntimeError("the gateway closed the pre-filling connection")
    codec.receive_data(data)
    while (event := codec.next_event()) is not NEED_DATA:
        if type(event) is Ack:
            acked += SEQUENCE.distance(seq_of(acked + 1), event.seq) + 1
            if acked > sent:
                raise RuntimeError(f"an ack covers {acked} publishes, {sent} were sent")
        elif isinstance(event, Error):
            raise RuntimeError(f"the gateway refused a pre-filling publish: {event.message}")
    return acked


# -- the subscriber ----------------------------------------------------------------------------
@dataclass
class Block:
    """What one block (one mode, one run) measured."""

    mode: str
    received: int = 0
    #: Elements received by the start and the end of the measured window, and when.
    window_count: int = 0
    window_seconds: float = 0.0
    server_cpu: float | None = None
    client_cpu: float = 0.0
    completed: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.window_count / self.window_seconds if self.window_seconds > 0 else math.nan

    def per_element_us(self, cpu: float | None) -> float:
        if cpu is None or not self.window_count:
            return math.nan
        return 1e6 * cpu / self.window_count


class Window:
    """The measured window: the counts and clocks at its start and end."""

    def __init__(self, warmup: float, seconds: float, server_cpu: Callable[[], float | None]):
        self.started = time.perf_counter()
        self.t0 = self.started + warmup
        self.t1 = self.t0 + seconds
        self.server_cpu = server_cpu
        self.start: tuple[float, int, float | None, float] | None = None
        self.end: tuple[float, int, float | None, float] | None = None

    def snapshot(self, count: int) -> tuple[float, int, float | None, float]:
        return time.perf_counter(), count, self.server_cpu(), time.process_time()

    def fill(self, block: Block) -> None:
        """The block's window figures (nothing if the window never started)."""
        if self.start is None or self.end is None:
            return
        (w0, c0, s0, p0), (w1, c1, s1, p1) = self.start, self.end
        block.window_seconds = w1 - w0
        block.window_count = c1 - c0
        block.server_cpu = None if s0 is None or s1 is None else s1 - s0
        block.client_cpu = p1 - p0


class Subscriber:
    """One subscription's receiving side: checks, counts, requests (see the module)."""

    def __init__(self, expected: bytes, element_size: int, window: int) -> None:
        self.expected = expected
        self.total = len(expected) // ELEMENT_SIZE
        self.packed = element_size > 0
        self.window = window
        self.received = 0
        self.requested = window  # the initial demand
        self.completed = False
        self.problem: str | None = None

    def more_demand(self) -> int:
        """How many request(window) are owed after what was received."""
        target = (self.received // self.window + 1) * self.window
        owed = max(0, (target - self.requested) // self.window)
        self.requested += owed * self.window
        return owed

    def check(self, data: bytes) -> bool:
        """Elements received in a row: whether they are the next ones, intact."""
        at = self.received * ELEMENT_SIZE
        if len(data) % ELEMENT_SIZE or self.expected[at : at + len(data)] != data:
            self.problem = f"elements from {self.received} on differ from those published"
            return False
        self.received += len(data) // ELEMENT_SIZE
        return True


class CodecReader:
    """Everything through a client ``Connection``."""

    def __init__(self, sub: Subscriber, codec: Connection) -> None:
        self.sub, self.codec = sub, codec

    def feed(self, data: bytes | bytearray) -> None:
        codec, sub = self.codec, self.sub
        codec.receive_data(data)
        while (event := codec.next_event()) is not NEED_DATA:
            if type(event) is Elements:
                if not sub.check(b"".join(event.elements)):
                    return
            elif type(event) is Completed:
                sub.completed = True
            else:
                sub.problem = f"unexpected event {event!r:.200}"
                return

    def request(self, count: int) -> bytes:
        return b"".join([self.codec.send(m.Request(SUBSCRIBER, self.sub.window))] * count)


class FastReader:
    """Variable-size: the bytes compared with the known stream. Packed: messages cut by
    msgpack, their ``bin`` compared. The wire templates are checked against the codec."""

    COMPLETE: Final = m.encode(m.OnComplete(SUBSCRIBER))

    def __init__(self, sub: Subscriber) -> None:
        self.sub = sub
        self.head = m.encode(m.OnNext(SUBSCRIBER, element(0)))[:-ELEMENT_SIZE]
        self.stride = len(self.head) + ELEMENT_SIZE
        self.offset = 0  # of the variable-size stream, from the first onNext
        self.pending: bytes | bytearray = b""
        self.unpacker = msgpack.Unpacker(raw=False, max_buffer_size=32 * 2**20)
        self.request_bytes = m.encode(m.Request(SUBSCRIBER, sub.window))
        self._check_templates()

    def _check_templates(self) -> None:
        """The codec's publisher side encodes what this reader expects."""
        server = _open_pair(0)
        if server.send_elements(SUBSCRIBER, [element(0), element(1)]) != self.wire(0, 2):
            raise AssertionError("the onNext template differs from the codec's encoding")
        if server.send(m.OnComplete(SUBSCRIBER)) != self.COMPLETE:
            raise AssertionError("the onComplete template differs from the codec's encoding")

    def wire(self, first: int, count: int) -> bytes:
        """The onNext messages of elements ``first`` to ``first + count - 1``."""
        head = self.head
        return b"".join([head + element(i) for i in range(first, first + count)])

    def feed(self, data: bytes | bytearray) -> None:
        if self.sub.packed:
            self._feed_packed(data)
        else:
            self._feed_var(data)

    def _feed_var(self, data: bytes | bytearray) -> None:
        sub, stride = self.sub, self.stride
        data = self.pending + data if self.pending else data
        whole = len(data) - len(data) % stride
        if whole:
            expected = self.wire(sub.received, whole // stride)
            if data[:whole] != expected:
                at = next(i for i in range(whole) if data[i] != expected[i])
                sub.problem = f"onNext of element {sub.received + at // stride} differs"
                return
        sub.received += whole // stride
        rest = data[whole:]
        if rest[: len(self.COMPLETE)] == self.COMPLETE:
            sub.completed = True
            rest = rest[len(self.COMPLETE) :]
        if len(rest) >= stride:  # neither an element nor the onComplete
            sub.problem = f"after element {sub.received}: {rest[:32].hex()}"
        self.pending = rest

    def _feed_packed(self, data: bytes | bytearray) -> None:
        sub = self.sub
        self.unpacker.feed(data)
        for obj in self.unpacker:
            if type(obj) is list and len(obj) == 4 and obj[:2] == [12, SUBSCRIBER]:
                if obj[2] * ELEMENT_SIZE != len(obj[3]) or not sub.check(obj[3]):
                    sub.problem = sub.problem or f"onNextPacked of {obj[2]} in {len(obj[3])} bytes"
                    return
            elif obj == [10, SUBSCRIBER]:
                sub.completed = True
            else:
                sub.problem = f"unexpected message {obj!r:.200}"
                return

    def request(self, count: int) -> bytes:
        return self.request_bytes * count


def _open_pair(element_size: int) -> Connection:
    """A publisher-side codec with subscription 1 accepted, after an in-memory handshake."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.hello() + client.send(m.Subscribe("x", SUBSCRIBER, 1 << 20)))
    while server.next_event() is not NEED_DATA:
        pass
    server.hello()
    server.send(m.Subscribed(SUBSCRIBER, element_size))
    return server


async def subscribe_handshake(
    stream: trio.abc.Stream, codec: Connection, publisher: str, window: int
) -> tuple[int, bytes | bytearray]:
    """Hello and subscribe: the elementSize, and what followed ``subscribed`` in the
    read that brought it (given to the codec byte by byte, so nothing past it is
    consumed by it)."""
    await stream.send_all(codec.hello() + codec.send(m.Subscribe(publisher, SUBSCRIBER, window)))
    seen_hello = False
    while True:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            raise RuntimeError("the gateway closed the connection during the handshake")
        for at in range(len(data)):
            codec.receive_data(data[at : at + 1])
            while (event := codec.next_event()) is not NEED_DATA:
                if isinstance(event, Hello):
                    seen_hello = True
                elif isinstance(event, Accepted) and seen_hello:
                    return event.element_size, data[at + 1 :]
                else:
                    raise RuntimeError(f"unexpected answer to subscribe: {event!r:.200}")


async def stream_block(
    stream: trio.abc.Stream,
    publisher: str,
    expected: bytes,
    args: argparse.Namespace,
    window: Window,
) -> Subscriber:
    """Subscribe on ``stream`` and receive until the window ends or the log does."""
    codec = Connection(Role.CLIENT)
    size, first = await subscribe_handshake(stream, codec, publisher, args.window)
    sub = Subscriber(expected, size, args.window)
    reader = CodecReader(sub, codec) if args.client == "codec" else FastReader(sub)
    data: bytes | bytearray = first
    while True:
        if data:
            reader.feed(data)
            if sub.problem is not None:
                return sub
            owed = sub.more_demand()
            if owed:
                await stream.send_all(reader.request(owed))
        now = time.perf_counter()
        if window.start is None and now >= window.t0:
            window.start = window.snapshot(sub.received)
        if sub.completed or now >= window.t1:
            window.end = window.snapshot(sub.received)
            break
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            sub.problem = "the gateway closed the connection"
            return sub
    if not sub.completed:
        await stream.send_all(codec.send(m.Cancel(SUBSCRIBER)))
    return sub


async def gateway_block(
    gw: RunningGateway, mode: str, expected: bytes, args: argparse.Namespace
) -> Block:
    """One mode against the gateway."""
    transport, kind = mode.split("-")
    publisher = f"{kind}?from=earliest&to=latest"
    block = Block(mode)
    window = Window(args.warmup, args.seconds, gw.cpu_seconds)
    with trio.move_on_after(args.warmup + args.seconds + args.block_timeout) as scope:
        async with await _connect(gw, transport) as stream:
            sub = await stream_block(stream, publisher, expected, args, window)
    if scope.cancelled_caught:
        block.problems.append(f"{mode}: no end within the block timeout")
        return block
    window.fill(block)
    _judge(block, sub.received, sub.total, sub.completed, sub.problem)
    return block


async def _connect(gw: RunningGateway, transport: str) -> trio.abc.Stream:
    if transport == "tcp":
        return await trio.open_tcp_stream(*gw.address("tcp"))
    address = parse_ws_address(gw.addresses["ws"][0])
    tcp = await trio.open_tcp_stream(address.host, address.port)
    return await client_handshake(tcp, address)


def _judge(block: Block, received: int, total: int, completed: bool, problem: str | None) -> None:
    block.received, block.completed = received, completed
    if problem is not None:
        block.problems.append(f"{block.mode}: {problem}")
    elif completed and received != total:
        block.problems.append(f"{block.mode}: onComplete after {received} of {total} elements")
    if block.window_count <= 0 and not block.problems:
        block.problems.append(f"{block.mode}: no element in the measured window")


# -- the rsocket reference ---------------------------------------------------------------------
async def rsocket_block(server_address: str, server_pid: int, args: argparse.Namespace) -> Block:
    """The rsocket client process against the running rsocket server."""
    command = [
        sys.executable,
        "-m",
        "bench._rsocket_peer",
        "client",
        server_address,
        f"--server-pid={server_pid}",
        f"--elements={args.elements}",
        f"--window={args.window}",
        f"--warmup={args.warmup}",
        f"--seconds={args.seconds}",
    ]
    block = Block("rsocket")
    with trio.move_on_after(args.warmup + args.seconds + args.block_timeout):
        result = await trio.run_process(
            command, capture_stdout=True, capture_stderr=True, check=False
        )
        if result.returncode == 0:
            _read_report(block, json.loads(result.stdout), args.elements)
            return block
        tail = result.stderr.decode("utf-8", "replace")[-2000:]
        block.problems.append(f"the rsocket client exited with {result.returncode}: {tail}")
        return block
    block.problems.append("rsocket: no end within the block timeout")
    return block


def _read_report(block: Block, report: dict[str, Any], total: int) -> None:
    """The rsocket client's JSON report into ``block``."""
    if report.get("window_count") is not None:
        block.window_count, block.window_seconds = report["window_count"], report["window_seconds"]
        block.server_cpu, block.client_cpu = report["server_cpu"], report["client_cpu"]
    _judge(block, report["received"], total, report["completed"], report["problem"])


# -- the run -----------------------------------------------------------------------------------
async def _run(args: argparse.Namespace) -> Result:
    modes = [mode for mode in args.modes.split(",") if mode]
    result = Result(
        params={
            "elements": args.elements,
            "element_size": ELEMENT_SIZE,
            "window": args.window,
            "modes": modes,
            "client": args.client,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "reference": None if args.no_rsocket else "rsocket (asyncio, TCP)",
        }
    )
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        result.problems.append(f"unknown modes {unknown}; choose among {', '.join(MODES)}")
        return result
    expected = all_elements(args.elements)
    config = gateway_config(args)
    result.details["gateway_config"] = config
    blocks: list[Block] = []
    async with run_gateway(config, "subprocess") as gw:
        fill = {}
        for name in sorted({mode.split("-")[1] for mode in modes}):
            fill[name] = await prefill(gw.address("fill"), name, args.elements)
        result.details["prefill_seconds"] = fill

        async def gateway() -> None:
            for mode in modes:
                blocks.append(await gateway_block(gw, mode, expected, args))

        await _abba(gateway, args, blocks)
    check_gateway(gw, result, result.problems)
    _report(blocks, modes, result)
    return result


async def _abba(
    gateway: Callable[[], Awaitable[None]], args: argparse.Namespace, blocks: list[Block]
) -> None:
    """Gateway, rsocket, rsocket, gateway (just the gateway twice with --no-rsocket)."""
    if args.no_rsocket:
        await gateway()
        await gateway()
        return
    if importlib.util.find_spec("rsocket") is None:
        raise SystemExit("the rsocket reference needs `pip install rsocket` (or use --no-rsocket)")
    command = [
        sys.executable,
        "-m",
        "bench._rsocket_peer",
        "server",
        "127.0.0.1:0",
        f"--elements={args.elements}",
    ]
    async with ready_process(
        command, "127.0.0.1:0", what="the rsocket server", start_timeout=60, stop_timeout=5
    ) as server:
        await gateway()
        for _ in range(2):
            blocks.append(await rsocket_block(server.address, server.process.pid, args))
        await gateway()
        if not server.alive:
            blocks[-1].problems.append(f"the rsocket server died: {server.log()[-2000:]}")


def _report(blocks: list[Block], modes: list[str], result: Result) -> None:
    """Per mode: the mean of its blocks' rates and CPU per element; ratios to rsocket."""
    for block in blocks:
        result.problems.extend(block.problems)
    result.details["blocks"] = [
        {
            "mode": b.mode,
            "elements_per_s": b.rate,
            "window_elements": b.window_count,
            "window_s": b.window_seconds,
            "server_cpu_s": b.server_cpu,
            "client_cpu_s": b.client_cpu,
            "received": b.received,
            "completed": b.completed,
        }
        for b in blocks
    ]
    rates: dict[str, float] = {}
    for mode in [*modes, "rsocket"]:
        mine = [b for b in blocks if b.mode == mode]
        if not mine:
            continue
        rates[mode] = sum(b.rate for b in mine) / len(mine)
        result.add(f"{mode} elements/s", rates[mode], "elem/s")
        server = [b.per_element_us(b.server_cpu) for b in mine]
        client = [b.per_element_us(b.client_cpu) for b in mine]
        result.add(f"{mode} server cpu per element", sum(server) / len(server), "us")
        result.add(f"{mode} client cpu per element", sum(client) / len(client), "us")
    if "rsocket" in rates:
        for mode in modes:
            result.add(f"{mode} / rsocket", rates[mode] / rates["rsocket"], "x")


@register(
    "reactive",
    "reactive streams: 16-byte elements to one subscriber in request(1024) windows, "
    "variable-size and packed, TCP and WebSocket, against rsocket-py",
    arguments=arguments,
    default_seconds=4.0,
)
def run(args: argparse.Namespace) -> Result:
    return trio.run(_run, args)
