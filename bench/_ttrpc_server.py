"""Our ttrpc server as a process of its own, for ``ttrpc-echo``: the interop Echo service.

``python -m bench._ttrpc_server ADDRESS`` serves ``interchange.test.Echo``
(``tests/interop/echo_service.py``: the service the Go peer serves, with the
same answers) on ``TtrpcSession`` over ``tcp:host:port`` (port 0: any) or
``unix:/path``, prints ``ready ADDRESS`` (the address bound, in the form the
Go program takes) on stdout once it listens, and exits with status 0 on
SIGTERM or SIGINT.

A process of its own, not a task beside the load, because the machine has 2
cores: the load generator and the server then each get one, and the server's
CPU time can be read on its own from ``/proc/<pid>/stat``, as the gateway's
is in the other benchmarks.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import trio

#: ``tests/``, where the interop Echo service lives (it is test code, not a package).
TESTS = Path(__file__).resolve().parent.parent / "tests"


def _echo_server() -> Callable[..., Awaitable[None]]:
    """``serve_echo`` from the tests tree (imported here so the path is set first)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    from interop.echo_service import serve_echo

    return serve_echo


async def serve(address: str) -> None:
    """Serve Echo on ``address`` until SIGTERM or SIGINT."""
    serve_echo = _echo_server()
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve_echo, address)
            print(f"ready {bound}", flush=True)
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench._ttrpc_server tcp:HOST:PORT|unix:/path", file=sys.stderr)
        return 2
    trio.run(serve, argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
