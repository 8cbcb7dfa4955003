"""The ``reactive`` benchmark's reference: request-stream over the ``rsocket`` package.

``python -m bench._rsocket_peer server HOST:PORT --elements N``: an asyncio
RSocket server (TCP) whose request-stream handler emits N 16-byte payloads,
made before it prints ``ready HOST:PORT``, as many as each ``request_n``
asks, the last one with the complete flag (an element is its index, 8 bytes
big-endian, and ``rstreams``, as in ``bench/reactive.py``).

``python -m bench._rsocket_peer client HOST:PORT --server-pid PID ...``: an
asyncio RSocket client that requests the stream with ``initial_request_n``
``--window`` and ``request_n(window)`` after each ``window`` payloads, checks
each payload is the next element, intact, and after ``--warmup`` measures
``--seconds`` (or up to the stream's end), reading the server's CPU time from
``/proc`` at the window's ends. It prints one JSON object: the counts, the
window, the CPU times and the first problem (None when all was well).

Both use 64 KiB reads (the library's default read size is 1 KiB), as the
gateway's side does; everything else is the library's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from reactivestreams.publisher import Publisher
from reactivestreams.subscriber import Subscriber
from reactivestreams.subscription import Subscription
from rsocket.helpers import single_transport_provider
from rsocket.payload import Payload
from rsocket.request_handler import BaseRequestHandler
from rsocket.rsocket_client import RSocketClient
from rsocket.rsocket_server import RSocketServer
from rsocket.transports.tcp import TransportTCP

from ._process import cpu_times

READ_SIZE = 65536
MARK = b"rstreams"


def element(i: int) -> bytes:
    return i.to_bytes(8, "big") + MARK


# -- the server -------------------------------------------------------------------------------
class Elements(Publisher, Subscription):
    """The stream of one request: the next payloads on each request(n)."""

    def __init__(self, payloads: list[Payload]) -> None:
        self.payloads = payloads
        self.next = 0
        self.subscriber: Subscriber | None = None

    def subscribe(self, subscriber: Subscriber) -> None:
        self.subscriber = subscriber
        subscriber.on_subscribe(self)

    def request(self, n: int) -> None:
        assert self.subscriber is not None
        payloads, last = self.payloads, len(self.payloads)
        end = min(self.next + n, last)
        on_next = self.subscriber.on_next
        for i in range(self.next, end):
            on_next(payloads[i], i == last - 1)
        self.next = end

    def cancel(self) -> None:
        self.next = len(self.payloads)


async def serve(address: str, count: int) -> None:
    payloads = [Payload(element(i)) for i in range(count)]

    class Handler(BaseRequestHandler):
        async def request_stream(self, payload: Payload) -> Publisher:
            return Elements(payloads)

    def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        RSocketServer(TransportTCP(reader, writer, read_buffer_size=READ_SIZE), Handler)

    host, _, port = address.rpartition(":")
    server = await asyncio.start_server(session, host, int(port))
    bound = server.sockets[0].getsockname()
    print(f"ready {bound[0]}:{bound[1]}", flush=True)
    async with server:
        await server.serve_forever()


# -- the client -------------------------------------------------------------------------------
class Counter(Subscriber):
    """Checks and counts payloads, requests a window after each window received."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.received = 0
        self.completed = False
        self.problem: str | None = None
        self.done = asyncio.Event()
        self.subscription: Subscription | None = None

    def on_subscribe(self, subscription: Subscription) -> None:
        self.subscription = subscription

    def on_next(self, value: Any, is_complete: bool = False) -> None:
        if value.data != element(self.received) and self.problem is None:
            self.problem = f"payload {self.received} is {bytes(value.data)[:32].hex()}"
            self.done.set()
        self.received += 1
        if self.received % self.window == 0 and self.subscription is not None:
            self.subscription.request(self.window)
        if is_complete:
            self.on_complete()

    def on_error(self, exception: Exception) -> None:
        self.problem = self.problem or f"onError: {exception}"
        self.done.set()

    def on_complete(self) -> None:
        self.completed = True
        self.done.set()


def _snapshot(counter: Counter, pid: int) -> tuple[float, int, float | None, float]:
    times = cpu_times(pid)
    server = None if times is None else times[0] + times[1]
    return time.perf_counter(), counter.received, server, time.process_time()


async def client(args: argparse.Namespace) -> dict[str, Any]:
    host, _, port = args.address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    transport = TransportTCP(reader, writer, read_buffer_size=READ_SIZE)
    counter = Counter(args.window)
    async with RSocketClient(single_transport_provider(transport)) as rsocket:
        started = time.perf_counter()
        rsocket.request_stream(Payload(b"bench")).initial_request_n(args.window).subscribe(counter)
        start = end = None
        for until in (started + args.warmup, started + args.warmup + args.seconds):
            try:
                await asyncio.wait_for(counter.done.wait(), until - time.perf_counter())
            except TimeoutError:
                pass
            snap = _snapshot(counter, args.server_pid)
            if start is None and not counter.done.is_set():
                start = snap
            else:
                end = snap
                break
        if not counter.done.is_set() and counter.subscription is not None:
            counter.subscription.cancel()
    if start is None or end is None:
        return {"problem": counter.problem or "the stream ended in the warm-up", **_counts(counter)}
    return {
        "window_count": end[1] - start[1],
        "window_seconds": end[0] - start[0],
        "server_cpu": None if start[2] is None or end[2] is None else end[2] - start[2],
        "client_cpu": end[3] - start[3],
        "problem": counter.problem,
        **_counts(counter),
    }


def _counts(counter: Counter) -> dict[str, Any]:
    return {"received": counter.received, "completed": counter.completed}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench._rsocket_peer")
    parser.add_argument("role", choices=("server", "client"))
    parser.add_argument("address")
    parser.add_argument("--elements", type=int, required=True)
    parser.add_argument("--server-pid", type=int, default=0)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    if args.role == "server":
        try:
            asyncio.run(serve(args.address, args.elements))
        except KeyboardInterrupt:
            pass
        return 0
    report = asyncio.run(client(args))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
