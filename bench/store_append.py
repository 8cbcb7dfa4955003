"""The segment store alone: writers appending 256 KiB records of 1 KiB events,
acked once durable (group commit), against the disk's own sequential write
bandwidth; then reading the segment back from its start.

``--writers`` tasks each append to their own segment (``--shared``: all to
one) and keep at most ``--window`` bytes unacked (32 MiB, a Kafka producer's
default buffer), as a segment-append connection does: an append counts once
its ``when_durable`` callback ran. A group commit covers what was written
before it started, so a writer streams only while its window holds about two
commits' worth. The baseline is dd's ``conv=fsync``: the same bytes in writes
of the record size to one file, then one fsync, timed before and after the
store run (the better counts). Reads use ``read_events`` from event 0 of the
first segment to its end, first warm (just written, in the page cache), then
cold (the files dropped from the page cache with ``posix_fadvise``, the store
reopened). Self-check: every event comes back, in order, byte for byte
(payloads carry their index).
"""

from __future__ import annotations

import argparse
import shutil
import struct
import tempfile
import time
from pathlib import Path

import trio

from gateway.store import RecordFormat, Store, frame_events

from . import Result, int_at_least, register
from ._disk import drop_page_cache, sequential_write


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--writers", type=int_at_least(1), default=1, help="appending tasks")
    parser.add_argument("--shared", action="store_true", help="all writers on one segment")
    parser.add_argument("--event-size", type=int_at_least(8), default=1024, help="payload bytes")
    parser.add_argument(
        "--record-bytes", type=int_at_least(1), default=256 * 1024, help="bytes per append"
    )
    parser.add_argument("--bytes", type=int_at_least(1), default=2**30, help="bytes written in all")
    parser.add_argument(
        "--window", type=int_at_least(1), default=32 * 2**20, help="unacked bytes per writer"
    )
    parser.add_argument("--fsync", choices=("always", "interval", "never"), default="interval")
    parser.add_argument("--fsync-interval", type=float, default=0.005)
    parser.add_argument(
        "--read-bytes", type=int_at_least(1), default=2**20, help="max_bytes of a read_events"
    )
    parser.add_argument("--dir", help="where to write (default: a new temporary directory)")


class _Records:
    """Records of ``count`` events whose payloads start with their event index: one
    buffer, the indexes rewritten in place for each append."""

    def __init__(self, count: int, size: int) -> None:
        self.count = count
        self.stride = size + 8
        self.buffer = bytearray(frame_events([bytes(size)] * count))

    def at(self, first: int) -> bytearray:
        buffer, stride = self.buffer, self.stride
        for i in range(self.count):
            struct.pack_into(">q", buffer, i * stride + 8, first + i)
        return buffer


async def _write(args: argparse.Namespace, directory: Path, result: Result) -> dict[str, float]:
    per_record = max(1, args.record_bytes // (args.event_size + 8))
    record_bytes = per_record * (args.event_size + 8)
    records = max(1, args.bytes // record_bytes // args.writers)
    async with Store.open(directory, fsync=args.fsync, fsync_interval=args.fsync_interval) as store:
        names = (
            ["bench/0"] * args.writers
            if args.shared
            else [f"bench/{w}" for w in range(args.writers)]
        )
        segments = [store.segment(name) for name in names]
        acked = [0] * args.writers
        appended_us: list[float] = []

        async def writer(w: int) -> None:
            segment = segments[w]
            assert segment is not None
            records_of = _Records(per_record, args.event_size)
            inflight = 0
            room = trio.Event()

            def on_durable() -> None:
                nonlocal inflight, room
                inflight -= record_bytes
                acked[w] += per_record
                room.set()

            for _ in range(records):
                while inflight + record_bytes > args.window:
                    room = trio.Event()
                    await room.wait()
                first = segment.next_event
                data = records_of.at(first)
                t = time.perf_counter()
                appended = segment.append(data, per_record, format=RecordFormat.RAW)
                appended_us.append(time.perf_counter() - t)
                inflight += record_bytes
                segment.when_durable(appended.end, on_durable)
                await trio.lowlevel.checkpoint()
            await segment.durable(segment.end)

        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for w in range(args.writers):
                nursery.start_soon(writer, w)
        elapsed = time.perf_counter() - t0
        stats = store.stats()
    events = sum(acked)
    total = events * (args.event_size + 8)
    result.params.update(records_per_writer=records, events_per_record=per_record)
    result.details["store stats"] = stats
    if events != records * per_record * args.writers:
        result.problems.append(f"{events} events acked, {records * per_record * args.writers} sent")
    return {
        "seconds": elapsed,
        "events": events,
        "bytes": total,
        "commits": stats["commits"],
        "append_us": sum(appended_us) / len(appended_us) * 1e6,
        "fsync_us": stats["fsync_us"],
    }


async def _read(
    args: argparse.Namespace, directory: Path, result: Result, cold: bool
) -> tuple[float, int, int]:
    async with Store.open(directory) as store:
        segment = store.segment("bench/0", create=False)
        assert segment is not None
        t0 = time.perf_counter()
        event = segment.first_event
        total = 0
        bad = 0
        while event < segment.next_event:
            batch = segment.read_events(event, 1_000_000, args.read_bytes)
            for fmt, payload in batch:
                if fmt is not RecordFormat.RAW or struct.unpack_from(">q", payload)[0] != event:
                    bad += 1
                total += len(payload)
                event += 1
        elapsed = time.perf_counter() - t0
        if bad:
            result.problems.append(f"{bad} events read back wrong ({'cold' if cold else 'warm'})")
        return elapsed, event - segment.first_event, total


@register(
    "store-append",
    "the segment store alone: appends of 256 KiB records acked once durable, vs dd; reads back",
    arguments=_arguments,
    default_seconds=0,
)
def run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "writers": args.writers,
            "shared": args.shared,
            "event size": args.event_size,
            "record bytes": args.record_bytes,
            "bytes": args.bytes,
            "window": args.window,
            "fsync": args.fsync,
            "fsync interval": args.fsync_interval,
        }
    )
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="store-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    directory = base / "store"
    try:
        dd = [sequential_write(base, args.bytes, args.record_bytes)]
        written = trio.run(_write, args, directory, result)
        dd.append(sequential_write(base, args.bytes, args.record_bytes))
        warm = trio.run(_read, args, directory, result, False)
        drop_page_cache(directory)
        cold = trio.run(_read, args, directory, result, True)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)
    first_segment = written["events"] if args.shared else written["events"] / args.writers
    for label, (_, events, _) in (("warm", warm), ("cold", cold)):
        if events != first_segment:
            result.problems.append(f"{label} read {events} events of {first_segment:.0f}")
    dd_mbps = args.bytes / min(dd) / 1e6
    store_mbps = written["bytes"] / written["seconds"] / 1e6
    result.add("appended events", written["events"] / written["seconds"], "events/s")
    result.add("appended bytes", store_mbps, "MB/s")
    result.add("dd conv=fsync", dd_mbps, "MB/s")
    result.add("store / dd", store_mbps / dd_mbps)
    result.add("append call", written["append_us"], "us")
    result.add("group commits", written["commits"])
    result.add("events per commit", written["events"] / max(1, written["commits"]))
    for label, (seconds, events, size) in (("warm", warm), ("cold", cold)):
        result.add(f"read_events {label}", events / seconds, "events/s")
        result.add(f"read_events {label} bytes", size / seconds / 1e6, "MB/s")
    result.details["dd seconds"] = dd
    return result
