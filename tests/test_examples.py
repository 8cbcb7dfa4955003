"""Every config under ``examples/`` passes ``gateway check``, and each says
what it does and how to try it (its opening comment)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CONFIGS = sorted(EXAMPLES.rglob("*.toml"))


def test_there_are_examples_for_the_documented_bridges() -> None:
    names = {path.name for path in CONFIGS}
    for bridge in (
        "beats-to-ndjson.toml",
        "beats-to-logstash.toml",
        "durable-stream.toml",
        "ndjson-relay.toml",
        "ttrpc-stream.toml",
        "ttrpc-proxy.toml",
        "segment-append.toml",
    ):
        assert bridge in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_passes_gateway_check(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["check", str(path)])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "OK" in out


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_example_opens_with_a_comment_saying_what_and_how(path: Path) -> None:
    header = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        header.append(line)
    assert len(header) >= 2, f"{path.name} has no comment header"
    assert any("gateway" in line or "Try it" in line for line in header)
