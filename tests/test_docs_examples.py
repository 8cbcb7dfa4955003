"""Every config example in the README and docs passes `gateway check`."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from documented import toml_configs

from gateway.config.certs import init_dir
from gateway.config.loader import load

CONFIGS = toml_configs()


def test_the_docs_have_config_examples() -> None:
    assert len(CONFIGS) >= 4


@pytest.mark.parametrize(("where", "text"), CONFIGS, ids=[w for w, _ in CONFIGS])
def test_config_example_is_valid(where: str, text: str, tmp_path: Path) -> None:
    tomllib.loads(text)  # a syntax error names the block in the test id
    init_dir(tmp_path / "certs")
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    load(path)  # raises ConfigError listing every problem
