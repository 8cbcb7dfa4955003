"""The deployment files: the systemd unit and its sample config, the Dockerfile
and the container's config, the Grafana dashboard.

No container engine can build the image here (no daemon, and base images come
from a registry this machine does not reach), so the Dockerfile is parsed and
checked for what docs/deployment.md promises, and every file it copies exists.
The unit is checked by ``systemd-analyze verify`` where systemd is installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from prometheus_client.parser import text_string_to_metric_families
from test_metrics_endpoint import http_request

from gateway.config.loader import default_data, load
from gateway.runtime.registry import default_registry

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "examples" / "systemd" / "interchange.service"
UNIT_CONFIG = ROOT / "examples" / "systemd" / "interchange.toml"
DOCKERFILE = ROOT / "Dockerfile"
CONTAINER_CONFIG = ROOT / "examples" / "docker" / "interchange.toml"


# --- systemd -----------------------------------------------------------------


def _unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file as {section: {key: [values]}} (keys may repeat in units)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"a key outside any section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"not a key=value line: {line}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def test_the_unit_has_what_an_operator_expects() -> None:
    unit = _unit(UNIT.read_text(encoding="utf-8"))
    service = unit["Service"]
    assert service["Type"] == ["simple"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["User"] == ["interchange"]
    assert service["NoNewPrivileges"] == ["yes"]
    assert service["ProtectSystem"] == ["strict"]
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    config = service["ExecStart"][0].split()[-1]
    assert config == "/etc/interchange/interchange.toml"
    assert config.startswith("/etc/" + service["ConfigurationDirectory"][0] + "/")


def test_the_sample_config_keeps_its_data_in_the_state_directory() -> None:
    unit = _unit(UNIT.read_text(encoding="utf-8"))
    state = "/var/lib/" + unit["Service"]["StateDirectory"][0]
    config = load(UNIT_CONFIG)
    assert config.gateway.data_dir == Path(state)
    assert config.admin_bind is not None


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``systemd-analyze verify`` on the unit, its gateway being this venv's."""
    gateway = Path(sys.executable).with_name("gateway")
    path = tmp_path / "interchange.service"
    path.write_text(unit_text.replace("/opt/interchange/bin/gateway", str(gateway)))
    return subprocess.run(
        ["systemd-analyze", "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


needs_systemd = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed"
)


@needs_systemd
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    result = _verify(UNIT.read_text(encoding="utf-8"), tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr


@needs_systemd
def test_systemd_analyze_would_catch_a_mistake(tmp_path: Path) -> None:
    broken = UNIT.read_text(encoding="utf-8").replace("Type=simple", "Type=simpel")
    result = _verify(broken, tmp_path)
    assert "simpel" in result.stderr


# --- the container -----------------------------------------------------------


def _instructions() -> list[dict[str, Any]]:
    dockerfile_parse = pytest.importorskip("dockerfile_parse")
    parser = dockerfile_parse.DockerfileParser(path=str(DOCKERFILE))
    return [i for i in parser.structure if i["instruction"] != "COMMENT"]


_KNOWN = {
    "ARG", "FROM", "WORKDIR", "COPY", "RUN", "USER", "VOLUME", "EXPOSE",
    "HEALTHCHECK", "STOPSIGNAL", "ENTRYPOINT", "CMD", "ENV", "LABEL",
}  # fmt: skip


def test_the_dockerfile_is_multi_stage_with_known_instructions() -> None:
    instructions = _instructions()
    assert {i["instruction"] for i in instructions} <= _KNOWN
    stages = [i["value"] for i in instructions if i["instruction"] == "FROM"]
    assert len(stages) == 2
    assert stages[-1].endswith("AS runtime")
    assert "slim" in stages[-1]


def _last(instructions: list[dict[str, Any]], name: str) -> str:
    values = [i["value"] for i in instructions if i["instruction"] == name]
    assert values, f"no {name}"
    return str(values[-1])


def test_the_image_runs_as_a_user_of_its_own_with_a_volume_and_a_healthcheck() -> None:
    instructions = _instructions()
    assert _last(instructions, "USER") not in ("root", "0")
    config = tomllib.loads(CONTAINER_CONFIG.read_text(encoding="utf-8"))
    data_dir = config["gateway"]["data_dir"]
    assert data_dir in _last(instructions, "VOLUME")
    admin_port = config["admin"]["bind"].rsplit(":", 1)[1]
    healthcheck = _last(instructions, "HEALTHCHECK")
    assert f"127.0.0.1:{admin_port}/healthz" in healthcheck
    assert "/etc/interchange/interchange.toml" in _last(instructions, "CMD")


def test_every_file_the_dockerfile_copies_exists_and_is_not_ignored() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    copied = []
    for i in _instructions():
        if i["instruction"] != "COPY" or i["value"].startswith("--from="):
            continue
        *sources, _target = i["value"].split()
        copied.extend(sources)
    assert "examples/docker/interchange.toml" in copied
    for source in copied:
        assert (ROOT / source).exists(), source
        assert source not in ignored
        assert source.split("/")[0] not in ignored


def _build_stage() -> tuple[list[tuple[str, str]], str]:
    """The first stage's COPYs (source, destination) and its ``pip wheel`` command."""
    instructions = _instructions()
    second = [n for n, i in enumerate(instructions) if i["instruction"] == "FROM"][1]
    copies: list[tuple[str, str]] = []
    command = ""
    for i in instructions[:second]:
        if i["instruction"] == "COPY":
            *sources, target = i["value"].split()
            copies.extend((source, target) for source in sources)
        elif i["instruction"] == "RUN" and "pip wheel" in i["value"]:
            command = i["value"]
    return copies, command


@pytest.mark.slow
def test_what_the_build_stage_copies_is_enough_to_build_the_wheels(tmp_path: Path) -> None:
    """As the image's first stage does, without its dependencies (PyPI's own wheels)."""
    copies, command = _build_stage()
    assert "--wheel-dir /wheels" in command
    context = tmp_path / "src"
    context.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "tests")
    for source, target in copies:
        origin, into = ROOT / source, context / target
        if origin.is_dir():
            shutil.copytree(origin, into, ignore=ignore)
        else:
            dest = into / origin.name if target.endswith("/") else into
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(origin, dest)
    projects = command.split("/wheels", 1)[1].split()
    wheels = tmp_path / "wheels"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir"]
    subprocess.run(
        [*pip_wheel, str(wheels), *projects],
        cwd=context,
        check=True,
        timeout=300,
    )
    built = sorted(p.name for p in wheels.glob("*.whl"))
    assert len(built) == len(projects), built


def _listeners(data: dict[str, Any]) -> dict[str, tuple[str, str, str | None]]:
    return {
        item["name"]: (item["protocol"], item["bind"].rsplit(":", 1)[1], item.get("destination"))
        for item in data["listeners"]
    }


def test_the_container_config_is_the_embedded_default_on_all_interfaces() -> None:
    default = default_data(default_registry())
    container = tomllib.loads(CONTAINER_CONFIG.read_text(encoding="utf-8"))
    assert _listeners(container) == _listeners(default)
    assert container["destinations"] == default["destinations"]
    binds = [item["bind"] for item in container["listeners"]]
    binds += [container["admin"]["bind"], container["metrics"]["bind"]]
    assert all(bind.startswith("*:") for bind in binds)
    assert load(CONTAINER_CONFIG).listeners


# --- the Grafana dashboard -------------------------------------------------------

DASHBOARD = ROOT / "examples" / "grafana" / "interchange.json"
#: A metric name in a PromQL expression (the dashboard queries only these prefixes).
_METRIC = re.compile(r"\b((?:interchange|process)_[a-z0-9_]+)\b")
_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def _queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


def test_the_dashboard_covers_what_operators_watch() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    names = {m for expr in _queries() for m in _METRIC.findall(expr)}
    for family in (
        "interchange_messages_received_total",
        "interchange_messages_sent_total",
        "interchange_destination_messages_in_total",
        "interchange_destination_messages_out_total",
        "interchange_publishes_total",
        "interchange_destination_backlog_messages",
        "interchange_memory_used_bytes",
        "interchange_connections_open",
        "interchange_tls_handshake_failures_total",
        "interchange_store_disk_free_bytes",
    ):
        assert family in names
    assert all('instance=~"$instance"' in expr for expr in _queries())


def _exported(body: str) -> set[str]:
    """Every family and sample name a /metrics page declares (a family with no
    samples yet still has its # TYPE line)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(body):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return names


def _served(name: str, exported: set[str]) -> bool:
    if name in exported:
        return True
    return any(name.endswith(s) and name[: -len(s)] in exported for s in _SUFFIXES)


async def test_every_metric_in_the_dashboard_is_served_by_a_gateway(tmp_path: Path) -> None:
    config = {
        "gateway": {"data_dir": str(tmp_path / "data")},
        "metrics": {"bind": "127.0.0.1:0"},
        "listeners": [
            {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "logs"}
        ],
        "upstreams": [{"name": "up", "protocol": "ndjson", "connect": "127.0.0.1:9"}],
        "destinations": [{"name": "logs", "store": "embedded"}],
    }
    async with running_gateway(config) as gw:
        client = await NdjsonClient.connect(*host_port(gw.addresses["nd"][0]))
        await client.publish(b"hello", "logs")
        reply = await http_request(gw.metrics_addresses[0])
        await client.aclose()
    assert reply.status == 200
    exported = _exported(reply.body.decode("utf-8"))
    names = {m for expr in _queries() for m in _METRIC.findall(expr)}
    missing = sorted(name for name in names if not _served(name, exported))
    assert missing == []
    assert not _served("interchange_no_such_family_total", exported)
