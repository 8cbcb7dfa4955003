"""Lumberjack's metrics in both roles, read from the gateway's registry after real traffic.

Frames are built here with ``struct`` and ``zlib``; the figures are read with
``Metrics.value`` (the registry's own sample lookup), so each assertion names
the exact exported sample.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

import trio
from harness import host_port, running_gateway

from gateway.core.model import Message
from gateway.runtime.gateway import Gateway
from protocols.lumberjack.standalone import open_server


def w(size: int) -> bytes:
    return struct.pack(">BBI", 0x32, ord("W"), size)


def j(seq: int, payload: bytes) -> bytes:
    return struct.pack(">BBII", 0x32, ord("J"), seq, len(payload)) + payload


def c(frames: bytes) -> bytes:
    packed = zlib.compress(frames, 3)
    return struct.pack(">BBI", 0x32, ord("C"), len(packed)) + packed


def ack(seq: int) -> bytes:
    return struct.pack(">BBI", 0x32, ord("A"), seq)


def event(n: int) -> bytes:
    return json.dumps({"n": n}).encode()


LISTENER = {"name": "lj", "protocol": "lumberjack", "bind": "127.0.0.1:0", "destination": "logs"}


def value(gw: Gateway, name: str, **labels: str) -> float:
    found = gw.metrics.value(name, labels or {"listener": "lj"})
    return 0.0 if found is None else found


async def read_exactly(stream: trio.abc.Stream, n: int) -> bytes:
    buf = b""
    with trio.fail_after(5):
        while len(buf) < n:
            chunk = await stream.receive_some(n - len(buf))
            assert chunk, f"closed after {buf!r}"
            buf += chunk
    return buf


async def test_a_window_counts_once_with_its_events_bytes_and_latency() -> None:
    frames = b"".join(j(i, event(i)) for i in range(1, 4))
    async with running_gateway({"listeners": [LISTENER | {"keepalive": "50ms"}]}) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["lj"][0]))
        await stream.send_all(w(3) + c(frames))
        with trio.fail_after(5):
            got = await sub.receive()
        # Held past a keepalive interval: the listener sends A 0 at least once.
        assert await read_exactly(stream, 6) == ack(0)
        assert value(gw, "lumberjack_ack_latency_seconds_count") == 0
        sub.ack_many(d.tag for d in got)
        while (frame := await read_exactly(stream, 6)) == ack(0):
            pass
        assert frame == ack(3)
        assert value(gw, "lumberjack_windows_total") == 1
        assert value(gw, "lumberjack_events_total") == 3
        assert value(gw, "lumberjack_inflated_bytes_total") == len(frames)
        assert value(gw, "lumberjack_keepalives_total") >= 1
        assert value(gw, "lumberjack_ack_latency_seconds_count") == 1
        assert value(gw, "lumberjack_ack_latency_seconds_sum") >= 0.05
        assert value(gw, "interchange_received_bytes_total") == len(w(3) + c(frames))
        assert value(gw, "lumberjack_protocol_errors_total") == 0
        await stream.aclose()


async def test_garbage_counts_a_protocol_error_and_nothing_else() -> None:
    async with running_gateway({"listeners": [LISTENER]}) as gw:
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["lj"][0]))
        await stream.send_all(b"GET / HTTP/1.1\r\n\r\n")
        with trio.fail_after(5):
            while await stream.receive_some(100):
                pass
        with trio.fail_after(5):
            while value(gw, "interchange_connections_open") != 0:
                await trio.sleep(0.01)
        assert value(gw, "lumberjack_protocol_errors_total") == 1
        assert value(gw, "lumberjack_windows_total") == 0
        assert value(gw, "interchange_connections_total") == 1


async def test_a_refused_window_is_counted() -> None:
    # A destination that cannot exist: the hub rejects, the listener closes unacked.
    config: dict[str, Any] = {
        "gateway": {"max_destinations": 1},
        "listeners": [LISTENER | {"destination_field": "to"}],
    }
    async with running_gateway(config) as gw:
        gw.hub.destination("only")
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["lj"][0]))
        await stream.send_all(w(1) + j(1, b'{"to":"elsewhere"}'))
        with trio.fail_after(5):
            assert await stream.receive_some(6) == b""
        assert value(gw, "lumberjack_refused_windows_total") == 1


async def test_the_upstream_counts_windows_acks_failures_and_resends() -> None:
    config = {
        "gateway": {"drain_timeout": "100ms"},
        "upstreams": [
            {
                "name": "up",
                "protocol": "lumberjack",
                "connect": "",
                "backoff_initial": "20ms",
                "backoff_max": "50ms",
            }
        ],
        "routes": [{"from": "logs", "to": ["upstream:up"]}],
    }
    labels = {"upstream": "up"}
    async with open_server("127.0.0.1", 0) as server:
        config["upstreams"][0]["connect"] = f"127.0.0.1:{server.port}"  # type: ignore[index]
        async with running_gateway(config) as gw:
            receipt = await gw.hub.publish([Message("logs", event(i)) for i in range(5)])
            with trio.fail_after(5):
                first = await server.receive()
            assert len(first.events) == 5
            first.fail()  # the server closes without an ack: the upstream resends
            with trio.fail_after(5):
                again = await server.receive()
            assert len(again.events) == 5
            again.ack()
            with trio.fail_after(5):
                await receipt.wait()
            m = gw.metrics
            assert m.value("lumberjack_upstream_windows_total", labels) == 2
            assert m.value("lumberjack_upstream_events_acked_total", labels) == 5
            assert m.value("lumberjack_upstream_events_failed_total", labels) == 5
            assert m.value("lumberjack_upstream_events_resent_total", labels) == 5
            assert m.value("lumberjack_upstream_window_events_count", labels) == 2
            assert m.value("lumberjack_upstream_window_events_sum", labels) == 10
            assert m.value("lumberjack_upstream_ack_latency_seconds_count", labels) == 1
            assert m.value("interchange_upstream_connects_total", labels) == 2
            assert m.value("interchange_upstream_failures_total", labels) == 1
            assert m.value("interchange_upstream_connected", labels) == 1


async def test_an_upstream_that_cannot_connect_counts_failures_not_connects() -> None:
    with trio.socket.socket() as sock:  # a port that refuses connections
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        config = {
            "upstreams": [
                {
                    "name": "up",
                    "protocol": "lumberjack",
                    "connect": f"127.0.0.1:{port}",
                    "backoff_initial": "10ms",
                    "backoff_max": "10ms",
                }
            ],
        }
        labels = {"upstream": "up"}
        async with running_gateway(config) as gw:
            with trio.fail_after(5):
                while (gw.metrics.value("interchange_upstream_failures_total", labels) or 0) < 2:
                    await trio.sleep(0.01)
            assert gw.metrics.value("interchange_upstream_connects_total", labels) == 0
            assert gw.metrics.value("interchange_upstream_connected", labels) == 0
