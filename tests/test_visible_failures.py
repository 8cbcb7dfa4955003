"""Failures an operator can see: in the status's hints, in the gateway's log, from
``gateway check``.

TLS refusals themselves (the log line, the subject, the metric) are in
tests/test_tls_failures.py; here, how long a refusal stays a hint, the refused
reloads in the gateway's log, and an unusable ``data_dir``.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
from test_admin import get

from gateway.cli import _reload as sighup_reload
from gateway.cli import main
from gateway.config.loader import load
from gateway.ops.status import TLS_HINT_WINDOW, status
from gateway.ops.view import BudgetView, GatewaySnapshot, ListenerView
from gateway.runtime.gateway import Gateway


def _taken(refusals: int, last_at: float | None) -> GatewaySnapshot:
    listener = ListenerView(
        "secure",
        "ndjson",
        "jobs",
        ("127.0.0.1:4000",),
        0,
        10,
        tls_refusals=refusals,
        last_tls_refusal="127.0.0.1:5000 (client certificate CN=rogue): unknown ca: ..."
        if refusals
        else None,
        last_tls_refusal_at=last_at,
    )
    return GatewaySnapshot(
        version="9.9.9",
        time=10_000.0,
        started_at=1.0,
        draining=False,
        inflight=0,
        listeners=(listener,),
        upstreams=(),
        destinations=(),
        budget=BudgetView(limit=100, used=0, peak=0, exhausted=False),
    )


@pytest.mark.parametrize(
    ("refusals", "ago", "shown"),
    [(0, None, False), (3, 60.0, True), (3, TLS_HINT_WINDOW + 1, False)],
    ids=["none", "recent", "stale"],
)
def test_a_tls_refusal_is_a_hint_while_it_is_recent(
    refusals: int, ago: float | None, shown: bool
) -> None:
    taken = _taken(refusals, None if ago is None else 10_000.0 - ago)
    hints = status(taken)["hints"]
    if not shown:
        assert hints == []
        return
    [hint] = hints
    assert hint == {
        "level": "warning",
        "subject": "listener secure",
        "text": "3 TLS handshakes refused since the start; the last 60s ago:"
        " 127.0.0.1:5000 (client certificate CN=rogue): unknown ca: ...",
    }


# -- a refused reload is in the gateway's log, however it was asked for -----------------

GOOD = """
[gateway]
drain_timeout = "2s"
[admin]
bind = "127.0.0.1:0"
[[listeners]]
name = "nd"
protocol = "ndjson"
bind = "127.0.0.1:0"
"""


def _refusals(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_refused_reload_is_one_warning_whichever_way_it_came(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    path = tmp_path / "gw.toml"
    path.write_text(GOOD)
    gw = Gateway(load(path))
    async with trio.open_nursery() as nursery:
        await nursery.start(gw.run)
        path.write_text(GOOD + "bogus_key = 1\n")
        reply = await get(gw, "/api/reload", "POST")  # what `gateway reload` sends
        assert reply.json()["reloaded"] is False
        [line] = _refusals(caplog)
        assert (line.name, line.levelno) == ("gateway.reload", logging.WARNING)
        assert line.getMessage().startswith("reload (POST /api/reload) refused: ")
        assert f"{path} has errors" in line.getMessage()
        assert "bogus_key" in line.getMessage()
        caplog.clear()
        await sighup_reload(gw)
        [line] = _refusals(caplog)
        assert line.levelno == logging.WARNING
        assert line.getMessage().startswith("reload (SIGHUP) refused: ")
        assert "bogus_key" in line.getMessage()
        gw.shutdown()


# -- data_dir: checked by `gateway check` and at start, with the file and the key ------


def _durable(path: Path, data_dir: str) -> Path:
    """A config with a durable destination (so the gateway needs its data_dir)."""
    path.write_text(
        f'[gateway]\ndata_dir = "{data_dir}"\n'
        '[[destinations]]\nname = "jobs"\nkind = "queue"\nstore = "embedded"\n'
    )
    return path


def test_check_refuses_a_data_dir_that_cannot_be_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _durable(tmp_path / "gw.toml", "/proc/interchange")
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: gateway.data_dir: cannot create '/proc/interchange': " in err
    assert main(["run", str(path)]) == 1  # start-up says the same, before anything runs
    assert f"{path}: gateway.data_dir: cannot create '/proc/interchange': " in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("data_dir", ["file", "file/below"])
def test_check_refuses_a_data_dir_under_or_at_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data_dir: str
) -> None:
    (tmp_path / "file").write_text("not a directory")
    path = _durable(tmp_path / "gw.toml", str(tmp_path / data_dir))
    assert main(["check", str(path)]) == 1
    assert "is not a directory" in capsys.readouterr().err


def test_check_creates_nothing_and_ignores_a_data_dir_nobody_needs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _durable(tmp_path / "gw.toml", str(tmp_path / "not" / "yet"))
    assert main(["check", str(path)]) == 0
    assert not (tmp_path / "not").exists()
    assert list(tmp_path.iterdir()) == [path]  # the probe left nothing behind
    path.write_text('[gateway]\ndata_dir = "/proc/interchange"\n')  # no durable destination
    assert main(["check", str(path)]) == 0
    assert "OK" in capsys.readouterr().out


def test_a_data_dir_that_fails_at_start_is_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What the probe cannot foresee (here ``store`` is a file) still names the key."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "store").write_text("in the way")
    path = _durable(tmp_path / "gw.toml", str(tmp_path / "data"))
    assert main(["run", str(path)]) == 1
    [line] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line.startswith(f"cannot start: {path}: gateway.data_dir: cannot use '")
    assert str(tmp_path / "data" / "store") in line
