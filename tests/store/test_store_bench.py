"""The store-append benchmark runs and checks itself (figures come from `python -m bench`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.parametrize("options", [(), ("--writers", "3", "--fsync", "always")])
def test_a_short_run_passes_its_self_checks(tmp_path: Path, options: tuple[str, ...]) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "store-append",
            "--bytes",
            str(8 * 2**20),
            "--dir",
            str(tmp_path),
            "--no-json",
            *options,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for metric in ("appended events", "dd conv=fsync", "read_events warm", "read_events cold"):
        assert metric in result.stdout
