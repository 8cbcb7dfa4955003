"""The config examples the README and docs show, as the tests that check them find them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def toml_configs() -> list[tuple[str, str]]:
    """(where, text) of each ```toml block that is a whole config (it has a listener
    or an upstream); ``where`` is the file and the block's index in it."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for i, block in enumerate(re.findall(r"```toml\n(.*?)```", text, re.S)):
            block = re.sub(r"^  ", "", block, flags=re.M)  # blocks inside list items
            if "[[listeners]]" in block or "[[upstreams]]" in block:
                found.append((f"{doc.relative_to(ROOT)}#{i}", block))
    return found
