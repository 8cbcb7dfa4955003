"""The gateway's protections against connections that hold memory, slots or logs hostage.

Each test is one of the problems a fault and bad-input run found, driven over
real sockets against an in-process gateway; the ones about time run on trio's
mock clock (``autojump_clock``), so "30 s" of trickling costs no real time.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway

from gateway.runtime.gateway import Gateway
from protocols.lumberjack.codec import EVENT_OVERHEAD, INFLATER_STATE
from protocols.lumberjack.frames import compressed_frame, json_frame, window_frame


def lumberjack(**options: Any) -> dict[str, Any]:
    return {"name": "lj", "protocol": "lumberjack", "bind": "127.0.0.1:0"} | options


def ndjson(**options: Any) -> dict[str, Any]:
    return {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"} | options


def config(*listeners: dict[str, Any], **gateway: Any) -> dict[str, Any]:
    return {"gateway": {"drain_timeout": "1s"} | gateway, "listeners": list(listeners)}


async def connect(gw: Gateway, listener: str) -> trio.SocketStream:
    return await trio.open_tcp_stream(*host_port(gw.addresses[listener][0]))


async def closed_after(stream: trio.abc.Stream, limit: float) -> float:
    """Read until the gateway closes ``stream``; how long that took (fails after ``limit``)."""
    start = trio.current_time()
    with trio.fail_after(limit):
        try:
            while await stream.receive_some(65536):
                pass
        except trio.BrokenResourceError:
            pass
    return trio.current_time() - start


async def closed_while(
    stream: trio.abc.Stream, send: Callable[[], Awaitable[None]], limit: float
) -> float:
    """Run ``send`` until the gateway closes ``stream``; how long that took."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        took = await closed_after(stream, limit)
        nursery.cancel_scope.cancel()
    return took


async def wait_for(check: Any, limit: float = 30.0) -> None:
    with trio.fail_after(limit):
        while not check():
            await trio.sleep(0.05)


def refused(gw: Gateway, listener: str, reason: str) -> float:
    value = gw.metrics.value(
        "interchange_refused_connections_total", {"listener": listener, "reason": reason}
    )
    return value or 0.0


# -- 1. deadlines that mean what the docs say ------------------------------------------


async def test_a_trickling_window_is_closed_within_its_timeout(autojump_clock: Any) -> None:
    """One byte every 5 s kept a started window (and its slot) forever."""
    listener = lumberjack(window_timeout="30s", idle_timeout="60s")
    async with running_gateway(config(listener)) as gw:
        stream = await connect(gw, "lj")
        rest = json_frame(2, 1, b'{"n":1}') + json_frame(2, 2, b'{"n":2}')
        await stream.send_all(window_frame(2, 2))

        async def trickle() -> None:
            for byte in rest[:-1]:
                await trio.sleep(5)
                await stream.send_all(bytes([byte]))

        took = await closed_while(stream, trickle, 60)
        assert 29 <= took <= 36
        assert refused(gw, "lj", "timeout") == 1
        assert gw.connections("lj") == 0


async def test_a_trickling_ndjson_line_is_closed_within_the_unit_timeout(
    autojump_clock: Any,
) -> None:
    """Every protocol on the skeleton gets the unit deadline: here, a line never ended."""
    async with running_gateway(config(ndjson(idle_timeout="600s"))) as gw:
        stream = await connect(gw, "nd")

        async def trickle() -> None:
            for byte in b'{"op":"pub","id":1,"body":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}':
                await stream.send_all(bytes([byte]))
                await trio.sleep(5)

        took = await closed_while(stream, trickle, 120)
        assert 29 <= took <= 36
        assert refused(gw, "nd", "timeout") == 1


async def test_pings_are_not_progress_for_the_idle_timeout(autojump_clock: Any) -> None:
    """A client that only pings holds its slot until idle_timeout, not forever."""
    async with running_gateway(config(ndjson(idle_timeout="60s"))) as gw:
        stream = await connect(gw, "nd")

        async def ping() -> None:
            while True:
                await stream.send_all(b'{"op":"ping"}\n')
                await trio.sleep(5)

        took = await closed_while(stream, ping, 300)
        assert 55 <= took <= 66
        assert refused(gw, "nd", "idle") == 1


async def test_useful_traffic_keeps_a_connection_past_the_idle_timeout(
    autojump_clock: Any,
) -> None:
    """Publishing every 5 s is progress: the connection stays for minutes."""
    gateway = config(ndjson(idle_timeout="20s"))
    gateway["destinations"] = [{"name": "logs", "kind": "topic"}]
    async with running_gateway(gateway) as gw:
        stream = await connect(gw, "nd")
        for i in range(30):
            await stream.send_all(b'{"op":"pub","id":%d,"dest":"logs","body":"x"}\n' % i)
            await trio.sleep(5)
        assert gw.connections("nd") == 1
        assert refused(gw, "nd", "idle") == 0


# -- 2. memory of partly received input ------------------------------------------------


async def send_all_of(stream: trio.SocketStream, frames: list[bytes]) -> bool:
    """Send ``frames``; False if the gateway closed the connection first."""
    try:
        for frame in frames:
            await stream.send_all(frame)
    except trio.BrokenResourceError:
        return False
    return True


def _bomb_window(frames: int) -> list[bytes]:
    """``W 10000`` and compressed frames that each inflate to about 1 MiB (ratio ~86)."""
    event = json.dumps({"pad": "a" * 1023}).encode()
    parts = [window_frame(2, 10_000)]
    seq = 0
    for _ in range(frames):
        inner = b"".join(json_frame(2, seq + n + 1, event) for n in range(1000))
        seq += 1000
        parts.append(compressed_frame(2, inner, 9))
    return parts


async def test_a_half_received_window_is_bounded_by_connection_memory() -> None:
    """W 10000 + 1 MiB-inflating frames grew the gateway by 400 MiB from one connection."""
    gateway = config(lumberjack(destination="logs", max_ratio=1000), connection_memory="8MiB")
    async with running_gateway(gateway) as gw:
        stream = await connect(gw, "lj")
        assert not await send_all_of(stream, _bomb_window(40))
        await closed_after(stream, 10)
        assert gw.budget.peak <= 8 * 2**20
        assert gw.budget.used == 0
        assert refused(gw, "lj", "memory") == 1


async def test_lumberjack_refuses_a_window_above_max_window_bytes() -> None:
    gateway = config(lumberjack(destination="logs", max_ratio=1000, max_window_bytes="3MiB"))
    async with running_gateway(gateway) as gw:
        stream = await connect(gw, "lj")
        assert not await send_all_of(stream, _bomb_window(10))
        await closed_after(stream, 10)
        # 3 MiB of events, the objects built for them, a read and the decompressor.
        assert gw.budget.peak <= 3 * 2**20 + 3100 * EVENT_OVERHEAD + 2**16 + INFLATER_STATE
        assert refused(gw, "lj", "protocol_error") == 1


async def test_connections_share_the_gateway_budget() -> None:
    """Several half-received windows together stay within memory_budget: the
    connections that would exceed it stop reading until their window times out."""
    listener = lumberjack(destination="logs", window_timeout="2s", max_ratio=1000)
    gateway = config(listener, memory_budget="6MiB", connection_memory="5MiB")
    async with running_gateway(gateway) as gw:
        streams = [await connect(gw, "lj") for _ in range(4)]

        async with trio.open_nursery() as nursery:
            for stream in streams:
                nursery.start_soon(send_all_of, stream, _bomb_window(4))
            for stream in streams:
                await closed_after(stream, 20)
        # Over the budget by at most one read (64 KiB inflating 100 times) per connection.
        assert gw.budget.peak <= 6 * 2**20 + 4 * 100 * 2**16
        assert gw.budget.used == 0


# -- 3. a peer that leaves with work pending --------------------------------------------


def _queue_nobody_consumes(**gateway: Any) -> dict[str, Any]:
    data = config(ndjson(max_connections=1), **gateway)
    data["destinations"] = [{"name": "jobs", "kind": "queue"}]
    return data


async def test_a_client_that_closes_with_publishes_pending_releases_its_slot(
    autojump_clock: Any,
) -> None:
    """It stayed in CLOSE-WAIT forever, holding its slot (max_connections = 1 here)."""
    async with running_gateway(_queue_nobody_consumes()) as gw:
        stream = await connect(gw, "nd")
        lines = b"".join(
            b'{"op":"pub","id":%d,"dest":"jobs","body":"job"}\n' % i for i in range(1, 6)
        )
        await stream.send_all(lines)
        await wait_for(lambda: gw.hub.inflight == 5)
        await stream.aclose()
        await wait_for(lambda: gw.connections("nd") == 0, limit=30)
        assert gw.hub.inflight == 0  # settled, as failed: nobody was told "ok"
        abandoned = gw.metrics.value("interchange_abandoned_publishes_total", {"listener": "nd"})
        assert abandoned == 5
        late = await connect(gw, "nd")  # the slot is free again
        await late.send_all(b'{"op":"ping"}\n')
        with trio.fail_after(5):
            assert b"pong" in await late.receive_some(1024)


async def test_a_hang_up_is_noticed_while_the_reader_waits_for_the_hub(
    autojump_clock: Any,
) -> None:
    """The reader is held up by a full destination, so it never reads the close:
    the hang-up probe notices it, and everything owed is settled as failed."""
    async with running_gateway(_queue_nobody_consumes(buffer_bytes="4KiB")) as gw:
        stream = await connect(gw, "nd")
        body = "x" * 1000
        lines = b"".join(
            b'{"op":"pub","id":%d,"dest":"jobs","body":"%s"}\n' % (i, body.encode())
            for i in range(1, 21)
        )
        await stream.send_all(lines)
        await wait_for(lambda: gw.hub.inflight >= 4)
        await trio.sleep(5)
        assert gw.connections("nd") == 1  # held up by backpressure: a live peer would wait
        await stream.aclose()
        await wait_for(lambda: gw.connections("nd") == 0, limit=30)
        assert gw.hub.inflight == 0


async def test_a_half_closed_client_still_gets_what_settles_within_the_linger(
    autojump_clock: trio.testing.MockClock,
) -> None:
    data = config(ndjson())
    async with running_gateway(data) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw, "nd")
        await stream.send_all(b'{"op":"pub","id":7,"dest":"logs","body":"x"}\n')
        await stream.send_eof()
        with trio.fail_after(5):
            [delivery] = await sub.receive()
        await trio.sleep(0.3)  # the ack comes late, but within the linger (mock clock)
        sub.ack(delivery.tag)
        reply = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(1024):
                reply += chunk
        assert reply == b'{"op":"ack","id":7,"status":"delivered"}\n'


# -- 4. fairness and log floods ---------------------------------------------------------


async def test_connections_per_address_are_limited_and_refusals_rate_limited(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with running_gateway(config(ndjson(max_connections_per_address=2))) as gw:
        kept = [await connect(gw, "nd") for _ in range(2)]
        await wait_for(lambda: gw.connections("nd") == 2)
        for _ in range(50):
            extra = await connect(gw, "nd")
            await closed_after(extra, 5)
        assert refused(gw, "nd", "max_connections_per_address") == 50
        lines = [r for r in caplog.records if "refusing" in r.getMessage()]
        assert 1 <= len(lines) <= 2
        assert gw.connections("nd") == 2
        for stream in kept:
            await stream.aclose()


async def test_protocol_errors_are_logged_once_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with running_gateway(config(ndjson())) as gw:
        for _ in range(40):
            stream = await connect(gw, "nd")
            await stream.send_all(b"not json\n")
            await closed_after(stream, 5)
        lines = [r for r in caplog.records if "protocol error" in r.getMessage()]
        assert len(lines) == 1
        assert refused(gw, "nd", "protocol_error") == 40
        suppressed = gw.metrics.value(
            "interchange_log_lines_suppressed_total", {"reason": "nd:protocol_error"}
        )
        assert suppressed == 39


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
async def test_the_accept_loop_survives_running_out_of_descriptors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """EMFILE made trio print a traceback per accept; now: a metric and one line."""
    import resource

    caplog.set_level(logging.WARNING)
    async with running_gateway(config(ndjson())) as gw:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        clients: list[trio.SocketStream] = []
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 4, hard))
            with trio.move_on_after(3):
                while not gw.metrics.value(
                    "interchange_accept_errors_total", {"listener": "nd", "error": "EMFILE"}
                ):
                    try:
                        clients.append(await connect(gw, "nd"))
                    except OSError:
                        await trio.sleep(0.01)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        assert gw.metrics.value(
            "interchange_accept_errors_total", {"listener": "nd", "error": "EMFILE"}
        )
        assert not [r for r in caplog.records if r.exc_info]
        for client in clients:
            await client.aclose()
        stream = await connect(gw, "nd")  # accepting again
        await stream.send_all(b'{"op":"ping"}\n')
        with trio.fail_after(5):
            assert b"pong" in await stream.receive_some(1024)
