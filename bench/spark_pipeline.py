"""Spark reading and writing the gateway's durable destinations through the
``interchange`` data source, against Spark's own ``text`` source reading the same
bodies from a local file.

The gateway runs as ``python -m gateway run`` (``bench/_gateway.py``) with a
segment listener on ``127.0.0.1:0`` and three durable destinations in a new
temporary ``data_dir``: ``bench`` (``--partitions``), ``bench-small`` and
``bench-sink``. Before Spark starts, ``--messages`` JSON log events of
``--size`` bytes each are appended to ``bench`` as envelopes (content type
``application/json``, one header, a source), as hub publishes are stored, with
the blocking segment client, round-robin over the partitions. The same bodies,
one per line, go to a local text file. ``bench-small`` gets
``--small-batches`` times ``--small-records`` of them.

Then, in one Spark session on ``--master`` (default ``local[2]``):

- **batch read**: ``spark.read.format("interchange")`` of all of ``bench``
  (``minPartitions`` ``--min-partitions``, default 2: the cores of ``local[2]``,
  so a destination of one partition is read by both) into the ``noop`` sink
  (every column decoded and handed to the JVM, nothing written), ``--reads``
  times; the best and median rows/s. The same for ``spark.read.text`` of the
  file: the **reference**, read in turn with it (ABBA), and the ratio of the
  two best rates;
- **streaming**: ``readStream`` of ``bench`` with ``maxRecordsPerTrigger``
  ``--batch-records`` (and the same ``minPartitions``) and
  ``Trigger.AvailableNow`` into ``noop``: rows over the sum of the batches'
  ``triggerExecution`` times, and the median batch;
- **fixed cost per micro-batch**: the same over ``bench-small`` with
  ``--small-records`` per batch, where the rows cost little: the median
  ``triggerExecution`` of its batches;
- **sink**: ``--sink-rows`` rows of ``--size``-byte bodies from ``spark.range``
  (cached, built before the clock starts) written with
  ``df.write.format("interchange")`` to ``bench-sink``, after a warm-up write of
  100 rows.

``--seconds`` is not used: each phase moves a fixed amount of data. The first
Spark job of a session pays the JVM's warm-up and the first use of a Python
data source (several seconds): a warm-up read of ``bench-small`` runs first and
is not counted.

Self-checks (any failure makes the run exit 1): each batch read and the text
read count ``--messages`` rows; the stream reads ``--messages`` rows; the small
stream runs ``--small-batches`` batches; ``bench-sink`` holds ``--sink-rows``
events (and the warm-up's) afterwards; the gateway logged no warning.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import trio

from . import Result, int_at_least, register
from ._gateway import run_gateway

LISTENER = "seg"
SOURCE, SMALL, SINK = "bench", "bench-small", "bench-sink"
#: Events per append call while filling.
FILL_CHUNK = 20_000
#: Rows of the sink's warm-up write.
SINK_WARMUP = 100


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--messages", type=int_at_least(1), default=1_000_000, help="events in bench"
    )
    parser.add_argument("--size", type=int_at_least(64), default=200, help="body bytes")
    parser.add_argument("--partitions", type=int_at_least(1), default=1)
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument(
        "--min-partitions",
        type=int_at_least(1),
        default=2,
        help="the source's minPartitions for the reads (default 2: local[2]'s cores)",
    )
    parser.add_argument("--reads", type=int_at_least(1), default=3, help="batch reads timed")
    parser.add_argument(
        "--batch-records", type=int_at_least(1), default=100_000, help="rows per streaming batch"
    )
    parser.add_argument("--small-batches", type=int_at_least(1), default=20)
    parser.add_argument("--small-records", type=int_at_least(1), default=1000)
    parser.add_argument("--sink-rows", type=int_at_least(1), default=200_000)
    parser.add_argument("--dir", type=Path, help="where to put the data (default: a temp dir)")


def gateway_config(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    """A segment listener on loopback and the three durable destinations, each
    retaining far more than the run writes."""

    def durable(name: str, partitions: int = 1) -> dict[str, Any]:
        return {"name": name, "store": "embedded", "retain": "1TiB", "partitions": partitions}

    return {
        "gateway": {"log_level": "info", "data_dir": str(data_dir), "drain_timeout": "2s"},
        "listeners": [{"name": LISTENER, "protocol": "segment", "bind": "127.0.0.1:0"}],
        "destinations": [durable(SOURCE, args.partitions), durable(SMALL), durable(SINK)],
    }


def body(n: int, size: int) -> bytes:
    """JSON log event number ``n``, padded to exactly ``size`` bytes (``size`` >= 64)."""
    head = json.dumps({"seq": n, "level": "info", "service": "bench", "message": ""})
    return (head[:-2] + "x" * (size - len(head)) + '"}').encode()


def bodies(count: int, size: int) -> Iterator[bytes]:
    return (body(n, size) for n in range(count))


def fill(address: str, destination: str, partitions: int, count: int, size: int) -> None:
    """Append ``count`` envelopes to the partitions of ``destination``, round-robin."""
    from gateway.core.model import Message, Source
    from gateway.durable.envelope import encode_many
    from protocols.segment.blocking import SegmentClient

    source = Source("ndjson", "bench", "127.0.0.1:1")
    headers = {"service": "bench"}
    with SegmentClient(address, timeout=120) as client:
        for p in range(partitions):
            writer = client.writer(f"{destination}/{p}", uuid.uuid4(), envelope=True)
            mine = range(p, count, partitions)
            for start in range(0, len(mine), FILL_CHUNK):
                part = mine[start : start + FILL_CHUNK]
                messages = [
                    Message(destination, body(n, size), headers, "application/json", source)
                    for n in part
                ]
                writer.append(encode_many(messages), start + 1)


def stored_events(address: str, destination: str) -> int:
    from protocols.segment.blocking import SegmentClient

    with SegmentClient(address) as client:
        return sum(i.next_event - i.first_event for i in client.partitions(destination))


def timed(action: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    action()
    return time.perf_counter() - t0


def batch_phase(spark: Any, args: argparse.Namespace, address: str, text: Path) -> dict[str, Any]:
    """Best and median rows/s of the interchange and text batch reads into noop."""

    def source() -> Any:
        return (
            spark.read.format("interchange")
            .option("address", address)
            .option("minPartitions", str(args.min_partitions))
        )

    gateway = source().option("destination", SOURCE).load()
    reference = spark.read.text(str(text))
    source().option("destination", SMALL).load().write.format("noop").mode("overwrite").save()
    out: dict[str, Any] = {"counts": (gateway.count(), reference.count())}
    frames = {"interchange": gateway, "text": reference}
    rates: dict[str, list[float]] = {name: [] for name in frames}
    # ABBA: the two reads alternate, each going first in every other round, so a
    # load that comes and goes on this shared machine weighs on both alike.
    for i in range(args.reads):
        for name in sorted(frames, reverse=bool(i % 2)):
            frame = frames[name]
            seconds = timed(lambda f=frame: f.write.format("noop").mode("overwrite").save())
            rates[name].append(args.messages / seconds)
    out.update(rates)
    return out


def stream_phase(
    spark: Any,
    address: str,
    destination: str,
    records: int,
    checkpoint: Path,
    min_partitions: int = 1,
) -> list[dict[str, Any]]:
    """The progress records of an AvailableNow stream of ``destination`` into noop."""
    query = (
        spark.readStream.format("interchange")
        .option("address", address)
        .option("destination", destination)
        .option("minPartitions", str(min_partitions))
        .option("maxRecordsPerTrigger", str(records))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the stream of {destination} failed: {query.exception()}")
    records_seen = [json.loads(p.json) for p in query.recentProgress]
    return [p for p in records_seen if p.get("numInputRows")]


def sink_phase(spark: Any, args: argparse.Namespace, address: str) -> float:
    """Seconds to write ``--sink-rows`` bodies of ``--size`` bytes to bench-sink,
    after a warm-up write of ``SINK_WARMUP`` rows (Spark's first use of the sink)."""
    from pyspark.sql import functions as F

    pad = "x" * (args.size - 40)

    def writer(count: int) -> Any:
        rows = spark.range(count).select(
            F.format_string('{"seq": %d, "level": "info", "m": "%s"}', "id", F.lit(pad)).alias(
                "body"
            )
        )
        rows.cache().count()  # built before the clock starts
        return (
            rows.write.format("interchange")
            .option("address", address)
            .option("destination", SINK)
            .mode("append")
        )

    writer(SINK_WARMUP).save()
    return timed(writer(args.sink_rows).save)


def measure(args: argparse.Namespace, address: str, base: Path, result: Result) -> dict[str, Any]:
    """Fill the destinations and the text file, then run the Spark phases."""
    from gateway.pipeline.session import local_session

    fill(address, SOURCE, args.partitions, args.messages, args.size)
    fill(address, SMALL, 1, args.small_batches * args.small_records, args.size)
    text = base / "bodies.txt"
    with text.open("wb") as out:
        for body in bodies(args.messages, args.size):
            out.write(body + b"\n")
    spark = local_session(args.master, app_name="bench-spark-pipeline")
    try:
        figures = batch_phase(spark, args, address, text)
        figures["stream"] = stream_phase(
            spark, address, SOURCE, args.batch_records, base / "ck-stream", args.min_partitions
        )
        figures["small"] = stream_phase(
            spark, address, SMALL, args.small_records, base / "ck-small"
        )
        figures["sink seconds"] = sink_phase(spark, args, address)
    finally:
        spark.stop()
    figures["sink stored"] = stored_events(address, SINK)
    return figures


async def _run(args: argparse.Namespace, base: Path, result: Result) -> dict[str, Any]:
    async with run_gateway(gateway_config(args, base / "data"), "subprocess") as gw:
        host, port = gw.address(LISTENER)
        figures = await trio.to_thread.run_sync(measure, args, f"{host}:{port}", base, result)
        result.details["gateway log problems"] = gw.problems_logged()
    return figures


@register(
    "spark-pipeline",
    "Spark reads of a durable destination (batch, streaming) and sink writes, vs Spark's text",
    arguments=_arguments,
    default_seconds=0.0,
)
def run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "messages": args.messages,
            "size": args.size,
            "partitions": args.partitions,
            "master": args.master,
            "min partitions": args.min_partitions,
            "batch records": args.batch_records,
            "small batches": f"{args.small_batches} x {args.small_records}",
            "sink rows": args.sink_rows,
        }
    )
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(prefix="spark-bench-", dir=args.dir))
    try:
        figures = trio.run(_run, args, base, result)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    report(result, args, figures)
    return result


def report(result: Result, args: argparse.Namespace, figures: dict[str, Any]) -> None:
    batch, text = figures["interchange"], figures["text"]
    result.add("batch read best", max(batch), "rows/s")
    result.add("batch read median", statistics.median(batch), "rows/s")
    result.add("batch read best, bodies", max(batch) * args.size / 2**20, "MiB/s")
    result.add("text read best (reference)", max(text), "rows/s")
    result.add("text read median", statistics.median(text), "rows/s")
    result.add("batch / text", max(batch) / max(text))
    stream, small = figures["stream"], figures["small"]
    trigger_ms = [p["durationMs"]["triggerExecution"] for p in stream]
    streamed = sum(p["numInputRows"] for p in stream)
    result.add("stream rows/s", streamed / (sum(trigger_ms) / 1e3 or float("nan")), "rows/s")
    result.add("stream batch median", statistics.median(trigger_ms or [0]), "ms")
    fixed = [p["durationMs"]["triggerExecution"] for p in small]
    result.add("micro-batch fixed cost (median)", statistics.median(fixed or [0]), "ms")
    result.add("sink rows/s", args.sink_rows / figures["sink seconds"], "rows/s")
    result.details["stream batches"] = len(stream)
    problems = result.problems
    if figures["counts"] != (args.messages, args.messages):
        problems.append(
            f"batch counts (interchange, text) {figures['counts']}, not {args.messages}"
        )
    if streamed != args.messages:
        problems.append(f"the stream read {streamed} rows, not {args.messages}")
    if len(small) != args.small_batches:
        problems.append(f"the small stream ran {len(small)} batches, not {args.small_batches}")
    if figures["sink stored"] != args.sink_rows + SINK_WARMUP:
        stored, wanted = figures["sink stored"], args.sink_rows + SINK_WARMUP
        problems.append(f"bench-sink holds {stored} events, not {wanted}")
    problems.extend(f"gateway logged: {line}" for line in result.details["gateway log problems"])
