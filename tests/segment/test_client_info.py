"""The trio segment client's additions: segment info, locating event boundaries,
reads that tell raw events from envelopes, caller-chosen event numbers, and
envelope writers whose events become messages.

Against a running gateway with a durable destination ``logs`` (one partition).
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from uuid import UUID

import pytest
import trio
from harness import running_gateway

from gateway.core.model import Message, Outcome, Source
from gateway.durable import envelope
from gateway.runtime.gateway import Gateway
from gateway.store import Segment, split_events
from protocols.segment import AppendSetup, Hello, ServerCodec, SetupAppend
from protocols.segment.client import (
    NoSuchSegmentError,
    SegmentError,
    SegmentReader,
    SegmentWriter,
)

W = UUID("00112233-4455-6677-8899-aabbccddeeff")


@asynccontextmanager
async def gateway(tmp_path: Path) -> AsyncIterator[Gateway]:
    config = {
        "gateway": {"data_dir": str(tmp_path / "data"), "drain_timeout": "100ms"},
        "listeners": [{"name": "seg", "protocol": "segment", "bind": "127.0.0.1:0"}],
        "destinations": [{"name": "logs", "store": "embedded"}],
    }
    async with running_gateway(config) as gw:
        yield gw


def address(gw: Gateway) -> str:
    return gw.addresses["seg"][0]


def segment_of(gw: Gateway, name: str) -> Segment:
    assert gw.store is not None
    found = gw.store.segment(name, create=False)
    assert found is not None
    return found


def stored(gw: Gateway, name: str) -> list[bytes]:
    segment = segment_of(gw, name)
    return split_events(segment.read(segment.start, segment.durable_end))


# -- info and locate ---------------------------------------------------------------------------


async def test_info_and_locate(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        async with SegmentWriter.connect(address(gw)) as writer:
            await writer.append_many("s", [b"a" * 10, b"b" * 20, b"c" * 30])
        async with SegmentReader.connect(address(gw)) as reader:
            info = await reader.info("s")
            assert (info.exists, info.start, info.end) == (True, 0, 18 + 28 + 38)
            assert (info.first_event, info.next_event) == (0, 3)
            assert info.last_modified_ms > 0
            missing = await reader.info("nowhere")
            assert (missing.exists, missing.end, missing.next_event) == (False, 0, 0)
            assert await reader.locate("s", 30) == (18, 1)
            assert await reader.locate("s", 0, events=2) == (46, 2)
            assert await reader.locate("s", 999) == (84, 3)
            with pytest.raises(NoSuchSegmentError):
                await reader.locate("nowhere", 0)
            # The same connection goes on reading.
            assert [p async for _, p in reader.read("s", 18, follow=False)] == [
                b"b" * 20,
                b"c" * 30,
            ]


async def test_read_stored_tells_raw_events_from_envelopes(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        async with SegmentWriter.connect(address(gw)) as writer:
            await writer.append("logs/0", b"raw one")
            receipt = await gw.hub.publish([Message("logs", b"message", {"k": "v"}, "text/plain")])
            assert await receipt.wait() == Outcome.DELIVERED
            await writer.append("logs/0", b"raw two")
        async with SegmentReader.connect(address(gw)) as reader:
            events = [e async for e in reader.read_stored("logs/0", follow=False)]
    assert [e.format for e in events] == [0, 1, 0]
    assert [events[0].payload, events[2].payload] == [b"raw one", b"raw two"]
    message = envelope.decode(events[1].payload, "logs")
    assert (message.body, dict(message.headers)) == (b"message", {"k": "v"})


# -- caller-chosen event numbers ---------------------------------------------------------------


async def test_caller_chosen_numbers_make_a_retry_store_nothing_twice(tmp_path: Path) -> None:
    payloads = [b"row-%d" % i for i in range(10)]
    async with gateway(tmp_path) as gw:
        async with SegmentWriter.connect(address(gw), writer_id=W) as writer:
            acked = await writer.append_many("s", payloads[:6], first_event_number=1 << 32)
            assert acked is not None
            assert acked.event_number == (1 << 32) + 5
            # Stored already: acked at once, not sent.
            again = await writer.append_many("s", payloads[:2], first_event_number=1 << 32)
            assert again is not None
            assert (again.event_number, again.segment_write_offset) == ((1 << 32) + 1, -1)
            # Numbers still on their way may not be used again.
            pending = await writer.submit("s", b"six", event_number=(1 << 32) + 6)
            with pytest.raises(ValueError, match="must lie above"):
                await writer.submit("s", b"six again", event_number=(1 << 32) + 6)
            await pending.wait()
            with pytest.raises(ValueError, match="not both"):
                await writer.append("s", b"numbered by the writer")
        # A retry of the same rows with the same numbers (and a few more): only the
        # rows the server does not have are stored.
        async with SegmentWriter.connect(address(gw), writer_id=W) as writer:
            acked = await writer.append_many("s", payloads, first_event_number=1 << 32)
            assert acked is not None
            assert acked.event_number == (1 << 32) + 9
            one = await writer.append("s", b"later", event_number=(2 << 32))
            assert one.event_number == 2 << 32
        assert stored(gw, "s") == [*payloads[:6], b"six", *payloads[7:], b"later"]
        assert segment_of(gw, "s").last_event_number(W) == 2 << 32


async def test_a_retry_of_stored_rows_only_is_acked_without_appending(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        async with SegmentWriter.connect(address(gw), writer_id=W) as writer:
            await writer.append_many("s", [b"a", b"b"], first_event_number=7)
        async with SegmentWriter.connect(address(gw), writer_id=W) as writer:
            acked = await writer.append_many("s", [b"a", b"b"], first_event_number=7)
            assert acked is not None
            assert (acked.event_number, acked.segment_write_offset) == (8, -1)
        assert stored(gw, "s") == [b"a", b"b"]


async def test_a_retry_in_several_calls_skips_what_an_earlier_attempt_stored(
    tmp_path: Path,
) -> None:
    rows = [b"row-%d" % i for i in range(12)]
    async with gateway(tmp_path) as gw:
        async with SegmentWriter.connect(address(gw), writer_id=W) as writer:
            await writer.append_many("s", rows[:10], first_event_number=1)
        async with SegmentWriter.connect(address(gw), writer_id=W) as writer:
            for start in (0, 4, 8):  # the retry goes further than the first attempt
                acked = await writer.append_many(
                    "s", rows[start : start + 4], first_event_number=start + 1
                )
                assert acked is not None
                assert acked.event_number == start + 4
            again = await writer.append("s", b"again", event_number=12)
            assert (again.event_number, again.segment_write_offset) == (12, -1)
        assert stored(gw, "s") == rows
        assert segment_of(gw, "s").stats()["appended_events"] == 12


# -- envelope writers --------------------------------------------------------------------------


async def test_an_envelope_writer_appends_messages(tmp_path: Path) -> None:
    source = Source("spark", "sink")
    messages = [
        Message("logs", b"alert %d" % i, {"level": "error"}, "application/json", source)
        for i in range(3)
    ]
    async with gateway(tmp_path) as gw:
        sub = gw.hub.subscribe("logs", "readers")
        async with SegmentWriter.connect(address(gw), envelope=True) as writer:
            await writer.append_many("logs/0", envelope.encode_many(messages))
        got: list[Message] = []
        with trio.fail_after(10):
            while len(got) < 3:
                got += [d.message for d in await sub.receive()]
    assert [(m.body, dict(m.headers), m.content_type) for m in got] == [
        (m.body, {"level": "error"}, "application/json") for m in messages
    ]
    assert {(m.source.protocol, m.source.listener) for m in got if m.source} == {("spark", "sink")}


async def test_a_payload_that_is_not_an_envelope_fails_its_appends(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        async with SegmentWriter.connect(address(gw), envelope=True) as writer:
            with pytest.raises(SegmentError, match="event 0 of the block"):
                await writer.append("logs/0", b"plain bytes")
            good = envelope.encode_many([Message("logs", b"fine")])[0]
            assert (await writer.append("other", good)).event_number == 1  # goes on
        assert stored(gw, "logs/0") == []


async def test_an_envelope_writer_fails_on_a_server_too_old_for_it(nursery: trio.Nursery) -> None:
    async def old_server(stream: trio.SocketStream) -> None:
        """A server of before payload formats: its AppendSetup has no such field."""
        codec = ServerCodec()
        async for data in stream:
            codec.receive_data(data)
            while isinstance(event := codec.next_event(), Hello | SetupAppend):
                if isinstance(event, Hello):
                    await stream.send_all(codec.send(Hello()))
                else:
                    setup = AppendSetup(event.request_id, event.segment, event.writer_id, 0)
                    await stream.send_all(codec.send(setup))

    serve = functools.partial(trio.serve_tcp, old_server, 0, host="127.0.0.1")
    listeners = await nursery.start(serve)
    port = listeners[0].socket.getsockname()[1]
    async with SegmentWriter.connect(f"127.0.0.1:{port}", envelope=True) as writer:
        with pytest.raises(SegmentError, match="too old for envelope writers"):
            await writer.append("s", envelope.encode_many([Message("s", b"m")])[0])
