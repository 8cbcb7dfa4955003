"""The library API without a gateway: ``LumberjackClient`` and ``open_server``.

``LumberjackClient.send`` returns only once the server acked every event;
``open_server`` yields one :class:`Batch` per window, and the client's ack
waits for ``batch.ack()``; ``batch.fail()`` closes the connection unacked.
"""

from __future__ import annotations

import json
import ssl
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from gateway.config.certs import init_dir
from gateway.core.errors import RemoteProtocolError
from protocols.lumberjack.client import ClientSettings, LumberjackClient
from protocols.lumberjack.server import ServerSettings
from protocols.lumberjack.standalone import Batch, LumberjackServer, open_server


@asynccontextmanager
async def server(**kwargs: Any) -> AsyncIterator[LumberjackServer]:
    async with open_server("127.0.0.1", 0, **kwargs) as srv:
        yield srv


async def next_batch(srv: LumberjackServer, timeout: float = 5.0) -> Batch:
    with trio.fail_after(timeout):
        return await srv.receive()


class Sending:
    """``client.send(events)`` in the background."""

    def __init__(self, client: LumberjackClient, events: list[Any]) -> None:
        self.client = client
        self.events = events
        self.done = trio.Event()
        self.result: int | None = None
        self.error: BaseException | None = None

    async def run(self) -> None:
        try:
            self.result = await self.client.send(self.events)
        except (trio.BrokenResourceError, trio.TooSlowError, RemoteProtocolError) as e:
            self.error = e
        self.done.set()

    async def finished_within(self, seconds: float) -> bool:
        with trio.move_on_after(seconds):
            await self.done.wait()
        return self.done.is_set()


async def test_send_returns_only_once_the_batch_is_acked() -> None:
    async with server() as srv:
        client = await LumberjackClient.connect("127.0.0.1", srv.port)
        events: list[Any] = [{"a": 1}, b'{"b":2}', {"c": "\u00e9"}]
        async with client, trio.open_nursery() as nursery:
            sending = Sending(client, events)
            nursery.start_soon(sending.run)
            batch = await next_batch(srv)
            assert [seq for seq, _ in batch.events] == [1, 2, 3]
            assert [json.loads(p) for _, p in batch.events] == [  # type: ignore[arg-type]
                {"a": 1},
                {"b": 2},
                {"c": "\u00e9"},
            ]
            assert batch.version == 2
            assert batch.peer.startswith("127.0.0.1:")
            assert batch.identity is None
            assert not await sending.finished_within(0.3)
            batch.ack()
            assert await sending.finished_within(5)
            assert sending.result == 3
            assert sending.error is None


async def test_a_failed_batch_closes_the_connection() -> None:
    async with server() as srv:
        client = await LumberjackClient.connect("127.0.0.1", srv.port)
        async with client, trio.open_nursery() as nursery:
            sending = Sending(client, [{"n": 1}])
            nursery.start_soon(sending.run)
            batch = await next_batch(srv)
            batch.fail("disk full")
            assert await sending.finished_within(5)
            assert isinstance(sending.error, trio.BrokenResourceError)
            assert sending.result is None
        # The server goes on serving new connections.
        again = await LumberjackClient.connect("127.0.0.1", srv.port)
        async with again, trio.open_nursery() as nursery:
            sending = Sending(again, [{"n": 2}])
            nursery.start_soon(sending.run)
            (await next_batch(srv)).ack()
            assert await sending.finished_within(5)
            assert sending.result == 1


def _two_windows_of_one_event() -> bytes:
    """``W 1`` + ``J`` seq 7, then ``W 1`` + ``J`` seq 8: two windows the server acks apart."""
    one = b'{"n":1}'
    window = struct.pack(">BBI", 0x32, ord("W"), 1)
    return b"".join(
        window + struct.pack(">BBII", 0x32, ord("J"), seq, len(one)) + one for seq in (7, 8)
    )


async def test_batches_are_acked_in_window_order() -> None:
    """Acking the second window first acks nothing until the first is acked too."""
    async with server() as srv:
        stream = await trio.open_tcp_stream("127.0.0.1", srv.port)
        await stream.send_all(_two_windows_of_one_event())
        first, second = await next_batch(srv), await next_batch(srv)
        second.ack()
        with trio.move_on_after(0.3):
            pytest.fail(f"acked out of order: {await stream.receive_some()!r}")
        first.ack()
        data = b""
        with trio.fail_after(5):
            while len(data) < 12:
                data += await stream.receive_some()
        assert data == b"2A\x00\x00\x00\x07" + b"2A\x00\x00\x00\x08"
        await stream.aclose()


async def test_large_sends_are_split_into_windows_of_bulk_max_size() -> None:
    async with server() as srv:
        settings = ClientSettings(bulk_max_size=4)
        client = await LumberjackClient.connect("127.0.0.1", srv.port, settings=settings)
        async with client, trio.open_nursery() as nursery:
            sending = Sending(client, [{"n": i} for i in range(10)])
            nursery.start_soon(sending.run)
            sizes = []
            for _ in range(3):
                batch = await next_batch(srv)
                sizes.append([json.loads(p)["n"] for _, p in batch.events])  # type: ignore[arg-type]
                batch.ack()
            assert await sending.finished_within(5)
        assert sizes == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        assert sending.result == 10


async def test_send_times_out_without_an_ack() -> None:
    async with server() as srv:
        settings = ClientSettings(timeout=0.3)
        client = await LumberjackClient.connect("127.0.0.1", srv.port, settings=settings)
        async with client, trio.open_nursery() as nursery:
            sending = Sending(client, [{"n": 1}])
            nursery.start_soon(sending.run)
            await next_batch(srv)  # received, never acked
            assert await sending.finished_within(5)
            assert isinstance(sending.error, trio.TooSlowError)


async def test_server_keepalives_let_a_slow_application_outlast_the_client_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with server(settings=ServerSettings(keepalive=0.05)) as srv:
        settings = ClientSettings(timeout=0.3)
        client = await LumberjackClient.connect("127.0.0.1", srv.port, settings=settings)
        async with client, trio.open_nursery() as nursery:
            sending = Sending(client, [{"n": 1}, {"n": 2}])
            nursery.start_soon(sending.run)
            batch = await next_batch(srv)
            await trio.sleep(1.0)  # more than three client timeouts
            assert not sending.done.is_set()
            batch.ack()
            assert await sending.finished_within(5)
            assert (sending.result, sending.error) == (2, None)


async def test_client_refuses_an_ack_beyond_its_window() -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, _ack_five, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        async with await LumberjackClient.connect("127.0.0.1", port) as client:
            with trio.fail_after(5), pytest.raises(RemoteProtocolError):
                await client.send([{"n": 1}, {"n": 2}])
        nursery.cancel_scope.cancel()


async def _ack_five(stream: trio.SocketStream) -> None:
    await stream.receive_some()
    await stream.send_all(b"2A\x00\x00\x00\x05")
    await trio.sleep_forever()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return init_dir(tmp_path_factory.mktemp("lj-library-certs"))


async def test_open_server_over_mutual_tls_reports_the_client_identity(
    certs: dict[str, Path],
) -> None:
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs["ca_cert"]))
    server_ctx.load_cert_chain(str(certs["server_cert"]), str(certs["server_key"]))
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.create_default_context(cafile=str(certs["ca_cert"]))
    client_ctx.load_cert_chain(str(certs["client_cert"]), str(certs["client_key"]))
    async with server(ssl_context=server_ctx) as srv:
        client = await LumberjackClient.connect(
            "127.0.0.1", srv.port, ssl_context=client_ctx, server_hostname="localhost"
        )
        async with client, trio.open_nursery() as nursery:
            sending = Sending(client, [{"secret": True}])
            nursery.start_soon(sending.run)
            batch = await next_batch(srv)
            assert batch.identity is not None
            assert batch.identity.common_name == "interchange-client"
            batch.ack()
            assert await sending.finished_within(5)
            assert sending.result == 1


async def test_a_batch_acked_just_before_a_failed_one_still_gets_its_ack() -> None:
    """Acks owed before a refused window go out before the connection closes."""
    async with server() as srv:
        stream = await trio.open_tcp_stream("127.0.0.1", srv.port)
        await stream.send_all(_two_windows_of_one_event())
        first, second = await next_batch(srv), await next_batch(srv)
        first.ack()  # settled together, before the server's writer runs
        second.fail("disk full")
        data = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some():
                data += chunk
        assert data == b"2A\x00\x00\x00\x07"
        await stream.aclose()


async def test_a_window_whose_highest_sequence_is_0_gets_no_keepalive() -> None:
    """Its ack is ``A 0``: a keepalive ``A 0`` would ack it before the application did."""
    async with server(settings=ServerSettings(keepalive=0.05)) as srv:
        stream = await trio.open_tcp_stream("127.0.0.1", srv.port)
        one = b'{"n":1}'
        window = struct.pack(">BBI", 0x32, ord("W"), 1)
        await stream.send_all(window + struct.pack(">BBII", 0x32, ord("J"), 0, len(one)) + one)
        batch = await next_batch(srv)
        with trio.move_on_after(0.3):
            pytest.fail(f"sent before the batch was acked: {await stream.receive_some()!r}")
        batch.ack()
        with trio.fail_after(5):
            assert await stream.receive_some() == b"2A\x00\x00\x00\x00"
        await stream.aclose()
