"""The example job of ``gateway pipeline``: traffic statistics and an alert stream.

It reads a stream of gateway events (the ``interchange`` source's columns:
destination, partition, offset, timestamp, source_protocol, listener, peer,
content_type, headers, body) and runs two streaming queries on it:

- **stats**: messages and body bytes per destination and source protocol in
  1-minute event-time windows, appended to Parquet once the watermark (2 minutes
  behind the latest event time seen) has closed a window. The event time is the
  time the gateway stored the message. Raw events (a segment writer's own
  bytes) have none and are not counted: giving them the batch's time instead
  would push the watermark to "now" while a backlog is read, and every older
  event after it would be dropped as late.
- **alerts**: error-level log events written back to a gateway destination
  through the ``interchange`` sink: the event's body unchanged, content type
  ``application/json``, and headers naming where it came from, so that
  subscribers of any protocol receive it (and ndjson subscribers can filter on
  ``level``).

The functions build DataFrames and start queries; nothing here reads options or
prints: :mod:`gateway.pipeline.command` does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

__all__ = [
    "ERROR_LEVELS",
    "LEVEL_SCHEMA",
    "WATERMARK",
    "WINDOW",
    "JobSettings",
    "alerts",
    "level",
    "read_events",
    "start_job",
    "traffic_stats",
    "write_alerts",
    "write_stats",
]

#: The length of a statistics window, and how late an event may arrive.
WINDOW = "1 minute"
WATERMARK = "2 minutes"
#: Levels (lower case) that make a log event an alert.
ERROR_LEVELS = ("error", "err", "fatal", "critical")
#: Where a JSON log event keeps its level: Beats and ECS loggers write
#: ``{"log": {"level": …}}`` or the dotted key ``{"log.level": …}``, most other
#: loggers ``{"level": …}``. ``from_json`` matches a field name literally, so the
#: dotted key is a field of its own. A body that is not a JSON object gives nulls.
LEVEL_SCHEMA = "`log.level` STRING, log STRUCT<level: STRING>, level STRING"


@dataclass(frozen=True, slots=True)
class JobSettings:
    """Everything the job needs to run; the command's options map onto it."""

    address: str
    sources: tuple[str, ...] = ("logs",)
    alerts: str = "alerts"
    output: Path = Path("pipeline-output")
    checkpoint: Path = Path("pipeline-checkpoint")
    #: Seconds between micro-batches; 0: as soon as the previous one ended.
    trigger_seconds: float = 0.0
    #: Process what is there when the job starts, then stop.
    available_now: bool = False
    max_records_per_trigger: int | None = None
    starting_offsets: str = "earliest"


def read_events(spark: SparkSession, settings: JobSettings) -> DataFrame:
    """The stream of events of the settings' source destinations."""
    reader = (
        spark.readStream.format("interchange")
        .option("address", settings.address)
        .option("destination", ",".join(settings.sources))
        .option("startingOffsets", settings.starting_offsets)
    )
    if settings.max_records_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", str(settings.max_records_per_trigger))
    return reader.load()


def traffic_stats(events: DataFrame) -> DataFrame:
    """Messages and body bytes per 1-minute window, destination and source protocol:
    columns window_start, window_end, destination, source_protocol, messages, bytes.
    Events without a stored time (raw events) are left out. On a stream, a window
    is emitted once the watermark has passed its end."""
    stamped = events.where(F.col("timestamp").isNotNull()).select(
        F.col("timestamp").alias("event_time"),
        "destination",
        "source_protocol",
        F.coalesce(F.length("body"), F.lit(0)).alias("size"),
    )
    window = F.window("event_time", WINDOW)
    counted = (
        stamped.withWatermark("event_time", WATERMARK)
        .groupBy(window, "destination", "source_protocol")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum("size").alias("bytes"))
    )
    return counted.select(
        F.col("window.start").alias("window_start"),
        F.col("window.end").alias("window_end"),
        "destination",
        "source_protocol",
        "messages",
        "bytes",
    )


def level(body: Column) -> Column:
    """The lower-cased log level of a JSON body (binary or string): ``log.level`` as
    Beats and ECS write it (nested or dotted), else ``level``; null when absent or
    when the body is not a JSON object."""
    parsed = F.from_json(body.cast("string"), LEVEL_SCHEMA)
    found = F.coalesce(
        parsed.getField("log.level"), parsed.getField("log").getField("level"), parsed["level"]
    )
    return F.lower(F.trim(found))


def alerts(events: DataFrame) -> DataFrame:
    """The error-level events as rows for the ``interchange`` sink: the body
    unchanged, content type ``application/json``, headers ``level``,
    ``source_destination``, ``source_partition`` and ``source_offset``."""
    leveled = events.withColumn("level", level(F.col("body")))
    chosen = leveled.where(F.col("level").isin(*ERROR_LEVELS))
    headers = F.create_map(
        F.lit("level"),
        F.col("level"),
        F.lit("source_destination"),
        F.col("destination"),
        F.lit("source_partition"),
        F.col("partition").cast("string"),
        F.lit("source_offset"),
        F.col("offset").cast("string"),
    )
    return chosen.select(
        F.col("body"), headers.alias("headers"), F.lit("application/json").alias("content_type")
    )


def start_job(spark: SparkSession, settings: JobSettings) -> list[StreamingQuery]:
    """Start the two queries on the settings' source destinations: stats to Parquet
    and alerts to the gateway. They run until stopped, or with ``available_now``
    until what was there at the start is processed."""
    events = read_events(spark, settings)
    return [write_stats(traffic_stats(events), settings), write_alerts(alerts(events), settings)]


def write_stats(stats: DataFrame, settings: JobSettings) -> StreamingQuery:
    """Start appending ``stats`` to Parquet files in ``settings.output`` (read them
    with Spark, which trusts only the committed files listed in ``_spark_metadata``),
    checkpointed in ``settings.checkpoint/stats``."""
    return (
        _triggered(stats.writeStream, settings)
        .queryName("stats")
        .format("parquet")
        .outputMode("append")
        .option("path", str(settings.output))
        .option("checkpointLocation", str(settings.checkpoint / "stats"))
        .start()
    )


def write_alerts(rows: DataFrame, settings: JobSettings) -> StreamingQuery:
    """Start writing ``rows`` to the gateway destination ``settings.alerts``,
    checkpointed in ``settings.checkpoint/alerts`` (the sink derives its writer ids
    from that checkpoint, so a replayed batch is not stored twice)."""
    return (
        _triggered(rows.writeStream, settings)
        .queryName("alerts")
        .format("interchange")
        .outputMode("append")
        .option("address", settings.address)
        .option("destination", settings.alerts)
        .option("checkpointLocation", str(settings.checkpoint / "alerts"))
        .start()
    )


def _triggered(writer: DataStreamWriter, settings: JobSettings) -> DataStreamWriter:
    if settings.available_now:
        return writer.trigger(availableNow=True)
    if settings.trigger_seconds > 0:
        return writer.trigger(processingTime=f"{settings.trigger_seconds} seconds")
    return writer
