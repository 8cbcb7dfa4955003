"""Envelope writers: a segment-append writer whose events are hub messages.

A writer set up with ``payload_format`` 1 appends envelopes the server checks
and stores as records of format ``ENVELOPE``, so the durable destination's
subscribers of any protocol get messages with their headers, content type and
source. Over real sockets to a running gateway with a durable topic
``alerts`` (kept in the segment ``alerts/0``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver
from segment_vectors import WRITER
from test_segment_server import Peer, append, hello

from gateway.core.model import Message, PeerIdentity, Source
from gateway.durable import envelope
from gateway.runtime.gateway import Gateway
from gateway.store import RecordFormat
from protocols.segment import (
    NULL_EVENT_NUMBER,
    READ_FORMATS,
    AppendSetup,
    DataAppended,
    ErrorMessage,
    Hello,
    PayloadFormat,
    ReadSegment,
    SegmentRead,
    SetupAppend,
    encode,
)

SEGMENT = "alerts/0"
SPARK = Source("spark", "sink-1")
OTHER = UUID("ffeeddcc-bbaa-9988-7766-554433221100")


def alerts_config() -> dict[str, Any]:
    return {
        "listeners": [
            {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0"},
            {"name": "seg", "protocol": "segment", "bind": "127.0.0.1:0"},
        ],
        "destinations": [{"name": "alerts", "kind": "topic", "store": "embedded"}],
    }


@asynccontextmanager
async def envelope_writer(
    gw: Gateway, fmt: int = PayloadFormat.ENVELOPE, writer: UUID = WRITER
) -> AsyncIterator[Peer]:
    """A connection whose ``writer`` is set up on ``alerts/0`` with ``fmt``."""
    stream = await trio.open_tcp_stream(*host_port(gw.addresses["seg"][0]))
    async with stream:
        peer = Peer(stream)
        await peer.send(hello())
        assert await peer.command() == Hello(17, 5)
        await peer.send(encode(SetupAppend(1, writer, SEGMENT, "", fmt)))
        reply = await peer.command()
        assert reply == AppendSetup(1, SEGMENT, writer, NULL_EVENT_NUMBER, fmt or -1)
        yield peer


def alert(body: bytes, **kwargs: Any) -> bytes:
    message = Message("alerts", body, {"severity": "high"}, "text/plain", SPARK)
    return envelope.encode(message._replace(**kwargs), stored_at=1_700_000_000.0)


def stored_events(gw: Gateway) -> int:
    assert gw.store is not None
    segment = gw.store.segment(SEGMENT, create=False)
    return 0 if segment is None else segment.next_event


async def test_an_envelope_writers_events_reach_an_ndjson_subscriber_as_messages(
    tmp_path: Path,
) -> None:
    async with running_gateway(alerts_config(), base_dir=tmp_path) as gw:
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["nd"][0]))
        async with NdjsonClient(stream) as subscriber, envelope_writer(gw) as writer:
            await subscriber.subscribe("alerts", start="earliest")
            await writer.send(append(WRITER, [alert(b"disk full"), alert(b"cpu hot")], 2))
            assert isinstance(await writer.command(), DataAppended)
            got = []
            with trio.fail_after(10):
                while len(got) < 2:
                    delivery = await subscriber.receive()
                    assert isinstance(delivery, Deliver)
                    got.append(delivery)
        assert [d.body for d in got] == [b"disk full", b"cpu hot"]
        assert [d.position for d in got] == [0, 1]
        assert got[0].headers == {"severity": "high"}
        assert got[0].content_type == "text/plain"
        # The hub's subscribers get the writer's source too.
        sub = gw.hub.subscribe("alerts", start="earliest")
        with trio.fail_after(10):
            first = (await sub.receive(1))[0].message
        sub.close()
        assert first.source is not None
        assert (first.source.protocol, first.source.listener) == ("spark", "sink-1")


async def test_envelopes_are_stored_as_envelope_records_and_read_back_so(tmp_path: Path) -> None:
    async with running_gateway(alerts_config(), base_dir=tmp_path) as gw:
        async with envelope_writer(gw) as writer:
            await writer.send(append(WRITER, [alert(b"x")], 1))
            assert isinstance(await writer.command(), DataAppended)
        assert gw.store is not None
        segment = gw.store.segment(SEGMENT)
        assert segment.read_events(0, 10, 1000) == [(RecordFormat.ENVELOPE, alert(b"x"))]
        async with envelope_writer(gw, PayloadFormat.RAW, OTHER) as raw:
            await raw.send(append(OTHER, [b"plain"], 1))
            assert isinstance(await raw.command(), DataAppended)
        assert segment.read_events(1, 10, 1000) == [(RecordFormat.RAW, b"plain")]


async def test_a_bad_envelope_is_refused_and_nothing_of_its_block_stored(tmp_path: Path) -> None:
    async with running_gateway(alerts_config(), base_dir=tmp_path) as gw:
        async with envelope_writer(gw) as writer:
            await writer.send(append(WRITER, [alert(b"fine"), b"not msgpack"], 2, rid=7))
            replies = await writer.closed()
        assert len(replies) == 1
        error = replies[0]
        assert isinstance(error, ErrorMessage)
        assert (error.request_id, error.segment, error.error_code) == (7, SEGMENT, 0)
        assert error.message.startswith("event 1 of the block: bad envelope")
        assert stored_events(gw) == 0


async def test_a_writer_cannot_claim_a_verified_identity(tmp_path: Path) -> None:
    claimed = Source("spark", "sink-1", identity=PeerIdentity("CN=admin"))
    async with running_gateway(alerts_config(), base_dir=tmp_path) as gw:
        async with envelope_writer(gw) as writer:
            await writer.send(append(WRITER, [alert(b"sneaky", source=claimed)], 1))
            replies = await writer.closed()
        assert [type(r) for r in replies] == [ErrorMessage]
        assert "event 0 of the block: a source identity" in replies[0].message  # type: ignore[attr-defined]
        assert stored_events(gw) == 0


async def test_an_unknown_payload_format_is_refused_and_the_connection_stays(
    tmp_path: Path,
) -> None:
    async with running_gateway(alerts_config(), base_dir=tmp_path) as gw:
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["seg"][0]))
        async with stream:
            peer = Peer(stream)
            await peer.send(encode(SetupAppend(3, WRITER, SEGMENT, "", 7)))
            reply = await peer.command()
            assert isinstance(reply, ErrorMessage)
            assert (reply.request_id, reply.error_code) == (3, 0)
            assert "unknown payload format 7" in reply.message
            await peer.send(encode(SetupAppend(4, WRITER, SEGMENT, "", 1)))
            assert await peer.command() == AppendSetup(4, SEGMENT, WRITER, NULL_EVENT_NUMBER, 1)


async def test_a_read_of_envelopes_reports_their_format(tmp_path: Path) -> None:
    async with running_gateway(alerts_config(), base_dir=tmp_path) as gw:
        async with envelope_writer(gw) as writer:
            await writer.send(append(WRITER, [alert(b"x")], 1))
            assert isinstance(await writer.command(), DataAppended)
            await writer.send(encode(ReadSegment(SEGMENT, 0, 1000, "", 9, READ_FORMATS)))
            read = await writer.command()
        assert isinstance(read, SegmentRead)
        assert read.format_runs == [(0, PayloadFormat.ENVELOPE)]
        assert envelope.decode(read.data[8:], "alerts").body == b"x"
