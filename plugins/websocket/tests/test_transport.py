"""The ws transport in a running gateway: ndjson over ws:// and wss:// with the independent
``websockets`` client library, and an upstream over ws:// from one gateway to another."""

from __future__ import annotations

import contextlib
import json
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from interchange_websocket.stream import WebSocketStream
from interchange_websocket.transport import WebSocketTransport
from waits import subscribed

from gateway.config.certs import init_dir
from gateway.runtime.registry import Registered, Registry, default_registry

try:
    from websockets.sync.client import ClientConnection
    from websockets.sync.client import connect as ws_connect
except ImportError:  # pragma: no cover - the message says what to do
    ws_connect = None  # type: ignore[assignment]


def registry() -> Registry:
    """The installed plugins with this transport registered (installed or not)."""
    installed = default_registry()
    ws = Registered(
        "ws",
        "interchange_websocket.transport:WebSocketTransport",
        "interchange-gateway-websocket",
        "0.1.0",
        plugin=WebSocketTransport(),
    )
    return Registry(
        protocols=installed.protocols, transports=dict(installed.transports) | {"ws": ws}
    )


def listener(bind: str = "ws://127.0.0.1:0/nd", **extra: Any) -> dict[str, Any]:
    return {"name": "ws", "protocol": "ndjson", "bind": bind} | extra


QUEUE = {"destinations": [{"name": "logs", "kind": "queue"}]}


def lines(ws: ClientConnection) -> Callable[[], dict[str, Any]]:
    """The next JSON line from ``ws``, whatever the message boundaries."""
    buffer = bytearray()

    def next_line() -> dict[str, Any]:
        while b"\n" not in buffer:
            data = ws.recv(timeout=10)
            buffer.extend(data.encode() if isinstance(data, str) else data)
        line, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        return dict(json.loads(line))

    return next_line


def open_ws(url: str, **kwargs: Any) -> ClientConnection:
    if ws_connect is None:
        pytest.fail("these tests need the websockets client library: pip install websockets")
    return ws_connect(url, open_timeout=10, **kwargs)


def subscribe_one(url: str, **kwargs: Any) -> dict[str, Any]:
    """Subscribe to logs, receive one delivery, ack it (in a thread: websockets is blocking)."""
    with open_ws(url, **kwargs) as ws:
        read = lines(ws)
        ws.send(b'{"op":"sub","dest":"logs"}\n')
        msg = read()
        ws.send(json.dumps({"op": "ack", "tag": msg["tag"]}).encode() + b"\n")
        ws.send(b'{"op":"ping"}\n')
        assert read() == {"op": "pong"}  # the ack was read before we hang up
        return msg


def publish_one(url: str, body: str, **kwargs: Any) -> dict[str, Any]:
    """Publish as a text message (taken as its UTF-8) and wait for the answer."""
    with open_ws(url, **kwargs) as ws:
        ws.send(json.dumps({"op": "pub", "id": 1, "dest": "logs", "body": body}) + "\n")
        return lines(ws)()


async def pub_sub_through(url: str, gw: Any, **kwargs: Any) -> None:
    async with trio.open_nursery() as nursery:
        got: list[dict[str, Any]] = []

        async def sub() -> None:
            got.append(await trio.to_thread.run_sync(lambda: subscribe_one(url, **kwargs)))

        nursery.start_soon(sub)
        await subscribed(gw, "logs")
        answer = await trio.to_thread.run_sync(lambda: publish_one(url, "über ws", **kwargs))
    assert answer["status"] == "delivered"
    assert got[0]["body"] == "über ws"


async def test_ndjson_over_ws_with_an_independent_client() -> None:
    async with running_gateway({"listeners": [listener()], **QUEUE}, registry=registry()) as gw:
        [url] = gw.addresses["ws"]
        assert url.startswith("ws://127.0.0.1:")
        assert url.endswith("/nd")
        await pub_sub_through(url, gw)


async def test_a_refused_origin_gets_403_from_the_gateway() -> None:
    bind = "ws://127.0.0.1:0/nd?origin=https://app.example"
    async with running_gateway({"listeners": [listener(bind)]}, registry=registry()) as gw:
        [url] = gw.addresses["ws"]

        def attempt(origin: str) -> str:
            try:
                with open_ws(url, origin=origin):
                    return "open"
            except Exception as e:  # websockets' InvalidStatus
                return str(e)

        assert await trio.to_thread.run_sync(attempt, "https://app.example") == "open"
        assert "403" in await trio.to_thread.run_sync(attempt, "https://evil.example")


async def test_a_subprotocol_is_negotiated_with_the_gateway() -> None:
    bind = "ws://127.0.0.1:0/nd?subprotocol=ndjson.v1"
    async with running_gateway({"listeners": [listener(bind)]}, registry=registry()) as gw:
        [url] = gw.addresses["ws"]
        assert url.endswith("/nd?subprotocol=ndjson.v1")

        def chosen() -> str | None:
            with open_ws(url, subprotocols=["other", "ndjson.v1"]) as ws:
                return ws.subprotocol

        assert await trio.to_thread.run_sync(chosen) == "ndjson.v1"


async def test_upstream_over_ws_acks_end_to_end() -> None:
    """ndjson publisher → gateway A → upstream connect = "ws://…" → gateway B → subscriber."""
    reg = registry()
    async with running_gateway({"listeners": [listener()]}, registry=reg) as b:
        [b_url] = b.addresses["ws"]
        config_a = {
            "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
            "upstreams": [{"name": "b", "protocol": "ndjson", "connect": b_url}],
            "routes": [{"from": "logs", "to": ["upstream:b"]}],
        }
        async with running_gateway(config_a, registry=reg) as a:
            transport = WebSocketTransport()
            raw = await transport.connect(b_url)
            sub = NdjsonClient(await transport.connected(raw, b_url))
            assert isinstance(sub.stream, WebSocketStream)
            await sub.subscribe("logs")
            await subscribed(b, "logs")
            pub = await NdjsonClient.connect(*host_port(a.addresses["nd"][0]))
            idents = await pub.publish_nowait([b"one", b"two"], "logs")
            got = [await sub.receive() for _ in idents]
            assert sorted(d.body for d in got) == [b"one", b"two"]
            with trio.move_on_after(0.2):
                await pub.wait_answers(idents)
                pytest.fail("relay acked before the final subscriber acked")
            await sub.ack(*(d.tag for d in got))
            answers = await pub.wait_answers(idents)
            assert [x.status for x in answers] == ["delivered", "delivered"]
            await pub.aclose()
            await sub.aclose()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return init_dir(tmp_path_factory.mktemp("certs"))


async def test_ndjson_over_wss_with_the_listeners_tls_table(certs: dict[str, Path]) -> None:
    tls = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    config = {"listeners": [listener("wss://127.0.0.1:0/nd", tls=tls)], **QUEUE}
    async with running_gateway(config, registry=registry()) as gw:
        [url] = gw.addresses["ws"]
        assert url.startswith("wss://127.0.0.1:")
        context = ssl.create_default_context(cafile=str(certs["ca_cert"]))
        await pub_sub_through(url, gw, ssl=context)


async def test_an_upstream_over_wss(certs: dict[str, Path]) -> None:
    reg = registry()
    tls = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    config_b = {"listeners": [listener("wss://127.0.0.1:0/nd", tls=tls)], **QUEUE}
    async with running_gateway(config_b, registry=reg) as b:
        [b_url] = b.addresses["ws"]
        config_a = {
            "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
            "upstreams": [
                {
                    "name": "b",
                    "protocol": "ndjson",
                    "connect": b_url,
                    "tls": {"ca": str(certs["ca_cert"])},
                }
            ],
            "routes": [{"from": "logs", "to": ["upstream:b"]}],
        }
        async with running_gateway(config_a, registry=reg) as a:
            tap = b.hub.subscribe("logs", "g")
            pub = await NdjsonClient.connect(*host_port(a.addresses["nd"][0]))
            [ident] = await pub.publish_nowait([b"over wss"], "logs")
            [delivery] = await tap.receive()
            assert delivery.message.body == b"over wss"
            tap.ack(delivery.tag)
            [answer] = await pub.wait_answers([ident])
            assert answer.status == "delivered"
            await pub.aclose()
            tap.close()


async def test_ws_with_a_tls_table_is_refused_naming_the_mistake(
    certs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    tls = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    async with running_gateway({"listeners": [listener(tls=tls)]}, registry=registry()) as gw:
        [url] = gw.addresses["ws"]
        stream = await trio.open_ssl_over_tcp_stream(
            *host_port(url.removeprefix("ws://").split("/")[0]),
            ssl_context=ssl.create_default_context(cafile=str(certs["ca_cert"])),
        )
        with trio.fail_after(10), contextlib.suppress(trio.BrokenResourceError):
            while await stream.receive_some():
                pass  # closed without a close_notify: that is fine here
        assert "write wss://, not ws://" in caplog.text


async def test_pings_are_answered_and_a_message_too_big_closes_1009() -> None:
    bind = "ws://127.0.0.1:0/nd?max_message=100"
    async with running_gateway({"listeners": [listener(bind)]}, registry=registry()) as gw:
        [url] = gw.addresses["ws"]

        def conversation() -> tuple[bool, int | None]:
            with open_ws(url) as ws:
                ponged = ws.ping(b"are you there").wait(10)
                ws.send(b'{"op":"ping"}' + b" " * 200 + b"\n")
                try:
                    while True:
                        ws.recv(timeout=10)
                except Exception:  # websockets' ConnectionClosedError
                    pass
                return ponged, ws.close_code

        assert await trio.to_thread.run_sync(conversation) == (True, 1009)


async def test_an_upgrade_that_never_completes_is_closed_after_handshake_timeout(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    config = {"listeners": [listener(handshake_timeout="20s")]}
    async with running_gateway(config, registry=registry()) as gw:
        [url] = gw.addresses["ws"]
        started = trio.current_time()
        silent = await trio.open_tcp_stream(*host_port(url.removeprefix("ws://").split("/")[0]))
        await silent.send_all(b"GET /nd HTTP/1.1\r\nHost: x\r\n")  # and never the end
        with trio.fail_after(60):
            assert await silent.receive_some() == b""
        assert 20 <= trio.current_time() - started < 60
        assert "ws handshake timed out; closing" in caplog.text
        await silent.aclose()


async def test_a_plain_http_request_gets_426_from_the_gateway() -> None:
    async with running_gateway({"listeners": [listener()]}, registry=registry()) as gw:
        [url] = gw.addresses["ws"]
        plain = await trio.open_tcp_stream(*host_port(url.removeprefix("ws://").split("/")[0]))
        await plain.send_all(b"GET /nd HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        with trio.fail_after(10):
            while chunk := await plain.receive_some():
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 426 Upgrade Required\r\n")
        assert answer.endswith(
            b"\r\n\r\nthis is a websocket endpoint: Missing header, 'Connection: Upgrade'\n"
        )
        await plain.aclose()


def goodbye_over_ws(url: str) -> tuple[int | None, list[bytes]]:
    """Say hello and goodbye to a reactive listener; its answers and its close code."""
    import msgpack

    with open_ws(url) as ws:
        ws.send(msgpack.packb([1, 0, []]) + msgpack.packb([4, "done"]))
        got: list[bytes] = []
        with contextlib.suppress(Exception):
            while True:
                data = ws.recv(timeout=10)
                got.append(data if isinstance(data, bytes) else data.encode())
        return ws.close_code, got


async def test_a_connection_the_gateway_ends_closes_1000() -> None:
    """The runtime closes a finished connection gracefully: the WebSocket close frame goes
    out (1000), not a bare hang-up (1006)."""
    rs = {"name": "ws", "protocol": "reactive", "bind": "ws://127.0.0.1:0/rs"}
    async with running_gateway({"listeners": [rs]}, registry=registry()) as gw:
        url = gw.addresses["ws"][0]
        code, got = await trio.to_thread.run_sync(lambda: goodbye_over_ws(url))
    assert b"".join(got).startswith(b"\x93\x02\x00")  # serverHello first
    assert code == 1000
