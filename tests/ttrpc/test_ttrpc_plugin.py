"""The ttrpc protocol in a running gateway: a listener proxying routed services to a ttrpc
upstream, SO_PEERCRED admission on unix listeners, and the upstream's client role calling a
method with each routed message (acked only once answered OK, replies for calls)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import running_gateway

from gateway.config.loader import ConfigError, parse
from gateway.core.model import Message, Outcome
from gateway.protocol.plugin import PluginError
from protocols.ttrpc import Code, TtrpcError, ttrpc_pb2
from protocols.ttrpc.client import open_client
from protocols.ttrpc.server import CallContext, Service, TtrpcSession

SVC = "test.v1.Echo"


class Backend:
    """A ttrpc server of ours standing for the upstream service."""

    def __init__(self) -> None:
        self.received: list[tuple[bytes, tuple[tuple[str, str], ...]]] = []
        self.refuse = False
        #: Calls to answer UNAVAILABLE before answering again.
        self.busy = 0
        self.address = ""

    def services(self) -> dict[str, Service]:
        svc = Service(SVC)

        async def echo(ctx: CallContext, payload: bytes) -> bytes:
            self.received.append((payload, ctx.metadata))
            if self.refuse:
                raise TtrpcError(Code.INVALID_ARGUMENT, "not this one")
            if self.busy:
                self.busy -= 1
                raise TtrpcError(Code.UNAVAILABLE, "busy")
            return b"echo:" + payload

        svc.unary("Echo", echo)
        return {SVC: svc}

    async def serve(self, stream: trio.SocketStream) -> None:
        try:
            await TtrpcSession(stream, self.services()).run()
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass


@pytest.fixture
async def backend(nursery: trio.Nursery) -> Backend:
    b = Backend()
    listeners = await nursery.start(partial(trio.serve_tcp, b.serve, 0, host="127.0.0.1"))
    b.address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    return b


def config(tmp_path: Path, backend: Backend, **listener: Any) -> dict[str, Any]:
    return {
        "gateway": {"data_dir": str(tmp_path / "data"), "drain_timeout": "100ms"},
        "listeners": [
            {
                "name": "rpc",
                "protocol": "ttrpc",
                "bind": "127.0.0.1:0",
                "services": [{"match": "test.v1.*", "upstream": "back"}],
            }
            | listener
        ],
        "upstreams": [
            {
                "name": "back",
                "protocol": "ttrpc",
                "connect": [backend.address],
                "backoff_initial": "20ms",
            }
        ],
    }


async def test_a_listener_proxies_routed_services(tmp_path: Path, backend: Backend) -> None:
    async with running_gateway(config(tmp_path, backend)) as gw:
        address = gw.addresses["rpc"][0]
        async with open_client(address) as client:
            assert await client.call(SVC, "Echo", b"hi", metadata={"k": "v"}) == b"echo:hi"
            with pytest.raises(TtrpcError) as info:
                await client.call("other.v1.S", "M")
            assert info.value.message == "service other.v1.S"
    assert backend.received == [(b"hi", (("k", "v"),))]


async def test_relayed_bytes_count_in_the_listener_s_metrics(
    tmp_path: Path, backend: Backend
) -> None:
    """Replies relayed without the writer task (written at once) are counted all the same."""
    async with running_gateway(config(tmp_path, backend)) as gw:
        sent = gw.metrics.bytes_sent.labels(listener="rpc")
        async with open_client(gw.addresses["rpc"][0]) as client:
            for n in range(20):
                assert await client.call(SVC, "Echo", b"%d" % n) == b"echo:%d" % n
        replies = [ttrpc_pb2.Response(payload=b"echo:%d" % n) for n in range(20)]
        assert sent.value == sum(10 + len(r.SerializeToString()) for r in replies)


@pytest.fixture
def short_tmp() -> AsyncIterator[Path]:
    """A directory with a path short enough for a unix socket."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ttrpc") as d:
        yield Path(d)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("uids", "gids", "admitted"),
    [
        ([str(os.getuid())], [], True),
        ([], [str(os.getgid())], True),
        (["4242424"], [], False),
        (["4242424"], ["4242424"], False),
    ],
)
async def test_unix_listeners_admit_only_allowed_peers(
    tmp_path: Path,
    short_tmp: Path,
    backend: Backend,
    uids: list[str],
    gids: list[str],
    admitted: bool,
) -> None:
    bind = f"unix:{short_tmp / 'rpc.sock'}"
    data = config(tmp_path, backend, bind=bind, allowed_uids=uids, allowed_gids=gids)
    async with running_gateway(data), open_client(bind) as client:
        if admitted:
            assert await client.call(SVC, "Echo", b"me") == b"echo:me"
        else:
            with pytest.raises(TtrpcError) as info:
                await client.call(SVC, "Echo", b"me")
            assert (info.value.code, info.value.message) == (Code.UNAVAILABLE, "ttrpc: closed")


async def test_peer_checks_need_a_unix_listener(tmp_path: Path, backend: Backend) -> None:
    with pytest.RaisesGroup(
        pytest.RaisesExc(PluginError, match="allowed_uids/allowed_gids need a unix: bind"),
        flatten_subgroups=True,
    ):
        async with running_gateway(config(tmp_path, backend, allowed_uids=["0"])):
            pass


def client_role_config(tmp_path: Path, backend: Backend) -> dict[str, Any]:
    data = config(tmp_path, backend)
    data["upstreams"][0] |= {"service": SVC, "method": "Echo", "timeout": "5s"}
    data["routes"] = [{"from": "jobs", "to": ["upstream:back"]}]
    return data


async def test_the_client_role_calls_with_each_message(tmp_path: Path, backend: Backend) -> None:
    async with running_gateway(client_role_config(tmp_path, backend)) as gw:
        messages = [Message("jobs", f"job {i}".encode(), {"n": str(i)}) for i in range(5)]
        receipt = await gw.hub.publish(messages)
        with trio.fail_after(10):
            assert await receipt.wait() == Outcome.DELIVERED
        assert sorted(body for body, _ in backend.received) == [b"job %d" % i for i in range(5)]
        assert all(meta[0][0] == "n" for _, meta in backend.received)
        # A call routed there gets the method's response as its reply.
        call = await gw.hub.call(Message("jobs", b"question"), 10)
        with trio.fail_after(10):
            await call.wait()
        assert call.reply is not None
        assert call.reply.body == b"echo:question"
        # A message the server refuses settles as rejected, with the server's reason.
        backend.refuse = True
        refused = await gw.hub.publish([Message("jobs", b"bad")])
        with trio.fail_after(10):
            assert await refused.wait() == Outcome.REJECTED
        assert "INVALID_ARGUMENT not this one" in refused.result(0).reason
        # One it cannot take now is sent again until it can.
        backend.refuse = False
        backend.busy = 2
        retried = await gw.hub.publish([Message("jobs", b"later")])
        with trio.fail_after(10):
            assert await retried.wait() == Outcome.DELIVERED
        assert [body for body, _ in backend.received[-3:]] == [b"later"] * 3


@pytest.mark.parametrize("bad", ["Sum", "test.v1.Echo/", "/Sum", "test.v1.Echo/Sum/x"])
def test_client_streaming_names_full_methods(tmp_path: Path, bad: str) -> None:
    backend = Backend()
    backend.address = "127.0.0.1:7071"
    data = config(tmp_path, backend)
    data["upstreams"][0]["client_streaming"] = ["test.v1.Echo/Chat", bad]
    with pytest.raises(ConfigError, match="service/method"):
        parse(data, source="<test>")
    data["upstreams"][0]["client_streaming"] = ["test.v1.Echo/Chat"]
    config_ = parse(data, source="<test>")
    assert config_.upstreams[0].options["client_streaming"] == ["test.v1.Echo/Chat"]
