"""Start a gateway for a benchmark: in this process, or as ``python -m gateway run``.

Both ways bind every listener on 127.0.0.1 port 0 (the OS picks a free port)
and report the real addresses, so runs never collide with each other or with
a developer's gateway. The subprocess way exists because the target machine
has 2 cores: with the gateway in its own process, the load generator and the
gateway each get a core instead of sharing one trio loop, and the gateway's
CPU time can be read on its own from ``/proc/<pid>/stat``.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import tomli_w
import trio

from ._process import cpu_times, stop

__all__ = ["RunningGateway", "run_gateway", "to_toml"]

#: How long the gateway may take to import, bind and log its addresses.
START_TIMEOUT = 30.0
#: How long it may take to drain and exit after SIGTERM before it is killed.
STOP_TIMEOUT = 15.0
_SERVING = re.compile(r"gateway\.runtime[\w.]*: serving: (.*)$")
_LISTENER = re.compile(r"(\S+) \((\S+)\) on (.+)")


class RunningGateway:
    """A started gateway: its addresses, and its CPU time when it is a process."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.addresses: dict[str, list[str]] = {}
        self.pid: int | None = None
        self.returncode: int | None = None
        #: The last lines the gateway process wrote to stderr (its log).
        self.log: deque[str] = deque(maxlen=200)

    def address(self, listener: str) -> tuple[str, int]:
        """``(host, port)`` of the first address ``listener`` is bound to."""
        host, _, port = self.addresses[listener][0].rpartition(":")
        return host.strip("[]"), int(port)

    def cpu_times(self) -> tuple[float, float] | None:
        """``(user, system)`` CPU seconds of the gateway process so far (None in-process)."""
        return None if self.pid is None else cpu_times(self.pid)

    def cpu_seconds(self) -> float | None:
        """User plus system CPU time of the gateway process so far (None in-process)."""
        times = self.cpu_times()
        return None if times is None else times[0] + times[1]

    def max_rss_mib(self) -> float | None:
        """Peak resident memory of the gateway process (VmHWM), None in-process."""
        return None if self.pid is None else peak_rss_mib(self.pid)

    def problems_logged(self) -> list[str]:
        """Log lines at WARNING or worse: a clean benchmark run has none."""
        return [line for line in self.log if " WARNING " in line or " ERROR " in line]


@contextlib.asynccontextmanager
async def run_gateway(
    config: Mapping[str, Any], mode: str, *, profile: Path | None = None
) -> AsyncIterator[RunningGateway]:
    """Run a gateway with ``config`` (shaped like the TOML) for the body of the block.

    ``mode`` is ``"subprocess"`` or ``"inprocess"``. On leaving, the gateway
    is asked to shut down (SIGTERM, or :meth:`Gateway.shutdown`) and waited for.
    With ``profile`` (subprocess only) the gateway runs under cProfile, which
    writes its stats there when the gateway exits.
    """
    if profile is not None and mode != "subprocess":
        raise ValueError("profiling the gateway needs mode 'subprocess'")
    with tempfile.TemporaryDirectory(prefix="interchange-bench-") as tmp:
        if mode == "subprocess":
            async with _subprocess(config, Path(tmp), profile) as gw:
                yield gw
        elif mode == "inprocess":
            async with _inprocess(config, Path(tmp)) as gw:
                yield gw
        else:
            raise ValueError(f"unknown mode {mode!r}")


@contextlib.asynccontextmanager
async def _inprocess(config: Mapping[str, Any], tmp: Path) -> AsyncIterator[RunningGateway]:
    from gateway.config.loader import parse
    from gateway.runtime.gateway import Gateway

    gateway = Gateway(parse(config, source="<benchmark>", base_dir=tmp))
    running = RunningGateway("inprocess")
    async with trio.open_nursery() as nursery:
        await nursery.start(gateway.run)
        running.addresses = gateway.addresses
        try:
            yield running
        finally:
            gateway.shutdown()
    running.returncode = 0


@contextlib.asynccontextmanager
async def _subprocess(
    config: Mapping[str, Any], tmp: Path, profile: Path | None
) -> AsyncIterator[RunningGateway]:
    path = tmp / "gateway.toml"
    path.write_text(to_toml(config), encoding="utf-8")
    running = RunningGateway("subprocess")
    command = [sys.executable, "-m", "gateway", "run", str(path)]
    if profile is not None:
        # The gateway runs in this working directory, so a relative path works as given.
        command[1:1] = ["-m", "cProfile", "-o", str(profile)]
    async with supervise(command, running):
        yield running


@contextlib.asynccontextmanager
async def supervise(
    command: list[str],
    running: RunningGateway,
    *,
    cwd: Path | None = None,
    log_grace: float = 2.0,
) -> AsyncIterator[None]:
    """Run ``command``, a gateway process that logs ``serving:``, for the ``with`` block.

    Fills ``running`` (pid, addresses, log, return code); stops the process with
    SIGTERM (then SIGKILL) on exit and waits up to ``log_grace`` seconds for its
    last log lines. Raises RuntimeError if it exits or stalls before serving.
    """
    process = await trio.lowlevel.open_process(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=None if cwd is None else str(cwd),
    )
    running.pid = process.pid
    stderr = process.stderr
    assert stderr is not None
    failure: str | None = None
    try:
        async with trio.open_nursery() as nursery:
            decided, log_ended = trio.Event(), trio.Event()
            nursery.start_soon(_read_log, stderr, running, decided, log_ended)
            with trio.move_on_after(START_TIMEOUT):
                await decided.wait()
            if not running.addresses:
                why = "exited" if decided.is_set() else f"did not serve within {START_TIMEOUT:g}s"
                failure = f"the gateway {why} before serving; its log:\n" + "\n".join(running.log)
                nursery.cancel_scope.cancel()
            else:
                try:
                    yield
                finally:
                    with trio.CancelScope(shield=True):
                        await stop(process, STOP_TIMEOUT)
                        running.returncode = process.returncode
                        # Keep its last lines (the shutdown) unless something holds the pipe.
                        with trio.move_on_after(log_grace):
                            await log_ended.wait()
                        nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
            await stderr.aclose()
    # Raised out here, not inside the nursery, so it is not wrapped in an exception group.
    if failure is not None:
        raise RuntimeError(failure)


async def _read_log(
    stream: trio.abc.ReceiveStream,
    running: RunningGateway,
    decided: trio.Event,
    ended: trio.Event,
) -> None:
    """Keep the log tail (so the pipe never fills up) and find the ``serving:`` line.

    ``decided`` is set on that line, or when the log ends without it.
    """
    pending = b""
    while data := await stream.receive_some(65536):
        pending += data
        *lines, pending = pending.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            running.log.append(line)
            m = _SERVING.search(line)
            if m and not decided.is_set():
                running.addresses = parse_serving(m.group(1))
                decided.set()
    decided.set()
    ended.set()


def parse_serving(text: str) -> dict[str, list[str]]:
    """``a (ndjson) on 127.0.0.1:1, b (x) on h:2 h:3`` → listener name → addresses."""
    out = {}
    for part in text.split(", "):
        m = _LISTENER.fullmatch(part)
        if m:
            out[m.group(1)] = m.group(3).split()
    return out


def to_toml(data: Mapping[str, Any]) -> str:
    """A gateway config dict as a TOML document (``tomli_w``: arrays of tables, tables
    nested in their items such as ``[[listeners.services]]`` or ``[listeners.tls]``)."""
    return tomli_w.dumps(data)


def peak_rss_mib(pid: int) -> float | None:
    """Peak resident memory of process ``pid`` (VmHWM) in MiB; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None
