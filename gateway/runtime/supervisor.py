"""The supervisor of ``gateway run --workers N``: bind once, run N workers, keep them running.

The supervisor's trio loop only supervises. It binds every listener once
(each transport's ``listen``), then starts N worker processes
(``gateway run CONFIG --worker SPEC``, see :mod:`gateway.runtime.worker`),
passing the listening sockets' descriptors down (``pass_fds``): each worker
serves them with its transport's ``adopt``, so the kernel hands each new
connection to whichever worker accepts first. Workers start in sessions of
their own, so that a terminal's Ctrl-C reaches the supervisor alone and each
worker gets exactly one forwarded signal.

With ``[gateway] reuse_port``, each TCP listener (not a pinned one) has a
socket per worker instead, with ``SO_REUSEPORT`` (:mod:`gateway.runtime.bound`),
and worker ``i`` is always given set ``i``: the supervisor keeps every socket
open, so a restarted or replacing worker serves the very socket its
predecessor did, and the connections queued on it meanwhile are served, not
dropped.

- A worker that exits while the gateway is not stopping is logged with its
  exit status and started again: at once after a long life, after a delay
  that doubles (up to :data:`MAX_BACKOFF`) while it keeps dying young.
- SIGTERM or SIGINT: forwarded (as SIGTERM) to every worker, each of which
  drains within ``drain_timeout``; a worker still running
  :data:`KILL_GRACE` seconds after that is killed. A second signal kills
  them at once.
- SIGHUP: forwarded to every worker; each reloads the config file in place
  as a single gateway does (its connections, and their state, stay).
- SIGUSR2 (or ``POST /api/reload?replace=1``): :meth:`Supervisor.replace`
  replaces the workers one at a time, for what a reload cannot apply (new
  code): the new worker starts on the same sockets and reports it serves
  (a ``ready`` descriptor in its spec), then the old one drains; the worker
  holding the store drains first.
- Listeners whose protocol keeps segments in the store get their sockets in
  worker 0 only (:meth:`Supervisor.pinned`): one store, one writer.
- ``GET /api/tap``: :meth:`Supervisor.open_taps` passes every worker a
  socket over its admin channel to write its tap's lines to.
- ``[admin]`` and ``[metrics]``: bound and served by the supervisor, for the
  whole gateway (:mod:`gateway.ops.fleet`). Each worker gets a control
  channel per endpoint (a socket pair, one end passed down) and answers
  what the supervisor asks on it (:mod:`gateway.ops.control`): its
  snapshot, its reload, its metrics.

:meth:`Supervisor.run` returns the exit status: 0 when every worker exited
0, 3 when some only abandoned unsettled publishes, 1 otherwise.

This module is the supervisor's lifecycle: starting, restarting, stopping,
signals and the rolling replacement. Binding the listeners once is
:mod:`gateway.runtime.bound`; a worker's slot, its process and the channels
the endpoints ask it on are :mod:`gateway.runtime.slots`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio

from gateway.config.loader import Config
from gateway.ops.fleet import WorkerAnswer, serve_fleet
from gateway.ops.metrics import Metrics
from gateway.runtime.bound import bind_listeners, describe_address
from gateway.runtime.endpoints import listen_plain
from gateway.runtime.registry import Registry, default_registry
from gateway.runtime.slots import (
    Command,
    Slot,
    WorkerProcess,
    describe_status,
    exit_or,
    start_process,
)
from gateway.runtime.worker import WorkerSpec

__all__ = ["Supervisor", "default_command"]

log = logging.getLogger("gateway.supervisor")

#: A worker that lived at least this long is restarted at once when it dies.
STEADY_UPTIME = 10.0
#: The first delay before restarting a worker that died young; doubles each time.
FIRST_BACKOFF = 0.5
#: The longest delay before restarting a worker.
MAX_BACKOFF = 30.0
#: Seconds past ``drain_timeout`` a worker has to exit before it is killed.
KILL_GRACE = 5.0
#: Seconds a replacement worker has to start serving before it is given up.
READY_TIMEOUT = 60.0
#: ``gateway run``'s exit status when publishes were abandoned (as one gateway's).
EXIT_ABANDONED = 3


@dataclass
class Supervisor:
    """Binds ``config``'s listeners and keeps ``workers`` worker processes running."""

    config: Config
    workers: int
    command: Command
    registry: Registry = field(default_factory=default_registry)

    def __post_init__(self) -> None:
        self.slots = [Slot(i) for i in range(self.workers)]
        self.stopping = False
        #: Each listener's sets of sockets: one that every worker serves, or (reuse_port)
        #: one per worker (:func:`~gateway.runtime.bound.bind_listeners`).
        self.bound: dict[str, list[list[socket.socket]]] = {}
        self._stopped = trio.Event()
        #: The endpoints the supervisor serves for the whole gateway.
        binds = {"admin": self.config.admin_bind, "metrics": self.config.metrics_bind}
        self.endpoints = [name for name, bind in binds.items() if bind is not None]
        #: Each worker's forwarding socket path while running (:mod:`~gateway.runtime.peerlinks`).
        self.peer_paths: list[str] = []
        #: Their bound addresses once running, by endpoint.
        self.addresses: dict[str, list[str]] = {}
        #: Processes started and not current yet (a replacement) or no longer (draining).
        self._starting: set[trio.Process] = set()
        self._retiring: set[trio.Process] = set()
        #: One rolling replacement at a time.
        self._replacing = trio.Lock()

    @property
    def sockets(self) -> dict[str, list[socket.socket]]:
        """Each listener's sockets, worker 0's with ``reuse_port`` (the same addresses)."""
        return {name: sets[0] for name, sets in self.bound.items()}

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids."""
        return [s.process.pid for s in self.slots if s.process is not None]

    async def run(
        self, *, task_status: trio.TaskStatus[Supervisor] = trio.TASK_STATUS_IGNORED
    ) -> int:
        """Bind, start the workers, supervise until stopped; return the exit status."""
        pinned = {ls.name for ls in self.config.listeners if self.pinned(ls.name)}
        self.bound = await bind_listeners(self.config, self.registry, self.workers, pinned)
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
            for sets in self.bound.values():
                for sock in (sock for sockets in sets for sock in sockets):
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
        # Not the workers already draining: a second SIGTERM would stop them at once.
        self.forward(signal.SIGTERM, self._starting)

    def kill(self) -> None:
        """Stop every worker now (SIGKILL), as a second SIGINT or SIGTERM asks."""
        self.stopping = True
        self._stopped.set()
        self.forward(signal.SIGKILL, self._starting | self._retiring)

    def forward(self, signum: int, also: Iterable[trio.Process] = ()) -> None:
        """Send ``signum`` to every running worker (and to the processes ``also``)."""
        processes = [
            s.process
            for s in self.slots
            if s.process is not None and s.process not in self._retiring
        ]
        for process in {*processes, *also}:
            if process.returncode is None:
                process.send_signal(signum)

    async def watch_signals(self) -> None:
        """SIGTERM/SIGINT: drain the workers (a second: kill them); SIGHUP: forward it;
        SIGUSR2: replace the workers one at a time (:meth:`replace`)."""
        watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR2)
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(*watched) as signals:
                async for signum in signals:
                    self._on_signal(signum, nursery)

    def _on_signal(self, signum: int, nursery: trio.Nursery) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGHUP:
            log.info("SIGHUP: forwarded to %d workers (each reloads)", self.workers)
            self.forward(signal.SIGHUP)
        elif signum == signal.SIGUSR2:
            log.info("SIGUSR2: replacing the %d workers one at a time", self.workers)
            nursery.start_soon(self.replace)
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

        async def one(slot: Slot) -> None:
            answers.append(await slot.ask(endpoint, request, timeout))

        async with trio.open_nursery() as nursery:
            for slot in self.slots:
                nursery.start_soon(one, slot)
        return sorted(answers, key=lambda a: a.index)

    async def open_taps(self, query: str, timeout: float) -> list[tuple[int, trio.SocketStream]]:
        """A tap for ``query`` in every running worker: (index, its stream of lines)
        (:class:`gateway.ops.fleet.Workers`)."""
        taps: list[tuple[int, trio.SocketStream]] = []

        async def one(slot: Slot) -> None:
            stream = await slot.tap(query, timeout)
            if stream is not None:
                taps.append((slot.index, stream))

        async with trio.open_nursery() as nursery:
            for slot in self.slots:
                nursery.start_soon(one, slot)
        return sorted(taps, key=lambda t: t[0])

    async def replace(self) -> list[dict[str, Any]]:
        """Replace the workers one at a time (a code upgrade); each one's outcome.

        A new worker starts on the same sockets; once it serves, the old one
        drains and exits: the listening sockets stay open in the supervisor, so
        no connection is refused. The worker that opens the store drains first
        (one process holds it), its pinned listeners' connections waiting in the
        kernel's queue meanwhile.
        """
        async with self._replacing:
            results = []
            for slot in self.slots:
                if self.stopping:
                    break
                results.append(await self._replace_one(slot))
            log.info("replacement done: %s", ", ".join(_describe(r) for r in results))
            return results

    async def _replace_one(self, slot: Slot) -> dict[str, Any]:
        """Ask ``slot``'s task to replace its worker; its outcome."""
        if slot.current is None or slot.current.process.returncode is not None:
            return {"index": slot.index, "replaced": False, "error": "not running"}
        slot.replaced = trio.Event()
        slot.replace_asked.set()
        async with trio.open_nursery() as nursery:

            async def stopped() -> None:
                await self._stopped.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(stopped)
            await slot.replaced.wait()
            nursery.cancel_scope.cancel()
        if not slot.replaced.is_set():
            return {"index": slot.index, "replaced": False, "error": "stopping"}
        return slot.result

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

    # -- pinned listeners, the store -------------------------------------------------
    def pinned(self, listener: str) -> bool:
        """Whether ``listener`` is served by worker 0 alone: its protocol keeps segments
        in the store, which one process writes."""
        for ls in self.config.listeners:
            if ls.name == listener:
                try:
                    return bool(self.registry.protocol(ls.protocol).needs_store)
                except LookupError:
                    return False
        return False

    def _holds_store(self, slot: Slot) -> bool:
        """Whether ``slot``'s worker opens the store (worker 0, when one is needed)."""
        if slot.index != 0:
            return False
        durable = any(d.store for d in self.config.destinations)
        return durable or any(self.pinned(ls.name) for ls in self.config.listeners)

    def _spec(self, slot: Slot, channels: dict[str, int], ready: int) -> WorkerSpec:
        """What ``slot``'s worker is told: its listeners' descriptors (:meth:`_fds`)."""
        listeners = {
            ls.name: (ls.bind, self._fds(ls.name, slot.index)) for ls in self.config.listeners
        }
        return WorkerSpec(slot.index, listeners, os.getpid(), channels, self.peer_paths, ready)

    def _fds(self, listener: str, index: int) -> list[int]:
        """The descriptors worker ``index`` serves ``listener`` on: its own set with
        ``reuse_port``, else the shared one (none but in worker 0 for a pinned listener)."""
        sets = self.bound[listener]
        if len(sets) > 1:
            return [s.fileno() for s in sets[index]]
        if index == 0 or not self.pinned(listener):
            return [s.fileno() for s in sets[0]]
        return []

    # -- running the workers -----------------------------------------------------------
    async def _spawn(self, slot: Slot) -> WorkerProcess:
        """Start a worker process for ``slot`` (not made current)."""
        make_spec = functools.partial(self._spec, slot)
        return await start_process(slot.index, self.command, make_spec, self.endpoints)

    async def _keep_running(self, slot: Slot) -> None:
        """Run the worker of ``slot``, again each time it dies, until the supervisor stops."""
        while not self.stopping:
            new = await self._spawn(slot)
            slot.install(new)
            if self.stopping:  # stopped while it started: the forwarded SIGTERM missed it
                new.process.send_signal(signal.SIGTERM)
            status = await self._supervise(slot)
            assert slot.current is not None
            pid = slot.current.pid
            if self.stopping:
                slot.final = status
                log.info("worker %d (pid %d) exited with status %d", slot.index, pid, status)
                return
            await self._restart_later(slot, pid, status, trio.current_time() - slot.since)

    async def _supervise(self, slot: Slot) -> int:
        """Wait until ``slot``'s current worker exits (its status), replacing it whenever
        asked (:meth:`replace`)."""
        while True:
            current = slot.current
            assert current is not None
            status = await exit_or(current.process, slot.replace_asked)
            if status is not None:
                await current.aclose()
                return status
            slot.replace_asked = trio.Event()
            slot.result = await self._replace_slot(slot)
            slot.replaced.set()

    async def _replace_slot(self, slot: Slot) -> dict[str, Any]:
        """Replace ``slot``'s current worker by a new one; what happened."""
        old = slot.current
        assert old is not None
        result: dict[str, Any] = {"index": slot.index, "old_pid": old.pid}
        if self._holds_store(slot):
            # One process holds the store: the old one drains and exits first.
            result["old_status"] = await self._retire(slot, old)
            if self.stopping:
                return {**result, "replaced": False, "error": "stopping"}
            new = await self._spawn(slot)
            slot.install(new)
            ready = await self._wait_ready(slot, new)
            return {**result, "pid": new.pid, "replaced": ready}
        new = await self._spawn(slot)
        self._starting.add(new.process)
        try:
            ready = await self._wait_ready(slot, new)
        finally:
            self._starting.discard(new.process)
        if not ready:
            await self._retire(slot, new)
            error = "its replacement did not start serving"
            return {**result, "pid": old.pid, "replaced": False, "error": error}
        slot.install(new)
        result["old_status"] = await self._retire(slot, old)
        return {**result, "pid": new.pid, "replaced": True}

    async def _wait_ready(self, slot: Slot, new: WorkerProcess) -> bool:
        """Whether ``new`` says it serves within :data:`READY_TIMEOUT` (False: it died,
        was late, or the supervisor is stopping)."""
        said = b""
        with trio.move_on_after(READY_TIMEOUT):
            async with trio.open_nursery() as nursery:

                async def stopped() -> None:
                    await self._stopped.wait()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(stopped)
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    said = bytes(await new.ready.receive_some(64))
                nursery.cancel_scope.cancel()
        if said.startswith(b"ready"):
            log.info("worker %d (pid %d) serves", slot.index, new.pid)
            return True
        log.error("worker %d (pid %d) did not start serving", slot.index, new.pid)
        return False

    async def _retire(self, slot: Slot, old: WorkerProcess) -> int:
        """Drain ``old`` (SIGTERM; killed :data:`KILL_GRACE` s past ``drain_timeout``);
        its exit status."""
        self._retiring.add(old.process)
        try:
            if old.process.returncode is None and not self.stopping:  # else: signalled
                old.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(self.config.gateway.drain_timeout + KILL_GRACE):
                await old.process.wait()
            if old.process.returncode is None:
                log.error(
                    "worker %d (pid %d) did not drain in time: killing it", slot.index, old.pid
                )
                old.process.kill()
            status = await old.process.wait()
        finally:
            self._retiring.discard(old.process)
            await old.aclose()
        log.info(
            "worker %d (pid %d) replaced: exited with status %s",
            slot.index,
            old.pid,
            describe_status(status),
        )
        return status

    async def _restart_later(self, slot: Slot, pid: int, status: int, lived: float) -> None:
        """Log the death of ``slot``'s worker and wait its backoff (or until stopped)."""
        slot.backoff = (
            0.0
            if lived >= STEADY_UPTIME
            else min(max(slot.backoff * 2, FIRST_BACKOFF), MAX_BACKOFF)
        )
        slot.restarts += 1
        slot.current = None
        log.warning(
            "worker %d (pid %d) exited with status %s after %.1fs; restarting%s",
            slot.index,
            pid,
            describe_status(status),
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
        self.forward(signal.SIGKILL, self._starting | self._retiring)

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
                + " ".join(describe_address(s) for s in self.sockets[ls.name])
                + (" (worker 0 only)" if self.workers > 1 and self.pinned(ls.name) else "")
                + (" (reuse_port: a socket per worker)" if len(self.bound[ls.name]) > 1 else "")
                for ls in self.config.listeners
            )
            or "no listeners",
            self.workers,
        )


def _describe(result: dict[str, Any]) -> str:
    """``worker 1 pid 10 → 12`` or ``worker 1 kept (why)``, for the log."""
    if result.get("replaced"):
        return f"worker {result['index']} pid {result['old_pid']} → {result['pid']}"
    return f"worker {result['index']} kept ({result.get('error')})"


def default_command(config_path: str | None, extra: Sequence[str] = ()) -> Command:
    """``python -m gateway run CONFIG [extra] --worker SPEC``: how the CLI starts workers."""
    import sys

    def command(spec: WorkerSpec) -> list[str]:
        config = [config_path] if config_path else []
        return [sys.executable, "-m", "gateway", "run", *config, *extra, "--worker", spec.encode()]

    return command
