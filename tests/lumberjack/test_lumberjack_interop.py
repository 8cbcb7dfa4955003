"""Third-party Lumberjack clients against the gateway's listener.

``pylogbeat`` (PyPI; blocking sockets, so it runs in a worker thread) sends v2
windows whose sequence numbers keep running across windows, over TCP and over
mutual TLS. The npm package ``lumberjack-protocol`` (a v1 client: ``1W`` once,
then a stream of ``1D`` frames, TLS only, asserting every ack is ``1A``) is
installed by ``.ci/test-deps`` into ``tests/lumberjack/npm`` and driven by a
small node script; without ``node`` or the package those tests fail, naming
what is missing, unless ``INTERCHANGE_SKIP_NODE=1`` skips them.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pylogbeat
import pytest
import trio
import trio.testing
from harness import host_port, running_gateway

from gateway.config.certs import init_dir
from gateway.core.destination import Delivery, Subscription


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return init_dir(tmp_path_factory.mktemp("lj-interop-certs"))


def lj_listener(**options: Any) -> dict[str, Any]:
    return {
        "name": "lj",
        "protocol": "lumberjack",
        "bind": "127.0.0.1:0",
        "destination": "logs",
    } | options


def tls_options(certs: dict[str, Path], client_auth: str = "required") -> dict[str, Any]:
    return {
        "handshake_timeout": "1s",
        "tls": {
            "cert": str(certs["server_cert"]),
            "key": str(certs["server_key"]),
            "client_ca": str(certs["ca_cert"]),
            "client_auth": client_auth,
        },
    }


def config(listener: dict[str, Any]) -> dict[str, Any]:
    return {"gateway": {"drain_timeout": "100ms"}, "listeners": [listener]}


async def consume(sub: Subscription, into: list[Delivery], *, ack: bool = True) -> None:
    """Collect every delivery of ``sub`` (acking each at once) until cancelled."""
    while True:
        batch = await sub.receive()
        into.extend(batch)
        if ack:
            sub.ack_many(x.tag for x in batch)


def windows_of(sizes: tuple[int, ...]) -> list[list[dict[str, Any]]]:
    n = iter(range(sum(sizes)))
    return [[{"id": next(n), "message": "hello from pylogbeat"} for _ in range(s)] for s in sizes]


def send_windows(address: str, windows: list[list[dict[str, Any]]], **kwargs: Any) -> int:
    """Send each window on one pylogbeat connection; return its last sequence number."""
    host, port = host_port(address)
    with pylogbeat.PyLogBeatClient(host, port, **kwargs) as client:
        for window in windows:
            client.send(window)  # returns only once the whole window is acked
        return int(client._sequence)


@pytest.mark.parametrize("transport", ["tcp", "mtls"])
async def test_pylogbeat_windows_arrive_once_each_and_are_acked(
    certs: dict[str, Path], transport: str
) -> None:
    extra: dict[str, Any] = {}
    listener = lj_listener()
    if transport == "mtls":
        listener |= tls_options(certs)
        extra = {
            "ssl_enable": True,
            "ssl_verify": True,
            "ca_certs": str(certs["ca_cert"]),
            "certfile": str(certs["client_cert"]),
            "keyfile": str(certs["client_key"]),
        }
    windows = windows_of((1, 50, 7, 300))
    async with running_gateway(config(listener)) as gw:
        sub = gw.hub.subscribe("logs")
        got: list[Delivery] = []
        address = gw.addresses["lj"][0]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, sub, got)
            with trio.fail_after(20):
                last_seq = await trio.to_thread.run_sync(
                    lambda: send_windows(address, windows, timeout=10, **extra)
                )
            # send() returned for every window: each event was acked, hence delivered.
            assert len(got) >= 358
            await trio.testing.wait_all_tasks_blocked()  # nothing more arrives (no resends)
            nursery.cancel_scope.cancel()
    assert last_seq == 358  # the sequence ran on across the four windows
    ids = [json.loads(x.message.body)["id"] for x in got]
    assert ids == list(range(358))  # in order, each exactly once
    assert all(x.message.content_type == "application/json" for x in got)
    source = got[0].message.source
    assert source is not None
    if transport == "mtls":
        assert source.identity is not None
        assert source.identity.common_name == "interchange-client"
    else:
        assert source.identity is None


async def test_pylogbeat_is_not_acked_while_the_consumer_holds_the_window() -> None:
    """A short socket timeout: pylogbeat gives up, since no ack (nor keepalive) came."""
    async with running_gateway(config(lj_listener())) as gw:
        sub = gw.hub.subscribe("logs")
        address = gw.addresses["lj"][0]
        with trio.fail_after(10):
            with pytest.raises((TimeoutError, socket.timeout)):
                await trio.to_thread.run_sync(
                    lambda: send_windows(address, windows_of((3,)), timeout=0.5)
                )
            got = await sub.receive()
        assert [json.loads(x.message.body)["id"] for x in got] == [0, 1, 2]


async def test_pylogbeat_waits_through_a_slow_consumer_thanks_to_keepalives() -> None:
    """The same 0.5 s socket timeout survives a 1.5 s consumer with 100 ms keepalives."""
    async with running_gateway(config(lj_listener(keepalive="100ms"))) as gw:
        sub = gw.hub.subscribe("logs")
        address = gw.addresses["lj"][0]

        async def slow_consumer() -> None:
            got = await sub.receive()
            # Real time: pylogbeat's 0.5 s socket timeout runs in its own thread.
            await trio.sleep(1.5)
            sub.ack_many(x.tag for x in got)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow_consumer)
            with trio.fail_after(10):
                last_seq = await trio.to_thread.run_sync(
                    lambda: send_windows(address, windows_of((3,)), timeout=0.5)
                )
        assert last_seq == 3


class HalvedPyLogBeat(pylogbeat.PyLogBeatClient):
    """Sends each window's C frame in two halves, ``pause`` seconds apart."""

    def __init__(self, *args: Any, pause: float, second_half: threading.Event, **kw: Any):
        super().__init__(*args, **kw)
        self.pause = pause
        self.second_half = second_half

    def _send_payload(self, compressed_payload: bytes) -> None:
        half = len(compressed_payload) // 2
        self._socket.sendall(compressed_payload[:half])
        time.sleep(self.pause)  # real time: this runs in a worker thread
        self.second_half.set()
        self._socket.sendall(compressed_payload[half:])


async def test_pylogbeat_window_trickling_inside_its_c_frame_is_not_cut() -> None:
    """pylogbeat sends a window as ``W`` and one ``C`` frame: events inside a C frame
    still arriving are not received yet, so no part goes out before it has ended."""
    second_half = threading.Event()
    window = windows_of((300,))[0]
    async with running_gateway(config(lj_listener(partial_after="50ms"))) as gw:
        sub = gw.hub.subscribe("logs")
        host, port = host_port(gw.addresses["lj"][0])

        def send() -> int:
            with HalvedPyLogBeat(
                host, port, timeout=10, pause=0.5, second_half=second_half
            ) as client:
                client.send(window)  # returns once the window is acked whole
                return int(client._sequence)

        async with trio.open_nursery() as nursery:
            # (Abandoned if the test fails: the thread may wait for its socket timeout.)
            nursery.start_soon(
                functools.partial(trio.to_thread.run_sync, abandon_on_cancel=True), send
            )
            with trio.fail_after(10):
                first = await sub.receive()
            assert second_half.is_set()  # nothing was published from the first half
            got = list(first)
            sub.ack_many(x.tag for x in first)
            with trio.fail_after(10):
                while len(got) < 300:
                    batch = await sub.receive()
                    got.extend(batch)
                    sub.ack_many(x.tag for x in batch)
    assert [json.loads(x.message.body)["id"] for x in got] == list(range(300))


async def test_pylogbeat_without_a_client_certificate_is_refused(certs: dict[str, Path]) -> None:
    async with running_gateway(config(lj_listener(**tls_options(certs)))) as gw:
        sub = gw.hub.subscribe("logs")
        address = gw.addresses["lj"][0]
        kwargs = {"ssl_enable": True, "ca_certs": str(certs["ca_cert"]), "timeout": 3}
        with (
            trio.fail_after(10),
            pytest.raises((ssl.SSLError, OSError, pylogbeat.ConnectionException)),
        ):
            await trio.to_thread.run_sync(lambda: send_windows(address, windows_of((2,)), **kwargs))
        with trio.move_on_after(0.2):
            pytest.fail(f"an unauthenticated event got through: {await sub.receive()}")


# -- npm lumberjack-protocol (v1 over TLS) --------------------------------------------------

NODE_SCRIPT = r"""
const fs = require('fs');
const lumberjack = require('lumberjack-protocol');
const [port, ca, cert, key, count, windowSize] = process.argv.slice(2);
const total = Number(count);
const client = lumberjack.client(
  {host: '127.0.0.1', port: Number(port), servername: 'localhost',
   ca: fs.readFileSync(ca), cert: fs.readFileSync(cert), key: fs.readFileSync(key)},
  {windowSize: Number(windowSize), maxQueueSize: 100000, reconnect: 60000});
const acks = [];
let started = false;
const finish = (code, extra) => {
  console.log(JSON.stringify(Object.assign({acks}, extra || {})));
  process.exit(code);
};
client.on('connect', () => {
  if (started) return;
  started = true;
  client._socket.on('ack', (seq) => {
    acks.push(seq);
    if (seq === total) finish(0);
  });
  for (let i = 1; i <= total; i++) {
    client.writeDataFrame({line: 'event ' + i, n: String(i), host: 'node-test'});
  }
});
client.on('disconnect', (err) => finish(2, {error: String(err)}));
setTimeout(() => finish(3, {error: 'timeout'}), 15000);
"""


#: Where .ci/test-deps installs the npm client (its package.json pins the version).
NPM_FOLDER = Path(__file__).parent / "npm"


@pytest.fixture(scope="module")
def npm_lumberjack() -> Path:
    """A folder holding the driver script beside node_modules/lumberjack-protocol."""
    if os.environ.get("INTERCHANGE_SKIP_NODE") == "1":
        pytest.skip("INTERCHANGE_SKIP_NODE=1: the npm lumberjack-protocol tests are skipped")
    if shutil.which("node") is None:
        pytest.fail("node is needed for the npm lumberjack-protocol tests: run .ci/test-deps")
    package = NPM_FOLDER / "node_modules" / "lumberjack-protocol" / "package.json"
    if not package.is_file():
        pytest.fail(f"{package} is missing: run .ci/test-deps (it runs npm install there)")
    (NPM_FOLDER / "send.js").write_text(NODE_SCRIPT)
    return NPM_FOLDER


async def test_npm_lumberjack_protocol_v1_client_over_mtls(
    certs: dict[str, Path], npm_lumberjack: Path
) -> None:
    total, window = 100, 50
    async with running_gateway(config(lj_listener(**tls_options(certs)))) as gw:
        sub = gw.hub.subscribe("logs")
        got: list[Delivery] = []
        port = host_port(gw.addresses["lj"][0])[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, sub, got)
            with trio.fail_after(30):
                result = await trio.run_process(
                    [
                        "node",
                        "send.js",
                        str(port),
                        str(certs["ca_cert"]),
                        str(certs["client_cert"]),
                        str(certs["client_key"]),
                        str(total),
                        str(window),
                    ],
                    cwd=str(npm_lumberjack),
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            await trio.testing.wait_all_tasks_blocked()  # nothing more arrives (no resends)
            nursery.cancel_scope.cancel()
    report = json.loads(result.stdout.decode().strip().splitlines()[-1])
    # The client asserts each ack's version byte is '1': a "2A" would have disconnected it.
    assert result.returncode == 0, (report, result.stderr.decode()[-2000:])
    assert report["acks"] == [50, 100]  # one 1A per window of the sticky size
    assert [x.message.headers["n"] for x in got] == [str(i) for i in range(1, total + 1)]
    assert got[0].message.headers["line"] == "event 1"
    assert got[0].message.headers["host"] == "node-test"
    assert {x.message.body for x in got} == {b""}
    source = got[0].message.source
    assert source is not None
    assert source.identity is not None
    assert source.identity.common_name == "interchange-client"


async def test_npm_lumberjack_protocol_slow_window_is_acked_in_part(
    certs: dict[str, Path], npm_lumberjack: Path
) -> None:
    """2 events of a window of 100, and nothing more: delivered and acked (1A 2) after
    the listener's ``partial_after``, not closed 30 s later for an unfinished window."""
    listener = lj_listener(partial_after="200ms", **tls_options(certs))
    async with running_gateway(config(listener)) as gw:
        sub = gw.hub.subscribe("logs")
        got: list[Delivery] = []
        port = host_port(gw.addresses["lj"][0])[1]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(consume, sub, got)
            with trio.fail_after(10):
                result = await trio.run_process(
                    [
                        "node",
                        "send.js",
                        str(port),
                        str(certs["ca_cert"]),
                        str(certs["client_cert"]),
                        str(certs["client_key"]),
                        "2",
                        "100",
                    ],
                    cwd=str(npm_lumberjack),
                    capture_stdout=True,
                    capture_stderr=True,
                    check=False,
                )
            nursery.cancel_scope.cancel()
    report = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert result.returncode == 0, (report, result.stderr.decode()[-2000:])
    assert report["acks"] == [2]
    assert [x.message.headers["n"] for x in got] == ["1", "2"]
