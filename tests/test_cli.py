"""The ``gateway`` command, run as users run it: in a subprocess."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

GATEWAY = [sys.executable, "-m", "gateway"]


def run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*GATEWAY, *args], capture_output=True, text=True, timeout=60, cwd=cwd, check=False
    )


def start(*args: str, cwd: Path) -> tuple[subprocess.Popen[str], dict[str, tuple[str, int]]]:
    """Start ``gateway run``; return it and the listeners it reports serving."""
    proc = subprocess.Popen([*GATEWAY, "run", *args], cwd=cwd, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        if "serving:" in line:
            found = re.findall(r"(\S+) \((\w+)\) on (\S+):(\d+)", line)
            return proc, {name: (host, int(port)) for name, _, host, port in found}
    proc.kill()
    raise AssertionError(f"gateway did not start: {proc.stderr.read()}")


def roundtrip(address: tuple[str, int]) -> list[dict[str, object]]:
    """Subscribe on one connection, publish on another, ack; return both answers."""
    with (
        socket.create_connection(address, timeout=5) as sub,
        socket.create_connection(address, timeout=5) as pub,
    ):
        # Lines are handled in order: the pong says the subscription is in.
        sub.sendall(b'{"op":"sub","dest":"demo"}\n{"op":"ping"}\n')
        lines = sub.makefile()
        assert json.loads(lines.readline()) == {"op": "pong"}
        pub.sendall(b'{"op":"pub","id":1,"dest":"demo","body":"hi"}\n')
        msg = json.loads(lines.readline())
        sub.sendall(b'{"op":"ack","tag":%d}\n' % msg["tag"])
        ack = json.loads(pub.makefile().readline())
        return [msg, ack]


def test_version_and_help() -> None:
    assert run("--version").stdout.startswith("interchange-gateway ")
    assert "run" in run("--help").stdout


def test_plugins_lists_protocols_and_transports_with_roles_and_versions() -> None:
    out = run("plugins").stdout
    assert re.search(
        r"^\s+ndjson\s+server,client\s+port 7070\s+interchange-gateway-ndjson 0\.1\.0", out, re.M
    )
    for transport in ("tcp", "unix", "tls"):
        assert re.search(rf"^\s+{transport}\s+(socket|layer)\s+interchange-gateway ", out, re.M)


def test_run_with_config_serves_and_exits_0_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "gw.toml"
    config.write_text(
        '[gateway]\ndrain_timeout = "2s"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
    )
    proc, listeners = start(str(config), cwd=tmp_path)
    try:
        msg, ack = roundtrip(listeners["nd"])
        assert msg["body"] == "hi"
        assert ack == {"op": "ack", "id": 1, "status": "delivered"}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_exit_status_3_when_shutdown_abandons_unsettled_publishes(tmp_path: Path) -> None:
    """It exited 0 after a drain that timed out with publishes unsettled."""
    config = tmp_path / "gw.toml"
    config.write_text(
        '[gateway]\ndrain_timeout = "500ms"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
        '[[destinations]]\nname = "jobs"\nkind = "queue"\n'
    )
    proc, listeners = start(str(config), cwd=tmp_path)
    with socket.create_connection(listeners["nd"], timeout=5) as pub:
        try:
            pub.sendall(
                b'{"op":"pub","id":1,"dest":"jobs","body":"nobody takes this"}\n{"op":"ping"}\n'
            )
            # The pong follows the publish's hand-off to the hub: held by the queue, unsettled.
            assert json.loads(pub.makefile().readline()) == {"op": "pong"}
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=15) == 3
    assert proc.stderr is not None
    assert "1 publishes abandoned unsettled (exit status 3)" in proc.stderr.read()


def test_default_config_runs_every_protocol_on_its_port(tmp_path: Path) -> None:
    """`gateway run` with no config: the README's first command."""
    proc, listeners = start(cwd=tmp_path)
    try:
        assert listeners["ndjson"] == ("127.0.0.1", 7070)
        assert listeners["lumberjack"] == ("127.0.0.1", 5044)
        _msg, ack = roundtrip(listeners["ndjson"])
        assert ack["status"] == "delivered"
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0


def test_run_with_a_broken_config_names_the_key_and_exits_1(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text('[[listeners]]\nname = "x"\nprotocol = "ndjson"\nbind = "nowhere"\n')
    result = run("run", str(config))
    assert result.returncode == 1
    assert f"{config}: listeners[0].bind:" in result.stderr


def test_run_reports_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        config = tmp_path / "gw.toml"
        config.write_text(
            f'[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:{port}"\n'
        )
        result = run("run", str(config))
    assert result.returncode == 1
    assert "cannot start" in result.stderr


def test_certs_init_creates_a_ca_and_refuses_to_overwrite(tmp_path: Path) -> None:
    result = run("certs", "init", str(tmp_path / "certs"))
    assert result.returncode == 0, result.stderr
    names = sorted(p.name for p in (tmp_path / "certs").iterdir())
    assert names == sorted(
        ["ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key"]
    )
    again = run("certs", "init", str(tmp_path / "certs"))
    assert again.returncode == 1
    assert "--force" in again.stderr


@pytest.mark.parametrize("module", [True, False])
def test_console_script_and_module_agree(module: bool) -> None:
    cmd = [*GATEWAY, "--version"] if module else ["gateway", "--version"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.strip() == "interchange-gateway 0.1.0"
