"""Helpers for the reactive listener's end-to-end bridge tests: a gateway registry that
has the listener and the ws transport, a reactive-streams client peer over any trio
stream, and ways to connect one (TCP, TLS, unix socket, ws://, wss://).

The peer reads in a background task and keeps every event it decoded, so a test can
wait for a condition ("ten elements arrived") and, once the gateway is idle
(:func:`idle`), check that nothing else did. Its codec refuses over-delivery (more
elements than requested) with ``RemoteProtocolError``, which the reader raises:
a gateway that sends beyond demand fails the test wherever it is waiting.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing
from harness import host_port
from interchange_ndjson.client import NdjsonClient
from interchange_websocket.transport import WebSocketTransport

from gateway.core.destination import GroupFigures
from gateway.runtime.gateway import Gateway
from gateway.runtime.registry import Registered, Registry, default_registry
from gateway.sdk import ConnectionClosed, start_tls
from protocols.reactive import (
    NEED_DATA,
    Accepted,
    Completed,
    Connection,
    Elements,
    Failed,
    Hello,
    Role,
)
from protocols.reactive.messages import Message
from protocols.reactive.plugin import ReactivePlugin

#: Seconds any one awaited condition may take before the test fails.
GUARD = 10.0


def registry() -> Registry:
    """The installed plugins, with the reactive listener and the ws transport registered
    whether or not their entry points are installed."""
    installed = default_registry()
    reactive = Registered("reactive", "tests:ReactivePlugin", "tests", "0", plugin=ReactivePlugin)
    ws = Registered("ws", "tests:WebSocketTransport", "tests", "0", plugin=WebSocketTransport())
    return Registry(
        protocols=dict(installed.protocols) | {"reactive": reactive},
        transports=dict(installed.transports) | {"ws": ws},
    )


def rs_listener(bind: str = "127.0.0.1:0", **options: Any) -> dict[str, Any]:
    """A reactive listener named ``rs`` exposing every destination."""
    return {"name": "rs", "protocol": "reactive", "bind": bind, "publishers": ["*"]} | options


async def idle() -> None:
    """Return once every task of the test's run (gateway, peers) is blocked: what was
    written over loopback has been read, so what has not arrived is not on its way."""
    await trio.testing.wait_all_tasks_blocked(cushion=0.01)


def group(gw: Gateway, destination: str, name: str | None = None) -> GroupFigures:
    """The figures of ``destination``'s group ``name`` (its only group if None)."""
    groups = gw.hub.destination(destination).figures().groups
    if name is None:
        (only,) = groups
        return only
    return next(g for g in groups if g.name == name)


class RsPeer:
    """A reactive-streams client (the codec's client role) reading in the background."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.codec = Connection(Role.CLIENT)
        self.events: list[Any] = []
        self._changed = trio.lowlevel.ParkingLot()

    async def send(self, *messages: Message) -> None:
        await self.stream.send_all(b"".join(self.codec.send(x) for x in messages))

    async def read(self) -> None:
        """Decode everything the gateway sends until it closes."""
        while True:
            data = await self.stream.receive_some(65536)
            self.codec.receive_data(data)
            while (event := self.codec.next_event()) is not NEED_DATA:
                self.events.append(event)
                self._changed.unpark_all()
                if isinstance(event, ConnectionClosed):
                    return

    async def until(self, predicate: Callable[[], bool], timeout: float = GUARD) -> None:
        """Wait until ``predicate()`` holds, looking again after each event."""
        with trio.fail_after(timeout):
            while not predicate():
                await self._changed.park()

    def elements(self, sid: int) -> list[bytes]:
        """Every element of subscription ``sid`` so far, in order."""
        return [
            e
            for x in self.events
            if isinstance(x, Elements)
            for e in x.elements
            if x.subscriber == sid
        ]

    async def take(self, sid: int, count: int) -> list[bytes]:
        """The first ``count`` elements of ``sid`` (waiting for them)."""
        await self.until(lambda: len(self.elements(sid)) >= count)
        return self.elements(sid)[:count]

    async def answer(self, sid: int) -> Accepted | Failed:
        """The gateway's answer to subscribing ``sid``."""
        await self.until(lambda: self._answer(sid) is not None)
        found = self._answer(sid)
        assert found is not None
        return found

    def _answer(self, sid: int) -> Accepted | Failed | None:
        return next(
            (x for x in self.events if isinstance(x, Accepted | Failed) and x.subscriber == sid),
            None,
        )

    def completed(self, sid: int) -> bool:
        return Completed(sid) in self.events

    def ended(self) -> bool:
        return any(isinstance(x, ConnectionClosed) for x in self.events)


@asynccontextmanager
async def rs_peer(stream: trio.abc.Stream) -> AsyncIterator[RsPeer]:
    """A peer past the hellos on ``stream``; on exit the connection is dropped (no
    goodbye, no cancel), as when a client crashes."""
    peer = RsPeer(stream)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(peer.read)
            await stream.send_all(peer.codec.hello())
            await peer.until(lambda: any(isinstance(x, Hello) for x in peer.events))
            try:
                yield peer
            finally:
                nursery.cancel_scope.cancel()
    finally:
        # Outside the cancelled nursery: a checkpoint in there would raise Cancelled,
        # which the nursery swallows, and with it the test's own failure.
        await trio.aclose_forcefully(stream)


async def connect_tcp(gw: Gateway, listener: str = "rs") -> trio.abc.Stream:
    return await trio.open_tcp_stream(*host_port(gw.addresses[listener][0]))


async def connect_tls(gw: Gateway, ca: Path, listener: str = "rs") -> trio.abc.Stream:
    context = ssl.create_default_context(cafile=str(ca))
    host, port = host_port(gw.addresses[listener][0])
    return await start_tls(await trio.open_tcp_stream(host, port), context, host)


async def connect_unix(gw: Gateway, listener: str = "rs") -> trio.abc.Stream:
    (address,) = gw.addresses[listener]
    assert address.startswith("unix:"), address
    return await trio.open_unix_socket(address.removeprefix("unix:"))


async def connect_ws(gw: Gateway, ca: Path | None = None, listener: str = "rs") -> trio.abc.Stream:
    """A WebSocket client stream to a ``ws://`` (or, with ``ca``, ``wss://``) listener."""
    (url,) = gw.addresses[listener]
    transport = WebSocketTransport()
    raw = await transport.connect(url)
    if ca is not None:
        context = ssl.create_default_context(cafile=str(ca))
        raw = await start_tls(raw, context, host_port(url.split("/")[2])[0])
    return await transport.connected(raw, url)


class Answers:
    """The ndjson publisher's answers, as they arrive: one background wait per publish
    id, so a test can look at which ones came without waiting for the others."""

    def __init__(self, client: NdjsonClient) -> None:
        self.client = client
        self.got: dict[int, str] = {}

    def watch(self, nursery: trio.Nursery, ids: list[int]) -> None:
        for ident in ids:
            nursery.start_soon(self._wait, ident)

    async def _wait(self, ident: int) -> None:
        (answer,) = await self.client.wait_answers([ident])
        self.got[ident] = answer.status
