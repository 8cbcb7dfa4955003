"""A fast publisher and a slow consumer: the gateway's memory stays bounded.

Two ndjson publishers send 1 KiB messages to the queue ``slow`` as fast as
they can; its only subscriber, an ndjson client, acks one message every few
milliseconds. The gateway must hold at most ``buffer_bytes`` (1 MiB) for the
queue's group and make the publishers wait, not buffer the difference. While
the load runs the test samples, every 0.2 s, the bytes the hub accounts for
(each destination's groups' ``held_bytes`` in ``stats()``), the gauge
``interchange_memory_used_bytes`` from ``GET /metrics`` when the gateway
reports it, and the resident memory of the process (gateway, publishers and
subscriber all run in it). Afterwards, every message a publisher got a
``delivered`` ack for must have reached the subscriber.
"""

from __future__ import annotations

import math
from collections import Counter
from types import ModuleType

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.runtime.gateway import Gateway

pytestmark = pytest.mark.slow

BUFFER_BYTES = 1024 * 1024
BODY = 1024
PUBLISHERS = 2
#: Publishes a publisher sends in one go, and how many such batches may be unanswered.
BATCH = 50
BATCHES_IN_FLIGHT = 40
#: How long the load runs, and the subscriber's pause before each ack.
LOAD_SECONDS = 8.0
ACK_DELAY = 0.002
SAMPLE_EVERY = 0.2
#: For the gauge: what connections may hold partly received beyond the buffers.
GAUGE_SLACK = 1024 * 1024
RSS_GROWTH_LIMIT = 200 * 1024 * 1024
MEMORY_GAUGE = "interchange_memory_used_bytes"


def body(n: int) -> bytes:
    return b"%010d:" % n + b"m" * (BODY - 11)


def held_bytes(gw: Gateway) -> int:
    """Bytes the hub's destinations account for (every group's queued plus unacked)."""
    total = 0
    for destination in gw.hub.destinations().values():
        groups = destination.stats().get("groups", {})
        assert isinstance(groups, dict)
        total += sum(int(g["held_bytes"]) for g in groups.values())
    return total


async def scrape(address: tuple[str, int]) -> dict[str, float]:
    """``GET /metrics``: every sample without labels, by name."""
    with trio.fail_after(5):
        stream = await trio.open_tcp_stream(*address)
        async with stream:
            await stream.send_all(
                b"GET /metrics HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n\r\n"
            )
            data = bytearray()
            while chunk := await stream.receive_some(65536):
                data += chunk
    head, _, text = bytes(data).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
        if not sample.labels
    }


async def test_a_slow_consumer_keeps_memory_bounded_and_loses_nothing_acked(
    faults: ModuleType,
) -> None:
    config = {
        "gateway": {"buffer_bytes": BUFFER_BYTES, "drain_timeout": "1s"},
        "metrics": {"bind": "127.0.0.1:0"},
        "listeners": [
            {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "slow"}
        ],
        "destinations": [{"name": "slow", "kind": "queue"}],
    }
    async with running_gateway(config) as gw:
        address = host_port(gw.addresses["nd"][0])
        metrics_address = host_port(gw.metrics_addresses[0])
        delivered: list[int] = []
        acked: list[int] = []
        other_answers: Counter[str] = Counter()
        stop = trio.Event()
        slow = True

        async def subscriber(task_status: trio.TaskStatus[None]) -> None:
            async with await NdjsonClient.connect(*address) as client:
                await client.subscribe("slow", window=20)
                task_status.started()
                while True:
                    d = await client.receive()
                    delivered.append(int(d.body[:10]))
                    if slow:
                        await trio.sleep(ACK_DELAY)  # real time: a consumer slower than the load
                    await client.ack(d.tag)

        async def publisher(first: int) -> None:
            async with await NdjsonClient.connect(*address) as client:
                send, receive = trio.open_memory_channel[tuple[list[int], range]](BATCHES_IN_FLIGHT)

                async def answers() -> None:
                    async for ids, numbers in receive:
                        for answer, n in zip(await client.wait_answers(ids), numbers, strict=True):
                            if answer.status == "delivered":
                                acked.append(n)
                            else:
                                other_answers[f"{answer.status}: {answer.reason}"] += 1

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(answers)
                    async with send:
                        n = first
                        while not stop.is_set():
                            numbers = range(n, n + BATCH)
                            n += BATCH
                            ids = await client.publish_nowait([body(i) for i in numbers])
                            await send.send((ids, numbers))

        held: list[int] = []
        gauge: list[float] = []
        rss: list[int] = []
        async with trio.open_nursery() as consumers:
            await consumers.start(subscriber)
            rss_before = faults.vm_rss_bytes()
            with trio.fail_after(LOAD_SECONDS + 30):
                async with trio.open_nursery() as publishers:
                    for k in range(PUBLISHERS):
                        publishers.start_soon(publisher, k * 10**8)
                    deadline = trio.current_time() + LOAD_SECONDS
                    while trio.current_time() < deadline:
                        await trio.sleep(SAMPLE_EVERY)  # real time: sampling memory under load
                        held.append(held_bytes(gw))
                        rss.append(faults.vm_rss_bytes())
                        if (value := (await scrape(metrics_address)).get(MEMORY_GAUGE)) is not None:
                            gauge.append(value)
                    # Stop publishing; the subscriber speeds up so the rest drains quickly.
                    stop.set()
                    slow = False
            # Every publish is answered now.
            consumers.cancel_scope.cancel()

    rss_growth = max(rss) - rss_before
    gauge_max = max(gauge, default=math.nan)
    lost = sorted(set(acked) - set(delivered))
    print(
        f"\nslow consumer: acked={len(acked)} delivered={len(delivered)} "
        f"duplicates={len(delivered) - len(set(delivered))} lost={len(lost)} "
        f"not delivered: {dict(other_answers)}; "
        f"hub held max {max(held)} bytes of {BUFFER_BYTES}; "
        f"{MEMORY_GAUGE} max {gauge_max:.0f} "
        f"({'reported' if gauge and gauge_max > 0 else 'not reported: hub stats used'}); "
        f"RSS {rss_before / 2**20:.1f} MiB before, growth max {rss_growth / 2**20:.1f} MiB"
    )
    # The load did push against the bound: publishers were faster than the consumer.
    assert max(held) >= BUFFER_BYTES // 2, held
    assert max(held) <= BUFFER_BYTES, held
    if gauge and gauge_max > 0:  # the gauge is implemented: it must agree
        assert gauge_max <= BUFFER_BYTES + GAUGE_SLACK, gauge
    assert rss_growth < RSS_GROWTH_LIMIT, rss
    assert not other_answers
    assert not lost, f"{len(lost)} acked messages never delivered, e.g. {lost[:10]}"
