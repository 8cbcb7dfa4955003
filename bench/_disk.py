"""The disk under a benchmark's files: its raw sequential write bandwidth, and a cold cache.

A store that acks writes once they are durable can go no faster than the
disk takes data and flushes it, so the store benchmarks (``store-append``,
``segment-append``) report their rate beside the disk's own, measured the
way ``dd bs=B conv=fsync`` does: the same bytes in large writes to one new
file, then one fsync, timed from the first write to the fsync's return. Run
it on the file system the store writes to, in the same run: a VM's disk
varies from hour to hour.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["drop_page_cache", "sequential_write"]

#: The file the probe writes (and removes) in the directory it is given.
PROBE_NAME = "dd-probe.bin"


def sequential_write(directory: Path, total: int, block: int = 2**20) -> float:
    """Seconds to write ``total`` bytes in writes of ``block`` bytes to a new file in
    ``directory`` and fsync it (``dd if=/dev/zero bs=block conv=fsync``); the file is
    removed afterwards."""
    if total < 1 or block < 1:
        raise ValueError("the probe writes at least one byte, in blocks of at least one")
    data = bytes(block)
    path = directory / PROBE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        started = time.perf_counter()
        written = 0
        while written < total:
            written += os.write(fd, data if total - written >= block else data[: total - written])
        os.fsync(fd)
        return time.perf_counter() - started
    finally:
        os.close(fd)
        path.unlink()


def drop_page_cache(directory: Path, pattern: str = "*.data") -> int:
    """Evict the files matching ``pattern`` below ``directory`` from the page cache
    (``posix_fadvise(DONTNEED)``; only clean pages go, so sync them first), so the next
    read comes from the disk, or from the VM host's cache. Returns the files done."""
    done = 0
    for path in directory.rglob(pattern):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
        done += 1
    return done
