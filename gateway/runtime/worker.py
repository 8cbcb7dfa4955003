"""One worker of ``gateway run --workers N``: a normal gateway on inherited sockets.

The supervisor (:mod:`gateway.runtime.supervisor`) binds every listener once
and starts each worker as ``gateway run CONFIG --worker SPEC``, in a process
of its own (spawned, never forked from a running trio), with the listening
sockets' descriptors passed down. :class:`WorkerSpec` is what ``SPEC`` says:
the worker's number and, by listener name, the bind and the descriptors.
Before its gateway starts, the worker hands those sockets to its listeners
(:func:`adopt`), so that every worker accepts from the same kernel queues;
with ``[gateway] reuse_port`` a TCP listener's descriptors are this worker's
own sockets (``SO_REUSEPORT``, one per worker), adopted the same way.

The spec also names one unix socket path per worker: topics published in one
worker reach subscribers in the others over links between them
(:mod:`gateway.runtime.peerlinks`, :func:`take_peers`).

With ``[admin]`` or ``[metrics]`` configured, the spec also names a control
channel for each (:mod:`gateway.ops.control`): the worker binds neither
endpoint but answers its supervisor, which serves them for the whole gateway
(:func:`take_channel`).

A worker stops when its supervisor is gone (:func:`watch_parent`): the
supervisor's signals reach workers by forwarding only, so an orphan would
otherwise serve on forever.

A listener the spec gives no descriptors is served by another worker (the
supervisor pins listeners whose protocol keeps segments in the store to worker
0, :func:`pinned_elsewhere`): this worker's gateway leaves it out of its
config, at start and at every reload (``gateway.cli``), and never
binds it nor sets its protocol up.

Once its gateway serves, a worker says so on the spec's ``ready`` descriptor
(:func:`report_ready`): the supervisor's rolling replacement waits for it
before it stops the worker being replaced.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from gateway.runtime.listener import adopt_sockets

__all__ = [
    "WorkerSpec",
    "adopt",
    "pinned_elsewhere",
    "report_ready",
    "take_channel",
    "take_peers",
    "watch_parent",
]

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
    #: Each worker's unix socket path for forwarding topics, by index (empty: none).
    peers: list[str] = field(default_factory=list)
    #: The inherited descriptor on which it reports it serves (-1: none).
    ready: int = -1

    def encode(self) -> str:
        """One command-line argument (JSON)."""
        listeners = {name: {"bind": b, "fds": fds} for name, (b, fds) in self.listeners.items()}
        return json.dumps(
            {
                "index": self.index,
                "parent": self.parent,
                "listeners": listeners,
                "channels": self.channels,
                "peers": self.peers,
                "ready": self.ready,
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
            peers = [str(path) for path in data.get("peers", [])]
            parent, ready = int(data.get("parent", 0)), int(data.get("ready", -1))
            return cls(int(data["index"]), listeners, parent, channels, peers, ready)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a worker spec: {e}") from None


#: This process's control channels, once :func:`adopt` took them (a worker only).
_CHANNELS: dict[str, socket.socket] = {}
#: This worker's index and every worker's forwarding socket path, once adopted.
_PEERS: list[tuple[int, list[str]]] = []
#: Where this worker reports it serves, once adopted (a worker only).
_READY: list[int] = []


def adopt(spec: WorkerSpec) -> None:
    """Make the listeners of ``spec`` serve its inherited sockets instead of binding,
    and keep its control channels for the endpoints (:func:`take_channel`)."""
    for name, (bind, fds) in spec.listeners.items():
        adopt_sockets(name, bind, [socket.socket(fileno=fd) for fd in fds])
    for endpoint, fd in spec.channels.items():
        _CHANNELS[endpoint] = socket.socket(fileno=fd)
    if len(spec.peers) > 1:
        _PEERS[:] = [(spec.index, list(spec.peers))]
    if spec.ready >= 0:
        _READY[:] = [spec.ready]


def pinned_elsewhere(spec: WorkerSpec) -> set[str]:
    """The listeners of ``spec`` another worker serves (given no descriptors here)."""
    return {name for name, (_, fds) in spec.listeners.items() if not fds}


def report_ready() -> None:
    """Tell the supervisor this worker serves (once; nothing outside a worker).

    A supervisor that stopped listening is no failure: it only waits for the
    word during a replacement.
    """
    if not _READY:
        return
    fd = _READY.pop()
    try:
        os.write(fd, b"ready\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def take_peers() -> tuple[int, list[str]] | None:
    """This worker's index and the paths where every worker takes forwarded topics
    (:mod:`gateway.runtime.peerlinks`); None outside a worker of several. Taken once."""
    return _PEERS.pop() if _PEERS else None


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
