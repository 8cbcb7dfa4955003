"""``python -m interchange_ndjson``: publish and subscribe from a terminal.

The README's walkthrough needs a client on a fresh machine, where ``nc`` may
not be installed; this one ships with the plugin::

    python -m interchange_ndjson sub logs           # print and ack every message
    python -m interchange_ndjson pub logs hello     # publish, print the gateway's answer
    echo '{"a":1}' | python -m interchange_ndjson pub logs   # one message per stdin line
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import trio

from .client import NdjsonClient
from .events import Deliver


async def _subscribe(host: str, port: int, destination: str, count: int) -> int:
    async with await NdjsonClient.connect(host, port) as client:
        await client.subscribe(destination)
        seen = 0
        while not count or seen < count:
            event = await client.receive()
            if not isinstance(event, Deliver):
                return 0
            print(event.body.decode("utf-8", "replace"), flush=True)
            await client.ack(event.tag)  # acked only once printed
            seen += 1
    return 0


async def _publish(host: str, port: int, destination: str, bodies: Sequence[bytes]) -> int:
    status = 0
    async with await NdjsonClient.connect(host, port) as client:
        ids = await client.publish_nowait(list(bodies), destination)
        for answer in await client.wait_answers(ids):
            print(f"{answer.status}{': ' + answer.reason if answer.reason else ''}", flush=True)
            status |= answer.status != "delivered"
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m interchange_ndjson", description="An ndjson client for the gateway."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=7070)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("sub", help="subscribe: print each message, then ack it")
    s.add_argument("destination")
    s.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    p = sub.add_parser("pub", help="publish the BODY arguments, or each line of stdin")
    p.add_argument("destination")
    p.add_argument("body", nargs="*")
    args = parser.parse_args(argv)
    try:
        if args.command == "sub":
            return trio.run(_subscribe, args.host, args.port, args.destination, args.count)
        bodies = [b.encode() for b in args.body] or [
            line.rstrip(b"\n") for line in sys.stdin.buffer if line.strip()
        ]
        return trio.run(_publish, args.host, args.port, args.destination, bodies)
    except OSError as e:
        print(f"cannot reach the gateway at {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())
