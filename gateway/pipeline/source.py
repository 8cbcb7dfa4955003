"""The ``interchange`` data source: Spark reads a gateway's durable destinations.

::

    from gateway.pipeline import register

    register(spark)
    df = (
        spark.read.format("interchange")
        .option("address", "gw:12345")
        .option("destination", "logs")
        .load()
    )

A batch read takes what is durable between ``startingOffsets`` and
``endingOffsets``; a streaming read (``spark.readStream``) goes on from its
checkpointed offsets, a micro-batch at a time, within ``maxRecordsPerTrigger``
or ``maxBytesPerTrigger``, and supports ``Trigger.AvailableNow``. The options
are those of :mod:`gateway.pipeline.options`, the offsets and limits those of
:mod:`gateway.pipeline.planning`, the rows those of :mod:`gateway.pipeline.rows`.

Where the code runs (Spark's Python data source model): ``partitions``,
``latestOffset`` and the other offset calls run on the driver, a streaming
query's in one long-lived process that keeps its connection to the gateway;
``read`` runs in executors' Python workers, each opening its own connection.
Reads are deterministic: a range of durable bytes always reads the same events,
so a micro-batch Spark replays after a failure reads what it read before.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from gateway.pipeline.options import ReadOptions, WriteOptions
from gateway.pipeline.planning import (
    LATEST,
    Bound,
    Planner,
    SegmentRange,
    checked_start,
    offsets_from_json,
    offsets_to_json,
)
from gateway.pipeline.rows import DDL, decode_chunk
from protocols.segment.blocking import SegmentClient
from protocols.segment.errors import SegmentTruncatedError

__all__ = [
    "InterchangeBatchReader",
    "InterchangeDataSource",
    "InterchangeStreamReader",
    "SegmentPartition",
    "read_range",
]

log = logging.getLogger("gateway.pipeline")


class InterchangeDataSource(DataSource):
    """The ``interchange`` format: reads and writes a gateway's durable destinations
    over its segment-append listener."""

    @classmethod
    def name(cls) -> str:
        return "interchange"

    def schema(self) -> str:
        return DDL

    def reader(self, schema: Any) -> DataSourceReader:
        return InterchangeBatchReader(ReadOptions.parse(self.options))

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return InterchangeStreamReader(ReadOptions.parse(self.options))

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        from gateway.pipeline.sink import InterchangeBatchWriter

        return InterchangeBatchWriter(WriteOptions.parse(self.options), schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        from gateway.pipeline.sink import InterchangeStreamWriter

        return InterchangeStreamWriter(WriteOptions.parse(self.options), schema)


@dataclass(frozen=True)
class SegmentPartition(SegmentRange, InputPartition):
    """A :class:`~gateway.pipeline.planning.SegmentRange` as Spark's input partition."""


def _partitions(ranges: Sequence[SegmentRange]) -> list[InputPartition]:
    return [SegmentPartition(r.destination, r.partition, r.segment, r.start, r.end) for r in ranges]


def read_range(options: ReadOptions, part: SegmentRange) -> Iterator[pa.RecordBatch]:
    """The rows of ``part``, a batch per read chunk (per payload format within one).
    Bytes retention dropped after planning are data loss (see
    :func:`~gateway.pipeline.planning.checked_start`)."""
    start = part.start
    with options.connection.client() as client:
        while start < part.end:
            try:
                for offset, data, formats in client.read_chunks(part.segment, start, part.end):
                    yield from decode_chunk(part.destination, part.partition, offset, data, formats)
                    start = offset + len(data)
                return
            except SegmentTruncatedError as e:
                if e.start_offset <= start:
                    raise
                start = checked_start(
                    part.destination,
                    part.partition,
                    start,
                    e.start_offset,
                    fail=options.fail_on_data_loss,
                    why="could not be read (dropped by retention, or a damaged record)",
                )


class InterchangeBatchReader(DataSourceReader):
    """A batch read: the ranges from ``startingOffsets`` to ``endingOffsets``."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.options
        with opts.connection.client() as client:
            planner = _planner(client, opts)
            layout = planner.layout()
            for destination, infos in layout.items():
                if not infos:
                    log.warning(
                        "destination %r: no segment %s/0 at the gateway", destination, destination
                    )
            start = planner.resolve(opts.starting, layout)
            end = planner.resolve(opts.ending, layout, missing=LATEST)
            return _partitions(planner.ranges(start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SegmentRange):
            yield from read_range(self.options, partition)


def _planner(client: SegmentClient, opts: ReadOptions) -> Planner:
    return Planner(
        client,
        opts.destinations,
        fail_on_data_loss=opts.fail_on_data_loss,
        max_bytes_per_partition=opts.max_bytes_per_partition,
        min_partitions=opts.min_partitions,
    )


class InterchangeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """A streaming read. Offsets are ``{destination: {partition: byte offset}}``; the
    driver's calls share one connection, opened on first use; ``read`` opens its
    own in the executor."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._client: SegmentClient | None = None
        self._target: dict[tuple[str, int], Bound] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    @property
    def planner(self) -> Planner:
        if self._client is None:
            self._client = self.options.connection.client()
        return _planner(self._client, self.options)

    def initialOffset(self) -> dict[str, Any]:
        planner = self.planner
        return offsets_to_json(planner.resolve(self.options.starting, planner.layout()))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records is not None:
            return ReadMaxRows(self.options.max_records)
        if self.options.max_bytes is not None:
            return ReadMaxBytes(self.options.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the durable ends of now: an AvailableNow query reads up to them."""
        planner = self.planner
        self._target = planner.bounds(planner.layout())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        size = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        end = self.planner.latest(
            offsets_from_json(start), max_rows=rows, max_bytes=size, target=self._target
        )
        return offsets_to_json(end)

    def reportLatestOffset(self) -> dict[str, Any]:
        """The durable ends, for the query's progress (how far behind it is)."""
        layout = self.planner.layout()
        return offsets_to_json(
            {d: {p: info.end for p, info in enumerate(infos)} for d, infos in layout.items()}
        )

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = self.planner.ranges(offsets_from_json(start), offsets_from_json(end))
        return _partitions(ranges)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, SegmentRange):
            yield from read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the gateway keeps data by retention, not by readers'
        positions (a query's position is its checkpoint)."""
        log.debug("committed up to %s", end)

    def stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
