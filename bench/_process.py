"""Helper processes of benchmarks and interop tests: started until ready, stopped, measured.

A server process says it is listening by printing ``ready ADDR`` on stdout
(the address it bound, e.g. the port the kernel chose for port 0); its
stderr goes to a temporary file, so no task has to drain a pipe and its log
can be read at any time (:func:`read_log`). The benchmarks' servers
(``bench/_ttrpc_server.py``) and the Go interop peer (``tests/interop``)
both start this way; the gateway (``_gateway.py``) shares the stopping.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import trio

__all__ = ["ReadyProcess", "connections_by_pid", "cpu_times", "read_log", "ready_process", "stop"]

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class ReadyProcess:
    """A server process that printed ``ready ADDR``."""

    #: What followed ``ready`` (the bound address), or the address asked for.
    address: str
    process: trio.Process
    stderr: IO[bytes] = field(repr=False)

    def log(self) -> str:
        """What it wrote to stderr so far."""
        return read_log(self.stderr)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None


def read_log(stderr: IO[bytes]) -> str:
    """A temporary file's whole text, leaving its offset alone (the process that
    writes it shares the offset, which must stay at the end)."""
    fd = stderr.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace")


@asynccontextmanager
async def ready_process(
    command: Sequence[str],
    address: str,
    *,
    what: str,
    start_timeout: float,
    stop_timeout: float,
    cwd: Path | None = None,
) -> AsyncIterator[ReadyProcess]:
    """Run ``command`` for the block: returns once it printed ``ready``, stops it
    (:func:`stop`) at exit. ``RuntimeError`` naming ``what`` and quoting its stderr
    when it does not get ready."""
    with tempfile.TemporaryFile() as stderr:
        process = await trio.lowlevel.open_process(
            list(command),
            cwd=None if cwd is None else str(cwd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        try:
            assert process.stdout is not None
            ready = b""
            with trio.move_on_after(start_timeout) as waiting:
                while b"\n" not in ready and (data := await process.stdout.receive_some()):
                    ready += data
            line = ready.partition(b"\n")[0].decode("utf-8", "replace")
            if not line.startswith("ready"):
                if waiting.cancelled_caught:
                    why = f"was not ready within {start_timeout:g}s"
                elif b"\n" in ready:
                    why = f"printed {line!r} instead of ready"
                else:
                    why = f"exited with {await process.wait()}"
                log = read_log(stderr)
                raise RuntimeError(f"{what} on {address} {why}; its stderr:\n{log}")
            yield ReadyProcess(line.partition(" ")[2] or address, process, stderr)
        finally:
            with trio.CancelScope(shield=True):
                await stop(process, stop_timeout)
                if process.stdout is not None:
                    await process.stdout.aclose()


async def stop(process: trio.Process, timeout: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(timeout):
            await process.wait()
            return
        process.kill()
    await process.wait()


def cpu_times(pid: int) -> tuple[float, float] | None:
    """``(user, system)`` CPU seconds of process ``pid`` so far (None if gone or not
    Linux)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # Fields 14 and 15 of proc(5) (utime, stime); the split starts at field 3.
    return int(fields[11]) / _CLOCK_TICKS, int(fields[12]) / _CLOCK_TICKS


def connections_by_pid(pids: Sequence[int], port: int) -> dict[int, int]:
    """How many established TCP connections to local ``port`` each of ``pids`` holds.

    From ``/proc/net/tcp`` (and ``tcp6``): the sockets whose local port is ``port``,
    matched by inode to each process's descriptors. Empty off Linux.
    """
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                inodes.add(f"socket:[{fields[9]}]")
    counts: dict[int, int] = {}
    for pid in pids:
        try:
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        counts[pid] = sum(1 for link in links if link in inodes)
    return counts
