"""The ``interchange`` sink against a real gateway: rows become messages every
subscriber receives, ``partition_key`` places them, and nothing is stored twice
when a batch is written again, a task is retried, or a micro-batch replayed."""

from __future__ import annotations

import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gateway.config.certs import init_dir
from gateway.pipeline.options import WriteOptions
from gateway.pipeline.sink import InterchangeBatchWriter, event_number, partition_of, writer_id
from protocols.segment.blocking import SegmentClient
from tests.pipeline.conftest import GatewayThread, pipeline_config
from tests.pipeline.traffic import read_all

SCHEMA = "body STRING, headers MAP<STRING, STRING>, content_type STRING, partition_key STRING"


def read_back(spark: Any, gateway: GatewayThread, destination: str) -> list[Any]:
    return (
        spark.read.format("interchange")
        .option("address", gateway.address("segment"))
        .option("destination", destination)
        .load()
        .collect()
    )


def write(df: Any, gateway: GatewayThread, destination: str, sink_id: str) -> None:
    (
        df.write.format("interchange")
        .mode("append")
        .option("address", gateway.address("segment"))
        .option("destination", destination)
        .option("sinkId", sink_id)
        .save()
    )


def test_identities_and_numbers() -> None:
    assert writer_id("q", 1, "parts/2") == writer_id("q", 1, "parts/2")
    assert len({writer_id("q", 1, "a/0"), writer_id("q", 2, "a/0"), writer_id("r", 1, "a/0")}) == 3
    assert event_number(0, 0) == 1 << 32
    assert event_number(6, 5) == 7 << 32 | 5
    assert partition_of("user-42", 3) == zlib.crc32(b"user-42") % 3
    with pytest.raises(ValueError, match="2\\*\\*32"):
        event_number(0, 1 << 32)


@pytest.mark.spark
def test_rows_become_messages_placed_by_their_partition_key(
    spark: Any, gateway: GatewayThread
) -> None:
    rows = [(f"b{i}", {"n": str(i)}, "text/plain", f"key{i}") for i in range(30)]
    rows += [("unkeyed", None, None, None)]
    write(spark.createDataFrame(rows, SCHEMA).coalesce(1), gateway, "parts", "keyed")
    got = {bytes(r.body).decode(): r for r in read_back(spark, gateway, "parts")}
    assert sorted(got) == sorted(r[0] for r in rows)
    for i in range(30):
        row = got[f"b{i}"]
        assert row.partition == zlib.crc32(f"key{i}".encode()) % 3
        assert (row.headers, row.content_type) == ({"n": str(i)}, "text/plain")
        assert (row.source_protocol, row.listener) == ("spark", "keyed")
    unkeyed = got["unkeyed"]
    assert (unkeyed.partition, unkeyed.headers, unkeyed.content_type) == (0, {}, None)


@pytest.mark.spark
def test_the_same_batch_written_twice_is_stored_once(spark: Any, gateway: GatewayThread) -> None:
    df = spark.createDataFrame([(f"alert {i}",) for i in range(40)], "body STRING").repartition(2)
    write(df, gateway, "alerts", "nightly")
    write(df, gateway, "alerts", "nightly")
    bodies = sorted(bytes(r.body).decode() for r in read_back(spark, gateway, "alerts"))
    assert bodies == sorted(f"alert {i}" for i in range(40))
    delivered = read_all(gateway.address("ndjson"), "alerts")
    assert sorted(d.body.decode() for d in delivered) == bodies
    # Another sink id is another write.
    write(df.limit(3), gateway, "alerts", "other")
    assert len(read_back(spark, gateway, "alerts")) == 43


def arrow_rows(bodies: list[str]) -> Iterator[pa.RecordBatch]:
    yield pa.RecordBatch.from_pydict({"body": bodies})


@pytest.mark.spark
def test_a_retried_task_stores_what_its_first_attempt_did_not(gateway: GatewayThread) -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType([StructField("body", StringType())])
    options = WriteOptions.parse(
        {"address": gateway.address("segment"), "destination": "alerts", "sinkId": "retry"}
    )
    bodies = [f"row {i}" for i in range(10)]
    # The first attempt dies after its first 4 rows were appended; the retry (a new
    # writer, as Spark unpickles one per attempt) writes the same rows again.
    first = InterchangeBatchWriter(options, schema).write(arrow_rows(bodies[:4]))
    retry = InterchangeBatchWriter(options, schema).write(arrow_rows(bodies))
    again = InterchangeBatchWriter(options, schema).write(arrow_rows(bodies))
    assert (first.stored, retry.stored, again.stored) == (4, 6, 0)
    assert (retry.rows, retry.spark_partition) == (10, 0)
    with SegmentClient(gateway.address("segment")) as client:
        stored = [e.payload for e in client.read("alerts/0", 0, client.info("alerts/0").end)]
    assert len(stored) == 10


@pytest.mark.spark
def test_rows_without_a_body_or_with_a_null_header_are_refused(gateway: GatewayThread) -> None:
    from pyspark.sql.types import MapType, StringType, StructField, StructType

    schema = StructType(
        [
            StructField("body", StringType()),
            StructField("headers", MapType(StringType(), StringType())),
        ]
    )
    options = WriteOptions.parse({"address": gateway.address("segment"), "destination": "alerts"})
    nulls = pa.RecordBatch.from_pydict(
        {"body": ["x"], "headers": [[("a", None)]]},
        schema=pa.schema([("body", pa.string()), ("headers", pa.map_(pa.string(), pa.string()))]),
    )
    with pytest.raises(ValueError, match="headers must be strings, not null"):
        InterchangeBatchWriter(options, schema).write(iter([nulls]))
    with pytest.raises(ValueError, match="body is null"):
        InterchangeBatchWriter(options, schema).write(arrow_rows([None]))  # type: ignore[list-item]
    with pytest.raises(ValueError, match="needs a column body"):
        InterchangeBatchWriter(options, StructType([StructField("value", StringType())]))


@pytest.mark.spark
def test_a_replayed_micro_batch_is_not_stored_twice(
    spark: Any, gateway: GatewayThread, tmp_path: Path
) -> None:
    with SegmentClient(gateway.address("segment")) as client:
        client.writer("logs/0", uuid.uuid4()).append([f"e{i}".encode() for i in range(20)], 1)
    checkpoint = tmp_path / "checkpoint"

    def run() -> Any:
        query = (
            spark.readStream.format("interchange")
            .option("address", gateway.address("segment"))
            .option("destination", "logs")
            .option("maxRecordsPerTrigger", "10")
            .load()
            .selectExpr("body", "map('from', CAST(offset AS STRING)) AS headers")
            .writeStream.format("interchange")
            .option("address", gateway.address("segment"))
            .option("destination", "alerts")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None
        return query

    first = run()
    # Spark wrote the sink's output of batch 1 but crashed before recording it:
    # the restarted query runs batch 1 again.
    for name in ("1", ".1.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    second = run()
    assert [p["batchId"] for p in second.recentProgress if p["numInputRows"]] == [1]
    rows = read_back(spark, gateway, "alerts")
    assert sorted(bytes(r.body) for r in rows) == sorted(f"e{i}".encode() for i in range(20))
    assert {r.listener for r in rows} == {str(first.id)} == {str(second.id)}
    assert len({r.headers["from"] for r in rows}) == 20


@pytest.mark.spark
def test_reads_and_writes_over_tls(spark: Any, tmp_path: Path) -> None:
    certs = init_dir(tmp_path / "certs")
    config = pipeline_config(tmp_path / "data")
    tls = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    config["listeners"].append(
        {"name": "segtls", "protocol": "segment", "bind": "127.0.0.1:0", "tls": tls}
    )
    gateway = GatewayThread(config).start()
    options = {
        "address": "",
        "tlsCaFile": str(certs["ca_cert"]),
        "tlsServerName": "localhost",
    }
    try:
        options["address"] = gateway.address("segtls")
        df = spark.createDataFrame([("over tls",)], "body STRING")
        df.write.format("interchange").mode("append").options(**options).option(
            "destination", "alerts"
        ).save()
        rows = (
            spark.read.format("interchange")
            .options(**options)
            .option("destination", "alerts")
            .load()
            .collect()
        )
        options["tlsCaFile"] = str(certs["server_cert"])  # not the CA: refused
        with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
            spark.read.format("interchange").options(**options).option(
                "destination", "alerts"
            ).load().collect()
    finally:
        gateway.stop()
    assert [bytes(r.body) for r in rows] == [b"over tls"]
