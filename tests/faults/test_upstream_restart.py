"""The upstream's server dies and comes back, several times, under load.

Senders → in-process gateway (Lumberjack listener, ``logs`` routed to a
Lumberjack upstream) → a sink that is killed abruptly (listener closed,
connections reset, windows it read but had not acked included) and restarted
on the same port. Checks: no event acked to a sender is missing from the
sink; nothing is acked while the sink is down; and the gateway reconnects by
itself, within its backoff (defaults: 0.5 s doubling up to 5 s).
"""

from __future__ import annotations

import random
from types import ModuleType
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway

pytestmark = pytest.mark.slow

RESTARTS = 4
SENDERS = 2
#: Events acked through the sink before it is killed ("under load").
ACKED_BEFORE_KILL = 3000
#: The upstream's default ``backoff_max``: once the sink is back, the gateway must
#: reconnect within it (plus slack for a busy machine).
BACKOFF_MAX = 5.0
#: Acks already on their way when the sink died may still arrive for this long.
ACK_GRACE = 0.5


async def test_upstream_restarts_lose_no_acked_event_and_the_gateway_reconnects(
    faults: ModuleType, rng: random.Random, sink_factory: Any
) -> None:
    # Windows wait a little for their ack, so that each kill finds some read and unacked.
    sink = sink_factory(ack_delay=0.02)
    await sink.start()
    config = {
        "gateway": {"drain_timeout": "1s"},
        "listeners": [
            {
                "name": "lj",
                "protocol": "lumberjack",
                "bind": "127.0.0.1:0",
                "destination": "logs",
                "keepalive": "1s",
            }
        ],
        # backoff_initial and backoff_max are left at their defaults on purpose.
        "upstreams": [
            {"name": "sink", "protocol": "lumberjack", "connect": f"127.0.0.1:{sink.port}"}
        ],
        "routes": [{"from": "logs", "to": ["upstream:sink"]}],
    }
    async with running_gateway(config) as gw:
        address = host_port(gw.addresses["lj"][0])
        senders = [
            faults.AtLeastOnceSender(address, first=k * 10**8, timeout=30) for k in range(SENDERS)
        ]

        stop = trio.Event()
        reconnects: list[tuple[float, float, float]] = []
        with trio.fail_after(70):
            async with trio.open_nursery() as sending:
                for sender in senders:
                    sending.start_soon(sender.run, stop)
                for restart in range(RESTARTS):
                    await faults.until_acked(senders, ACKED_BEFORE_KILL)
                    await trio.sleep(rng.uniform(0.0, 0.5))  # real time: a random moment
                    await sink.kill()
                    await trio.sleep(ACK_GRACE)  # real time: acks the sink sent before dying land
                    acked_when_down = faults.acked_total(senders)
                    # Down for a random while (real time), during which nothing may be acked.
                    await trio.sleep(rng.uniform(0.2, 2.0))
                    assert faults.acked_total(senders) == acked_when_down, (
                        "events were acked while the sink was down"
                    )
                    restarted = trio.current_time()
                    await sink.start()  # the same port
                    with trio.fail_after(BACKOFF_MAX + 3):
                        first_event = await sink.wait_first_event() - restarted
                        while faults.acked_total(senders) == acked_when_down:
                            await trio.sleep(0.005)
                    first_ack = trio.current_time() - restarted
                    reconnects.append((first_event, first_ack, restarted))
                    print(
                        f"restart {restart + 1}: first event at the sink after "
                        f"{first_event:.2f}s, first ack to a sender after {first_ack:.2f}s"
                    )
                await faults.until_acked(senders, ACKED_BEFORE_KILL)
                stop.set()

    counts = faults.report("upstream restarts", senders, sink)
    lost = sorted({n for s in senders for n in s.acked} - set(sink.received))
    assert not lost, f"{len(lost)} acked events lost, e.g. {lost[:10]}"
    assert sink.connections >= RESTARTS + 1
    assert all(first_event < BACKOFF_MAX + 1 for first_event, _, _ in reconnects), reconnects
    # The senders kept their connections: the gateway held their windows meanwhile.
    assert counts["sender_errors"] == 0, [s.errors for s in senders]
