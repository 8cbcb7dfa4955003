"""What the gateway guards one connection with, handed to its driver on the stream.

The runtime wraps every accepted stream in one that carries a :class:`Guard`
(``stream.guard``); a :class:`~gateway.sdk.Session` finds it there, so
every protocol built on the skeleton gets the protections without asking:

* **progress**: the idle timeout restarts on useful progress (a unit received
  whole, an answer written, a delivery acked), never on bytes alone;
* **memory**: what the connection holds partly received is charged to the
  gateway's :class:`~gateway.core.budget.MemoryBudget` within the connection's own
  limit;
* **abandoned work**: publishes that a departed peer can no longer be
  answered for are counted.

:func:`hangup_probe` tells, without reading, whether the peer closed or reset
a socket connection, even with unread data in front of the end: the skeleton
uses it while the reader is held up by backpressure, when a closed peer
would otherwise go unnoticed.
"""

from __future__ import annotations

import select
import socket
from collections.abc import Callable
from typing import Any

from gateway.core.budget import Account

__all__ = ["Guard", "hangup_probe"]


def _nothing() -> None:
    pass


def _never() -> bool:
    return False


class Guard:
    """The protections of one connection (see the module's docstring)."""

    def __init__(
        self,
        account: Account | None = None,
        *,
        on_progress: Callable[[], None] = _nothing,
        on_abandoned: Callable[[int], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
        warn: Callable[..., None] | None = None,
    ) -> None:
        #: Partly received input, charged to the gateway's budget (None: not counted).
        self.account = account
        self._on_progress = on_progress
        self._on_abandoned = on_abandoned
        self._on_refused = on_refused
        self._warn = warn
        #: True once a driver reports progress itself: bytes alone stop counting.
        self.reports_progress = False
        #: Whether the driver has work pending (set by the driver).
        self.pending: Callable[[], bool] = _never

    def progress(self) -> None:
        """Useful progress: the idle timeout starts again."""
        self.reports_progress = True
        self._on_progress()

    def refused(self, reason: str) -> None:
        """The connection is being closed by a protection or for the peer's fault.

        ``reason`` is one of a bounded set (``protocol_error``, ``not_kept``,
        ``timeout``, ``memory``): it labels a metric and keys the log throttle.
        """
        if self._on_refused is not None:
            self._on_refused(reason)

    def warn(self, reason: str, msg: str, *args: object) -> bool:
        """Log a warning about this connection, rate-limited per ``reason`` and listener.

        False when no rate-limited log is configured: the caller logs it itself.
        """
        if self._warn is None:
            return False
        self._warn(reason, msg, *args)
        return True

    def abandoned(self, count: int) -> None:
        """``count`` publishes were settled as failed because their sender left."""
        if self._on_abandoned is not None and count:
            self._on_abandoned(count)


def guard_of(stream: Any) -> Guard | None:
    """The guard the runtime put on ``stream`` (None for a stream of one's own)."""
    guard = getattr(stream, "guard", None)
    return guard if isinstance(guard, Guard) else None


def _socket_of(stream: Any) -> Any:
    """The socket under ``stream``, through layers that expose ``transport_stream``."""
    for _ in range(8):
        sock = getattr(stream, "socket", None)
        if sock is not None and hasattr(sock, "fileno"):
            return sock
        stream = getattr(stream, "transport_stream", None)
        if stream is None:
            return None
    return None


def hangup_probe(stream: Any) -> Callable[[], bool] | None:
    """A check of whether the peer hung up (closed its side or reset), or None.

    None where it cannot be told without reading: no socket under the
    stream, or a platform without ``POLLRDHUP`` (Linux has it).
    """
    rdhup = getattr(select, "POLLRDHUP", None)
    sock = _socket_of(stream)
    if rdhup is None or sock is None:
        return None
    try:
        fd = sock.fileno()
        if fd < 0 or sock.type != socket.SOCK_STREAM:
            return None
    except OSError:
        return None
    poller = select.poll()
    poller.register(fd, rdhup)  # POLLHUP, POLLERR and POLLNVAL are always reported

    def hung_up() -> bool:
        try:
            return bool(poller.poll(0))
        except (OSError, ValueError):
            return True

    return hung_up
