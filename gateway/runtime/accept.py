"""The accept loop of every listener of the gateway (protocol listeners and metrics).

``accept()`` fails when the process or the system runs out of file
descriptors or buffer memory (``EMFILE``, ``ENFILE``, ``ENOMEM``,
``ENOBUFS``). That is load, not a bug: the listener must survive it, wait a
little for connections to close and try again, as :func:`trio.serve_listeners`
does. Unlike trio's loop, this one logs no traceback and logs through a
:class:`~gateway.ops.loglines.Throttled` logger, because a flood of connections would
otherwise flood the log too (one line per failed accept, ten a second per
listener); each failure is counted in ``interchange_accept_errors_total``.

What to do with an accepted stream (serve it, or refuse it because a limit is
reached) is the caller's decision, made synchronously in ``handle``.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

import prometheus_client
import trio

from gateway.ops.loglines import Throttled

__all__ = ["CAPACITY_ERRNOS", "accept_forever"]

#: accept() errors that mean "out of resources for now": wait and retry.
CAPACITY_ERRNOS = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS}


async def accept_forever(
    listener: trio.abc.Listener[trio.abc.Stream],
    handle: Callable[[trio.abc.Stream], None],
    *,
    name: str,
    log: Throttled,
    errors: prometheus_client.Counter | None = None,
    retry: float = 0.1,
) -> None:
    """Accept connections on ``listener`` and pass each to ``handle`` until cancelled.

    ``handle`` must not block: it starts a task for the stream, or refuses it,
    and owns it from then on (if ``handle`` raises, the stream is closed and the
    error ends the loop). A failure for lack of resources (:data:`CAPACITY_ERRNOS`)
    is counted in ``errors`` (a counter family labelled ``listener`` and
    ``error``; ``listener`` is ``name``), logged as a warning without a
    traceback, rate-limited by ``log``, and retried after ``retry`` seconds. Any
    other error propagates. The listener is closed when the loop ends.
    """
    try:
        while True:
            try:
                stream = await listener.accept()
            except OSError as e:
                if e.errno not in CAPACITY_ERRNOS:
                    raise
                errname = errno.errorcode[e.errno]
                if errors is not None:
                    errors.labels(listener=name, error=errname).inc()
                log.warning(
                    f"accept:{name}:{errname}",
                    "listener %s: accept failed: %s (%s); retrying in %gs",
                    name,
                    errname,
                    os.strerror(e.errno),
                    retry,
                )
                await trio.sleep(retry)
                continue
            try:
                handle(stream)
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
    finally:
        await trio.aclose_forcefully(listener)
