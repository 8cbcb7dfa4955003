"""The segment upstream: what is routed to ``upstream:NAME`` appended to a second gateway's
segment, each message acked only once that gateway stored it, exactly once across a cut
connection, read back with the client library."""

from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from test_segment_client import proxy

from gateway.core.model import Message, Outcome
from gateway.core.receipts import Receipt
from gateway.durable import envelope
from gateway.runtime.gateway import Gateway
from protocols.segment.client import SegmentReader
from protocols.segment.upstream import default_writer_id

REMOTE = "remote/0"


def sink_config(tmp_path: Path, bind: str = "127.0.0.1:0") -> dict[str, Any]:
    return {
        "gateway": {"data_dir": str(tmp_path / "sink"), "drain_timeout": "100ms"},
        "listeners": [{"name": "seg", "protocol": "segment", "bind": bind}],
    }


def relay_config(tmp_path: Path, connect: str, **options: Any) -> dict[str, Any]:
    return {
        "gateway": {"data_dir": str(tmp_path / "relay"), "drain_timeout": "100ms"},
        "listeners": [{"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"}],
        "upstreams": [
            {
                "name": "out",
                "protocol": "segment",
                "connect": [connect],
                "backoff_initial": "20ms",
                "backoff_max": "50ms",
                "segment": REMOTE,
            }
            | options
        ],
        "routes": [{"from": "logs", "to": ["upstream:out"]}],
    }


@asynccontextmanager
async def bridge(tmp_path: Path, **options: Any) -> AsyncIterator[tuple[Gateway, Gateway]]:
    async with running_gateway(sink_config(tmp_path)) as sink:
        target = sink.addresses["seg"][0]
        async with running_gateway(relay_config(tmp_path, target, **options)) as relay:
            yield relay, sink


async def read_remote(sink: Gateway, segment: str = REMOTE) -> list[bytes]:
    async with SegmentReader.connect(sink.addresses["seg"][0]) as reader:
        return [payload async for _, payload in reader.read(segment, follow=False)]


async def settled(receipts: list[Receipt], timeout: float = 10.0) -> list[Outcome | None]:
    with trio.fail_after(timeout):
        for receipt in receipts:
            await receipt.wait()
    return [r.outcome for r in receipts]


def bodies(n: int, start: int = 0) -> list[bytes]:
    return [b"message %d" % i for i in range(start, start + n)]


async def test_ndjson_publishes_land_in_the_remote_segment_once_stored(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (relay, sink):
        async with await NdjsonClient.connect(*host_port(relay.addresses["nd"][0])) as client:
            ids = await client.publish_nowait(bodies(50), "logs")
            with trio.fail_after(10):
                answers = await client.wait_answers(ids)
        assert [a.status for a in answers] == ["delivered"] * 50
        assert await read_remote(sink) == bodies(50)
        assert sink.store is not None
        remote = sink.store.segment(REMOTE, create=False)
        assert remote is not None
        # One writer, stable across restarts: derived from the upstream's name.
        assert remote.stats()["writers"] == 1
        assert remote.last_event_number(default_writer_id("out")) == 50


async def test_a_message_waits_for_its_ack_while_the_remote_is_down(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on, for now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    where = f"127.0.0.1:{port}"
    async with running_gateway(relay_config(tmp_path, where)) as relay:
        receipts = [await relay.hub.publish([Message("logs", b)]) for b in bodies(3)]
        with trio.move_on_after(0.3):
            await receipts[0].wait()
        assert [r.outcome for r in receipts] == [None, None, None]  # not acked: not stored
        async with running_gateway(sink_config(tmp_path, where)) as sink:
            assert await settled(receipts) == [Outcome.DELIVERED] * 3
            assert await read_remote(sink) == bodies(3)


async def test_a_cut_connection_duplicates_nothing_remotely(tmp_path: Path) -> None:
    async with running_gateway(sink_config(tmp_path)) as sink:
        target = sink.addresses["seg"][0]
        # The first connection passes Hello and AppendSetup (16 + 50 bytes) and no ack,
        # and is cut once 3000 bytes went to the sink: stored blocks are never acked.
        async with (
            proxy(target, cut_after=3000, replies=66) as (via, cutter),
            running_gateway(relay_config(tmp_path, via)) as relay,
        ):
            receipts = []
            for i in range(0, 400, 20):
                receipts += [await relay.hub.publish([Message("logs", b)]) for b in bodies(20, i)]
                await trio.sleep(0.005)  # paced (real time): several blocks in flight at the cut
            assert await settled(receipts) == [Outcome.DELIVERED] * 400
            assert cutter.connections == 2
            resent = relay.metrics.value(
                "segment_upstream_events_resent_total", {"upstream": "out"}
            )
            assert resent  # events cut in flight went again, with their numbers
        assert await read_remote(sink) == bodies(400)


async def test_envelopes_carry_the_whole_message(tmp_path: Path) -> None:
    writer = uuid.UUID("0f0e0d0c-0b0a-0908-0706-050403020100")
    async with bridge(tmp_path, payload="envelope", writer_id=str(writer)) as (relay, sink):
        message = Message("logs", b"body", {"k": "v"}, "text/plain")
        assert await settled([await relay.hub.publish([message])]) == [Outcome.DELIVERED]
        (payload,) = await read_remote(sink)
        back = envelope.decode(payload, "logs")
        assert (back.body, back.headers, back.content_type) == (b"body", {"k": "v"}, "text/plain")
        assert sink.store is not None
        remote = sink.store.segment(REMOTE, create=False)
        assert remote is not None
        assert remote.stats()["writers"] == 1
        assert remote.last_event_number(writer) == 1


async def test_an_event_too_large_for_the_protocol_is_rejected(tmp_path: Path) -> None:
    async with bridge(tmp_path) as (relay, sink):
        huge = Message("logs", b"x" * (8 * 2**20 + 1))
        receipts = [await relay.hub.publish([m]) for m in (huge, Message("logs", b"fine"))]
        assert await settled(receipts) == [Outcome.REJECTED, Outcome.DELIVERED]
        assert await read_remote(sink) == [b"fine"]


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"segment": None}, "segment"),
        ({"writer_id": "not-a-uuid"}, "not a UUID"),
        ({"payload": "json"}, "payload"),
    ],
)
def test_upstream_options_are_checked(tmp_path: Path, options: dict[str, Any], error: str) -> None:
    from gateway.config.loader import parse

    config = relay_config(tmp_path, "127.0.0.1:1", **options)
    upstream = config["upstreams"][0]
    for key, value in options.items():
        if value is None:
            del upstream[key]
    with pytest.raises(Exception, match=error):
        parse(config, source="<test>")
