"""Two gateways joined by one reactive-streams connection that carries both roles, over
TCP, TLS, a unix socket, ws:// and wss://.

The *edge* gateway's upstream connects to the *central* gateway's listener. Over
that one connection:

* edge → central: what routes send to ``upstream:central`` is the edge's publisher
  ``central``, which the central listener's ``subscriptions`` subscribe to and
  publish into its ``from-edges`` log; a publish at the edge settles once the
  central gateway stored it and requested more;
* central → edge: the edge's upstream subscribes to the central ``alerts`` log
  (``from=earliest``) and publishes what arrives into its own ``alerts`` log.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from harness import running_gateway

from gateway.config.certs import init_dir
from gateway.core.model import Message, Outcome
from gateway.ops.status import snapshot
from gateway.runtime.gateway import Gateway

from .bridge_helpers import registry

GUARD = 10.0


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return init_dir(tmp_path_factory.mktemp("certs"))


def central_config(transport: str, certs: dict[str, Path], tmp: Path) -> dict[str, Any]:
    tls = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    binds: dict[str, dict[str, Any]] = {
        "tcp": {"bind": "127.0.0.1:0"},
        "tls": {"bind": "127.0.0.1:0", "tls": tls},
        "unix": {"bind": f"unix:{tmp / 'central.sock'}"},
        "ws": {"bind": "ws://127.0.0.1:0/rs"},
        "wss": {"bind": "wss://127.0.0.1:0/rs", "tls": tls},
    }
    listener = {
        "name": "rs",
        "protocol": "reactive",
        "destination": "from-edges",
        "publishers": ["alerts"],
        "ack": "demand",
        "subscriptions": [{"publisher": "central", "demand": 4}],
        **binds[transport],
    }
    return {
        "gateway": {"drain_timeout": "100ms"},
        "listeners": [listener],
        "destinations": [
            {"name": "from-edges", "retain": "1MiB"},
            {"name": "alerts", "retain": "1MiB"},
        ],
    }


def edge_config(address: str, transport: str, certs: dict[str, Path]) -> dict[str, Any]:
    upstream: dict[str, Any] = {
        "name": "central",
        "protocol": "reactive",
        "connect": address,
        "destination": "alerts",
        "subscriptions": [{"publisher": "alerts?group=edge&from=earliest", "demand": 2}],
    }
    if transport in ("tls", "wss"):
        upstream["tls"] = {"ca": str(certs["ca_cert"])}
    return {
        "gateway": {"drain_timeout": "100ms"},
        "upstreams": [upstream],
        "routes": [{"from": "events", "to": ["upstream:central"]}],
        "destinations": [{"name": "alerts", "retain": "1MiB"}],
    }


async def bodies(gw: Gateway, destination: str, count: int) -> list[bytes]:
    """The first ``count`` bodies of the log ``destination``, read from the start."""
    sub = gw.hub.subscribe(destination, start="earliest")
    got: list[bytes] = []
    with trio.fail_after(GUARD):
        while len(got) < count:
            for d in await sub.receive():
                got.append(d.message.body)
                sub.ack(d.tag)
    sub.close()
    return got


@pytest.mark.parametrize("transport", ["tcp", "tls", "unix", "ws", "wss"])
async def test_both_roles_on_one_connection(
    transport: str, certs: dict[str, Path], tmp_path: Path
) -> None:
    reg = registry()
    async with running_gateway(central_config(transport, certs, tmp_path), registry=reg) as c:
        await c.hub.publish([Message("alerts", b"alert %d" % i) for i in range(5)])
        [address] = c.addresses["rs"]
        async with running_gateway(edge_config(address, transport, certs), registry=reg) as e:
            # central -> edge, two at a time (the edge's demand), all five.
            assert await bodies(e, "alerts", 5) == [b"alert %d" % i for i in range(5)]
            # edge -> central: settled once the central gateway stored them.
            events = [Message("events", b"event %d" % i) for i in range(10)]
            with trio.fail_after(GUARD):
                receipt = await e.hub.publish(events)
                await receipt.wait()
            assert receipt.outcome is Outcome.DELIVERED
            assert await bodies(c, "from-edges", 10) == [b"event %d" % i for i in range(10)]
            # Both ways went over one connection.
            [listener] = snapshot(c)["listeners"]
            assert listener["connections"] == 1
