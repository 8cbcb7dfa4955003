"""``gateway top``: the terminal view of the admin API's status.

The command runs as users run it, in a subprocess, against a gateway running
in this process; :func:`gateway.ops.top.render` is also checked on its own.
"""

from __future__ import annotations

import io
import signal
import socket
import subprocess
import sys
from typing import Any

import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from rich.console import Console

from gateway.ops.top import render

GATEWAY = [sys.executable, "-m", "gateway"]
TIMEOUT = 30.0


def config() -> dict[str, Any]:
    return {
        "admin": {"bind": "127.0.0.1:0"},
        "gateway": {"drain_timeout": "1s"},
        "listeners": [
            {"name": "ingest", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "jobs"}
        ],
        "destinations": [{"name": "jobs", "kind": "queue"}],
    }


async def test_top_once_renders_listeners_and_backlog() -> None:
    async with running_gateway(config()) as gw:
        host, port = host_port(gw.addresses["ingest"][0])
        async with await NdjsonClient.connect(host, port) as pub:
            with trio.fail_after(TIMEOUT):
                await pub.publish_nowait([b"1", b"2", b"3", b"4"])
                while gw.hub.inflight < 4:
                    await trio.sleep(0.05)
                url = f"http://{gw.admin_addresses[0]}"
                result = await trio.run_process(
                    [*GATEWAY, "top", "--once", "--url", url], capture_stdout=True, check=False
                )
    out = result.stdout.decode()
    assert result.returncode == 0, out
    assert "ingest" in out
    assert "ndjson" in out
    jobs = next(line for line in out.splitlines() if "jobs" in line and "queue" in line)
    assert " 4 " in jobs, jobs  # the backlog
    assert "no subscriber" in out  # the hint


async def test_top_exits_cleanly_on_ctrl_c() -> None:
    async with running_gateway(config()) as gw:
        url = f"http://{gw.admin_addresses[0]}"
        with trio.fail_after(TIMEOUT):
            proc = await trio.lowlevel.open_process(
                [*GATEWAY, "top", "--url", url],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
            try:
                # Real time: the other process has imported and drawn a few screens by then
                # (it tells nothing over its pipes that could be waited for).
                await trio.sleep(2.0)
                proc.send_signal(signal.SIGINT)
                assert await proc.wait() == 0
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
            assert proc.stderr is not None
            assert b"Traceback" not in await proc.stderr.receive_some(65536)


def test_top_once_says_when_the_gateway_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run(
        [*GATEWAY, "top", "--once", "--url", f"http://127.0.0.1:{port}"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert result.returncode == 1
    assert "cannot reach the admin API" in result.stderr


def test_render_shows_upstream_errors_rates_and_hints() -> None:
    status = {
        "version": "0.1.0",
        "uptime_s": 75.0,
        "draining": False,
        "ready": False,
        "not_ready": ["upstream up is backoff"],
        "inflight": 2,
        "memory": {"limit": 1 << 20, "used": 1 << 20, "peak": 1 << 20, "exhausted": True},
        "listeners": [
            {
                "name": "nd",
                "protocol": "ndjson",
                "addresses": ["127.0.0.1:7070"],
                "connections": 2,
                "max_connections": 1024,
            }
        ],
        "upstreams": [
            {
                "name": "up",
                "protocol": "ndjson",
                "state": "backoff",
                "last_error": "ECONNREFUSED (Connection refused)",
                "connected_for_s": None,
            }
        ],
        "destinations": [
            {
                "name": "upstream:up",
                "kind": "queue",
                "backlog": {"messages": 2, "bytes": 402},
                "groups": [
                    {
                        "name": "queue",
                        "queued": 2,
                        "unacked": 0,
                        "held": 2,
                        "held_bytes": 402,
                        "members": 0,
                        "full": False,
                    }
                ],
            }
        ],
        "rates": {
            "window_s": 5.0,
            "listeners": {"nd": {"messages_in": 12.5, "bytes_in": 2048.0}},
            "upstreams": {},
            "destinations": {"upstream:up": {"backlog": 0.4}},
        },
        "hints": [{"level": "warning", "subject": "memory", "text": "the budget is exhausted"}],
    }
    console = Console(file=io.StringIO(), width=160)
    console.print(render(status))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "not ready" in out
    assert "EXHAUSTED" in out
    assert "ECONNREFUSED" in out
    assert "12.5" in out
    assert "2.0 KiB" in out
    assert "memory: the budget is exhausted" in out
    assert "upstream:up" in out


def test_render_shows_each_worker_of_a_supervisor() -> None:
    """``gateway run --workers N``: the supervisor's status has a ``workers`` breakdown."""
    status = {
        "version": "0.1.0",
        "uptime_s": 5.0,
        "draining": False,
        "ready": False,
        "inflight": 0,
        "memory": {"limit": 1 << 20, "used": 0, "peak": 0, "exhausted": False},
        "listeners": [],
        "upstreams": [],
        "destinations": [],
        "workers": [
            {
                "index": 0,
                "pid": 4242,
                "running": True,
                "connections": 7,
                "messages_in": 1234,
                "messages_out": 1200,
                "inflight": 3,
                "memory_used": 4096,
            },
            {"index": 1, "pid": None, "running": False},
        ],
    }
    console = Console(file=io.StringIO(), width=160)
    console.print(render(status))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "workers" in out
    assert "4242" in out
    assert "1234" in out
    assert "4.0 KiB" in out
    assert "restarting" in out
