"""``gateway run`` sets the garbage collector for a process that holds many messages."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator

import pytest

from gateway.runtime.collector import (
    MIDDLE_THRESHOLD,
    OLD_THRESHOLD,
    YOUNG_THRESHOLD,
    tune_collector,
)


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_thresholds_are_raised_and_start_up_objects_frozen(restored: None) -> None:
    assert gc.get_freeze_count() == 0
    tune_collector()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
    assert gc.get_freeze_count() > 0


def test_cycles_are_still_collected(restored: None) -> None:
    tune_collector()

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a  # type: ignore[attr-defined]
    del a, b
    assert gc.collect() >= 2  # a full collection still finds them


def test_gateway_run_tunes_the_collector(tmp_path: object) -> None:
    """The command that owns the process sets it (a library user's process is theirs)."""
    code = (
        "import gc, sys\n"
        "import gateway.cli as cli\n"
        "calls = []\n"
        "import gateway.runtime.collector as c\n"
        "c.tune_collector = lambda: calls.append(1)\n"
        "cli.trio.run = lambda *a, **k: None\n"
        "class G:\n"
        "    drained_cleanly = True\n"
        "    def __init__(self, config): pass\n"
        "import gateway.runtime.gateway as g\n"
        "g.Gateway = G\n"
        "rc = cli.main(['run'])\n"
        "print(rc, calls)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip().splitlines()[-1] == "0 [1]"
