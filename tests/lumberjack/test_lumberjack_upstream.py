"""The Lumberjack upstream (client role) against servers written in the test.

No independent Lumberjack server is packaged on PyPI, npm or Debian, so the
upstream is checked against a raw trio server that parses the bytes it gets
with ``struct`` and ``zlib`` (independently of the project's codec) and sends
hand-made ``A`` frames: partial acks, keepalives, acks beyond the window, acks
of the wrong version; and against the library server ``open_server`` for
TTL, failover and restarts. Messages enter the upstream through the hub of
an in-process gateway, each publish with its own receipt, so the test sees
exactly which events the upstream acked.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from harness import running_gateway

from gateway.config.loader import ConfigError, parse
from gateway.core.model import Message, Outcome
from gateway.core.receipts import Receipt
from gateway.runtime.gateway import Gateway
from protocols.lumberjack.server import ServerSettings
from protocols.lumberjack.standalone import Batch, open_server

JSON = "application/json"

# -- the raw server ---------------------------------------------------------------------


def a(seq: int, version: int = 2) -> bytes:
    return struct.pack(">BBI", 0x30 + version, ord("A"), seq)


def j(seq: int, payload: bytes) -> bytes:
    return struct.pack(">BBII", 0x32, ord("J"), seq, len(payload)) + payload


def parse_j_frames(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    p = 0
    while p < len(data):
        ver, typ, seq, n = struct.unpack_from(">BBII", data, p)
        assert (ver, typ) == (0x32, ord("J")), data[p : p + 2]
        out.append((seq, data[p + 10 : p + 10 + n]))
        p += 10 + n
    assert p == len(data)
    return out


async def read_exactly(stream: trio.abc.Stream, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = await stream.receive_some(n - len(buf))
        if not chunk:
            raise EOFError(f"closed after {bytes(buf)!r}")
        buf += chunk
    return bytes(buf)


class Window:
    """A window as the raw server read it."""

    def __init__(self, wire: bytes, events: list[tuple[int, bytes]], compressed: bool) -> None:
        self.wire = wire
        self.events = events
        self.compressed = compressed

    @property
    def payloads(self) -> list[bytes]:
        return [p for _, p in self.events]

    @property
    def seqs(self) -> list[int]:
        return [s for s, _ in self.events]


async def read_window(stream: trio.abc.Stream, timeout: float = 5.0) -> Window:
    """One window (``2W n`` then ``C`` or bare ``J`` frames), checked frame by frame."""
    with trio.fail_after(timeout):
        head = await read_exactly(stream, 6)
        ver, typ, n = struct.unpack(">BBI", head)
        assert (ver, typ) == (0x32, ord("W")), head
        wire = bytearray(head)
        events: list[tuple[int, bytes]] = []
        compressed = False
        while len(events) < n:
            h = await read_exactly(stream, 2)
            assert h[0] == 0x32, h
            if h[1] == ord("C"):
                compressed = True
                size_raw = await read_exactly(stream, 4)
                packed = await read_exactly(stream, struct.unpack(">I", size_raw)[0])
                wire += h + size_raw + packed
                events += parse_j_frames(zlib.decompress(packed))
            else:
                assert h[1] == ord("J"), h
                rest = await read_exactly(stream, 8)
                seq, size = struct.unpack(">II", rest)
                payload = await read_exactly(stream, size)
                wire += h + rest + payload
                events.append((seq, payload))
        assert len(events) == n
        return Window(bytes(wire), events, compressed)


async def wait_closed(stream: trio.abc.Stream, timeout: float = 5.0) -> bytes:
    """What the client still sends until it closes the connection."""
    data = bytearray()
    with trio.fail_after(timeout):
        try:
            while chunk := await stream.receive_some(65536):
                data += chunk
        except trio.BrokenResourceError:
            pass
    return bytes(data)


class RawServer:
    """A port bound at once, listening only when told to (until then: refused)."""

    def __init__(self) -> None:
        self.sock = trio.socket.socket()
        self.listener: trio.SocketListener | None = None

    async def bind(self, port: int = 0) -> RawServer:
        self.sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
        await self.sock.bind(("127.0.0.1", port))
        return self

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.sock.getsockname()[1]}"

    def listen(self) -> None:
        self.sock.listen(16)
        self.listener = trio.SocketListener(self.sock)

    async def accept(self, timeout: float = 5.0) -> trio.SocketStream:
        if self.listener is None:
            self.listen()
        assert self.listener is not None
        with trio.fail_after(timeout):
            return await self.listener.accept()

    async def no_connection_within(self, seconds: float) -> bool:
        if self.listener is None:
            self.listen()
        assert self.listener is not None
        with trio.move_on_after(seconds):
            await self.listener.accept()
            return False
        return True

    def close(self) -> None:
        self.sock.close()


# -- the gateway whose upstream is under test ----------------------------------------------


def upstream_config(connect: str | list[str], **options: Any) -> dict[str, Any]:
    upstream = {
        "name": "up",
        "protocol": "lumberjack",
        "connect": connect,
        "backoff_initial": "20ms",
        "backoff_max": "50ms",
        "connect_timeout": "1s",
        # Bodies go byte for byte, so that windows can be compared with encode_window.
        "metadata_beat": "",
    } | options
    return {
        "gateway": {"drain_timeout": "100ms"},
        "upstreams": [upstream],
        "routes": [{"from": "logs", "to": ["upstream:up"]}],
    }


def body(n: int) -> bytes:
    return b'{"n":%d}' % n


async def publish_each(gw: Gateway, bodies: list[bytes]) -> list[Receipt]:
    """One publish (and one receipt) per body, in order."""
    return [await gw.hub.publish([Message("logs", b, {}, JSON)]) for b in bodies]


def outcomes(receipts: list[Receipt]) -> list[Outcome | None]:
    return [r.outcome for r in receipts]


async def settled(receipts: list[Receipt], timeout: float = 5.0) -> list[Outcome]:
    with trio.fail_after(timeout):
        return [await r.wait() for r in receipts]


@asynccontextmanager
async def raw_upstream(**options: Any) -> AsyncIterator[tuple[RawServer, Gateway]]:
    """A raw server (not listening yet) and a gateway whose upstream targets it."""
    server = await RawServer().bind()
    try:
        async with running_gateway(upstream_config(server.address, **options)) as gw:
            yield server, gw
    finally:
        server.close()


# -- what goes on the wire ---------------------------------------------------------------------


@pytest.mark.parametrize("level", [0, 1, 3, 9])
async def test_a_window_is_w_n_then_one_zlib_c_of_j_frames_numbered_1_to_n(level: int) -> None:
    async with raw_upstream(compression_level=level) as (server, gw):
        bodies = [body(1), b'{"text":"h\xc3\xa9"}', body(3)]
        receipts = await publish_each(gw, bodies)
        # Published while nothing listens: the upstream sends all three in one window.
        conn = await server.accept()
        window = await read_window(conn)
        frames = b"".join(j(i, b) for i, b in enumerate(bodies, 1))
        if level:
            # W 3, then one C whose zlib stream (ISA-L's or zlib's) inflates to the J frames.
            assert window.wire[:8] == b"2W\x00\x00\x00\x03" + b"2C"
            assert struct.unpack(">I", window.wire[8:12])[0] == len(window.wire) - 12
            assert zlib.decompress(window.wire[12:]) == frames
        else:
            assert window.wire == b"2W\x00\x00\x00\x03" + frames
        assert window.seqs == [1, 2, 3]
        assert outcomes(receipts) == [None] * 3  # nothing is acked before the server acks
        await conn.send_all(a(3))
        assert await settled(receipts) == [Outcome.DELIVERED] * 3


async def test_sequence_numbers_restart_at_1_in_every_window() -> None:
    async with raw_upstream(bulk_max_size=2, pipelining=1) as (server, gw):
        receipts = await publish_each(gw, [body(i) for i in range(5)])
        conn = await server.accept()
        seen = []
        for size in (2, 2, 1):
            window = await read_window(conn)
            assert window.seqs == list(range(1, size + 1))
            seen += window.payloads
            await conn.send_all(a(size))
        assert seen == [body(i) for i in range(5)]
        assert await settled(receipts) == [Outcome.DELIVERED] * 5


async def test_messages_that_are_not_json_objects_are_wrapped() -> None:
    async with raw_upstream() as (server, gw):
        messages = [
            Message("logs", b"plain text", {"host": "web-1", "message": "not used"}),
            Message("logs", b'{"already": "json"}', {"dropped": "x"}, None),
            Message("logs", b"[1, 2]", {}, JSON),
            Message("logs", b"", {"only": "headers"}),
        ]
        receipt = await gw.hub.publish(messages)
        conn = await server.accept()
        window = await read_window(conn)
        assert [json.loads(p) for p in window.payloads] == [
            {"message": "plain text", "host": "web-1"},
            {"already": "json"},
            {"message": "[1, 2]"},
            {"only": "headers"},
        ]
        await conn.send_all(a(4))
        with trio.fail_after(5):
            assert await receipt.wait() is Outcome.DELIVERED


# -- acks -----------------------------------------------------------------------------------


async def test_a_partial_ack_acks_the_prefix_and_only_the_tail_is_resent() -> None:
    async with raw_upstream() as (server, gw):
        receipts = await publish_each(gw, [body(i) for i in range(1, 6)])
        conn = await server.accept()
        assert (await read_window(conn)).payloads == [body(i) for i in range(1, 6)]
        await conn.send_all(a(3))
        await settled(receipts[:3])
        await trio.testing.wait_all_tasks_blocked()  # the ack was taken in whole
        assert outcomes(receipts) == [Outcome.DELIVERED] * 3 + [None, None]
        await conn.aclose()  # the server dies with events 4 and 5 unacked
        again = await server.accept()
        window = await read_window(again)
        assert window.payloads == [body(4), body(5)]
        assert window.seqs == [1, 2]
        await again.send_all(a(2))
        assert await settled(receipts) == [Outcome.DELIVERED] * 5


async def test_partial_acks_then_the_full_ack_on_the_same_connection() -> None:
    async with raw_upstream() as (server, gw):
        receipts = await publish_each(gw, [body(i) for i in range(1, 6)])
        conn = await server.accept()
        await read_window(conn)
        for seq in (1, 1, 4):  # a repeated ack is harmless
            await conn.send_all(a(seq))
        await settled(receipts[:4])
        assert receipts[4].outcome is None
        await conn.send_all(a(5))
        assert await settled(receipts) == [Outcome.DELIVERED] * 5
        assert await server.no_connection_within(0.2)


async def test_keepalives_hold_the_connection_past_the_read_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with raw_upstream(timeout="300ms") as (server, gw):
        receipts = await publish_each(gw, [body(1), body(2)])
        conn = await server.accept()
        await read_window(conn)
        for _ in range(10):  # 1 s of "2A 0", well past the 300 ms timeout
            await conn.send_all(a(0))
            await trio.sleep(0.1)
        assert outcomes(receipts) == [None, None]
        await conn.send_all(a(2))
        assert await settled(receipts) == [Outcome.DELIVERED] * 2
        # Still the same connection: the next message comes on it.
        more = await publish_each(gw, [body(3)])
        assert (await read_window(conn)).payloads == [body(3)]
        await conn.send_all(a(1))
        await settled(more)
        assert await server.no_connection_within(0.1)


async def test_no_ack_within_the_timeout_reconnects_and_resends() -> None:
    async with raw_upstream(timeout="300ms") as (server, gw):
        receipts = await publish_each(gw, [body(1), body(2)])
        conn = await server.accept()
        await read_window(conn)
        start = trio.current_time()
        await wait_closed(conn)
        assert trio.current_time() - start >= 0.15  # the 300 ms timeout, not at once
        again = await server.accept()
        assert (await read_window(again)).payloads == [body(1), body(2)]
        await again.send_all(a(2))
        assert await settled(receipts) == [Outcome.DELIVERED] * 2


BAD_ACKS = {
    "ack-beyond-the-window": a(5),
    "v1-ack-on-a-v2-connection": a(2, version=1),
    "not-an-ack-frame": b"2W\x00\x00\x00\x02",
    "unknown-version": b"3A\x00\x00\x00\x02",
}


@pytest.mark.parametrize("name", list(BAD_ACKS))
async def test_a_bad_answer_makes_the_upstream_reconnect_and_resend(name: str) -> None:
    async with raw_upstream() as (server, gw):
        receipts = await publish_each(gw, [body(1), body(2)])
        conn = await server.accept()
        await read_window(conn)
        await conn.send_all(BAD_ACKS[name])
        await wait_closed(conn)
        assert outcomes(receipts) == [None, None]  # nothing counts as acked
        again = await server.accept()
        assert (await read_window(again)).payloads == [body(1), body(2)]
        await again.send_all(a(2))
        assert await settled(receipts) == [Outcome.DELIVERED] * 2


async def test_an_ack_with_no_window_in_flight_makes_the_upstream_reconnect() -> None:
    async with raw_upstream() as (server, gw):
        conn = await server.accept()
        await trio.testing.wait_all_tasks_blocked()  # connected and reading, nothing in flight
        await conn.send_all(a(1))
        await wait_closed(conn)
        receipts = await publish_each(gw, [body(1)])
        again = await server.accept()
        assert (await read_window(again)).payloads == [body(1)]
        await again.send_all(a(1))
        await settled(receipts)


async def test_only_keepalives_for_the_stall_timeout_make_the_upstream_move_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with raw_upstream(timeout="200ms", stall_timeout="600ms") as (server, gw):
        receipts = await publish_each(gw, [body(1), body(2)])
        conn = await server.accept()
        await read_window(conn)
        start = trio.current_time()
        closed = trio.Event()

        async def keepalives() -> None:
            try:
                while not closed.is_set():
                    await conn.send_all(a(0))
                    await trio.sleep(0.05)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(keepalives)
            await wait_closed(conn)
            closed.set()
        elapsed = trio.current_time() - start
        # Keepalives beat the 200 ms read timeout; the 600 ms stall timeout ended it.
        assert 0.5 <= elapsed < 3, elapsed
        assert outcomes(receipts) == [None, None]
        again = await server.accept()
        assert (await read_window(again)).payloads == [body(1), body(2)]
        await again.send_all(a(2))
        assert await settled(receipts) == [Outcome.DELIVERED] * 2


async def test_pipelining_keeps_two_windows_in_flight_and_no_more() -> None:
    async with raw_upstream(bulk_max_size=2, pipelining=2) as (server, gw):
        receipts = await publish_each(gw, [body(i) for i in range(6)])
        conn = await server.accept()
        first = await read_window(conn)
        second = await read_window(conn)  # sent before the first is acked
        with trio.move_on_after(0.3):
            await conn.receive_some(1)
            pytest.fail("a third window was sent with two unacked")
        await conn.send_all(a(2))
        third = await read_window(conn)
        await conn.send_all(a(2) + a(2))
        assert first.payloads + second.payloads + third.payloads == [body(i) for i in range(6)]
        assert await settled(receipts) == [Outcome.DELIVERED] * 6


async def test_acks_are_matched_to_windows_in_order() -> None:
    async with raw_upstream(bulk_max_size=3, pipelining=2) as (server, gw):
        receipts = await publish_each(gw, [body(i) for i in range(5)])
        conn = await server.accept()
        await read_window(conn)
        await read_window(conn)
        # "A 2": the first window (3 events) is acked up to 2, nothing of the second.
        await conn.send_all(a(2))
        await settled(receipts[:2])
        await trio.testing.wait_all_tasks_blocked()  # the ack was taken in whole
        assert outcomes(receipts)[2:] == [None, None, None]
        await conn.send_all(a(3) + a(2))
        assert await settled(receipts) == [Outcome.DELIVERED] * 5


# -- connection management --------------------------------------------------------------------


@asynccontextmanager
async def library_server(
    port: int = 0, *, acker: bool = True
) -> AsyncIterator[tuple[int, list[Batch]]]:
    """``open_server`` on loopback; every batch is recorded (and acked if ``acker``)."""
    batches: list[Batch] = []
    settings = ServerSettings(keepalive=0.1)
    async with (
        open_server("127.0.0.1", port, settings=settings) as server,
        trio.open_nursery() as nursery,
    ):

        async def collect() -> None:
            async for batch in server:
                batches.append(batch)
                if acker:
                    batch.ack()

        nursery.start_soon(collect)
        yield server.port, batches
        nursery.cancel_scope.cancel()


def payloads(batches: list[Batch]) -> list[bytes]:
    return [p for b in batches for _, p in b.events]  # type: ignore[misc]


async def test_failover_skips_a_dead_address() -> None:
    dead = await RawServer().bind()  # bound, never listening: connections are refused
    try:
        async with library_server() as (port, batches):
            config = upstream_config([dead.address, f"127.0.0.1:{port}"])
            async with running_gateway(config) as gw:
                receipts = await publish_each(gw, [body(1), body(2)])
                assert await settled(receipts) == [Outcome.DELIVERED] * 2
        assert payloads(batches) == [body(1), body(2)]
    finally:
        dead.close()


async def test_failover_moves_to_the_next_host_when_the_first_dies() -> None:
    async with library_server() as (port_b, batches_b):
        first = await RawServer().bind()
        try:
            config = upstream_config([first.address, f"127.0.0.1:{port_b}"], timeout="300ms")
            async with running_gateway(config) as gw:
                receipts = await publish_each(gw, [body(1)])
                conn = await first.accept()
                await read_window(conn)
                first.close()  # no more connections to the first host
                await conn.aclose()
                assert await settled(receipts) == [Outcome.DELIVERED]
        finally:
            first.close()
    assert payloads(batches_b) == [body(1)]


async def test_ttl_reconnects_under_load_without_loss_or_duplicates(
    autojump_clock: trio.testing.MockClock,
) -> None:
    n = 300
    async with library_server(acker=False) as (port, batches):
        config = upstream_config(f"127.0.0.1:{port}", ttl="150ms", bulk_max_size=10)
        async with running_gateway(config) as gw, trio.open_nursery() as nursery:

            async def slow_acker() -> None:
                acked = 0
                while True:
                    while acked < len(batches):
                        await trio.sleep(0.01)
                        batches[acked].ack()
                        acked += 1
                    await trio.sleep(0.005)

            nursery.start_soon(slow_acker)
            receipt = await gw.hub.publish([Message("logs", body(i), {}, JSON) for i in range(n)])
            with trio.fail_after(20):
                assert await receipt.wait() is Outcome.DELIVERED
            nursery.cancel_scope.cancel()
    assert sorted(payloads(batches)) == sorted(body(i) for i in range(n))  # each exactly once
    assert len({b.peer for b in batches}) >= 2, "the TTL never made the upstream reconnect"


async def test_ttl_also_reconnects_an_idle_upstream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with (
        library_server() as (port, batches),
        running_gateway(upstream_config(f"127.0.0.1:{port}", ttl="150ms")) as gw,
    ):
        for i in range(3):
            receipts = await publish_each(gw, [body(i)])
            assert await settled(receipts, timeout=3) == [Outcome.DELIVERED]
            await trio.sleep(0.4)  # idle past the TTL
    assert payloads(batches) == [body(0), body(1), body(2)]
    assert len({b.peer for b in batches}) == 3


async def test_a_server_restarted_on_the_same_port_gets_the_unacked_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The server dies holding a window; a new one on the same port receives it."""
    async with raw_upstream() as (server, gw):
        receipts = await publish_each(gw, [body(1), body(2)])
        conn = await server.accept()
        await read_window(conn)
        await conn.send_all(a(2))
        await settled(receipts)
        more = await publish_each(gw, [body(3), body(4)])
        assert (await read_window(conn)).payloads == [body(3), body(4)]
        port = int(server.address.rsplit(":", 1)[1])
        server.close()  # killed mid-window: the listening socket and the connection
        await conn.aclose()
        await trio.sleep(0.2)  # the upstream retries a refused port meanwhile
        assert outcomes(more) == [None, None]
        async with library_server(port) as (_, batches):
            assert await settled(more) == [Outcome.DELIVERED] * 2
        assert payloads(batches) == [body(3), body(4)]  # 1 and 2 were acked: not resent


def test_a_compression_level_above_9_is_refused_when_the_config_is_loaded() -> None:
    """Accepted by the config, level 10 makes ``run_upstream`` raise on every restart."""
    with pytest.raises(ConfigError, match="compression_level"):
        parse(upstream_config("127.0.0.1:5044", compression_level=10), source="<test>")
