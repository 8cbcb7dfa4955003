"""Every config the README and docs show carries real traffic, and its senders get acks.

Each documented config (and the embedded default that ``gateway run`` uses)
is started as written, with only what a real deployment has swapped for local
stand-ins:

- binds go to loopback ports the OS picks;
- the certificate files are made by ``gateway certs init certs``;
- each upstream is a second gateway listening with the upstream's protocol
  (and TLS, with a client certificate when the upstream sends one); of a
  failover list, the first address refuses connections;
- each queue has a consumer that acks, as the docs tell the reader to run;
- where the config has an admin endpoint, the docs' "watch the traffic"
  runs too: a ``gateway tap`` of everything that reads nothing until the end.

Then every listener gets messages from a real client of its protocol over a
real socket. Each message must be acked as delivered within ``DEADLINE``
seconds (a documented example that stalls its senders fails here), and each
upstream must have received exactly what the routes send it.
"""

from __future__ import annotations

import copy
import fnmatch
import socket
import ssl
import tomllib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from documented import toml_configs
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from test_runtime_tls import client_context

from gateway.config.certs import init_dir
from gateway.config.loader import default_data
from gateway.core.model import Message
from gateway.ops.status import snapshot
from gateway.runtime.gateway import Gateway
from gateway.runtime.registry import default_registry
from protocols.lumberjack.client import LumberjackClient
from protocols.micromessage import Client as MicromessageClient
from protocols.reactive import Ending, Peer
from protocols.segment.client import Appender, run_appender
from protocols.ttrpc import messaging_pb2
from protocols.ttrpc.client import open_client
from protocols.ttrpc.messaging import SERVICE

#: Seconds within which every message of a config must be acked.
DEADLINE = 30
#: Messages each listener is sent.
COUNT = 20

Sender = Callable[[trio.abc.Stream, str, list[bytes]], Awaitable[None]]


async def send_lumberjack(stream: trio.abc.Stream, destination: str, bodies: list[bytes]) -> None:
    """Send ``bodies`` as Lumberjack events; return once the window is acked."""
    async with LumberjackClient(stream) as client:
        assert await client.send(bodies) == len(bodies)


async def send_ndjson(stream: trio.abc.Stream, destination: str, bodies: list[bytes]) -> None:
    """Publish ``bodies`` to ``destination``; every answer must be ``delivered``."""
    async with NdjsonClient(stream) as client:
        ids = await client.publish_nowait(bodies, destination)
        answers = await client.wait_answers(ids)
        assert [a.status for a in answers] == ["delivered"] * len(bodies), answers


async def send_segment(stream: trio.abc.Stream, destination: str, bodies: list[bytes]) -> None:
    """Append ``bodies`` to ``destination``'s first segment; return once all are acked."""
    acked: list[int] = []
    done = trio.Event()

    def on_acked(_s: str, _w: object, tokens: list[tuple[int, int]], _offset: int) -> None:
        acked.extend(token for token, _number in tokens)
        if len(acked) == len(bodies):
            done.set()

    appender = Appender(on_acked)
    appender.add(f"{destination}/0", bodies, list(range(len(bodies))))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_appender, stream, appender)
        await done.wait()
        nursery.cancel_scope.cancel()
    assert sorted(acked) == list(range(len(bodies)))


async def send_ttrpc(stream: trio.abc.Stream, destination: str, bodies: list[bytes]) -> None:
    """Publish ``bodies`` with ``interchange.v1.Messaging``; every one must be delivered."""
    request = messaging_pb2.PublishRequest(
        messages=[messaging_pb2.Message(destination=destination, body=b) for b in bodies]
    )
    async with open_client(stream) as client:
        raw = await client.call(SERVICE, "Publish", request.SerializeToString())
    response = messaging_pb2.PublishResponse.FromString(raw)
    outcomes = [r.outcome for r in response.results]
    assert outcomes == [messaging_pb2.OUTCOME_DELIVERED] * len(bodies), response


async def send_micromessage(stream: trio.abc.Stream, destination: str, bodies: list[bytes]) -> None:
    """Publish ``bodies`` as MESSAGE frames; return once every one is acked."""
    async with await MicromessageClient.over(stream) as client:
        for body in bodies:
            await client.publish(destination, body)
        await client.wait_acked()


async def send_reactive(stream: trio.abc.Stream, publisher: str, bodies: list[bytes]) -> None:
    """Offer ``bodies`` as ``publisher``, which the listener's ``subscriptions`` name;
    return once the gateway took them all and the stream completed."""

    async def source() -> AsyncIterator[bytes]:
        for body in bodies:
            yield body

    async with Peer(stream) as peer:
        assert await peer.publish(publisher, source()) is Ending.COMPLETED


#: A real client for each protocol a documented listener speaks.
SENDERS: dict[str, Sender] = {
    "lumberjack": send_lumberjack,
    "micromessage": send_micromessage,
    "ndjson": send_ndjson,
    "reactive": send_reactive,
    "segment": send_segment,
    "ttrpc": send_ttrpc,
}


def documented() -> list[tuple[str, dict[str, Any]]]:
    configs = [(where, tomllib.loads(text)) for where, text in toml_configs()]
    return [("embedded default", default_data(default_registry())), *configs]


CONFIGS = documented()


def refused_address() -> str:
    """A loopback address nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def local(data: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """``data`` with every bind on loopback and its data folder under ``tmp``."""
    data = copy.deepcopy(data)
    data.setdefault("gateway", {})["data_dir"] = str(tmp / "data")
    for table in ("metrics", "admin"):
        if table in data:
            data[table]["bind"] = "127.0.0.1:0"
    for listener in data.get("listeners", []):
        if listener["bind"].startswith("unix:"):
            listener["bind"] = f"unix:{tmp / listener['name']}.sock"
        else:
            listener["bind"] = "127.0.0.1:0"
    return data


def sink_config(upstream: dict[str, Any], certs: dict[str, Path]) -> dict[str, Any]:
    """A gateway standing in for what ``upstream`` connects to: everything it is
    sent lands in the queue ``received``."""
    listener: dict[str, Any] = {
        "name": "in",
        "protocol": upstream["protocol"],
        "bind": "127.0.0.1:0",
        "destination": "received",
    }
    if upstream["protocol"] == "reactive":  # it takes what the upstream publishes
        listener["subscriptions"] = [{"publisher": upstream.get("publisher") or upstream["name"]}]
    tls = upstream.get("tls")
    if tls is not None:
        listener["tls"] = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
        if "cert" in tls:
            listener["tls"] |= {"client_ca": str(certs["ca_cert"]), "client_auth": "required"}
    return {
        "listeners": [listener],
        "routes": [{"from": "*", "to": ["received"]}],
        "destinations": [{"name": "received", "kind": "queue"}],
    }


async def consume(gw: Gateway, destination: str, got: list[bytes]) -> None:
    """Ack everything ``destination`` delivers, keeping the bodies."""
    sub = gw.hub.subscribe(destination)
    try:
        while True:
            for delivery in await sub.receive():
                got.append(delivery.message.body)
                sub.ack(delivery.tag)
    except trio.ClosedResourceError:
        pass  # the gateway shut down


def listener_context(listener: dict[str, Any], certs: dict[str, Path]) -> ssl.SSLContext | None:
    """How a client of ``listener`` does TLS (with the client certificate where asked)."""
    tls = listener.get("tls")
    if tls is None:
        return None
    return client_context(certs, "client" if tls.get("client_auth", "none") != "none" else None)


async def open_stream(address: str, context: ssl.SSLContext | None) -> trio.abc.Stream:
    if address.startswith("unix:"):
        stream: trio.abc.Stream = await trio.open_unix_socket(address[5:])
    else:
        stream = await trio.open_tcp_stream(*host_port(address))
    if context is not None:
        tls = trio.SSLStream(stream, context, server_hostname="localhost")
        await tls.do_handshake()
        stream = tls
    return stream


def routed(data: dict[str, Any], destination: str) -> set[str]:
    """The targets a message published to ``destination`` goes to (see routing.py)."""
    targets = {
        t
        for r in data.get("routes", [])
        if fnmatch.fnmatchcase(destination, r["from"])
        for t in ([r["to"]] if isinstance(r["to"], str) else r["to"])  # one target or a list
    }
    return targets or {destination}


def test_every_documented_config_is_here() -> None:
    assert len(CONFIGS) >= 8
    assert all(
        listener["protocol"] in SENDERS
        for _, data in CONFIGS
        for listener in data.get("listeners", [])
    ), "a documented listener speaks a protocol this test has no client for: add one"


@pytest.mark.parametrize("data", [d for _, d in CONFIGS], ids=[w for w, _ in CONFIGS])
async def test_documented_config_acks_its_senders(data: dict[str, Any], tmp_path: Path) -> None:
    certs = init_dir(tmp_path / "certs")  # where the documented configs look for them
    config = local(data, tmp_path)
    received: dict[str, list[bytes]] = {}
    queued: dict[str, list[bytes]] = {}
    async with trio.open_nursery() as nursery:
        # What each upstream connects to.
        for upstream in config.get("upstreams", []):
            sink = await nursery.start(_serve, sink_config(upstream, certs), tmp_path)
            got = received[upstream["name"]] = []
            nursery.start_soon(consume, sink, "received", got)
            address = sink.addresses["in"][0]
            if isinstance(upstream["connect"], list) and len(upstream["connect"]) > 1:
                upstream["connect"] = [refused_address(), address]
            else:
                upstream["connect"] = address
        async with running_gateway(config, base_dir=tmp_path) as gw:
            for spec in config.get("destinations", []):
                if spec.get("kind") == "queue":
                    got = queued[spec["name"]] = []
                    nursery.start_soon(consume, gw, spec["name"], got)
            tap = await open_tap(gw) if "admin" in config else None
            expected: dict[str, int] = {}
            with trio.fail_after(DEADLINE):
                for listener in config.get("listeners", []):
                    destination = listener.get("destination", "logs")
                    if listener["protocol"] == "reactive":
                        taken = listener.get("subscriptions", [{}])[0]
                        destination = taken.get("destination", destination)
                        if not listener.get("subscriptions"):
                            destination = listener["publishers"][0]
                    bodies = [
                        b'{"message":"%s %d"}' % (listener["name"].encode(), i)
                        for i in range(COUNT)
                    ]
                    expected = count(expected, routed(config, destination))
                    stream = await open_stream(
                        gw.addresses[listener["name"]][0], listener_context(listener, certs)
                    )
                    if listener["protocol"] == "reactive":
                        await reactive_traffic(gw, stream, listener, bodies)
                        continue
                    await SENDERS[listener["protocol"]](stream, destination, bodies)
                # Acked means delivered: what the routes send upstream is there already.
                for name, got in received.items():
                    assert len(got) == expected.get(f"upstream:{name}", 0), name
                for name, got in queued.items():
                    assert len(got) == expected.get(name, 0), name
                states = {u["name"]: u["state"] for u in snapshot(gw)["upstreams"]}
                while any(state != "connected" for state in states.values()):
                    await trio.sleep(0.05)
                    states = {u["name"]: u["state"] for u in snapshot(gw)["upstreams"]}
                if tap is not None:  # it held nothing up, and saw the traffic
                    seen = b""
                    while b'"message' not in seen:
                        seen += await tap.receive_some()
                    assert seen.startswith(b"HTTP/1.1 200 "), seen
        nursery.cancel_scope.cancel()


def count(expected: dict[str, int], targets: set[str]) -> dict[str, int]:
    """``expected`` with :data:`COUNT` more messages at each of ``targets``."""
    return expected | {t: expected.get(t, 0) + COUNT for t in targets}


async def reactive_traffic(
    gw: Gateway, stream: trio.abc.Stream, listener: dict[str, Any], bodies: list[bytes]
) -> None:
    """Offer ``bodies`` as the publisher the listener's first subscription names; a
    listener without subscriptions only publishes: subscribe to its first
    publisher, publish ``bodies`` there, and receive each of them."""
    if listener.get("subscriptions"):
        await send_reactive(stream, listener["subscriptions"][0]["publisher"], bodies)
        return
    destination = listener["publishers"][0]
    async with Peer(stream) as peer, peer.subscribe(destination, len(bodies)) as sub:
        await gw.hub.publish([Message(destination, b) for b in bodies])
        got = [await sub.__anext__() for _ in bodies]
    assert got == bodies


async def open_tap(gw: Gateway) -> trio.SocketStream:
    """``gateway tap '*'``, as a connection that is not read from."""
    stream = await trio.open_tcp_stream(*host_port(gw.admin_addresses[0]))
    await stream.send_all(b"GET /api/tap?dest=%2A&format=json HTTP/1.1\r\nHost: gw\r\n\r\n")
    return stream


async def _serve(
    data: dict[str, Any], base_dir: Path, *, task_status: trio.TaskStatus[Gateway]
) -> None:
    async with running_gateway(data, base_dir=base_dir) as gw:
        task_status.started(gw)
        await trio.sleep_forever()
