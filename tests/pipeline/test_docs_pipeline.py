"""docs/pipeline.md's Spark examples, run as a reader would: against a gateway
holding a few JSON log events, with the docs' address replaced by the test
gateway's segment listener and their relative paths put under the test's
temporary directory (Spark's JVM resolves relative paths against the directory
it started in: the test run's, not the example's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from documented import python_examples

from tests.pipeline.traffic import publish, read_all

pytestmark = pytest.mark.spark

HERE = "tests/pipeline/test_docs_pipeline.py"
EXAMPLES = [e for e in python_examples() if e.tested_by == HERE]
#: The address the docs use: the embedded default config's segment listener.
DOCS_ADDRESS = "127.0.0.1:12345"


def test_the_docs_have_their_spark_examples() -> None:
    assert [e.where for e in EXAMPLES] == [
        "docs/pipeline.md#0",
        "docs/pipeline.md#2",
        "docs/pipeline.md#3",
    ]
    assert all(DOCS_ADDRESS in e.code for e in EXAMPLES)


def test_the_examples_read_stream_and_write_as_documented(
    spark: Any,
    gateway: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bodies = [
        json.dumps({"level": level, "message": f"event {i}"}).encode()
        for i, level in enumerate(["info", "error", "warn", "ERROR", "info"])
    ]
    publish(gateway.address("ndjson"), bodies)
    for example in EXAMPLES:
        code = example.code.replace(DOCS_ADDRESS, gateway.address("segment"))
        code = code.replace('"checkpoints/', f'"{tmp_path}/checkpoints/')
        code = code.replace('"levels"', f'"{tmp_path}/levels"')
        exec(compile(code, example.where, "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert "ndjson" in out  # the batch read's count per source protocol
    assert "closed minutes counted" in out
    alerts = read_all(gateway.address("ndjson"), "alerts")
    assert [a.body for a in alerts] == [
        bodies[1],
        bodies[3],
        b'{"level": "error", "message": "by hand"}',
    ]
    assert [a.headers for a in alerts] == [
        {"source": "logs"},
        {"source": "logs"},
        {"origin": "notebook"},
    ]
    assert [a.content_type for a in alerts[:2]] == ["application/json"] * 2
    assert (tmp_path / "checkpoints" / "alerts" / "commits").is_dir()
    assert (tmp_path / "levels" / "_spark_metadata").is_dir()
