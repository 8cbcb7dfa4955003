"""Transports and layers as plugins: a made-up ``toy://`` transport (``tests/toy_transport.py``)
with its own handshake and framing carries ndjson listeners and upstreams, and the TLS layer
is found by its role, so a third party's layer replaces the built-in one."""

from __future__ import annotations

import functools
import logging
import ssl
import textwrap
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from toy_transport import CLIENT_HELLO, ToyStream, ToyTransport, toy_registered
from waits import subscribed

import gateway.cli
import gateway.config.loader
from gateway.config.certs import init_dir
from gateway.config.loader import ConfigError, parse
from gateway.core.model import PeerIdentity
from gateway.runtime.registry import Registered, Registry, default_registry
from gateway.transports import SocketTransport, Transport
from gateway.transports.tls import TlsLayer
from gateway.transports.tls import transport as builtin_tls

# -- registries -------------------------------------------------------------------------


class CountingTls(TlsLayer):
    """A third party's TLS: the built-in one, counting its handshakes."""

    name = "counting-tls"
    role = "tls"

    def __init__(self) -> None:
        self.server_handshakes = 0
        self.client_handshakes = 0

    async def wrap_server(
        self, stream: trio.abc.Stream, context: ssl.SSLContext
    ) -> tuple[trio.abc.Stream, PeerIdentity | None]:
        self.server_handshakes += 1
        return await super().wrap_server(stream, context)

    async def wrap_client(
        self, stream: trio.abc.Stream, context: ssl.SSLContext, server_hostname: str | None
    ) -> tuple[trio.abc.Stream, PeerIdentity | None]:
        self.client_handshakes += 1
        return await super().wrap_client(stream, context, server_hostname)


def third_party(name: str, plugin: Any, distribution: str = "interchange-extra") -> Registered:
    return Registered(name, f"extra:{name}", distribution, "1.0", plugin=plugin)


def make_registry(*extra: Registered) -> Registry:
    """The installed protocols and transports, plus ``extra`` registrations."""
    installed = default_registry()
    return Registry(
        protocols=installed.protocols,
        transports=dict(installed.transports) | {r.name: r for r in extra},
    )


@pytest.fixture
def toy() -> ToyTransport:
    return ToyTransport()


@pytest.fixture
def registry(toy: ToyTransport) -> Registry:
    return make_registry(toy_registered(toy))


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return init_dir(tmp_path_factory.mktemp("certs"))


def toy_listener(**extra: Any) -> dict[str, Any]:
    return {
        "name": "toy",
        "protocol": "ndjson",
        "bind": "toy://127.0.0.1:0",
        "destination": "logs",
    } | extra


QUEUE = {"destinations": [{"name": "logs", "kind": "queue"}]}


async def toy_client(address: str, transport: Transport | None = None) -> NdjsonClient:
    """An ndjson client speaking the toy transport: its ``connect``, then ``connected``."""
    transport = transport or ToyTransport()
    stream = await transport.connect(address)
    return NdjsonClient(await transport.connected(stream, address))


# -- the Transport API --------------------------------------------------------------------


def test_socket_transport_is_still_importable_as_the_transport_base() -> None:
    assert SocketTransport is Transport
    tcp = default_registry().transport_for("127.0.0.1:1")
    assert isinstance(tcp, SocketTransport)
    assert (tcp.name, tcp.fallback, tcp.handshakes) == ("tcp", True, False)


def test_a_transport_claims_its_url_schemes(registry: Registry, toy: ToyTransport) -> None:
    assert registry.transport_for("toy://127.0.0.1:7000") is toy
    assert registry.transport_for("TOY://h:1") is toy  # schemes are case-insensitive
    assert registry.transport_for("toy:7000").name == "tcp"  # a host called toy, not the scheme
    assert registry.transport_for("127.0.0.1:7000").name == "tcp"
    assert registry.transport_for("unix:/run/x.sock").name == "unix"
    assert toy.schemes == ("toy",)
    assert toy.handshakes
    with pytest.raises(LookupError, match=r"no transport handles zz:// addresses.*toy, unix"):
        registry.transport_for("zz://127.0.0.1:80/x")


def test_two_third_party_transports_for_one_scheme_are_an_error() -> None:
    registry = make_registry(
        toy_registered(), third_party("toy2", ToyTransport(), "interchange-toy-fork")
    )
    with pytest.raises(LookupError, match=r"'toy'.*interchange-toy.*'toy2'.*interchange-toy-fork"):
        registry.transport_for("toy://127.0.0.1:1")


def test_a_transport_registered_as_a_class_is_instantiated_once() -> None:
    registry = make_registry(
        Registered(
            "toy", "toy_transport:ToyTransport", "interchange-toy", "0.1", plugin=ToyTransport
        )
    )
    first = registry.transport_for("toy://a:1")
    assert isinstance(first, ToyTransport)
    assert registry.transport_for("toy://b:2") is first


def test_server_names_come_from_the_address() -> None:
    installed = default_registry()
    assert ToyTransport().server_name("toy://example.org:7000") == "example.org"
    assert ToyTransport().server_name("toy://[::1]:7000") == "::1"
    assert installed.transport_for("[::1]:1").server_name("[::1]:1") == "::1"
    assert installed.transport_for("unix:/x").server_name("unix:/x") is None


# -- listeners and upstreams over the toy transport --------------------------------------


async def test_ndjson_listener_on_a_toy_url_serves_pub_sub(
    registry: Registry, toy: ToyTransport
) -> None:
    config = {"listeners": [toy_listener()], **QUEUE}
    async with running_gateway(config, registry=registry) as gw:
        [address] = gw.addresses["toy"]
        assert address.startswith("toy://127.0.0.1:")
        assert host_port(address.removeprefix("toy://"))[1] != 0
        sub = await toy_client(address)
        await sub.subscribe("logs")
        pub = await toy_client(address)
        [ident] = await pub.publish_nowait([b"through the toy"])
        delivery = await sub.receive()
        assert delivery.body == b"through the toy"
        await sub.ack(delivery.tag)
        [answer] = await pub.wait_answers([ident])
        assert answer.status == "delivered"
        # Both directions really went through toy frames.
        for client in (sub, pub):
            assert isinstance(client.stream, ToyStream)
            assert client.stream.frames_received >= 1
        assert toy.handshakes_done == 2
        await sub.aclose()
        await pub.aclose()


async def test_plain_ndjson_on_a_toy_port_is_refused(
    registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes that skip the toy's handshake never reach ndjson; the listener goes on."""
    caplog.set_level(logging.INFO)
    async with running_gateway({"listeners": [toy_listener()]}, registry=registry) as gw:
        [address] = gw.addresses["toy"]
        plain = await trio.open_tcp_stream(*host_port(address.removeprefix("toy://")))
        await plain.send_all(b'{"op":"ping"}\n')
        with trio.fail_after(5):
            received = b""
            while chunk := await plain.receive_some():
                received += chunk
        assert b"pong" not in received
        assert "toy handshake failed: toy: expected" in caplog.text
        assert f"[toy 127.0.0.1:{plain.socket.getsockname()[1]}]" in caplog.text
        client = await toy_client(address)
        await client.publish_nowait([b"still serving"])
        await client.aclose()


async def test_upstream_over_the_toy_transport_acks_end_to_end(registry: Registry) -> None:
    """ndjson publisher → gateway A → upstream connect = "toy://…" → gateway B → subscriber."""
    async with running_gateway({"listeners": [toy_listener()]}, registry=registry) as b:
        [b_addr] = b.addresses["toy"]
        config_a = {
            "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
            "upstreams": [{"name": "b", "protocol": "ndjson", "connect": b_addr}],
            "routes": [{"from": "logs", "to": ["upstream:b"]}],
        }
        async with running_gateway(config_a, registry=registry) as a:
            sub = await toy_client(b_addr)
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


async def test_a_handshake_that_never_completes_is_closed_after_the_timeout(
    registry: Registry, caplog: pytest.LogCaptureFixture, autojump_clock: trio.abc.Clock
) -> None:
    """It runs in the connection's task: meanwhile others connect; then only it is closed."""
    caplog.set_level(logging.INFO)
    config = {"listeners": [toy_listener(handshake_timeout="20s")], **QUEUE}
    async with running_gateway(config, registry=registry) as gw:
        [address] = gw.addresses["toy"]
        started = trio.current_time()
        silent = await trio.open_tcp_stream(*host_port(address.removeprefix("toy://")))
        await silent.send_all(CLIENT_HELLO[:4])  # and never the rest
        good = await toy_client(address)
        [ident] = await good.publish_nowait([b"meanwhile"])
        assert trio.current_time() - started < 20  # not held up by the silent one
        with trio.fail_after(60):
            assert await silent.receive_some() == b""
        assert 20 <= trio.current_time() - started < 60
        assert "toy handshake timed out; closing" in caplog.text
        # The listener and the good connection go on.
        tap = gw.hub.subscribe("logs", "g")
        [delivery] = await tap.receive()
        assert delivery.message.body == b"meanwhile"
        tap.ack(delivery.tag)
        [answer] = await good.wait_answers([ident])
        assert answer.status == "delivered"
        late = await toy_client(address)
        await late.aclose()
        await good.aclose()
        await silent.aclose()
        tap.close()


async def test_an_upstream_handshake_failure_is_a_failed_attempt(
    registry: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that answers the wrong greeting: the upstream reports it and retries."""
    caplog.set_level(logging.WARNING)

    async def wrong_greeting(stream: trio.SocketStream) -> None:
        await stream.receive_some()
        await stream.send_all(b"HTTP/1.1 400 Nope\r\n\r\n")

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(
            functools.partial(trio.serve_tcp, wrong_greeting, 0, host="127.0.0.1")
        )
        port = listener.socket.getsockname()[1]
        config = {
            "upstreams": [
                {
                    "name": "b",
                    "protocol": "ndjson",
                    "connect": f"toy://127.0.0.1:{port}",
                    "backoff_initial": "50ms",
                }
            ]
        }
        async with running_gateway(config, registry=registry):
            with trio.fail_after(5):
                while "toy handshake failed: toy: expected" not in caplog.text:
                    await trio.sleep(0.02)
        nursery.cancel_scope.cancel()


# -- gateway check ------------------------------------------------------------------------


def check(tmp_path: Path, toml: str, monkeypatch: pytest.MonkeyPatch, registry: Registry) -> Any:
    """Run ``gateway check`` in-process with ``registry`` as the installed plugins."""
    path = tmp_path / "gateway.toml"
    path.write_text(textwrap.dedent(toml))
    monkeypatch.setattr(gateway.config.loader, "default_registry", lambda: registry)
    return gateway.cli.main(["check", str(path)])


def test_gateway_check_accepts_a_toy_bind(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    registry: Registry,
    capsys: pytest.CaptureFixture[str],
) -> None:
    toml = """
        [[listeners]]
        name = "toy"
        protocol = "ndjson"
        bind = "toy://127.0.0.1:7000"

        [[upstreams]]
        name = "central"
        protocol = "ndjson"
        connect = ["toy://central.example:7000", "10.0.0.2:7070"]
    """
    assert check(tmp_path, toml, monkeypatch, registry) == 0
    assert "OK (1 listeners, 1 upstreams" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("bind", "message"),
    [
        ("toy://127.0.0.1", "toy addresses look like toy://HOST:PORT"),
        ("toy://127.0.0.1:99999", "toy port must be a number 0..65535, not '99999'"),
        ("toy://h:1/path", "no path"),
        ("zz://127.0.0.1:80", "no transport handles zz:// addresses"),
    ],
)
def test_gateway_check_reports_a_bad_toy_bind_with_the_transports_message(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    registry: Registry,
    capsys: pytest.CaptureFixture[str],
    bind: str,
    message: str,
) -> None:
    toml = f"""
        [[listeners]]
        name = "toy"
        protocol = "ndjson"
        bind = "{bind}"
    """
    assert check(tmp_path, toml, monkeypatch, registry) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'gateway.toml'}: listeners[0].bind: " in err
    assert message in err


def test_metrics_cannot_bind_a_transport_with_a_handshake(registry: Registry) -> None:
    with pytest.raises(ConfigError, match=r"metrics\.bind: .*toy transport has a handshake"):
        parse({"metrics": {"bind": "toy://127.0.0.1:0"}}, registry=registry)


# -- layers by role -----------------------------------------------------------------------


def test_the_builtin_layer_has_the_tls_role() -> None:
    layer = default_registry().layer_for("tls")
    assert layer is builtin_tls
    assert (layer.name, layer.role) == ("tls", "tls")
    assert default_registry().layer("tls") is layer  # by name still works
    with pytest.raises(LookupError, match="no transport layer has the role 'zstd'"):
        default_registry().layer_for("zstd")


def test_a_third_party_layer_wins_its_role_over_the_builtin_one() -> None:
    counting = CountingTls()
    registry = make_registry(third_party("counting-tls", counting))
    assert registry.layer_for("tls") is counting
    assert registry.layer("tls") is builtin_tls


def test_two_third_party_layers_with_one_role_are_an_error(
    tmp_path: Path, certs: dict[str, Path]
) -> None:
    registry = make_registry(
        third_party("counting-tls", CountingTls(), "interchange-counting"),
        third_party("other-tls", CountingTls(), "interchange-other"),
    )
    expected = r"'counting-tls' \(interchange-counting 1.0\) and 'other-tls' \(interchange-other"
    with pytest.raises(LookupError, match=rf"the layer role 'tls' is claimed by both {expected}"):
        registry.layer_for("tls")
    listener = toy_listener(
        bind="127.0.0.1:0", tls={"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    )
    with pytest.raises(ConfigError, match=rf"listeners\[0\]\.tls: .*{expected}"):
        parse({"listeners": [listener]}, registry=registry)


async def test_a_third_party_tls_layer_is_the_one_used(certs: dict[str, Path]) -> None:
    counting = CountingTls()
    registry = make_registry(third_party("counting-tls", counting))
    tls = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    config = {"listeners": [toy_listener(name="secure", bind="127.0.0.1:0", tls=tls)], **QUEUE}
    async with running_gateway(config, registry=registry) as gw:
        tcp = await trio.open_tcp_stream(*host_port(gw.addresses["secure"][0]))
        ctx = ssl.create_default_context(cafile=str(certs["ca_cert"]))
        stream = trio.SSLStream(tcp, ctx, server_hostname="localhost")
        await stream.do_handshake()
        client = NdjsonClient(stream)
        [ident] = await client.publish_nowait([b"secret"])
        tap = gw.hub.subscribe("logs", "g")
        [delivery] = await tap.receive()
        tap.ack(delivery.tag)
        assert (await client.wait_answers([ident]))[0].status == "delivered"
        await client.aclose()
    assert counting.server_handshakes == 1


async def test_tls_then_the_toy_handshake_on_both_sides(
    certs: dict[str, Path], toy: ToyTransport
) -> None:
    """A toy listener and upstream with ``tls`` tables: TLS first, then the toy greeting,
    through the third party's layer; the server name comes from the ``toy://`` address."""
    counting = CountingTls()
    registry = make_registry(toy_registered(toy), third_party("counting-tls", counting))
    server_tls = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    async with running_gateway(
        {"listeners": [toy_listener(tls=server_tls)]}, registry=registry
    ) as b:
        [b_addr] = b.addresses["toy"]
        config_a = {
            "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
            "upstreams": [
                {
                    "name": "b",
                    "protocol": "ndjson",
                    "connect": b_addr,
                    "tls": {"ca": str(certs["ca_cert"])},
                }
            ],
            "routes": [{"from": "logs", "to": ["upstream:b"]}],
        }
        tap = b.hub.subscribe("logs", "g")
        async with running_gateway(config_a, registry=registry) as a:
            pub = await NdjsonClient.connect(*host_port(a.addresses["nd"][0]))
            [ident] = await pub.publish_nowait([b"wrapped twice"], "logs")
            [delivery] = await tap.receive()
            assert delivery.message.body == b"wrapped twice"
            tap.ack(delivery.tag)
            assert (await pub.wait_answers([ident]))[0].status == "delivered"
            await pub.aclose()
        tap.close()
    assert (counting.server_handshakes, counting.client_handshakes) == (1, 1)
    assert toy.handshakes_done == 1


# -- gateway plugins ----------------------------------------------------------------------


def test_gateway_plugins_shows_schemes_and_roles(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = make_registry(toy_registered(), third_party("counting-tls", CountingTls()))
    monkeypatch.setattr(gateway.cli, "default_registry", lambda: registry)
    assert gateway.cli.main(["plugins"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line}
    assert lines["toy"].split()[1:] == ["transport", "interchange-toy", "0.1", "schemes", "toy"]
    assert lines["unix"].endswith("schemes unix")
    assert lines["tcp"].endswith("host:port")
    assert lines["counting-tls"].endswith("role tls")
    assert lines["tls"].endswith("role tls (replaced by counting-tls)")
