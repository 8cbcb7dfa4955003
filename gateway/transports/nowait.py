"""Writing to a stream without waiting: what the socket under it takes right now.

trio's ``send_all`` goes through the scheduler: a task must be woken to call
it, and it yields after writing. For a batch of small frames that costs more
than the write itself. A producer with a batch ready and nothing queued
before it (a proxy at the end of a read, relaying to another connection)
can instead hand the bytes to the kernel at once: :func:`nowait_sender`
gives a function that writes what the non-blocking socket accepts and says
how many bytes that was, never waiting; the caller queues the rest for its
writer task as usual.

Only streams that pass bytes through unchanged have one: a
``trio.SocketStream``, and layers that say so with a ``nowait_sender()``
method of their own (the runtime's byte-counting wrapper offers its inner
stream's, counting). TLS and other framing layers have none, nor do memory
streams: their sessions always write through their writer task.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import trio

__all__ = ["NowaitSender", "nowait_sender"]

#: Writes what the socket takes without waiting: how many bytes (0: none now, or
#: the stream is closed; its writer task meets the reason). Other ``OSError``\\ s
#: (a reset connection) propagate.
NowaitSender = Callable[[bytes | bytearray | memoryview], int]


def nowait_sender(stream: Any) -> NowaitSender | None:
    """The stream's :data:`NowaitSender`, or None when it cannot write without waiting."""
    own = getattr(stream, "nowait_sender", None)
    if own is not None:
        sender: NowaitSender | None = own()
        return sender
    if isinstance(stream, trio.SocketStream):
        return _socket_sender(stream.socket)
    return None


def _socket_sender(sock: trio.socket.SocketType) -> NowaitSender:
    def send(data: bytes | bytearray | memoryview) -> int:
        fd = sock.fileno()  # -1 once closed: never write to a number reused since
        if fd < 0:
            return 0
        try:
            return os.write(fd, data)  # trio's sockets are non-blocking
        except (BlockingIOError, InterruptedError):
            return 0

    return send
