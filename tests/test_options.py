"""Nested plugin options: ``table``/``tables``/``upstream`` kinds, checked with full key paths."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest
from test_config import config_errors
from test_config import write as write_config

from gateway.config.loader import Config, load
from gateway.protocol.options import REQUIRED, Option
from gateway.protocol.plugin import ProtocolPlugin, Role
from gateway.runtime.registry import Registered, Registry, default_registry

# -- fake protocols ---------------------------------------------------------------------


def _unique_matches(services: list[dict[str, Any]]) -> None:
    seen: set[str] = set()
    for service in services:
        if service["match"] in seen:
            raise ValueError(f"match {service['match']!r} appears twice")
        seen.add(service["match"])


def _burst_covers_max_calls(limits: dict[str, Any]) -> None:
    if limits["burst"] < limits["max_calls"]:
        raise ValueError(f"burst must be at least max_calls ({limits['max_calls']})")


RETRY = {
    "attempts": Option("int", 3, "calls before giving up", minimum=1, maximum=10),
    "backoff": Option("duration", 0.1, "pause between calls"),
}
SERVICE = {
    "match": Option("str", REQUIRED, "service name pattern"),
    "upstream": Option("upstream", REQUIRED, "upstream serving it"),
    "timeout": Option("duration", 5.0, "per-call timeout"),
    "retry": Option("table", None, "retry failed calls", fields=RETRY),
}
HEADER = {
    "name": Option("str", REQUIRED, "header name"),
    "value": Option("str", "", "header value"),
}
LIMITS = {
    "max_calls": Option("int", 100, "calls in flight", minimum=1),
    "burst": Option("int", 200, "calls accepted at once", minimum=1),
    "headers": Option("tables", [], "headers added to each call", fields=HEADER),
}
OVERRIDE = {
    "key": Option("str", REQUIRED, "metadata key"),
    "value": Option("str", REQUIRED, "metadata value"),
}
METHOD = {
    "name": Option("str", REQUIRED, "method name"),
    "weight": Option("int", 1, "share of calls", minimum=1),
    "overrides": Option("tables", [], "metadata to set", fields=OVERRIDE),
}


class Ttrpc(ProtocolPlugin):
    """A transparent proxy routing by service name, as the ttrpc protocol will."""

    name = "ttrpc"
    roles: ClassVar[frozenset[Role]] = frozenset({"server", "client"})
    listener_options: ClassVar[dict[str, Option]] = {
        "services": Option(
            "tables", [], "routes by service name", fields=SERVICE, check=_unique_matches
        ),
        "limits": Option(
            "table", None, "call limits", fields=LIMITS, check=_burst_covers_max_calls
        ),
    }
    upstream_options: ClassVar[dict[str, Option]] = {
        "fallback": Option("upstream", None, "upstream to try when this one is down"),
        "methods": Option("tables", [], "per-method settings", fields=METHOD),
    }


class Ndjson(ProtocolPlugin):
    name = "ndjson"
    roles: ClassVar[frozenset[Role]] = frozenset({"server", "client"})


class Strict(ProtocolPlugin):
    """Required tables: a listener of it must write both."""

    name = "strict"
    roles: ClassVar[frozenset[Role]] = frozenset({"server"})
    listener_options: ClassVar[dict[str, Option]] = {
        "auth": Option(
            "table",
            REQUIRED,
            "credentials",
            fields={"user": Option("str", REQUIRED, "user"), "realm": Option("str", "x", "")},
        ),
        "rules": Option(
            "tables", REQUIRED, "rules", fields={"allow": Option("str", REQUIRED, "pattern")}
        ),
    }


@pytest.fixture
def registry() -> Registry:
    protocols = {
        p.name: Registered(p.name, f"tests.test_options:{type(p).__name__}", "tests", "0", plugin=p)
        for p in (Ttrpc(), Ndjson(), Strict())
    }
    return Registry(protocols=protocols, transports=default_registry().transports)


# -- helpers ------------------------------------------------------------------------------


def write(folder: Path, text: str, name: str = "gw.toml") -> Path:
    return write_config(folder, text, name)


def only_error(path: Path, registry: Registry) -> str:
    """The one error of the file at ``path``, without the ``<file>: `` prefix."""
    errors = config_errors(path, registry)
    assert len(errors) == 1, errors
    prefix = f"{path}: "
    assert errors[0].startswith(prefix), errors
    return errors[0][len(prefix) :]


def without_file(path: Path, errors: list[str]) -> list[str]:
    prefix = f"{path}: "
    assert all(line.startswith(prefix) for line in errors), errors
    return [line[len(prefix) :] for line in errors]


UPSTREAM = """
[[upstreams]]
name = "shim"
protocol = "ttrpc"
connect = "unix:/run/shim.sock"
"""

LISTENER = """
[[listeners]]
name = "proxy"
protocol = "ttrpc"
bind = "unix:/run/proxy.sock"
"""

EXAMPLE = (
    UPSTREAM
    + LISTENER
    + """
[[listeners.services]]
match = "containerd.task.v2.*"
upstream = "shim"
"""
)


def service(match: str, upstream: str = "shim", extra: str = "") -> str:
    return f'\n[[listeners.services]]\nmatch = "{match}"\nupstream = "{upstream}"\n{extra}'


def load_ok(tmp_path: Path, registry: Registry, text: str) -> Config:
    return load(write(tmp_path, text), registry=registry)


# -- values ----------------------------------------------------------------------------


def test_services_example_parses_into_a_list_of_dicts(tmp_path: Path, registry: Registry) -> None:
    config = load_ok(tmp_path, registry, EXAMPLE)
    (listener,) = config.listeners
    assert listener.options == {
        "services": [
            {"match": "containerd.task.v2.*", "upstream": "shim", "timeout": 5.0, "retry": None}
        ],
        "limits": None,
    }
    (upstream,) = config.upstreams
    assert upstream.options == {"fallback": None, "methods": []}


def test_entries_are_converted_and_defaulted_in_order(tmp_path: Path, registry: Registry) -> None:
    text = (
        UPSTREAM
        + LISTENER
        + service("a.*", extra='timeout = "250ms"\n')
        + service("b.*", extra="retry = { attempts = 5 }\n")
        + service("c.*", extra='[listeners.services.retry]\nbackoff = "2s"\n')
    )
    services = load_ok(tmp_path, registry, text).listeners[0].options["services"]
    assert services == [
        {"match": "a.*", "upstream": "shim", "timeout": 0.25, "retry": None},
        {
            "match": "b.*",
            "upstream": "shim",
            "timeout": 5.0,
            "retry": {"attempts": 5, "backoff": 0.1},
        },
        {
            "match": "c.*",
            "upstream": "shim",
            "timeout": 5.0,
            "retry": {"attempts": 3, "backoff": 2.0},
        },
    ]


def test_inline_array_of_tables_is_the_same(tmp_path: Path, registry: Registry) -> None:
    text = UPSTREAM + LISTENER + 'services = [{ match = "a.*", upstream = "shim" }]\n'
    services = load_ok(tmp_path, registry, text).listeners[0].options["services"]
    assert services == [{"match": "a.*", "upstream": "shim", "timeout": 5.0, "retry": None}]


def test_absent_tables_get_a_fresh_copy_of_the_default(tmp_path: Path, registry: Registry) -> None:
    second = LISTENER.replace('"proxy"', '"proxy2"').replace("proxy.sock", "proxy2.sock")
    config = load_ok(tmp_path, registry, LISTENER + second)
    first, other = (ls.options["services"] for ls in config.listeners)
    assert first == other == []
    assert first is not other
    assert first is not Ttrpc.listener_options["services"].default


def test_table_inside_a_table_with_an_array_of_tables(tmp_path: Path, registry: Registry) -> None:
    text = (
        LISTENER
        + """
[listeners.limits]
max_calls = 10

[[listeners.limits.headers]]
name = "x-proxy"

[[listeners.limits.headers]]
name = "x-zone"
value = "eu"
"""
    )
    limits = load_ok(tmp_path, registry, text).listeners[0].options["limits"]
    assert limits == {
        "max_calls": 10,
        "burst": 200,
        "headers": [{"name": "x-proxy", "value": ""}, {"name": "x-zone", "value": "eu"}],
    }


def test_upstream_options_with_nested_tables(tmp_path: Path, registry: Registry) -> None:
    text = (
        UPSTREAM
        + """
[[upstreams.methods]]
name = "Create"
weight = 3

[[upstreams.methods.overrides]]
key = "tenant"
value = "a"

[[upstreams.methods]]
name = "Delete"
"""
    )
    (upstream,) = load_ok(tmp_path, registry, text).upstreams
    assert upstream.options == {
        "fallback": None,
        "methods": [
            {"name": "Create", "weight": 3, "overrides": [{"key": "tenant", "value": "a"}]},
            {"name": "Delete", "weight": 1, "overrides": []},
        ],
    }


def test_required_tables_written_are_accepted(tmp_path: Path, registry: Registry) -> None:
    text = LISTENER.replace('"ttrpc"', '"strict"') + 'auth = { user = "u" }\nrules = []\n'
    (listener,) = load_ok(tmp_path, registry, text).listeners
    assert listener.options == {"auth": {"user": "u", "realm": "x"}, "rules": []}


# -- errors ----------------------------------------------------------------------------


def test_required_nested_keys(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, UPSTREAM + LISTENER + service("a.*") + "\n[[listeners.services]]\n")
    assert without_file(path, config_errors(path, registry)) == [
        "listeners[0].services[1].match: is required",
        "listeners[0].services[1].upstream: is required",
    ]


def test_required_table_and_tables(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER.replace('"ttrpc"', '"strict"') + "auth = {}\n")
    assert without_file(path, config_errors(path, registry)) == [
        "listeners[0].auth.user: is required",
        "listeners[0].rules: is required",
    ]
    path = write(tmp_path, LISTENER.replace('"ttrpc"', '"strict"') + 'rules = [{ allow = "*" }]\n')
    assert only_error(path, registry) == "listeners[0].auth: is required"


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (
            "match = 5",
            "listeners[0].services[1].match: expected a string, got an integer (5)",
        ),
        (
            'timeout = "soon"',
            "listeners[0].services[1].timeout: "
            """expected a duration such as "10s" or "500ms", got 'soon'""",
        ),
        (
            "retry = { attempts = 0 }",
            "listeners[0].services[1].retry.attempts: must be at least 1",
        ),
        (
            "retry = { attempts = 11 }",
            "listeners[0].services[1].retry.attempts: must be at most 10",
        ),
        (
            'retry = "often"',
            "listeners[0].services[1].retry: expected a table, got a string ('often')",
        ),
        (
            "upstream = 5",
            "listeners[0].services[1].upstream: expected a string, got an integer (5)",
        ),
    ],
)
def test_wrong_types_at_depth_name_the_full_path(
    tmp_path: Path, registry: Registry, extra: str, error: str
) -> None:
    # A key written twice would be a TOML error: the bad value replaces the good one.
    second = service("b.*", extra=extra + "\n")
    for key, good in (("match", 'match = "b.*"\n'), ("upstream", 'upstream = "shim"\n')):
        if extra.startswith(key):
            second = second.replace(good, "")
    path = write(tmp_path, UPSTREAM + LISTENER + service("a.*") + second)
    assert only_error(path, registry) == error


def test_unknown_nested_keys(tmp_path: Path, registry: Registry) -> None:
    text = (
        UPSTREAM
        + LISTENER
        + service("a.*")
        + '\n[[listeners.services]]\nmtach = "b.*"\nupstream = "shim"\n'
        + "retry = { attempts = 2, jitter = true }\n"
    )
    path = write(tmp_path, text)
    assert without_file(path, config_errors(path, registry)) == [
        "listeners[0].services[1].match: is required",
        "listeners[0].services[1].retry.jitter: unknown key (keys are attempts and backoff)",
        "listeners[0].services[1].mtach: unknown key (keys are match, upstream, timeout and retry)",
    ]


def test_unknown_key_in_a_one_key_table(tmp_path: Path, registry: Registry) -> None:
    text = LISTENER.replace('"ttrpc"', '"strict"') + 'auth = { user = "u" }\n'
    path = write(tmp_path, text + 'rules = [{ allow = "*", deny = "x" }]\n')
    assert only_error(path, registry) == (
        "listeners[0].rules[0].deny: unknown key (the only key is allow)"
    )


@pytest.mark.parametrize(
    ("value", "got"),
    [
        ('"containerd.*"', "a string ('containerd.*')"),
        ('["a.*", "b.*"]', "a list holding a string ('a.*')"),
        ('[{ match = "a.*", upstream = "shim" }, 7]', "a list holding an integer (7)"),
        ('{ match = "a.*", upstream = "shim" }', "a table"),
    ],
)
def test_services_must_be_an_array_of_tables(
    tmp_path: Path, registry: Registry, value: str, got: str
) -> None:
    path = write(tmp_path, UPSTREAM + LISTENER + f"services = {value}\n")
    assert only_error(path, registry) == (
        f"listeners[0].services: expected an array of tables ([[listeners.services]]), got {got}"
    )


def test_deeper_array_of_tables_names_its_header(tmp_path: Path, registry: Registry) -> None:
    text = UPSTREAM + '\n[[upstreams.methods]]\nname = "Create"\noverrides = "tenant=a"\n'
    path = write(tmp_path, text)
    assert only_error(path, registry) == (
        "upstreams[0].methods[0].overrides: expected an array of tables "
        "([[upstreams.methods.overrides]]), got a string ('tenant=a')"
    )


def test_errors_in_tables_inside_tables(tmp_path: Path, registry: Registry) -> None:
    text = (
        UPSTREAM
        + """
[[upstreams.methods]]
name = "Create"

[[upstreams.methods]]
name = "Delete"
weight = 0

[[upstreams.methods.overrides]]
key = "tenant"

[[upstreams.methods.overrides]]
key = "zone"
value = 1
"""
    )
    path = write(tmp_path, text)
    assert without_file(path, config_errors(path, registry)) == [
        "upstreams[0].methods[1].weight: must be at least 1",
        "upstreams[0].methods[1].overrides[0].value: is required",
        "upstreams[0].methods[1].overrides[1].value: expected a string, got an integer (1)",
    ]


def test_table_must_be_a_table(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER + "limits = 5\n")
    assert only_error(path, registry) == "listeners[0].limits: expected a table, got an integer (5)"


def test_check_on_tables_gets_the_whole_list(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, UPSTREAM + LISTENER + service("a.*") + service("b.*") + service("a.*"))
    assert only_error(path, registry) == "listeners[0].services: match 'a.*' appears twice"


def test_check_on_a_table_gets_the_dict(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, LISTENER + "limits = { max_calls = 300 }\n")
    assert only_error(path, registry) == (
        "listeners[0].limits: burst must be at least max_calls (300)"
    )


def test_check_is_skipped_when_an_entry_has_errors(tmp_path: Path, registry: Registry) -> None:
    path = write(
        tmp_path, UPSTREAM + LISTENER + service("a.*") + service("a.*", extra="timeout = []\n")
    )
    assert only_error(path, registry) == (
        'listeners[0].services[1].timeout: expected a duration such as "10s" or "500ms", got []'
    )


# -- upstream references ---------------------------------------------------------------


def test_upstream_reference_to_a_missing_upstream(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, UPSTREAM + LISTENER + service("a.*") + service("b.*", "ghost"))
    assert only_error(path, registry) == (
        "listeners[0].services[1].upstream: no upstream named 'ghost' is configured"
    )


def test_upstream_reference_to_another_protocol(tmp_path: Path, registry: Registry) -> None:
    path = write(tmp_path, UPSTREAM.replace('"ttrpc"', '"ndjson"') + EXAMPLE.replace(UPSTREAM, ""))
    assert only_error(path, registry) == (
        "listeners[0].services[0].upstream: upstream 'shim' speaks 'ndjson', not 'ttrpc'"
    )


def test_upstream_reference_written_before_the_upstream(tmp_path: Path, registry: Registry) -> None:
    # The listener comes first in the file, and an upstream names a later one.
    later = UPSTREAM.replace('"shim"', '"spare"')
    text = LISTENER + service("a.*", "spare") + UPSTREAM + 'fallback = "spare"\n' + later
    config = load_ok(tmp_path, registry, text)
    assert config.listeners[0].options["services"][0]["upstream"] == "spare"
    assert [up.options["fallback"] for up in config.upstreams] == ["spare", None]


def test_upstream_option_of_an_upstream_is_checked_too(tmp_path: Path, registry: Registry) -> None:
    other = '\n[[upstreams]]\nname = "nd"\nprotocol = "ndjson"\nconnect = "h:1"\n'
    path = write(tmp_path, other + UPSTREAM + 'fallback = "nd"\n')
    assert only_error(path, registry) == (
        "upstreams[1].fallback: upstream 'nd' speaks 'ndjson', not 'ttrpc'"
    )
    path = write(tmp_path, UPSTREAM + 'fallback = "none"\n')
    assert only_error(path, registry) == (
        "upstreams[0].fallback: no upstream named 'none' is configured"
    )


def test_broken_upstream_is_reported_once(tmp_path: Path, registry: Registry) -> None:
    text = UPSTREAM.replace('"unix:/run/shim.sock"', "[]") + EXAMPLE.replace(UPSTREAM, "")
    path = write(tmp_path, text)
    assert only_error(path, registry) == "upstreams[0].connect: needs at least one address"


def test_all_errors_are_reported_together(tmp_path: Path, registry: Registry) -> None:
    text = (
        LISTENER.replace("unix:/run/proxy.sock", "nowhere")
        + service("a.*", "ghost", "retry = { attempts = 0 }\n")
        + "\n[listeners.limits]\nburst = 0\n"
        + UPSTREAM
        + 'fallback = "shim2"\n'
    )
    path = write(tmp_path, text)
    errors = without_file(path, config_errors(path, registry))
    assert errors[1:] == [
        "listeners[0].services[0].retry.attempts: must be at least 1",
        "listeners[0].limits.burst: must be at least 1",
        "listeners[0].services[0].upstream: no upstream named 'ghost' is configured",
        "upstreams[0].fallback: no upstream named 'shim2' is configured",
    ]
    assert errors[0].startswith("listeners[0].bind: ")


# -- declarations ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda: Option("list", [], "x"), ValueError, "unknown option kind 'list'"),
        (
            lambda: Option("str", "", "x", fields={"a": Option("int", 1, "")}),
            ValueError,
            "fields apply to 'table' and 'tables' options, not 'str'",
        ),
        (lambda: Option("tables", [], "x"), ValueError, "a 'tables' option needs fields"),
        (lambda: Option("table", None, "x"), ValueError, "a 'table' option needs fields"),
        (
            lambda: Option("int", 1, "x", choices=("1", "2")),
            ValueError,
            "choices apply to 'str' options, not 'int'",
        ),
        (
            lambda: Option("str", "", "x", minimum=1),
            ValueError,
            "minimum applies to int, float, duration and size options, not 'str'",
        ),
        (
            lambda: Option("int", 1, "x", minimum=5, maximum=2),
            ValueError,
            "minimum 5 is above maximum 2",
        ),
        (
            lambda: Option("tables", [], "x", fields={"a": "str"}),
            TypeError,
            "field 'a' must be an Option",
        ),
        (lambda: Option("str", "", "x", choices=["a"]), TypeError, "choices must be a tuple"),
        (lambda: Option("str", "", "x", check="strict"), TypeError, "check must be callable"),
    ],
)
def test_malformed_declarations_are_rejected_at_construction(
    make: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as info:
        make()
    assert str(info.value).startswith(message)


def test_existing_positional_declarations_still_work() -> None:
    opt = Option("size", 1024, "longest line", 64)
    assert (opt.kind, opt.default, opt.help, opt.minimum) == ("size", 1024, "longest line", 64)
    assert opt.fields == {}
    assert opt.check is None
    assert not opt.required
    assert Option("str", REQUIRED, "x").required
    assert repr(REQUIRED) == "REQUIRED"


def test_option_is_the_same_class_from_gateway_plugin() -> None:
    import gateway.protocol.plugin

    assert gateway.protocol.plugin.Option is Option


# -- the command line ------------------------------------------------------------------

PLUGIN_MODULE = """
from gateway.protocol.options import REQUIRED, Option
from gateway.protocol.plugin import ProtocolPlugin


class Proxy(ProtocolPlugin):
    name = "nestedfake"
    roles = frozenset({"server", "client"})
    listener_options = {
        "services": Option(
            "tables",
            [],
            "routes by service name",
            fields={
                "match": Option("str", REQUIRED, "service name pattern"),
                "upstream": Option("upstream", REQUIRED, "upstream serving it"),
            },
        ),
    }


plugin = Proxy()
"""


def test_cli_check_reports_the_full_key_path(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist = site / "interchange_test_nested-0.0.0.dist-info"
    dist.mkdir(parents=True)
    (site / "interchange_test_nested.py").write_text(PLUGIN_MODULE, encoding="utf-8")
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: interchange-test-nested\nVersion: 0.0.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        "[interchange.protocols]\nnestedfake = interchange_test_nested:plugin\n", encoding="utf-8"
    )
    text = (
        EXAMPLE.replace('"ttrpc"', '"nestedfake"')
        + '\n[[listeners.services]]\nmtach = "x.*"\nupstream = "shim"\n'
    )
    config = write(tmp_path, text)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "check", str(config)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        f"{config}: listeners[0].services[1].match: is required",
        f"{config}: listeners[0].services[1].mtach: unknown key (keys are match and upstream)",
    ]
