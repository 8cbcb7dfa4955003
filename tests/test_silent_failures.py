"""Failures that used to pass without a word: each is now said, or slowed down."""

from __future__ import annotations

import functools
import itertools
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import running_gateway
from waits import until

from gateway import cli
from gateway.config.loader import ConfigError, parse
from gateway.runtime.registry import Registered, Registry, default_registry


def _upstream_config(address: str) -> dict[str, Any]:
    return {
        "listeners": [],
        "upstreams": [{"name": "sink", "protocol": "lumberjack", "connect": [address]}],
    }


async def test_an_upstream_that_accepts_and_drops_backs_off(autojump_clock: Any) -> None:
    """It reconnected every half second forever: the backoff started over at each connect."""
    accepted: list[float] = []

    async def drop(stream: trio.SocketStream) -> None:
        accepted.append(trio.current_time())
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), drop, 0
        )
        port = listener.socket.getsockname()[1]
        async with running_gateway(_upstream_config(f"127.0.0.1:{port}")):
            await trio.sleep(60)
        nursery.cancel_scope.cancel()
    # 0.5 s doubling to 5 s: about 14 attempts in a minute, not 120.
    assert 8 <= len(accepted) <= 16, accepted
    gaps = [b - a for a, b in itertools.pairwise(accepted)]
    assert max(gaps) >= 4.5


async def test_connection_refused_is_named_in_the_upstream_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    with trio.socket.socket() as probe:  # a port with nobody listening
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with running_gateway(_upstream_config(f"127.0.0.1:{port}")):
        await until(lambda: "cannot connect" in caplog.text)
    lines = [r.getMessage() for r in caplog.records if "cannot connect" in r.getMessage()]
    assert lines, caplog.text
    assert "ECONNREFUSED (Connection refused)" in lines[0]


def test_gateway_plugins_into_a_closed_pipe_prints_no_traceback() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "plugins"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # like `| head -0`: the reader is gone before anything is written
    _, err = proc.communicate(timeout=60)
    assert b"Traceback" not in err
    assert b"BrokenPipeError" not in err
    assert proc.returncode == 0


def test_a_broken_plugin_is_a_warning_on_every_run(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    base = default_registry()
    broken = Registered("widget", "widget.plugin:Widget", "widget-gw", "1.0", error="No module")
    registry = Registry({**base.protocols, "widget": broken}, base.transports)
    monkeypatch.setattr(cli, "default_registry", lambda: registry)
    caplog.set_level(logging.WARNING)
    config = parse({"listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}]})
    cli._warn_about(config)
    assert "protocol plugin 'widget' (widget-gw 1.0) failed to load" in caplog.text
    assert "No module" in caplog.text


def test_an_empty_config_is_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    cli._warn_about(parse({}))
    assert "has no listeners and no upstreams" in caplog.text


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("127.0.0.1:7070", "0.0.0.0:7070"),
        ("*:7070", "10.0.0.1:7070"),
        ("[::]:7070", "[::1]:7070"),
    ],
)
def test_check_refuses_a_wildcard_bind_beside_a_specific_one(first: str, second: str) -> None:
    data = {
        "listeners": [
            {"name": "a", "protocol": "ndjson", "bind": first},
            {"name": "b", "protocol": "ndjson", "bind": second},
        ]
    }
    with pytest.raises(ConfigError, match=r"listeners\[1\]\.bind: .* overlaps listeners\[0\]"):
        parse(data)


def test_check_refuses_a_metrics_bind_overlapping_a_listener() -> None:
    data = {
        "listeners": [{"name": "a", "protocol": "ndjson", "bind": "0.0.0.0:9464"}],
        "metrics": {"bind": "127.0.0.1:9464"},
    }
    with pytest.raises(ConfigError, match=r"metrics\.bind: .* overlaps listeners\[0\]"):
        parse(data)


def test_different_ports_and_specific_addresses_do_not_overlap() -> None:
    parse(
        {
            "listeners": [
                {"name": "a", "protocol": "ndjson", "bind": "127.0.0.1:7070"},
                {"name": "b", "protocol": "ndjson", "bind": "127.0.0.2:7070"},
                {"name": "c", "protocol": "ndjson", "bind": "0.0.0.0:7071"},
            ]
        }
    )
