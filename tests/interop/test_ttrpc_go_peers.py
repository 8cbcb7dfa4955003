"""Interop with containerd's Go ttrpc in the two directions ``test_ttrpc_go.py`` leaves:

* **our client against Go's server**: a scenario of Interchange's trio client
  (``protocols.ttrpc.client``) covering every method of ``interchange.test.Echo`` and its
  error cases runs against Go's server and against ours (``echo_service.py``), over TCP
  and over a unix socket; both must answer it step for step alike, and as expected;
* **Go's client through our proxy**: the Go client's scenario through a real gateway's
  transparent proxy (a ttrpc listener routing ``interchange.test.*`` to a ttrpc upstream,
  the Go server) must print exactly what it prints against the Go server directly, also
  with several Go clients at once sharing the proxy's upstream connection.

Go and its ttrpc library come from Debian (``bash .ci/go-interop-deps``); without them
these tests fail, or skip with ``INTERCHANGE_SKIP_GO=1`` (see ``go_ttrpc.py``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from google.protobuf import wrappers_pb2
from google.protobuf.any_pb2 import Any as AnyPb
from google.protobuf.message import Message
from harness import running_gateway
from interop import go_ttrpc
from interop.echo_service import SERVICE, serve_echo
from interop.go_ttrpc import (
    GoServer,
    ScenarioLine,
    check_go_log,
    go_server,
    proxy_config,
    run_go_client,
    scenario_diff,
)

from protocols.ttrpc import Code, TtrpcError
from protocols.ttrpc.client import CallKind, Client, Metadata, open_client

# The helpers' fixtures, bound here so that pytest finds them in this module.
go_peer = go_ttrpc.go_peer
socket_dir = go_ttrpc.socket_dir

#: The whole of one scenario run (each call also has a deadline of its own).
SCENARIO_TIMEOUT = 60.0
#: A streaming call's deadline, as the Go client's scenario gives its streams.
STREAM_TIMEOUT = 10.0
#: How the Fail method's detail is rendered: Any(StringValue "detail").
DETAIL = 'type.googleapis.com/google.protobuf.StringValue "detail"'
#: Metadata with several keys, a key twice, a key in mixed case and an empty value, in
#: the order sent; and what the Metadata method answers for it (sorted, keys lower-cased).
METADATA = [
    ("x-b", "2"),
    ("x-a", "1"),
    ("x-dup", "one"),
    ("X-Mixed", "Case"),
    ("x-dup", "two"),
    ("x-empty", ""),
]
METADATA_SEEN = "x-a=1\nx-b=2\nx-dup=one\nx-dup=two\nx-empty=\nx-mixed=Case"
#: Unary calls at once on one connection.
CONCURRENT_CALLS = 64
#: Go clients running their scenario through the proxy at once.
GO_CLIENTS = 4


# -- rendering, as the Go client renders (client.go: render, renderAny, outcome) ----------


def pattern(n: int) -> bytes:
    """n bytes that are not all alike (the Go client's ``pattern``)."""
    return bytes(i % 251 for i in range(n))


def numbers(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def render_value(value: bytes) -> str:
    """Text when short and printable, else hex, else (long) its length and digest."""
    if len(value) > 256:
        return f"{len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()}"
    if any((c < 0x20 and c != 0x0A) or c >= 0x7F for c in value):
        return f"hex {value.hex()}"
    return value.decode("ascii")


def render(payload: bytes, cls: type[Message] = wrappers_pb2.BytesValue) -> str:
    """A reply's payload, decoded as ``cls`` (BytesValue or StringValue), rendered."""
    message = cls()
    message.ParseFromString(payload)
    value = message.value  # type: ignore[attr-defined]
    return render_value(value if isinstance(value, bytes) else value.encode())


def render_detail(detail: AnyPb) -> str:
    text = wrappers_pb2.StringValue()
    if detail.Is(wrappers_pb2.StringValue.DESCRIPTOR) and detail.Unpack(text):
        return f"{detail.type_url} {json.dumps(text.value, ensure_ascii=False)}"
    return f"{detail.type_url} hex {detail.value.hex()}"


def raw(payload: bytes) -> str:
    """The reply's payload bytes as sent (their encoding, not just the value)."""
    return render_value(payload) if len(payload) > 256 else f"hex {payload.hex()}"


def bytes_value(value: bytes) -> bytes:
    return wrappers_pb2.BytesValue(value=value).SerializeToString()


def string_value(value: str) -> bytes:
    return wrappers_pb2.StringValue(value=value).SerializeToString()


# -- the scenario of our client ---------------------------------------------------------------


class Scenario:
    """Our client's scenario against one Echo server: one line per step, in the Go
    client's shape (step, ok, code, message, details, result) plus ``raw`` for unary
    replies. The lines depend only on the server's replies."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.lines: list[ScenarioLine] = []

    async def step(
        self, step: str, body: Callable[[], Awaitable[Any]], got: list[str] | None = None
    ) -> ScenarioLine:
        """Run one step; its result is what ``body`` returns, or for streams the
        messages received (``got``), also when the call then failed."""
        line: ScenarioLine = {"step": step, "ok": True, "code": 0, "message": "", "details": []}
        try:
            result = await body()
        except TtrpcError as e:
            line |= {"ok": False, "code": e.code, "message": e.message}
            line["details"] = [render_detail(d) for d in e.details]
            result = None
        line["result"] = got if got is not None else result
        self.lines.append(line)
        return line

    async def unary(
        self,
        step: str,
        method: str,
        request: bytes,
        *,
        reply: type[Message] = wrappers_pb2.BytesValue,
        service: str = SERVICE,
        timeout: float | None = None,
        metadata: Metadata | None = None,
    ) -> ScenarioLine:
        answer: dict[str, str] = {}

        async def body() -> str:
            payload = await self.client.call(
                service, method, request, timeout=timeout, metadata=metadata
            )
            answer["raw"] = raw(payload)
            return render(payload, reply)

        line = await self.step(step, body)
        line["raw"] = answer.get("raw")
        return line

    async def server_stream(
        self, step: str, request: bytes, *, method: str = "Count", metadata: Metadata | None = None
    ) -> None:
        got: list[str] = []

        async def body() -> None:
            async with self.client.stream(
                SERVICE,
                method,
                CallKind.SERVER_STREAMING,
                request,
                timeout=STREAM_TIMEOUT,
                metadata=metadata,
            ) as call:
                async for message in call:
                    got.append(render(message))

        await self.step(step, body, got)

    async def sum(self, step: str, sends: list[str], metadata: Metadata | None = None) -> None:
        got: list[str] = []

        async def body() -> None:
            async with self.client.stream(
                SERVICE,
                "Sum",
                CallKind.CLIENT_STREAMING,
                timeout=STREAM_TIMEOUT,
                metadata=metadata,
            ) as call:
                for m in sends:  # back to back, nothing read in between
                    await call.send(bytes_value(m.encode()))
                await call.close_send()
                got.append(render(await call.response()))

        await self.step(step, body, got)

    async def chat(
        self, step: str, sends: list[str], *, pingpong: bool, metadata: Metadata | None = None
    ) -> None:
        got: list[str] = []

        async def body() -> None:
            async with self.client.stream(
                SERVICE, "Chat", CallKind.BIDI, timeout=STREAM_TIMEOUT, metadata=metadata
            ) as call:
                for m in sends:
                    await call.send(bytes_value(m.encode()))
                    if pingpong:  # each reply read before the next send
                        got.append(render(await call.receive()))
                await call.close_send()
                async for message in call:
                    got.append(render(message))
                assert await call.response() == b""

        await self.step(step, body, got)

    async def concurrent(self, step: str, calls: int) -> None:
        results: dict[int, str] = {}

        async def one(i: int) -> None:
            want = f"call-{i:02d}"
            try:
                payload = await self.client.call(SERVICE, "Echo", bytes_value(want.encode()))
            except TtrpcError as e:
                results[i] = f"{want}: code {e.code}: {e.message}"
                return
            got = render(payload)
            results[i] = "ok" if got == want else f"{want}: got {got!r}"

        async def body() -> str:
            async with trio.open_nursery() as nursery:
                for i in range(calls):
                    nursery.start_soon(one, i)
            bad = [results[i] for i in range(calls) if results[i] != "ok"]
            if bad:
                raise TtrpcError(Code.UNKNOWN, "; ".join(bad))
            return f"{calls} of {calls} ok"

        await self.step(step, body)

    async def completion_order(self, step: str) -> None:
        """A slow call and a quick one at once: the quick one's reply comes first."""
        order: list[str] = []

        async def call(name: str, method: str, request: bytes) -> None:
            try:
                await self.client.call(SERVICE, method, request, timeout=STREAM_TIMEOUT)
                order.append(name)
            except TtrpcError as e:
                order.append(f"{name} failed: {e.message}")

        async def body() -> list[str]:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, "sleep", "Sleep", string_value("300ms"))
                nursery.start_soon(call, "echo", "Echo", bytes_value(b"quick"))
            return order

        await self.step(step, body)

    async def run(self) -> list[ScenarioLine]:
        # Unary Echo: text, empty (a zero-length payload both ways), binary, 1 MiB.
        await self.unary("echo_text", "Echo", bytes_value(b"hello, ttrpc"))
        await self.unary("echo_empty", "Echo", b"")
        await self.unary("echo_binary", "Echo", bytes_value(bytes([0, 1, 2, 0xFE, 0xFF, 10, 34])))
        await self.unary("echo_1mib", "Echo", bytes_value(pattern(1 << 20)))
        await self.unary("echo_after_1mib", "Echo", bytes_value(b"still here"))

        # Errors chosen by the handler: status, message and details as sent.
        fails = ["5:no such thing", "16:who are you", "9:caf\u00e9 \u2603 \U0001f600"]
        for request in [*fails, "99:a code beyond the table", "7:", "nonsense"]:
            step = "fail_" + request.partition(":")[0]
            await self.unary(step, "Fail", string_value(request), reply=wrappers_pb2.StringValue)

        # Routing errors, unary and streaming.
        await self.unary("unknown_method", "Nope", bytes_value(b"x"))
        await self.unary("unknown_service", "Echo", bytes_value(b"x"), service=SERVICE + "Nope")
        await self.server_stream("stream_unknown_method", bytes_value(b"1"), method="Nope")

        # Metadata, unary: Go's handler sees every pair, the duplicate key's both values.
        meta = wrappers_pb2.StringValue
        await self.unary("metadata", "Metadata", b"", reply=meta, metadata=METADATA)
        await self.unary(
            "metadata_mapping", "Metadata", b"", reply=meta, metadata={"k": ["1", "2"]}
        )
        await self.unary("metadata_none", "Metadata", b"", reply=meta)

        # Deadlines: a sleep within the deadline; one longer than it.
        await self.unary("sleep_short", "Sleep", string_value("20ms"), reply=meta)
        await self.unary("sleep_within", "Sleep", string_value("20ms"), reply=meta, timeout=10)
        started = trio.current_time()
        line = await self.unary("sleep_timeout", "Sleep", string_value("5s"), timeout=0.2)
        line["result"] = (
            "ended by the deadline" if trio.current_time() - started < 3 else "slept past it"
        )
        await self.unary("sleep_bad_duration", "Sleep", string_value("soon"), reply=meta)
        await self.unary("echo_after_timeout", "Echo", bytes_value(b"next"))

        # Server streaming: 0, 1 and many messages, an empty request, errors before and
        # after messages; and one with metadata (Go's Count does not look at it, but the
        # Request carrying it must be taken as any other).
        for n in ("0", "1", "100"):
            await self.server_stream(f"count_{n}", bytes_value(n.encode()))
        await self.server_stream("count_empty_request", b"")
        await self.server_stream("count_bad_request", bytes_value(b"many"))
        await self.server_stream("count_abort_after_3", bytes_value(b"3!"))
        await self.server_stream("count_with_metadata", bytes_value(b"3"), metadata=METADATA)

        # Client streaming: 0, 1, several (an empty one among them), a burst of 100.
        await self.sum("sum_0", [])
        await self.sum("sum_1", ["only"])
        await self.sum("sum_many", ["a", "b", "", "d", "e", "f", "g", "h", "i", "j"])
        await self.sum("sum_100", numbers(100))
        await self.sum("sum_with_metadata", ["m", "d"], metadata=METADATA)

        # Bidi: 0 messages, ping-pong, a burst of 100 sent before reading any reply.
        await self.chat("chat_0", [], pingpong=False)
        await self.chat("chat_pingpong", ["ping", "", "caf\u00e9", "x1y2"], pingpong=True)
        await self.chat("chat_burst_100", numbers(100), pingpong=False)
        await self.chat("chat_with_metadata", ["md"], pingpong=True, metadata=METADATA)

        # Concurrency on the one connection.
        await self.concurrent("concurrent_unary", CONCURRENT_CALLS)
        await self.completion_order("replies_in_completion_order")
        await self.unary("echo_last", "Echo", bytes_value(b"bye"))
        return self.lines


async def our_scenario(address: str) -> list[ScenarioLine]:
    """Our client's scenario against the Echo server at ``address``, on one connection."""
    with trio.fail_after(SCENARIO_TIMEOUT):
        async with open_client(address) as client:
            return await Scenario(client).run()


def by_step(lines: list[ScenarioLine]) -> dict[str, ScenarioLine]:
    steps = {line["step"]: line for line in lines}
    assert len(steps) == len(lines), "step names must be unique"
    return steps


def outcome(line: ScenarioLine) -> tuple[bool, int, str, list[str]]:
    return line["ok"], line["code"], line["message"], line["details"]


OK: tuple[bool, int, str, list[str]] = (True, 0, "", [])


def check_our_scenario(lines: list[ScenarioLine]) -> None:
    """What the Echo service must answer to our client's scenario, step by step."""
    s = by_step(lines)
    assert (outcome(s["echo_text"]), s["echo_text"]["result"]) == (OK, "hello, ttrpc")
    assert (s["echo_text"]["raw"]) == "hex " + bytes_value(b"hello, ttrpc").hex()
    assert (outcome(s["echo_empty"]), s["echo_empty"]["result"], s["echo_empty"]["raw"]) == (
        OK,
        "",
        "hex ",
    )
    assert s["echo_binary"]["result"] == "hex 000102feff0a22"
    big = pattern(1 << 20)
    assert s["echo_1mib"]["result"] == f"1048576 bytes, sha256 {hashlib.sha256(big).hexdigest()}"
    assert s["echo_1mib"]["raw"] == render_value(bytes_value(big))
    assert s["echo_after_1mib"]["result"] == "still here"

    assert outcome(s["fail_5"]) == (False, 5, "no such thing", [DETAIL])
    assert outcome(s["fail_16"]) == (False, Code.UNAUTHENTICATED, "who are you", [DETAIL])
    assert outcome(s["fail_9"]) == (False, 9, "caf\u00e9 \u2603 \U0001f600", [DETAIL])
    assert outcome(s["fail_99"]) == (False, 99, "a code beyond the table", [DETAIL])
    assert outcome(s["fail_7"]) == (False, Code.PERMISSION_DENIED, "", [DETAIL])
    bad = "fail: want CODE:message, CODE > 0"
    assert outcome(s["fail_nonsense"]) == (False, Code.INVALID_ARGUMENT, bad, [])
    for step in ("fail_5", "fail_nonsense"):
        assert s[step]["result"] is None

    unimplemented = (False, Code.UNIMPLEMENTED)
    assert outcome(s["unknown_method"]) == (*unimplemented, "method Nope", [])
    assert outcome(s["unknown_service"]) == (*unimplemented, f"service {SERVICE}Nope", [])
    assert outcome(s["stream_unknown_method"]) == (*unimplemented, "method Nope", [])
    assert s["stream_unknown_method"]["result"] == []

    assert (outcome(s["metadata"]), s["metadata"]["result"]) == (OK, METADATA_SEEN)
    assert s["metadata_mapping"]["result"] == "k=1\nk=2"
    assert (s["metadata_none"]["result"], s["metadata_none"]["raw"]) == ("", "hex ")

    assert s["sleep_short"]["result"] == s["sleep_within"]["result"] == "20ms"
    timeout = s["sleep_timeout"]
    assert outcome(timeout) == (False, Code.DEADLINE_EXCEEDED, "context deadline exceeded", [])
    assert timeout["result"] == "ended by the deadline"
    bad_duration = (False, Code.INVALID_ARGUMENT, "sleep: bad duration", [])
    assert outcome(s["sleep_bad_duration"]) == bad_duration
    assert s["echo_after_timeout"]["result"] == "next"

    for n in (0, 1, 100):
        assert (outcome(s[f"count_{n}"]), s[f"count_{n}"]["result"]) == (OK, numbers(n))
    bad_count = (False, Code.INVALID_ARGUMENT, "count: want a decimal count", [])
    for step in ("count_empty_request", "count_bad_request"):
        assert (outcome(s[step]), s[step]["result"]) == (bad_count, [])
    aborted = (False, Code.ABORTED, "count: aborted after 3", [])
    assert (outcome(s["count_abort_after_3"]), s["count_abort_after_3"]["result"]) == (
        aborted,
        numbers(3),
    )
    assert (outcome(s["count_with_metadata"]), s["count_with_metadata"]["result"]) == (
        OK,
        numbers(3),
    )

    assert s["sum_0"]["result"] == [""]
    assert s["sum_1"]["result"] == ["only"]
    assert s["sum_many"]["result"] == ["a,b,,d,e,f,g,h,i,j"]
    assert (outcome(s["sum_100"]), s["sum_100"]["result"]) == (
        OK,
        [render_value(",".join(numbers(100)).encode())],
    )
    assert s["sum_with_metadata"]["result"] == ["m,d"]

    assert (outcome(s["chat_0"]), s["chat_0"]["result"]) == (OK, [])
    assert s["chat_pingpong"]["result"] == ["PING", "", "hex 434146c3a9", "X1Y2"]
    assert (outcome(s["chat_burst_100"]), s["chat_burst_100"]["result"]) == (OK, numbers(100))
    assert s["chat_with_metadata"]["result"] == ["MD"]

    concurrent = s["concurrent_unary"]
    assert (outcome(concurrent), concurrent["result"]) == (OK, "64 of 64 ok")
    assert s["replies_in_completion_order"]["result"] == ["echo", "sleep"]
    assert s["echo_last"]["result"] == "bye"


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_our_client_against_go_and_our_servers(
    transport: str, go_peer: Path, socket_dir: Path, nursery: trio.Nursery
) -> None:
    unix = transport == "unix"
    go_address = f"unix:{socket_dir / 'go.sock'}" if unix else "tcp:127.0.0.1:0"
    async with go_server(go_peer, go_address) as server:
        go_lines = await our_scenario(server.address)
        assert server.alive, server.log()
        assert "panic" not in server.log(), server.log()
    ours = await nursery.start(
        serve_echo, f"unix:{socket_dir / 'ours.sock'}" if unix else "tcp:127.0.0.1:0"
    )
    our_lines = await our_scenario(ours)

    check_our_scenario(go_lines)  # our client, as Go's server answers
    if diff := scenario_diff(go_lines, our_lines):
        pytest.fail(f"our client saw our server answer otherwise than Go's:\n{diff}", False)


# -- Go's client through our proxy ----------------------------------------------------------------


def addresses(transport: str, socket_dir: Path) -> tuple[str, str]:
    """The Go server's address and the proxy's bind."""
    if transport == "unix":
        return f"unix:{socket_dir / 'go.sock'}", f"unix:{socket_dir / 'gw.sock'}"
    return "tcp:127.0.0.1:0", "127.0.0.1:0"


def go_connections(server: GoServer) -> int:
    """Connections the Go server has open (its sockets but the listener), from /proc."""
    sockets = 0
    for fd in Path(f"/proc/{server.process.pid}/fd").iterdir():
        try:
            sockets += os.readlink(fd).startswith("socket:")
        except FileNotFoundError:  # closed meanwhile
            pass
    return sockets - 1


async def wait_for_go_connections(server: GoServer, count: int) -> None:
    with trio.fail_after(10):
        while go_connections(server) != count:
            await trio.sleep(0.01)


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_go_client_through_our_proxy_to_go_server(
    transport: str, go_peer: Path, socket_dir: Path, tmp_path: Path
) -> None:
    go_address, bind = addresses(transport, socket_dir)
    async with go_server(go_peer, go_address) as server:
        direct = await run_go_client(go_peer, server.address)
        async with running_gateway(proxy_config(tmp_path, bind, server.address)) as gw:
            proxy = gw.addresses["rpc"][0]
            assert proxy.startswith("unix:") == (transport == "unix")
            proxied = await run_go_client(go_peer, proxy)
        check_go_log(server)

    steps = by_step(direct)
    assert steps["echo_text"]["result"] == "hello, ttrpc"
    assert outcome(steps["fail_5"]) == (False, 5, "no such thing", [DETAIL])
    assert steps["metadata"]["result"] == METADATA_SEEN
    assert steps["chat_burst_100"]["result"] == numbers(100)
    if diff := scenario_diff(direct, proxied, names=("direct", "proxied")):
        pytest.fail(
            f"the Go client saw our proxy answer otherwise than Go's server:\n{diff}", False
        )


@pytest.mark.parametrize("transport", ["tcp", "unix"])
async def test_go_clients_at_once_share_the_proxys_upstream_connection(
    transport: str, go_peer: Path, socket_dir: Path, tmp_path: Path
) -> None:
    go_address, bind = addresses(transport, socket_dir)
    async with go_server(go_peer, go_address) as server:
        direct = await run_go_client(go_peer, server.address)
        await wait_for_go_connections(server, 0)
        # One connection to the Go server at most: the one the upstream keeps open.
        data = proxy_config(tmp_path, bind, server.address, max_connections=1)
        async with running_gateway(data) as gw:
            proxy = gw.addresses["rpc"][0]
            await wait_for_go_connections(server, 1)
            outputs: dict[int, list[ScenarioLine]] = {}
            seen: list[int] = []

            async def client(i: int) -> None:
                outputs[i] = await run_go_client(go_peer, proxy)

            async with trio.open_nursery() as nursery:

                async def sample() -> None:  # the Go server's connections meanwhile
                    while True:
                        seen.append(go_connections(server))
                        await trio.sleep(0.005)  # real time: sampling another process's sockets

                nursery.start_soon(sample)
                with trio.fail_after(SCENARIO_TIMEOUT * 2):
                    async with trio.open_nursery() as clients:
                        for i in range(GO_CLIENTS):
                            clients.start_soon(client, i)
                nursery.cancel_scope.cancel()
            assert go_connections(server) == 1
        check_go_log(server)

    assert seen, "no sample of the Go server's connections"
    assert max(seen) == 1, f"the Go server's connections while proxied: {seen}"
    for i in range(GO_CLIENTS):
        if diff := scenario_diff(direct, outputs[i], names=("direct", f"proxied {i}")):
            pytest.fail(f"Go client {i} of {GO_CLIENTS} through our proxy:\n{diff}", False)
