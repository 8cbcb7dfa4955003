"""Durable destinations in a running gateway, over real sockets.

- Beats to a durable destination (``pylogbeat``, an independent Lumberjack
  client): acked once stored, and a subscriber that connects later, even after
  a restart of the gateway, reads everything, in order.
- A named group resumes after a restart: what it acked is not delivered again,
  what it held unacked is.
- A segment-append reader reads what another protocol published: the stored
  envelopes, decoded with ``gateway.durable.envelope``.
- The store's figures are on ``/metrics``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pylogbeat
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient

from gateway.core.destination import Delivery
from gateway.core.model import Position
from gateway.durable import envelope
from protocols.segment.client import SegmentReader


def durable_config(**destination: Any) -> dict[str, Any]:
    return {
        "listeners": [
            {"name": "lj", "protocol": "lumberjack", "bind": "127.0.0.1:0", "destination": "logs"},
            {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"},
            {"name": "seg", "protocol": "segment", "bind": "127.0.0.1:0"},
        ],
        "destinations": [{"name": "logs", "store": "embedded"} | destination],
    }


def send_beats(address: str, count: int) -> None:
    """Two windows through pylogbeat; ``send`` returns once each window is acked."""
    host, port = host_port(address)
    with pylogbeat.PyLogBeatClient(host, port, timeout=10) as client:
        half = count // 2
        client.send([{"id": i, "message": "hello"} for i in range(half)])
        client.send([{"id": i, "message": "hello"} for i in range(half, count)])


async def receive_all(gw: Any, count: int, **subscribe: Any) -> list[Delivery]:
    sub = gw.hub.subscribe("logs", **subscribe)
    got: list[Delivery] = []
    with trio.fail_after(10):
        while len(got) < count:
            got += await sub.receive()
    sub.close()
    return got


async def test_beats_into_a_durable_destination_reach_a_subscriber_that_comes_after_a_restart(
    tmp_path: Path,
) -> None:
    async with running_gateway(durable_config(), base_dir=tmp_path) as gw:
        # Nobody subscribes: the log, not a consumer, acks the Beats windows.
        with trio.fail_after(20):
            await trio.to_thread.run_sync(send_beats, gw.addresses["lj"][0], 300)
        assert gw.store is not None
        assert gw.store.stats()["events"] == 300
    async with running_gateway(durable_config(), base_dir=tmp_path) as gw:
        got = await receive_all(gw, 300, start="earliest")
    assert [json.loads(d.message.body)["id"] for d in got] == list(range(300))
    assert [d.position for d in got] == [Position(i) for i in range(300)]
    assert got[0].message.content_type == "application/json"
    assert got[0].message.source is not None
    assert got[0].message.source.protocol == "lumberjack"


async def test_a_named_group_resumes_after_a_restart(tmp_path: Path) -> None:
    async with running_gateway(durable_config(groups=["audit"]), base_dir=tmp_path) as gw:
        async with NdjsonClient(
            await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        ) as client:
            ids = await client.publish_nowait([b"m%d" % i for i in range(100)], "logs")
            answers = await client.wait_answers(ids)
        assert {a.status for a in answers} == {"delivered"}
        # Acked publishes were committed durably (interval policy: one commit covers many).
        assert (gw.metrics.value("interchange_store_commits_total") or 0) >= 1
        assert (gw.metrics.value("interchange_store_fsyncs_total") or 0) >= 1
        sub = gw.hub.subscribe("logs", "audit", max_unacked=50)
        with trio.fail_after(10):
            first = await sub.receive(50)
        sub.ack_many(d.tag for d in first[:40])  # 40..49 stay unacked at the "crash"
    async with running_gateway(durable_config(groups=["audit"]), base_dir=tmp_path) as gw:
        got = await receive_all(gw, 60, group="audit")
        assert gw.metrics.value("interchange_store_events") == 100
        assert gw.metrics.value("interchange_store_segments") == 1
    assert [d.message.body for d in got] == [b"m%d" % i for i in range(40, 100)]


async def test_a_segment_reader_reads_what_another_protocol_published(tmp_path: Path) -> None:
    async with running_gateway(durable_config(), base_dir=tmp_path) as gw:
        async with NdjsonClient(
            await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        ) as client:
            ids = await client.publish_nowait([b"e%d" % i for i in range(20)], "logs")
            assert {a.status for a in await client.wait_answers(ids)} == {"delivered"}
        async with SegmentReader.connect(gw.addresses["seg"][0]) as reader:
            events = []
            with trio.fail_after(10):
                async for _offset, payload in reader.read("logs/0", 0, follow=False):
                    events.append(envelope.decode(payload, "logs"))
    assert [m.body for m in events] == [b"e%d" % i for i in range(20)]
    assert all(m.source is not None and m.source.protocol == "ndjson" for m in events)
