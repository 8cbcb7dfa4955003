"""SIGKILL the gateway under load, again and again: nothing acked to a sender is lost.

Senders → gateway process (Lumberjack listener, ``logs`` routed to a
Lumberjack upstream) → an in-process sink. The gateway keeps what it has not
forwarded in memory only, so a SIGKILL drops it; that is allowed only because
nothing was acked to the senders before the sink acked it. Were the gateway to
ack a window when it takes it in (before the upstream's ack), the events it
held at the kill would be acked and missing from the sink.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

pytestmark = pytest.mark.slow

KILLS = 4
SENDERS = 3
#: Events acked through each new gateway before the kill is armed ("under load").
ACKED_BEFORE_KILL = 3000


async def test_sigkill_under_load_loses_no_acked_event(
    tmp_path: Path,
    faults: ModuleType,
    rng: random.Random,
    sink_factory: Any,
    gateway_process: Any,
) -> None:
    sink = sink_factory(ack_delay=0.01)
    await sink.start()
    port = faults.free_port()  # the listener keeps its port across restarts
    config = tmp_path / "gateway.toml"
    config.write_text(
        faults.toml_config(
            {
                "gateway": {"drain_timeout": "1s"},
                "listeners": [
                    {
                        "name": "lj",
                        "protocol": "lumberjack",
                        "bind": f"127.0.0.1:{port}",
                        "destination": "logs",
                        "keepalive": "1s",
                    }
                ],
                "upstreams": [
                    {
                        "name": "sink",
                        "protocol": "lumberjack",
                        "connect": f"127.0.0.1:{sink.port}",
                        "timeout": "5s",
                    }
                ],
                "routes": [{"from": "logs", "to": ["upstream:sink"]}],
            }
        )
    )
    gw = gateway_process(config)
    addresses = await gw.start()
    assert addresses["lj"] == [f"127.0.0.1:{port}"]

    senders = [
        faults.AtLeastOnceSender(("127.0.0.1", port), first=k * 10**8) for k in range(SENDERS)
    ]

    stop = trio.Event()
    t0 = trio.current_time()
    with trio.fail_after(60):
        async with trio.open_nursery() as sending:
            for sender in senders:
                sending.start_soon(sender.run, stop)
            for kill in range(KILLS):
                await faults.until_acked(senders, ACKED_BEFORE_KILL)
                await trio.sleep(rng.uniform(0.0, 1.0))  # real time: a random moment of the load
                await gw.kill()
                at = trio.current_time() - t0
                print(f"SIGKILL {kill + 1} at {at:.2f}s: {faults.acked_total(senders)} acked")
                await trio.sleep(rng.uniform(0.0, 0.3))  # down for a random while (real time)
                await gw.start()  # same config, same ports
            # Traffic resumes after the last restart; then each sender finishes its window.
            await faults.until_acked(senders, ACKED_BEFORE_KILL)
            stop.set()
    elapsed = trio.current_time() - t0
    assert await gw.stop() == 0, "\n".join(gw.log)

    counts = faults.report("kill -9 under load", senders, sink)
    errors: Counter[str] = Counter()
    for s in senders:
        errors += s.errors
    print(f"{KILLS} SIGKILLs in {elapsed:.1f}s; sender connection errors: {dict(errors)}")
    print("gateway warnings and errors (all runs):", *gw.warnings(), sep="\n  ")
    lost = sorted({n for s in senders for n in s.acked} - set(sink.received))
    assert not lost, f"{len(lost)} acked events lost, e.g. {lost[:10]}"
    assert counts["sender_errors"] >= KILLS, "the kills did not hit the senders' connections"
    assert counts["acked"] >= (KILLS + 1) * ACKED_BEFORE_KILL
