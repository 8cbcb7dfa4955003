"""``gateway pipeline`` without Spark: its options, where it finds the gateway, and
the progress lines it prints from Spark's progress records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import build_parser, main
from gateway.pipeline.command import PipelineError, cmd_pipeline, settings_from
from gateway.pipeline.progress import ProgressPrinter, format_progress, lag

SEGMENT_ON = """
[gateway]
data_dir = "data"

[[listeners]]
name = "ndjson"
protocol = "ndjson"
bind = "127.0.0.1:7070"
destination = "logs"
{segment}
[[destinations]]
name = "logs"
kind = "queue"
store = "embedded"
"""

SEGMENT = """
[[listeners]]
name = "seg"
protocol = "segment"
bind = "{bind}"
destination = "logs"
"""


def config_file(tmp_path: Path, bind: str | None) -> str:
    text = SEGMENT_ON.format(segment=SEGMENT.format(bind=bind) if bind else "")
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def parse(*argv: str) -> Any:
    return build_parser().parse_args(["pipeline", *argv])


def test_defaults_read_logs_of_the_default_config_on_local_cores() -> None:
    args = parse()
    assert args.func is cmd_pipeline
    assert args.master == "local[*]"
    settings = settings_from(args)
    assert settings.address == "127.0.0.1:12345"  # the embedded default's segment listener
    assert settings.sources == ("logs",)
    assert settings.alerts == "alerts"
    assert settings.output == Path("pipeline-output")
    assert settings.checkpoint == Path("pipeline-checkpoint")
    assert (settings.trigger_seconds, settings.available_now) == (0.0, False)
    assert settings.max_records_per_trigger is None
    assert args.conf == []


def test_every_option_reaches_the_job_settings(tmp_path: Path) -> None:
    args = parse(
        "--address=gw.example:4000",
        "--master=spark://m:7077",
        "--source= logs, parts ,",
        "--alerts=pages",
        f"--output={tmp_path / 'o'}",
        f"--checkpoint={tmp_path / 'c'}",
        "--trigger=2.5",
        "--available-now",
        "--max-records-per-trigger=500",
        "--conf=spark.sql.shuffle.partitions=8",
        "--conf",
        "spark.executor.extraJavaOptions=-Da=b",
    )
    assert args.master == "spark://m:7077"
    assert dict(args.conf) == {
        "spark.sql.shuffle.partitions": "8",
        "spark.executor.extraJavaOptions": "-Da=b",
    }
    settings = settings_from(args)
    assert settings.address == "gw.example:4000"
    assert settings.sources == ("logs", "parts")
    assert settings.alerts == "pages"
    assert (settings.output, settings.checkpoint) == (tmp_path / "o", tmp_path / "c")
    assert (settings.trigger_seconds, settings.available_now) == (2.5, True)
    assert settings.max_records_per_trigger == 500


@pytest.mark.parametrize(
    "argv",
    [
        ["--trigger=-1"],
        ["--trigger=soon"],
        ["--max-records-per-trigger=0"],
        ["--conf=spark.master"],
        ["--conf==x"],
        ["--bogus"],
    ],
)
def test_bad_options_are_usage_errors(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit:
        parse(*argv)
    assert exit.value.code == 2


@pytest.mark.parametrize(
    ("bind", "address"),
    [
        ("127.0.0.1:9001", "127.0.0.1:9001"),
        ("0.0.0.0:9002", "127.0.0.1:9002"),
        ("[::]:9003", "[::1]:9003"),
        ("gw.internal:9004", "gw.internal:9004"),
    ],
)
def test_the_address_is_the_config_files_segment_listener(
    tmp_path: Path, bind: str, address: str
) -> None:
    settings = settings_from(parse("-c", config_file(tmp_path, bind)))
    assert settings.address == address


def test_address_overrides_the_config(tmp_path: Path) -> None:
    missing = str(tmp_path / "nowhere.toml")  # not even read
    assert settings_from(parse("-c", missing, "--address=h:1")).address == "h:1"


def test_a_config_without_segment_listener_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config_file(tmp_path, None)
    with pytest.raises(PipelineError, match="has no segment listener"):
        settings_from(parse("-c", path))
    assert main(["pipeline", "-c", path]) == 1  # before any Spark starts
    assert "has no segment listener: add one, or pass --address" in capsys.readouterr().err


def test_a_bad_config_file_fails_with_its_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[[listeners]]\nname = 3\n", encoding="utf-8")
    assert main(["pipeline", "-c", str(path)]) == 1
    assert "bad.toml" in capsys.readouterr().err


def test_no_source_is_refused() -> None:
    with pytest.raises(PipelineError, match="--source names no destination"):
        settings_from(parse("--address=h:1", "--source=,"))


# --- progress lines -------------------------------------------------------------

#: A progress record as ``json.loads(query.lastProgress.json)`` gives it (trimmed).
RECORDED = {
    "id": "0b6b2d5e-7f4e-4a43-9d4c-1f0d7a5e2b11",
    "runId": "5a9c0c1e-1d5b-4f8b-8a77-3f3b6c7d8e90",
    "name": "stats",
    "timestamp": "2026-11-27T23:40:01.250Z",
    "batchId": 7,
    "numInputRows": 1200,
    "inputRowsPerSecond": 1000.0,
    "processedRowsPerSecond": 4511.6,
    "durationMs": {"addBatch": 180, "latestOffset": 3, "triggerExecution": 266},
    "sources": [
        {
            "description": "interchange",
            "startOffset": {"logs": {"0": 0, "1": 100}},
            "endOffset": {"logs": {"0": 5000, "1": 700}},
            "latestOffset": {"logs": {"0": 5000, "1": 1259100}, "parts": {"0": 300}},
            "numInputRows": 1200,
        }
    ],
}


def test_a_progress_line_has_batch_rate_duration_and_lag_per_partition() -> None:
    assert format_progress(RECORDED) == (
        "stats batch 7: 1200 rows, 4512 rows/s, 266 ms; "
        "lag logs/0 0 B, logs/1 1.2 MiB, parts/0 300 B"
    )


def test_offsets_given_as_json_text_as_pyspark_does() -> None:
    source = {
        key: json.dumps(value) if "Offset" in key else value
        for key, value in RECORDED["sources"][0].items()  # type: ignore[index]
    }
    assert lag(source) == {"logs/0": 0, "logs/1": 1258400, "parts/0": 300}
    assert lag({**source, "latestOffset": "null"}) is None
    no_latest = {**RECORDED, "sources": [{**source, "latestOffset": None}], "name": None}
    assert format_progress(no_latest) == "0b6b2d5e batch 7: 1200 rows, 4512 rows/s, 266 ms"


def test_each_record_is_printed_once_per_query() -> None:
    printer = ProgressPrinter()
    first = {**RECORDED, "timestamp": "2026-11-27T23:40:00.000Z", "batchId": 6}
    assert [line.split(":")[0] for line in printer.new_lines("q", [first, RECORDED])] == [
        "stats batch 6",
        "stats batch 7",
    ]
    assert printer.new_lines("q", [first, RECORDED]) == []
    assert len(printer.new_lines("other", [RECORDED])) == 1
    idle = {**RECORDED, "timestamp": "2026-11-27T23:40:11.250Z", "numInputRows": 0}
    assert printer.new_lines("q", [first, RECORDED, idle]) == [format_progress(idle)]


def test_an_idle_heartbeat_says_it_waits_and_shows_the_lag() -> None:
    """Without new data Spark runs no batch but reports every ten seconds, with the
    next batch's id: that is not a batch of 0 rows."""
    idle = {**RECORDED, "numInputRows": 0, "durationMs": {"triggerExecution": 2}}
    line = format_progress(idle)
    assert line.startswith("stats waiting for data (batch 7 next); lag logs/0 0 B")
    empty = {**RECORDED, "numInputRows": 0, "durationMs": {"addBatch": 5, "triggerExecution": 9}}
    assert format_progress(empty).startswith("stats batch 7: 0 rows, ")


# --- end to end -----------------------------------------------------------------


@pytest.mark.spark
def test_available_now_run_sends_alerts_to_an_ndjson_subscriber(
    gateway: Any, tmp_path: Path
) -> None:
    """``gateway pipeline --available-now`` as a user runs it, in a process of its
    own: Beats-style, ECS-style and plain JSON log events in; the error-level ones
    reach a subscriber of the alerts destination, with content type and headers."""
    import subprocess

    from tests.pipeline.traffic import pipeline_command, publish, read_all

    ndjson = gateway.address("ndjson")
    bodies = [
        b'{"log": {"level": "error"}, "message": "beats"}',
        b'{"log.level": "warning", "message": "ecs"}',
        b'{"level": "FATAL", "message": "plain"}',
        b"not json at all",
        b'{"level": "info"}',
    ]
    publish(ndjson, bodies)
    run = subprocess.run(
        pipeline_command(gateway.address("segment"), "--master=local[2]", "--available-now"),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "stats batch 0: 5 rows" in run.stdout
    assert "alerts batch 0: 5 rows" in run.stdout
    assert "lag logs/0 0 B" in run.stdout
    alerts = read_all(ndjson, "alerts")
    # Two Spark tasks (with minPartitions) may write their alerts in either order.
    by_body = {a.body: a for a in alerts}
    assert len(alerts) == 2
    assert set(by_body) == {bodies[0], bodies[2]}
    assert {a.content_type for a in alerts} == {"application/json"}
    assert [by_body[b].headers.get("level") for b in (bodies[0], bodies[2])] == ["error", "fatal"]
    assert {a.headers.get("source_destination") for a in alerts} == {"logs"}
    assert (tmp_path / "pipeline-checkpoint" / "stats" / "commits").is_dir()
    assert (tmp_path / "pipeline-output" / "_spark_metadata").is_dir()
