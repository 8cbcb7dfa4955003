"""Unix domain sockets: ``unix:/run/interchange.sock`` (or a relative ``unix:path``).

A socket file left behind by a crashed gateway is replaced on ``listen``, but
only once a connection attempt proves nothing accepts on it any more: a
second gateway must never steal a running one's socket.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import struct
from dataclasses import dataclass
from typing import Any

import trio

from gateway.transports.base import Transport

__all__ = ["PeerCredentials", "UnixTransport", "peer_credentials", "transport"]

PREFIX = "unix:"
#: Group may connect (e.g. a shipper in the gateway's group); others may not.
SOCKET_MODE = 0o660
#: ``sun_path`` holds 108 bytes on Linux and 104 on the BSDs, NUL included.
_MAX_PATH_BYTES = 103
#: How long a probe connection may take before the existing socket counts as alive.
_PROBE_TIMEOUT = 1.0


def socket_path(address: str) -> str:
    """The filesystem path of a ``unix:`` address; ``ValueError`` if there is none."""
    if not address.startswith(PREFIX):
        raise ValueError(f"expected unix:/path/to/socket, not {address!r}")
    path = address[len(PREFIX) :]
    if not path:
        raise ValueError("expected unix:/path/to/socket (the path is empty)")
    if "\0" in path:
        raise ValueError("the socket path must not contain NUL characters")
    if path.endswith("/"):
        raise ValueError(f"{path!r} names a directory, not a socket file")
    if len(os.fsencode(path)) > _MAX_PATH_BYTES:
        raise ValueError(
            f"socket path is {len(os.fsencode(path))} bytes long; "
            f"the limit is {_MAX_PATH_BYTES} (use a shorter or relative path)"
        )
    return path


class UnixTransport(Transport):
    """Listeners and connections over Unix stream sockets."""

    kind = "socket"
    name = "unix"
    schemes = ("unix",)

    def claims(self, address: str) -> bool:
        """``unix:path`` (not a URL: no ``//`` after the colon)."""
        return address.startswith(PREFIX)

    def check_address(self, address: str) -> None:
        socket_path(address)

    async def listen(self, address: str) -> list[trio.SocketListener]:
        """Bind the socket file (replacing a dead one), make it group-writable, listen."""
        path = socket_path(address)
        await _remove_stale(path)
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            await sock.bind(path)
            os.chmod(path, SOCKET_MODE)
            sock.listen(socket.SOMAXCONN)
        except BaseException:
            sock.close()
            raise
        return [trio.SocketListener(sock)]

    async def connect(self, address: str) -> trio.abc.Stream:
        return await trio.open_unix_socket(socket_path(address))

    def peer_name(self, stream: trio.abc.Stream) -> str:
        """``unix:<path>``: the server path (an accepted peer is usually unnamed)."""
        sock = getattr(stream, "socket", None)
        if sock is None:
            inner = getattr(stream, "transport_stream", None)
            return self.peer_name(inner) if inner is not None else ""
        for name in (sock.getpeername, sock.getsockname):
            try:
                path = _path_text(name())
            except OSError:
                continue
            if path:
                return PREFIX + path
        return PREFIX

    def listener_name(self, listener: trio.abc.Listener[Any]) -> str:
        sock = getattr(listener, "socket", None)
        return PREFIX + (_path_text(sock.getsockname()) if sock is not None else "")

    def server_name(self, address: str) -> str | None:
        """None: a socket path is no host name (set the upstream's ``server_name`` for TLS)."""
        return None


def _path_text(sockaddr: object) -> str:
    if isinstance(sockaddr, bytes):  # abstract namespace or undecodable
        return os.fsdecode(sockaddr.lstrip(b"\0"))
    return str(sockaddr or "")


async def _remove_stale(path: str) -> None:
    """Unlink ``path`` if it is a socket nobody accepts on; raise ``OSError`` if it is in use."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EADDRINUSE, f"address in use: {path} exists and is not a socket", path)
    probe = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with trio.move_on_after(_PROBE_TIMEOUT):
            await probe.connect(path)
        # Connected, or so slow to accept that it is busy: alive either way.
        raise OSError(errno.EADDRINUSE, f"address in use: something listens on {path}", path)
    except ConnectionRefusedError:
        pass
    except FileNotFoundError:  # removed meanwhile: nothing to clean up
        return
    finally:
        probe.close()
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


transport = UnixTransport()


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """Who runs the process at the other end of a unix socket (``SO_PEERCRED``)."""

    pid: int
    uid: int
    gid: int


def peer_credentials(stream: trio.abc.Stream) -> PeerCredentials | None:
    """The peer's credentials as the kernel recorded them at connect time.

    None for a stream that is no unix socket (or a system without
    ``SO_PEERCRED``). A layered stream (TLS) is unwrapped to its socket.
    """
    sock = getattr(stream, "socket", None)
    if sock is None:
        inner = getattr(stream, "transport_stream", None)
        return peer_credentials(inner) if inner is not None else None
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None or sock.family != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, option, _UCRED.size)
    except OSError:
        return None
    return PeerCredentials(*_UCRED.unpack(raw))


#: ``struct ucred``: pid, uid, gid.
_UCRED = struct.Struct("iII")
