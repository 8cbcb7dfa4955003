"""The admin endpoint from the outside: health, readiness, status, the page, taps.

Each test runs a gateway in-process with ``[admin] bind`` on a free loopback
port, makes known traffic over ndjson and reads the endpoint with the
standard library's HTTP client (in a worker thread), which shares no code
with the server. Misbehaving clients are played with raw trio streams. Every
step runs under ``trio.fail_after`` so that a stuck endpoint fails a test.
"""

from __future__ import annotations

import functools
import http.client
import io
import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient

from gateway.config.loader import ConfigError, default_config, parse
from gateway.ops.tap_client import follow
from gateway.runtime.gateway import Gateway

TIMEOUT = 10.0
CLIENT_TIMEOUT = 5.0


def config(**extra: Any) -> dict[str, Any]:
    """One ndjson listener publishing into the queue ``jobs``; the admin endpoint."""
    return {
        "gateway": {"drain_timeout": "2s"},
        "admin": {"bind": "127.0.0.1:0"},
        "listeners": [
            {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "jobs"}
        ],
        "destinations": [{"name": "jobs", "kind": "queue"}],
    } | extra


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _get(address: str, path: str, method: str = "GET") -> Reply:
    host, port = host_port(address)
    conn = http.client.HTTPConnection(host, port, timeout=CLIENT_TIMEOUT)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        body = response.read()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
    finally:
        conn.close()


async def get(gw: Gateway, path: str, method: str = "GET") -> Reply:
    return await trio.to_thread.run_sync(_get, gw.admin_addresses[0], path, method)


async def status(gw: Gateway) -> dict[str, Any]:
    reply = await get(gw, "/api/status")
    assert reply.status == 200
    assert reply.headers["content-type"] == "application/json"
    result: dict[str, Any] = reply.json()
    return result


def by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(item for item in items if item["name"] == name)


@asynccontextmanager
async def client(gw: Gateway, listener: str = "nd") -> AsyncIterator[NdjsonClient]:
    host, port = host_port(gw.addresses[listener][0])
    async with await NdjsonClient.connect(host, port) as c:
        yield c


async def until(check: Any, what: str, timeout: float = 5.0) -> None:
    """Poll the async ``check()`` until it is true."""
    with trio.move_on_after(timeout):
        while not await check():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out waiting for {what}")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- health and status ------------------------------------------------------------------


async def test_healthz_answers_ok() -> None:
    async with running_gateway(config()) as gw:
        with trio.fail_after(TIMEOUT):
            reply = await get(gw, "/healthz")
            assert (reply.status, reply.body) == (200, b"ok\n")
            head = await get(gw, "/healthz", "HEAD")
            assert (head.status, head.body) == (200, b"")


async def test_status_shows_the_backlog_of_a_queue_nobody_consumes() -> None:
    """Three publishes into a queue with no consumer: held, unacked senders, and a hint."""
    async with running_gateway(config()) as gw, client(gw) as pub:
        with trio.fail_after(TIMEOUT):
            await pub.publish_nowait([b"a", b"bb", b"ccc"])
            await until(lambda: _inflight(gw, 3), "the publishes to reach the hub")
            s = await status(gw)

            assert s["version"]
            assert s["uptime_s"] >= 0
            assert s["draining"] is False
            assert s["inflight"] == 3
            nd = by_name(s["listeners"], "nd")
            assert nd["protocol"] == "ndjson"
            assert nd["addresses"] == gw.addresses["nd"]
            assert nd["connections"] == 1
            assert nd["max_connections"] == 1024

            jobs = by_name(s["destinations"], "jobs")
            assert jobs["kind"] == "queue"
            # Each message is charged its body plus a fixed overhead of 200 bytes.
            assert jobs["backlog"] == {"messages": 3, "bytes": 3 * 200 + 1 + 2 + 3}
            (group,) = jobs["groups"]
            assert group["members"] == 0
            assert (group["queued"], group["unacked"], group["held"]) == (3, 0, 3)
            assert s["memory"]["used"] == 606
            assert s["memory"]["limit"] == gw.budget.limit
            assert any(
                h["subject"] == "destination jobs" and "no subscriber" in h["text"]
                for h in s["hints"]
            ), s["hints"]


async def _inflight(gw: Gateway, n: int) -> bool:
    return gw.hub.inflight == n


async def test_status_follows_a_consumer_through_delivery_and_ack() -> None:
    async with running_gateway(config()) as gw, client(gw) as pub, client(gw) as sub:
        with trio.fail_after(TIMEOUT):
            ids = await pub.publish_nowait([b"one", b"two"])
            await until(lambda: _inflight(gw, 2), "the publishes to reach the hub")
            await sub.subscribe("jobs")
            tags = [(await sub.receive()).tag for _ in range(2)]  # type: ignore[union-attr]

            group = by_name((await status(gw))["destinations"], "jobs")["groups"][0]
            assert (group["members"], group["queued"], group["unacked"]) == (1, 0, 2)
            hints = (await status(gw))["hints"]
            assert any("not acked" in h["text"] for h in hints), hints

            await sub.ack(*tags)
            answers = await pub.wait_answers(ids)
            assert [a.status for a in answers] == ["delivered", "delivered"]
            s = await status(gw)
            assert by_name(s["destinations"], "jobs")["backlog"]["messages"] == 0
            assert s["inflight"] == 0
            assert s["hints"] == []


async def test_rates_count_the_bytes_a_listener_received() -> None:
    async with running_gateway(config()) as gw, client(gw) as pub:
        with trio.fail_after(TIMEOUT):
            await status(gw)  # a first sample
            await pub.publish_nowait([b"x" * 1000])
            # Rates compare samples at least 0.25 s apart (wall clock): ask until one shows it.
            s: dict[str, Any] = {}

            async def counted() -> bool:
                s.update(await status(gw))
                return bool(s["rates"]["listeners"].get("nd", {}).get("bytes_in"))

            await until(counted, "the rates to count the publish")
            assert s["rates"]["window_s"] > 0
            assert s["rates"]["listeners"]["nd"]["bytes_in"] > 0
            # The queue's backlog grew: its rate of change is positive.
            assert s["rates"]["destinations"]["jobs"]["backlog"] > 0


# -- readiness --------------------------------------------------------------------------


async def test_readyz_is_200_when_every_listener_is_bound() -> None:
    async with running_gateway(config()) as gw:
        with trio.fail_after(TIMEOUT):
            reply = await get(gw, "/readyz")
            assert reply.status == 200
            assert reply.json() == {"ready": True, "reasons": []}


async def test_readyz_is_503_while_an_upstream_cannot_connect() -> None:
    port = closed_port()
    cfg = config(upstreams=[{"name": "up", "protocol": "ndjson", "connect": f"127.0.0.1:{port}"}])
    async with running_gateway(cfg) as gw:
        with trio.fail_after(TIMEOUT):

            async def failed() -> bool:
                return (await get(gw, "/readyz")).status == 503 and "ECONNREFUSED" in str(
                    (await get(gw, "/readyz")).json()
                )

            await until(failed, "a refused connection")
            reply = await get(gw, "/readyz")
            assert reply.headers["content-type"] == "application/json"
            body = reply.json()
            assert body["ready"] is False
            (reason,) = body["reasons"]
            assert reason.startswith("upstream up is backoff: ")
            assert f"127.0.0.1:{port}" in reason

            up = by_name((await status(gw))["upstreams"], "up")
            assert up["state"] == "backoff"
            assert "ECONNREFUSED" in up["last_error"]
            assert up["connected_since"] is None
            assert any(h["subject"] == "upstream up" for h in (await status(gw))["hints"])


async def test_readyz_is_200_once_the_upstream_is_connected() -> None:
    peer = {"listeners": [{"name": "in", "protocol": "ndjson", "bind": "127.0.0.1:0"}]}
    async with running_gateway(peer) as b:
        cfg = config(
            upstreams=[{"name": "up", "protocol": "ndjson", "connect": b.addresses["in"][0]}]
        )
        async with running_gateway(cfg) as gw:
            with trio.fail_after(TIMEOUT):

                async def ready() -> bool:
                    return (await get(gw, "/readyz")).status == 200

                await until(ready, "the upstream to connect")
                up = by_name((await status(gw))["upstreams"], "up")
                assert up["state"] == "connected"
                assert up["connected_since"] is not None
                assert up["last_error"] is None


async def test_readyz_is_503_while_draining() -> None:
    async with running_gateway(config()) as gw, client(gw) as pub:
        with trio.fail_after(TIMEOUT):
            # Unsettled: the drain waits for it (up to drain_timeout, 2 s).
            await pub.publish_nowait([b"held"])
            await until(lambda: _inflight(gw, 1), "the publish to reach the hub")
            gw.shutdown()
            await until(lambda: _draining(gw), "the drain to start")
            reply = await get(gw, "/readyz")
            assert reply.status == 503
            assert "the gateway is draining (shutting down)" in reply.json()["reasons"]
            assert (await status(gw))["draining"] is True


async def _draining(gw: Gateway) -> bool:
    return gw.draining.is_set()


# -- the page and the HTTP surface ------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "content_type", "words"),
    [
        ("/", "text/html", b"/static/status.js"),
        ("/static/status.js", "text/javascript", b"/api/status"),
        ("/static/status.css", "text/css", b"table"),
    ],
)
async def test_the_page_and_its_files(path: str, content_type: str, words: bytes) -> None:
    async with running_gateway(config()) as gw:
        with trio.fail_after(TIMEOUT):
            reply = await get(gw, path)
            assert reply.status == 200
            assert reply.headers["content-type"].startswith(content_type)
            assert words in reply.body
            assert reply.headers["x-content-type-options"] == "nosniff"
            assert "default-src 'self'" in reply.headers["content-security-policy"]


@pytest.mark.parametrize(
    ("method", "path", "code"),
    [
        ("GET", "/nope", 404),
        ("GET", "/static/../config.py", 404),
        ("GET", "/static/", 404),
        ("GET", "/static/nothing.js", 404),
        ("POST", "/api/status", 405),
        ("DELETE", "/", 405),
    ],
)
async def test_other_paths_and_methods_are_refused(method: str, path: str, code: int) -> None:
    async with running_gateway(config()) as gw:
        with trio.fail_after(TIMEOUT):
            assert (await get(gw, path, method)).status == code


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    async with running_gateway(config()) as gw:
        with trio.fail_after(TIMEOUT):
            host, port = host_port(gw.admin_addresses[0])
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
                await stream.send_all(request * 3)
                data = b""
                while data.count(b"ok\n") < 3:
                    chunk = await stream.receive_some(4096)
                    assert chunk, data
                    data += chunk
                assert data.count(b"HTTP/1.1 200 OK") == 3


# -- protections ------------------------------------------------------------------------


async def test_a_connection_beyond_max_connections_gets_503() -> None:
    async with running_gateway(config(admin={"bind": "127.0.0.1:0", "max_connections": 1})) as gw:
        with trio.fail_after(TIMEOUT):
            host, port = host_port(gw.admin_addresses[0])
            held = await trio.open_tcp_stream(host, port)
            async with held:
                await trio.testing.wait_all_tasks_blocked()  # accepted and being served
                reply = await get(gw, "/healthz")
                assert reply.status == 503
                assert b"too many admin connections" in reply.body
            refused = gw.metrics.value(
                "interchange_refused_connections_total",
                {"listener": "admin", "reason": "max_connections"},
            )
            assert refused == 1
            # The slot is free again once the held connection is gone.
            await until(_healthy(gw), "the slot to be released")


def _healthy(gw: Gateway) -> Any:
    async def check() -> bool:
        return (await get(gw, "/healthz")).status == 200

    return check


async def test_an_idle_connection_is_closed_after_idle_timeout() -> None:
    cfg = config(admin={"bind": "127.0.0.1:0", "idle_timeout": "200ms"})
    async with running_gateway(cfg) as gw:
        with trio.fail_after(TIMEOUT):
            host, port = host_port(gw.admin_addresses[0])
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                start = trio.current_time()
                assert await stream.receive_some(1024) == b""  # closed, nothing said
                assert trio.current_time() - start < 2.0


async def test_a_malformed_request_gets_400() -> None:
    async with running_gateway(config()) as gw:
        with trio.fail_after(TIMEOUT):
            host, port = host_port(gw.admin_addresses[0])
            stream = await trio.open_tcp_stream(host, port)
            async with stream:
                await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
                data = b""
                while chunk := await stream.receive_some(4096):
                    data += chunk
                assert data.startswith(b"HTTP/1.1 400 ")


# -- taps -------------------------------------------------------------------------------


async def test_a_tap_streams_what_is_published() -> None:
    """``gateway tap``'s client against the endpoint: it sees the message, and the
    publisher is still held by the queue (a tap never acks)."""
    async with running_gateway(config()) as gw, client(gw) as pub:
        with trio.fail_after(TIMEOUT):
            out = io.StringIO()
            url = f"http://{gw.admin_addresses[0]}"
            done = trio.Event()

            async def tap() -> None:
                await trio.to_thread.run_sync(
                    functools.partial(follow, url, "jobs", out=out, limit=1)
                )
                done.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(tap)
                while not done.is_set():  # until the tap is in place and sees one
                    await pub.publish_nowait([b'{"n":1}'])
                    with trio.move_on_after(0.2):
                        await done.wait()
            line = json.loads(out.getvalue().splitlines()[0])
            assert line["dest"] == "jobs"
            assert line["body"] == '{"n":1}'
            assert line["source"]["listener"] == "nd"
            assert gw.hub.inflight >= 1  # nobody consumed: still unacked


async def test_a_tap_with_a_bad_filter_is_400() -> None:
    async with running_gateway(config()) as gw:
        with trio.fail_after(TIMEOUT):
            assert (await get(gw, "/api/tap?dest=jobs&filter=%7Bnot")).status == 400
            assert (await get(gw, "/api/tap")).status == 400
            assert (await get(gw, "/api/tap?dest=jobs&format=xml")).status == 400


# -- configuration ----------------------------------------------------------------------


def config_errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(data, source="test.toml")
    return info.value.errors


def test_the_embedded_default_serves_admin_on_9465_loopback() -> None:
    config = default_config()
    assert config.admin_bind == "127.0.0.1:9465"
    assert config.admin_bind != config.metrics_bind
    assert all(ls.bind != config.admin_bind for ls in config.listeners)


def test_no_admin_table_means_no_endpoint() -> None:
    assert parse({}, source="test.toml").admin_bind is None


def test_admin_keys_are_read() -> None:
    cfg = parse(
        {"admin": {"bind": "127.0.0.1:9999", "max_connections": 3, "idle_timeout": "2s"}},
        source="test.toml",
    )
    assert (cfg.admin_bind, cfg.admin_max_connections, cfg.admin_idle_timeout) == (
        "127.0.0.1:9999",
        3,
        2.0,
    )


def test_an_admin_bind_equal_to_a_listener_bind_is_refused() -> None:
    listener = {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:9500"}
    errors = config_errors({"admin": {"bind": "127.0.0.1:9500"}, "listeners": [listener]})
    assert errors == ["test.toml: admin.bind: is also the bind of listeners[0]"]


def test_an_admin_bind_equal_to_the_metrics_bind_is_refused() -> None:
    errors = config_errors(
        {"admin": {"bind": "127.0.0.1:9500"}, "metrics": {"bind": "127.0.0.1:9500"}}
    )
    assert errors == ["test.toml: admin.bind: is also the bind of metrics"]


@pytest.mark.parametrize(
    ("admin", "key", "words"),
    [
        ({"bind": "not an address"}, "admin.bind", "host:port"),
        ({"bind": 9465}, "admin.bind", "string"),
        ({"bind": "127.0.0.1:9465", "port": 1}, "admin.port", "unknown key"),
        ({"bind": "127.0.0.1:9465", "max_connections": 0}, "admin.max_connections", "least"),
    ],
)
def test_a_bad_admin_table_names_the_key(admin: dict[str, Any], key: str, words: str) -> None:
    errors = config_errors({"admin": admin})
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"test.toml: {key}: "), errors
    assert words in errors[0]


# -- rates ------------------------------------------------------------------------------


def test_the_tracker_turns_counters_into_rates_over_its_window() -> None:
    from gateway.ops.status import StatusTracker

    gw = Gateway(parse(config(), source="test.toml"))
    now = [100.0]
    tracker = StatusTracker(gw, window=5.0, clock=lambda: now[0])
    received = gw.metrics.bytes_received.labels(listener="nd")
    tracker.sample()
    for _ in range(10):  # 1000 bytes a second for 10 s
        now[0] += 1.0
        received.inc(1000)
        tracker.sample()
    rates = tracker.rates()
    assert rates["listeners"]["nd"]["bytes_in"] == 1000.0
    # A counter the metrics do not have reads 0, never fails.
    assert rates["listeners"]["nd"]["messages_out"] == 0.0
    # Nobody looked for a minute: the rate is since the last look.
    now[0] += 60.0
    received.inc(6000)
    tracker.sample()
    assert tracker.rates()["listeners"]["nd"]["bytes_in"] == 100.0


async def test_the_endpoint_serves_on_a_unix_socket(tmp_path: Path) -> None:
    path = tmp_path / "admin.sock"
    async with running_gateway(config(admin={"bind": f"unix:{path}"})) as gw:
        with trio.fail_after(TIMEOUT):
            assert gw.admin_addresses == [f"unix:{path}"]
            stream = await trio.open_unix_socket(str(path))
            async with stream:
                await stream.send_all(
                    b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                )
                data = b""
                while chunk := await stream.receive_some(4096):
                    data += chunk
            assert data.startswith(b"HTTP/1.1 200 OK\r\n")
            assert data.endswith(b"\r\n\r\nok\n")


def test_gateway_check_refuses_an_admin_bind_taken_by_metrics(tmp_path: Path) -> None:
    config_file = tmp_path / "gw.toml"
    config_file.write_text(
        '[metrics]\nbind = "127.0.0.1:9500"\n[admin]\nbind = "127.0.0.1:9500"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
    )
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "check", str(config_file)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert f"{config_file}: admin.bind: is also the bind of metrics" in result.stderr


def _status_with_group(**group: int) -> dict[str, Any]:
    counts = {"held": 0, "members": 0, "queued": 0, "unacked": 0} | group
    return {
        "draining": False,
        "inflight": 0,
        "memory": {"used": 0, "limit": 1, "exhausted": False},
        "listeners": [],
        "upstreams": [],
        "destinations": [
            {
                "name": "jobs",
                "kind": "queue",
                "backlog": {"messages": counts["held"], "bytes": 0},
                "groups": [{"name": "queue", "full": False} | counts],
            }
        ],
    }


@pytest.mark.parametrize(
    ("group", "text"),
    [
        ({"held": 1, "queued": 1}, "1 message waits in group queue, which has no subscriber"),
        ({"held": 3, "queued": 3}, "3 messages wait in group queue, which has no subscriber"),
        ({"held": 1, "unacked": 1, "members": 1}, "1 message is delivered to group queue"),
        ({"held": 2, "unacked": 2, "members": 1}, "2 messages are delivered to group queue"),
        (
            {"held": 1, "queued": 1, "members": 1},
            "1 message queued in group queue: its 1 subscriber has no credit",
        ),
        (
            {"held": 5, "queued": 5, "members": 2},
            "5 messages queued in group queue: its 2 subscribers have no credit",
        ),
    ],
)
def test_hints_count_in_words_that_agree(group: dict[str, int], text: str) -> None:
    from gateway.ops.status import hints

    [hint] = hints(_status_with_group(**group))
    assert hint["subject"] == "destination jobs"
    assert hint["text"].startswith(text), hint["text"]


async def test_a_log_with_a_publisher_waiting_for_room_is_full() -> None:
    """The log holds 1000 of its 1024 bytes and the next message does not fit: the
    publisher waits, and the status says the log is full and why, not "not settled"."""
    settings = config(
        destinations=[
            {"name": "jobs", "kind": "topic", "retain": 1024, "groups": ["audit"]},
        ]
    )
    async with running_gateway(settings) as gw, client(gw) as pub:
        with trio.fail_after(TIMEOUT):
            # Each message is charged its body plus 200 bytes: 5 of 0 bytes are 1000.
            answers = await pub.wait_answers(await pub.publish_nowait([b""] * 5))
            assert {a.status for a in answers} == {"delivered"}
            await pub.publish_nowait([b"x" * 100])
            await until(lambda: _inflight(gw, 1), "the publish to wait for room")
            s = await status(gw)
            log = by_name(s["destinations"], "jobs")["log"]
            assert (log["bytes"], log["retain"]) == (1000, 1024)
            assert log["full"] is True
            assert log["blocked"] == 1
            texts = [h["text"] for h in s["hints"] if h["subject"] == "destination jobs"]
            assert texts == [
                "the log is full (retain 1024 bytes) and group audit has not committed 5"
                " messages: 1 publish waits for room"
            ]
            assert not any("not settled" in h["text"] for h in s["hints"])
