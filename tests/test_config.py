"""The TOML config: validation, defaults, error messages, and ``gateway check``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import ClassVar

import pytest

from gateway.config.loader import Config, ConfigError, StoreSettings, default_config, load
from gateway.core.hub import HubLimits
from gateway.core.routing import Route
from gateway.protocol.plugin import Option, ProtocolPlugin, Role
from gateway.runtime.registry import Registered, Registry, default_registry

# -- a fake protocol registry ---------------------------------------------------------


class FakeProtocol(ProtocolPlugin):
    """Both roles, with listener and upstream options of every kind."""

    name = "fake"
    roles: ClassVar[frozenset[Role]] = frozenset({"server", "client"})
    default_port = 7000
    listener_options: ClassVar[dict[str, Option]] = {
        "destination_field": Option("str", "destination", "header naming the destination"),
        "max_frame": Option("size", 1024 * 1024, "largest frame", minimum=1024),
        "mode": Option("str", "fast", "ack mode", choices=("fast", "safe")),
        "ack_timeout": Option("duration", 5.0, "ack within"),
        "window": Option("int", 10, "frames in flight", minimum=1),
        "compress": Option("bool", False, "compress frames"),
        "tags": Option("str_list", [], "tags to add"),
    }
    upstream_options: ClassVar[dict[str, Option]] = {
        "batch_size": Option("int", 100, "messages per batch", minimum=1),
        "keepalive": Option("duration", 30.0, "ping interval"),
    }


class ClientOnly(ProtocolPlugin):
    name = "pull"
    roles: ClassVar[frozenset[Role]] = frozenset({"client"})


class ServerOnly(ProtocolPlugin):
    name = "push"
    roles: ClassVar[frozenset[Role]] = frozenset({"server"})


LISTENER_DEFAULTS = {name: opt.default for name, opt in FakeProtocol.listener_options.items()}
UPSTREAM_DEFAULTS = {name: opt.default for name, opt in FakeProtocol.upstream_options.items()}


def _registered(plugin: ProtocolPlugin) -> Registered:
    return Registered(
        plugin.name, f"tests.test_config:{type(plugin).__name__}", "tests", "0", plugin=plugin
    )


@pytest.fixture
def registry() -> Registry:
    protocols = {p.name: _registered(p) for p in (FakeProtocol(), ClientOnly(), ServerOnly())}
    protocols["broken"] = Registered(
        "broken", "missing.module:plugin", "broken-dist", "1.0", error="ImportError: no module"
    )
    return Registry(protocols=protocols, transports=default_registry().transports)


# -- helpers ----------------------------------------------------------------------------


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, Path]:
    """A CA, server and client certificate in ``tmp_path/certs``."""
    from gateway.config.certs import init_dir

    return init_dir(tmp_path / "certs")


def write(folder: Path, text: str, name: str = "gateway.toml") -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def config_errors(path: Path, registry: Registry) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(path, registry=registry)
    errors = info.value.errors
    assert str(info.value) == "\n".join(errors)
    return errors


def assert_error(errors: list[str], path: Path, key: str, fragment: str = "") -> str:
    """The error line for ``key``: it starts with the file and the key path."""
    prefix = f"{path}: {key}: " if key else f"{path}: "
    for line in errors:
        if line.startswith(prefix) and fragment.lower() in line.lower():
            return line
    raise AssertionError(f"no error {prefix!r}…{fragment!r} in:\n" + "\n".join(errors))


LISTENER = """
[[listeners]]
name = "in"
protocol = "fake"
bind = "127.0.0.1:5044"
"""

FULL = """
[gateway]
data_dir = "var/data"
drain_timeout = "30s"
log_level = "debug"
buffer_bytes = "16MiB"
buffer_messages = 5000
max_destinations = 100

[[listeners]]
name = "beats-tls"
protocol = "fake"
bind = "0.0.0.0:5044"
destination = "logs.beats"
max_connections = 50
handshake_timeout = "5s"
idle_timeout = "2m"
destination_field = "topic"
max_frame = "4MiB"

[listeners.tls]
cert = "certs/server.pem"
key = "certs/server.key"
client_ca = "certs/ca.pem"
client_auth = "required"
min_version = "1.3"

[[listeners]]
name = "local"
protocol = "fake"
bind = "unix:run/gateway.sock"

[[upstreams]]
name = "central"
protocol = "fake"
connect = ["10.0.0.1:5045", "central.example:5045"]
connect_timeout = "3s"
backoff_initial = "500ms"
backoff_max = "1m"
batch_size = 50

[upstreams.tls]
ca = "certs/ca.pem"
cert = "certs/client.pem"
key = "certs/client.key"
server_name = "localhost"

[[routes]]
from = "logs.*"
to = ["archive.{1}", "upstream:central"]

[[routes]]
from = "metrics"
to = "upstream:central"
"""


# -- valid configs --------------------------------------------------------------------


def test_full_config(tmp_path: Path, certs: dict[str, Path], registry: Registry) -> None:
    path = write(tmp_path, FULL)
    config = load(path, registry=registry)
    assert isinstance(config, Config)
    assert config.path == path

    gw = config.gateway
    assert gw.data_dir == tmp_path.resolve() / "var" / "data"
    assert gw.drain_timeout == 30.0
    assert gw.log_level == "debug"
    assert gw.limits == HubLimits(
        buffer_bytes=16 * 2**20, buffer_messages=5000, max_destinations=100
    )

    beats, local = config.listeners
    assert (beats.name, beats.protocol, beats.bind) == ("beats-tls", "fake", "0.0.0.0:5044")
    assert beats.destination == "logs.beats"
    assert beats.max_connections == 50
    assert beats.handshake_timeout == 5.0
    assert beats.idle_timeout == 120.0
    assert beats.options == {
        **LISTENER_DEFAULTS,
        "destination_field": "topic",
        "max_frame": 4 * 2**20,
    }
    assert beats.tls.cert == certs["server_cert"].resolve()
    assert beats.tls.key == certs["server_key"].resolve()
    assert beats.tls.client_ca == certs["ca_cert"].resolve()
    assert beats.tls.client_auth == "required"
    assert beats.tls.min_version == "1.3"

    assert (local.name, local.bind, local.destination) == (
        "local",
        "unix:run/gateway.sock",
        "local",
    )
    assert local.tls is None
    assert local.options == LISTENER_DEFAULTS

    (central,) = config.upstreams
    assert central.name == "central"
    assert central.protocol == "fake"
    assert central.connect == ["10.0.0.1:5045", "central.example:5045"]
    assert central.connect_timeout == 3.0
    assert central.handshake_timeout == 10.0
    assert (central.backoff_initial, central.backoff_max) == (0.5, 60.0)
    assert central.options == {**UPSTREAM_DEFAULTS, "batch_size": 50}
    assert central.tls.ca == certs["ca_cert"].resolve()
    assert central.tls.cert == certs["client_cert"].resolve()
    assert central.tls.server_name == "localhost"
    assert central.tls.verify is True

    assert config.routes == [
        Route("logs.*", ("archive.{1}", "upstream:central")),
        Route("metrics", ("upstream:central",)),
    ]


def test_empty_config_gets_defaults(tmp_path: Path, registry: Registry) -> None:
    config = load(write(tmp_path, ""), registry=registry)
    assert config.listeners == []
    assert config.upstreams == []
    assert config.routes == []
    assert config.gateway.data_dir == tmp_path.resolve() / "data"
    assert config.gateway.drain_timeout == 10.0
    assert config.gateway.log_level == "info"


def test_unset_limits_default_to_hub_limits(tmp_path: Path, registry: Registry) -> None:
    """Limits not in the file must be HubLimits' defaults (real numbers)."""
    config = load(write(tmp_path, "[gateway]\nbuffer_messages = 10\n"), registry=registry)
    limits = config.gateway.limits
    assert limits == HubLimits(buffer_messages=10)
    assert isinstance(limits.buffer_bytes, int)
    assert isinstance(limits.max_destinations, int)


def test_listener_defaults(tmp_path: Path, registry: Registry) -> None:
    (listener,) = load(write(tmp_path, LISTENER), registry=registry).listeners
    assert listener.destination == "in"
    assert listener.max_connections == 1024
    assert listener.handshake_timeout == 10.0
    assert listener.idle_timeout == 60.0
    assert listener.tls is None
    assert listener.options == LISTENER_DEFAULTS


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ('"10.0.0.1:5045"', ["10.0.0.1:5045"]),
        ('["a.example:1", "b.example:2"]', ["a.example:1", "b.example:2"]),
        ('["unix:/run/peer.sock"]', ["unix:/run/peer.sock"]),
    ],
)
def test_connect_as_string_or_list(
    tmp_path: Path, registry: Registry, value: str, expected: list[str]
) -> None:
    text = f'[[upstreams]]\nname = "up"\nprotocol = "fake"\nconnect = {value}\n'
    (up,) = load(write(tmp_path, text), registry=registry).upstreams
    assert up.connect == expected
    assert up.options == UPSTREAM_DEFAULTS


def test_upstream_only_protocol_is_fine_for_upstreams(tmp_path: Path, registry: Registry) -> None:
    text = '[[upstreams]]\nname = "up"\nprotocol = "pull"\nconnect = "h:1"\n'
    (up,) = load(write(tmp_path, text), registry=registry).upstreams
    assert up.protocol == "pull"


def test_plugin_options_are_converted(tmp_path: Path, registry: Registry) -> None:
    text = LISTENER + textwrap.dedent(
        """
        destination_field = "dst"
        max_frame = "2KiB"
        mode = "safe"
        ack_timeout = "250ms"
        window = 3
        compress = true
        tags = ["a", "b"]
        """
    )
    (listener,) = load(write(tmp_path, text), registry=registry).listeners
    assert listener.options == {
        "destination_field": "dst",
        "max_frame": 2048,
        "mode": "safe",
        "ack_timeout": 0.25,
        "window": 3,
        "compress": True,
        "tags": ["a", "b"],
    }


def test_relative_paths_resolve_against_config_folder(
    tmp_path: Path, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.config.certs import init_dir

    conf_dir = tmp_path / "etc" / "gateway"
    init_dir(conf_dir / "pki")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    text = LISTENER + textwrap.dedent(
        """
        [listeners.tls]
        cert = "pki/server.pem"
        key = "pki/server.key"

        [gateway]
        data_dir = "../../state"
        """
    )
    write(conf_dir, text)
    config = load(Path("..") / "etc" / "gateway" / "gateway.toml", registry=registry)
    (listener,) = config.listeners
    assert listener.tls.cert.resolve() == (conf_dir / "pki" / "server.pem").resolve()
    assert listener.tls.key.resolve() == (conf_dir / "pki" / "server.key").resolve()
    assert config.gateway.data_dir.resolve() == (tmp_path / "state").resolve()


def test_absolute_paths_are_kept(
    tmp_path: Path, certs: dict[str, Path], registry: Registry
) -> None:
    text = LISTENER + (
        f"[listeners.tls]\ncert = {str(certs['server_cert'])!r}\n"
        f"key = {str(certs['server_key'])!r}\n"
    )
    (listener,) = load(write(tmp_path / "conf", text), registry=registry).listeners
    assert listener.tls.cert == certs["server_cert"]


# -- errors ----------------------------------------------------------------------------


def test_unknown_top_level_key(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, "[gatway]\ndata_dir = 'x'\n")
    assert_error(config_errors(path, registry), path, "gatway", "unknown key")


def test_unknown_gateway_key(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, "[gateway]\ndrain_timout = '5s'\n")
    assert_error(config_errors(path, registry), path, "gateway.drain_timout", "unknown key")


def test_unknown_listener_key(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER + 'colour = "red"\n')
    errors = config_errors(path, registry)
    assert_error(errors, path, "listeners[0].colour", "unknown key")
    assert len(errors) == 1


def test_unknown_key_in_second_listener_names_its_index(tmp_path: Path, registry: Registry) -> None:
    text = LISTENER + LISTENER.replace('"in"', '"in2"').replace("5044", "5045") + "bnid = 1\n"
    path = write(tmp_path, text)
    assert_error(config_errors(path, registry), path, "listeners[1].bnid", "unknown key")


def test_unknown_tls_key(tmp_path: Path, certs: dict[str, Path], registry: Registry) -> None:
    text = LISTENER + (
        '[listeners.tls]\ncert = "certs/server.pem"\nkey = "certs/server.key"\nciphers = "x"\n'
    )
    path = write(tmp_path, text)
    assert_error(config_errors(path, registry), path, "listeners[0].tls.ciphers", "unknown key")


def test_unknown_upstream_and_route_keys(tmp_path: Path, registry: Registry) -> None:
    text = """
    [[upstreams]]
    name = "up"
    protocol = "fake"
    connect = "h:1"
    retries = 3

    [[routes]]
    from = "a"
    to = "b"
    via = "c"
    """
    path = write(tmp_path, text)
    errors = config_errors(path, registry)
    assert_error(errors, path, "upstreams[0].retries", "unknown key")
    assert_error(errors, path, "routes[0].via", "unknown key")


@pytest.mark.parametrize("missing", ["name", "protocol", "bind"])
def test_missing_required_listener_key(tmp_path: Path, registry: Registry, missing: str) -> None:
    lines = [line for line in LISTENER.splitlines() if not line.startswith(f"{missing} =")]
    path = write(tmp_path, "\n".join(lines) + "\n")
    assert_error(config_errors(path, registry), path, f"listeners[0].{missing}", "required")


@pytest.mark.parametrize("missing", ["name", "protocol", "connect"])
def test_missing_required_upstream_key(tmp_path: Path, registry: Registry, missing: str) -> None:
    keys = {"name": '"up"', "protocol": '"fake"', "connect": '"h:1"'}
    body = "".join(f"{k} = {v}\n" for k, v in keys.items() if k != missing)
    path = write(tmp_path, "[[upstreams]]\n" + body)
    assert_error(config_errors(path, registry), path, f"upstreams[0].{missing}", "required")


@pytest.mark.parametrize(
    "bind",
    [
        "localhost",
        "127.0.0.1:",
        "127.0.0.1:99999",
        "127.0.0.1:http",
        "::1:5044",
        "[::1]",
        "unix:",
        "",
    ],
)
def test_bad_bind_address(tmp_path: Path, registry: Registry, bind: str) -> None:
    path = write(tmp_path, LISTENER.replace('"127.0.0.1:5044"', repr(bind).replace("'", '"')))
    assert_error(config_errors(path, registry), path, "listeners[0].bind")


def test_bind_must_be_a_string(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER.replace('"127.0.0.1:5044"', "5044"))
    assert_error(config_errors(path, registry), path, "listeners[0].bind", "string")


@pytest.mark.parametrize("name", ["has space", "-dash-first", "x" * 65, "a/b", ""])
def test_bad_listener_name(tmp_path: Path, registry: Registry, name: str) -> None:
    path = write(tmp_path, LISTENER.replace('"in"', f'"{name}"'))
    assert_error(config_errors(path, registry), path, "listeners[0].name")


def test_duplicate_listener_names(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER + LISTENER.replace("5044", "5045"))
    errors = config_errors(path, registry)
    assert_error(errors, path, "listeners[1].name", "duplicate")
    assert len(errors) == 1


def test_duplicate_binds(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER + LISTENER.replace('"in"', '"other"'))
    errors = config_errors(path, registry)
    assert_error(errors, path, "listeners[1].bind", "duplicate")
    assert len(errors) == 1


def test_port_zero_binds_may_repeat_but_unix_paths_ending_in_zero_may_not(
    tmp_path: Path, registry: Registry
) -> None:
    any_port = LISTENER.replace('"127.0.0.1:5044"', '"127.0.0.1:0"')
    path = write(tmp_path, any_port + any_port.replace('"in"', '"other"'))
    assert [ls.bind for ls in load(path, registry).listeners] == ["127.0.0.1:0"] * 2
    unix = LISTENER.replace('"127.0.0.1:5044"', f'"unix:{tmp_path}/gw:0"')
    path = write(tmp_path, unix + unix.replace('"in"', '"other"'))
    errors = config_errors(path, registry)
    assert_error(errors, path, "listeners[1].bind", "duplicate")


def test_duplicate_reported_at_the_index_in_the_file(tmp_path: Path, registry: Registry) -> None:
    """An invalid listener before the duplicates must not shift the reported index."""
    broken = LISTENER.replace('"in"', '"first"').replace('"fake"', '"nope"')
    second = LISTENER.replace('"in"', '"dup"').replace("5044", "5045")
    third = LISTENER.replace('"in"', '"dup"').replace("5044", "5046")
    path = write(tmp_path, broken + second + third)
    errors = config_errors(path, registry)
    assert_error(errors, path, "listeners[0].protocol", "unknown protocol")
    assert_error(errors, path, "listeners[2].name", "duplicate")


def test_duplicate_upstream_names(tmp_path: Path, registry: Registry) -> None:
    up = '[[upstreams]]\nname = "up"\nprotocol = "fake"\nconnect = "h:1"\n'
    path = write(tmp_path, up + up)
    assert_error(config_errors(path, registry), path, "upstreams[1].name", "duplicate")


def test_unknown_protocol(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER.replace('"fake"', '"nope"'))
    line = assert_error(config_errors(path, registry), path, "listeners[0].protocol", "nope")
    assert "fake" in line, "the message lists the registered protocols"


def test_protocol_that_failed_to_load(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER.replace('"fake"', '"broken"'))
    line = assert_error(config_errors(path, registry), path, "listeners[0].protocol", "broken")
    assert "ImportError" in line


def test_protocol_without_server_role(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER.replace('"fake"', '"pull"'))
    assert_error(config_errors(path, registry), path, "listeners[0].protocol", "server")


def test_protocol_without_client_role(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, '[[upstreams]]\nname = "up"\nprotocol = "push"\nconnect = "h:1"\n')
    assert_error(config_errors(path, registry), path, "upstreams[0].protocol", "client")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("drain_timeout", '"soon"'),
        ("drain_timeout", '"-5s"'),
        ("drain_timeout", "-1"),
        ("drain_timeout", "true"),
        ("drain_timeout", "nan"),
    ],
)
def test_bad_duration(tmp_path: Path, registry: Registry, key: str, value: str) -> None:
    path = write(tmp_path, f"[gateway]\n{key} = {value}\n")
    assert_error(config_errors(path, registry), path, f"gateway.{key}")


def test_bad_listener_duration(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER + 'idle_timeout = "forever"\n')
    assert_error(config_errors(path, registry), path, "listeners[0].idle_timeout", "duration")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [('"big"', "size"), ('"64XB"', "size"), ("1.5", "size"), ('"512B"', "at least"), ("-1", "")],
)
def test_bad_size(tmp_path: Path, registry: Registry, value: str, fragment: str) -> None:
    path = write(tmp_path, f"[gateway]\nbuffer_bytes = {value}\n")
    assert_error(config_errors(path, registry), path, "gateway.buffer_bytes", fragment)


def test_bad_integer_and_choice(tmp_path: Path, registry: Registry) -> None:
    path = write(
        tmp_path,
        '[gateway]\nbuffer_messages = "many"\nlog_level = "verbose"\nmax_destinations = 0\n',
    )
    errors = config_errors(path, registry)
    assert_error(errors, path, "gateway.buffer_messages", "integer")
    assert_error(errors, path, "gateway.log_level", "verbose")
    assert_error(errors, path, "gateway.max_destinations", "at least")


def test_gateway_must_be_a_table(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, 'gateway = "yes"\n')
    assert_error(config_errors(path, registry), path, "gateway", "table")


def test_listeners_must_be_an_array_of_tables(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, '[listeners]\nname = "x"\n')
    assert_error(config_errors(path, registry), path, "listeners", "array")


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("destination_field", "5", "string"),
        ("max_frame", '"512B"', "at least"),
        ("max_frame", '"huge"', "size"),
        ("mode", '"slow"', "slow"),
        ("ack_timeout", '"later"', "duration"),
        ("window", '"10"', "integer"),
        ("window", "0", "at least"),
        ("compress", '"yes"', "true or false"),
        ("tags", '"a"', "list"),
        ("tags", "[1, 2]", "list"),
    ],
)
def test_plugin_options_are_type_checked(
    tmp_path: Path, registry: Registry, option: str, value: str, fragment: str
) -> None:
    path = write(tmp_path, LISTENER + f"{option} = {value}\n")
    errors = config_errors(path, registry)
    assert_error(errors, path, f"listeners[0].{option}", fragment)
    assert len(errors) == 1


def test_upstream_plugin_options_are_type_checked(tmp_path: Path, registry: Registry) -> None:
    text = '[[upstreams]]\nname = "up"\nprotocol = "fake"\nconnect = "h:1"\nbatch_size = 0\n'
    path = write(tmp_path, text)
    assert_error(config_errors(path, registry), path, "upstreams[0].batch_size", "at least")


def test_listener_option_is_unknown_on_an_upstream(tmp_path: Path, registry: Registry) -> None:
    text = '[[upstreams]]\nname = "up"\nprotocol = "fake"\nconnect = "h:1"\nmode = "safe"\n'
    path = write(tmp_path, text)
    assert_error(config_errors(path, registry), path, "upstreams[0].mode", "unknown key")


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("[]", "at least one"), ('"nohost"', ""), ('["h:1", "bad host:2"]', ""), ("[1]", "list")],
)
def test_bad_connect(tmp_path: Path, registry: Registry, value: str, fragment: str) -> None:
    path = write(tmp_path, f'[[upstreams]]\nname = "up"\nprotocol = "fake"\nconnect = {value}\n')
    assert_error(config_errors(path, registry), path, "upstreams[0].connect", fragment)


def test_route_to_unknown_upstream(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, '[[routes]]\nfrom = "logs.*"\nto = ["archive", "upstream:nowhere"]\n')
    assert_error(config_errors(path, registry), path, "routes[0].to", "nowhere")


def test_route_to_known_upstream(tmp_path: Path, registry: Registry) -> None:
    text = (
        '[[upstreams]]\nname = "central"\nprotocol = "fake"\nconnect = "h:1"\n'
        '[[routes]]\nfrom = "a"\nto = "upstream:central"\n'
    )
    config = load(write(tmp_path, text), registry=registry)
    assert config.routes == [Route("a", ("upstream:central",))]


@pytest.mark.parametrize("target", ["archive.{2}", "archive.{name}", "archive.{", "{}"])
def test_bad_route_template(tmp_path: Path, registry: Registry, target: str) -> None:
    path = write(tmp_path, f'[[routes]]\nfrom = "logs.*"\nto = "{target}"\n')
    assert_error(config_errors(path, registry), path, "routes[0].to")


@pytest.mark.parametrize(
    ("body", "key", "fragment"),
    [
        ('to = "x"', "routes[0].from", "required"),
        ('from = "x"', "routes[0].to", "required"),
        ('from = "x"\nto = []', "routes[0].to", "at least one"),
        ('from = 1\nto = "x"', "routes[0].from", "string"),
    ],
)
def test_bad_route(tmp_path: Path, registry: Registry, body: str, key: str, fragment: str) -> None:
    path = write(tmp_path, f"[[routes]]\n{body}\n")
    assert_error(config_errors(path, registry), path, key, fragment)


@pytest.mark.parametrize("client_auth", ["optional", "required"])
def test_client_auth_without_client_ca(
    tmp_path: Path, certs: dict[str, Path], registry: Registry, client_auth: str
) -> None:
    text = LISTENER + (
        '[listeners.tls]\ncert = "certs/server.pem"\nkey = "certs/server.key"\n'
        f'client_auth = "{client_auth}"\n'
    )
    path = write(tmp_path, text)
    assert_error(config_errors(path, registry), path, "listeners[0].tls.client_ca", "required")


def test_bad_client_auth_value(tmp_path: Path, certs: dict[str, Path], registry: Registry) -> None:
    text = LISTENER + (
        '[listeners.tls]\ncert = "certs/server.pem"\nkey = "certs/server.key"\n'
        'client_auth = "always"\n'
    )
    path = write(tmp_path, text)
    assert_error(config_errors(path, registry), path, "listeners[0].tls.client_auth", "always")


def test_tls_cert_file_missing(tmp_path: Path, certs: dict[str, Path], registry: Registry) -> None:
    text = LISTENER + '[listeners.tls]\ncert = "certs/missing.pem"\nkey = "certs/server.key"\n'
    path = write(tmp_path, text)
    line = assert_error(config_errors(path, registry), path, "listeners[0].tls")
    assert str(tmp_path.resolve() / "certs" / "missing.pem") in line


def test_tls_key_not_matching(tmp_path: Path, certs: dict[str, Path], registry: Registry) -> None:
    text = LISTENER + '[listeners.tls]\ncert = "certs/server.pem"\nkey = "certs/client.key"\n'
    path = write(tmp_path, text)
    line = assert_error(config_errors(path, registry), path, "listeners[0].tls")
    assert "client.key" in line


def test_tls_requires_cert_and_key(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER + "[listeners.tls]\nmin_version = '1.3'\n")
    errors = config_errors(path, registry)
    assert_error(errors, path, "listeners[0].tls.cert", "required")
    assert_error(errors, path, "listeners[0].tls.key", "required")


def test_upstream_tls_ca_missing(tmp_path: Path, registry: Registry) -> None:
    text = (
        '[[upstreams]]\nname = "up"\nprotocol = "fake"\nconnect = "h:1"\n'
        '[upstreams.tls]\nca = "nowhere/ca.pem"\n'
    )
    path = write(tmp_path, text)
    line = assert_error(config_errors(path, registry), path, "upstreams[0].tls")
    assert str(tmp_path.resolve() / "nowhere" / "ca.pem") in line


def test_invalid_toml_names_the_file(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, "[gateway\ndata_dir = 1\n")
    (line,) = config_errors(path, registry)
    assert line.startswith(f"{path}: ")
    assert "TOML" in line


def test_missing_file_names_the_file(tmp_path: Path, registry: Registry) -> None:
    path = tmp_path / "absent.toml"
    (line,) = config_errors(path, registry)
    assert line.startswith(f"{path}: ")


def test_several_errors_reported_together(tmp_path: Path, registry: Registry) -> None:
    text = """
    colour = "blue"

    [gateway]
    drain_timeout = "soon"

    [[listeners]]
    name = "in"
    protocol = "nope"
    bind = "nowhere"

    [[routes]]
    from = "x"
    to = "upstream:ghost"
    """
    path = write(tmp_path, text)
    errors = config_errors(path, registry)
    assert_error(errors, path, "colour", "unknown key")
    assert_error(errors, path, "gateway.drain_timeout")
    assert_error(errors, path, "listeners[0].protocol")
    assert_error(errors, path, "listeners[0].bind")
    assert_error(errors, path, "routes[0].to", "ghost")
    assert len(errors) == 5
    assert all(line.startswith(f"{path}: ") for line in errors)


# -- the command line ---------------------------------------------------------------------

FAKE_PLUGIN_MODULE = """
from gateway.protocol.plugin import Option, ProtocolPlugin


class Fake(ProtocolPlugin):
    name = "fake"
    roles = frozenset({"server", "client"})
    listener_options = {
        "destination_field": Option("str", "destination", "header naming the destination"),
        "max_frame": Option("size", 1048576, "largest frame", minimum=1024),
    }
    upstream_options = {"batch_size": Option("int", 100, "messages per batch", minimum=1)}


plugin = Fake()
"""


def run_check(config: Path, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(extra_path), env.get("PYTHONPATH", "")) if p
        )
    return subprocess.run(
        [sys.executable, "-m", "gateway", "check", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=config.parent,
        timeout=60,
        check=False,
    )


@pytest.fixture
def fake_plugin_path(tmp_path: Path) -> Path:
    """A folder that, on PYTHONPATH, registers the ``fake`` protocol by entry point."""
    site = tmp_path / "site"
    dist = site / "interchange_test_fake-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (site / "interchange_test_fake.py").write_text(FAKE_PLUGIN_MODULE, encoding="utf-8")
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: interchange-test-fake\nVersion: 0.0.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        "[interchange.protocols]\nfake = interchange_test_fake:plugin\n", encoding="utf-8"
    )
    return site


def test_cli_check_ok(tmp_path: Path) -> None:
    path = write(tmp_path, '[gateway]\ndrain_timeout = "5s"\n[[routes]]\nfrom = "a"\nto = "b"\n')
    result = run_check(path)
    assert result.returncode == 0, result.stderr
    assert "OK" in result.stdout
    assert result.stderr == ""


def test_cli_check_full_config_with_plugin(
    tmp_path: Path, certs: dict[str, Path], fake_plugin_path: Path
) -> None:
    path = write(tmp_path, FULL)
    result = run_check(path, fake_plugin_path)
    assert result.returncode == 0, result.stderr
    assert "OK (2 listeners, 1 upstreams, 2 routes)" in result.stdout


def test_cli_check_reports_file_and_key_path(tmp_path: Path, fake_plugin_path: Path) -> None:
    path = write(tmp_path, LISTENER.replace('"127.0.0.1:5044"', '"localhost"') + "extra = 1\n")
    result = run_check(path, fake_plugin_path)
    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert any(line.startswith(f"{path}: listeners[0].bind: ") for line in lines), result.stderr
    assert any(line.startswith(f"{path}: listeners[0].extra: ") for line in lines), result.stderr
    assert "Traceback" not in result.stderr


def test_cli_check_unknown_key(tmp_path: Path) -> None:
    path = write(tmp_path, "[gateway]\nlog_levle = 'debug'\n")
    result = run_check(path)
    assert result.returncode == 1
    assert f"{path}: gateway.log_levle: unknown key" in result.stderr


def test_cli_check_invalid_toml(tmp_path: Path) -> None:
    path = write(tmp_path, "this is not toml\n")
    result = run_check(path)
    assert result.returncode == 1
    assert str(path) in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_check_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    result = run_check(path)
    assert result.returncode == 1
    assert str(path) in result.stderr


# -- [[destinations]] ---------------------------------------------------------------------


def test_destinations_are_read_in_order_with_their_keys(tmp_path: Path, registry: Registry) -> None:
    path = write(
        tmp_path,
        """
        [[destinations]]
        name = "jobs"
        kind = "queue"
        buffer_bytes = "1MiB"

        [[destinations]]
        name = "audit.*"
        retain = "64MiB"
        overflow = "drop_oldest"
        groups = ["archiver", "indexer"]

        [[destinations]]
        name = "frames"
        element_size = 16
        retain = "16KiB"
        """,
    )
    config = load(path, registry=registry)
    jobs, audit, frames = config.destinations
    assert (jobs.name, jobs.kind, jobs.retain, jobs.buffer_bytes) == ("jobs", "queue", None, 2**20)
    assert (audit.retain, audit.overflow, audit.groups) == (
        64 * 2**20,
        "drop_oldest",
        ("archiver", "indexer"),
    )
    assert audit.is_glob
    assert (frames.element_size, frames.retain, frames.overflow) == (16, 16 * 1024, "block")


@pytest.mark.parametrize(
    ("entry", "key", "fragment"),
    [
        ('kind = "stream"', "destinations[0].kind", "must be one of"),
        ('retain = "1KB"', "destinations[0].retain", "at least"),
        ('overflow = "drop_oldest"', "destinations[0].overflow", "logs only"),
        ('retain = "1MiB"\nbuffer_bytes = "1MiB"', "destinations[0].buffer_bytes", "retain"),
        ('kind = "queue"\ngroups = ["a"]', "destinations[0].groups", "one group"),
        ('groups = ["bad name"]', "destinations[0].groups", "not a valid name"),
        ("element_size = 0", "destinations[0].element_size", "at least"),
        ('element_size = 4096\nbuffer_bytes = "4KiB"', "destinations[0].element_size", "fit"),
        ('store = "segments"', "destinations[0].store", "must be one of 'embedded'"),
        ("partitions = 2", "destinations[0].partitions", "set 'store'"),
        ('retain_age = "1h"', "destinations[0].retain_age", "set 'store'"),
        ('store = "embedded"\npartitions = 0', "destinations[0].partitions", "at least"),
        ('store = "embedded"\npartition_key = "k"', "destinations[0].partition_key", "above 1"),
        ('store = "embedded"\nbuffer_bytes = "1MiB"', "destinations[0].buffer_bytes", "retain"),
        ("colour = 1", "destinations[0].colour", "unknown key"),
    ],
)
def test_destination_errors_name_the_key(
    tmp_path: Path, registry: Registry, entry: str, key: str, fragment: str
) -> None:
    path = write(tmp_path, '[[destinations]]\nname = "d"\n' + entry + "\n")
    assert_error(config_errors(path, registry), path, key, fragment)


def test_durable_destinations_and_the_store_table(tmp_path: Path, registry: Registry) -> None:
    path = write(
        tmp_path,
        """
        [store]
        fsync = "always"
        fsync_interval = "20ms"
        chunk_bytes = "1MiB"
        retain_bytes = "2GiB"
        retain_age = "7d"

        [[destinations]]
        name = "logs"
        store = "embedded"
        partitions = 4
        partition_key = "host"

        [[destinations]]
        name = "audit"
        store = "embedded"
        retain = "1MiB"
        retain_age = "1h"
        """,
    )
    config = load(path, registry=registry)
    assert config.store == StoreSettings("always", 0.02, 2**20, 2 * 2**30, 7 * 86400.0)
    logs, audit = config.destinations
    assert (logs.store, logs.partitions, logs.partition_key) == ("embedded", 4, "host")
    # The store's defaults fill what an entry leaves out.
    assert (logs.retain, logs.retain_age) == (2 * 2**30, 7 * 86400.0)
    assert (audit.retain, audit.retain_age, audit.partitions) == (2**20, 3600.0, 1)
    assert load(write(tmp_path, ""), registry=registry).store == StoreSettings()


@pytest.mark.parametrize(
    ("entry", "key", "fragment"),
    [
        ('fsync = "sometimes"', "store.fsync", "must be one of"),
        ('chunk_bytes = "1KiB"', "store.chunk_bytes", "at least"),
        ("colour = 1", "store.colour", "unknown key"),
    ],
)
def test_store_errors_name_the_key(
    tmp_path: Path, registry: Registry, entry: str, key: str, fragment: str
) -> None:
    path = write(tmp_path, "[store]\n" + entry + "\n")
    assert_error(config_errors(path, registry), path, key, fragment)


def test_destination_names_must_be_unique_and_not_upstreams(
    tmp_path: Path, registry: Registry
) -> None:
    path = write(
        tmp_path,
        """
        [[destinations]]
        kind = "queue"
        [[destinations]]
        name = "d"
        [[destinations]]
        name = "d"
        [[destinations]]
        name = "upstream:x"
        """,
    )
    errors = config_errors(path, registry)
    assert_error(errors, path, "destinations[0].name", "required")
    assert_error(errors, path, "destinations[2].name", "duplicate")
    assert_error(errors, path, "destinations[3].name", "upstream destinations")


def test_gateway_check_knows_destinations(tmp_path: Path) -> None:
    path = write(tmp_path, '[[destinations]]\nname = "q"\nkind = "queu"\n')
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "check", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 1
    assert f"{path}: destinations[0].kind:" in result.stderr


def test_the_embedded_default_publishes_into_queues() -> None:
    """What the default listeners publish waits for a consumer, so senders are acked
    only once somebody took each message."""
    config = default_config()
    destinations = {ls.destination for ls in config.listeners}
    assert destinations
    assert [(d.name, d.kind) for d in config.destinations] == [
        *((name, "queue") for name in sorted(destinations)),
        ("alerts", "topic"),
    ]
    assert all(d.store == "embedded" for d in config.destinations)
