"""Interop with containerd's Go ttrpc (Debian's 1.2.4): the Go client's scenario
against Go's own server is the reference, and against Interchange's server (the Echo
service of ``echo_service.py`` on ``TtrpcSession``, over TCP and a unix socket) it must
print the very same lines.

Go and its ttrpc library come from Debian (``bash .ci/go-interop-deps``); without them
these tests fail, or skip with ``INTERCHANGE_SKIP_GO=1`` (see ``go_ttrpc.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from interop import go_ttrpc
from interop.echo_service import serve_echo
from interop.go_ttrpc import ScenarioLine, go_server, run_go_bench, run_go_client, scenario_diff

# The helpers' fixtures, bound here so that pytest finds them in this module.
go_peer = go_ttrpc.go_peer
socket_dir = go_ttrpc.socket_dir

#: How the client prints the Fail method's detail, Any(StringValue "detail").
DETAIL = 'type.googleapis.com/google.protobuf.StringValue "detail"'


async def go_against_go(binary: Path) -> list[ScenarioLine]:
    async with go_server(binary) as server:
        return await run_go_client(binary, server.address)


@pytest.fixture(scope="module")
def go_reference(go_peer: Path) -> list[ScenarioLine]:
    """The scenario's lines from Go's client against Go's server, over TCP, once per
    module (pytest-trio's async fixtures are per test only, hence trio.run here)."""
    return trio.run(go_against_go, go_peer)


def by_step(lines: list[ScenarioLine]) -> dict[str, ScenarioLine]:
    return {line["step"]: line for line in lines}


def test_go_client_against_go_server(go_reference: list[ScenarioLine]) -> None:
    steps = by_step(go_reference)
    assert len(steps) == len(go_reference), "step names must be unique"
    assert steps["echo_text"] == {
        "step": "echo_text",
        "ok": True,
        "code": 0,
        "message": "",
        "details": [],
        "result": "hello, ttrpc",
    }
    assert steps["echo_empty"]["ok"]
    assert steps["echo_empty"]["result"] == ""
    assert steps["echo_1mib"]["result"].startswith("1048576 bytes, sha256 ")
    assert steps["echo_max_frame"]["ok"]
    oversize = steps["echo_oversize"]
    assert (oversize["code"], oversize["message"]) == (
        8,
        "message length 4194305 exceed maximum message size of 4194304",
    )
    assert steps["echo_after_oversize"]["result"] == "still here"
    fail = steps["fail_5"]
    assert (fail["ok"], fail["code"], fail["message"], fail["details"]) == (
        False,
        5,
        "no such thing",
        [DETAIL],
    )
    assert steps["fail_99"]["code"] == 99
    assert steps["unknown_method"]["message"] == "method Nope"
    assert steps["unknown_service"]["message"] == "service interchange.test.Nope"
    assert (
        steps["metadata"]["result"] == "x-a=1\nx-b=2\nx-dup=one\nx-dup=two\nx-empty=\nx-mixed=Case"
    )
    for step in ("sleep_client_timeout", "sleep_server_deadline"):
        assert (steps[step]["code"], steps[step]["message"]) == (4, "context deadline exceeded")
    assert steps["sleep_server_deadline"]["result"] == "ended by the server's deadline"
    assert steps["count_100"]["result"] == [str(i) for i in range(100)]
    assert steps["count_abort_after_3"]["result"] == ["0", "1", "2"]
    assert steps["count_abort_after_3"]["code"] == 10
    assert steps["sum_0"]["result"] == [""]
    assert steps["sum_many"]["result"] == ["a,b,,d,e,f,g,h,i,j"]
    assert steps["sum_100"]["ok"], steps["sum_100"]
    assert steps["chat_burst_100"]["result"] == [str(i) for i in range(100)]
    assert steps["chat_pingpong"]["result"] == ["PING", "", "hex 434146c3a9", "X1Y2"]
    assert steps["concurrent_unary"]["result"] == "32 of 32 ok"
    assert steps["replies_in_completion_order"]["result"] == ["echo", "sleep"]


async def test_go_server_over_a_unix_socket(
    go_peer: Path, socket_dir: Path, go_reference: list[ScenarioLine]
) -> None:
    address = f"unix:{socket_dir / 'go.sock'}"
    async with go_server(go_peer, address) as server:
        assert server.address == address
        lines = await run_go_client(go_peer, server.address)
        assert server.alive, server.log()
    assert not scenario_diff(go_reference, lines, names=("tcp", "unix"))


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_go_client_against_our_server(
    transport: str,
    go_peer: Path,
    socket_dir: Path,
    go_reference: list[ScenarioLine],
    nursery: trio.Nursery,
) -> None:
    address = f"unix:{socket_dir / 'ours.sock'}" if transport == "unix" else "tcp:127.0.0.1:0"
    bound = await nursery.start(serve_echo, address)
    lines = await run_go_client(go_peer, bound)
    if diff := scenario_diff(go_reference, lines):
        pytest.fail(f"the Go client saw our server answer otherwise than Go's:\n{diff}", False)


async def test_go_bench_against_go_and_ours(go_peer: Path, nursery: trio.Nursery) -> None:
    """The benchmark's plumbing (the numbers belong to bench runs, not tests)."""
    ours = await nursery.start(serve_echo, "tcp:127.0.0.1:0")
    async with go_server(go_peer) as server:
        for address in (server.address, ours):
            result = await run_go_bench(
                go_peer, address, concurrency=4, conns=2, seconds=0.3, size=16
            )
            assert result["errors"] == 0, result
            assert result["calls"] > 0, result
            assert (result["concurrency"], result["conns"], result["size"]) == (4, 2, 16)
            assert result["calls_per_s"] == pytest.approx(result["calls"] / result["seconds"])
