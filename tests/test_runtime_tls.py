"""TLS and mTLS listeners and upstreams through the runtime."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient

from gateway.config.certs import create_ca, init_dir, issue


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("certs")
    paths = init_dir(d)
    other = tmp_path_factory.mktemp("other-ca")
    ca_cert, ca_key = create_ca(other, "Untrusted CA")
    issue(
        ca_cert,
        ca_key,
        other / "rogue.pem",
        other / "rogue.key",
        "rogue-client",
        client=True,
    )
    paths["rogue_cert"] = other / "rogue.pem"
    paths["rogue_key"] = other / "rogue.key"
    return paths


def tls_listener(certs: dict[str, Path], client_auth: str = "required") -> dict[str, Any]:
    return {
        "name": "secure",
        "protocol": "ndjson",
        "bind": "127.0.0.1:0",
        "destination": "logs",
        "handshake_timeout": "300ms",
        "tls": {
            "cert": str(certs["server_cert"]),
            "key": str(certs["server_key"]),
            "client_ca": str(certs["ca_cert"]),
            "client_auth": client_auth,
        },
    }


def client_context(certs: dict[str, Path], cert: str | None = "client") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs["ca_cert"]))
    if cert is not None:
        ctx.load_cert_chain(str(certs[f"{cert}_cert"]), str(certs[f"{cert}_key"]))
    return ctx


async def tls_client(address: str, ctx: ssl.SSLContext) -> trio.SSLStream[trio.SocketStream]:
    tcp = await trio.open_tcp_stream(*host_port(address))
    stream = trio.SSLStream(tcp, ctx, server_hostname="localhost")
    await stream.do_handshake()
    return stream


async def test_mtls_identity_reaches_the_message_source(certs: dict[str, Path]) -> None:
    async with running_gateway({"listeners": [tls_listener(certs)]}) as gw:
        tap = gw.hub.subscribe("logs")
        client = NdjsonClient(await tls_client(gw.addresses["secure"][0], client_context(certs)))
        [ident] = await client.publish_nowait([b"secret"])
        [delivery] = await tap.receive()
        source = delivery.message.source
        assert source is not None
        assert source.identity is not None
        assert source.identity.common_name == "interchange-client"
        assert source.protocol == "ndjson"
        assert source.listener == "secure"
        assert source.peer.startswith("127.0.0.1:")
        der = ssl.PEM_cert_to_DER_cert(certs["client_cert"].read_text())
        import hashlib

        assert source.identity.fingerprint == hashlib.sha256(der).hexdigest()
        tap.ack(delivery.tag)
        assert (await client.wait_answers([ident]))[0].status == "delivered"


@pytest.mark.parametrize("which", ["missing", "rogue"])
async def test_mtls_rejects_bad_client_certificates(certs: dict[str, Path], which: str) -> None:
    async with running_gateway({"listeners": [tls_listener(certs)]}) as gw:
        address = gw.addresses["secure"][0]
        ctx = client_context(certs, None if which == "missing" else "rogue")
        with pytest.raises((trio.BrokenResourceError, ssl.SSLError)):  # noqa: PT012
            stream = await tls_client(address, ctx)
            # TLS 1.3 reports the server's refusal on the first read.
            await stream.send_all(b'{"op":"ping"}\n')
            if not await stream.receive_some():
                raise trio.BrokenResourceError("closed")
        # The listener still serves good clients.
        good = NdjsonClient(await tls_client(address, client_context(certs)))
        await good.subscribe("logs")
        await good.aclose()


async def test_optional_client_auth_accepts_anonymous_clients(certs: dict[str, Path]) -> None:
    async with running_gateway({"listeners": [tls_listener(certs, "optional")]}) as gw:
        tap = gw.hub.subscribe("logs")
        client = NdjsonClient(
            await tls_client(gw.addresses["secure"][0], client_context(certs, None))
        )
        await client.publish_nowait([b"anonymous"])
        [delivery] = await tap.receive()
        assert delivery.message.source is not None
        assert delivery.message.source.identity is None
        tap.ack(delivery.tag)


async def test_plaintext_client_on_a_tls_port_is_closed(certs: dict[str, Path]) -> None:
    async with running_gateway({"listeners": [tls_listener(certs)]}) as gw:
        address = gw.addresses["secure"][0]
        plain = await trio.open_tcp_stream(*host_port(address))
        await plain.send_all(b'{"op":"ping"}\n')
        with trio.fail_after(3):
            data = b""
            while chunk := await plain.receive_some():
                data += chunk
        assert b"pong" not in data


async def test_silent_client_is_dropped_after_the_handshake_timeout(
    certs: dict[str, Path], caplog: Any
) -> None:
    async with running_gateway({"listeners": [tls_listener(certs)]}) as gw:
        silent = await trio.open_tcp_stream(*host_port(gw.addresses["secure"][0]))
        with trio.fail_after(3):
            assert await silent.receive_some() == b""
    assert "TLS handshake timed out" in caplog.text


async def test_upstream_over_mtls(certs: dict[str, Path]) -> None:
    async with running_gateway({"listeners": [tls_listener(certs)]}) as b:
        upstream = {
            "name": "secure-b",
            "protocol": "ndjson",
            "connect": b.addresses["secure"][0],
            "tls": {
                "ca": str(certs["ca_cert"]),
                "cert": str(certs["client_cert"]),
                "key": str(certs["client_key"]),
                "server_name": "localhost",
            },
        }
        config = {
            "listeners": [
                {"name": "in", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "x"}
            ],
            "upstreams": [upstream],
            "routes": [{"from": "x", "to": ["upstream:secure-b"]}],
        }
        async with running_gateway(config) as a:
            tap = b.hub.subscribe("x")
            pub = await NdjsonClient.connect(*host_port(a.addresses["in"][0]))
            [ident] = await pub.publish_nowait([b"across"])
            [d] = await tap.receive()
            assert d.message.body == b"across"
            identity = d.message.source.identity  # type: ignore[union-attr]
            assert identity is not None
            assert identity.common_name == "interchange-client"
            tap.ack(d.tag)
            assert (await pub.wait_answers([ident]))[0].status == "delivered"
