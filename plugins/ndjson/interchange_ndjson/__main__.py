"""``python -m interchange_ndjson``: publish and subscribe from a terminal.

The README's walkthrough needs a client on a fresh machine, where ``nc`` may
not be installed; this one ships with the plugin::

    python -m interchange_ndjson sub logs           # print and ack every message
    python -m interchange_ndjson pub logs hello     # publish, print the gateway's answer
    echo '{"a":1}' | python -m interchange_ndjson pub logs   # one message per stdin line
    python -m interchange_ndjson sub logs --group g --filter '{"level":"error"}' --headers
    python -m interchange_ndjson --tls --ca ca.pem sub logs --json   # one JSON object a delivery

``sub`` prints one line per delivery, and acks it once printed. A delivery
without a body prints ``<no body>`` (with ``--headers``, its headers alone),
never a blank line, so a stream of header-only events stays readable.
"""

from __future__ import annotations

import argparse
import base64
import json
import ssl
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from gateway.sdk import Filter

from .client import NdjsonClient
from .events import Deliver

#: What ``sub`` prints for a delivery whose body is empty.
NO_BODY = "<no body>"


@dataclass(frozen=True, slots=True)
class Target:
    """Where the gateway is and how to reach it (TLS or not)."""

    host: str
    port: int
    ssl_context: ssl.SSLContext | None = None
    server_name: str | None = None

    async def connect(self) -> NdjsonClient:
        return await NdjsonClient.connect(
            self.host, self.port, ssl_context=self.ssl_context, server_hostname=self.server_name
        )


def format_text(event: Deliver, *, headers: bool = False) -> str:
    """The body as text; with ``headers``, the headers as a JSON object before it.

    An empty body is ``<no body>``, or with ``headers`` the headers alone.
    """
    body = event.body.decode("utf-8", "replace")
    if not headers:
        return body or NO_BODY
    head = json.dumps(dict(event.headers), ensure_ascii=False, separators=(",", ":"))
    return f"{head} {body}" if body else head


def format_json(event: Deliver) -> str:
    """One compact JSON object, in the shape of the protocol's ``msg`` line (no ``op``)."""
    out: dict[str, object] = {"dest": event.destination, "tag": event.tag}
    try:
        out["body"] = event.body.decode("utf-8")
    except UnicodeDecodeError:
        out["b64"] = base64.b64encode(event.body).decode("ascii")
    out["headers"] = dict(event.headers)
    if event.content_type is not None:
        out["content_type"] = event.content_type
    out["redelivered"] = event.redelivered
    if event.position is not None:
        out["pos"] = event.position
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class Subscription:
    """What ``sub`` asks for and how it prints each delivery."""

    destination: str
    group: str | None
    filter: Filter | None
    count: int
    render: Callable[[Deliver], str]


async def _subscribe(target: Target, sub: Subscription) -> int:
    async with await target.connect() as client:
        await client.subscribe(sub.destination, sub.group, filter=sub.filter)
        seen = 0
        while not sub.count or seen < sub.count:
            event = await client.receive()
            if not isinstance(event, Deliver):
                return 0
            print(sub.render(event), flush=True)
            await client.ack(event.tag)  # acked only once printed
            seen += 1
    return 0


async def _publish(target: Target, destination: str, bodies: Sequence[bytes]) -> int:
    status = 0
    async with await target.connect() as client:
        ids = await client.publish_nowait(list(bodies), destination)
        for answer in await client.wait_answers(ids):
            print(f"{answer.status}{': ' + answer.reason if answer.reason else ''}", flush=True)
            status |= answer.status != "delivered"
    return status


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The client context the TLS options describe; None without TLS.

    The options are those of an upstream's ``tls`` table: ``--ca`` (default:
    the system store), ``--cert``/``--key`` for mTLS, ``--server-name``, and
    ``--insecure`` for ``verify = false``. Any of them turns TLS on.
    """
    if not (args.tls or args.ca or args.cert or args.insecure or args.server_name):
        return None
    ctx = ssl.create_default_context(cafile=args.ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if args.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if args.cert:
        ctx.load_cert_chain(args.cert, args.key)
    return ctx


def parse_filter(text: str) -> Filter:
    """``--filter``: the JSON the protocol's ``sub`` takes in ``filter``."""
    try:
        return Filter.from_json(json.loads(text))
    except ValueError as e:  # json.JSONDecodeError and FilterError are ValueErrors
        raise argparse.ArgumentTypeError(f"invalid filter {text!r}: {e}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m interchange_ndjson", description="An ndjson client for the gateway."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7070)
    tls = parser.add_argument_group("TLS (any of these turns it on)")
    tls.add_argument("--tls", action="store_true", help="connect over TLS")
    tls.add_argument("--ca", help="CA bundle that verifies the gateway (default: system store)")
    tls.add_argument("--cert", help="client certificate, for mTLS")
    tls.add_argument("--key", help="the client certificate's key (default: in --cert)")
    tls.add_argument("--server-name", help="name to verify and send as SNI (default: --host)")
    tls.add_argument("--insecure", action="store_true", help="do not verify the gateway")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sub", help="subscribe: print each message, then ack it")
    s.add_argument("destination")
    s.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    s.add_argument("--group", help="join this consumer group (competing consumers)")
    s.add_argument("--filter", type=parse_filter, help='header filter, e.g. \'{"level":"error"}\'')
    out = s.add_mutually_exclusive_group()
    out.add_argument("--headers", action="store_true", help="print the headers before the body")
    out.add_argument("--json", action="store_true", help="print each delivery as a JSON object")
    p = sub.add_parser("pub", help="publish the BODY arguments, or each line of stdin")
    p.add_argument("destination")
    p.add_argument("body", nargs="*")
    return parser


def _run(args: argparse.Namespace, target: Target) -> int:
    if args.command == "sub":
        if args.json:
            render: Callable[[Deliver], str] = format_json
        else:
            render = lambda e: format_text(e, headers=args.headers)  # noqa: E731
        subscription = Subscription(args.destination, args.group, args.filter, args.count, render)
        return trio.run(_subscribe, target, subscription)
    bodies = [b.encode() for b in args.body] or [
        line.rstrip(b"\n") for line in sys.stdin.buffer if line.strip()
    ]
    return trio.run(_publish, target, args.destination, bodies)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.key and not args.cert:
        parser.error("--key needs --cert: a client key goes with its certificate")
    try:
        ctx = tls_context(args)
    except OSError as e:  # a missing or unreadable file, a key that does not fit
        print(f"TLS options: {e}", file=sys.stderr)
        return 2
    try:
        return _run(args, Target(args.host, args.port, ctx, args.server_name))
    except (OSError, trio.BrokenResourceError) as e:  # ssl.SSLError is an OSError
        where = f"{args.host}:{args.port}"
        cause = e.__cause__ if isinstance(e, trio.BrokenResourceError) and e.__cause__ else e
        print(f"cannot reach the gateway at {where}: {cause}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
