"""``gateway config default`` (and, below, ``gateway config schema``): the config
as files an operator can start from and check against."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
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
