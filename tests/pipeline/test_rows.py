"""Stored events as the ``interchange`` data source's rows: envelopes and raw events
framed as a segment keeps them, decoded into Arrow batches of the exact schema."""

from __future__ import annotations

import datetime as dt
from typing import Any

import msgpack
import pytest

from gateway.core.model import Message, PeerIdentity, Source
from gateway.durable import envelope
from gateway.pipeline.rows import ARROW_SCHEMA, DDL, ENVELOPE, RAW, decode_chunk, empty_batch
from gateway.store.records import frame_events

STORED = 1_800_000_000.123  # seconds since the epoch


def messages() -> list[Message]:
    ndjson = Source("ndjson", "edge", "10.0.0.7:5000", None, STORED - 1)
    tls = Source("lumberjack", "beats", "", PeerIdentity("CN=host"), STORED - 1)
    return [
        Message(
            "logs", b'{"level":"error"}', {"key": "a", "env": "prod"}, "application/json", ndjson
        ),
        Message("logs", b"plain"),
        Message("logs", b"\x00\xff", {}, None, tls),
    ]


@pytest.mark.spark
def test_the_arrow_schema_is_what_spark_expects_for_the_ddl(spark: Any) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import _parse_datatype_string

    assert to_arrow_schema(_parse_datatype_string(DDL), timezone="UTC").equals(ARROW_SCHEMA)


def test_envelopes_become_rows_with_their_headers_content_type_and_source() -> None:
    data = frame_events(envelope.encode_many(messages(), stored_at=STORED))
    [batch] = decode_chunk("logs", 2, 1000, data, [(1000, ENVELOPE)])
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    stamp = dt.datetime(2027, 1, 15, 8, 0, 0, 123000, tzinfo=dt.UTC)
    first = len(envelope.encode_many(messages()[:1], stored_at=STORED)[0]) + 8
    assert rows[0] == {
        "destination": "logs",
        "partition": 2,
        "offset": 1000,
        "timestamp": stamp,
        "source_protocol": "ndjson",
        "listener": "edge",
        "peer": "10.0.0.7:5000",
        "content_type": "application/json",
        "headers": [("key", "a"), ("env", "prod")],
        "body": b'{"level":"error"}',
    }
    assert rows[1]["offset"] == 1000 + first
    assert rows[1]["headers"] == []
    assert rows[1]["source_protocol"] is None
    assert rows[1]["content_type"] is None
    assert (rows[2]["source_protocol"], rows[2]["listener"], rows[2]["peer"]) == (
        "lumberjack",
        "beats",
        None,
    )
    assert [r["timestamp"] for r in rows] == [stamp] * 3


def test_raw_events_have_a_body_and_no_envelope_columns() -> None:
    data = frame_events([b"one", b"", b"three"])
    [batch] = decode_chunk("logs", 0, 0, data, [(0, RAW)])
    assert batch.schema.equals(ARROW_SCHEMA)
    rows = batch.to_pylist()
    assert [r["body"] for r in rows] == [b"one", b"", b"three"]
    assert [r["offset"] for r in rows] == [0, 11, 19]
    for row in rows:
        assert row["headers"] == []
        assert row["timestamp"] is None
        assert row["content_type"] is row["source_protocol"] is row["listener"] is None


def test_a_chunk_of_both_formats_is_a_batch_per_run() -> None:
    raw = frame_events([b"r1", b"r2"])
    env = frame_events(envelope.encode_many(messages()[:2], stored_at=STORED))
    runs = [(500, RAW), (500 + len(raw), ENVELOPE)]
    batches = list(decode_chunk("logs", 0, 500, raw + env, runs))
    assert [b.num_rows for b in batches] == [2, 2]
    bodies = [r["body"] for b in batches for r in b.to_pylist()]
    assert bodies == [b"r1", b"r2", b'{"level":"error"}', b"plain"]
    assert batches[1].to_pylist()[0]["offset"] == 500 + len(raw)


def test_unknown_envelope_keys_are_ignored_and_a_newer_version_refused() -> None:
    doc = {"v": 1, "b": b"x", "s": 5, "zz": [1, 2]}
    data = frame_events([msgpack.packb(doc)])
    [batch] = decode_chunk("logs", 0, 0, data, [(0, ENVELOPE)])
    assert batch.to_pylist()[0]["body"] == b"x"
    data = frame_events([msgpack.packb({**doc, "v": 2})])
    with pytest.raises(ValueError, match="version 2"):
        list(decode_chunk("logs", 0, 0, data, [(0, ENVELOPE)]))


def test_envelopes_laid_out_otherwise_read_the_same() -> None:
    """Bodies of every bin size, and an envelope whose keys come in another order
    than the gateway writes them (decoded whole rather than body and metadata)."""
    docs = [{"v": 1, "b": b"x" * size, "s": 7, "c": "t/p"} for size in (10, 300, 70_000)]
    docs.append({"c": "t/p", "s": 7, "b": b"reordered", "v": 1})
    data = frame_events([msgpack.packb(doc) for doc in docs])
    [batch] = decode_chunk("logs", 0, 0, data, [(0, ENVELOPE)])
    rows = batch.to_pylist()
    assert [r["body"] for r in rows] == [d["b"] for d in docs]
    assert {(r["content_type"], r["timestamp"].microsecond) for r in rows} == {("t/p", 7000)}


def test_events_of_one_publish_share_metadata_others_do_not() -> None:
    first = envelope.encode_many(messages()[:1] * 3, stored_at=STORED)
    later = envelope.encode_many(messages()[:1], stored_at=STORED + 1)
    data = frame_events(first + later)
    [batch] = decode_chunk("logs", 0, 0, data, [(0, ENVELOPE)])
    stamps = [r["timestamp"].timestamp() for r in batch.to_pylist()]
    assert stamps == [STORED] * 3 + [STORED + 1]


def test_a_bad_envelope_is_named_by_its_byte() -> None:
    good = frame_events(envelope.encode_many(messages()[1:2], stored_at=STORED))
    data = good + frame_events([msgpack.packb({"v": 1, "b": "text, not bin", "s": 5})])
    with pytest.raises(ValueError, match=f"bad envelope at byte {700 + len(good)}"):
        list(decode_chunk("logs", 0, 700, data, [(700, ENVELOPE)]))


def test_damaged_records_and_bad_framing_are_errors() -> None:
    data = frame_events([b"a"])
    with pytest.raises(ValueError, match="format 255"):
        list(decode_chunk("logs", 0, 0, data, [(0, 255)]))
    with pytest.raises(ValueError, match="framing"):
        list(decode_chunk("logs", 0, 0, data[:-1], [(0, RAW)]))


def test_the_empty_batch_has_the_schema() -> None:
    batch = empty_batch()
    assert batch.num_rows == 0
    assert batch.schema.equals(ARROW_SCHEMA)
