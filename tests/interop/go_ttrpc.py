"""containerd's Go ttrpc as a peer for tests: build ``ttrpc_go/`` once, then run it.

The Go program (``ttrpc_go/``, beside this file) is a server of the Echo test service
(``echo_service.py`` is the same service on Interchange's server), a client that runs a
fixed scenario against any Echo server and prints one JSON line per step, and a unary
benchmark. Every function here takes any address the program takes: ``tcp:host:port``
(port 0: any, the server reports the one it bound), ``host:port`` or ``unix:/path``.

It is built in GOPATH mode from Debian's Go sources, so no module proxy is needed:
``golang-go`` and ``golang-github-containerd-ttrpc-dev`` 1.2.x (with the protobuf
packages it needs), as ``bash .ci/go-interop-deps`` installs them. A missing piece fails
the tests that need the program, naming it, unless ``INTERCHANGE_SKIP_GO=1`` is set,
which skips them instead.

Use from a test module (``tests/`` is on pytest's pythonpath; pytest finds fixtures
among a module's globals, so bind them there)::

    from interop import go_ttrpc
    from interop.go_ttrpc import go_server, run_go_client

    go_peer = go_ttrpc.go_peer  # the program, built once per session

    async def test_x(go_peer: Path) -> None:
        async with go_server(go_peer) as server:
            lines = await run_go_client(go_peer, server.address)
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import pytest
import trio

from bench._process import ReadyProcess, ready_process

__all__ = [
    "CLIENT_STREAMING",
    "GO_SOURCE",
    "GoServer",
    "ScenarioLine",
    "build_go_peer",
    "check_go_log",
    "find_go",
    "go_peer",
    "go_server",
    "proxy_config",
    "run_go_bench",
    "run_go_client",
    "scenario_diff",
    "socket_dir",
]

#: The Go program's package.
GO_SOURCE = Path(__file__).with_name("ttrpc_go")
#: Where Debian's golang-*-dev packages put their sources (a GOPATH entry).
DEBIAN_GOCODE = Path("/usr/share/gocode")
SKIP_VARIABLE = "INTERCHANGE_SKIP_GO"
INSTALL = "bash .ci/go-interop-deps (as root, on Debian bookworm)"

#: Go import paths the program needs: the Debian package that provides each, and a
#: file in it that only the version needed has.
REQUIRED = {
    "github.com/containerd/ttrpc": (
        "golang-github-containerd-ttrpc-dev 1.2.x (from trixie: bookworm's 1.1 has no streaming)",
        "stream_server.go",
    ),
    "google.golang.org/protobuf/types/known/wrapperspb": (
        "golang-google-protobuf-dev",
        "wrappers.pb.go",
    ),
    "github.com/golang/protobuf/proto": (
        "golang-github-golang-protobuf-1-5-dev (1.3's APIv1 does not work with ttrpc 1.2)",
        "registry.go",
    ),
    "google.golang.org/grpc/status": ("golang-google-grpc-dev", "status.go"),
}

#: The Echo service's methods that take the client's messages (its client-streaming and
#: bidi ones), as a proxy's upstream must be told (``client_streaming``).
CLIENT_STREAMING = ["interchange.test.Echo/Sum", "interchange.test.Echo/Chat"]

#: One step of the client scenario: step, ok, code, message, details, result.
ScenarioLine = dict[str, Any]

#: How long the server may take to print ``ready``, and to exit after SIGTERM.
START_TIMEOUT = 10.0
STOP_TIMEOUT = 5.0


def _missing(what: str) -> NoReturn:
    """Fail (or, with INTERCHANGE_SKIP_GO=1, skip) for a missing piece of the Go peer."""
    if os.environ.get(SKIP_VARIABLE) == "1":
        pytest.skip(f"{what}, and {SKIP_VARIABLE}=1: Go ttrpc interop skipped")
    pytest.fail(
        f"the Go ttrpc interop tests need {what}. Install it: {INSTALL};"
        f" or set {SKIP_VARIABLE}=1 to skip these tests",
        pytrace=False,
    )


def _gopath_sources() -> list[Path]:
    """The GOPATH entries to build with, after the build's own: the user's, then Debian's."""
    entries = [Path(p) for p in os.environ.get("GOPATH", "").split(os.pathsep) if p]
    return [*entries, DEBIAN_GOCODE]


def find_go() -> tuple[str, list[Path]]:
    """``go`` and the GOPATH entries holding every package needed; fails (or skips)
    naming the first missing piece."""
    go = shutil.which("go")
    if go is None:
        _missing("Go: no `go` on PATH (Debian: golang-go)")
    sources = _gopath_sources()
    for package, (debian, marker) in REQUIRED.items():
        found = [s / "src" / package for s in sources if (s / "src" / package).is_dir()]
        if not found:
            where = ", ".join(str(s / "src") for s in sources)
            _missing(f"the Go package {package} (Debian: {debian}); looked in {where}")
        if not any((d / marker).is_file() for d in found):
            _missing(f"a newer {package}: {found[0]} lacks {marker} (Debian: {debian})")
    return go, sources


def go_build(source: Path, output: Path, gopath: Path, root: Path, what: str) -> None:
    """``go build`` ``source`` into ``output`` in GOPATH mode (``gopath`` first, then
    Debian's sources), offline; the test fails naming ``what`` if it does not build."""
    go, sources = find_go()
    env = dict(os.environ)
    env.update(
        GO111MODULE="off",  # GOPATH mode: Debian's sources, no go.mod, no proxy
        GOPROXY="off",
        GOFLAGS="",
        GOTOOLCHAIN="local",
        GOPATH=os.pathsep.join(str(p) for p in [gopath, *sources]),
    )
    if not any(env.get(v) for v in ("GOCACHE", "XDG_CACHE_HOME", "HOME")):
        env["GOCACHE"] = str(root / "cache")  # go needs somewhere to cache builds
    build = subprocess.run(
        [go, "build", "-o", str(output), "."],
        cwd=source,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if build.returncode != 0:
        pytest.fail(f"building {what} failed:\n{build.stderr}", pytrace=False)


def build_go_peer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go program, built on first use in this test session (under pytest's base
    temporary directory, so every module that asks gets the same binary)."""
    root = tmp_path_factory.getbasetemp() / "go-ttrpc-peer"
    binary = root / "ttrpc_go"
    if binary.is_file():
        return binary
    root.mkdir(exist_ok=True)
    partial = root / "ttrpc_go.partial"
    started = time.monotonic()
    go_build(GO_SOURCE, partial, root / "gopath", root, f"the Go ttrpc peer ({GO_SOURCE.name}/)")
    partial.rename(binary)
    (root / "build-seconds").write_text(f"{time.monotonic() - started:.2f}\n")
    return binary


@pytest.fixture(scope="session")
def go_peer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Go ttrpc program (server, client, bench), built once per test session."""
    return build_go_peer(tmp_path_factory)


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A directory with a short path, for unix sockets (``sun_path`` holds 108 bytes;
    pytest's ``tmp_path`` can be longer)."""
    with tempfile.TemporaryDirectory(prefix="ttrpc-") as directory:
        yield Path(directory)


#: A running Go Echo server: ``address`` (as the program takes it, e.g.
#: ``tcp:127.0.0.1:PORT``), ``log()`` (its stderr so far: logrus lines, e.g. a panic or
#: ``received message on inactive stream``), ``alive`` (a Go ttrpc 1.2.4 server dies
#: of some bad input).
GoServer = ReadyProcess


@asynccontextmanager
async def go_server(binary: Path, address: str = "tcp:127.0.0.1:0") -> AsyncIterator[GoServer]:
    """Run the Go Echo server on ``address`` for the ``with`` block: returns once it
    listens, stops it (SIGTERM, then SIGKILL) at exit. Its stderr goes to a temporary
    file, so no task has to drain a pipe."""
    async with ready_process(
        [str(binary), "server", "-addr", address],
        address,
        what="the Go ttrpc server",
        start_timeout=START_TIMEOUT,
        stop_timeout=STOP_TIMEOUT,
    ) as server:
        yield server


def check_go_log(server: GoServer) -> None:
    """The Go server is alive and its log has no panic."""
    assert server.alive, server.log()
    assert "panic" not in server.log().lower(), server.log()


def proxy_config(
    tmp_path: Path, bind: str, upstream: str, **upstream_options: Any
) -> dict[str, Any]:
    """A gateway whose ttrpc listener on ``bind`` relays ``interchange.test.*`` to the Echo
    server at ``upstream`` (the upstream ``go``, ``upstream_options`` added), for
    ``harness.running_gateway``."""
    return {
        "gateway": {"data_dir": str(tmp_path / "data"), "drain_timeout": "100ms"},
        "listeners": [
            {
                "name": "rpc",
                "protocol": "ttrpc",
                "bind": bind,
                "services": [{"match": "interchange.test.*", "upstream": "go"}],
            }
        ],
        "upstreams": [
            {
                "name": "go",
                "protocol": "ttrpc",
                # The gateway's TCP addresses are host:port, the Go program's tcp:host:port.
                "connect": [upstream.removeprefix("tcp:")],
                "backoff_initial": "20ms",
                "client_streaming": CLIENT_STREAMING,
            }
            | upstream_options
        ],
    }


async def _run(args: list[str], timeout: float) -> str:
    """Run the program to the end; its stdout, or AssertionError with its stderr."""
    with trio.fail_after(timeout):
        done = await trio.run_process(
            args, stdin=b"", capture_stdout=True, capture_stderr=True, check=False
        )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(args[1:])} exited with {done.returncode}:\n"
            + done.stderr.decode("utf-8", "replace")
        )
    return done.stdout.decode("utf-8")


async def run_go_client(
    binary: Path, address: str, *, timeout: float = 120.0
) -> list[ScenarioLine]:
    """Run the Go client's scenario against the Echo server at ``address``: one dict per
    step (``step``, ``ok``, ``code``, ``message``, ``details``, ``result``), in order.
    The lines depend only on the server's replies, so two servers' lists compare equal
    exactly when their replies do."""
    out = await _run([str(binary), "client", "-addr", address], timeout)
    return [json.loads(line) for line in out.splitlines()]


async def run_go_bench(
    binary: Path,
    address: str,
    *,
    concurrency: int = 1,
    seconds: float = 1.0,
    size: int = 16,
    conns: int = 1,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run the Go unary benchmark against the Echo server at ``address``: ``concurrency``
    goroutines over ``conns`` connections call Echo with ``size`` bytes for ``seconds``.
    Returns its JSON: calls, seconds, calls_per_s, concurrency, conns, size, errors,
    first_error, p50_us, p99_us (latencies of the successful calls)."""
    args = [str(binary), "bench", "-addr", address, "-c", str(concurrency)]
    args += ["-conns", str(conns), "-d", str(seconds), "-size", str(size)]
    out = await _run(args, seconds + 60 if timeout is None else timeout)
    result: dict[str, Any] = json.loads(out)
    return result


def scenario_diff(
    expected: list[ScenarioLine],
    actual: list[ScenarioLine],
    *,
    names: tuple[str, str] = ("go", "ours"),
) -> str:
    """Nothing when the two scenario outputs are the same; else, for a test's failure
    message, each step that differs with both lines, then a unified diff."""
    if expected == actual:
        return ""

    def text(line: ScenarioLine) -> str:
        return json.dumps(line, ensure_ascii=False)

    want = {line.get("step"): line for line in expected}
    got = {line.get("step"): line for line in actual}
    out = []
    for step in dict.fromkeys([*want, *got]):
        if want.get(step) != got.get(step):
            out.append(f"step {step}:")
            for name, lines in zip(names, (want, got), strict=True):
                out.append(f"  {name:>6}: {text(lines[step]) if step in lines else '(missing)'}")
    diff = difflib.unified_diff(
        [text(line) for line in expected],
        [text(line) for line in actual],
        fromfile=names[0],
        tofile=names[1],
        lineterm="",
    )
    return "\n".join([*out, "", *diff])
