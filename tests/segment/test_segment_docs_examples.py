"""The client-library examples of docs/protocols/segment-append.md run as written.

Each ```python block of the "Using the client library" section is a whole
script that connects to ``127.0.0.1:12345``; here it runs as a separate
process against a gateway's segment listener (the address swapped for the
listener's), and what it prints must be the ```text block that follows it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import trio
from harness import running_gateway

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocols" / "segment-append.md"
DOCUMENTED_ADDRESS = "127.0.0.1:12345"


def examples() -> list[tuple[str, str]]:
    """(script, printed) of each python block of the section and the text block after it."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## Using the client library", 1)[1].split("\n## ", 1)[0]
    pairs = re.findall(r"```python\n(.*?)```.*?```text\n(.*?)```", section, re.S)
    return [(script, printed) for script, printed in pairs]


async def run_script(script: str, address: str, tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(script.replace(DOCUMENTED_ADDRESS, address), encoding="utf-8")
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, str(path)], capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


def gateway_config(tmp_path: Path) -> dict[str, object]:
    return {
        "gateway": {"data_dir": str(tmp_path / "data"), "drain_timeout": "100ms"},
        "listeners": [{"name": "seg", "protocol": "segment", "bind": "127.0.0.1:0"}],
    }


def test_the_section_has_a_writer_and_a_reader_example() -> None:
    scripts = [script for script, _ in examples()]
    assert len(scripts) == 2
    assert "SegmentWriter.connect" in scripts[0]
    assert "SegmentReader.connect" in scripts[1]
    assert all(DOCUMENTED_ADDRESS in script for script in scripts)


async def test_the_examples_print_what_the_doc_says(tmp_path: Path) -> None:
    (write, wrote), (read, was_read) = examples()
    async with running_gateway(gateway_config(tmp_path)) as gw:
        address = gw.addresses["seg"][0]
        assert await run_script(write, address, tmp_path, "write") == wrote
        assert await run_script(read, address, tmp_path, "read") == was_read
        # The doc's claim: the same writer id on a second run continues at event 4,
        # and the segment holds each run's events once.
        again = await run_script(write, address, tmp_path, "write-again")
        assert again == "event 4 segment length 68\nevent 6 segment length 102\n"
        lines = (await run_script(read, address, tmp_path, "read-again")).splitlines()
        assert lines == [*was_read.splitlines(), '51 {"id": 1}', '68 {"id": 2}', '85 {"id": 3}']
