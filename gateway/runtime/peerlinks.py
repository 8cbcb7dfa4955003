"""The trio driver of the links between workers (:mod:`gateway.core.peers`).

Each worker listens on one unix socket of its own (the supervisor picks the
paths, one per worker, in a private directory) and dials every other
worker's: N workers make N(N-1) connections, each carrying one direction of
forwarding (the dialling worker's batches and its proxies' subscription
requests; the accepting worker's answers, interest and deliveries). A link
that breaks fails what it had in flight and is dialled again, with a growing
delay, until the other worker (or its replacement, after a restart) accepts.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket

import trio

from gateway.core.peers import Incoming, Outgoing, Peers
from gateway.core.peerwire import WireError

__all__ = ["drive_incoming", "drive_outgoing", "serve_peers"]

log = logging.getLogger(__name__)

#: Delays between attempts to dial a worker that does not accept (yet).
DIAL_BACKOFF = (0.05, 1.0)
_BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, WireError, OSError)


async def drive_outgoing(peers: Peers, peer: int, stream: trio.abc.Stream) -> None:
    """Forward to worker ``peer`` over ``stream`` until it breaks or ends."""
    link = peers.connected(peer)
    try:
        await _drive(link, stream)
    finally:
        peers.disconnected(link)
        await trio.aclose_forcefully(stream)


async def drive_incoming(peers: Peers, stream: trio.abc.Stream) -> None:
    """Take batches from another worker over ``stream`` until it breaks or ends."""
    link = peers.accepted()
    try:
        await _drive(link, stream)
    finally:
        peers.dropped(link)
        await trio.aclose_forcefully(stream)


async def _drive(link: Outgoing | Incoming, stream: trio.abc.Stream) -> None:
    async with trio.open_nursery() as nursery:
        done = nursery.cancel_scope
        nursery.start_soon(_write, link, stream, done)
        try:
            async for data in stream:
                if isinstance(link, Incoming):
                    await link.received(data)
                else:
                    link.received(data)
        except _BROKEN as e:
            log.warning("worker link broke: %s", e)
        done.cancel()


async def _write(
    link: Outgoing | Incoming, stream: trio.abc.Stream, done: trio.CancelScope
) -> None:
    try:
        while True:
            await stream.send_all(b"".join(await link.take()))
    except _BROKEN:
        done.cancel()


async def serve_peers(
    peers: Peers, paths: list[str], *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Listen at this worker's path and keep a link to every other worker, until
    cancelled."""
    listener = _listen(paths[peers.index])

    async def accepted(stream: trio.SocketStream) -> None:
        await drive_incoming(peers, stream)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, accepted, [listener])
        for peer, path in enumerate(paths):
            if peer != peers.index:
                nursery.start_soon(_keep_dialling, peers, peer, path)
        task_status.started()


def _listen(path: str) -> trio.SocketListener:
    """A listener on ``path`` (a stale socket file of a dead predecessor is replaced)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(16)
    return trio.SocketListener(trio.socket.from_stdlib_socket(sock))


async def _keep_dialling(peers: Peers, peer: int, path: str) -> None:
    delay = DIAL_BACKOFF[0]
    while True:
        try:
            stream = await trio.open_unix_socket(path)
        except OSError:
            await trio.sleep(delay)
            delay = min(delay * 2, DIAL_BACKOFF[1])
            continue
        delay = DIAL_BACKOFF[0]
        log.info("linked to worker %d", peer)
        await drive_outgoing(peers, peer, stream)
        await trio.sleep(delay)
