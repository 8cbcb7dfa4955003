"""``gateway config default`` and ``gateway completion``: the config as a file an
operator can start from, and the commands as their shell completes them."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gateway.cli import build_parser, main
from gateway.config.default import to_toml
from gateway.config.loader import default_config, load


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
    import tomllib

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
