"""Logs that explain: a line per connection accepted and closed (and why), JSON lines,
levels and formats in any case, from the config and the command line."""

from __future__ import annotations

import io
import json
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway

from gateway.cli import build_parser
from gateway.config.loader import ConfigError, parse
from gateway.ops.logsetup import JsonFormatter, log_context, parse_level, setup_logging
from gateway.runtime.gateway import Gateway


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """Our handler, at DEBUG and in JSON, on the root logger for one test."""
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = setup_logging("DEBUG", "JSON", stream)
    assert handler is not None
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def connection_lines(stream: io.StringIO, what: str) -> list[dict[str, Any]]:
    return [r for r in lines(stream) if f"connection {what}" in r["message"]]


def ndjson(**options: Any) -> dict[str, Any]:
    return {
        "listeners": [
            {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0", **options},
        ],
        "gateway": {"drain_timeout": "1s"},
    }


async def closed_by_gateway(stream: trio.SocketStream) -> bytes:
    data = b""
    with trio.fail_after(5):
        while chunk := await stream.receive_some():
            data += chunk
    return data


async def wait_closed(gw: Gateway) -> None:
    with trio.fail_after(5):
        while gw.connections("nd"):
            await trio.sleep(0.01)


# -- JSON lines ------------------------------------------------------------------------------


def test_json_lines_carry_the_record_the_context_and_the_exception(
    json_log: io.StringIO,
) -> None:
    async def task() -> None:
        log_context(listener="in", peer="192.0.2.1:4000")
        logging.getLogger("gateway.test").info("hello %s", "world", extra={"bytes_in": 12})
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("gateway.test").exception("failed")

    trio.run(task)
    logging.getLogger("gateway.test").warning("outside")  # no context here
    hello, failed, outside = lines(json_log)
    assert list(hello)[:4] == ["time", "level", "logger", "message"]
    assert hello["time"].endswith("Z")
    assert "T" in hello["time"]
    assert hello["level"] == "INFO"
    assert hello["logger"] == "gateway.test"
    assert hello["message"] == "hello world"
    assert (hello["listener"], hello["peer"], hello["bytes_in"]) == ("in", "192.0.2.1:4000", 12)
    assert failed["level"] == "ERROR"
    assert "ValueError: boom" in failed["exception"]
    assert "listener" not in outside
    assert outside["message"] == "outside"


def test_json_formatter_turns_odd_values_into_strings() -> None:
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", (), None)
    record.path = Path("/a")
    record.pair = (1, Path("/b"))
    out = json.loads(JsonFormatter().format(record))
    assert out["path"] == "/a"
    assert out["pair"] == [1, "/b"]


def test_levels_and_formats_are_case_insensitive() -> None:
    assert parse_level("INFO") == "info"
    assert parse_level("Debug") == "debug"
    with pytest.raises(ValueError, match="must be one of"):
        parse_level("verbose")
    with pytest.raises(ValueError, match="must be one of"):
        setup_logging("info", "xml", io.StringIO())


def test_config_takes_log_level_and_format_in_any_case() -> None:
    config = parse({"gateway": {"log_level": "INFO", "log_format": "JSON"}}, source="t.toml")
    assert (config.gateway.log_level, config.gateway.log_format) == ("info", "json")
    assert parse({}, source="t.toml").gateway.log_format == "text"
    with pytest.raises(ConfigError) as e:
        parse({"gateway": {"log_level": "loud", "log_format": "xml"}}, source="t.toml")
    assert any(x.startswith("t.toml: gateway.log_level: must be one of") for x in e.value.errors)
    assert any(x.startswith("t.toml: gateway.log_format: must be one of") for x in e.value.errors)


def test_command_line_takes_log_level_and_format_in_any_case() -> None:
    args = build_parser().parse_args(["run", "--log-level", "DEBUG", "--log-format", "Json"])
    assert (args.log_level, args.log_format) == ("debug", "json")


def test_gateway_run_logs_json_lines(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(
        '[gateway]\nlog_level = "Info"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "run", str(config), "--log-format", "JSON"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        deadline = time.monotonic() + 30
        records = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            records.append(json.loads(line))
            if "serving:" in records[-1]["message"]:
                break
        serving = records[-1]
        assert serving["level"] == "INFO"
        assert serving["logger"] == "gateway.runtime"
        assert serving["message"].startswith("serving: nd (ndjson) on 127.0.0.1:")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    for line in proc.stderr.read().splitlines():
        assert json.loads(line)["level"] in ("INFO", "WARNING")


# -- a line per connection ------------------------------------------------------------------


async def test_a_connection_is_logged_when_accepted_and_closed(json_log: io.StringIO) -> None:
    async with running_gateway(ndjson()) as gw:
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        ping = b'{"op":"ping"}\n'
        await stream.send_all(ping)
        pong = await stream.receive_some()
        await stream.aclose()
        await wait_closed(gw)
    [accepted] = connection_lines(json_log, "accepted")
    [closed] = connection_lines(json_log, "closed")
    peer = accepted["peer"]
    assert peer.startswith("127.0.0.1:")
    assert accepted["listener"] == "nd"
    assert accepted["level"] == "DEBUG"
    assert accepted["message"] == f"[nd {peer}] connection accepted"
    assert accepted["logger"] == "gateway.protocol.ndjson"
    assert (closed["listener"], closed["peer"]) == ("nd", peer)
    assert closed["close_reason"] == "peer closed"
    assert (closed["bytes_in"], closed["bytes_out"]) == (len(ping), len(pong))
    assert 0 <= closed["duration"] < 5
    assert closed["message"] == (
        f"[nd {peer}] connection closed after {closed['duration']:.3f}s (peer closed):"
        f" {len(ping)} bytes in, {len(pong)} bytes out"
    )


@pytest.mark.parametrize(
    ("options", "send", "why"),
    [
        ({"idle_timeout": "100ms"}, b"", "idle"),
        ({"max_line": "64B"}, b'{"op":"ping","pad":"' + b"x" * 100 + b'"}\n', "protocol error"),
    ],
    ids=["idle", "protocol-error"],
)
async def test_why_the_gateway_closed_a_connection(
    json_log: io.StringIO, options: dict[str, Any], send: bytes, why: str
) -> None:
    async with running_gateway(ndjson(**options)) as gw:
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        if send:
            await stream.send_all(send)
        await closed_by_gateway(stream)
        await wait_closed(gw)
    [closed] = connection_lines(json_log, "closed")
    assert closed["close_reason"] == why
    assert f"({why})" in closed["message"]


async def test_connections_open_at_shutdown_close_for_shutdown(json_log: io.StringIO) -> None:
    async with running_gateway(ndjson()) as gw:
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        await stream.send_all(b'{"op":"ping"}\n')
        await stream.receive_some()
    [closed] = connection_lines(json_log, "closed")
    assert closed["close_reason"] == "shutdown"
    await stream.aclose()


async def test_a_refused_connection_is_logged(json_log: io.StringIO) -> None:
    async with running_gateway(ndjson(max_connections=1)) as gw:
        address = host_port(gw.addresses["nd"][0])
        first = await trio.open_tcp_stream(*address)
        await first.send_all(b'{"op":"ping"}\n')
        await first.receive_some()
        second = await trio.open_tcp_stream(*address)
        await closed_by_gateway(second)
        await first.aclose()
    [refused] = connection_lines(json_log, "refused")
    assert refused["close_reason"] == "max connections"
    assert refused["listener"] == "nd"
    assert refused["message"].endswith("connection refused: max connections")


def test_a_worker_says_which_it_is_on_every_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gateway run --workers N``: each worker process marks its lines."""
    from gateway.ops import logsetup

    monkeypatch.setattr(logsetup, "_process", {})
    logsetup.log_process(2)
    for fmt, expected in (("text", " [worker 2] gateway.test: hello"), ("json", '"worker": 2')):
        out = io.StringIO()
        handler = logsetup.setup_logging("info", fmt, out)
        try:
            logging.getLogger("gateway.test").info("hello")
        finally:
            assert handler is not None
            logging.getLogger().removeHandler(handler)
        assert expected in out.getvalue(), out.getvalue()
