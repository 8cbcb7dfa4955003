"""Every config example in the README and docs passes `gateway check`."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from gateway.certs import init_dir
from gateway.config import load

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def toml_configs() -> list[tuple[str, str]]:
    """(where, text) of each ```toml block that is a whole config (it has a listener)."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for i, block in enumerate(re.findall(r"```toml\n(.*?)```", text, re.S)):
            block = re.sub(r"^  ", "", block, flags=re.M)  # blocks inside list items
            if "[[listeners]]" in block or "[[upstreams]]" in block:
                found.append((f"{doc.relative_to(ROOT)}#{i}", block))
    return found


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
