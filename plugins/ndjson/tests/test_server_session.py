"""The server driver against races trio's scheduler allows but rarely shows.

A subscription pump writes a batch of deliveries line by line; a write that
finds room does not yield, one that waits for room does, and while it waits
the reader may take an ``unsub`` (or the gateway may start draining). Here
the pump is made to leave at exactly that point, every time: it must not send
another ``msg`` for the subscription (the codec would refuse it, and the
client has been told nothing more comes), and the connection goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from interchange_ndjson.codec import DEFAULT_MAX_LINE
from interchange_ndjson.plugin import _ServerSession

from gateway.core.facade import HubFacade
from gateway.core.hub import Hub
from gateway.core.model import Message
from gateway.protocol.plugin import ConnectionInfo, ListenerSettings, ServerConnection

Leave = Callable[[_ServerSession], Awaitable[None]]


async def unsubscribe(session: _ServerSession) -> None:
    """The reader takes an ``unsub`` line (through the codec, as it would)."""
    session.codec.receive_data(b'{"op":"unsub","dest":"d"}\n')
    await session.handle(session.codec.next_event())


async def drain(session: _ServerSession) -> None:
    """The gateway starts draining."""
    session.conn.shutdown.set()
    session.draining()


class _LeavesMidBatch(_ServerSession):
    """Leaves (``leave``) right after the first ``msg`` is queued, as the reader or the
    drain could while the pump waited for room, and goes on without a checkpoint (as
    after a wait that found room at once)."""

    leave: Leave

    async def write_when_room(self, data: bytes | bytearray) -> None:
        await super().write_when_room(data)
        if data.startswith(b'{"op":"msg","tag":1,'):
            await self.leave(self)


class Client:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buf = b""

    async def line(self) -> bytes:
        with trio.fail_after(5):
            while b"\n" not in self.buf:
                data = await self.stream.receive_some()
                if not data:
                    return b""
                self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line


@asynccontextmanager
async def session(leave: Leave) -> AsyncIterator[tuple[Client, Hub, trio.Event]]:
    """A server session on a memory stream; the event is set once it returned."""
    hub = Hub()
    near, far = trio.testing.memory_stream_pair()
    options = {"max_line": DEFAULT_MAX_LINE, "max_inflight": 8}
    listener = ListenerSettings("nd", "ndjson", "127.0.0.1:0", "d", options=options)
    info = ConnectionInfo("ndjson", "nd", "peer")
    server = _LeavesMidBatch(ServerConnection(far, info, listener, HubFacade(hub), trio.Event()))
    server.leave = leave
    done = trio.Event()

    async def serve() -> None:
        await server.serve()
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        yield Client(near), hub, done
        nursery.cancel_scope.cancel()
    hub.close()


@pytest.mark.parametrize("leave", [unsubscribe, drain], ids=["unsub", "drain"])
@pytest.mark.parametrize("batch", [3, 1], ids=["mid-batch", "last-of-batch"])
async def test_a_pump_left_between_two_lines_writes_no_more(leave: Leave, batch: int) -> None:
    """Left after the last line of a batch, the pump asks the closed subscription for
    more (no checkpoint either): it must stop there too."""
    async with session(leave) as (client, hub, done):
        await client.stream.send_all(b'{"op":"sub","dest":"d","window":10}\n{"op":"ping"}\n')
        assert await client.line() == b'{"op":"pong"}'
        await hub.publish([Message("d", b"m%d" % i) for i in range(batch)])
        assert (await client.line()).startswith(b'{"op":"msg","tag":1,')
        # After an unsub the gateway forgot the delivery; while draining it waits for it.
        ack = b'{"op":"ack","tag":1}\n' if leave is drain else b""
        await client.stream.send_all(ack + b'{"op":"ping"}\n')
        # The only line after the msg, on a connection that goes on (or, draining,
        # ends once the ack paid what was owed).
        assert await client.line() == b'{"op":"pong"}'
        if leave is drain:
            with trio.fail_after(5):
                await done.wait()
            assert client.buf == b""
        else:
            assert not done.is_set()
