"""``gateway pipeline``: run the example job (:mod:`gateway.pipeline.job`) on Spark.

It reads the gateway's durable destinations (``--source``, default ``logs``)
through the segment listener, appends traffic statistics to Parquet
(``--output``) and writes alerts back to a gateway destination (``--alerts``).
The gateway's address comes from ``--address``, or from the segment listener of
the config file (``-c``; without one the embedded default config, whose segment
listener is ``127.0.0.1:12345``).

It runs on ``local[*]`` unless ``--master`` names a cluster, prints a progress
line per micro-batch, and on Ctrl-C (SIGINT) or SIGTERM stops both queries and
exits 0: a batch in flight is interrupted, and the checkpoint (``--checkpoint``)
keeps it as planned but not committed, so the next run does it again. With
``--available-now`` it processes what is there when it starts, then exits.

Exit status: 0 after a clean stop; 1 when the job could not start or a query
failed; 2 for a usage error. Also runnable as ``python -m gateway.pipeline.command``.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from gateway.config.loader import Config, ConfigError, default_config, load

if TYPE_CHECKING:
    from gateway.pipeline.job import JobSettings

__all__ = ["add_parser", "build_parser", "main", "run", "segment_address", "settings_from"]

#: Seconds between two looks at the queries' progress.
POLL_SECONDS = 1.0


class PipelineError(Exception):
    """The job cannot start as asked (no segment listener, a TLS listener, ...)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``gateway pipeline``."""
    parser.add_argument(
        "-c", "--config", help="a gateway config file: its segment listener is the address"
    )
    parser.add_argument("--address", help="the gateway's segment listener, host:port")
    parser.add_argument("--master", default="local[*]", help="Spark master (default: local[*])")
    parser.add_argument(
        "--source",
        default="logs",
        help="the durable destinations to read, comma-separated (default: logs)",
    )
    parser.add_argument("--alerts", default="alerts", help="where alerts go (default: alerts)")
    parser.add_argument(
        "--output", default="pipeline-output", help="Parquet statistics (default: %(default)s)"
    )
    parser.add_argument(
        "--checkpoint",
        default="pipeline-checkpoint",
        help="the queries' checkpoints (default: %(default)s)",
    )
    parser.add_argument(
        "--trigger",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="seconds between micro-batches (default: 0, one after the other)",
    )
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="process what the destinations hold now, then exit",
    )
    parser.add_argument(
        "--max-records-per-trigger",
        type=_positive,
        metavar="N",
        help="at most N events per micro-batch, shared over the partitions",
    )
    parser.add_argument(
        "--conf",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting, e.g. spark.sql.shuffle.partitions=8 (repeatable)",
    )


def add_parser(sub: Any) -> None:
    """Add ``pipeline`` to the ``gateway`` command's subparsers."""
    parser = sub.add_parser(
        "pipeline",
        help="run the example Spark job: traffic statistics to Parquet, alerts back",
        description="Run the example Spark job on the gateway's durable destinations: "
        "traffic statistics to Parquet, alerts back to a destination.",
    )
    add_arguments(parser)
    parser.set_defaults(func=cmd_pipeline)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m gateway.pipeline.command``."""
    parser = argparse.ArgumentParser(
        prog="gateway pipeline", description="Run the example Spark job on the gateway's data."
    )
    add_arguments(parser)
    return parser


def segment_address(config: Config) -> str:
    """``host:port`` to reach the config's (first) segment listener from this
    machine: a wildcard bind is reached on loopback."""
    for listener in config.listeners:
        if listener.protocol != "segment":
            continue
        if listener.tls is not None:
            raise PipelineError(
                f"the segment listener {listener.name!r} uses TLS, which gateway pipeline "
                "does not: run the job with spark-submit and the source's TLS options"
            )
        host, sep, port = listener.bind.rpartition(":")
        if not sep or host.startswith("unix") or not port.isdigit():
            raise PipelineError(
                f"the segment listener {listener.name!r} binds {listener.bind!r}, "
                "not a TCP host:port: pass --address"
            )
        host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "[::]": "[::1]"}.get(host, host)
        return f"{host}:{port}"
    where = config.path or "the embedded default config"
    raise PipelineError(f"{where} has no segment listener: add one, or pass --address")


def settings_from(args: argparse.Namespace) -> JobSettings:
    """The job's settings from the parsed options; the address from ``--address``
    or the config's segment listener."""
    from gateway.pipeline.job import JobSettings

    if args.address:
        address = args.address
    else:
        config = load(args.config) if args.config else default_config()
        address = segment_address(config)
    sources = tuple(name.strip() for name in args.source.split(",") if name.strip())
    if not sources:
        raise PipelineError("--source names no destination")
    return JobSettings(
        address=address,
        sources=sources,
        alerts=args.alerts,
        output=Path(args.output),
        checkpoint=Path(args.checkpoint),
        trigger_seconds=args.trigger,
        available_now=args.available_now,
        max_records_per_trigger=args.max_records_per_trigger,
    )


def cmd_pipeline(args: argparse.Namespace) -> int:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print(
            "gateway pipeline needs pyspark: pip install 'interchange-gateway[pipeline]'",
            file=sys.stderr,
        )
        return 1
    try:
        settings = settings_from(args)
    except (ConfigError, PipelineError) as e:
        print(e, file=sys.stderr)
        return 1
    from gateway.pipeline.session import local_session

    print(f"gateway pipeline: reading {','.join(settings.sources)} from {settings.address}")
    spark = local_session(args.master, conf=dict(args.conf))
    try:
        return run(spark, settings)
    finally:
        spark.stop()


def run(spark: Any, settings: JobSettings, *, out: Any = None) -> int:
    """Start the job on ``spark`` and print progress until it ends or SIGINT/SIGTERM
    ask it to stop; stop the queries; 0 unless a query failed."""
    from gateway.pipeline.job import start_job
    from gateway.pipeline.progress import ProgressPrinter

    out = out or sys.stdout
    stop = threading.Event()
    previous = _on_signals(stop)
    queries = start_job(spark, settings)
    printer = ProgressPrinter()
    try:
        while not stop.is_set() and any(q.isActive for q in queries):
            stop.wait(POLL_SECONDS)
            _print_progress(queries, printer, out)
    finally:
        for query in queries:
            query.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    _print_progress(queries, printer, out)
    failed = [q for q in queries if q.exception() is not None]
    for query in failed:
        print(f"query {query.name} failed: {query.exception()}", file=sys.stderr)
    if stop.is_set():
        print(f"stopped; the checkpoint in {settings.checkpoint} resumes it", file=out)
    return 1 if failed else 0


def _print_progress(queries: list[Any], printer: Any, out: Any) -> None:
    for query in queries:
        records = [json.loads(p.json) for p in query.recentProgress]
        for line in printer.new_lines(str(query.id), records):
            print(line, file=out, flush=True)


def _on_signals(stop: threading.Event) -> dict[int, Any]:
    """SIGINT and SIGTERM set ``stop``; the handlers they had, to put back."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, not {text}")
    return value


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key.strip(), value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m gateway.pipeline.command [options]``."""
    return cmd_pipeline(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
