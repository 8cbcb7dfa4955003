"""Segment appends over the wire: writer connections → a segment listener → the embedded
store, each event acked once durable; the disk's raw bandwidth beside it; then the
segment read back from its start.

The gateway runs as ``python -m gateway run`` (``bench/_gateway.py``) with one
segment listener on ``127.0.0.1:0``, the metrics endpoint on another, and
``[gateway] data_dir`` in a new temporary directory (``--dir`` to choose one),
where the raw-bandwidth probe writes too: same file system, same run. The
``[store]`` table is left at its defaults (``fsync = "interval"``: a group
commit at most every 5 ms) unless ``--fsync`` says otherwise.

``--writers`` connections each append with a writer id of their own (a fresh
UUID, so events are numbered from 1) to a segment of their own, ``bench/<n>``
(``--shared``: all to ``bench/shared``), all from this process's trio loop.
Every payload is ``--size`` bytes: its writer's index and its own index (two
big-endian u32), then fixed random bytes.

``--client library`` (the default)
    Each connection is a :class:`~protocols.segment.client.SegmentWriter`
    making one ``append_many`` call over a lazy sequence that builds the
    events as the writer takes them (up to 1000 at a time, as many as its
    window of ``--inflight`` events and ``--inflight-bytes`` has room for).
    The call is cancelled when the measured window ends; what was handed
    over by then is still sent and acked (``flush``). This is what a Python
    application gets, and on 2 cores the client library costs more CPU per
    event than the gateway.
``--client replay``
    Each connection sends one append block of ``--block-size`` bytes of
    events, encoded once, again and again, with its event numbers and payload
    heads rewritten in place (no client library): what the gateway can do
    when the client costs little. At most ``--inflight-bytes`` (and
    ``--inflight`` events) of blocks are unacked per connection.

Figures: events acked per second in the measured window (after ``--warmup``)
and their payload MiB/s; the ack latency of each chunk (an ``append_many``
chunk, or a replayed block) from the moment the writer took it to the
``DataAppended`` covering its last event; the gateway's CPU time and the
store's group commits and fsync time in the window (from its /metrics). Then,
with the gateway still running, the first segment is read from offset 0 to
its end, warm (just written, in the page cache) and cold (its files dropped
from the page cache first; on a VM the host may still cache them): with a
:class:`~protocols.segment.client.SegmentReader` (library), or with the same
``ReadSegment`` requests of 1 MiB without cutting the data into events
(replay). After the gateway stopped, the raw probe writes as many bytes as the
store appended (event frames) in 1 MiB writes and fsyncs them, as
``dd bs=1M conv=fsync``, twice; the faster counts, and the ratio is the acked
payload rate over it.

Self-checks (any failure makes the run exit 1): every event handed to a
writer is acked within ``--drain-timeout``, in order, over the connection it
started on; the read returns exactly the acked events of its segment (in
order, for the library reader; the right number of bytes, for the raw one);
after the gateway exits (status 0, no warning logged) the store, opened in
this process, holds per segment exactly the acked events, each writer's in
order and once, and each writer's durable last event number is its acked
count.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import random
import re
import shutil
import struct
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, overload
from uuid import UUID, uuid4

import trio

from protocols.segment import (
    NULL_EVENT_NUMBER,
    AppendSetup,
    BlockWriter,
    Command,
    DataAppended,
    Hello,
    KeepAlive,
    ReadSegment,
    SegmentRead,
    SetupAppend,
    decode_command,
    encode,
)
from protocols.segment.client import SegmentReader, SegmentWriter, WriterSettings
from protocols.segment.frames import HEADER

from . import Result, add_warmup, int_at_least, register
from ._disk import drop_page_cache, sequential_write
from ._gateway import RunningGateway, run_gateway
from ._system import busy_seconds

LISTENER = "seg"
#: Each payload's head: the writer's index, the event's index in its writer.
_HEAD = struct.Struct(">II")
_I64 = struct.Struct(">q")
#: Bytes per write of the raw-bandwidth probe (dd bs=1M), and how many probes run.
PROBE_BLOCK = 2**20
PROBES = 2
_METRICS_LINE = re.compile(r"metrics: GET /metrics on (\S+)")
#: Store counters read from the gateway's /metrics: stats key → metric name.
_STORE_METRICS = {
    "commits": "interchange_store_commits",
    "fsyncs": "interchange_store_fsyncs",
    "fsync_s": "interchange_store_fsync_seconds",
}


# -- the load ----------------------------------------------------------------------------------


@dataclass
class Writer:
    """One writer connection: what it handed over, what came back."""

    index: int
    segment: str
    writer_id: UUID
    #: Events handed to the connection (numbered 1..taken).
    taken: int = 0
    #: Events acked (event numbers are dense from 1, so: the last one acked).
    acked: int = 0
    #: ``(last event number, perf_counter when handed over)`` of chunks not acked yet.
    chunks: deque[tuple[int, float]] = field(default_factory=deque)
    #: Chunk ack latencies (s) of acks inside the measured window.
    latencies: list[float] = field(default_factory=list)
    window: tuple[float, float] = (math.inf, math.inf)
    #: Acks that do not fit what was sent.
    anomalies: list[str] = field(default_factory=list)

    def handed(self, last: int) -> None:
        self.taken = last
        self.chunks.append((last, time.perf_counter()))

    def acked_to(self, number: int) -> None:
        """The server acked every event up to ``number``."""
        if not self.acked < number <= self.taken:
            self.anomalies.append(f"ack of event {number}: acked {self.acked}, sent {self.taken}")
            return
        self.acked = number
        now = time.perf_counter()
        in_window = self.window[0] <= now < self.window[1]
        chunks = self.chunks
        while chunks and chunks[0][0] <= number:
            _, taken_at = chunks.popleft()
            if in_window:
                self.latencies.append(now - taken_at)


class Payloads(Sequence[bytes]):
    """The events of ``writer``, made as ``append_many`` takes them.

    It looks ``limit`` events long. ``append_many`` slices it to hand chunks
    over (up to 1000 events, as many as the window has room for), which the
    writer records. A single item is what ``append_many`` reads for its
    length only, so it is the filler alone, made once: any other use of it
    would store events without their head, which the read-back check reports.
    """

    def __init__(self, writer: Writer, size: int, filler: bytes, limit: int = 2**62) -> None:
        self.writer = writer
        self.limit = limit
        self._filler = filler[_HEAD.size : size]
        self._sized = filler[:size]

    def __len__(self) -> int:
        return self.limit

    @overload
    def __getitem__(self, index: int) -> bytes: ...

    @overload
    def __getitem__(self, index: slice) -> list[bytes]: ...

    def __getitem__(self, index: int | slice) -> bytes | list[bytes]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.limit)
            if step != 1 or start != self.writer.taken:
                raise ValueError("a writer takes contiguous chunks, in order")
            head, w, filler = _HEAD.pack, self.writer.index, self._filler
            out = [head(w, i) + filler for i in range(start, stop)]
            self.writer.handed(stop)
            return out
        if not 0 <= index < self.limit:
            raise IndexError(index)
        return self._sized


class Load(Protocol):
    """Writers appending until told to stop."""

    async def run(self) -> None:
        """Append until :meth:`stop`, then until everything sent is acked."""
        ...

    def stop(self) -> None: ...

    def acked(self) -> int:
        """Events acked so far, all writers."""
        ...

    def problems(self) -> list[str]: ...


class LibraryLoad:
    """Each writer a :class:`SegmentWriter` (its own connection) making one
    ``append_many`` call over its :class:`Payloads`."""

    def __init__(
        self, args: argparse.Namespace, address: str, writers: list[Writer], filler: bytes
    ) -> None:
        self.args = args
        self.address = address
        self.writers = writers
        self.filler = filler
        self.clients: list[SegmentWriter] = []
        self._scopes = [trio.CancelScope() for _ in writers]

    async def run(self) -> None:
        args = self.args
        settings = WriterSettings() if args.block_size is None else WriterSettings(args.block_size)
        async with contextlib.AsyncExitStack() as stack:
            for w in self.writers:
                client = await stack.enter_async_context(
                    SegmentWriter.connect(
                        self.address,
                        writer_id=w.writer_id,
                        settings=settings,
                        max_inflight=args.inflight,
                        max_inflight_bytes=args.inflight_bytes,
                    )
                )
                _hook_acks(client, w)
                self.clients.append(client)
            async with trio.open_nursery() as nursery:
                for client, w, scope in zip(self.clients, self.writers, self._scopes, strict=True):
                    nursery.start_soon(self._append, client, w, scope)

    async def _append(self, client: SegmentWriter, w: Writer, scope: trio.CancelScope) -> None:
        with scope:
            await client.append_many(w.segment, Payloads(w, self.args.size, self.filler))
        await client.flush()

    def stop(self) -> None:
        for scope in self._scopes:
            scope.cancel()

    def acked(self) -> int:
        # Exact at any checkpoint: events handed over minus those still unacked.
        return sum(
            w.taken - c.appender.events for w, c in zip(self.writers, self.clients, strict=False)
        )

    def problems(self) -> list[str]:
        return [
            f"writer {w.index} connected {c.connections} times (last error: {c.last_error})"
            for w, c in zip(self.writers, self.clients, strict=False)
            if c.connections != 1
        ]


def _hook_acks(client: SegmentWriter, writer: Writer) -> None:
    """Have ``writer`` see each ack of ``client`` before the library does.

    ``append_many`` gives a token to the last event of each chunk it hands
    over, and the appender reports the tokens an ack covered to ``on_acked``.
    """
    appender = client.appender
    library = appender.on_acked

    def on_acked(segment: str, writer_id: UUID, acked: list[tuple[Any, int]], offset: int) -> None:
        writer.acked_to(acked[-1][1])
        library(segment, writer_id, acked, offset)

    appender.on_acked = on_acked


class ReplayLoad:
    """Each writer a plain connection sending one pre-encoded append block again and
    again, only its event numbers and payload heads rewritten: the gateway's side of
    the work at the cost of a memory copy and a ``pack_into`` per event."""

    def __init__(
        self, args: argparse.Namespace, address: str, writers: list[Writer], filler: bytes
    ) -> None:
        self.args = args
        self.address = address
        self.writers = writers
        self.filler = filler[: args.size]
        block = args.block_size or WriterSettings().block_size
        self.per_block = max(1, block // (args.size + 8))
        self.window = max(
            1, min(args.inflight // self.per_block, args.inflight_bytes // block or 1)
        )
        self.stopping = False
        self._room = trio.lowlevel.ParkingLot()
        self._problems: list[str] = []

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            for w in self.writers:
                host, _, port = self.address.rpartition(":")
                stream = await trio.open_tcp_stream(host, int(port))
                nursery.start_soon(self._connection, stream, w)

    def stop(self) -> None:
        self.stopping = True
        self._room.unpark_all()

    def acked(self) -> int:
        return sum(w.acked for w in self.writers)

    def problems(self) -> list[str]:
        return self._problems

    async def _connection(self, stream: trio.SocketStream, w: Writer) -> None:
        async with stream:
            await stream.send_all(
                encode(Hello()) + encode(SetupAppend(1, w.writer_id, w.segment, ""))
            )
            answers = replies(stream)
            async for command in answers:
                if isinstance(command, AppendSetup):
                    if command.last_event_number != NULL_EVENT_NUMBER:
                        self._problems.append(f"writer {w.index}: set up at {command!r}")
                        return
                    break
                if not isinstance(command, Hello):
                    self._problems.append(f"writer {w.index}: {command!r} answered the setup")
                    return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._acks, answers, w, nursery.cancel_scope)
                await self._send(stream, w)  # until stop()
                while w.acked < w.taken:
                    await self._room.park()
                nursery.cancel_scope.cancel()

    async def _acks(
        self, answers: AsyncIterator[Command], w: Writer, scope: trio.CancelScope
    ) -> None:
        """Count the ``DataAppended`` answers; anything else ends the connection."""
        async for command in answers:
            if isinstance(command, DataAppended) and command.writer_id == w.writer_id:
                w.acked_to(command.event_number)
                self._room.unpark_all()
            elif not isinstance(command, KeepAlive):
                self._problems.append(f"writer {w.index}: unexpected {command!r}")
                break
        else:
            self._problems.append(f"the gateway closed writer {w.index}'s connection")
        scope.cancel()

    async def _send(self, stream: trio.SocketStream, w: Writer) -> None:
        """Blocks of ``per_block`` events, at most ``window`` of them unacked."""
        n, size = self.per_block, self.args.size
        template = BlockWriter().write(
            w.writer_id, [self.filler] * n, n, block_size=0, request_id=1
        )
        # [AppendBlock header][writer id] then n times [event header][payload], then the
        # AppendBlockEnd whose last two fields are lastEventNumber and requestId.
        heads = [8 + 16 + i * (8 + size) + 8 for i in range(n)]
        last_at = len(template) - 16
        assert _I64.unpack_from(template, last_at)[0] == n, "unexpected AppendBlockEnd layout"
        pack_head, pack_last = _HEAD.pack_into, _I64.pack_into
        while not self.stopping:
            while (w.taken - w.acked) // n >= self.window and not self.stopping:
                await self._room.park()
            if self.stopping:
                break
            block = bytearray(template)
            first = w.taken
            for i, at in enumerate(heads):
                pack_head(block, at, w.index, first + i)
            pack_last(block, last_at, first + n)
            w.handed(first + n)
            await stream.send_all(block)


async def replies(stream: trio.abc.ReceiveStream) -> AsyncIterator[Command]:
    """The server's commands on ``stream``, decoded as they arrive whole, until it closes."""
    buffer = bytearray()
    while data := await stream.receive_some(2**20):
        buffer += data
        pos = 0
        while len(buffer) - pos >= HEADER.size:
            length = HEADER.unpack_from(buffer, pos)[1]
            if len(buffer) - pos - HEADER.size < length:
                break
            command, pos = decode_command(buffer, pos)
            yield command
        del buffer[:pos]


# -- the gateway ---------------------------------------------------------------------------------


def gateway_config(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    """A segment listener and the metrics endpoint on loopback; the store at its
    defaults except for ``--fsync``/``--fsync-interval``."""
    config: dict[str, Any] = {
        "gateway": {"log_level": "info", "data_dir": str(data_dir), "drain_timeout": "2s"},
        "metrics": {"bind": "127.0.0.1:0"},
        # The read phase reads every event back from offset 0: the segments the
        # listener creates keep all of it (its default retain, 1 GiB, would let
        # retention delete the oldest chunks of a fast run).
        "listeners": [
            {"name": LISTENER, "protocol": "segment", "bind": "127.0.0.1:0", "retain": "1TiB"}
        ],
    }
    store: dict[str, Any] = {}
    if args.fsync != "interval":
        store["fsync"] = args.fsync
    if args.fsync_interval is not None:
        store["fsync_interval"] = f"{args.fsync_interval * 1000:g}ms"
    if store:
        config["store"] = store
    return config


async def scrape_store(address: str | None) -> dict[str, float]:
    """The store's commit counters from the gateway's /metrics (empty when unknown)."""
    if address is None:
        return {}
    host, _, port = address.rpartition(":")
    with trio.move_on_after(5):
        stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
        async with stream:
            await stream.send_all(
                f"GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n".encode()
            )
            body = bytearray()
            while data := await stream.receive_some(65536):
                body += data
        text = body.decode("utf-8", "replace")
        out = {}
        for key, name in _STORE_METRICS.items():
            m = re.search(rf"^{name}(?:_total)? (\S+)$", text, re.MULTILINE)
            if m:
                out[key] = float(m.group(1))
        return out
    return {}


def _metrics_address(gw: RunningGateway) -> str | None:
    for line in gw.log:
        if m := _METRICS_LINE.search(line):
            return m.group(1)
    return None


# -- one run -----------------------------------------------------------------------------------


@dataclass
class Window:
    """What happened during the measured window."""

    elapsed: float = math.nan
    acked: int = 0
    gateway_cpu: tuple[float, float] | None = None
    own_cpu: float = math.nan
    others: float | None = None
    store: dict[str, float] = field(default_factory=dict)
    #: Events acked per second since the load started (warm-up included).
    timeline: list[int] = field(default_factory=list)


@dataclass
class ReadFigures:
    seconds: float
    events: int
    payload_bytes: int
    gateway_cpu: float | None
    own_cpu: float


async def _timeline(acked: Callable[[], int], out: list[int]) -> None:
    last = 0
    while True:
        await trio.sleep(1)
        now = acked()
        out.append(now - last)
        last = now


async def append_phase(
    args: argparse.Namespace, gw: RunningGateway, load: Load, writers: list[Writer], result: Result
) -> Window | None:
    """Warm up, measure, stop handing events over, drain; None when the drain failed."""
    window = Window()
    metrics = _metrics_address(gw)
    drained = False
    async with trio.open_nursery() as nursery:
        done = trio.Event()

        async def run_load() -> None:
            await load.run()
            done.set()

        nursery.start_soon(run_load)
        nursery.start_soon(_timeline, load.acked, window.timeline)
        await trio.sleep(args.warmup)
        t0 = time.perf_counter()
        for w in writers:
            w.window = (t0, math.inf)
        acked0 = load.acked()
        cpu0, own0, busy0 = gw.cpu_times(), time.process_time(), busy_seconds()
        store0 = await scrape_store(metrics)
        await trio.sleep(args.seconds)
        t1 = time.perf_counter()
        acked1 = load.acked()
        cpu1, own1, busy1 = gw.cpu_times(), time.process_time(), busy_seconds()
        for w in writers:
            w.window = (t0, t1)
        load.stop()
        store1 = await scrape_store(metrics)
        with trio.move_on_after(args.drain_timeout):
            await done.wait()
            drained = True
        nursery.cancel_scope.cancel()
    result.problems.extend(load.problems())
    for w in writers:
        if w.acked != w.taken:
            result.problems.append(f"writer {w.index}: {w.taken} events sent, {w.acked} acked")
        result.problems.extend(f"writer {w.index}: {a}" for a in w.anomalies[:5])
    if not drained:
        result.problems.append(f"the writers were not all acked {args.drain_timeout:g}s after")
        return None
    window.elapsed = t1 - t0
    window.acked = acked1 - acked0
    window.own_cpu = own1 - own0
    if cpu0 is not None and cpu1 is not None:
        window.gateway_cpu = (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1])
    if busy0 is not None and busy1 is not None:
        ours = window.own_cpu + sum(window.gateway_cpu or (0.0, 0.0))
        window.others = max(0.0, (busy1 - busy0) - ours) / window.elapsed
    window.store = {k: store1[k] - store0[k] for k in store1 if k in store0}
    return window


async def read_phase(
    gw: RunningGateway, address: str, segment: str, expect: dict[int, int], result: Result
) -> ReadFigures:
    """Read ``segment`` with a :class:`SegmentReader` from offset 0 to its end; check
    each writer's events come in order and that there are ``expect[writer]`` of them."""
    seen = dict.fromkeys(expect, 0)
    unpack = _HEAD.unpack_from
    bad = events = nbytes = 0
    cpu0, own0 = gw.cpu_seconds(), time.process_time()
    started = time.perf_counter()
    async with SegmentReader.connect(address) as reader:
        async for _offset, payload in reader.read(segment, 0, follow=False):
            writer, index = unpack(payload)
            if seen.get(writer) != index:
                bad += 1
            else:
                seen[writer] = index + 1
            events += 1
            nbytes += len(payload)
    seconds = time.perf_counter() - started
    cpu1, own1 = gw.cpu_seconds(), time.process_time()
    if bad:
        result.problems.append(f"read {segment}: {bad} events out of order or unknown")
    if seen != expect:
        result.problems.append(f"read {segment}: events per writer {seen}, acked {expect}")
    return ReadFigures(
        seconds,
        events,
        nbytes,
        None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
        own1 - own0,
    )


async def raw_read_phase(
    gw: RunningGateway, address: str, segment: str, events: int, size: int, result: Result
) -> ReadFigures:
    """Read ``segment`` from offset 0 to its end as ``SegmentReader`` does (one
    ``ReadSegment`` of up to 1 MiB at a time) but without cutting the data into
    events; check it is exactly ``events`` frames of ``size`` bytes long (the
    store check looks at each event)."""
    cpu0, own0 = gw.cpu_seconds(), time.process_time()
    started = time.perf_counter()
    offset = 0
    host, _, port = address.rpartition(":")
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        answers = replies(stream)
        for rid in itertools.count(1):
            request = ReadSegment(segment, offset, 2**20, "", rid)
            await stream.send_all((encode(Hello()) if rid == 1 else b"") + encode(request))
            reply = await _reply(answers, rid, result)
            if reply is None:
                break
            offset += len(reply.data)
            if reply.at_tail:
                break
    seconds = time.perf_counter() - started
    cpu1, own1 = gw.cpu_seconds(), time.process_time()
    if offset != events * (size + 8):
        result.problems.append(f"raw read: {offset} bytes, {events * (size + 8)} acked")
    return ReadFigures(
        seconds,
        offset // (size + 8),
        offset // (size + 8) * size,
        None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
        own1 - own0,
    )


async def _reply(answers: AsyncIterator[Command], rid: int, result: Result) -> SegmentRead | None:
    """The ``SegmentRead`` answering request ``rid`` (None, and a problem, for anything else)."""
    async for command in answers:
        if isinstance(command, SegmentRead) and command.request_id == rid:
            return command
        if not isinstance(command, Hello):
            result.problems.append(f"raw read: unexpected {command!r}")
            return None
    result.problems.append("raw read: the gateway closed the connection")
    return None


async def check_store(directory: Path, writers: Sequence[Writer], result: Result) -> None:
    """The stopped gateway's store holds exactly the acked events, in order, once."""
    from gateway.store import Store

    by_segment: dict[str, list[Writer]] = {}
    for w in writers:
        by_segment.setdefault(w.segment, []).append(w)
    unpack = _HEAD.unpack_from
    async with Store.open(directory) as store:
        for name, group in by_segment.items():
            segment = store.segment(name, create=False)
            if segment is None:
                result.problems.append(f"store: no segment {name!r}")
                continue
            for w in group:
                last = segment.last_event_number(w.writer_id, durable=True)
                if (last or 0) != w.acked:
                    result.problems.append(
                        f"store: writer {w.index} last durable event {last}, acked {w.acked}"
                    )
            expect = {w.index: w.acked for w in group}
            seen = dict.fromkeys(expect, 0)
            bad = 0
            event = segment.first_event
            while event < segment.next_event:
                batch = segment.read_events(event, 100_000, 64 * 2**20)
                if not batch:
                    break
                for _fmt, payload in batch:
                    writer, index = unpack(payload)
                    if seen.get(writer) != index:
                        bad += 1
                    else:
                        seen[writer] = index + 1
                event += len(batch)
            if bad:
                result.problems.append(f"store: {name} has {bad} events out of order or unknown")
            if seen != expect:
                result.problems.append(
                    f"store: {name} holds {seen} events per writer, acked {expect}"
                )


async def _run(args: argparse.Namespace, base: Path, result: Result) -> dict[str, Any]:
    rng = random.Random(12345)
    filler = rng.randbytes(args.size)
    writers = [
        Writer(i, "bench/shared" if args.shared else f"bench/{i}", uuid4())
        for i in range(args.writers)
    ]
    data_dir = base / "data"
    out: dict[str, Any] = {"writers": writers}
    async with run_gateway(
        gateway_config(args, data_dir), "subprocess", profile=args.profile
    ) as gw:
        host, port = gw.address(LISTENER)
        address = f"{host}:{port}"
        kind = LibraryLoad if args.client == "library" else ReplayLoad
        load = kind(args, address, writers, filler)
        window = await append_phase(args, gw, load, writers, result)
        out["window"] = window
        if window is not None and args.read != "none":
            first = writers[0].segment
            expect = {w.index: w.acked for w in writers if w.segment == first}

            async def read() -> ReadFigures:
                if args.client == "replay":
                    count = sum(expect.values())
                    return await raw_read_phase(gw, address, first, count, args.size, result)
                return await read_phase(gw, address, first, expect, result)

            out["warm"] = await read()
            if args.read == "both":
                drop_page_cache(data_dir)
                out["cold"] = await read()
        out["gateway_rss"] = gw.max_rss_mib()
    if gw.returncode != 0:
        tail = "\n".join(list(gw.log)[-8:])
        result.problems.append(f"the gateway exited with status {gw.returncode}; its log:\n{tail}")
    result.problems.extend(f"gateway logged: {line}" for line in gw.problems_logged()[:5])
    result.details["gateway_log_tail"] = list(gw.log)[-10:]
    if window is not None:
        await check_store(data_dir / "store", writers, result)
    return out


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--writers",
        type=int_at_least(1),
        default=1,
        help="writer connections, each with its own writer id (default: %(default)s)",
    )
    parser.add_argument(
        "--shared",
        action="store_true",
        help="all writers append to one segment (default: a segment each)",
    )
    parser.add_argument(
        "--size", type=int_at_least(_HEAD.size), default=1024, help="payload bytes per event"
    )
    parser.add_argument(
        "--client",
        choices=("library", "replay"),
        default="library",
        help="library: SegmentWriter.append_many (default); replay: pre-encoded append "
        "blocks, to see what the gateway does with a client that costs little",
    )
    parser.add_argument(
        "--inflight",
        type=int_at_least(1),
        default=16384,
        help="events a writer keeps unacked at most (SegmentWriter max_inflight; "
        "default: %(default)s, the library's is 1000)",
    )
    parser.add_argument(
        "--inflight-bytes",
        type=int_at_least(1),
        default=16 * 2**20,
        help="payload bytes a writer keeps unacked at most (max_inflight_bytes; default: "
        "%(default)s, the library's and the listener's max_outstanding_bytes)",
    )
    parser.add_argument(
        "--block-size",
        type=int_at_least(0),
        default=None,
        help="the writers' append block size (default: the library's, 256 KiB)",
    )
    parser.add_argument(
        "--fsync",
        choices=("always", "interval", "never"),
        default="interval",
        help="[store] fsync (default: %(default)s, the gateway's default)",
    )
    parser.add_argument(
        "--fsync-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="[store] fsync_interval (default: the gateway's, 5 ms)",
    )
    parser.add_argument(
        "--read",
        choices=("both", "warm", "none"),
        default="both",
        help="read the first segment back warm, and cold from the disk (default: both)",
    )
    add_warmup(parser)
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=10.0,
        help="seconds for the events in flight to be acked after the window (default: %(default)g)",
    )
    parser.add_argument(
        "--dir",
        type=Path,
        metavar="PATH",
        help="where the store and the raw probe write (default: a new temporary directory)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="run the gateway under cProfile and write its stats to PATH "
        "(do not quote the figures of such a run)",
    )


@register(
    "segment-append",
    "SegmentWriter connections → segment listener → store, acked once durable, vs dd; read back",
    arguments=_arguments,
)
def run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "client": args.client,
            "writers": args.writers,
            "segments": 1 if args.shared else args.writers,
            "size": args.size,
            "inflight": args.inflight,
            "inflight bytes": args.inflight_bytes,
            "block size": args.block_size,
            "fsync": args.fsync,
            "fsync interval": args.fsync_interval,
            "seconds": args.seconds,
            "warmup": args.warmup,
        }
    )
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="segment-bench-", dir=args.dir))
    try:
        out = trio.run(_run, args, base, result)
        writers: list[Writer] = out["writers"]
        window: Window | None = out["window"]
        if window is None:
            return result
        events = sum(w.acked for w in writers)
        frames = events * (args.size + 8)
        # The disk's own rate, for the same bytes as the store appended (event frames),
        # twice: the faster counts (the disk of a VM varies from minute to minute).
        probes = [sequential_write(base, frames, PROBE_BLOCK) for _ in range(PROBES) if frames]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(result, args, window, writers, out, frames, probes)
    return result


def report(
    result: Result,
    args: argparse.Namespace,
    window: Window,
    writers: Sequence[Writer],
    out: dict[str, Any],
    frames: int,
    probes: list[float],
) -> None:
    elapsed = window.elapsed
    rate = window.acked / elapsed
    mib = rate * args.size / 2**20
    raw = frames / min(probes, default=math.nan) / 2**20
    result.add("acked events", rate, "events/s")
    result.add("acked payload", mib, "MiB/s")
    result.add("raw write (dd conv=fsync)", raw, "MiB/s")
    result.add("acked / raw", mib / raw)
    result.add_latencies("chunk ack latency", [x for w in writers for x in w.latencies])
    result.add("measured window", elapsed, "s")
    result.add("acked (whole run)", sum(w.acked for w in writers), "events")
    if window.gateway_cpu is not None:
        user, system = window.gateway_cpu
        result.add("gateway cpu load", 100 * (user + system) / elapsed, "% of a core")
        result.add("gateway system cpu", 100 * system / elapsed, "% of a core")
        if window.acked:
            result.add("gateway cpu per event", 1e6 * (user + system) / window.acked, "us")
    result.add("writers' cpu load", 100 * window.own_cpu / elapsed, "% of a core")
    if window.others is not None:
        result.add("other processes' cpu load", 100 * window.others, "% of a core")
    if window.store.get("commits"):
        commits = window.store["commits"]
        result.add("group commits", commits / elapsed, "/s")
        result.add("events per commit", window.acked / commits)
        if "fsync_s" in window.store:
            result.add("fsync time per commit", 1e3 * window.store["fsync_s"] / commits, "ms")
    for label in ("warm", "cold"):
        figures: ReadFigures | None = out.get(label)
        if figures is None:
            continue
        result.add(f"read {label}", figures.events / figures.seconds, "events/s")
        result.add(
            f"read {label} payload", figures.payload_bytes / figures.seconds / 2**20, "MiB/s"
        )
        if figures.gateway_cpu is not None:
            result.add(
                f"read {label} gateway cpu load",
                100 * figures.gateway_cpu / figures.seconds,
                "% of a core",
            )
        result.add(
            f"read {label} reader cpu load", 100 * figures.own_cpu / figures.seconds, "% of a core"
        )
        result.add(f"read {label} events", figures.events, "events")
    if out.get("gateway_rss") is not None:
        result.add("gateway max rss", out["gateway_rss"], "MiB")
    result.details["acked_per_second"] = window.timeline
    result.details["store_in_window"] = window.store
    result.details["raw_probe"] = {"bytes": frames, "seconds": probes, "block": PROBE_BLOCK}
