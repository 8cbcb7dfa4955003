"""The ``gateway`` command: run, check, plugins, certs, store.

Exit status of ``gateway run``: 0 after a clean stop; 1 when it could not
start (a bad config, a port in use, a plugin that failed to set up); 3 when
shutdown had to abandon publishes that had not settled by ``drain_timeout``
(their senders got no ack and will resend); 2 for a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from gateway import __version__
from gateway.config.loader import (
    DEFAULT_ADMIN_PORT,
    Config,
    ConfigError,
    default_config,
    load,
    usable_cores,
)
from gateway.core.errors import first_leaf
from gateway.protocol.plugin import PluginError, UpstreamSettings
from gateway.runtime.registry import Registry, default_registry
from gateway.transports.base import StreamLayer, Transport

if TYPE_CHECKING:
    from typing import TypeAlias

    from gateway.runtime.gateway import Gateway

    #: What ``add_subparsers()`` returns: each ``_add_*`` below adds one command to it.
    _Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

log = logging.getLogger("gateway")


def _load(path: str | None) -> Config:
    return load(path) if path else default_config()


def _setup_logging(level: str, fmt: str = "text") -> None:
    from gateway.ops.logsetup import setup_logging

    setup_logging(level, fmt, unless_configured=True)


#: ``gateway run`` stopped, but abandoned unsettled publishes (see the module docstring).
EXIT_ABANDONED = 3


def cmd_run(args: argparse.Namespace) -> int:
    try:
        config = _load(args.config)
        workers = _workers(args, config)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1
    if args.worker is not None:
        from gateway.ops.logsetup import log_process
        from gateway.runtime.worker import WorkerSpec

        log_process(WorkerSpec.decode(args.worker).index)
    _setup_logging(
        args.log_level or config.gateway.log_level, args.log_format or config.gateway.log_format
    )
    if args.worker is not None:
        return _run_worker(args.worker, config)
    if config.path is None:
        log.info("no config file given: running the embedded default configuration")
    _warn_about(config)
    if workers > 1:
        return _supervise(args, config, workers)
    return _run_gateway(config)


def _workers(args: argparse.Namespace, config: Config) -> int:
    """``--workers``, else ``[gateway] workers``."""
    if args.worker is not None or args.workers is None:
        return 1 if args.worker is not None else config.gateway.workers
    workers: int = usable_cores() if args.workers == "auto" else args.workers
    return workers


def _run_worker(spec_text: str, config: Config) -> int:
    """``--worker SPEC``: serve the supervisor's sockets as one normal gateway."""
    from gateway.runtime.worker import WorkerSpec, adopt, pinned_elsewhere

    spec = WorkerSpec.decode(spec_text)
    adopt(spec)
    log.info("worker %d (pid %d) starting", spec.index, os.getpid())
    elsewhere, receives = pinned_elsewhere(spec), spec.index == 0
    return _run_gateway(
        config, parent=spec.parent, make=lambda: worker_gateway(config, elsewhere, receives)
    )


def _supervise(args: argparse.Namespace, config: Config, workers: int) -> int:
    """Bind once and run ``workers`` worker processes (see ``gateway.runtime.supervisor``)."""
    from gateway.runtime.supervisor import Supervisor, default_command

    extra = [f"--log-level={args.log_level}"] if args.log_level else []
    extra += [f"--log-format={args.log_format}"] if args.log_format else []
    supervisor = Supervisor(config, workers, default_command(args.config, extra))

    async def supervise() -> int:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(supervisor.watch_signals)
            status = await supervisor.run()
            nursery.cancel_scope.cancel()
        return status

    try:
        return trio.run(supervise)
    except OSError as e:
        log.error("cannot start: %s", e)
        return 1


def _run_gateway(
    config: Config, parent: int | None = None, make: Callable[[], Gateway] | None = None
) -> int:
    """Run one gateway in this process (``make()``, else one of ``config``) until it
    stops; return the exit status."""
    from gateway.runtime.collector import tune_collector
    from gateway.runtime.gateway import Gateway

    gateway: Gateway | None = None
    try:
        # Loads the protocol plugins: may fail to start too.
        gateway = make() if make is not None else Gateway(config)
        tune_collector()
        trio.run(_run, gateway, parent)
    except BaseExceptionGroup as eg:
        start_errors, rest = eg.split((OSError, PluginError))
        if start_errors is None or rest is not None:
            raise
        _log_failure(gateway, first_leaf(start_errors))
        return 1
    except (OSError, PluginError) as e:
        _log_failure(gateway, e)
        return 1
    if gateway.drained_cleanly is False:
        log.error(
            "stopped with %d publishes abandoned unsettled (exit status %d)",
            gateway.abandoned,
            EXIT_ABANDONED,
        )
        return EXIT_ABANDONED
    return 0


def worker_gateway(config: Config, elsewhere: Collection[str], receives: bool = True) -> Gateway:
    """The gateway of a worker: ``config`` without the listeners ``elsewhere`` (pinned to
    another worker: their protocol might need what only that worker has, the store),
    and unless it ``receives`` (worker 0 does), with every upstream's receiving side
    off (its option :meth:`~gateway.protocol.plugin.ProtocolPlugin.upstream_receives`
    names set to its default): one worker subscribes to the peer and publishes what
    it sends, every worker relays. The same holds in every config a reload reads."""
    from gateway.runtime.gateway import Gateway

    registry = default_registry()

    def without(config: Config) -> Config:
        config.listeners = [ls for ls in config.listeners if ls.name not in elsewhere]
        if not receives:
            for up in config.upstreams:
                _relay_only(up, registry)
        return config

    class WorkerGateway(Gateway):
        def read_config(self, path: Path) -> Config:
            return without(super().read_config(path))

    return WorkerGateway(without(config))


def _relay_only(up: UpstreamSettings, registry: Registry) -> None:
    """Turn off what ``up`` takes from its peer and publishes here (if anything)."""
    try:
        plugin = registry.protocol(up.protocol)
    except LookupError:
        return
    key = plugin.upstream_receives(up.options)
    if key is not None:
        up.options = {**up.options, key: copy.deepcopy(plugin.upstream_options[key].default)}


async def _reload(gateway: Gateway) -> None:
    from gateway.ops.reload import ReloadRefused, reload_file

    log.info("SIGHUP: reloading %s", gateway.config.path or "the config")
    with contextlib.suppress(ReloadRefused):  # logged by reload_file
        await reload_file(gateway, via="SIGHUP")


def cmd_reload(args: argparse.Namespace) -> int:
    """Ask a running gateway to reload its config, over its admin API."""
    import http.client
    import json
    import urllib.parse

    parts = urllib.parse.urlsplit(args.url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=60)
    try:
        conn.request("POST", "/api/reload")
        answer = json.loads(conn.getresponse().read() or b"{}")
    except (OSError, ValueError) as e:
        print(f"reload: cannot reach the admin API at {args.url}: {e}", file=sys.stderr)
        return 1
    finally:
        conn.close()
    if answer.get("reloaded"):
        print(f"reloaded: {answer.get('changes', '')}")
        return 0
    print(f"reload refused: {answer.get('error', answer)}", file=sys.stderr)
    return 1


def _warn_about(config: Config) -> None:
    """Say what would otherwise fail silently: broken plugins, a config that does nothing."""
    registry = default_registry()
    for kind, registrations in (
        ("protocol", registry.protocols),
        ("transport", registry.transports),
    ):
        for name, reg in registrations.items():
            if reg.error:
                log.warning(
                    "%s plugin %r (%s %s) failed to load and is not available: %s",
                    kind,
                    name,
                    reg.distribution,
                    reg.version,
                    reg.error,
                )
    if not config.listeners and not config.upstreams:
        log.warning(
            "%s has no listeners and no upstreams: the gateway will do nothing",
            config.path or "the config",
        )


def _log_failure(gateway: Gateway | None, error: BaseException) -> None:
    """``cannot start`` for what failed before the gateway served, ``stopped`` after."""
    what = _about_data_dir(gateway.config, error) if gateway is not None else None
    if gateway is None or gateway.serving_since is None:
        log.error("cannot start: %s", what or error)
    else:
        running = time.time() - gateway.serving_since
        log.error("stopped by an error after %.0fs of serving: %s", running, what or error)


def _about_data_dir(config: Config, error: BaseException) -> str | None:
    """A file error under ``data_dir``, naming the config file and the key (else None).

    ``gateway check`` probes ``data_dir``; this says the same when something
    under it fails later (a ``store`` that is a file, a disk gone read-only).
    """
    if not isinstance(error, OSError) or not error.filename:
        return None
    filename = Path(os.fsdecode(error.filename))
    if not filename.is_relative_to(config.gateway.data_dir):
        return None
    source = config.path or "the embedded default config"
    return f"{source}: gateway.data_dir: cannot use '{filename}': {error.strerror or error}"


async def _run(gateway: Gateway, parent: int | None = None) -> None:
    from gateway.runtime.worker import report_ready, watch_parent

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, gateway, nursery.cancel_scope)
        if parent is not None:
            nursery.start_soon(watch_parent, parent, gateway.shutdown)
        async with trio.open_nursery() as serving:
            await serving.start(gateway.run)
            report_ready()  # a worker tells its supervisor it serves (else nothing)
        nursery.cancel_scope.cancel()


async def _watch_signals(gateway: Gateway, scope: trio.CancelScope) -> None:
    """First SIGINT/SIGTERM: drain and stop. A second one: stop now. SIGHUP: reload."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            if signum == signal.SIGHUP:
                # In the background, so that signals keep coming; reloads queue up.
                gateway.spawn(_reload, gateway)
                continue
            if gateway.draining.is_set():
                log.warning("second %s: stopping now", signal.Signals(signum).name)
                scope.cancel()
                return
            log.info("%s received", signal.Signals(signum).name)
            gateway.shutdown()


def cmd_check(args: argparse.Namespace) -> int:
    try:
        config = load(args.config)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 1
    print(
        f"{args.config}: OK ({len(config.listeners)} listeners, {len(config.upstreams)} "
        f"upstreams, {len(config.routes)} routes)"
    )
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    registry = default_registry()
    print("protocols:")
    for name, reg in registry.protocols.items():
        if reg.error:
            print(f"  {name:<12} BROKEN  {reg.distribution} {reg.version}: {reg.error}")
            continue
        plugin = reg.plugin
        roles = ",".join(r for r in ("server", "client") if r in plugin.roles)
        port = plugin.default_port if plugin.default_port is not None else "-"
        print(
            f"  {name:<12} {roles:<14} port {port!s:<6} {reg.distribution} {reg.version}"
            + (f"  {plugin.summary}" if plugin.summary else "")
        )
    print("transports:")
    for name, reg in registry.transports.items():
        if reg.error:
            print(f"  {name:<12} BROKEN  {reg.distribution} {reg.version}: {reg.error}")
            continue
        print(
            f"  {name:<12} {reg.plugin.kind:<14} {reg.distribution} {reg.version}"
            + _transport_detail(registry, reg.plugin)
        )
    return 0


def _transport_detail(registry: Registry, plugin: Transport | StreamLayer) -> str:
    """``  schemes ws, wss`` for a transport; ``  role tls`` (and who wins it) for a layer."""
    if isinstance(plugin, StreamLayer):
        try:
            active = registry.layer_for(plugin.role)
        except LookupError as e:
            return f"  role {plugin.role} (unusable: {e})"
        replaced = "" if active is plugin else f" (replaced by {active.name})"
        return f"  role {plugin.role}{replaced}"
    if plugin.fallback:
        return "  host:port" + "".join(f", {scheme}:" for scheme in plugin.schemes)
    return "  schemes " + (", ".join(plugin.schemes) or "-")


def cmd_tap(args: argparse.Namespace) -> int:
    from gateway.ops.tap_client import follow

    return follow(args.url, args.destination, filter=args.filter, fmt=args.format, limit=args.limit)


def cmd_top(args: argparse.Namespace) -> int:
    from gateway.ops.top import main as top

    return top(args.url, once=args.once, interval=args.interval)


def cmd_certs_init(args: argparse.Namespace) -> int:
    from gateway.config.certs import init_dir

    hosts = {"hosts": args.host} if args.host else {}
    try:
        paths = init_dir(Path(args.directory), force=args.force, **hosts)
    except FileExistsError as e:
        print(f"{e} (use --force to replace)", file=sys.stderr)
        return 1
    for role, path in paths.items():
        print(f"{role}: {path}")
    return 0


def _store_dir(args: argparse.Namespace) -> Path:
    """``--data-dir``, else the ``data_dir`` of ``--config``, else ``data``; plus ``store``."""
    if args.data_dir:
        return Path(args.data_dir) / "store"
    return _load(args.config).gateway.data_dir / "store"


def cmd_store_inspect(args: argparse.Namespace) -> int:
    from gateway.store.layout import UnknownFormat
    from gateway.store.report import inspect_lines, scan

    try:
        directory = _store_dir(args)
        segments = list(scan(directory, verify="none", segment=args.segment))
    except (ConfigError, FileNotFoundError, UnknownFormat) as e:
        print(e, file=sys.stderr)
        return 1
    if not segments:
        print(f"{directory}: no segments")
    for segment in segments:
        for line in inspect_lines(segment, detail=args.segment is not None):
            print(line)
    return 0


def cmd_store_verify(args: argparse.Namespace) -> int:
    from gateway.store.layout import UnknownFormat
    from gateway.store.report import scan, verify_lines

    try:
        directory = _store_dir(args)
        segments = list(scan(directory, verify="all"))
    except (ConfigError, FileNotFoundError, UnknownFormat) as e:
        print(e, file=sys.stderr)
        return 1
    damaged = 0
    for segment in segments:
        lines = verify_lines(segment)
        damaged += bool(lines)
        for line in lines:
            print(line)
    records = sum(s.report.records for s in segments)
    corrupt = sum(s.report.corrupt_records for s in segments)
    torn = sum(s.report.truncated_bytes for s in segments)
    verified = sum(s.report.verified_bytes for s in segments)
    repairs = sum(s.report.repaired for s in segments)
    print(
        f"{directory}: {len(segments)} segments, {records} records, {verified} bytes "
        f"verified: {corrupt} corrupt records, {torn} bytes of torn tail"
        + (f", {repairs} index repairs for the next start" if repairs else "")
    )
    # A damaged record stays damaged (flagged in place, never delivered): 1 for as long
    # as one exists, whoever found it, and for anything else that is not as written.
    return 1 if damaged or corrupt or torn or repairs else 0


#: Where ``reload``, ``tap`` and ``top`` find a running gateway unless ``--url`` says.
_ADMIN_URL = f"http://127.0.0.1:{DEFAULT_ADMIN_PORT}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway", description="Interchange: a multi-protocol message gateway."
    )
    parser.add_argument("--version", action="version", version=f"interchange-gateway {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    # In this order in ``gateway --help``.
    commands = (_add_run, _add_check, _add_plugins, _add_reload, _add_tap, _add_top)
    for add in (*commands, _add_config, _add_certs, _add_store, _add_pipeline, _add_completion):
        add(sub)
    return parser


def _add_run(sub: _Subparsers) -> None:
    run = sub.add_parser("run", help="run the gateway (the embedded default without CONFIG)")
    run.add_argument("config", nargs="?", help="a TOML config file")
    run.add_argument("--log-level", type=str.lower, choices=("debug", "info", "warning", "error"))
    run.add_argument(
        "--log-format",
        type=str.lower,
        choices=("text", "json"),
        help="text (default) or json: one JSON object per line",
    )
    run.add_argument(
        "--workers",
        type=_worker_count,
        help='worker processes sharing the listeners: a number or "auto" (the usable cores);'
        " default [gateway] workers, 1",
    )
    run.add_argument("--worker", help=argparse.SUPPRESS)  # set by the supervisor for its workers
    run.set_defaults(func=cmd_run)


def _worker_count(text: str) -> int | str:
    """``--workers``: a positive integer or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a number or "auto", not {text!r}') from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {count}")
    return count


def _add_check(sub: _Subparsers) -> None:
    check = sub.add_parser("check", help="validate a config file without binding anything")
    check.add_argument("config")
    check.set_defaults(func=cmd_check)


def _add_plugins(sub: _Subparsers) -> None:
    plugins = sub.add_parser("plugins", help="list registered protocols and transports")
    plugins.set_defaults(func=cmd_plugins)


def _add_reload(sub: _Subparsers) -> None:
    reload = sub.add_parser(
        "reload", help="make a running gateway re-read its config (as SIGHUP does)"
    )
    reload.add_argument("--url", default=_ADMIN_URL, help="the gateway's admin API")
    reload.set_defaults(func=cmd_reload)


def _add_tap(sub: _Subparsers) -> None:
    tap = sub.add_parser(
        "tap",
        help="watch the messages stored into a destination, passively (never holds an ack)",
    )
    tap.add_argument("destination", help="a destination name or glob (logs, logs-*)")
    tap.add_argument(
        "--filter", help='a header filter as ndjson\'s sub takes it: {"level":"error"}'
    )
    tap.add_argument("--format", choices=("json", "pretty"), default="json")
    tap.add_argument("--url", default=_ADMIN_URL, help="the gateway's admin API")
    tap.add_argument("--limit", type=int, default=0, help="stop after this many messages")
    tap.set_defaults(func=cmd_tap)


def _add_top(sub: _Subparsers) -> None:
    top = sub.add_parser("top", help="a live view of a running gateway's status (admin API)")
    top.add_argument("--url", default=_ADMIN_URL, help="the gateway's admin API")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    top.set_defaults(func=cmd_top)


def _add_config(sub: _Subparsers) -> None:
    config = sub.add_parser("config", help="print the embedded default config or its schema")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    default = config_sub.add_parser(
        "default", help="the embedded default config as TOML (what `gateway run` uses)"
    )
    default.set_defaults(func=cmd_config_default)
    schema = config_sub.add_parser(
        "schema", help="a JSON Schema of the config file (for editors; gateway check decides)"
    )
    schema.set_defaults(func=cmd_config_schema)


def cmd_config_default(args: argparse.Namespace) -> int:
    from gateway.config.default import default_toml

    sys.stdout.write(default_toml())
    return 0


def cmd_config_schema(args: argparse.Namespace) -> int:
    import json

    from gateway.config.schema import config_schema

    print(json.dumps(config_schema(), indent=2))
    return 0


def _add_certs(sub: _Subparsers) -> None:
    certs = sub.add_parser("certs", help="development certificates")
    certs_sub = certs.add_subparsers(dest="certs_command", required=True)
    init = certs_sub.add_parser("init", help="create a CA, a server and a client certificate")
    init.add_argument("directory")
    init.add_argument(
        "--host",
        action="append",
        help="a name or IP for the server certificate (repeatable; default: localhost, "
        "127.0.0.1, ::1)",
    )
    init.add_argument("--force", action="store_true", help="replace existing files")
    init.set_defaults(func=cmd_certs_init)


def _add_store(sub: _Subparsers) -> None:
    store = sub.add_parser("store", help="look into the embedded segment store (read-only)")
    store_sub = store.add_subparsers(dest="store_command", required=True)
    # The options every store command takes: where the store is.
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument(
        "--data-dir", help="the gateway's data directory (the store is its store/ folder)"
    )
    where.add_argument("--config", help="a TOML config file: its [gateway] data_dir")
    inspect = store_sub.add_parser(
        "inspect",
        parents=[where],
        help="segments: bytes, events, chunks, records, writers' last event numbers",
    )
    inspect.add_argument("segment", nargs="?", help="one segment, in detail")
    inspect.set_defaults(func=cmd_store_inspect)
    verify = store_sub.add_parser(
        "verify",
        parents=[where],
        help="check every checksum; exit status 1 if anything is damaged",
    )
    verify.set_defaults(func=cmd_store_verify)


def _add_pipeline(sub: _Subparsers) -> None:
    # Spark is imported only when the command runs: the option parsing needs none.
    from gateway.pipeline.command import add_parser

    add_parser(sub)


def _add_completion(sub: _Subparsers) -> None:
    completion = sub.add_parser(
        "completion",
        help='print a shell completion script: eval "$(gateway completion bash)"',
    )
    completion.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    completion.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    """Generate the script from this very parser, so it never lags behind the commands."""
    try:
        import shtab
    except ImportError:
        print("gateway completion needs the shtab package: pip install shtab", file=sys.stderr)
        return 1
    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader went away (`gateway plugins | head`): not an error of ours.
        # Point stdout at /dev/null so that the interpreter's final flush is quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
