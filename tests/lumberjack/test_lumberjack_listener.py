"""The Lumberjack listener over real sockets: windows in, acks out only once safe.

A raw trio client writes frames built here with ``struct`` and ``zlib`` (not
with the project's encoders) and reads the ``A`` frames byte for byte; an
in-process hub subscription plays the consumer and decides when a window is
safe. Every test runs a gateway on an OS-chosen loopback port.
"""

from __future__ import annotations

import hashlib
import json
import ssl
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway

from gateway.config.certs import init_dir
from gateway.core.destination import Delivery, Subscription
from gateway.protocol.plugin import ServerConnection
from gateway.runtime.registry import Registered, Registry, default_registry
from protocols.lumberjack.client import ClientSettings, LumberjackClient
from protocols.lumberjack.plugin import LumberjackPlugin

# -- frames, built independently of protocols.lumberjack.frames --------------------------


def w(size: int, version: int = 2) -> bytes:
    return struct.pack(">BBI", 0x30 + version, ord("W"), size)


def j(seq: int, payload: bytes, version: int = 2) -> bytes:
    return struct.pack(">BBII", 0x30 + version, ord("J"), seq, len(payload)) + payload


def d(seq: int, fields: dict[str, str], version: int = 1) -> bytes:
    out = struct.pack(">BBII", 0x30 + version, ord("D"), seq, len(fields))
    for key, value in fields.items():
        for text in (key, value):
            raw = text.encode()
            out += struct.pack(">I", len(raw)) + raw
    return out


def c(frames: bytes, version: int = 2, level: int = 3) -> bytes:
    packed = zlib.compress(frames, level)
    return struct.pack(">BBI", 0x30 + version, ord("C"), len(packed)) + packed


def a(seq: int, version: int = 2) -> bytes:
    return struct.pack(">BBI", 0x30 + version, ord("A"), seq)


def event(n: int, **extra: Any) -> bytes:
    return json.dumps({"n": n, **extra}, separators=(",", ":")).encode()


# -- helpers ----------------------------------------------------------------------------


def lj_listener(**options: Any) -> dict[str, Any]:
    return {
        "name": "lj",
        "protocol": "lumberjack",
        "bind": "127.0.0.1:0",
        "destination": "logs",
    } | options


def config(*listeners: dict[str, Any]) -> dict[str, Any]:
    return {"gateway": {"drain_timeout": "100ms"}, "listeners": list(listeners or [lj_listener()])}


async def connect(gw: Any, listener: str = "lj") -> trio.SocketStream:
    return await trio.open_tcp_stream(*host_port(gw.addresses[listener][0]))


async def read_exactly(stream: trio.abc.Stream, n: int, timeout: float = 5.0) -> bytes:
    buf = bytearray()
    with trio.fail_after(timeout):
        while len(buf) < n:
            chunk = await stream.receive_some(n - len(buf))
            if not chunk:
                raise EOFError(f"closed after {bytes(buf)!r}")
            buf += chunk
    return bytes(buf)


async def read_until_closed(stream: trio.abc.Stream, timeout: float = 5.0) -> bytes:
    """Everything the peer sends until it closes (a reset counts as closed)."""
    data = bytearray()
    with trio.fail_after(timeout):
        try:
            while chunk := await stream.receive_some(65536):
                data += chunk
        except trio.BrokenResourceError:
            pass
    return bytes(data)


async def nothing_within(stream: trio.abc.Stream, seconds: float) -> bool:
    """True when the peer sends nothing (and does not close) for ``seconds``."""
    with trio.move_on_after(seconds):
        await stream.receive_some(1)
        return False
    return True


async def take(sub: Subscription, n: int, *, ack: bool = False, timeout: float = 5.0) -> list[Any]:
    """The next ``n`` deliveries of ``sub`` (acked at once if ``ack``)."""
    got: list[Delivery] = []
    with trio.fail_after(timeout):
        while len(got) < n:
            batch = await sub.receive(n - len(got))
            got.extend(batch)
            if ack:
                sub.ack_many(x.tag for x in batch)
    return got


async def assert_no_delivery(sub: Subscription, seconds: float = 0.2) -> None:
    with trio.move_on_after(seconds):
        extra = await sub.receive()
        pytest.fail(f"unexpected delivery: {extra}")


def ack_all(sub: Subscription, deliveries: Sequence[Delivery]) -> None:
    sub.ack_many(x.tag for x in deliveries)


# -- window semantics --------------------------------------------------------------------


async def test_window_is_acked_with_its_highest_seq_only_after_the_consumer_acks() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        payloads = [event(i) for i in (101, 102, 103)]
        await stream.send_all(
            w(3) + c(b"".join(j(s, p) for s, p in zip((101, 102, 103), payloads, strict=True)))
        )
        got = await take(sub, 3)
        assert [x.message.body for x in got] == payloads
        assert {x.message.content_type for x in got} == {"application/json"}
        assert {x.message.destination for x in got} == {"logs"}
        assert all(not x.message.headers for x in got)  # enrich = "none"
        source = got[0].message.source
        assert source is not None
        assert (source.protocol, source.listener) == ("lumberjack", "lj")
        # Two of three acked: still no ack on the wire.
        sub.ack_many(x.tag for x in got[:2])
        assert await nothing_within(stream, 0.3)
        sub.ack(got[2].tag)
        assert await read_exactly(stream, 6) == a(103)


async def test_seq_numbers_need_not_start_at_one_or_be_contiguous() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(3) + j(1, event(1)) + j(2, event(2)) + j(7, event(7)))
        ack_all(sub, await take(sub, 3))
        assert await read_exactly(stream, 6) == a(7)


async def test_w0_is_answered_with_a0() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(0))
        assert await read_exactly(stream, 6) == a(0)
        # The connection goes on as usual afterwards.
        await stream.send_all(w(1) + j(1, event(1)))
        ack_all(sub, await take(sub, 1))
        assert await read_exactly(stream, 6) == a(1)
        await assert_no_delivery(sub)


async def test_a_new_w_completes_a_partial_window_with_its_highest_seq() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        # W 3 announces three events; only two arrive before the next W.
        await stream.send_all(w(3) + j(4, event(4)) + j(5, event(5)) + w(1) + j(9, event(9)))
        got = await take(sub, 3, ack=True)
        assert [json.loads(x.message.body)["n"] for x in got] == [4, 5, 9]
        assert await read_exactly(stream, 12) == a(5) + a(9)


async def test_many_pipelined_windows_are_acked_in_order() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        n = 200
        await stream.send_all(b"".join(w(1) + c(j(i, event(i))) for i in range(1, n + 1)))
        got = await take(sub, n, ack=True)
        assert [json.loads(x.message.body)["n"] for x in got] == list(range(1, n + 1))
        acks = await read_exactly(stream, 6 * n)
        assert acks == b"".join(a(i) for i in range(1, n + 1))


async def test_a_window_sent_one_byte_at_a_time_is_acked() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        wire = w(2) + c(j(1, event(1)) + j(2, event(2)))
        for i in range(len(wire)):
            await stream.send_all(wire[i : i + 1])
            await trio.testing.wait_all_tasks_blocked()  # read alone, before the next
        ack_all(sub, await take(sub, 2))
        assert await read_exactly(stream, 6) == a(2)


async def test_v1_data_frames_become_headers_and_acks_carry_version_1() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        fields = [{"line": f"line {i}", "host": "h\u00e9", "offset": str(i)} for i in range(4)]
        # W 2 once, then four D frames: the window size is sticky (v1 streaming).
        await stream.send_all(w(2, version=1) + b"".join(d(i + 1, f) for i, f in enumerate(fields)))
        got = await take(sub, 4, ack=True)
        assert [dict(x.message.headers) for x in got] == fields
        assert {x.message.body for x in got} == {b""}
        assert await read_exactly(stream, 12) == a(2, version=1) + a(4, version=1)


async def test_each_ack_has_the_version_of_its_window() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(
            w(1, version=1)
            + d(1, {"line": "v1"})
            + w(1)
            + j(2, event(2))
            + w(1, version=1)
            + c(d(3, {"line": "v1 compressed"}), version=1)
        )
        await take(sub, 3, ack=True)
        assert await read_exactly(stream, 18) == a(1, version=1) + a(2) + a(3, version=1)


async def test_half_closed_client_still_gets_its_ack() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(1) + j(1, event(1)))
        await stream.send_eof()
        ack_all(sub, await take(sub, 1))
        assert await read_until_closed(stream) == a(1)


# -- refusing bad input --------------------------------------------------------------------


async def test_invalid_json_event_closes_the_connection_without_any_ack() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(2) + c(j(1, event(1)) + j(2, b'{"n": 2, oops')))
        assert await read_until_closed(stream) == b""
        await assert_no_delivery(sub)


async def test_a_json_event_that_is_not_an_object_is_refused() -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(1) + j(1, b"[1, 2, 3]"))
        assert await read_until_closed(stream) == b""
        await assert_no_delivery(sub)


async def test_validate_json_false_passes_payloads_through() -> None:
    async with running_gateway(config(lj_listener(validate_json=False))) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(1) + j(1, b"not json at all"))
        [got] = await take(sub, 1, ack=True)
        assert got.message.body == b"not json at all"
        assert await read_exactly(stream, 6) == a(1)


async def test_a_window_larger_than_max_window_is_refused() -> None:
    async with running_gateway(config(lj_listener(max_window=10))) as gw:
        sub = gw.hub.subscribe("logs")
        ok = await connect(gw)
        await ok.send_all(w(10) + c(b"".join(j(i, event(i)) for i in range(1, 11))))
        ack_all(sub, await take(sub, 10))
        assert await read_exactly(ok, 6) == a(10)
        big = await connect(gw)
        await big.send_all(w(11))
        assert await read_until_closed(big) == b""
        await assert_no_delivery(sub)


async def test_a_frame_longer_than_max_frame_is_refused_before_it_arrives() -> None:
    async with running_gateway(config(lj_listener(max_frame="1KiB"))) as gw:
        stream = await connect(gw)
        # Only the header of a 2 KiB J frame is sent: the length alone is refused.
        await stream.send_all(w(1) + struct.pack(">BBII", 0x32, ord("J"), 1, 2048))
        assert await read_until_closed(stream) == b""


async def test_a_zip_bomb_is_refused() -> None:
    async with running_gateway(config(lj_listener(max_ratio=10))) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        bomb = j(1, json.dumps({"pad": " " * 200_000}).encode())
        await stream.send_all(w(1) + c(bomb, level=9))
        assert await read_until_closed(stream) == b""
        await assert_no_delivery(sub)


def _truncated_zlib() -> bytes:
    packed = zlib.compress(j(1, event(1)) + j(2, event(2)))[:-6]
    return w(2) + struct.pack(">BBI", 0x32, ord("C"), len(packed)) + packed


BAD_INPUT = {
    "garbage": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad-version": b"3W\x00\x00\x00\x01",
    "unknown-frame-type": w(1) + b"2Z\x00\x00\x00\x01",
    "client-sends-ack": a(1),
    "data-before-window": j(1, event(1)),
    "truncated-zlib": _truncated_zlib(),
    "bad-zlib": w(1) + struct.pack(">BBI", 0x32, ord("C"), 16) + b"\x78\x9c" + b"\xff" * 14,
    "frame-cut-inside-c": w(2) + c(j(1, event(1)) + j(2, event(2))[:-3]),
}


@pytest.mark.parametrize("name", list(BAD_INPUT))
async def test_bad_input_closes_only_that_connection(name: str) -> None:
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        good = await connect(gw)  # opened before, used after
        bad = await connect(gw)
        await bad.send_all(BAD_INPUT[name])
        assert await read_until_closed(bad) == b""
        await good.send_all(w(1) + j(1, event(1)))
        ack_all(sub, await take(sub, 1))
        assert await read_exactly(good, 6) == a(1)
        late = await connect(gw)  # and new connections are still served
        await late.send_all(w(1) + j(5, event(5)))
        ack_all(sub, await take(sub, 1))
        assert await read_exactly(late, 6) == a(5)


async def test_a_window_that_stops_arriving_times_out_unacked() -> None:
    async with running_gateway(config(lj_listener(window_timeout="200ms"))) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(3) + j(1, event(1)))
        start = trio.current_time()
        assert await read_until_closed(stream, timeout=3) == b""
        assert trio.current_time() - start >= 0.15
        await assert_no_delivery(sub)


# -- routing and enrichment ----------------------------------------------------------------


async def test_destination_field_routes_each_event() -> None:
    async with running_gateway(config(lj_listener(destination_field="fields.topic"))) as gw:
        subs = {name: gw.hub.subscribe(name) for name in ("alpha", "beta", "logs")}
        stream = await connect(gw)
        events = [
            event(1, fields={"topic": "alpha"}),
            event(2, fields={"topic": "beta"}),
            event(3),  # no field: the listener's destination
            event(4, fields={"topic": ""}),  # empty: the listener's destination
            event(5, fields={"topic": "alpha"}),
        ]
        await stream.send_all(w(5) + c(b"".join(j(i, p) for i, p in enumerate(events, 1))))
        got = {
            name: await take(sub, n) for (name, sub), n in zip(subs.items(), (2, 1, 2), strict=True)
        }
        for name, sub in subs.items():
            assert {x.message.destination for x in got[name]} == {name}
            await assert_no_delivery(sub, 0.05)
        assert [json.loads(x.message.body)["n"] for x in got["alpha"]] == [1, 5]
        assert [json.loads(x.message.body)["n"] for x in got["beta"]] == [2]
        assert [json.loads(x.message.body)["n"] for x in got["logs"]] == [3, 4]
        # The window is acked once every destination's consumer acked its part.
        ack_all(subs["alpha"], got["alpha"])
        ack_all(subs["logs"], got["logs"])
        assert await nothing_within(stream, 0.2)
        ack_all(subs["beta"], got["beta"])
        assert await read_exactly(stream, 6) == a(5)


async def test_destination_field_also_reads_v1_data_frames() -> None:
    async with running_gateway(config(lj_listener(destination_field="type"))) as gw:
        sub = gw.hub.subscribe("syslog")
        stream = await connect(gw)
        await stream.send_all(w(1, version=1) + d(1, {"type": "syslog", "line": "x"}))
        [got] = await take(sub, 1, ack=True)
        assert dict(got.message.headers) == {"type": "syslog", "line": "x"}
        assert await read_exactly(stream, 6) == a(1, version=1)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return init_dir(tmp_path_factory.mktemp("lj-listener-certs"))


async def test_enrich_headers_name_the_peer_and_its_tls_certificate(certs: dict[str, Path]) -> None:
    listener = lj_listener(
        enrich="headers",
        tls={
            "cert": str(certs["server_cert"]),
            "key": str(certs["server_key"]),
            "client_ca": str(certs["ca_cert"]),
            "client_auth": "required",
        },
    )
    async with running_gateway(config(listener)) as gw:
        sub = gw.hub.subscribe("logs")
        ctx = ssl.create_default_context(cafile=str(certs["ca_cert"]))
        ctx.load_cert_chain(str(certs["client_cert"]), str(certs["client_key"]))
        client = await LumberjackClient.connect(
            *host_port(gw.addresses["lj"][0]), ssl_context=ctx, server_hostname="localhost"
        )
        tls = client.stream
        assert isinstance(tls, trio.SSLStream)
        local = tls.transport_stream.socket.getsockname()  # type: ignore[attr-defined]
        async with client, trio.open_nursery() as nursery:
            nursery.start_soon(client.send, [{"n": 1}, {"n": 2}])
            got = await take(sub, 2, ack=True)
        der = ssl.PEM_cert_to_DER_cert(certs["client_cert"].read_text())
        for x in got:
            headers = dict(x.message.headers)
            assert headers["lumberjack.peer"] == f"127.0.0.1:{local[1]}"
            assert "CN=interchange-client" in headers["lumberjack.tls_subject"]
            assert headers["lumberjack.tls_fingerprint"] == hashlib.sha256(der).hexdigest()
            assert x.message.content_type == "application/json"
        assert [json.loads(x.message.body) for x in got] == [{"n": 1}, {"n": 2}]


async def test_enrich_headers_without_tls_has_only_the_peer() -> None:
    async with running_gateway(config(lj_listener(enrich="headers"))) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(1, version=1) + d(1, {"line": "x"}))
        [got] = await take(sub, 1, ack=True)
        port = stream.socket.getsockname()[1]
        assert dict(got.message.headers) == {"line": "x", "lumberjack.peer": f"127.0.0.1:{port}"}


# -- keepalives and backpressure -------------------------------------------------------------


async def test_keepalives_flow_while_the_consumer_holds_the_window() -> None:
    async with running_gateway(config(lj_listener(keepalive="100ms"))) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(2) + c(j(1, event(1)) + j(2, event(2))))
        got = await take(sub, 2)
        # About 5 keepalives in 0.55 s; each is "2A 0" (nothing acked yet).
        with trio.move_on_after(0.55):
            frames = b""
            while True:
                frames += await read_exactly(stream, 6)
        assert len(frames) >= 6 * 3
        assert frames == a(0) * (len(frames) // 6)
        ack_all(sub, got)
        with trio.fail_after(3):
            while (frame := await read_exactly(stream, 6)) == a(0):
                pass
        assert frame == a(2)


async def test_keepalives_keep_a_short_timeout_client_alive_through_a_slow_consumer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Client timeout 0.5 s, consumer acks after 2 s: keepalives bridge the gap."""
    async with running_gateway(config(lj_listener(keepalive="100ms"))) as gw:
        sub = gw.hub.subscribe("logs")
        settings = ClientSettings(timeout=0.5)
        client = await LumberjackClient.connect(
            *host_port(gw.addresses["lj"][0]), settings=settings
        )
        events = [{"n": i} for i in range(20)]
        async with client, trio.open_nursery() as nursery:

            async def slow_consumer() -> None:
                got = await take(sub, 20)
                await trio.sleep(2.0)
                ack_all(sub, got)

            nursery.start_soon(slow_consumer)
            start = trio.current_time()
            assert await client.send(events) == 20
            assert trio.current_time() - start >= 1.9
        await assert_no_delivery(sub)  # nothing was resent


async def test_without_keepalives_the_short_timeout_client_gives_up() -> None:
    """The control for the test above: the default 5 s keepalive is too slow for it."""
    async with running_gateway(config()) as gw:
        sub = gw.hub.subscribe("logs")
        client = await LumberjackClient.connect(
            *host_port(gw.addresses["lj"][0]), settings=ClientSettings(timeout=0.5)
        )
        async with client:
            with pytest.raises(trio.TooSlowError):
                await client.send([{"n": 1}])
        assert len(await take(sub, 1)) == 1  # delivered, never acked


async def test_a_keepalive_never_acks_a_window_the_consumer_holds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """After a first window is acked, keepalives for the next one must not ack it.

    A keepalive that repeats the last acked sequence reads, to a Beats-style
    writer numbering every window 1..n, as the ack of the pending window when
    both windows have the same size: the writer drops events nobody has yet.
    """
    async with running_gateway(config(lj_listener(keepalive="50ms"))) as gw:
        sub = gw.hub.subscribe("logs")
        client = await LumberjackClient.connect(
            *host_port(gw.addresses["lj"][0]), settings=ClientSettings(timeout=5)
        )
        async with client, trio.open_nursery() as nursery:

            async def consume_first_window_only() -> None:
                ack_all(sub, await take(sub, 3))

            nursery.start_soon(consume_first_window_only)
            await client.send([{"n": 1}, {"n": 2}, {"n": 3}])
            held = trio.Event()
            send_returned = trio.Event()

            async def second_window() -> None:
                await client.send([{"n": 4}, {"n": 5}, {"n": 6}])
                send_returned.set()

            async def hold() -> None:
                second = await take(sub, 3)
                held.set()
                await trio.sleep(0.6)
                assert not send_returned.is_set(), (
                    "the second window was acked while its consumer still held it"
                )
                ack_all(sub, second)

            nursery.start_soon(second_window)
            nursery.start_soon(hold)
            with trio.fail_after(5):
                await send_returned.wait()
            assert held.is_set()


async def test_max_pending_windows_stops_reading_while_keepalives_go_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pending = 2
    listener = lj_listener(keepalive="100ms", max_pending_windows=pending)
    async with running_gateway(config(listener)) as gw:
        sub = gw.hub.subscribe("logs", max_unacked=10_000)
        stream = await connect(gw)
        stream.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, 65536)
        n, size = 16, 256 << 10
        windows = [w(1) + j(i, event(i, pad="x" * size)) for i in range(1, n + 1)]
        written = 0
        frames: list[bytes] = []

        async def writer() -> None:
            nonlocal written
            for window in windows:
                await stream.send_all(window)
                written += 1

        async def reader() -> None:
            while True:
                frames.append(await read_exactly(stream, 6, timeout=30))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer)
            nursery.start_soon(reader)
            # Wait until the writer is stuck: no window written for 0.5 s.
            with trio.fail_after(10):
                while True:
                    before = written
                    await trio.sleep(0.5)
                    if written == before:
                        break
            assert written < n, "the listener read everything: no backpressure"
            got = await take(sub, pending)
            await assert_no_delivery(sub, 0.3)  # reading stopped at max_pending_windows
            keepalives = len(frames)
            await trio.sleep(0.35)
            assert len(frames) - keepalives >= 2, "no keepalives while reading is paused"
            assert set(frames) == {a(0)}
            # The consumer catches up: everything is read, delivered and acked.
            ack_all(sub, got)
            rest = await take(sub, n - pending, ack=True, timeout=20)
            assert [json.loads(x.message.body)["n"] for x in got + rest] == list(range(1, n + 1))
            with trio.fail_after(10):
                while a(n) not in frames:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        positive = [f for f in frames if f != a(0)]
        assert list(dict.fromkeys(positive)) == [a(i) for i in range(1, n + 1)]


async def test_time_spent_not_reading_under_backpressure_is_not_a_slow_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The window timeout measures the client, not the listener's own pause.

    Window 2 is sent whole, promptly, right behind window 1; the listener pauses
    reading at ``max_pending_windows`` = 1 with part of window 2 buffered, and
    resumes once window 1 is acked, 1 s later. That pause is the listener's
    backpressure, so window 2 must still be read and acked, not timed out.
    """
    listener = lj_listener(window_timeout="300ms", max_pending_windows=1, keepalive="100ms")
    async with running_gateway(config(listener)) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        second = w(2) + c(j(2, event(2)) + j(3, event(3)))
        await stream.send_all(w(1) + j(1, event(1)) + second[:8])
        first = await take(sub, 1)  # window 1 handed off; reading paused mid-window 2
        await stream.send_all(second[8:])  # the rest of window 2, at once
        await trio.sleep(1.0)  # the consumer is slow
        ack_all(sub, first)
        rest = await take(sub, 2, ack=True, timeout=1.5)
        assert [json.loads(x.message.body)["n"] for x in rest] == [2, 3]
        frames = []
        with trio.fail_after(3):
            while a(3) not in frames:
                frames.append(await read_exactly(stream, 6))
        assert [f for f in frames if f != a(0)] == [a(1), a(3)]


async def test_shutdown_acks_the_windows_handed_off_then_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cfg = config(lj_listener()) | {"gateway": {"drain_timeout": "5s"}}
    async with running_gateway(cfg) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(2) + c(j(1, event(1)) + j(2, event(2))))
        got = await take(sub, 2)
        gw.shutdown()
        await trio.sleep(0.2)
        # Draining: a new window is no longer read; the handed-off one still gets its ack.
        await stream.send_all(w(1) + j(3, event(3)))
        await assert_no_delivery(sub, 0.2)
        ack_all(sub, got)
        assert await read_until_closed(stream) == a(2)
    assert gw.drained_cleanly is True


async def test_idle_timeout_never_closes_a_connection_with_a_pending_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running_gateway(config(lj_listener(idle_timeout="300ms"))) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(1) + j(1, event(1)))
        got = await take(sub, 1)
        # Two and a half idle timeouts without any traffic (the keepalive is 5 s). The
        # ack is kept away from the watchdog's wake-ups (multiples of 300 ms): see
        # the test below for what happens when the two coincide.
        await trio.sleep(0.75)
        ack_all(sub, got)
        assert await read_exactly(stream, 6) == a(1)
        # Nothing pending any more: now the idle timeout applies.
        start = trio.current_time()
        assert await read_until_closed(stream, timeout=3) == b""
        assert trio.current_time() - start >= 0.1


async def test_a_window_the_hub_refuses_is_never_acked() -> None:
    cfg = config(lj_listener()) | {"gateway": {"drain_timeout": "100ms", "buffer_bytes": "4KiB"}}
    async with running_gateway(cfg) as gw:
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        # One small event and one larger than any buffer: the window is rejected whole.
        await stream.send_all(w(2) + c(j(1, event(1)) + j(2, event(2, pad="x" * 8192))))
        got = await take(sub, 1, ack=True)  # the small one is delivered and acked ...
        assert json.loads(got[0].message.body)["n"] == 1
        assert await read_until_closed(stream) == b""  # ... but the window is not
        await assert_no_delivery(sub)


async def test_lumberjack_over_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "lj.sock"
    async with running_gateway(config(lj_listener(bind=f"unix:{path}", enrich="headers"))) as gw:
        sub = gw.hub.subscribe("logs")
        client = LumberjackClient(await trio.open_unix_socket(str(path)))
        async with client, trio.open_nursery() as nursery:
            nursery.start_soon(client.send, [{"via": "unix"}])
            [got] = await take(sub, 1, ack=True)
        assert json.loads(got.message.body) == {"via": "unix"}
        assert got.message.headers["lumberjack.peer"].startswith("unix:")


class _CapturingPlugin(LumberjackPlugin):
    """The Lumberjack plugin, keeping each ServerConnection it serves."""

    def __init__(self) -> None:
        self.connections: list[ServerConnection] = []

    async def serve(self, conn: ServerConnection) -> None:
        self.connections.append(conn)
        await super().serve(conn)


async def test_a_connection_that_still_owes_its_sender_an_ack_is_not_idle() -> None:
    """Between "the consumer acked" and "the A frame is written" the connection is busy.

    The idle watchdog closes a connection that is not busy and saw no traffic for
    ``idle_timeout``. If it runs in that gap (it does when a window was held
    longer than ``idle_timeout`` without keepalives, and its wake-up coincides
    with the consumer's ack), the sender never gets the ack of a delivered
    window and sends it again.
    """
    registry = Registry(
        {"lumberjack": Registered("lumberjack", "tests", "tests", "0", plugin=_CapturingPlugin)},
        default_registry().transports,
    )
    async with running_gateway(config(), registry=registry) as gw:
        plugin = gw.plugins["lumberjack"]  # this gateway's own instance
        assert isinstance(plugin, _CapturingPlugin)
        sub = gw.hub.subscribe("logs")
        stream = await connect(gw)
        await stream.send_all(w(1) + j(1, event(1)))
        got = await take(sub, 1)
        [conn] = plugin.connections
        assert conn.busy  # a window is pending
        ack_all(sub, got)
        # No checkpoint since the ack: the "A 1" cannot have been written yet.
        assert conn.busy, "the connection looks idle while it still owes its sender an ack"
        assert await read_exactly(stream, 6) == a(1)
