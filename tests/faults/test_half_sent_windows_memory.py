"""60 half-sent compressed Lumberjack windows: the gateway's resident memory stays
within its budget, and goes back down once the senders are gone.

A gateway process with the default config (``memory_budget`` 512 MiB,
``connection_memory`` 64 MiB, Lumberjack ``max_window_bytes`` 64 MiB) gets 60
connections, each sending ``W 9001`` and one ``C`` frame of 9000 JSON events of
7000 bytes: 60 MiB once inflated, 3.9 MB on the wire (234 MB for the 60), and
never the last event. Every connection holds its half-received window; the
test samples the process's resident memory (``VmRSS``, and its peak
``VmHWM``) until it settles, then resets the connections (as a killed
sender's kernel does) and waits for the memory to come back.

Before the fix this took the process to 1.3 GiB (the budget counted 1.2 GiB:
each connection inflated its whole ``C`` frame at once, however exhausted the
budget was), and the memory stayed: the readers, waiting for room, never read
the resets (their windows' 30 s timeout freed them), and glibc kept the freed
pages. Now ``C`` frames are inflated piece by piece as they arrive, each piece
only while the budget has room, the budget charges what is really allocated,
a reset is noticed while a reader waits for memory, and the heap is trimmed
after a large release (docs/limits.md, "Memory").
"""

from __future__ import annotations

import random
import socket
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
CONNECTIONS = 60
EVENTS = 9000
EVENT_SIZE = 7000
#: The default [gateway] memory_budget.
BUDGET = 512 * MiB
#: Resident memory above the idle gateway's that the held windows may take: the
#: budget, a floor of 1 MiB (plus a piece being inflated) per connection that
#: partial input may always take, and the allocator's own overhead.
HELD_BOUND = BUDGET + CONNECTIONS * 2 * MiB + 64 * MiB
#: Resident memory above the idle gateway's once every sender is gone.
AFTER_BOUND = 64 * MiB
SAMPLE_EVERY = 0.25


def events_window() -> bytes:
    """``W 9001`` + one ``C`` of 9000 ``J`` events: Filebeat-like objects of 7000
    bytes (40 short fields, then a message), which zlib level 3 compresses 15 times."""
    rng = random.Random(5044)
    words = [
        "GET",
        "POST",
        "/api/v1/items",
        "/healthz",
        "200",
        "404",
        "500",
        "upstream",
        "cache",
        "hit",
        "miss",
    ]
    frames = []
    for seq in range(1, EVENTS + 1):
        fields = "".join(
            f',"field_{k}":"{rng.choice(words)} {rng.choice(words)} {rng.randrange(1000)}"'
            for k in range(40)
        )
        head = f'{{"@timestamp":"2026-11-27T04:00:00.{seq % 1000:03d}Z","n":{seq}{fields}'
        message = ("lorem ipsum dolor sit amet " * 300)[: EVENT_SIZE - len(head) - 14]
        payload = f'{head},"message":"{message}"}}'.encode()
        assert len(payload) == EVENT_SIZE
        frames.append(struct.pack(">BBII", 0x32, ord("J"), seq, EVENT_SIZE) + payload)
    packed = zlib.compress(b"".join(frames), 3)
    window = struct.pack(">BBI", 0x32, ord("W"), EVENTS + 1)
    return window + struct.pack(">BBI", 0x32, ord("C"), len(packed)) + packed


def status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


async def memory_used(port: int) -> float:
    """``interchange_memory_used_bytes`` from the gateway's ``GET /metrics``."""
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
            data = bytearray()
            while chunk := await stream.receive_some(65536):
                data += chunk
    text = bytes(data).partition(b"\r\n\r\n")[2].decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "interchange_memory_used_bytes":
                return sample.value
    raise LookupError("interchange_memory_used_bytes")


def reset(stream: trio.SocketStream) -> None:
    """Close with a reset (SO_LINGER 0): unsent bytes are dropped, the peer sees RST."""
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    stream.socket.close()


async def test_half_sent_windows_stay_within_the_memory_bound_and_go_away(
    faults: ModuleType, gateway_process: Callable[[Path], Any], tmp_path: Path
) -> None:
    wire = events_window()
    metrics_port = faults.free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        faults.toml_config(
            {
                "metrics": {"bind": f"127.0.0.1:{metrics_port}"},
                "listeners": [
                    {
                        "name": "beats",
                        "protocol": "lumberjack",
                        "bind": "127.0.0.1:0",
                        "destination": "logs",
                    }
                ],
            }
        )
    )
    gw = gateway_process(config)
    host, _, port = (await gw.start())["beats"][0].rpartition(":")
    assert gw.process is not None
    pid = gw.process.pid
    idle = status(pid)["VmRSS"]

    streams = [await trio.open_tcp_stream(host, int(port)) for _ in range(CONNECTIONS)]
    samples: list[int] = []
    async with trio.open_nursery() as senders:
        for stream in streams:
            senders.start_soon(stream.send_all, wire)
        # Until the gateway stops taking more: resident memory flat for 2 s (the
        # windows' 30 s timeout is far off).
        with trio.move_on_after(20):
            while True:
                await trio.sleep(SAMPLE_EVERY)  # real time: sampling another process's memory
                samples.append(status(pid)["VmRSS"])
                recent = samples[-int(2 / SAMPLE_EVERY) :]
                if len(samples) >= 12 and max(recent) - min(recent) < 2 * MiB:
                    break
        held = status(pid)
        used = await memory_used(metrics_port)
        senders.cancel_scope.cancel()
    for stream in streams:
        reset(stream)

    after = []
    with trio.move_on_after(15):
        while True:
            await trio.sleep(SAMPLE_EVERY)  # real time: sampling another process's memory
            after.append(status(pid)["VmRSS"])
            if after[-1] - idle <= AFTER_BOUND and await memory_used(metrics_port) == 0:
                break
    used_after = await memory_used(metrics_port)

    print(
        f"\n{CONNECTIONS} half-sent windows of {EVENTS * (EVENT_SIZE + 10) / MiB:.1f} MiB"
        f" ({len(wire) / 1e6:.2f} MB on the wire each): idle {idle / MiB:.0f} MiB;"
        f" held {held['VmRSS'] / MiB:.0f} MiB (peak {held['VmHWM'] / MiB:.0f} MiB,"
        f" budget used {used / MiB:.0f} MiB);"
        f" {len(after) * SAMPLE_EVERY:.2f} s after the resets {after[-1] / MiB:.0f} MiB"
        f" (budget used {used_after / MiB:.0f} MiB)"
    )
    # The memory the windows take stays within the bound, and the budget counts it.
    assert held["VmHWM"] - idle <= HELD_BOUND, held
    assert used <= BUDGET + CONNECTIONS * 2 * MiB
    assert held["VmRSS"] - idle <= used + 64 * MiB
    # Once the senders are gone, it is freed and given back to the system.
    assert used_after == 0
    assert after[-1] - idle <= AFTER_BOUND, after
    assert not gw.warnings(), gw.warnings()
