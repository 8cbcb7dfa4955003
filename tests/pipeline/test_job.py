"""The example job of ``gateway pipeline`` on events built in memory: the traffic
statistics it writes to Parquet against counts computed here, the alerts it
selects, and the ``from_json`` recipe that reads a log event's level."""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.spark

#: The ``interchange`` source's columns, as a DDL schema.
EVENTS = (
    "destination string, partition int, offset bigint, timestamp timestamp, "
    "source_protocol string, listener string, peer string, content_type string, "
    "headers map<string,string>, body binary"
)
T0 = dt.datetime(2026, 11, 27, 12, 0, 0, tzinfo=dt.UTC)


def event(
    offset: int,
    body: bytes | None,
    *,
    seconds: float | None = 0.0,
    destination: str = "logs",
    protocol: str | None = "lumberjack",
    partition: int = 0,
) -> tuple[Any, ...]:
    """One row as the source gives it; ``seconds`` after T0 is its stored time
    (None: a raw event, without envelope: no time, protocol, headers)."""
    stamp = None if seconds is None else T0 + dt.timedelta(seconds=seconds)
    raw = seconds is None
    return (
        destination,
        partition,
        offset,
        stamp,
        None if raw else protocol,
        None if raw else protocol,
        None if raw else "127.0.0.1:5000",
        None if raw else "application/json",
        {} if raw else {"key": "k"},
        body,
    )


def traffic() -> list[tuple[Any, ...]]:
    """Events over four minutes, two destinations, three protocols, bodies of
    varied size, and raw events that have no stored time."""
    rows = []
    protocols = ("lumberjack", "ndjson", "segment")
    for i in range(60):
        body = json.dumps({"n": i, "pad": "x" * (i % 7)}).encode()
        rows.append(
            event(
                i,
                body,
                seconds=i * 4.1,
                destination=("logs", "parts")[i % 2],
                protocol=protocols[i % 3],
                partition=i % 2,
            )
        )
    rows.append(event(60, b"raw bytes", seconds=None))
    return rows


def expected_stats(rows: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], tuple[int, int]]:
    """(window start, destination, protocol) -> (messages, bytes), counted here."""
    messages: Counter[tuple[Any, ...]] = Counter()
    size: Counter[tuple[Any, ...]] = Counter()
    for destination, _, _, stamp, protocol, *_, body in rows:
        if stamp is None:
            continue
        start = stamp.replace(second=0, microsecond=0)
        key = (start, destination, protocol)
        messages[key] += 1
        size[key] += len(body)
    return {key: (messages[key], size[key]) for key in messages}


def as_dict(rows: list[Any]) -> dict[tuple[Any, ...], tuple[int, int]]:
    result = {}
    for row in rows:
        start = row.window_start.astimezone(dt.UTC)
        assert row.window_end.astimezone(dt.UTC) - start == dt.timedelta(minutes=1)
        result[(start, row.destination, row.source_protocol)] = (row.messages, row.bytes)
    return result


def test_traffic_stats_counts_messages_and_bytes_per_window(spark: Any) -> None:
    from gateway.pipeline.job import traffic_stats

    rows = traffic()
    stats = traffic_stats(spark.createDataFrame(rows, EVENTS)).collect()
    assert as_dict(stats) == expected_stats(rows)
    assert len(stats) > 6  # several windows, destinations and protocols


def test_stats_stream_appends_closed_windows_to_parquet(spark: Any, tmp_path: Path) -> None:
    """As a stream, a window reaches Parquet once the watermark (2 minutes behind the
    latest stored time) has passed its end; Spark reads back exactly those."""
    from gateway.pipeline.job import JobSettings, traffic_stats, write_stats

    rows = traffic()
    late = event(61, b"{}", seconds=10 * 60)  # moves the watermark past every window above
    inbox = tmp_path / "inbox"
    spark.createDataFrame([*rows, late], EVENTS).write.parquet(str(inbox))
    stream = spark.readStream.schema(EVENTS).parquet(str(inbox))
    settings = JobSettings(
        address="unused:1",
        output=tmp_path / "out",
        checkpoint=tmp_path / "checkpoint",
        available_now=True,
    )
    query = write_stats(traffic_stats(stream), settings)
    assert query.awaitTermination(120)
    assert query.exception() is None
    written = spark.read.parquet(str(settings.output)).collect()
    assert as_dict(written) == expected_stats(rows)  # not the late event's open window
    assert (settings.checkpoint / "stats" / "commits").is_dir()


BODIES: dict[bytes | None, str | None] = {
    b'{"level": "ERROR", "message": "disk full"}': "error",
    b'{"log": {"level": "error"}, "message": "beats, nested"}': "error",
    b'{"log.level": "Fatal", "message": "ecs, dotted"}': "fatal",
    b'{"level": " critical "}': "critical",
    b'{"level": "err"}': "err",
    b'{"log.level": "error", "level": "info"}': "error",
    b'{"level": "warn"}': None,
    b'{"level": "information"}': None,
    b'{"message": "error in the text only"}': None,
    b"error: not JSON": None,
    b'["level", "error"]': None,
    b"": None,
    None: None,
}


def test_alerts_are_the_error_level_events_with_their_origin(spark: Any) -> None:
    from gateway.pipeline.job import alerts

    rows = [
        event(i, body, destination=("logs", "parts")[i % 2], partition=i % 2)
        for i, body in enumerate(BODIES)
    ]
    got = alerts(spark.createDataFrame(rows, EVENTS)).collect()
    wanted = [(i, body, lvl) for i, (body, lvl) in enumerate(BODIES.items()) if lvl]
    assert [bytes(r.body) for r in got] == [body for _, body, _ in wanted]
    assert {r.content_type for r in got} == {"application/json"}
    assert [r.headers for r in got] == [
        {
            "level": lvl,
            "source_destination": ("logs", "parts")[i % 2],
            "source_partition": str(i % 2),
            "source_offset": str(i),
        }
        for i, _, lvl in wanted
    ]


def test_level_reads_json_bodies_as_strings_or_bytes(spark: Any) -> None:
    """The ``from_json`` recipe on both column types; a field of another JSON type
    than the schema says does not hide the others."""
    from pyspark.sql import functions as F

    from gateway.pipeline.job import level

    bodies = [
        '{"level": "Error"}',
        '{"log": "a string, not an object", "level": "fatal"}',
        '{"log": {"level": 3}}',
        "{not json",
    ]
    frame = spark.createDataFrame([(b, b.encode()) for b in bodies], "text string, raw binary")
    got = frame.select(level(F.col("text")), level(F.col("raw"))).collect()
    assert [tuple(r) for r in got] == [
        ("error", "error"),
        ("fatal", "fatal"),
        ("3", "3"),
        (None, None),
    ]
