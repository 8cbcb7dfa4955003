"""``gateway top``: a live terminal view of a running gateway's status.

It polls the admin API's ``GET /api/status`` (see :mod:`gateway.ops.status`)
every second and renders it with rich: rates per listener, upstream states
and errors, destination backlogs with their groups, the memory budget and
the hints that say why a sender may not be acked. ``--once`` prints one
frame and exits, for scripts and tests. Ctrl-C exits cleanly.
"""

from __future__ import annotations

import http.client
import json
import signal
import sys
import threading
import urllib.parse
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

__all__ = ["fetch", "main", "render"]

#: Seconds to wait for the admin API.
TIMEOUT = 5.0


class Unreachable(Exception):
    """The admin API did not answer with a status."""


def fetch(url: str, timeout: float = TIMEOUT) -> dict[str, Any]:
    """``GET {url}/api/status``, decoded; :exc:`Unreachable` says why not."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise Unreachable(f"the admin URL must be http://HOST:PORT, not {url!r}")
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", parts.path.rstrip("/") + "/api/status")
        response = conn.getresponse()
        body = response.read()
    except OSError as e:
        raise Unreachable(f"cannot reach the admin API at {url}: {e}") from None
    finally:
        conn.close()
    if response.status != 200:
        raise Unreachable(f"{url}/api/status answered {response.status} {response.reason}")
    try:
        status: dict[str, Any] = json.loads(body)
    except ValueError as e:
        raise Unreachable(f"{url}/api/status is not JSON: {e}") from None
    return status


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def render(status: dict[str, Any]) -> RenderableType:
    """One frame: a header, the hints, and a table per section."""
    rates = status.get("rates", {})
    parts: list[RenderableType] = [_header(status)]
    hints = _hints(status.get("hints", []))
    if hints is not None:
        parts.append(hints)
    parts += [
        _listeners(status["listeners"], rates.get("listeners", {})),
        _upstreams(status["upstreams"], rates.get("upstreams", {})),
        _destinations(status["destinations"], rates.get("destinations", {})),
    ]
    if status.get("workers"):  # gateway run --workers N: the supervisor's breakdown
        parts.append(_workers(status["workers"]))
    return Group(*parts)


#: Rates of one section: name → key → per second.
_Rates = dict[str, dict[str, float]]


def _header(status: dict[str, Any]) -> Text:
    """Version, uptime, readiness, unsettled publishes, memory."""
    memory = status["memory"]
    ready = (
        Text("draining", style="bold yellow")
        if status["draining"]
        else Text("ready", style="bold green")
        if status["ready"]
        else Text("not ready", style="bold red")
    )
    return Text.assemble(
        ("Interchange ", "bold"),
        status["version"],
        f"  up {_ago(status['uptime_s'])}  ",
        ready,
        f"  unsettled publishes {status['inflight']}",
        f"  memory {_bytes(memory['used'])} / {_bytes(memory['limit'])}",
        (" EXHAUSTED", "bold red") if memory["exhausted"] else "",
    )


def _hints(hints: list[dict[str, str]]) -> Panel | None:
    """The hints, warnings in red, in a panel; None when there are none."""
    if not hints:
        return None
    lines = Text()
    for i, h in enumerate(hints):
        style = "red" if h["level"] == "warning" else "yellow"
        lines.append(("\n" if i else "") + f"{h['subject']}: ", style=f"bold {style}")
        lines.append(h["text"])
    return Panel(lines, title="why is my sender not acked?", title_align="left")


def _table(title: str, left: tuple[str, ...], right: tuple[str, ...]) -> Table:
    """A section's table: ``left`` columns, then ``right`` ones justified right."""
    table = Table(title=title, title_justify="left", expand=True)
    for column in left:
        table.add_column(column)
    for column in right:
        table.add_column(column, justify="right")
    return table


def _listeners(listeners: list[dict[str, Any]], rates: _Rates) -> Table:
    table = _table(
        "listeners",
        ("name", "protocol", "addresses"),
        ("conns", "msg/s in", "msg/s out", "in/s", "out/s"),
    )
    for ls in listeners:
        r = rates.get(ls["name"], {})
        table.add_row(
            ls["name"],
            ls["protocol"],
            " ".join(ls["addresses"]) or Text("not bound", style="red"),
            f"{ls['connections']}/{ls['max_connections']}",
            _rate(r.get("messages_in")),
            _rate(r.get("messages_out")),
            _bytes(r.get("bytes_in")),
            _bytes(r.get("bytes_out")),
        )
    return table


def _upstreams(upstreams: list[dict[str, Any]], rates: _Rates) -> Table:
    table = _table("upstreams", ("name", "protocol", "state"), ("msg/s out",))
    table.add_column("since / last error", ratio=1)
    for up in upstreams:
        r = rates.get(up["name"], {})
        connected = up["state"] == "connected"
        table.add_row(
            up["name"],
            up["protocol"],
            Text(up["state"], style="green" if connected else "red"),
            _rate(r.get("messages_out")),
            f"for {_ago(up['connected_for_s'])}" if connected else (up["last_error"] or ""),
        )
    return table


def _workers(workers: list[dict[str, Any]]) -> Table:
    """Each worker: pid, whether it answered, its connections, counts and memory."""
    table = _table(
        "workers",
        ("worker", "pid", "state"),
        ("conns", "msgs in", "msgs out", "unsettled", "memory"),
    )
    for w in workers:
        running = w["running"]
        table.add_row(
            str(w["index"]),
            str(w["pid"] or ""),
            Text("running" if running else "restarting", style="green" if running else "red"),
            *(
                (
                    str(w["connections"]),
                    str(w["messages_in"]),
                    str(w["messages_out"]),
                    str(w["inflight"]),
                    _bytes(w["memory_used"]),
                )
                if running
                else ("", "", "", "", "")
            ),
        )
    return table


def _destinations(destinations: list[dict[str, Any]], rates: _Rates) -> Table:
    """A row per destination, and under it one per group."""
    table = _table(
        "destinations",
        ("name / group", "kind"),
        ("in/s", "out/s", "backlog", "bytes", "Δ/s", "subs", "queued", "unacked"),
    )
    for d in destinations:
        r = rates.get(d["name"], {})
        table.add_row(
            Text(d["name"], style="bold"),
            d["kind"],
            _rate(r.get("messages_in")),
            _rate(r.get("messages_out")),
            str(d["backlog"]["messages"]),
            _bytes(d["backlog"]["bytes"]),
            _rate(r.get("backlog")),
            str(sum(g["members"] for g in d["groups"])),
            "",
            "",
        )
        for g in d["groups"]:
            table.add_row(
                "  " + ("(anonymous)" if g.get("anonymous") else g["name"]),
                Text("full", style="red") if g.get("full") else "",
                "",
                "",
                str(g.get("held", g.get("behind", ""))),
                _bytes(g.get("held_bytes")),
                "",
                Text(str(g["members"]), style="" if g["members"] else "yellow"),
                str(g["queued"]),
                str(g["unacked"]),
            )
    return table


def _error(message: str) -> RenderableType:
    return Panel(Text(message, style="red"), title="gateway top", title_align="left")


def main(
    url: str, *, once: bool = False, interval: float = 1.0, console: Console | None = None
) -> int:
    """Show the status at ``url`` until Ctrl-C (or one frame with ``once``); exit status."""
    if console is None:
        # Not a terminal (a pipe, a test): wide enough that tables keep their names.
        console = Console() if sys.stdout.isatty() else Console(width=160)
    if once:
        try:
            console.print(render(fetch(url)))
        except Unreachable as e:
            print(f"top: {e}", file=sys.stderr)
            return 1
        return 0
    # Ctrl-C sets a flag that the loop checks between frames, instead of raising
    # KeyboardInterrupt wherever the main thread happens to be: raised inside a lock
    # rich's refresh thread shares, it could leave the lock held and the exit hanging.
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda _signum, _frame: stop.set())
    try:
        with Live(console=console, refresh_per_second=4, screen=False) as live:
            while not stop.is_set():
                try:
                    live.update(render(fetch(url)))
                except Unreachable as e:
                    live.update(_error(f"{e}; retrying"))
                stop.wait(interval)
    finally:
        signal.signal(signal.SIGINT, previous)
    return 0
