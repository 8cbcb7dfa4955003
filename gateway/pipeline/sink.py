"""The ``interchange`` sink: Spark appends rows to a gateway destination, as
messages its subscribers of every protocol receive, each row stored once.

::

    (df.selectExpr("to_json(struct(*)) AS body")
       .write.format("interchange")
       .option("address", "gw:12345")
       .option("destination", "alerts")
       .save())

The rows: ``body`` (binary or string, required), and optional ``headers``
(map<string, string>), ``content_type`` (string) and ``partition_key``
(string); other columns are ignored. Each row becomes a message in an envelope:
its source is protocol ``spark``, listener the sink id. On a partitioned
destination (``NAME/0`` … ``NAME/N-1``) a row with a ``partition_key`` goes to
partition ``crc32(key) % N``, as the gateway's own partitioning sends a
message with that key header; rows without one go to partition
``sparkPartition % N``.

Exactly once, and its limits. Every Spark task appends as writers whose ids
derive from the sink id, the task's Spark partition and the segment
(``uuid5(NAMESPACE, "sinkId/sparkPartition/segment")``), numbering its rows
for each segment ``(batchId + 1) << 32 | index`` (batch writes: batch 0). The
gateway keeps each writer's last stored number, and the writer sends only the
rows above it: a retried task, a speculative copy, or a micro-batch Spark
replays after a crash re-appends the same numbers, and nothing is stored twice.
That holds while a replay sends the same rows to the same Spark partitions in
the same order (a deterministic query). Rows are visible to subscribers as a
task appends them, before Spark commits the batch: a batch that fails and is
never retried leaves what its tasks wrote (``commit`` and ``abort`` have
nothing to undo). The sink id: the option ``sinkId``; by default a streaming
query uses its id, which its checkpoint keeps across restarts, and a batch
write a new random id (give ``sinkId`` to make a batch write repeatable: the
same write under the same ``sinkId`` stores nothing new).
"""

from __future__ import annotations

import logging
import time
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from gateway.core.model import Message, Source
from gateway.durable import envelope
from gateway.pipeline.options import WriteOptions
from gateway.pipeline.planning import segment_name
from protocols.segment.blocking import BlockingWriter, SegmentClient

__all__ = [
    "NAMESPACE",
    "InterchangeBatchWriter",
    "InterchangeStreamWriter",
    "SinkCommitMessage",
    "event_number",
    "partition_of",
    "writer_id",
]

log = logging.getLogger("gateway.pipeline")

#: The namespace of the sink's writer ids (uuid5).
NAMESPACE = uuid.UUID("6f1c2a4e-3b7d-5e08-9a61-2d4c8b0e7f35")
#: Rows of one task buffered per segment before an append.
_FLUSH_ROWS = 8192


def writer_id(sink_id: str, spark_partition: int, segment: str) -> uuid.UUID:
    """The writer id of a Spark partition's appends to ``segment``."""
    return uuid.uuid5(NAMESPACE, f"{sink_id}/{spark_partition}/{segment}")


def event_number(batch_id: int, index: int) -> int:
    """The event number of the ``index``-th row a task appends to one segment in
    micro-batch ``batch_id`` (0 for a batch write)."""
    if not 0 <= index < 1 << 32:
        raise ValueError(f"a task appends at most 2**32 rows to a segment, not {index + 1}")
    return (batch_id + 1) << 32 | index


def partition_of(key: str, partitions: int) -> int:
    """The partition of a row with ``partition_key`` ``key``: as the gateway's
    partitioned destinations place a message whose key header is ``key``."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task appended: rows seen, and events the gateway stored (fewer on a
    retry: those already stored are skipped)."""

    spark_partition: int
    rows: int
    stored: int


def _check_schema(schema: Any) -> None:
    """ValueError unless ``schema`` has the columns the sink needs, of usable types."""
    fields = {f.name: f.dataType.simpleString() for f in schema.fields}
    wanted = {
        "body": ("binary", "string"),
        "headers": ("map<string,string>",),
        "content_type": ("string",),
        "partition_key": ("string",),
    }
    if "body" not in fields:
        raise ValueError(f"the interchange sink needs a column body, not only {sorted(fields)}")
    for name, types in wanted.items():
        if name in fields and fields[name] not in types:
            raise ValueError(f"column {name}: {fields[name]}, not {' or '.join(types)}")


class _Task:
    """One task's appends: a writer per segment, rows buffered and numbered."""

    def __init__(self, opts: WriteOptions, sink_id: str, spark_partition: int, batch_id: int):
        self.opts = opts
        self.sink_id = sink_id
        self.spark_partition = spark_partition
        self.batch_id = batch_id
        self.client: SegmentClient = opts.connection.client()
        infos = self.client.partitions(opts.destination)
        if not infos:
            raise ValueError(
                f"destination {opts.destination!r}: no segment {opts.destination}/0 at the"
                " gateway (the sink writes durable destinations)"
            )
        self.partitions = len(infos)
        self.source = Source("spark", sink_id)
        self.writers: dict[int, BlockingWriter] = {}
        self.pending: dict[int, list[Message]] = {}
        self.counts: dict[int, int] = {}
        self.rows = self.stored = 0

    def add(self, batch: pa.RecordBatch) -> None:
        """Buffer the rows of ``batch``, appending a segment's when enough wait."""
        n = batch.num_rows
        names = batch.schema.names
        bodies = batch.column("body").to_pylist()
        headers = batch.column("headers").to_pylist() if "headers" in names else [None] * n
        types = batch.column("content_type").to_pylist() if "content_type" in names else [None] * n
        keys = batch.column("partition_key").to_pylist() if "partition_key" in names else [None] * n
        default = self.spark_partition % self.partitions
        destination, source = self.opts.destination, self.source
        for body, head, ctype, key in zip(bodies, headers, types, keys, strict=True):
            if body is None:
                raise ValueError("the interchange sink cannot write a row whose body is null")
            if isinstance(body, str):
                body = body.encode("utf-8")
            p = default if key is None else partition_of(key, self.partitions)
            fields = dict(head) if head else {}
            if None in fields.values():
                raise ValueError(f"headers must be strings, not null: {fields}")
            message = Message(destination, body, fields, ctype, source)
            waiting = self.pending.setdefault(p, [])
            waiting.append(message)
            if len(waiting) >= _FLUSH_ROWS:
                self.flush(p)
        self.rows += n

    def flush(self, p: int) -> None:
        """Append the rows waiting for partition ``p``, numbered after those before."""
        messages = self.pending.pop(p, [])
        if not messages:
            return
        segment = segment_name(self.opts.destination, p)
        if p not in self.writers:
            wid = writer_id(self.sink_id, self.spark_partition, segment)
            self.writers[p] = self.client.writer(segment, wid, envelope=True)
        first = self.counts.get(p, 0)
        self.counts[p] = first + len(messages)
        payloads = envelope.encode_many(messages, stored_at=time.time())
        self.stored += self.writers[p].append(payloads, event_number(self.batch_id, first))

    def finish(self) -> SinkCommitMessage:
        try:
            for p in sorted(self.pending):
                self.flush(p)
        finally:
            for writer in self.writers.values():
                writer.close()
            self.client.close()
        return SinkCommitMessage(self.spark_partition, self.rows, self.stored)


def _write(
    opts: WriteOptions, sink_id: str | None, batch_id: int, batches: Iterator[pa.RecordBatch]
) -> SinkCommitMessage:
    """One task's write: its rows appended, each stored once."""
    context = TaskContext.get()
    spark_partition = context.partitionId() if context is not None else 0
    if sink_id is None:
        sink_id = context.getLocalProperty("sql.streaming.queryId") if context else None
        if not sink_id:
            raise ValueError("option sinkId is needed outside a streaming query")
    task = _Task(opts, sink_id, spark_partition, batch_id)
    try:
        for batch in batches:
            task.add(batch)
    except BaseException:
        task.client.close()
        raise
    return task.finish()


class InterchangeBatchWriter(DataSourceArrowWriter):
    """A batch write (``df.write``). Without ``sinkId`` it gets a random one, made
    here on the driver, so every task and retry of this write shares it."""

    def __init__(self, options: WriteOptions, schema: Any) -> None:
        _check_schema(schema)
        self.options = options
        self.sink_id = options.sink_id or str(uuid.uuid4())

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return _write(self.options, self.sink_id, 0, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: each task's rows were stored as it appended them."""
        log.debug("sink %s: %s", self.sink_id, _summary(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo; what tasks appended stays (the sink's docstring says why)."""
        log.warning("sink %s: write aborted after %s", self.sink_id, _summary(messages))


class InterchangeStreamWriter(DataSourceStreamArrowWriter):
    """A streaming write (``df.writeStream``): each micro-batch's rows numbered by
    its batch id, under the query's id unless ``sinkId`` is given."""

    def __init__(self, options: WriteOptions, schema: Any) -> None:
        _check_schema(schema)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        context = TaskContext.get()
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        if batch is None:
            raise RuntimeError("no streaming.sql.batchId in the task: not a streaming query")
        return _write(self.options, self.options.sink_id, int(batch), iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task's rows were stored as it appended them."""
        log.debug("batch %d: %s", batchId, _summary(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo; a replay of the batch skips what was stored."""
        log.warning("batch %d aborted after %s", batchId, _summary(messages))


def _summary(messages: list[WriterCommitMessage | None]) -> str:
    done = [m for m in messages if isinstance(m, SinkCommitMessage)]
    rows = sum(m.rows for m in done)
    stored = sum(m.stored for m in done)
    return f"{len(done)} of {len(messages)} tasks wrote {rows} rows, {stored} stored"
