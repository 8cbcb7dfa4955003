"""``gateway config default``, ``gateway config schema`` and ``gateway completion``:
the config as a file to start from and a schema to check against, and the
commands as the shell completes them."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import build_parser, main
from gateway.config.default import to_toml
from gateway.config.loader import ConfigError, default_config, default_data, load, parse
from gateway.config.schema import DURATION_PATTERN, SIZE_PATTERN, config_schema
from gateway.config.units import parse_duration, parse_size
from gateway.runtime.registry import default_registry


def _print_default(capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["config", "default"]) == 0
    return capsys.readouterr().out


def test_the_printed_default_passes_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(_print_default(capsys), encoding="utf-8")
    assert main(["check", str(path)]) == 0
    assert "OK" in capsys.readouterr().out


def test_the_printed_default_loads_to_the_embedded_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(_print_default(capsys), encoding="utf-8")
    loaded = load(path)
    embedded = default_config(base_dir=tmp_path)
    loaded.path = None
    assert loaded == embedded
    assert loaded.listeners
    assert loaded.destinations


def test_to_toml_writes_what_tomllib_reads_back() -> None:
    data = {
        "gateway": {"data_dir": 'a "quoted"\npath', "drain_timeout": 2.5, "flag": True},
        "listeners": [{"name": "x", "hosts": ["a", "b"], "opts": {"k.y": 1}}],
        "empty": [],
    }
    assert tomllib.loads(to_toml(data)) == data


# --- gateway completion --------------------------------------------------------


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    """Every subcommand name of the parser, nested ones included."""
    names: set[str] = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                names.add(name)
                names |= _commands(sub)
    return names


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_mentions_every_subcommand(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("shtab")
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    commands = _commands(build_parser())
    assert {"run", "check", "config", "default", "completion", "inspect"} <= commands
    for name in commands:
        assert re.search(rf"\b{re.escape(name)}\b", script), name


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_a_subcommand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("shtab")
    assert main(["completion", "bash"]) == 0
    script = tmp_path / "gateway.bash"
    script.write_text(capsys.readouterr().out, encoding="utf-8")
    # What bash does on `gateway store <TAB>`.
    probe = (
        f"source {script}; COMP_WORDS=(gateway store ''); COMP_CWORD=2; "
        "COMP_LINE='gateway store '; COMP_POINT=${#COMP_LINE}; "
        "_shtab_gateway gateway '' store; echo ${COMPREPLY[@]}"
    )
    result = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["inspect", "verify"]


# --- gateway config schema -----------------------------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _validator() -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(data: dict[str, Any]) -> list[str]:
    return [e.message for e in _validator().iter_errors(data)]


def test_the_schema_command_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "schema"]) == 0
    assert json.loads(capsys.readouterr().out) == config_schema()


def test_the_schema_accepts_the_embedded_default() -> None:
    assert _errors(default_data(default_registry())) == []


@pytest.mark.parametrize(
    "path", sorted(EXAMPLES.rglob("*.toml")), ids=lambda p: str(p.relative_to(EXAMPLES))
)
def test_the_schema_accepts_every_example(path: Path) -> None:
    assert _errors(tomllib.loads(path.read_text(encoding="utf-8"))) == []


@pytest.mark.parametrize(
    "data",
    [
        {"gateway": {"data_dri": "data"}},
        {"listners": []},
        {"listeners": [{"name": "a", "protocol": "ndjson", "bind": ":1", "max_lien": "1MiB"}]},
        {"listeners": [{"name": "a", "protocol": "ttrpc", "bind": ":1", "services": [{"x": 1}]}]},
        {"destinations": [{"name": "d", "kind": "log"}]},
        {"store": {"fsync_interval": "soon"}},
        {"upstreams": [{"name": "u", "protocol": "nosuch", "connect": "h:1"}]},
    ],
    ids=["typo", "top-level", "plugin-option", "nested-table", "choice", "duration", "protocol"],
)
def test_the_schema_refuses_what_check_refuses(data: dict[str, Any]) -> None:
    assert _errors(data)
    with pytest.raises(ConfigError):
        parse(data)


def test_a_protocol_option_is_accepted_only_for_its_protocol() -> None:
    entry = {"name": "a", "bind": "127.0.0.1:1", "max_line": "1MiB"}
    assert _errors({"listeners": [{**entry, "protocol": "ndjson"}]}) == []
    assert _errors({"listeners": [{**entry, "protocol": "lumberjack"}]})


@pytest.mark.parametrize(
    ("kind", "text"), [("duration", "500ms"), ("duration", "1.5 h"), ("size", "64MiB")]
)
def test_the_unit_patterns_match_what_the_loader_parses(kind: str, text: str) -> None:
    pattern = DURATION_PATTERN if kind == "duration" else SIZE_PATTERN
    assert re.match(pattern, text)
    assert (parse_duration if kind == "duration" else parse_size)(text) > 0
