"""SIGKILL a gateway that stores durably, again and again: nothing acked is lost,
and nothing a segment writer appended is stored twice.

Writers of two protocols append into one durable destination, ``logs``
(``store = "embedded"``, its segment ``logs/0``), of a gateway process that is
killed with SIGKILL several times while they run and restarted on the same
ports and data directory:

- segment-append writers (``SegmentWriter``, each with its own writer id)
  append numbered RAW events; on every reconnect the server's ``AppendSetup``
  says what is stored and they resend only the rest: **exactly once**;
- a Lumberjack sender (another protocol, through the hub) publishes numbered
  events and resends any window not acked: **at least once** (a window stored
  but not acked before a kill is stored again; counted as duplicates).

Afterwards the store is opened by the test itself and read from the first
event: every acked event is there, the segment writers' events exactly once
and in order per writer. The counts are printed.
"""

from __future__ import annotations

import random
import re
import uuid
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio

from gateway.durable.envelope import decode
from gateway.store import RecordFormat, Store
from protocols.segment.client import SegmentWriter

pytestmark = pytest.mark.slow

KILLS = 4
WRITERS = 3
#: Events each segment writer appends per call (one or more blocks).
BATCH = 50
#: Events acked (segment writers and Lumberjack together) before each kill is armed.
ACKED_BEFORE_KILL = 2000
_NUMBER = re.compile(rb'"n":(\d+)')


class NumberedWriter:
    """Appends ``w<id>-<n>`` events, n = 0, 1, 2, …, and records what was acked."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.writer_id = uuid.UUID(int=index + 1)
        self.next_n = 0
        self.acked = 0

    async def run(self, address: str, stop: trio.Event) -> None:
        async with SegmentWriter.connect(
            address, writer_id=self.writer_id, backoff_initial=0.05, backoff_max=0.5
        ) as writer:
            while not stop.is_set():
                numbers = range(self.next_n, self.next_n + BATCH)
                self.next_n += BATCH
                await writer.append_many("logs/0", [b"w%d-%d" % (self.index, n) for n in numbers])
                self.acked = self.next_n


async def read_back(directory: Path) -> tuple[dict[int, list[int]], list[int], int]:
    """Every event of ``logs/0``: segment writers' numbers by writer, Lumberjack numbers,
    and how many events were neither."""
    by_writer: dict[int, list[int]] = {}
    lumberjack: list[int] = []
    other = 0
    async with Store.open(directory) as store:
        segment = store.segment("logs/0", create=False)
        assert segment is not None, store.names()
        index = segment.first_event
        assert index == 0
        while index < segment.next_event:
            events = segment.read_events(index, 10_000, 16 * 2**20)
            index += len(events)
            for fmt, payload in events:
                if fmt == RecordFormat.RAW and payload.startswith(b"w"):
                    w, n = payload[1:].split(b"-")
                    by_writer.setdefault(int(w), []).append(int(n))
                elif fmt == RecordFormat.ENVELOPE and (
                    m := _NUMBER.search(decode(payload, "logs").body)
                ):
                    lumberjack.append(int(m.group(1)))
                else:
                    other += 1
    return by_writer, lumberjack, other


async def test_sigkill_loses_nothing_acked_and_duplicates_no_segment_event(
    tmp_path: Path,
    faults: ModuleType,
    rng: random.Random,
    gateway_process: Any,
) -> None:
    segment_port, lumberjack_port = faults.free_port(), faults.free_port()
    config = tmp_path / "gateway.toml"
    config.write_text(
        faults.toml_config(
            {
                "gateway": {"drain_timeout": "2s", "data_dir": "data"},
                "listeners": [
                    {
                        "name": "segments",
                        "protocol": "segment",
                        "bind": f"127.0.0.1:{segment_port}",
                    },
                    {
                        "name": "lj",
                        "protocol": "lumberjack",
                        "bind": f"127.0.0.1:{lumberjack_port}",
                        "destination": "logs",
                    },
                ],
                "destinations": [{"name": "logs", "store": "embedded", "retain": "1GiB"}],
            }
        )
    )
    gw = gateway_process(config)
    await gw.start()
    writers = [NumberedWriter(i) for i in range(WRITERS)]
    sender = faults.AtLeastOnceSender(("127.0.0.1", lumberjack_port), window=100, timeout=5.0)

    def acked() -> int:
        return sum(w.acked for w in writers) + len(sender.acked)

    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for w in writers:
            nursery.start_soon(w.run, f"127.0.0.1:{segment_port}", stop)
        nursery.start_soon(sender.run, stop)
        for _ in range(KILLS):
            target = acked() + ACKED_BEFORE_KILL
            with trio.fail_after(60):
                while acked() < target:
                    await trio.sleep(0.01)
            await trio.sleep(rng.uniform(0, 0.05))  # somewhere inside a commit
            await gw.kill()
            await trio.sleep(rng.uniform(0, 0.2))  # down for a random while (real time)
            await gw.start()
        target = acked() + ACKED_BEFORE_KILL  # the last run carries traffic too
        with trio.fail_after(60):
            while acked() < target:
                await trio.sleep(0.01)
        stop.set()  # each writer finishes the batch it has in flight, acked
    assert await gw.stop() == 0, "\n".join(gw.log)

    by_writer, lumberjack, other = await read_back(tmp_path / "data" / "store")
    stored_lj = Counter(lumberjack)
    counts = {
        "kills": KILLS,
        "segment_acked": sum(w.acked for w in writers),
        "segment_stored": sum(len(v) for v in by_writer.values()),
        "segment_duplicates": sum(len(v) - len(set(v)) for v in by_writer.values()),
        "lumberjack_acked": len(sender.acked),
        "lumberjack_stored": len(lumberjack),
        "lumberjack_duplicates": len(lumberjack) - len(stored_lj),
        "lumberjack_lost": sum(1 for n in sender.acked if n not in stored_lj),
        "other_events": other,
    }
    print("\nkill -9 of a durable gateway: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    for w in writers:
        # Exactly once, in order: every acked event and nothing else (each writer
        # stopped only once its last batch was acked).
        assert by_writer.get(w.index) == list(range(w.acked)), f"writer {w.index}"
    assert counts["lumberjack_lost"] == 0
    assert other == 0
    assert gw.starts == KILLS + 1
