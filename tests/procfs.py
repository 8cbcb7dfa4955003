"""What Linux's /proc says about sockets: which a process holds, and the TCP tables.

The workers' tests find which worker process holds a connection or a
listening socket by matching socket inodes, as ``ss -p`` does.
"""

from __future__ import annotations

import os

#: ``st`` column values of the TCP tables.
ESTABLISHED = "01"
LISTEN = "0A"


def socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process ``pid`` holds open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def tcp_rows() -> list[list[str]]:
    """The rows of the kernel's TCP tables (IPv4 and IPv6), split into columns:
    local address at 1, remote at 2, state at 3, inode at 9."""
    rows = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows += [row.split() for row in list(f)[1:]]
    return rows


def port_of(address: str) -> int:
    """The port of a table's ``ADDRESS:PORT`` column (hexadecimal)."""
    return int(address.rsplit(":", 1)[1], 16)
