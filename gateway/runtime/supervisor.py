"""The supervisor of ``gateway run --workers N``: bind once, run N workers, keep them running.

The supervisor's trio loop only supervises. It binds every listener once
(each transport's ``listen``), then starts N worker processes
(``gateway run CONFIG --worker SPEC``, see :mod:`gateway.runtime.worker`),
passing the listening sockets' descriptors down (``pass_fds``): each worker
serves them with its transport's ``adopt``, so the kernel hands each new
connection to whichever worker accepts first. Workers start in sessions of
their own, so that a terminal's Ctrl-C reaches the supervisor alone and each
worker gets exactly one forwarded signal.

- A worker that exits while the gateway is not stopping is logged with its
  exit status and started again: at once after a long life, after a delay
  that doubles (up to :data:`MAX_BACKOFF`) while it keeps dying young.
- SIGTERM or SIGINT: forwarded (as SIGTERM) to every worker, each of which
  drains within ``drain_timeout``; a worker still running
  :data:`KILL_GRACE` seconds after that is killed. A second signal kills
  them at once.
- SIGHUP: forwarded to every worker; each reloads the config file as a
  single gateway does.
- ``[admin]`` and ``[metrics]``: bound and served by the supervisor, for the
  whole gateway (:mod:`gateway.ops.fleet`). Each worker gets a control
  channel per endpoint (a socket pair, one end passed down) and answers
  what the supervisor asks on it (:mod:`gateway.ops.control`): its
  snapshot, its reload, its metrics.

:meth:`Supervisor.run` returns the exit status: 0 when every worker exited
0, 3 when some only abandoned unsettled publishes, 1 otherwise.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import trio

from gateway.config.loader import Config
from gateway.ops import control
from gateway.ops.fleet import WorkerAnswer, serve_fleet
from gateway.ops.metrics import Metrics
from gateway.runtime.endpoints import listen_plain
from gateway.runtime.registry import Registry, default_registry
from gateway.runtime.worker import WorkerSpec

__all__ = ["Supervisor", "bind_listeners"]

log = logging.getLogger("gateway.supervisor")

#: A worker that lived at least this long is restarted at once when it dies.
STEADY_UPTIME = 10.0
#: The first delay before restarting a worker that died young; doubles each time.
FIRST_BACKOFF = 0.5
#: The longest delay before restarting a worker.
MAX_BACKOFF = 30.0
#: Seconds past ``drain_timeout`` a worker has to exit before it is killed.
KILL_GRACE = 5.0
#: ``gateway run``'s exit status when publishes were abandoned (as one gateway's).
EXIT_ABANDONED = 3

#: Builds a worker's command line from its spec.
Command = Callable[[WorkerSpec], list[str]]


async def bind_listeners(config: Config, registry: Registry) -> dict[str, list[socket.socket]]:
    """Bind every listener of ``config`` once: its name → its listening sockets.

    Each listener is bound by its transport's ``listen`` (so a wildcard or
    port 0 gives the same sockets a single gateway would have) and its
    sockets are taken out of the trio listeners as plain sockets.
    """
    bound: dict[str, list[socket.socket]] = {}
    try:
        for ls in config.listeners:
            try:
                listeners = await registry.transport_for(ls.bind).listen(ls.bind)
            except OSError as e:
                raise OSError(
                    e.errno, f"listener {ls.name!r} cannot bind {ls.bind}: {e.strerror or e}"
                ) from None
            bound[ls.name] = [_take_socket(sl) for sl in listeners]
    except BaseException:
        for sockets in bound.values():
            for sock in sockets:
                sock.close()
        raise
    return bound


def _take_socket(listener: trio.abc.Listener[trio.abc.Stream]) -> socket.socket:
    """The listening socket under ``listener`` as a plain socket (the listener is left
    without it). Looks through wrappers that keep theirs as ``inner`` (``ws``)."""
    wrapped: object = listener
    for _ in range(4):
        sock = getattr(wrapped, "socket", None)
        if sock is not None:
            return socket.socket(fileno=sock.detach())
        wrapped = getattr(wrapped, "inner", None)
        if wrapped is None:
            break
    raise TypeError("the transport's listener has no socket to hand to workers")


def _address(sock: socket.socket) -> str:
    """``127.0.0.1:5044``, ``[::1]:5044`` or ``unix:/path``, for the log."""
    name = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return "unix:" + (os.fsdecode(name) if isinstance(name, bytes) else str(name))
    host = f"[{name[0]}]" if sock.family == socket.AF_INET6 else name[0]
    return f"{host}:{name[1]}"


@dataclass(slots=True)
class _Worker:
    """One worker slot: its process (None between runs) and how it has fared."""

    index: int
    process: trio.Process | None = None
    backoff: float = 0.0
    restarts: int = 0
    #: Its exit status once it stopped during the supervisor's stop.
    final: int | None = None
    #: The supervisor's ends of its control channels, by endpoint, while it runs.
    channels: dict[str, trio.SocketStream] = field(default_factory=dict)
    #: One request at a time on each channel.
    locks: dict[str, trio.Lock] = field(default_factory=dict)

    async def ask(self, endpoint: str, request: str, timeout: float) -> WorkerAnswer:
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
                    return WorkerAnswer(self.index, pid, await control.ask(channel, request))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        if waited.cancelled_caught:
            log.warning("worker %d did not answer %r within %gs", self.index, request, timeout)
        if asked and self.channels.get(endpoint) is channel:
            del self.channels[endpoint]
            await trio.aclose_forcefully(channel)
        return WorkerAnswer(self.index, pid, None)


@dataclass
class Supervisor:
    """Binds ``config``'s listeners and keeps ``workers`` worker processes running."""

    config: Config
    workers: int
    command: Command
    registry: Registry = field(default_factory=default_registry)

    def __post_init__(self) -> None:
        self.slots = [_Worker(i) for i in range(self.workers)]
        self.stopping = False
        self.sockets: dict[str, list[socket.socket]] = {}
        self._stopped = trio.Event()
        #: The endpoints the supervisor serves for the whole gateway.
        binds = {"admin": self.config.admin_bind, "metrics": self.config.metrics_bind}
        self.endpoints = [name for name, bind in binds.items() if bind is not None]
        #: Each worker's forwarding socket path while running (:mod:`~gateway.runtime.peerlinks`).
        self.peer_paths: list[str] = []
        #: Their bound addresses once running, by endpoint.
        self.addresses: dict[str, list[str]] = {}

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids."""
        return [s.process.pid for s in self.slots if s.process is not None]

    async def run(
        self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
    ) -> int:
        """Bind, start the workers, supervise until stopped; return the exit status."""
        self.sockets = await bind_listeners(self.config, self.registry)
        peer_dir = tempfile.mkdtemp(prefix="gateway-peers-") if self.workers > 1 else None
        if peer_dir is not None:
            # One unix socket per worker: in-memory topics forward between them.
            self.peer_paths = [os.path.join(peer_dir, f"{i}.sock") for i in range(self.workers)]
        try:
            endpoints = await self._bind_endpoints()
            self._log_serving()
            async with trio.open_nursery() as outer:
                outer.start_soon(self._kill_late)
                outer.start_soon(self._serve_endpoints, endpoints)
                async with trio.open_nursery() as nursery:
                    for slot in self.slots:
                        nursery.start_soon(self._keep_running, slot)
                    task_status.started(self)
                outer.cancel_scope.cancel()
        finally:
            for sockets in self.sockets.values():
                for sock in sockets:
                    sock.close()
            if peer_dir is not None:
                shutil.rmtree(peer_dir, ignore_errors=True)
        return self._status()

    def stop(self) -> None:
        """Drain every worker (SIGTERM); ``run`` returns once all have exited."""
        if self.stopping:
            return
        self.stopping = True
        self._stopped.set()
        self.forward(signal.SIGTERM)

    def kill(self) -> None:
        """Stop every worker now (SIGKILL), as a second SIGINT or SIGTERM asks."""
        self.stopping = True
        self._stopped.set()
        self.forward(signal.SIGKILL)

    def forward(self, signum: int) -> None:
        """Send ``signum`` to every running worker."""
        for slot in self.slots:
            if slot.process is not None and slot.process.returncode is None:
                slot.process.send_signal(signum)

    async def watch_signals(self) -> None:
        """SIGTERM/SIGINT: drain the workers (a second: kill them); SIGHUP: forward it."""
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if signum == signal.SIGHUP:
                    log.info("SIGHUP: forwarded to %d workers (each reloads)", self.workers)
                    self.forward(signal.SIGHUP)
                elif self.stopping:
                    log.warning("second %s: killing the workers", name)
                    self.kill()
                else:
                    log.info("%s received: draining %d workers", name, self.workers)
                    self.stop()

    async def ask(self, endpoint: str, request: str, timeout: float) -> list[WorkerAnswer]:
        """Every worker's answer to ``request`` on its ``endpoint`` channel, asked at once
        (:class:`gateway.ops.fleet.Workers`)."""
        answers: list[WorkerAnswer] = []

        async def one(slot: _Worker) -> None:
            answers.append(await slot.ask(endpoint, request, timeout))

        async with trio.open_nursery() as nursery:
            for slot in self.slots:
                nursery.start_soon(one, slot)
        return sorted(answers, key=lambda a: a.index)

    async def _bind_endpoints(self) -> dict[str, list[trio.SocketListener]]:
        """Bind ``[admin]`` and ``[metrics]`` (as a single gateway would), by endpoint."""
        bound = {}
        binds = {"admin": self.config.admin_bind, "metrics": self.config.metrics_bind}
        try:
            for name in self.endpoints:
                bind = binds[name]
                assert bind is not None
                bound[name], self.addresses[name] = await listen_plain(self.registry, bind, name)
        except BaseException:
            for listeners in bound.values():
                for listener in listeners:
                    listener.socket.close()
            raise
        return bound

    async def _serve_endpoints(self, bound: dict[str, list[trio.SocketListener]]) -> None:
        if "admin" in bound:
            log.info("admin: status page and /api/status on %s", " ".join(self.addresses["admin"]))
        if "metrics" in bound:
            log.info("metrics: GET /metrics on %s", " ".join(self.addresses["metrics"]))
        if bound:
            config = self.config
            await serve_fleet(
                self,
                bound.get("admin"),
                bound.get("metrics"),
                Metrics(),
                max_connections=(config.admin_max_connections, config.metrics_max_connections),
                idle_timeout=(config.admin_idle_timeout, config.metrics_idle_timeout),
            )

    def _spec(self, slot: _Worker, channels: dict[str, int]) -> WorkerSpec:
        listeners = {
            ls.name: (ls.bind, [s.fileno() for s in self.sockets[ls.name]])
            for ls in self.config.listeners
        }
        return WorkerSpec(slot.index, listeners, os.getpid(), channels, self.peer_paths)

    def _fds(self) -> list[int]:
        return [s.fileno() for sockets in self.sockets.values() for s in sockets]

    async def _keep_running(self, slot: _Worker) -> None:
        """Run the worker of ``slot``, again each time it dies, until the supervisor stops."""
        while not self.stopping:
            started = trio.current_time()
            pairs = {name: socket.socketpair() for name in self.endpoints}
            theirs = {name: pair[1].fileno() for name, pair in pairs.items()}
            try:
                slot.process = await trio.lowlevel.open_process(
                    self.command(self._spec(slot, theirs)),
                    pass_fds=[*self._fds(), *theirs.values()],
                    start_new_session=True,
                )
            except BaseException:
                for ours, _ in pairs.values():
                    ours.close()
                raise
            finally:
                for _, child in pairs.values():
                    child.close()
            slot.channels = {
                name: trio.SocketStream(trio.socket.from_stdlib_socket(ours))
                for name, (ours, _) in pairs.items()
            }
            log.info("worker %d started (pid %d)", slot.index, slot.process.pid)
            try:
                status = await slot.process.wait()
            finally:
                channels, slot.channels = slot.channels, {}
                for channel in channels.values():
                    await trio.aclose_forcefully(channel)
            if self.stopping:
                slot.final = status
                log.info(
                    "worker %d (pid %d) exited with status %d", slot.index, slot.process.pid, status
                )
                return
            await self._restart_later(slot, status, trio.current_time() - started)

    async def _restart_later(self, slot: _Worker, status: int, lived: float) -> None:
        """Log the death of ``slot``'s worker and wait its backoff (or until stopped)."""
        assert slot.process is not None
        slot.backoff = (
            0.0
            if lived >= STEADY_UPTIME
            else min(max(slot.backoff * 2, FIRST_BACKOFF), MAX_BACKOFF)
        )
        slot.restarts += 1
        log.warning(
            "worker %d (pid %d) exited with status %s after %.1fs; restarting%s",
            slot.index,
            slot.process.pid,
            _describe_status(status),
            lived,
            f" in {slot.backoff:g}s" if slot.backoff else "",
        )
        with trio.move_on_after(slot.backoff):
            await self._stopped.wait()

    async def _kill_late(self) -> None:
        """Once stopping: kill the workers still running ``drain_timeout`` plus a grace later."""
        await self._stopped.wait()
        await trio.sleep(self.config.gateway.drain_timeout + KILL_GRACE)
        late = [s for s in self.slots if s.process is not None and s.process.returncode is None]
        for slot in late:
            log.error("worker %d did not exit within drain_timeout: killing it", slot.index)
        self.forward(signal.SIGKILL)

    def _status(self) -> int:
        """0: every worker exited cleanly; 3: some abandoned publishes; 1: worse.

        A worker the forwarded SIGTERM ended (status -15) was still starting (a
        running one handles the signal and drains): it held no connection, so
        it counts as clean.
        """
        finals = [0 if s.final == -signal.SIGTERM else s.final for s in self.slots]
        if all(status == 0 for status in finals):
            return 0
        if all(status in (0, EXIT_ABANDONED) for status in finals):
            return EXIT_ABANDONED
        return 1

    def _log_serving(self) -> None:
        log.info(
            "serving: %s; %d workers",
            ", ".join(
                f"{ls.name} ({ls.protocol}) on "
                + " ".join(_address(s) for s in self.sockets[ls.name])
                for ls in self.config.listeners
            )
            or "no listeners",
            self.workers,
        )


def _describe_status(status: int) -> str:
    """``1``, or ``-9 (SIGKILL)`` for a worker a signal ended."""
    if status < 0:
        try:
            return f"{status} ({signal.Signals(-status).name})"
        except ValueError:
            pass
    return str(status)


def default_command(config_path: str | None, extra: Sequence[str] = ()) -> Command:
    """``python -m gateway run CONFIG [extra] --worker SPEC``: how the CLI starts workers."""
    import sys

    def command(spec: WorkerSpec) -> list[str]:
        config = [config_path] if config_path else []
        return [sys.executable, "-m", "gateway", "run", *config, *extra, "--worker", spec.encode()]

    return command
