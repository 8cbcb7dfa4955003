"""ttrpc unary Echo: our client and server, Go's, and our proxy between two Go peers.

Issue 12's benchmark: unary calls of ``interchange.test.Echo/Echo`` with a
16-byte ``BytesValue``, ``--concurrency`` calls outstanding (a closed loop),
over ``--transport`` TCP or unix sockets. One run measures these pairs, one
after the other on the same machine, so that they can be compared:

* ``py``: our client (``protocols.ttrpc.client``, in this process: N tasks
  sharing one connection) ↔ our server (``TtrpcSession`` serving
  ``tests/interop/echo_service.py``, in a process of its own:
  ``bench/_ttrpc_server.py``);
* ``go-py``: the Go client (containerd's ttrpc 1.2, the interop peer of
  ``tests/interop/``) → our server;
* ``go``: Go client ↔ Go server, the reference;
* ``go-proxy``: Go client → our gateway (``python -m gateway run``, a ttrpc
  listener whose route relays ``interchange.test.*`` to a ttrpc upstream) →
  the same Go server.

With ``--proxy-workers 1,2,2,1`` the ``go-proxy`` pair is measured once per
entry instead, each time with a gateway of its own started as ``gateway run
--workers N`` (ABBA: a drift of the machine weighs on both sides alike); its
figures are named ``"<transport> c=<N> go-proxy w=<workers>"``, the gateway's
CPU is that of the supervisor and each worker (``gateway worker K``), and
``go-proxy w=2 / w=1`` compares them. Use ``--conns`` of at least the number of
workers: the Go client's connections are what the workers share out.

Each pair gets ``--warmup`` seconds of load (not counted), then ``--seconds``
measured. With the runner's ``--wait-idle S`` each pair first waits (up to S
seconds) for a quiet machine, since a run lasts a minute or more and the
machine's other work comes and goes. With ``--rounds N`` the pairs take turns
N times and their figures add up (calls / time; CPU / calls; the median of
the rounds' Go percentiles).
The Go client is a new process (and connection) for each warm-up and each
measurement; ours opens a new connection for each. ``--concurrency`` and
``--transport`` take comma lists (``1,64``, ``tcp,unix``): each combination
is a set of figures named ``"<transport> c=<N> <pair> …"``.

Reported per pair: calls/s, p50/p99 latency (the Go client's own figures;
ours from every call of the window), CPU time per call of each process
involved (our server, the gateway and the Go server from ``/proc/<pid>/stat``,
the Go client from this process's ``RUSAGE_CHILDREN``, our client from its
own process time), the load of the process served, and what other processes
used meanwhile. Then ``go-proxy / go`` (the issue's target: at least 0.5)
and ``py`` at c=64 against its target of 10 000 calls/s.

Self-checks (any failure: exit 1): the Go peer could be built (if a pair
needs it; ``--pairs py`` runs without Go); every call answered OK (the Go
client's ``errors`` is 0; our client's calls raise nothing) and every reply
of our client equals its request; the proxy really relayed: the gateway's
listener serves no local service (``messaging = false``), its /metrics count
at least a request's and a reply's bytes per call the Go client completed,
and its upstream connected; our server, the Go server and the gateway were
alive throughout and exited cleanly, with no warning in the gateway's log.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import re
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import trio
from google.protobuf import wrappers_pb2

from protocols.ttrpc.client import open_client
from protocols.ttrpc.status import TtrpcError

from . import Result, add_warmup, int_at_least, percentile, register
from ._gateway import RunningGateway, supervise, to_toml
from ._ndjson import check_gateway
from ._process import ReadyProcess, cpu_times, ready_process
from ._system import busy_seconds, wait_for_idle
from .lumberjack import SupervisedGateway

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

SERVICE = "interchange.test.Echo"
METHOD = "Echo"
#: The pairs, in the order they run in each round.
PAIRS = ("py", "go-py", "go", "go-proxy")
GO_PAIRS = frozenset({"go-py", "go", "go-proxy"})
TRANSPORTS = ("tcp", "unix")
#: Issue 12's targets: our server at c=64, and the proxy against Go ↔ Go.
TARGET_CALLS = 10_000
TARGET_CONCURRENCY = 64
TARGET_PROXY_RATIO = 0.5
#: Cores' worth of CPU used by others under which the machine counts as quiet (as the
#: runner's ``--wait-idle``, which this benchmark also applies before each pair).
IDLE_THRESHOLD = 0.15

LISTENER = "rpc"
UPSTREAM = "go"
#: How long our server may take to import and listen, and to exit after SIGTERM.
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
#: Seconds our client's tasks have to finish their last calls after the window.
DRAIN_TIMEOUT = 10.0
#: ttrpc's frame header: length, stream id, type, flags.
FRAME_HEADER = 10

_METRICS_LINE = re.compile(r"metrics: GET /metrics on (\S+)")


# -- options -------------------------------------------------------------------------------


def _list_of(convert: Callable[[str], Any], choices: tuple[str, ...] = ()) -> Callable[[str], Any]:
    """An option type: a comma-separated list of values, each converted, in order, unique."""

    def parse(text: str) -> list[Any]:
        values = []
        for part in text.split(","):
            part = part.strip()
            if choices and part not in choices:
                raise argparse.ArgumentTypeError(f"{part!r} is not one of {', '.join(choices)}")
            value = convert(part)
            if value not in values:
                values.append(value)
        if not values:
            raise argparse.ArgumentTypeError("give at least one value")
        return values

    return parse


def _list_of_any(convert: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    """An option type: a comma-separated list of values, each converted, repeats kept."""

    def parse(text: str) -> list[Any]:
        return [convert(part.strip()) for part in text.split(",")]

    return parse


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--transport",
        type=_list_of(str, TRANSPORTS),
        default=["tcp"],
        help="tcp (127.0.0.1), unix (a socket in a temporary folder), or both: tcp,unix "
        "(default: tcp)",
    )
    parser.add_argument(
        "--concurrency",
        type=_list_of(int_at_least(1)),
        default=[64],
        help="calls outstanding at once, or a list such as 1,64 (default: 64)",
    )
    parser.add_argument(
        "--pairs",
        type=_list_of(str, PAIRS),
        default=list(PAIRS),
        help=f"which pairs to measure (default: all of {','.join(PAIRS)}); "
        "py needs no Go, the others do",
    )
    parser.add_argument(
        "--rounds",
        type=int_at_least(1),
        default=1,
        help="measure each pair this many times, the pairs taking turns (default: %(default)s)",
    )
    add_warmup(parser, "before each measurement")
    parser.add_argument(
        "--size",
        type=int_at_least(0),
        default=16,
        help="Echo payload bytes (the BytesValue's value; default: %(default)s)",
    )
    parser.add_argument(
        "--conns",
        type=int_at_least(1),
        default=1,
        help="connections the Go client spreads its calls over (default: %(default)s; "
        "ours always uses one)",
    )
    parser.add_argument(
        "--proxy-workers",
        type=_list_of_any(int_at_least(1)),
        default=[],
        help="measure go-proxy once per entry, each with a new `gateway run --workers N`, "
        "in this order, e.g. 1,2,2,1 (default: one gateway, one process)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="run the gateway (go-proxy) under cProfile, stats written to PATH when it exits; "
        "its figures are then not comparable",
    )


# -- processes -----------------------------------------------------------------------------


def cpu_seconds(pid: int | None) -> float | None:
    """User plus system CPU seconds of process ``pid`` so far (None if unknown or gone)."""
    times = None if pid is None else cpu_times(pid)
    return None if times is None else times[0] + times[1]


def children_cpu_seconds() -> float:
    """CPU seconds of this process's children that ended and were waited for."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


#: Our Echo server's process (``bench/_ttrpc_server.py``).
OurServer = ReadyProcess


@contextlib.asynccontextmanager
async def our_server(address: str) -> AsyncIterator[OurServer]:
    """Run our Echo server on ``address`` for the block (stderr to a temporary file)."""
    async with ready_process(
        [sys.executable, "-m", "bench._ttrpc_server", address],
        address,
        what="our ttrpc server",
        start_timeout=START_TIMEOUT,
        stop_timeout=STOP_TIMEOUT,
        cwd=ROOT,
    ) as server:
        yield server


def _go_helpers() -> Any:
    """``tests/interop/go_ttrpc.py`` (the Go peer's build and runners), imported from the
    tests tree."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from interop import go_ttrpc

    return go_ttrpc


class _BuildDir:
    """What ``build_go_peer`` needs of pytest's ``tmp_path_factory``: a base folder.

    One per version of the Go sources, in the system's temporary folder, so the
    program is built once and rebuilt when its sources change.
    """

    def __init__(self, sources: Path) -> None:
        digest = hashlib.sha256()
        for path in sorted(sources.glob("*.go")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        self.base = Path(tempfile.gettempdir()) / f"interchange-bench-go-{digest.hexdigest()[:12]}"

    def getbasetemp(self) -> Path:
        self.base.mkdir(parents=True, exist_ok=True)
        return self.base


def build_go() -> tuple[Path | None, str]:
    """The Go peer's binary, built by the tests' own logic; else None and why not."""
    try:
        go_ttrpc = _go_helpers()
    except ImportError as e:
        return None, f"cannot import the Go peer's helpers (tests/interop/go_ttrpc.py): {e}"
    import pytest  # go_ttrpc reports a missing piece with pytest.fail / pytest.skip

    outcomes = (pytest.fail.Exception, pytest.skip.Exception)
    try:
        binary = go_ttrpc.build_go_peer(cast(Any, _BuildDir(go_ttrpc.GO_SOURCE)))
    except outcomes as e:  # BaseExceptions, raised for a missing Go or a failed build
        return None, str(getattr(e, "msg", e))
    return Path(binary), ""


# -- the gateway -----------------------------------------------------------------------------


def gateway_toml(args: argparse.Namespace, bind: str, upstream: str, data_dir: Path) -> str:
    """A ttrpc listener on ``bind`` with no local service, relaying ``interchange.test.*``
    to the ttrpc upstream at ``upstream``; the metrics endpoint on loopback."""
    config: dict[str, Any] = {
        "gateway": {"log_level": "info", "data_dir": str(data_dir), "drain_timeout": "2s"},
        "metrics": {"bind": "127.0.0.1:0"},
        "upstreams": [{"name": UPSTREAM, "protocol": "ttrpc", "connect": [upstream]}],
        "listeners": [
            {
                "name": LISTENER,
                "protocol": "ttrpc",
                "bind": bind,
                # No interchange.v1.Messaging: a call can only be answered by the upstream.
                "messaging": False,
                "max_calls": max(1024, *args.concurrency),
                "services": [{"match": f"{SERVICE.rsplit('.', 1)[0]}.*", "upstream": UPSTREAM}],
            }
        ],
    }
    return to_toml(config)


@contextlib.asynccontextmanager
async def proxy_gateway(
    args: argparse.Namespace, bind: str, upstream: str, tmp: Path, workers: int = 0
) -> AsyncIterator[SupervisedGateway]:
    """``python -m gateway run`` with :func:`gateway_toml` for the block (with
    ``--workers N`` when ``workers`` is given; the block starts once every worker serves)."""
    path = tmp / "gateway.toml"
    path.write_text(gateway_toml(args, bind, upstream, tmp / "data"), encoding="utf-8")
    command = [sys.executable, "-m", "gateway", "run", str(path)]
    if workers:
        command += ["--workers", str(workers)]
    if args.profile is not None:
        command[1:1] = ["-m", "cProfile", "-o", str(args.profile.resolve())]
    running = SupervisedGateway(max(1, workers))
    async with supervise(command, running, cwd=ROOT):
        if not await running.wait_for_workers(START_TIMEOUT):
            raise RuntimeError(f"not every worker of the gateway served within {START_TIMEOUT:g}s")
        yield running


def metrics_address(gw: RunningGateway) -> str | None:
    for line in gw.log:
        if m := _METRICS_LINE.search(line):
            return m.group(1)
    return None


async def scrape(address: str | None) -> dict[str, float]:
    """Every sample of the gateway's /metrics (``name{labels}`` → value); empty if none."""
    if address is None:
        return {}
    host, _, port = address.rpartition(":")
    body = bytearray()
    with trio.move_on_after(5):
        stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
        async with stream:
            request = f"GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
            await stream.send_all(request.encode())
            while data := await stream.receive_some(65536):
                body += data
    samples = {}
    for line in body.decode("utf-8", "replace").partition("\r\n\r\n")[2].splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                samples[name] = float(value)
    return samples


# -- one measurement -------------------------------------------------------------------------


@dataclass
class Sample:
    """One measured window of one pair."""

    calls: int = 0
    #: The window's length as the client timed it (calls / seconds = the rate).
    seconds: float = math.nan
    #: Wall time around it, for the CPU loads (the Go client's start and exit included).
    wall: float = math.nan
    p50_us: float = math.nan
    p99_us: float = math.nan
    #: Our client's latencies (seconds); None for the Go client, which gives percentiles.
    latencies: list[float] | None = None
    #: CPU seconds in the window, by process ("our server", "gateway", "Go client", ...).
    cpu: dict[str, float] = field(default_factory=dict)
    #: CPU seconds the rest of the machine used in the window (None off Linux).
    others: float | None = None
    problems: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)


class Clocks:
    """CPU clocks of the watched processes, this one, its children and the machine."""

    def __init__(self, watched: Mapping[str, int | None]) -> None:
        self.watched = dict(watched)
        self.wall = time.perf_counter()
        self.procs = {name: cpu_seconds(pid) for name, pid in self.watched.items()}
        self.own = time.process_time()
        self.children = children_cpu_seconds()
        self.busy = busy_seconds()

    def into(self, sample: Sample, end: Clocks, *, client: str | None) -> None:
        """Fill ``sample``'s CPU figures from here to ``end``; ``client`` names this
        process's own CPU (our client) or, if None, its children's (the Go client)."""
        sample.wall = end.wall - self.wall
        ours = 0.0
        for name, before in self.procs.items():
            after = end.procs.get(name)
            if before is not None and after is not None:
                sample.cpu[name] = after - before
                ours += after - before
        own, children = end.own - self.own, end.children - self.children
        sample.cpu[client or "Go client"] = own if client else children
        ours += own + children
        if self.busy is not None and end.busy is not None:
            sample.others = max(0.0, end.busy - self.busy - ours)


async def go_sample(
    binary: Path, address: str, args: argparse.Namespace, c: int, watched: Mapping[str, int | None]
) -> Sample:
    """The Go client against ``address``: a warm-up run, then the measured one."""
    go_ttrpc = _go_helpers()
    sample = Sample()
    options = {"concurrency": c, "size": args.size, "conns": args.conns}
    try:
        if args.warmup > 0:
            warm = await go_ttrpc.run_go_bench(binary, address, seconds=args.warmup, **options)
            if warm.get("errors"):
                sample.problems.append(f"warm-up: {warm['errors']} errors: {warm['first_error']}")
        start = Clocks(watched)
        out = await go_ttrpc.run_go_bench(binary, address, seconds=args.seconds, **options)
        start.into(sample, Clocks(watched), client=None)
    except (AssertionError, trio.TooSlowError, ValueError) as e:
        sample.problems.append(f"the Go client failed: {e}")
        return sample
    sample.details["go"] = out
    sample.calls = int(out["calls"])
    sample.seconds = float(out["seconds"])
    sample.p50_us, sample.p99_us = float(out["p50_us"]), float(out["p99_us"])
    if out["errors"]:
        sample.problems.append(f"{out['errors']} calls failed, the first: {out['first_error']}")
    if not sample.calls:
        sample.problems.append("the Go client completed no call")
    return sample


class PyLoad:
    """Our client's closed loop: ``c`` tasks calling Echo on one connection."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.calls = 0
        self.mismatches = 0
        self.errors = 0
        self.first_error = ""
        self.measuring = False
        self.stopping = False
        self.latencies: list[float] = []
        self.running = 0
        #: Set when the last caller has returned.
        self.done = trio.Event()

    async def caller(self, call: Callable[..., Any]) -> None:
        self.running += 1
        try:
            await self._loop(call)
        finally:
            self.running -= 1
            if not self.running:
                self.done.set()

    async def _loop(self, call: Callable[..., Any]) -> None:
        payload, perf_counter, latencies = self.payload, time.perf_counter, self.latencies
        while not self.stopping:
            before = perf_counter()
            try:
                reply = await call(SERVICE, METHOD, payload)
            except TtrpcError as e:
                self.errors += 1
                self.first_error = self.first_error or f"{e.code}: {e.message}"
                self.stopping = True  # one failure is enough to fail the run
                return
            if self.measuring:
                latencies.append(perf_counter() - before)
            if reply != payload:
                self.mismatches += 1
            self.calls += 1


async def py_sample(
    address: str, args: argparse.Namespace, c: int, watched: Mapping[str, int | None]
) -> Sample:
    """Our client against ``address`` on a new connection: warm-up, then the window."""
    sample = Sample()
    load = PyLoad(echo_request(args.size))
    try:
        await _py_window(address, args, c, watched, sample, load)
    except OSError as e:
        sample.problems.append(f"our client could not connect: {e}")
        return sample
    return sample


async def _py_window(
    address: str,
    args: argparse.Namespace,
    c: int,
    watched: Mapping[str, int | None],
    sample: Sample,
    load: PyLoad,
) -> None:
    async with open_client(address) as client, trio.open_nursery() as nursery:
        for _ in range(c):
            nursery.start_soon(load.caller, client.call)
        await trio.sleep(args.warmup)
        start, calls0 = Clocks(watched), load.calls
        load.measuring = True
        await trio.sleep(args.seconds)
        load.measuring = False
        end, calls1 = Clocks(watched), load.calls
        load.stopping = True
        with trio.move_on_after(DRAIN_TIMEOUT) as draining:
            await load.done.wait()
        if draining.cancelled_caught:
            sample.problems.append(f"calls still unanswered {DRAIN_TIMEOUT:g}s after the window")
            nursery.cancel_scope.cancel()
    start.into(sample, end, client="our client")
    sample.calls = calls1 - calls0
    sample.seconds = end.wall - start.wall
    sample.latencies = load.latencies
    ordered = sorted(load.latencies)
    sample.p50_us = percentile(ordered, 50) * 1e6
    sample.p99_us = percentile(ordered, 99) * 1e6
    if load.errors:
        sample.problems.append(f"{load.errors} calls failed, the first: {load.first_error}")
    if load.mismatches:
        sample.problems.append(f"{load.mismatches} replies differ from their request")
    if not sample.calls:
        sample.problems.append("our client completed no call in the window")


def pattern(n: int) -> bytes:
    """The Go client's payload: byte i is i mod 251."""
    return bytes(i % 251 for i in range(n))


def echo_request(size: int) -> bytes:
    """The Echo request (and reply) message: a BytesValue of ``size`` pattern bytes."""
    return wrappers_pb2.BytesValue(value=pattern(size)).SerializeToString()


# -- a run -----------------------------------------------------------------------------------


@dataclass
class Processes:
    """What runs for one transport: the servers and the gateway (each None if unused)."""

    ours: OurServer | None = None
    go: Any = None  # go_ttrpc.GoServer
    gateway: SupervisedGateway | None = None
    gateway_address: str = ""
    metrics: str | None = None

    def pids(self, pair: str) -> dict[str, int | None]:
        """The processes whose CPU counts for ``pair``, by name."""
        if pair in ("py", "go-py"):
            return {"our server": self.ours.process.pid if self.ours else None}
        go = {"Go server": self.go.process.pid if self.go else None}
        if pair == "go-proxy":
            return {**self.gateway_pids(), **go}
        return go

    def gateway_pids(self) -> dict[str, int | None]:
        """The gateway's process, or its supervisor and each worker."""
        tree = self.gateway.tree() if self.gateway is not None else []
        if len(tree) <= 1:
            return {"gateway": tree[0] if tree else None}
        supervisor, *workers = tree
        named = {f"gateway worker {k + 1}": pid for k, pid in enumerate(workers)}
        return {"gateway supervisor": supervisor, **named}


async def measure_pair(
    pair: str, c: int, procs: Processes, binary: Path | None, args: argparse.Namespace
) -> Sample:
    """One sample of ``pair``, after waiting (``--wait-idle``) for a quiet machine."""
    busy, waited = None, 0.0
    if args.wait_idle > 0:
        busy, waited = await trio.to_thread.run_sync(wait_for_idle, args.wait_idle, IDLE_THRESHOLD)
    sample = await _measure_pair(pair, c, procs, binary, args)
    sample.details["machine_before"] = {"busy_cores": busy, "waited_for_idle_s": waited}
    return sample


async def _measure_pair(
    pair: str, c: int, procs: Processes, binary: Path | None, args: argparse.Namespace
) -> Sample:
    watched = procs.pids(pair)
    if pair == "py":
        assert procs.ours is not None
        return await py_sample(procs.ours.address, args, c, watched)
    assert binary is not None
    if pair == "go-py":
        assert procs.ours is not None
        return await go_sample(binary, procs.ours.address, args, c, watched)
    assert procs.go is not None
    if pair == "go":
        return await go_sample(binary, procs.go.address, args, c, watched)
    before = await scrape(procs.metrics)
    sample = await go_sample(binary, procs.gateway_address, args, c, watched)
    after = await scrape(procs.metrics)
    check_relayed(sample, before, after, args.size)
    return sample


def check_relayed(
    sample: Sample, before: dict[str, float], after: dict[str, float], size: int
) -> None:
    """The gateway carried the calls: at least a request's and a reply's payload frame
    per completed call went through its listener, and its upstream connected."""

    def total(samples: dict[str, float], name: str, label: str) -> float:
        # Summed over workers: with several, each series also has a worker="N" label.
        return sum(
            value for key, value in samples.items() if key.startswith(name + "{") and label in key
        )

    def delta(name: str) -> float:
        label = f'listener="{LISTENER}"'
        return total(after, name, label) - total(before, name, label)

    received = delta("interchange_received_bytes_total")
    sent = delta("interchange_sent_bytes_total")
    connects = total(after, "interchange_upstream_connects_total", f'upstream="{UPSTREAM}"')
    sample.details["gateway_metrics"] = {
        "received_bytes": received,
        "sent_bytes": sent,
        "upstream_connects": connects,
    }
    if not after:
        sample.problems.append("could not read the gateway's /metrics to check it relayed")
        return
    # Each Request and Response carries the BytesValue: its bytes, plus the frame header.
    floor = sample.calls * (FRAME_HEADER + len(echo_request(size)))
    if received < floor or sent < floor:
        sample.problems.append(
            f"the gateway's listener moved {received:.0f} bytes in and {sent:.0f} out for "
            f"{sample.calls} calls (at least {floor} each way expected): did it relay them?"
        )
    if connects < 1:
        sample.problems.append(f"the gateway's upstream {UPSTREAM!r} never connected")


async def run_transport(
    transport: str, args: argparse.Namespace, binary: Path | None, result: Result
) -> dict[tuple[int, str], list[Sample]]:
    """Start what ``--pairs`` needs on ``transport``, then measure every concurrency
    and round; stop everything and check how it ended."""
    go_ttrpc = _go_helpers() if binary is not None else None
    pairs = args.pairs
    samples: dict[tuple[int, str], list[Sample]] = {}
    procs = Processes()
    with tempfile.TemporaryDirectory(prefix="ttrpc-bench-") as folder:
        tmp = Path(folder)

        def address(name: str) -> str:
            return f"unix:{tmp / name}.sock" if transport == "unix" else "tcp:127.0.0.1:0"

        async with contextlib.AsyncExitStack() as stack:
            if {"py", "go-py"} & set(pairs):
                procs.ours = await stack.enter_async_context(our_server(address("ours")))
            if {"go", "go-proxy"} & set(pairs):
                assert go_ttrpc is not None
                assert binary is not None
                procs.go = await stack.enter_async_context(
                    go_ttrpc.go_server(binary, address("go"))
                )
            per_workers = bool(args.proxy_workers) and "go-proxy" in pairs
            if "go-proxy" in pairs and not per_workers:
                await _start_proxy(stack, procs, args, address("gateway"), transport, tmp)
            for c in args.concurrency:
                for _ in range(args.rounds):
                    for pair in pairs:
                        if pair == "go-proxy" and per_workers:
                            continue
                        sample = await measure_pair(pair, c, procs, binary, args)
                        samples.setdefault((c, pair), []).append(sample)
            if per_workers:
                await _proxy_per_workers(procs, args, binary, transport, tmp, result, samples)
            # (The gateway's exit status is checked below: it is stopped first.)
            alive = {
                "our server": procs.ours is None or procs.ours.process.returncode is None,
                "Go server": procs.go is None or procs.go.alive,
            }
            for name, ok in alive.items():
                if not ok:
                    result.problems.append(f"{transport}: the {name} died during the run")
    if procs.ours is not None and procs.ours.process.returncode != 0:
        result.problems.append(
            f"{transport}: our server exited with {procs.ours.process.returncode}"
        )
    if procs.gateway is not None:
        gateway_problems: list[str] = []
        check_gateway(procs.gateway, result, gateway_problems)
        result.problems += [f"{transport}: {p}" for p in gateway_problems]
    return samples


async def _start_proxy(
    stack: contextlib.AsyncExitStack,
    procs: Processes,
    args: argparse.Namespace,
    unix_address: str,
    transport: str,
    tmp: Path,
    workers: int = 0,
) -> SupervisedGateway:
    """Start the proxy gateway for the rest of ``stack``; it becomes ``procs.gateway``."""
    bind = unix_address if transport == "unix" else "127.0.0.1:0"
    upstream = procs.go.address.removeprefix("tcp:")
    gateway = await stack.enter_async_context(proxy_gateway(args, bind, upstream, tmp, workers))
    procs.gateway = gateway
    host, port = gateway.listener_address(LISTENER)
    procs.gateway_address = bind if transport == "unix" else f"tcp:{host}:{port}"
    procs.metrics = metrics_address(gateway)
    return gateway


async def _proxy_per_workers(
    procs: Processes,
    args: argparse.Namespace,
    binary: Path | None,
    transport: str,
    tmp: Path,
    result: Result,
    samples: dict[tuple[int, str], list[Sample]],
) -> None:
    """``go-proxy`` once per ``--proxy-workers`` entry, each with a new gateway of N workers."""
    for i, workers in enumerate(args.proxy_workers):
        unix_address = f"unix:{tmp / f'gateway-{i}'}.sock"
        async with contextlib.AsyncExitStack() as stack:
            gateway = await _start_proxy(stack, procs, args, unix_address, transport, tmp, workers)
            for c in args.concurrency:
                sample = await measure_pair("go-proxy", c, procs, binary, args)
                samples.setdefault((c, f"go-proxy w={workers}"), []).append(sample)
        gateway_problems: list[str] = []
        check_gateway(gateway, result, gateway_problems)
        result.problems += [f"{transport} go-proxy w={workers}: {p}" for p in gateway_problems]
    procs.gateway = None


def add_figures(
    result: Result, transport: str, c: int, pair: str, samples: list[Sample]
) -> float | None:
    """The metrics of ``pair`` from its rounds; returns its calls/s (None if it failed)."""
    tag = f"{transport} c={c} {pair}"
    for i, s in enumerate(samples):
        result.problems += [f"{tag} (round {i + 1}): {p}" for p in s.problems]
    good = [s for s in samples if s.calls and not math.isnan(s.seconds)]
    if not good:
        return None
    calls = sum(s.calls for s in good)
    rate = calls / sum(s.seconds for s in good)
    result.add(f"{tag} calls", rate, "calls/s")
    latencies = [t for s in good for t in (s.latencies or [])]
    if latencies:
        ordered = sorted(latencies)
        p50, p99 = percentile(ordered, 50) * 1e6, percentile(ordered, 99) * 1e6
    else:
        p50 = statistics.median(s.p50_us for s in good)
        p99 = statistics.median(s.p99_us for s in good)
    result.add(f"{tag} latency p50", p50, "us")
    result.add(f"{tag} latency p99", p99, "us")
    wall = sum(s.wall for s in good)
    served = {"py": "our server", "go-py": "our server", "go": "Go server"}.get(pair, "gateway")
    for name in dict.fromkeys(n for s in good for n in s.cpu):
        cpu = sum(s.cpu.get(name, 0.0) for s in good)
        result.add(f"{tag} {name} cpu per call", 1e6 * cpu / calls, "us")
        if name.startswith(served):
            result.add(f"{tag} {name} cpu load", 100 * cpu / wall, "% of a core")
    parts = [n for n in dict.fromkeys(n for s in good for n in s.cpu) if n.startswith("gateway ")]
    if parts:  # a supervisor and its workers: the gateway is their sum
        cpu = sum(s.cpu.get(name, 0.0) for s in good for name in parts)
        result.add(f"{tag} gateway (all processes) cpu per call", 1e6 * cpu / calls, "us")
    others = [s.others for s in good]
    if all(o is not None for o in others):
        load = 100 * sum(cast(float, o) for o in others) / wall
        result.add(f"{tag} other processes' cpu load", load, "% of a core")
        if load > 15:
            result.details["warning"] = (
                "other processes used the CPU during a window: figures are not comparable"
            )
    result.details.setdefault("samples", {})[tag] = [
        {
            "calls": s.calls,
            "seconds": s.seconds,
            "wall": s.wall,
            "p50_us": s.p50_us,
            "p99_us": s.p99_us,
            "cpu_s": s.cpu,
            "others_cpu_s": s.others,
            **s.details,
        }
        for s in samples
    ]
    return rate


async def _run(args: argparse.Namespace) -> Result:
    result = Result(
        params={
            "transport": ",".join(args.transport),
            "concurrency": ",".join(map(str, args.concurrency)),
            "pairs": ",".join(args.pairs),
            "rounds": args.rounds,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "size": args.size,
            "go_conns": args.conns,
        }
    )
    if args.profile is not None:
        result.params["profiled"] = True
    binary: Path | None = None
    if GO_PAIRS & set(args.pairs):
        binary, why = build_go()
        if binary is None:
            result.problems.append(
                f"the Go ttrpc peer is needed for {', '.join(p for p in args.pairs if p != 'py')}"
                f" and is not available (run with --pairs py to measure without Go): {why}"
            )
            return result
    targets: dict[str, Any] = {}
    for transport in args.transport:
        samples = await run_transport(transport, args, binary, result)
        for c in args.concurrency:
            rates = {
                pair: add_figures(result, transport, c, pair, samples.get((c, pair), []))
                for pair in args.pairs
            }
            tag = f"{transport} c={c}"
            _add_worker_ratios(result, args, transport, c, samples, rates.get("go"))
            go, proxy, py = rates.get("go"), rates.get("go-proxy"), rates.get("py")
            if go and proxy:
                ratio = proxy / go
                result.add(f"{tag} go-proxy / go", ratio)
                targets[f"{tag} go-proxy / go >= {TARGET_PROXY_RATIO}"] = (
                    ratio >= TARGET_PROXY_RATIO
                )
            if py and c == TARGET_CONCURRENCY:
                result.add(f"{tag} py / target {TARGET_CALLS}", py / TARGET_CALLS)
                targets[f"{tag} py >= {TARGET_CALLS} calls/s"] = py >= TARGET_CALLS
    result.details["targets"] = targets
    return result


def _add_worker_ratios(
    result: Result,
    args: argparse.Namespace,
    transport: str,
    c: int,
    samples: dict[tuple[int, str], list[Sample]],
    go: float | None,
) -> None:
    """``go-proxy w=N``'s figures per distinct N, and each as a multiple of the first N's."""
    tag = f"{transport} c={c}"
    rates: dict[int, float] = {}
    for workers in dict.fromkeys(args.proxy_workers):
        pair = f"go-proxy w={workers}"
        rate = add_figures(result, transport, c, pair, samples.get((c, pair), []))
        if rate:
            rates[workers] = rate
            if go:
                result.add(f"{tag} {pair} / go", rate / go)
    if len(rates) > 1:
        first, *others = rates
        for workers in others:
            result.add(f"{tag} go-proxy w={workers} / w={first}", rates[workers] / rates[first])


@register(
    "ttrpc-echo",
    "ttrpc unary Echo, 16 bytes: our client/server, Go ↔ ours, Go ↔ Go, Go → our proxy → Go",
    arguments=_arguments,
    default_seconds=5.0,
)
def run(args: argparse.Namespace) -> Result:
    return trio.run(_run, args)
