"""The ``interchange`` data source in Spark, against a real gateway: what three
protocols sent read back with their headers and content types, a partitioned
destination read in full, a streaming read under a record limit with
Trigger.AvailableNow, and a start that retention dropped."""

from __future__ import annotations

import contextlib
import json
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pylogbeat
import pytest
import trio
from interchange_ndjson.client import NdjsonClient
from pyspark.errors import StreamingQueryException

from gateway.pipeline.options import ReadOptions
from gateway.pipeline.planning import DataLossError, SegmentRange
from gateway.pipeline.source import read_range
from protocols.segment.blocking import SegmentClient
from tests.harness import host_port
from tests.pipeline.conftest import GatewayThread, pipeline_config

pytestmark = pytest.mark.spark


def publish(
    address: str,
    bodies: Sequence[bytes],
    destination: str,
    *,
    headers: Mapping[str, str] | None = None,
    content_type: str | None = None,
) -> None:
    """Publish ``bodies`` over ndjson and wait until each is stored."""

    async def main() -> None:
        async with await NdjsonClient.connect(*host_port(address)) as client:
            ids = await client.publish_nowait(
                list(bodies), destination, headers=headers, content_type=content_type
            )
            answers = await client.wait_answers(ids)
            assert {a.status for a in answers} == {"delivered"}, answers

    trio.run(main)


def append_raw(address: str, segment: str, payloads: Sequence[bytes]) -> None:
    """Append ``payloads`` as a segment-append writer's own bytes."""
    with SegmentClient(address) as client, client.writer(segment, uuid.uuid4()) as writer:
        assert writer.append(list(payloads), 1) == len(payloads)


def read(spark: Any, gateway: GatewayThread, destination: str, **options: str) -> list[Any]:
    reader = spark.read.format("interchange").option("address", gateway.address("segment"))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.option("destination", destination).load().collect()


def test_what_three_protocols_sent_reads_back_with_headers_and_content_types(
    spark: Any, gateway: GatewayThread
) -> None:
    append_raw(gateway.address("segment"), "logs/0", [b"raw one", b"raw two"])
    publish(
        gateway.address("ndjson"),
        [b'{"n": 1}', b'{"n": 2}'],
        "logs",
        headers={"env": "test", "team": "a"},
        content_type="application/json",
    )
    with pylogbeat.PyLogBeatClient(*host_port(gateway.address("lumberjack"))) as beats:
        beats.send([{"message": "disk full", "level": "error"}])
    rows = read(spark, gateway, "logs")
    assert [r.offset for r in rows] == sorted({r.offset for r in rows})
    assert {(r.destination, r.partition) for r in rows} == {("logs", 0)}
    by_protocol: dict[Any, list[Any]] = {}
    for row in rows:
        by_protocol.setdefault(row.source_protocol, []).append(row)
    raw, ndjson, [beat] = by_protocol[None], by_protocol["ndjson"], by_protocol["lumberjack"]
    assert [(bytes(r.body), r.content_type, r.headers, r.timestamp) for r in raw] == [
        (b"raw one", None, {}, None),
        (b"raw two", None, {}, None),
    ]
    assert [bytes(r.body) for r in ndjson] == [b'{"n": 1}', b'{"n": 2}']
    for row in ndjson:
        assert row.headers == {"env": "test", "team": "a"}
        assert row.content_type == "application/json"
        assert row.listener == "ndjson"
        assert row.peer.startswith("127.0.0.1:")
        assert row.timestamp is not None
    assert json.loads(bytes(beat.body))["message"] == "disk full"
    assert (beat.content_type, beat.listener) == ("application/json", "lumberjack")


def test_a_partitioned_destination_is_read_in_full_split_and_by_offsets(
    spark: Any, gateway: GatewayThread
) -> None:
    keys = [f"k{i}" for i in range(12)]
    for key in keys:
        publish(
            gateway.address("ndjson"),
            [f"{key}-{j}".encode() for j in range(5)],
            "parts",
            headers={"key": key},
        )
    rows = read(spark, gateway, "parts", maxBytesPerPartition="300")
    assert sorted(bytes(r.body).decode() for r in rows) == sorted(
        f"{k}-{j}" for k in keys for j in range(5)
    )
    for row in rows:
        assert row.partition == zlib.crc32(row.headers["key"].encode()) % 3
    assert len({(r.partition, r.offset) for r in rows}) == len(rows)
    # Partition 0 from its second event, 1 up to its last (an end inside that event
    # is the boundary before it), none of 2.
    second0 = sorted(r.offset for r in rows if r.partition == 0)[1]
    last1 = max(r.offset for r in rows if r.partition == 1)
    starting = {"parts": {"0": second0, "1": -2, "2": -1}}
    ending = {"parts": {"0": -1, "1": last1 + 3, "2": -1}}
    some = read(
        spark,
        gateway,
        "parts",
        startingOffsets=json.dumps(starting),
        endingOffsets=json.dumps(ending),
    )
    expected = {
        (r.partition, r.offset)
        for r in rows
        if (r.partition == 1 and r.offset < last1) or (r.partition == 0 and r.offset >= second0)
    }
    assert {(r.partition, r.offset) for r in some} == expected


def test_a_stream_reads_every_record_once_in_limited_batches(
    spark: Any, gateway: GatewayThread, tmp_path: Path
) -> None:
    append_raw(gateway.address("segment"), "logs/0", [f"r{i}".encode() for i in range(25)])
    stream = (
        spark.readStream.format("interchange")
        .option("address", gateway.address("segment"))
        .option("destination", "logs")
        .option("maxRecordsPerTrigger", "10")
        .option("minPartitions", "2")
        .load()
    )
    query = (
        stream.writeStream.format("memory")
        .queryName("limited")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120)
        assert query.exception() is None
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        bodies = [bytes(r.body) for r in spark.sql("SELECT body FROM limited").collect()]
    finally:
        query.stop()
    assert sizes == [10, 10, 5]
    assert sorted(bodies) == sorted(f"r{i}".encode() for i in range(25))


def truncated_gateway(tmp_path: Path) -> GatewayThread:
    """A gateway whose ``logs`` keeps about 2 KiB: older events are dropped."""
    config = pipeline_config(tmp_path / "data")
    config["destinations"][0].update(retain=2048, overflow="drop_oldest")
    return GatewayThread(config).start()


def test_a_start_retention_dropped_fails_or_is_skipped(spark: Any, tmp_path: Path) -> None:
    gateway = truncated_gateway(tmp_path)
    try:
        bodies = [f"event {i:03d} ".encode() * 10 for i in range(60)]
        publish(gateway.address("ndjson"), bodies, "logs")
        from_zero = json.dumps({"logs": {"0": 0}})
        with pytest.raises(Exception, match="segment 'logs/0': bytes 0 to") as info:
            read(spark, gateway, "logs", startingOffsets=from_zero)
        assert "failOnDataLoss" in str(info.value)
        rows = read(spark, gateway, "logs", startingOffsets=from_zero, failOnDataLoss="false")
    finally:
        gateway.stop()
    kept = [bytes(r.body) for r in rows]
    assert 0 < len(kept) < len(bodies)
    assert kept == bodies[-len(kept) :]


def test_a_stream_behind_retention_fails_or_skips(spark: Any, tmp_path: Path) -> None:
    gateway = truncated_gateway(tmp_path)

    def run(checkpoint: str, fail: str) -> Any:
        query = (
            spark.readStream.format("interchange")
            .option("address", gateway.address("segment"))
            .option("destination", "logs")
            .option("failOnDataLoss", fail)
            .load()
            .select("body")
            .writeStream.format("parquet")
            .option("path", str(tmp_path / checkpoint / "out"))
            .option("checkpointLocation", str(tmp_path / checkpoint / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        with contextlib.suppress(StreamingQueryException):  # seen in query.exception()
            query.awaitTermination(120)
        return query

    try:
        publish(gateway.address("ndjson"), [b"first"], "logs")
        for checkpoint in ("strict", "lenient"):
            assert run(checkpoint, "true").exception() is None
        later = [f"later {i:03d} ".encode() * 10 for i in range(60)]
        publish(gateway.address("ndjson"), later, "logs")
        failed = run("strict", "true").exception()
        assert failed is not None
        assert "segment 'logs/0': bytes" in str(failed)
        assert run("lenient", "false").exception() is None
        out = spark.read.parquet(str(tmp_path / "lenient" / "out")).collect()
    finally:
        gateway.stop()
    kept = sorted(bytes(r.body) for r in out if bytes(r.body) != b"first")
    assert 0 < len(kept) < len(later)
    assert kept == later[-len(kept) :]


def test_a_range_retention_dropped_after_planning(tmp_path: Path) -> None:
    """What an executor meets when retention runs between planning and reading."""
    gateway = truncated_gateway(tmp_path)
    try:
        bodies = [f"event {i:03d} ".encode() * 10 for i in range(60)]
        publish(gateway.address("ndjson"), bodies, "logs")
        with SegmentClient(gateway.address("segment")) as client:
            info = client.info("logs/0")
        planned = SegmentRange("logs", 0, "logs/0", 0, info.end)
        strict = ReadOptions.parse({"address": gateway.address("segment"), "destination": "logs"})
        with pytest.raises(DataLossError, match=f"segment 'logs/0': bytes 0 to {info.start}"):
            list(read_range(strict, planned))
        lenient = replace(strict, fail_on_data_loss=False)
        rows = [r for batch in read_range(lenient, planned) for r in batch.to_pylist()]
    finally:
        gateway.stop()
    assert rows[0]["offset"] == info.start
    assert [r["body"] for r in rows] == bodies[-len(rows) :]
