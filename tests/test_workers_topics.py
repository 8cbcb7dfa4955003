"""In-memory topics across ``gateway run --workers 2``, end to end.

A subscriber held by worker 1 receives what a publisher held by worker 0
publishes to a plain topic, and the publisher's answer waits for the
subscriber's ack: the message crossed the link between the workers, and its
receipt settled across it. Which worker holds a connection is read from
``/proc`` (tests/test_workers.py's helpers).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
import trio
from harness import start
from interchange_ndjson.client import NdjsonClient
from test_workers import STARTUP, connections_of, supervised

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

#: How long a received delivery's publisher is watched for an early answer.
EARLY = 0.3


def topics_config(tmp_path: Path) -> Path:
    path = tmp_path / "topics.toml"
    path.write_text(
        '[gateway]\ndrain_timeout = "3s"\n'
        '[[listeners]]\nname = "nd"\nprotocol = "ndjson"\nbind = "127.0.0.1:0"\n'
    )
    return path


async def one_on_each(port: int, pids: dict[int, int]) -> dict[int, NdjsonClient]:
    """Connect until worker 0 and worker 1 each hold one of the connections; the
    others are closed."""
    held: dict[int, NdjsonClient] = {}
    extra: list[NdjsonClient] = []
    with trio.fail_after(STARTUP):
        while len(held) < 2:
            before = {i: connections_of(pid, port) for i, pid in pids.items()}
            client = await NdjsonClient.connect("127.0.0.1", port)
            while {i: connections_of(pid, port) for i, pid in pids.items()} == before:
                await trio.sleep(0.01)  # the kernel queue: wait until a worker accepted
            after = {i: connections_of(pid, port) for i, pid in pids.items()}
            index = next(i for i in pids if after[i] > before[i])
            if index in held:
                extra.append(client)
            else:
                held[index] = client
    for client in extra:
        await client.aclose()
    return held


async def test_a_subscriber_on_one_worker_gets_what_the_other_published(tmp_path: Path) -> None:
    async with supervised(topics_config(tmp_path)) as run:
        pids = run.worker_pids()
        await run.wait_for(r"linked to worker \d", 2)
        clients = await one_on_each(run.port, pids)
        publisher, subscriber = clients[0], clients[1]
        await subscriber.subscribe("news", window=10)
        async with trio.open_nursery() as nursery:
            # The subscription's interest reaches worker 0 shortly: until then a
            # publish has nobody to go to, and is answered at once.
            with trio.fail_after(STARTUP):
                for n in range(1000):
                    ids = await publisher.publish_nowait([b"m%d" % n], "news")
                    with trio.move_on_after(0.2):
                        delivery = await subscriber.receive()
                        break
                    await publisher.wait_answers(ids)
            assert delivery.body == b"m%d" % n
            answered = start(nursery, publisher.wait_answers, ids)
            with trio.move_on_after(EARLY):
                await answered.finished.wait()
            assert not answered.done, "the publisher was answered before the subscriber acked"
            await subscriber.ack(delivery.tag)
            with trio.fail_after(STARTUP):
                (answer,) = await answered.wait()
            assert answer.status == "delivered"
        for client in clients.values():
            await client.aclose()
        run.process.send_signal(signal.SIGTERM)
        with trio.fail_after(STARTUP):
            assert await run.process.wait() == 0, "\n".join(run.lines)
