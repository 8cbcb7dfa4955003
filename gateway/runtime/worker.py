"""One worker of ``gateway run --workers N``: a normal gateway on inherited sockets.

The supervisor (:mod:`gateway.runtime.supervisor`) binds every listener once
and starts each worker as ``gateway run CONFIG --worker SPEC``, in a process
of its own (spawned, never forked from a running trio), with the listening
sockets' descriptors passed down. :class:`WorkerSpec` is what ``SPEC`` says:
the worker's number and, by listener name, the bind and the descriptors.
Before its gateway starts, the worker hands those sockets to its listeners
(:func:`adopt`), so that every worker accepts from the same kernel queues.

With ``[admin]`` or ``[metrics]`` configured, the spec also names a control
channel for each (:mod:`gateway.ops.control`): the worker binds neither
endpoint but answers its supervisor, which serves them for the whole gateway
(:func:`take_channel`).

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

__all__ = ["WorkerSpec", "adopt", "take_channel", "watch_parent"]

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
    #: Endpoint (``admin``, ``metrics``) → the inherited descriptor of its control channel.
    channels: dict[str, int] = field(default_factory=dict)

    def encode(self) -> str:
        """One command-line argument (JSON)."""
        listeners = {name: {"bind": b, "fds": fds} for name, (b, fds) in self.listeners.items()}
        return json.dumps(
            {
                "index": self.index,
                "parent": self.parent,
                "listeners": listeners,
                "channels": self.channels,
            }
        )

    @classmethod
    def decode(cls, text: str) -> WorkerSpec:
        """Parse :meth:`encode`'s output; ``ValueError`` if it is not one."""
        try:
            data = json.loads(text)
            listeners = {
                str(name): (str(entry["bind"]), [int(fd) for fd in entry["fds"]])
                for name, entry in data["listeners"].items()
            }
            channels = {str(k): int(fd) for k, fd in data.get("channels", {}).items()}
            return cls(int(data["index"]), listeners, int(data.get("parent", 0)), channels)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a worker spec: {e}") from None


#: This process's control channels, once :func:`adopt` took them (a worker only).
_CHANNELS: dict[str, socket.socket] = {}


def adopt(spec: WorkerSpec) -> None:
    """Make the listeners of ``spec`` serve its inherited sockets instead of binding,
    and keep its control channels for the endpoints (:func:`take_channel`)."""
    for name, (bind, fds) in spec.listeners.items():
        adopt_sockets(name, bind, [socket.socket(fileno=fd) for fd in fds])
    for endpoint, fd in spec.channels.items():
        _CHANNELS[endpoint] = socket.socket(fileno=fd)


def take_channel(endpoint: str) -> trio.SocketStream | None:
    """The control channel through which this worker's ``endpoint`` (``admin``,
    ``metrics``) answers the supervisor; None outside a worker (serve it yourself).

    Taken once: the endpoints start once (changing them needs a restart).
    """
    sock = _CHANNELS.pop(endpoint, None)
    return None if sock is None else trio.SocketStream(trio.socket.from_stdlib_socket(sock))


async def watch_parent(parent: int, stop: Callable[[], None]) -> None:
    """Call ``stop`` (the gateway's drain) once this process's parent is not ``parent``."""
    while True:
        if os.getppid() != parent:
            stop()
            return
        await trio.sleep(PARENT_CHECK_INTERVAL)
