"""One worker of ``gateway run --workers N``: a normal gateway on inherited sockets.

The supervisor (:mod:`gateway.runtime.supervisor`) binds every listener once
and starts each worker as ``gateway run CONFIG --worker SPEC``, in a process
of its own (spawned, never forked from a running trio), with the listening
sockets' descriptors passed down. :class:`WorkerSpec` is what ``SPEC`` says:
the worker's number and, by listener name, the bind and the descriptors.
Before its gateway starts, the worker hands those sockets to its listeners
(:func:`adopt`), so that every worker accepts from the same kernel queues.

A worker stops when its supervisor is gone (:func:`watch_parent`): the
supervisor's signals reach workers by forwarding only, so an orphan would
otherwise serve on forever.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from gateway.runtime.listener import adopt_sockets

__all__ = ["WorkerSpec", "adopt", "watch_parent"]

#: How often a worker checks that its supervisor still runs.
PARENT_CHECK_INTERVAL = 1.0


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """What a worker is told on its command line."""

    #: 0 … N-1: which of the supervisor's workers this is (for logs).
    index: int
    #: Listener name → (its bind, the inherited descriptors of its sockets).
    listeners: dict[str, tuple[str, list[int]]] = field(default_factory=dict)
    #: The supervisor's pid: the worker stops when its parent is no longer it.
    parent: int = 0

    def encode(self) -> str:
        """One command-line argument (JSON)."""
        listeners = {name: {"bind": b, "fds": fds} for name, (b, fds) in self.listeners.items()}
        return json.dumps({"index": self.index, "parent": self.parent, "listeners": listeners})

    @classmethod
    def decode(cls, text: str) -> WorkerSpec:
        """Parse :meth:`encode`'s output; ``ValueError`` if it is not one."""
        try:
            data = json.loads(text)
            listeners = {
                str(name): (str(entry["bind"]), [int(fd) for fd in entry["fds"]])
                for name, entry in data["listeners"].items()
            }
            return cls(int(data["index"]), listeners, int(data.get("parent", 0)))
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a worker spec: {e}") from None


def adopt(spec: WorkerSpec) -> None:
    """Make the listeners of ``spec`` serve its inherited sockets instead of binding."""
    for name, (bind, fds) in spec.listeners.items():
        adopt_sockets(name, bind, [socket.socket(fileno=fd) for fd in fds])


async def watch_parent(parent: int, stop: Callable[[], None]) -> None:
    """Call ``stop`` (the gateway's drain) once this process's parent is not ``parent``."""
    while True:
        if os.getppid() != parent:
            stop()
            return
        await trio.sleep(PARENT_CHECK_INTERVAL)
