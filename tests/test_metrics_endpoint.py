"""The metrics endpoint from the outside: ``GET /metrics`` scraped over real sockets.

Scrapes use an HTTP client that shares no code with the endpoint (the
standard library's ``http.client``, in a worker thread) and read the figures
with ``prometheus_client``'s own text parser; misbehaving clients are played
with raw trio streams. Every step runs under ``trio.fail_after`` so that a
stuck endpoint fails a test instead of hanging it.
"""

from __future__ import annotations

import functools
import http.client
import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway
from prometheus_client.parser import text_string_to_metric_families

from gateway.config.loader import ConfigError, default_config, parse
from gateway.protocol.plugin import ProtocolPlugin, ServerConnection
from gateway.runtime.gateway import Gateway
from gateway.runtime.registry import Registered, Registry, default_registry

#: Seconds any one test may take end to end (the endpoint's idle timeout is 10 s).
TIMEOUT = 8.0
#: Socket timeout of the blocking HTTP client, so that its thread always returns.
CLIENT_TIMEOUT = 5.0
PING = b'{"op":"ping"}\n'
PONG = b'{"op":"pong"}\n'

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def ndjson_listener(name: str = "nd", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "protocol": "ndjson",
        "bind": "127.0.0.1:0",
        "destination": "logs",
    } | extra


def metrics_config(**extra: Any) -> dict[str, Any]:
    """A gateway with the endpoint on a free loopback port and one ndjson listener."""
    return {"metrics": {"bind": "127.0.0.1:0"}, "listeners": [ndjson_listener()]} | extra


# -- an independent HTTP client -------------------------------------------------------


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    #: Whether the client still holds the same, open socket after reading this reply.
    kept_alive: bool


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix stream socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


def _connection(address: str) -> http.client.HTTPConnection:
    if address.startswith("unix:"):
        return UnixHTTPConnection(address[len("unix:") :], CLIENT_TIMEOUT)
    host, port = host_port(address)
    return http.client.HTTPConnection(host, port, timeout=CLIENT_TIMEOUT)


def _exchange(
    address: str, requests: list[tuple[str, str, bytes | None]], keep_alive: bool = False
) -> list[Reply]:
    """Send ``(method, path, body)`` requests one after another on ONE connection.

    Blocking: run it in a thread. If the server closes the connection, the
    next request fails instead of silently reconnecting (``auto_open`` off),
    so a reply sequence proves which requests shared a connection.
    """
    conn = _connection(address)
    conn.connect()
    conn.auto_open = 0
    replies = []
    try:
        for i, (method, path, body) in enumerate(requests):
            sock = conn.sock
            last = i == len(requests) - 1
            headers = {} if keep_alive or not last else {"Connection": "close"}
            conn.request(method, path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
            replies.append(
                Reply(
                    response.status,
                    {k.lower(): v for k, v in response.getheaders()},
                    data,
                    conn.sock is not None and conn.sock is sock,
                )
            )
    finally:
        conn.close()
    return replies


async def http_requests(
    address: str, requests: list[tuple[str, str, bytes | None]], keep_alive: bool = False
) -> list[Reply]:
    # Abandoned on cancel, so that ``fail_after`` ends a test whose scrape is stuck (the
    # thread itself ends within CLIENT_TIMEOUT).
    return await trio.to_thread.run_sync(
        functools.partial(_exchange, address, requests, keep_alive), abandon_on_cancel=True
    )


async def http_request(
    address: str, method: str = "GET", path: str = "/metrics", body: bytes | None = None
) -> Reply:
    [reply] = await http_requests(address, [(method, path, body)])
    return reply


async def scrape(gw: Gateway) -> Samples:
    """Every sample the endpoint serves now, by (name, sorted labels)."""
    reply = await http_request(gw.metrics_addresses[0])
    assert reply.status == 200, reply
    return parse_samples(reply.body)


def parse_samples(body: bytes) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(body.decode("utf-8")):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


async def scrape_until(gw: Gateway, name: str, expected: float, **labels: str) -> Samples:
    """Scrape until ``name{labels}`` equals ``expected`` (the caller bounds the time)."""
    while True:
        samples = await scrape(gw)
        if sample(samples, name, **labels) == expected:
            return samples
        await trio.sleep(0.02)


# -- raw sockets ----------------------------------------------------------------------


async def open_raw(address: str) -> trio.SocketStream:
    return await trio.open_tcp_stream(*host_port(address))


async def send_and_read_to_close(address: str, data: bytes) -> bytes:
    """Send ``data``, then read until the server closes (or resets) the connection."""
    stream = await open_raw(address)
    reply = b""
    try:
        try:
            await stream.send_all(data)
        except trio.BrokenResourceError:
            pass  # closed on us mid-send: whatever arrived is still readable
        try:
            while chunk := await stream.receive_some():
                reply += chunk
        except trio.BrokenResourceError:
            pass
    finally:
        await stream.aclose()
    return reply


def split_responses(raw: bytes, methods: list[str]) -> list[tuple[int, bytes]]:
    """Cut raw bytes into one ``(status, body)`` per request method; nothing may be left."""
    responses = []
    for method in methods:
        head, sep, raw = raw.partition(b"\r\n\r\n")
        assert sep, f"incomplete response head: {head[:200]!r}"
        status_line, *lines = head.split(b"\r\n")
        headers = dict(line.lower().split(b":", 1) for line in lines)
        length = 0 if method == "HEAD" else int(headers[b"content-length"])
        responses.append((int(status_line.split(b" ")[1]), raw[:length]))
        raw = raw[length:]
    assert raw == b"", f"bytes after the last response: {raw[:200]!r}"
    return responses


def status_of(raw_reply: bytes) -> int | None:
    if not raw_reply.startswith(b"HTTP/1."):
        return None
    return int(raw_reply.split(b" ", 2)[1])


async def ndjson_ping(address: str) -> trio.SocketStream:
    """Connect to an ndjson listener, ping and read the whole pong; the stream stays open."""
    stream = await open_raw(address)
    await stream.send_all(PING)
    reply = b""
    while not reply.endswith(b"\n"):
        chunk = await stream.receive_some()
        assert chunk, f"ndjson listener closed after {reply!r}"
        reply += chunk
    assert reply == PONG
    return stream


# -- 1. the figures of one connection, scraped ------------------------------------------


async def test_scrape_serves_the_text_format_and_counts_one_ndjson_connection() -> None:
    async with running_gateway(metrics_config()) as gw:
        with trio.fail_after(TIMEOUT):
            [address] = gw.metrics_addresses
            assert not address.endswith(":0"), "metrics_addresses must name the real port"
            reply = await http_request(address)
            assert reply.status == 200
            media_type, *params = (p.strip() for p in reply.headers["content-type"].split(";"))
            assert media_type == "text/plain"
            assert "charset=utf-8" in [p.lower() for p in params]
            versions = [p.split("=", 1)[1] for p in params if p.startswith("version=")]
            assert versions in (["0.0.4"], ["1.0.0"])
            assert int(reply.headers["content-length"]) == len(reply.body)
            families = {f.name for f in text_string_to_metric_families(reply.body.decode())}
            assert {
                "interchange_connections",
                "interchange_connections_open",
                "interchange_received_bytes",
                "interchange_sent_bytes",
            } <= families
            before = parse_samples(reply.body)
            assert not sample(before, "interchange_connections_total", listener="nd")

            stream = await ndjson_ping(gw.addresses["nd"][0])
            during = await scrape(gw)
            assert sample(during, "interchange_connections_total", listener="nd") == 1
            assert sample(during, "interchange_connections_open", listener="nd") == 1
            received = sample(during, "interchange_received_bytes_total", listener="nd")
            assert received is not None
            assert received > 0
            # Exactly the bytes that crossed the wire, each way.
            assert received == len(PING)
            assert sample(during, "interchange_sent_bytes_total", listener="nd") == len(PONG)

            await stream.aclose()
            after = await scrape_until(gw, "interchange_connections_open", 0, listener="nd")
            assert sample(after, "interchange_connections_total", listener="nd") == 1
            assert sample(after, "interchange_connection_errors_total", listener="nd") == 0


async def test_without_a_metrics_table_nothing_is_served_but_figures_are_kept() -> None:
    async with running_gateway({"listeners": [ndjson_listener()]}) as gw:
        with trio.fail_after(TIMEOUT):
            assert gw.config.metrics_bind is None
            assert gw.metrics_addresses == []
            stream = await ndjson_ping(gw.addresses["nd"][0])
            assert gw.metrics.value("interchange_connections_total", {"listener": "nd"}) == 1
            await stream.aclose()


async def test_the_endpoint_is_closed_when_the_gateway_stops() -> None:
    async with running_gateway(metrics_config()) as gw:
        address = gw.metrics_addresses[0]
        assert (await http_request(address)).status == 200
    with trio.fail_after(TIMEOUT), pytest.raises(OSError):
        await open_raw(address)


async def test_a_unix_socket_bind_is_served(tmp_path: Path) -> None:
    path = tmp_path / "metrics.sock"
    config = metrics_config(metrics={"bind": f"unix:{path}"})
    async with running_gateway(config) as gw:
        with trio.fail_after(TIMEOUT):
            assert gw.metrics_addresses == [f"unix:{path}"]
            stream = await ndjson_ping(gw.addresses["nd"][0])
            reply = await http_request(gw.metrics_addresses[0])
            assert reply.status == 200
            samples = parse_samples(reply.body)
            assert sample(samples, "interchange_connections_total", listener="nd") == 1
            await stream.aclose()


# -- 2. HTTP semantics ---------------------------------------------------------------


async def test_keep_alive_serves_several_requests_on_one_connection() -> None:
    async with running_gateway(metrics_config()) as gw:
        with trio.fail_after(TIMEOUT):
            replies = await http_requests(
                gw.metrics_addresses[0],
                [("GET", "/metrics", None), ("GET", "/metrics", None), ("GET", "/metrics", None)],
                keep_alive=True,
            )
            assert [r.status for r in replies] == [200, 200, 200]
            assert all(r.kept_alive for r in replies), "the server closed a keep-alive connection"
            assert all("close" not in r.headers.get("connection", "").lower() for r in replies)
            for r in replies:
                parse_samples(r.body)


async def test_head_has_the_headers_of_get_and_no_body() -> None:
    async with running_gateway(metrics_config()) as gw:
        with trio.fail_after(TIMEOUT):
            # HEAD then GET on one connection: a body sent after the HEAD reply would be
            # read as the start of the GET reply and break it.
            head, get = await http_requests(
                gw.metrics_addresses[0], [("HEAD", "/metrics", None), ("GET", "/metrics", None)]
            )
            assert head.status == 200
            assert head.body == b""
            assert head.kept_alive
            assert head.headers["content-type"] == get.headers["content-type"]
            # Process metrics (CPU seconds, memory) move between two scrapes: the
            # lengths are those of two expositions, close but not always equal.
            assert abs(int(head.headers["content-length"]) - len(get.body)) < 200
            assert len(get.body) > 0
            assert get.status == 200
            parse_samples(get.body)


async def test_head_sends_no_body_bytes_on_the_wire() -> None:
    async with running_gateway(metrics_config()) as gw:
        with trio.fail_after(TIMEOUT):
            raw = await send_and_read_to_close(
                gw.metrics_addresses[0],
                b"HEAD /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            )
            [(status, body)] = split_responses(raw, ["HEAD"])  # fails on any body byte
            assert status == 200
            assert body == b""
            assert b"\r\ncontent-length: " in raw.lower()


@pytest.mark.parametrize("path", ["/metrics?x=1", "/metrics?", "/metrics?name[]=a&b=%20"])
async def test_a_query_string_is_ignored(path: str) -> None:
    async with running_gateway(metrics_config()) as gw:
        with trio.fail_after(TIMEOUT):
            reply = await http_request(gw.metrics_addresses[0], path=path)
            assert reply.status == 200
            assert "interchange_connections" in {
                f.name for f in text_string_to_metric_families(reply.body.decode())
            }


@pytest.mark.parametrize("path", ["/", "/metric", "/metrics/", "/metricsx", "/other?/metrics"])
async def test_other_paths_are_404_and_keep_the_connection(path: str) -> None:
    async with running_gateway(metrics_config()) as gw:
        with trio.fail_after(TIMEOUT):
            missing, found = await http_requests(
                gw.metrics_addresses[0], [("GET", path, None), ("GET", "/metrics", None)]
            )
            assert missing.status == 404
            assert b"interchange_" not in missing.body
            assert missing.kept_alive
            assert found.status == 200


@pytest.mark.parametrize(
    ("method", "body"),
    [("POST", b"x=1"), ("POST", None), ("PUT", b"{}"), ("DELETE", None), ("OPTIONS", None)],
)
async def test_other_methods_are_405_with_allow(method: str, body: bytes | None) -> None:
    async with running_gateway(metrics_config()) as gw:
        with trio.fail_after(TIMEOUT):
            refused, found = await http_requests(
                gw.metrics_addresses[0], [(method, "/metrics", body), ("GET", "/metrics", None)]
            )
            assert refused.status == 405
            allowed = {m.strip().upper() for m in refused.headers["allow"].split(",")}
            assert allowed == {"GET", "HEAD"}
            assert b"interchange_" not in refused.body
            # The request body was consumed: the next request on the connection is intact.
            assert refused.kept_alive
            assert found.status == 200


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with running_gateway(metrics_config()) as gw:
        with trio.fail_after(TIMEOUT):
            raw = await send_and_read_to_close(
                gw.metrics_addresses[0],
                b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n"
                b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n"
                b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            )
            missing, head, get = split_responses(raw, ["GET", "HEAD", "GET"])
            assert (missing[0], head[0], get[0]) == (404, 200, 200)
            assert head[1] == b""
            parse_samples(get[1])


# -- 3. misbehaving clients --------------------------------------------------------------


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x16\x03\x01\x00\xa5\x01\x00\x00garbage\r\n\r\n",  # a TLS ClientHello's start
        b"GET\r\n\r\n",  # request line without a target
        b"GET /metrics\r\n\r\n",  # HTTP/0.9
        b"GET /metrics HTTP/1.1\r\n\r\n",  # HTTP/1.1 without Host
        b"GET /metrics HTTP/1.1\r\nHost: t\r\nBad Header: x\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: t\r\nContent-Length: -1\r\n\r\n",
        b"\x00\x01\x02\x03\r\n\r\n",
    ],
)
async def test_a_malformed_request_gets_400_or_a_close_and_the_next_client_is_served(
    garbage: bytes,
) -> None:
    async with running_gateway(metrics_config()) as gw:
        address = gw.metrics_addresses[0]
        with trio.fail_after(TIMEOUT):
            raw = await send_and_read_to_close(address, garbage)
            status = status_of(raw)
            assert raw == b"" or status == 400, raw[:200]
            assert b"interchange_" not in raw
            reply = await http_request(address)
            assert reply.status == 200
            parse_samples(reply.body)


async def test_silent_clients_do_not_block_other_scrapes() -> None:
    async with running_gateway(metrics_config()) as gw:
        address = gw.metrics_addresses[0]
        # Well under the endpoint's 10 s idle timeout: a scrape queued behind a
        # silent client would miss this deadline.
        with trio.fail_after(3):
            silent = [await open_raw(address) for _ in range(5)]
            partial = await open_raw(address)
            await partial.send_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n")  # never finished
            statuses: list[int] = []

            async def one() -> None:
                statuses.append((await http_request(address)).status)

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(one)
            assert statuses == [200] * 4
            for stream in [*silent, partial]:
                await stream.aclose()


async def read_until_closed(stream: trio.abc.Stream) -> bytes:
    """Everything the server sends until it closes (or resets) the connection."""
    data = b""
    try:
        while chunk := await stream.receive_some():
            data += chunk
    except trio.BrokenResourceError:
        pass
    return data


async def test_a_silent_client_is_disconnected_after_the_idle_timeout() -> None:
    config = metrics_config(metrics={"bind": "127.0.0.1:0", "idle_timeout": "300ms"})
    async with running_gateway(config) as gw:
        address = gw.metrics_addresses[0]
        with trio.fail_after(TIMEOUT):
            silent = await open_raw(address)
            opened = trio.current_time()
            kept = await open_raw(address)
            await kept.send_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                data += await kept.receive_some()
            answered = trio.current_time()
            # Before the first request, and between requests: closed after 0.3 s, well
            # before the 10 s default.
            for stream, since in ((silent, opened), (kept, answered)):
                with trio.fail_after(3):
                    await read_until_closed(stream)
                assert trio.current_time() - since >= 0.25
                await stream.aclose()


async def test_a_client_sending_within_the_idle_timeout_is_kept(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = metrics_config(metrics={"bind": "127.0.0.1:0", "idle_timeout": "1s"})
    async with running_gateway(config) as gw:
        with trio.fail_after(TIMEOUT):
            stream = await open_raw(gw.metrics_addresses[0])
            await trio.sleep(0.5)
            await stream.send_all(b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            await trio.sleep(0.5)  # the timeout runs from the response, not the connect
            await stream.send_all(b"HEAD /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            raw = await read_until_closed(stream)
            assert [status for status, _ in split_responses(raw, ["HEAD", "HEAD"])] == [200, 200]
            await stream.aclose()


def refused_metrics(gw: Gateway) -> float | None:
    return gw.metrics.value(
        "interchange_refused_connections_total",
        {"listener": "metrics", "reason": "max_connections"},
    )


async def test_connections_beyond_max_connections_get_503_and_are_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.metrics")
    config = metrics_config(metrics={"bind": "127.0.0.1:0", "max_connections": 2})
    async with running_gateway(config) as gw:
        address = gw.metrics_addresses[0]
        # Well under the 10 s idle timeout: a refused client waiting for it fails here.
        with trio.fail_after(3):
            idle = [await open_raw(address) for _ in range(2)]
            assert not refused_metrics(gw)
            # Refused at once, without waiting for a request: one sends nothing, one
            # sends a whole request (which is never answered but by the 503).
            for request in (b"", b"", b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n"):
                raw = await send_and_read_to_close(address, request)
                head, _, body = raw.partition(b"\r\n\r\n")
                assert status_of(raw) == 503, raw[:200]
                assert b"\r\nconnection: close" in head.lower()
                assert b"interchange_" not in body
            assert refused_metrics(gw) == 3
            warnings = [r for r in caplog.records if r.name == "gateway.metrics"]
            assert len(warnings) == 1, [r.getMessage() for r in warnings]  # rate-limited
            assert "max_connections" in warnings[0].getMessage()
            assert warnings[0].exc_info is None
            suppressed = {"reason": "metrics:max_connections"}
            assert gw.metrics.value("interchange_log_lines_suppressed_total", suppressed) == 2

            # The idle connections still hold their places, and are served.
            await idle[0].send_all(b"HEAD /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            data = b""
            while b"\r\n\r\n" not in data:
                data += await idle[0].receive_some()
            assert status_of(data) == 200

            # Once one leaves, a new client takes its place (after the server saw it go).
            await idle[1].aclose()
            while (reply := await http_request(address)).status == 503:
                await trio.sleep(0.02)
            assert reply.status == 200
            await idle[0].aclose()


async def test_refusals_are_bounded_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A refused client that never hangs up holds its refusal for about a second; while
    it does, refusals beyond max_connections get no 503, only a close."""
    config = metrics_config(metrics={"bind": "127.0.0.1:0", "max_connections": 1})
    async with running_gateway(config) as gw:
        address = gw.metrics_addresses[0]
        with trio.fail_after(TIMEOUT):
            idle = await open_raw(address)
            lingering = await open_raw(address)  # refused, and never hangs up
            assert status_of(await read_until_closed(lingering)) == 503
            assert await send_and_read_to_close(address, b"") == b""
            await trio.sleep(1.2)  # the lingering refusal gives up after a second (mock clock)
            assert status_of(await send_and_read_to_close(address, b"")) == 503
            assert refused_metrics(gw) == 3
            for stream in (idle, lingering):
                await stream.aclose()


async def test_max_connections_counts_open_connections_not_requests() -> None:
    config = metrics_config(metrics={"bind": "127.0.0.1:0", "max_connections": 1})
    async with running_gateway(config) as gw:
        with trio.fail_after(TIMEOUT):
            for _ in range(5):  # one after another: never refused
                assert (await http_request(gw.metrics_addresses[0])).status == 200
            assert not refused_metrics(gw)


async def test_a_huge_request_head_is_refused_and_the_endpoint_keeps_serving() -> None:
    pad = b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 100) for i in range(1000))
    head = b"GET /metrics HTTP/1.1\r\nHost: t\r\n" + pad + b"\r\n"
    assert len(head) > 100_000
    async with running_gateway(metrics_config()) as gw:
        address = gw.metrics_addresses[0]
        with trio.fail_after(TIMEOUT):
            raw = await send_and_read_to_close(address, head)
            assert raw == b"" or status_of(raw) in (400, 413, 431), raw[:200]
            assert b"interchange_" not in raw
            assert (await http_request(address)).status == 200


async def test_an_endless_request_head_is_cut_off_not_buffered() -> None:
    """Far more header bytes than any buffer should hold: the endpoint must hang up."""
    limit = 64 * 1024 * 1024
    chunk = b"a" * 65536
    async with running_gateway(metrics_config()) as gw:
        address = gw.metrics_addresses[0]
        with trio.fail_after(TIMEOUT):
            stream = await open_raw(address)
            sent = 0
            refused = False
            try:
                await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nX-Pad: ")
                while sent < limit:
                    await stream.send_all(chunk)
                    sent += len(chunk)
            except trio.BrokenResourceError:
                refused = True
            finally:
                await stream.aclose()
            assert refused, f"the endpoint took {sent} bytes of one request head"
            assert (await http_request(address)).status == 200


# -- 4. and 5. configuration --------------------------------------------------------------


def config_errors(data: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(data, source="test.toml")
    return info.value.errors


@pytest.mark.parametrize(
    ("metrics", "key", "words"),
    [
        ({"bind": "not an address"}, "metrics.bind", "host:port"),
        ({"bind": ""}, "metrics.bind", "host:port"),
        ({"bind": 9464}, "metrics.bind", "string"),
        ({"bind": "127.0.0.1:70000"}, "metrics.bind", "65535"),
        ({"bind": "[::1:9464"}, "metrics.bind", "]"),
        ({"bind": "gopher://x:1"}, "metrics.bind", ""),
        ({"bind": "127.0.0.1:9464", "port": 9464}, "metrics.port", "unknown key"),
    ],
)
def test_a_bad_metrics_table_names_the_file_and_key(
    metrics: dict[str, Any], key: str, words: str
) -> None:
    errors = config_errors({"metrics": metrics, "listeners": [ndjson_listener()]})
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"test.toml: {key}: "), errors
    assert words in errors[0]


@pytest.mark.parametrize("value", ["127.0.0.1:9464", 9464, ["127.0.0.1:9464"], True])
def test_metrics_must_be_a_table(value: Any) -> None:
    errors = config_errors({"metrics": value})
    assert len(errors) == 1, errors
    assert errors[0].startswith("test.toml: metrics: expected a table"), errors


@pytest.mark.parametrize(
    ("listener_binds", "metrics_bind", "index"),
    [
        (["127.0.0.1:9500"], "127.0.0.1:9500", 0),
        (["127.0.0.1:9501", "127.0.0.1:9500"], "127.0.0.1:9500", 1),
        (["*:9500"], "*:9500", 0),
        (["[::1]:9500"], "[::1]:9500", 0),
        (["unix:/run/interchange/gw.sock"], "unix:/run/interchange/gw.sock", 0),
    ],
)
def test_a_metrics_bind_equal_to_a_listener_bind_is_refused(
    listener_binds: list[str], metrics_bind: str, index: int
) -> None:
    listeners = [ndjson_listener(f"l{i}", bind=b) for i, b in enumerate(listener_binds)]
    errors = config_errors({"metrics": {"bind": metrics_bind}, "listeners": listeners})
    assert len(errors) == 1, errors
    assert errors[0].startswith("test.toml: metrics.bind: "), errors
    assert f"listeners[{index}]" in errors[0]


def test_a_unix_metrics_bind_ending_in_colon_zero_still_collides() -> None:
    bind = "unix:/run/interchange/gw:0"
    errors = config_errors({"metrics": {"bind": bind}, "listeners": [ndjson_listener(bind=bind)]})
    assert any(e.startswith("test.toml: metrics.bind: ") for e in errors), errors


@pytest.mark.parametrize(
    ("listener_bind", "metrics_bind"),
    [("127.0.0.1:0", "127.0.0.1:0"), ("127.0.0.1:9500", "127.0.0.1:9501")],
)
def test_distinct_or_port_zero_binds_are_accepted(listener_bind: str, metrics_bind: str) -> None:
    config = parse(
        {"metrics": {"bind": metrics_bind}, "listeners": [ndjson_listener(bind=listener_bind)]},
        source="test.toml",
    )
    assert config.metrics_bind == metrics_bind


def test_no_metrics_table_means_no_endpoint() -> None:
    assert parse({"listeners": [ndjson_listener()]}, source="test.toml").metrics_bind is None


def test_the_embedded_default_serves_metrics_on_9464() -> None:
    config = default_config()
    assert config.metrics_bind == "127.0.0.1:9464"
    assert config.listeners, "the default has a listener per bundled server protocol"
    assert all(ls.bind != config.metrics_bind for ls in config.listeners)


# -- 6. one registry per gateway ------------------------------------------------------------


async def test_two_gateways_in_one_process_keep_separate_figures() -> None:
    async with (
        running_gateway(metrics_config()) as a,
        running_gateway(metrics_config()) as b,
    ):
        with trio.fail_after(TIMEOUT):
            assert a.metrics_addresses != b.metrics_addresses
            streams = [await ndjson_ping(a.addresses["nd"][0]) for _ in range(2)]
            in_a, in_b = await scrape(a), await scrape(b)
            assert sample(in_a, "interchange_connections_total", listener="nd") == 2
            assert sample(in_a, "interchange_received_bytes_total", listener="nd") == 2 * len(PING)
            assert not sample(in_b, "interchange_connections_total", listener="nd")
            assert not sample(in_b, "interchange_connections_open", listener="nd")
            assert not sample(in_b, "interchange_received_bytes_total", listener="nd")

            other = await ndjson_ping(b.addresses["nd"][0])
            in_a, in_b = await scrape(a), await scrape(b)
            assert sample(in_a, "interchange_connections_total", listener="nd") == 2
            assert sample(in_b, "interchange_connections_total", listener="nd") == 1
            for stream in [*streams, other]:
                await stream.aclose()


# -- 7. start-up failures ------------------------------------------------------------------


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc


@contextmanager
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


async def start_and_expect_failure(gw: Gateway) -> BaseException:
    """Run ``gw``; return what its start-up raised (fail if it started)."""
    with trio.fail_after(TIMEOUT), pytest.raises(BaseException) as info:  # noqa: PT012
        async with trio.open_nursery() as nursery:
            await nursery.start(gw.run)
            gw.shutdown()
            pytest.fail("the gateway started although its metrics bind cannot be bound")
    return info.value


def assert_names_metrics(raised: BaseException, bind: str) -> None:
    oserrors = [e for e in _leaves(raised) if isinstance(e, OSError)]
    assert oserrors, raised
    assert "metrics" in str(oserrors[0])
    assert bind in str(oserrors[0])


async def test_a_taken_metrics_port_stops_start_up_naming_metrics() -> None:
    with taken_port() as port:
        bind = f"127.0.0.1:{port}"
        gw = Gateway(parse(metrics_config(metrics={"bind": bind}), source="test.toml"))
        assert_names_metrics(await start_and_expect_failure(gw), bind)
        assert gw.metrics_addresses == []


async def test_an_unbindable_unix_metrics_bind_stops_start_up_naming_metrics() -> None:
    bind = "unix:/nonexistent-interchange-test-folder/metrics.sock"
    gw = Gateway(parse(metrics_config(metrics={"bind": bind}), source="test.toml"))
    assert_names_metrics(await start_and_expect_failure(gw), bind)


# -- the runtime's counting, end to end -------------------------------------------------------


class _Exploding(ProtocolPlugin):
    """Echoes, and crashes on ``!`` (a fault its protocol does not handle)."""

    name = "exploding"
    roles: ClassVar = frozenset({"server"})

    async def serve(self, conn: ServerConnection) -> None:
        while data := await conn.stream.receive_some():
            if b"!" in data:
                raise ZeroDivisionError("a bug in the protocol")
            await conn.stream.send_all(data)


async def test_a_crash_counts_a_connection_error_and_a_protocol_error_does_not() -> None:
    base = default_registry()
    registry = Registry(
        {
            "exploding": Registered("exploding", "tests", "tests", "0", plugin=_Exploding()),
            "ndjson": base.protocols["ndjson"],
        },
        base.transports,
    )
    config = metrics_config(
        listeners=[
            {"name": "x", "protocol": "exploding", "bind": "127.0.0.1:0"},
            ndjson_listener(),
        ]
    )
    async with running_gateway(config, registry=registry) as gw:
        with trio.fail_after(TIMEOUT):
            crashed = await send_and_read_to_close(gw.addresses["x"][0], b"ab!")
            assert crashed in (b"", b"ab")
            refused = await send_and_read_to_close(gw.addresses["nd"][0], b"garbage\n")
            assert refused.startswith(b'{"op":"error"')
            await scrape_until(gw, "interchange_connections_open", 0, listener="x")
            samples = await scrape_until(gw, "interchange_connections_open", 0, listener="nd")
            assert sample(samples, "interchange_connection_errors_total", listener="x") == 1
            assert sample(samples, "interchange_connection_errors_total", listener="nd") == 0
            assert sample(samples, "interchange_connections_total", listener="x") == 1
            assert sample(samples, "interchange_received_bytes_total", listener="x") == 3


def upstream_sample(samples: Samples, name: str) -> float | None:
    return sample(samples, f"interchange_upstream_{name}", upstream="up")


def _free_refusing_port() -> socket.socket:
    """A bound, non-listening socket: connecting to its port is refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s


async def test_upstream_failures_are_counted_while_it_cannot_connect() -> None:
    with _free_refusing_port() as dead:
        upstream = {
            "name": "up",
            "protocol": "ndjson",
            "connect": f"127.0.0.1:{dead.getsockname()[1]}",
            "backoff_initial": "20ms",
            "backoff_max": "50ms",
        }
        async with running_gateway(metrics_config(upstreams=[upstream])) as gw:
            with trio.fail_after(TIMEOUT):
                while True:
                    samples = await scrape(gw)
                    failures = upstream_sample(samples, "failures_total")
                    if failures is not None and failures >= 2:
                        break
                    await trio.sleep(0.02)
                assert upstream_sample(samples, "connects_total") == 0
                assert upstream_sample(samples, "connected") == 0


async def test_upstream_connects_and_losses_are_counted() -> None:
    server_config = {"gateway": {"drain_timeout": "1s"}, "listeners": [ndjson_listener()]}
    server = Gateway(parse(server_config, source="<server>"))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        try:
            upstream = {
                "name": "up",
                "protocol": "ndjson",
                "connect": server.addresses["nd"][0],
                "backoff_initial": "20ms",
                "backoff_max": "50ms",
            }
            async with running_gateway(metrics_config(upstreams=[upstream])) as gw:
                with trio.fail_after(TIMEOUT):
                    samples = await scrape_until(
                        gw, "interchange_upstream_connected", 1, upstream="up"
                    )
                    assert upstream_sample(samples, "connects_total") == 1
                    assert upstream_sample(samples, "failures_total") == 0
                    served = {"listener": "nd"}
                    assert server.metrics.value("interchange_connections_total", served) == 1

                    server.shutdown()  # the upstream loses its peer, then cannot reconnect
                    samples = await scrape_until(
                        gw, "interchange_upstream_connected", 0, upstream="up"
                    )
                    while not upstream_sample(samples, "failures_total"):
                        await trio.sleep(0.02)
                        samples = await scrape(gw)
                    assert upstream_sample(samples, "connects_total") == 1
        finally:
            server.shutdown()


@pytest.mark.parametrize("peer_says", [b"", b"this is not json\n"])
async def test_an_upstream_connection_lost_after_connecting_counts_a_failure(
    peer_says: bytes,
) -> None:
    """A peer that accepts, then hangs up (or talks garbage): one connect, one failure."""
    accepted = 0

    async def peer(stream: trio.SocketStream) -> None:
        nonlocal accepted
        accepted += 1
        if peer_says:
            await stream.send_all(peer_says)
        await trio.testing.wait_all_tasks_blocked()  # the upstream saw itself connected
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    upstream = {
        "name": "up",
        "protocol": "ndjson",
        "connect": f"127.0.0.1:{port}",
        # Long enough that no reconnect happens while the figures are read.
        "backoff_initial": "30s",
        "backoff_max": "30s",
    }
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, peer, listeners)
        async with running_gateway(metrics_config(upstreams=[upstream])) as gw:
            with trio.fail_after(TIMEOUT):
                while True:
                    samples = await scrape(gw)
                    if upstream_sample(samples, "failures_total"):
                        break
                    await trio.sleep(0.02)
                assert accepted == 1
                assert upstream_sample(samples, "failures_total") == 1
                assert upstream_sample(samples, "connects_total") == 1
                assert upstream_sample(samples, "connected") == 0
        nursery.cancel_scope.cancel()
