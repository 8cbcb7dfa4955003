"""Plugin interface v2: a plugin instance per gateway, setup/teardown, the hub facade,
upstreams reachable from listeners (a proxy), and the ingress path of client roles.

The toy ``toyline`` protocol (``tests/toy_line.py``) is registered here like a
third party's plugin, with no change to ``gateway/``.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, ClassVar

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway
from toy_line import ToyLinePlugin, registered

from gateway.config.loader import parse
from gateway.protocol.plugin import PluginEnv, PluginError, ProtocolPlugin, Role, ServerConnection
from gateway.runtime.gateway import Gateway

# -- a line server standing in for a service behind the proxy --------------------------------


class LineServer:
    """Answers each line with it in capitals; records connections and their ends."""

    def __init__(self) -> None:
        self.accepted = 0
        self.closed = 0
        self.port = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        buf = b""
        try:
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    await stream.send_all(line.upper() + b"\n")
        except trio.BrokenResourceError:
            pass
        finally:
            self.closed += 1

    async def serve(self, nursery: trio.Nursery) -> None:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), self.handle, 0
        )
        self.port = listener.socket.getsockname()[1]


def proxy_config(port: int, pool_size: int = 2) -> dict[str, Any]:
    return {
        "upstreams": [
            {"name": "caps", "protocol": "toyline", "connect": f"127.0.0.1:{port}"},
        ],
        "listeners": [
            {
                "name": "proxy",
                "protocol": "toyline",
                "bind": "127.0.0.1:0",
                "upstream": "caps",
                "pool_size": pool_size,
            }
        ],
    }


async def ask(gw: Gateway, *lines: bytes) -> list[bytes]:
    """Send ``lines`` through the proxy on one connection; the answers, in order."""
    stream = await trio.open_tcp_stream(*host_port(gw.addresses["proxy"][0]))
    async with stream:
        answers = []
        buf = b""
        for line in lines:
            await stream.send_all(line + b"\n")
            while b"\n" not in buf:
                buf += await stream.receive_some(65536)
            answer, buf = buf.split(b"\n", 1)
            answers.append(answer)
        return answers


# -- the upstream seam: a listener proxies to a pool of upstream connections -----------------


async def test_a_listener_proxies_frames_to_its_upstream_through_a_pool() -> None:
    server = LineServer()
    async with trio.open_nursery() as nursery:
        await server.serve(nursery)
        registry = registered(ToyLinePlugin)
        async with running_gateway(proxy_config(server.port), registry=registry) as gw:
            assert await ask(gw, b"hello", b"again") == [b"HELLO", b"AGAIN"]
            assert await ask(gw, b"second client") == [b"SECOND CLIENT"]
            # Both clients were served over one pooled upstream connection.
            assert server.accepted == 1
            plugin = gw.plugins["toyline"]
            assert isinstance(plugin, ToyLinePlugin)
            assert plugin.pools["caps"].opened == 1
        # Teardown closed the pooled connection.
        with trio.fail_after(5):
            while server.closed < 1:
                await trio.sleep(0.01)
        assert plugin.events == ["setup", "teardown"]
        nursery.cancel_scope.cancel()


async def test_concurrent_clients_share_at_most_pool_size_upstream_connections() -> None:
    server = LineServer()
    async with trio.open_nursery() as nursery:
        await server.serve(nursery)
        registry = registered(ToyLinePlugin)
        async with running_gateway(proxy_config(server.port, 2), registry=registry) as gw:
            answers: list[list[bytes]] = []

            async def client(n: int) -> None:
                answers.append(await ask(gw, *(f"c{n} m{i}".encode() for i in range(20))))

            async with trio.open_nursery() as clients:
                for n in range(6):
                    clients.start_soon(client, n)
            assert sorted(answers) == sorted(
                [f"C{n} M{i}".encode() for i in range(20)] for n in range(6)
            )
            assert 1 <= server.accepted <= 2
        nursery.cancel_scope.cancel()


class Grabbing(ToyLinePlugin):
    """Keeps the ServerConnection of each client instead of serving it."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[ServerConnection] = []

    async def serve(self, conn: ServerConnection) -> None:
        self.seen.append(conn)


async def a_connection(config: dict[str, Any], registry: Any) -> ServerConnection:
    """What ``serve`` gets for one client of the ``proxy`` listener."""
    server = LineServer()
    async with trio.open_nursery() as nursery:
        await server.serve(nursery)
        config["upstreams"][0]["connect"] = f"127.0.0.1:{server.port}"
        async with running_gateway(config, registry=registry) as gw:
            stream = await trio.open_tcp_stream(*host_port(gw.addresses["proxy"][0]))
            plugin = gw.plugins["toyline"]
            assert isinstance(plugin, Grabbing)
            with trio.fail_after(5):
                while not plugin.seen:
                    await trio.sleep(0.01)
            await stream.aclose()
        nursery.cancel_scope.cancel()
    return plugin.seen[0]


async def test_a_listener_reaches_only_upstreams_of_its_own_protocol() -> None:
    from gateway.runtime.registry import Registry, default_registry

    config = proxy_config(0)
    config["upstreams"].append({"name": "other", "protocol": "ndjson", "connect": "127.0.0.1:9"})
    base = registered(Grabbing)
    registry = Registry(
        {**base.protocols, "ndjson": default_registry().protocols["ndjson"]}, base.transports
    )
    conn = await a_connection(config, registry)
    assert conn.upstream("caps").name == "caps"
    with pytest.raises(LookupError, match=r"no toyline upstream named 'other'"):
        conn.upstream("other")
    with pytest.raises(LookupError, match=r"configured: caps"):
        conn.upstream("nope")


async def test_protocols_see_the_hub_facade_not_the_hub() -> None:
    hub = (await a_connection(proxy_config(0), registered(Grabbing))).hub
    for name in ("publish", "call", "subscribe", "info"):
        assert callable(getattr(hub, name))
    for name in ("close", "destination", "run", "wait_idle", "router"):
        assert not hasattr(hub, name), name


# -- lifecycle ------------------------------------------------------------------------------

LOG: list[str] = []


class Recorder(ProtocolPlugin):
    """Records setup, teardown, connections and its background task, per instance."""

    name = "alpha"
    roles: ClassVar[frozenset[Role]] = frozenset({"server"})

    def __init__(self) -> None:
        self.connections = 0
        self.env: PluginEnv | None = None

    async def setup(self, env: PluginEnv) -> None:
        self.env = env
        LOG.append(f"setup {self.name} listeners={[ls.name for ls in env.listeners]}")
        env.nursery.start_soon(self._background)

    async def _background(self) -> None:
        try:
            await trio.sleep_forever()
        finally:
            LOG.append(f"background {self.name} cancelled")

    async def teardown(self) -> None:
        LOG.append(f"teardown {self.name}")

    async def serve(self, conn: ServerConnection) -> None:
        self.connections += 1
        LOG.append(f"serve {self.name}")
        await conn.stream.send_all(b"hi\n")


class Beta(Recorder):
    name = "beta"


class FailingSetup(Recorder):
    name = "gamma"

    async def setup(self, env: PluginEnv) -> None:
        raise ValueError("cannot open the cache")


class FailingInit(Recorder):
    name = "gamma"

    def __init__(self) -> None:
        raise PluginError("no licence for gamma")


class FailingTeardown(Recorder):
    name = "beta"

    async def teardown(self) -> None:
        raise RuntimeError("teardown exploded")


def two_listeners(first: str = "alpha", second: str = "beta") -> dict[str, Any]:
    return {
        "listeners": [
            {"name": "a", "protocol": first, "bind": "127.0.0.1:0"},
            {"name": "b", "protocol": second, "bind": "127.0.0.1:0"},
        ]
    }


async def hello(gw: Gateway, listener: str) -> bytes:
    stream = await trio.open_tcp_stream(*host_port(gw.addresses[listener][0]))
    async with stream:
        data = b""
        while not data.endswith(b"\n"):
            chunk = await stream.receive_some(100)
            if not chunk:
                break
            data += chunk
        return data


async def test_setup_runs_in_name_order_before_serving_and_teardown_in_reverse() -> None:
    LOG.clear()
    async with running_gateway(two_listeners(), registry=registered(Recorder, Beta)) as gw:
        assert LOG == ["setup alpha listeners=['a']", "setup beta listeners=['b']"]
        assert await hello(gw, "a") == b"hi\n"
        assert await hello(gw, "b") == b"hi\n"
    assert LOG[2:4] == ["serve alpha", "serve beta"]
    # Teardown in reverse order, after serving; background tasks cancelled after it.
    assert LOG[4:] == [
        "teardown beta",
        "teardown alpha",
        "background alpha cancelled",
        "background beta cancelled",
    ] or LOG[4:] == [
        "teardown beta",
        "teardown alpha",
        "background beta cancelled",
        "background alpha cancelled",
    ]


async def test_two_gateways_in_one_process_get_their_own_plugin_instances() -> None:
    LOG.clear()
    registry = registered(Recorder, Beta)
    async with (
        running_gateway(two_listeners(), registry=registry) as one,
        running_gateway(two_listeners(), registry=registry) as two,
    ):
        assert one.plugins["alpha"] is not two.plugins["alpha"]
        for _ in range(3):
            await hello(one, "a")
        await hello(two, "a")
        first, second = one.plugins["alpha"], two.plugins["alpha"]
        assert isinstance(first, Recorder)
        assert isinstance(second, Recorder)
        assert (first.connections, second.connections) == (3, 1)
        assert first.env is not None
        assert second.env is not None
        assert first.env.hub is not second.env.hub
    assert LOG.count("setup alpha listeners=['a']") == 2
    assert LOG.count("teardown alpha") == 2


async def test_a_failing_setup_names_the_plugin_and_undoes_the_others() -> None:
    LOG.clear()
    config = parse(
        two_listeners("alpha", "gamma"),
        source="<test>",
        registry=registered(Recorder, FailingSetup),
    )
    gateway = Gateway(config, registered(Recorder, FailingSetup))
    with pytest.RaisesGroup(
        pytest.RaisesExc(
            PluginError,
            match=r"protocol plugin 'gamma' failed to set up: ValueError: cannot open the cache",
        ),
        flatten_subgroups=True,
    ):
        async with trio.open_nursery() as nursery:
            await nursery.start(gateway.run)
    # alpha was set up first and is torn down; nothing was bound.
    assert LOG[:2] == ["setup alpha listeners=['a']", "teardown alpha"]
    assert "background alpha cancelled" in LOG
    assert gateway.addresses == {}


async def test_a_failing_teardown_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    LOG.clear()
    with caplog.at_level(logging.ERROR, logger="gateway.runtime"):
        async with running_gateway(two_listeners(), registry=registered(Recorder, FailingTeardown)):
            pass
    assert "teardown alpha" in LOG
    assert any("protocol plugin 'beta': teardown failed" in r.getMessage() for r in caplog.records)


def test_gateway_run_reports_a_failing_setup_and_exits_1(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway import cli
    from gateway.config import loader as config_module

    registry = registered(Recorder, FailingSetup)
    monkeypatch.setattr(config_module, "default_registry", lambda: registry)
    monkeypatch.setattr("gateway.runtime.gateway.default_registry", lambda: registry)
    path = tmp_path / "gw.toml"
    path.write_text(
        '[[listeners]]\nname = "g"\nprotocol = "gamma"\nbind = "127.0.0.1:0"\n', encoding="utf-8"
    )
    messages: list[str] = []
    monkeypatch.setattr(cli.log, "error", lambda fmt, *a: messages.append(fmt % a))
    assert cli.main(["run", str(path)]) == 1
    assert messages == [
        "cannot start: protocol plugin 'gamma' failed to set up: ValueError: cannot open the cache"
    ]


def test_gateway_run_reports_a_plugin_that_cannot_be_made_and_exits_1(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Plugins are made when the gateway is: before it serves, so 'cannot start'."""
    from gateway import cli
    from gateway.config import loader as config_module

    registry = registered(Recorder, FailingInit)
    monkeypatch.setattr(config_module, "default_registry", lambda: registry)
    monkeypatch.setattr("gateway.runtime.gateway.default_registry", lambda: registry)
    path = tmp_path / "gw.toml"
    path.write_text(
        '[[listeners]]\nname = "g"\nprotocol = "gamma"\nbind = "127.0.0.1:0"\n', encoding="utf-8"
    )
    messages: list[str] = []
    monkeypatch.setattr(cli.log, "error", lambda fmt, *a: messages.append(fmt % a))
    assert cli.main(["run", str(path)]) == 1
    assert messages == ["cannot start: no licence for gamma"]


# -- ingress: a client role publishes what the remote sends, acked once safe ---------------


class RemoteLines:
    """A remote that sends lines to whoever connects and records the acks."""

    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines
        self.acks = 0
        self.port = 0
        self.peer = ""

    async def handle(self, stream: trio.SocketStream) -> None:
        await stream.send_all(b"".join(line + b"\n" for line in self.lines))
        buf = b""
        while True:
            data = await stream.receive_some(100)
            if not data:
                return
            buf += data
            self.acks = buf.count(b"ack\n")

    async def serve(self, nursery: trio.Nursery) -> None:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), self.handle, 0
        )
        self.port = listener.socket.getsockname()[1]


async def test_an_upstream_publishes_what_it_receives_and_acks_only_once_safe() -> None:
    remote = RemoteLines([f"line {i}".encode() for i in range(5)])
    async with trio.open_nursery() as nursery:
        await remote.serve(nursery)
        config = {
            "upstreams": [
                {
                    "name": "remote",
                    "protocol": "toyline",
                    "connect": f"127.0.0.1:{remote.port}",
                    "destination": "inbox",
                    "ingress": True,
                    "window": 2,
                }
            ],
            "destinations": [{"name": "inbox", "kind": "queue"}],
        }
        async with running_gateway(config, registry=registered(ToyLinePlugin)) as gw:
            sub = gw.hub.subscribe("inbox", max_unacked=10)
            with trio.fail_after(5):
                first = await sub.receive()
                while len(first) < 2:
                    first += await sub.receive()
            await trio.testing.wait_all_tasks_blocked()  # what would be read has been
            # Backpressure: two unanswered lines, so the third is not even read.
            assert [d.message.body for d in first] == [b"line 0", b"line 1"]
            assert gw.hub.info("inbox").kind == "queue"
            assert remote.acks == 0  # nothing is acked before the consumer took it
            source = first[0].message.source
            assert source is not None
            assert (source.protocol, source.upstream, source.listener) == ("toyline", "remote", "")
            assert source.peer == f"127.0.0.1:{remote.port}"
            for d in first:
                sub.ack(d.tag)
            rest = []
            with trio.fail_after(5):
                while len(rest) < 3:
                    batch = await sub.receive()
                    rest += batch
                    for d in batch:
                        sub.ack(d.tag)
                while remote.acks < 5:
                    await trio.sleep(0.01)
            assert [d.message.body for d in rest] == [b"line 2", b"line 3", b"line 4"]
        nursery.cancel_scope.cancel()
