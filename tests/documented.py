"""The config examples the README and docs show, as the tests that check them find them."""

from __future__ import annotations

import re
from dataclasses import dataclass
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


#: The comment, on the line right before a ```python block, that says how the
#: docs' test treats it (see tests/test_docs_examples.py).
MARK = re.compile(r"<!-- (fragment|continues|(?:tested elsewhere|run-by): (\S+)) -->\s*$")


@dataclass(frozen=True)
class PythonExample:
    """One ```python block of the docs: where it is, its code, and how it is tested."""

    #: ``file#index`` (the index counts the file's python blocks from 0).
    where: str
    code: str
    #: ``"run"`` (no mark, or ``continues``: then ``code`` starts with the code of
    #: the block before it), ``"fragment"`` (compiled only) or ``"elsewhere"``.
    mode: str
    #: For ``"elsewhere"``: the test file (relative to the repository) that runs it.
    tested_by: str | None = None


def python_examples() -> list[PythonExample]:
    """Every ```python block of the README and docs, with the mark before it, if any."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        starts = [m.start() for m in re.finditer(r"^[ ]*```python\n", text, re.M)]
        for i, start in enumerate(starts):
            body = text[start:].split("\n", 1)[1].split("```", 1)[0]
            indent = len(text[start:]) - len(text[start:].lstrip(" "))
            code = re.sub(rf"^ {{{indent}}}", "", body, flags=re.M) if indent else body
            mark = MARK.search(text[max(0, start - 200) : start])
            mode, tested_by = "run", None
            if mark is not None and mark.group(1) == "continues":
                before = found[-1] if found else None
                if before is None or before.mode != "run" or i == 0:
                    raise ValueError(f"{doc.name}: a block continues one that does not run")
                code = before.code + "\n" + code
            elif mark is not None:
                mode = "fragment" if mark.group(1) == "fragment" else "elsewhere"
                tested_by = mark.group(2)
            found.append(PythonExample(f"{doc.relative_to(ROOT)}#{i}", code, mode, tested_by))
    return found


def json_blocks() -> list[tuple[str, str]]:
    """(where, text) of each ```json block of the README and docs."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for i, block in enumerate(re.findall(r"^```json\n(.*?)```", text, re.S | re.M)):
            found.append((f"{doc.relative_to(ROOT)}#{i}", block))
    return found
