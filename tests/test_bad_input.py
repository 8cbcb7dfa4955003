"""Bad input on each transport (tcp, unix, tls): a clear error or a close, never a
crash, and the listener keeps serving everyone else."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from waits import subscribed

from gateway.config.certs import init_dir
from gateway.runtime.gateway import Gateway


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return init_dir(tmp_path_factory.mktemp("certs"))


@asynccontextmanager
async def gateway_on(
    transport: str, tmp_path: Path, certs: dict[str, Path], **extra: Any
) -> AsyncIterator[Connect]:
    """A gateway with one ndjson listener on ``transport``; yields a connect function."""
    listener: dict[str, Any] = {
        "name": "nd",
        "protocol": "ndjson",
        "destination": "logs",
        "bind": f"unix:{tmp_path / 'gw.sock'}" if transport == "unix" else "127.0.0.1:0",
        **extra,
    }
    if transport == "tls":
        listener["tls"] = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    async with running_gateway({"listeners": [listener]}) as gw:
        yield Connect(gw, transport, certs)


class Connect:
    """``await connect()`` opens a connection to the gateway's listener over one
    transport; ``connect.gateway`` is the gateway, to look at its hub."""

    def __init__(self, gateway: Gateway, transport: str, certs: dict[str, Path]) -> None:
        self.gateway = gateway
        self.transport = transport
        self.certs = certs

    async def __call__(self) -> trio.abc.Stream:
        address = self.gateway.addresses["nd"][0]
        if self.transport == "unix":
            return await trio.open_unix_socket(address.removeprefix("unix:"))
        tcp = await trio.open_tcp_stream(*host_port(address))
        if self.transport == "tcp":
            return tcp
        ctx = ssl.create_default_context(cafile=str(self.certs["ca_cert"]))
        stream = trio.SSLStream(tcp, ctx, server_hostname="localhost")
        await stream.do_handshake()
        return stream


async def read_to_close(stream: trio.abc.Stream) -> bytes:
    data = b""
    with trio.fail_after(5):
        try:
            while chunk := await stream.receive_some():
                data += chunk
        except trio.BrokenResourceError:
            pass
    return data


async def still_serves(connect: Connect) -> None:
    sub = NdjsonClient(await connect())
    await sub.subscribe("logs")
    await subscribed(connect.gateway, "logs")
    pub = NdjsonClient(await connect())
    [ident] = await pub.publish_nowait([b"after the bad client"])
    delivery = await sub.receive()
    await sub.ack(delivery.tag)
    assert (await pub.wait_answers([ident]))[0].status == "delivered"


TRANSPORTS = ["tcp", "unix", "tls"]
GARBAGE = [
    b"\x00\xff\xfe garbage \x80\n",
    b"[1,2,3]\n",
    b'{"op":"launch"}\n',
    b'{"op":"ack","tag":99}\n',  # a tag that was never delivered
    b"{" * 5000 + b"\n",  # deep nesting
]


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("garbage", GARBAGE, ids=["binary", "array", "op", "tag", "nesting"])
async def test_garbage_gets_an_error_line_then_close(
    transport: str, garbage: bytes, tmp_path: Path, certs: dict[str, Path]
) -> None:
    async with gateway_on(transport, tmp_path, certs) as connect:
        bad = await connect()
        await bad.send_all(garbage)
        reply = await read_to_close(bad)
        assert reply.startswith(b'{"op":"error","error":')
        assert reply.endswith(b"\n")
        await still_serves(connect)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_oversize_line_is_refused_before_it_is_buffered(
    transport: str, tmp_path: Path, certs: dict[str, Path]
) -> None:
    async with gateway_on(transport, tmp_path, certs, max_line="1KiB") as connect:
        bad = await connect()
        with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):  # noqa: PT012
            for _ in range(100):  # 100 KiB without a newline
                await bad.send_all(b"x" * 1024)
                await trio.sleep(0)
            await read_to_close(bad)
            raise trio.BrokenResourceError("closed")
        await still_serves(connect)


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_truncated_line_at_eof_is_not_published(
    transport: str, tmp_path: Path, certs: dict[str, Path]
) -> None:
    async with gateway_on(transport, tmp_path, certs) as connect:
        sub = NdjsonClient(await connect())
        await sub.subscribe("logs")
        bad = await connect()
        await bad.send_all(b'{"op":"pub","id":1,"body":"cut sh')
        if transport == "tls":
            await bad.aclose()  # TLS has no half-close; a close is the EOF here
        else:
            await bad.send_eof()  # type: ignore[attr-defined]
            assert b'"op":"error"' in await read_to_close(bad)
        with trio.move_on_after(0.3):
            await sub.receive()
            pytest.fail("a truncated line was published")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_silent_client_is_closed_after_the_idle_timeout(
    transport: str, tmp_path: Path, certs: dict[str, Path]
) -> None:
    async with gateway_on(transport, tmp_path, certs, idle_timeout="200ms") as connect:
        silent = await connect()
        with trio.fail_after(3):
            assert await read_to_close(silent) == b""
        await still_serves(connect)
