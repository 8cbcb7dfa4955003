"""The worker slots of ``gateway run --workers N``: each worker's process and how it fares.

The supervisor (:mod:`gateway.runtime.supervisor`) keeps one :class:`Slot` per
worker index. A slot holds the process serving it (a :class:`WorkerProcess`,
None between runs), its restart backoff and count, and the supervisor's ends
of the process's control channels, on which the fleet's endpoints ask it
(:meth:`Slot.ask`, :meth:`Slot.tap`) one request at a time.

:func:`start_process` starts a worker process: the channels and the ``ready``
descriptor are socket pairs whose far ends are passed down with the listening
sockets, and the process runs in a session of its own so that a terminal's
Ctrl-C reaches the supervisor alone.
"""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import trio

from gateway.ops import control
from gateway.ops.fleet import WorkerAnswer
from gateway.runtime.worker import WorkerSpec

__all__ = ["Command", "Slot", "WorkerProcess", "describe_status", "exit_or", "start_process"]

#: The supervisor's log: a slot's lines are the supervisor's.
log = logging.getLogger("gateway.supervisor")

#: Builds a worker's command line from its spec.
Command = Callable[[WorkerSpec], list[str]]
#: A worker's spec from the descriptors of its control channels (by endpoint)
#: and of its ``ready`` socket.
MakeSpec = Callable[[dict[str, int], int], WorkerSpec]


@dataclass(slots=True)
class WorkerProcess:
    """One worker process and the supervisor's ends of what it was given."""

    process: trio.Process
    #: Its control channels, by endpoint.
    channels: dict[str, trio.SocketStream]
    #: Where it says it serves (:func:`gateway.runtime.worker.report_ready`).
    ready: trio.SocketStream

    @property
    def pid(self) -> int:
        return self.process.pid

    async def aclose(self) -> None:
        """Close the supervisor's ends (the process exited)."""
        for channel in [*self.channels.values(), self.ready]:
            await trio.aclose_forcefully(channel)


@dataclass(slots=True)
class Slot:
    """One worker slot: its process (None between runs) and how it has fared."""

    index: int
    #: The process serving the slot, whose channels the endpoints ask.
    current: WorkerProcess | None = None
    backoff: float = 0.0
    restarts: int = 0
    #: Its exit status once it stopped during the supervisor's stop.
    final: int | None = None
    #: When the current process started (trio clock): a long life resets the backoff.
    since: float = 0.0
    #: One request at a time on each channel of the current process.
    locks: dict[str, trio.Lock] = field(default_factory=dict)
    #: Set to ask the slot's task for a rolling replacement; its result, once done.
    replace_asked: trio.Event = field(default_factory=trio.Event)
    replaced: trio.Event = field(default_factory=trio.Event)
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def process(self) -> trio.Process | None:
        """The current process (None between runs)."""
        return self.current.process if self.current is not None else None

    @property
    def channels(self) -> dict[str, trio.SocketStream]:
        return self.current.channels if self.current is not None else {}

    def install(self, new: WorkerProcess) -> None:
        """Make ``new`` the process the endpoints ask."""
        self.current, self.locks, self.since = new, {}, trio.current_time()

    async def ask(
        self, endpoint: str, request: str, timeout: float, fds: list[int] | None = None
    ) -> WorkerAnswer:
        """Its answer to ``request`` on its ``endpoint`` channel (None: not running or
        not answering in time; a channel that failed is closed, its framing being lost)."""
        pid = self.process.pid if self.process is not None else None
        channel = self.channels.get(endpoint)
        if channel is None:
            return WorkerAnswer(self.index, pid, None)
        lock = self.locks.setdefault(endpoint, trio.Lock())
        asked = False
        with trio.move_on_after(timeout) as waited:
            async with lock:
                asked = True
                try:
                    body = await control.ask(channel, request, fds)
                    return WorkerAnswer(self.index, pid, body)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass
        if waited.cancelled_caught:
            log.warning("worker %d did not answer %r within %gs", self.index, request, timeout)
        if asked and self.channels.get(endpoint) is channel:
            del self.channels[endpoint]
            await trio.aclose_forcefully(channel)
        return WorkerAnswer(self.index, pid, None)

    async def tap(self, query: str, timeout: float) -> trio.SocketStream | None:
        """A stream of the lines of a tap this worker opened for ``query`` (None: it is
        not running or refused)."""
        ours, theirs = socket.socketpair()
        try:
            answer = await self.ask("admin", f"tap {query}", timeout, [theirs.fileno()])
        finally:
            theirs.close()
        if answer.body is None or not orjson.loads(answer.body).get("tapping"):
            ours.close()
            return None
        return trio.SocketStream(trio.socket.from_stdlib_socket(ours))


async def start_process(
    index: int, command: Command, make_spec: MakeSpec, endpoints: list[str]
) -> WorkerProcess:
    """Start worker ``index``'s process with a control channel per endpoint and a
    ``ready`` socket, passing it the listening sockets its spec names."""
    pairs = {name: socket.socketpair() for name in endpoints}
    ready_ours, ready_theirs = socket.socketpair()
    theirs = {name: pair[1].fileno() for name, pair in pairs.items()}
    spec = make_spec(theirs, ready_theirs.fileno())
    fds = [fd for _, listener_fds in spec.listeners.values() for fd in listener_fds]
    try:
        process = await trio.lowlevel.open_process(
            command(spec),
            pass_fds=[*fds, *theirs.values(), ready_theirs.fileno()],
            start_new_session=True,
        )
    except BaseException:
        for ours, _ in pairs.values():
            ours.close()
        ready_ours.close()
        raise
    finally:
        for _, child in pairs.values():
            child.close()
        ready_theirs.close()
    log.info("worker %d started (pid %d)", index, process.pid)
    return WorkerProcess(
        process,
        {name: _stream(ours) for name, (ours, _) in pairs.items()},
        _stream(ready_ours),
    )


def _stream(sock: socket.socket) -> trio.SocketStream:
    return trio.SocketStream(trio.socket.from_stdlib_socket(sock))


async def exit_or(process: trio.Process, event: trio.Event) -> int | None:
    """``process``'s exit status once it exits; None if ``event`` is set first."""
    status: int | None = None
    async with trio.open_nursery() as nursery:

        async def asked() -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(asked)
        status = await process.wait()
        nursery.cancel_scope.cancel()
    return status


def describe_status(status: int) -> str:
    """``1``, or ``-9 (SIGKILL)`` for a worker a signal ended."""
    if status < 0:
        try:
            return f"{status} ({signal.Signals(-status).name})"
        except ValueError:
            pass
    return str(status)
