"""The segment-append client library: numbering, batching, reconnects with exactly-once
resends, the in-flight window, refusals, and reading from any offset to the tail.

Against a running gateway (tcp, unix and TLS), a proxy that cuts the
connection mid-stream, and scripted servers built on the codec's server side,
which say exactly what each connection stored and acknowledged.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import trio
import trio.testing
from harness import running_gateway

from gateway.config.certs import init_dir
from gateway.runtime.gateway import Gateway
from gateway.store import Segment, split_events
from protocols.segment import (
    NEED_DATA,
    NULL_EVENT_NUMBER,
    Append,
    AppendSetup,
    Command,
    ConnectionClosed,
    DataAppended,
    Hello,
    KeepAlive,
    ReadSegment,
    SegmentRead,
    ServerCodec,
    SetupAppend,
    event_frame,
)
from protocols.segment.client import (
    Appender,
    NoSuchSegmentError,
    SegmentReader,
    SegmentTruncatedError,
    SegmentWriter,
    WriterSettings,
    run_appender,
)

W = UUID("00112233-4455-6677-8899-aabbccddeeff")


def payloads(n: int, start: int = 0) -> list[bytes]:
    return [f"event-{i:05d}".encode() for i in range(start, start + n)]


# -- a gateway -------------------------------------------------------------------------------


@asynccontextmanager
async def gateway(tmp_path: Path, **listener: Any) -> AsyncIterator[Gateway]:
    config = {
        "gateway": {"data_dir": str(tmp_path / "data"), "drain_timeout": "100ms"},
        "listeners": [{"name": "seg", "protocol": "segment", "bind": "127.0.0.1:0"} | listener],
    }
    async with running_gateway(config) as gw:
        yield gw


def address(gw: Gateway) -> str:
    return gw.addresses["seg"][0]


def segment_of(gw: Gateway, name: str) -> Segment:
    assert gw.store is not None
    segment = gw.store.segment(name, create=False)
    assert segment is not None
    return segment


def stored(segment: Segment) -> list[bytes]:
    return split_events(segment.read(segment.start, segment.end))


# -- writing to a gateway --------------------------------------------------------------------


async def test_events_are_numbered_from_one_and_read_back(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        async with SegmentWriter.connect(address(gw)) as writer:
            first = await writer.append("a", b"one")
            assert (first.segment, first.event_number, first.segment_write_offset) == ("a", 1, 11)
            last = await writer.append_many("a", payloads(5))
            assert last is not None
            assert last.event_number == 6
            assert last.writer_id == first.writer_id
            other = await writer.append("b", b"two")  # a second segment, same connection
            assert other.event_number == 1
            assert other.writer_id != first.writer_id
            assert writer.connections == 1
        async with SegmentReader.connect(address(gw)) as reader:
            got = [p async for _, p in reader.read("a", follow=False)]
            assert got == [b"one", *payloads(5)]
            assert [p async for _, p in reader.read("b", follow=False)] == [b"two"]


async def test_a_known_writer_id_goes_on_after_the_stored_number(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw:
        async with SegmentWriter.connect(address(gw), writer_id=W) as writer:
            await writer.append_many("s", payloads(3))
        async with SegmentWriter.connect(address(gw), writer_id=W) as writer:
            acked = await writer.append("s", b"again")
            assert (acked.writer_id, acked.event_number) == (W, 4)
            with pytest.raises(ValueError, match="writer id"):
                await writer.append("t", b"a fixed id is for one segment")
        assert segment_of(gw, "s").last_event_number(W) == 4


async def test_events_in_flight_share_blocks(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, SegmentWriter.connect(address(gw)) as writer:
        handles = []
        for i in range(40):  # a trickle: one event a turn while earlier ones are in flight
            handles.append(await writer.submit("s", f"e{i}".encode()))
            await trio.sleep(0)
        for handle in handles:
            await handle.wait()
        stats = segment_of(gw, "s").stats()
        assert stats["appended_events"] == 40
        assert stats["appends"] < 20  # blocks of several events, not one each
        assert stored(segment_of(gw, "s")) == [f"e{i}".encode() for i in range(40)]


async def test_a_missing_segment_fails_its_appends_only(tmp_path: Path) -> None:
    async with gateway(tmp_path, auto_create=False) as gw:
        assert gw.store is not None
        gw.store.segment("there")
        async with SegmentWriter.connect(address(gw)) as writer:
            with pytest.raises(NoSuchSegmentError) as refused:
                await writer.append("missing", b"x")
            assert refused.value.segment == "missing"
            assert (await writer.append("there", b"y")).event_number == 1
            assert writer.connections == 1


async def test_writing_over_unix_sockets_and_tls(tmp_path: Path) -> None:
    certs = init_dir(tmp_path / "certs")
    sock = tmp_path / "seg.sock"
    tls = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    async with (
        gateway(tmp_path, bind=f"unix:{sock}") as gw,
        SegmentWriter.connect(address(gw)) as writer,
    ):
        assert (await writer.append("u", b"over unix")).event_number == 1
    async with gateway(tmp_path, tls=tls) as gw:
        context = ssl.create_default_context(cafile=str(certs["ca_cert"]))
        async with SegmentWriter.connect(
            address(gw), ssl_context=context, server_hostname="localhost"
        ) as writer:
            assert (await writer.append("t", b"over tls")).event_number == 1
        async with SegmentReader.connect(
            address(gw), ssl_context=context, server_hostname="localhost"
        ) as reader:
            assert [p async for _, p in reader.read("t", follow=False)] == [b"over tls"]


# -- a connection cut mid-stream -------------------------------------------------------------


class CuttingProxy:
    """Forwards to ``target``; the first connection is cut once ``cut_after`` bytes
    went to the server, and it passes no reply after the first ``replies`` bytes,
    so the server stores blocks whose acks the client never sees."""

    def __init__(self, target: str, cut_after: int, replies: int) -> None:
        self.target = target
        self.cut_after = cut_after
        self.replies = replies
        self.connections = 0

    async def handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        cut = self.connections == 1
        host, _, port = self.target.rpartition(":")
        server = await trio.open_tcp_stream(host, int(port))
        async with client, server, trio.open_nursery() as nursery:

            async def upstream() -> None:
                sent = 0
                while data := await client.receive_some(65536):
                    if cut and sent + len(data) >= self.cut_after:
                        await server.send_all(data[: self.cut_after - sent])
                        nursery.cancel_scope.cancel()
                        return
                    sent += len(data)
                    await server.send_all(data)
                nursery.cancel_scope.cancel()

            async def downstream() -> None:
                passed = 0
                while data := await server.receive_some(65536):
                    if cut:
                        data = data[: max(self.replies - passed, 0)]
                        passed += len(data)
                    if data:
                        await client.send_all(data)
                nursery.cancel_scope.cancel()

            nursery.start_soon(upstream)
            nursery.start_soon(downstream)


@asynccontextmanager
async def proxy(
    target: str, cut_after: int, replies: int
) -> AsyncIterator[tuple[str, CuttingProxy]]:
    cutter = CuttingProxy(target, cut_after, replies)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), cutter.handle, 0
        )
        port = listeners[0].socket.getsockname()[1]
        yield f"127.0.0.1:{port}", cutter
        nursery.cancel_scope.cancel()


async def test_a_cut_connection_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    events = payloads(300)
    # Hello (16 bytes) and AppendSetup for "cut" (45) pass; every ack is withheld.
    async with (
        gateway(tmp_path) as gw,
        proxy(address(gw), cut_after=2000, replies=61) as (
            via,
            cutter,
        ),
    ):
        async with SegmentWriter.connect(via, backoff_initial=0.01) as writer:
            handles = []
            for i in range(0, len(events), 10):  # ten at a time: several blocks in flight
                for payload in events[i : i + 10]:
                    handles.append(await writer.submit("cut", payload))
                await trio.sleep(0.005)  # real time: the writer closes a block after 20 ms
            with trio.fail_after(10):
                numbers = [(await h.wait()).event_number for h in handles]
        assert numbers == list(range(1, 301))
        assert cutter.connections == 2
        segment = segment_of(gw, "cut")
        assert stored(segment) == events
        assert segment.stats()["appends"] > 1  # some blocks were stored before the cut


# -- scripted servers: what was stored and acked, exactly --------------------------------------


class Scripted:
    """One connection's server side, driven by the test with the codec's server."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.codec = ServerCodec()

    async def event(self) -> Any:
        while (event := self.codec.next_event()) is NEED_DATA:
            self.codec.receive_data(await self.stream.receive_some(65536))
        assert not isinstance(event, ConnectionClosed), "the client closed"
        return event

    async def send(self, command: Command) -> None:
        await self.stream.send_all(self.codec.send(command))

    async def accept(self, last: int = NULL_EVENT_NUMBER) -> SetupAppend:
        """Hello and one writer's setup, answered with ``last``."""
        assert await self.event() == Hello(17, 5)
        await self.send(Hello())
        setup = await self.event()
        assert isinstance(setup, SetupAppend)
        await self.send(AppendSetup(setup.request_id, setup.segment, setup.writer_id, last))
        return setup

    async def appends_until(self, last: int) -> list[Append]:
        appends = []
        while not appends or appends[-1].last_event_number < last:
            event = await self.event()
            assert isinstance(event, Append), event
            appends.append(event)
        return appends


@asynccontextmanager
async def scripted_server() -> AsyncIterator[tuple[str, trio.MemoryReceiveChannel[Scripted]]]:
    """An address, and each connection made to it as a :class:`Scripted` server."""
    send, receive = trio.open_memory_channel[Scripted](10)

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            await send.send(Scripted(stream))
            await trio.sleep_forever()  # until the test closes it (or the end)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, host="127.0.0.1"), handle, 0
        )
        yield f"127.0.0.1:{listeners[0].socket.getsockname()[1]}", receive
        nursery.cancel_scope.cancel()


def events_of(appends: Sequence[Append]) -> list[tuple[int, bytes]]:
    """``(event number, payload)`` of every event in ``appends``."""
    out = []
    for append in appends:
        first = append.last_event_number - append.event_count + 1
        out.extend(enumerate(split_events(append.data), start=first))
    return out


async def test_a_reconnect_resends_exactly_what_the_server_did_not_store() -> None:
    async with (
        scripted_server() as (where, connections),
        SegmentWriter.connect(where, backoff_initial=0.01) as writer,
    ):
        handles = [await writer.submit("s", p) for p in payloads(5)]
        first = await connections.receive()
        writer_id = (await first.accept()).writer_id
        assert events_of(await first.appends_until(5)) == list(enumerate(payloads(5), 1))
        await first.send(DataAppended(writer_id, 2, NULL_EVENT_NUMBER, 1, 40))
        with trio.fail_after(5):
            assert (await handles[1].wait()).event_number == 2
        await first.stream.aclose()  # lost: #3 was stored, its ack never sent
        second = await connections.receive()
        assert (await second.accept(last=3)).writer_id == writer_id
        resent = await second.appends_until(5)
        assert events_of(resent) == [(4, b"event-00003"), (5, b"event-00004")]
        await second.send(DataAppended(writer_id, 5, 3, 1, 100))
        with trio.fail_after(5):
            acks = [await h.wait() for h in handles]
        assert [a.event_number for a in acks] == [1, 2, 3, 4, 5]
        # #3 was acked by the AppendSetup (no offset), #4..#5 by DataAppended.
        assert [a.segment_write_offset for a in acks] == [40, 40, -1, 100, 100]
        assert writer.connections == 2


async def test_the_window_bounds_events_in_flight() -> None:
    async with (
        scripted_server() as (where, connections),
        SegmentWriter.connect(where, max_inflight=3) as writer,
    ):
        handles = [await writer.submit("s", p) for p in payloads(3)]
        server = await connections.receive()
        setup = await server.accept()
        await server.appends_until(3)
        with trio.move_on_after(0.2) as blocked:
            await writer.submit("s", b"fourth")
        assert blocked.cancelled_caught  # three unacked: the fourth waits
        await server.send(DataAppended(setup.writer_id, 1, NULL_EVENT_NUMBER, 1, 20))
        with trio.fail_after(5):
            fourth = await writer.submit("s", b"fourth")
        assert (await handles[0].wait()).event_number == 1
        await server.appends_until(4)
        await server.send(DataAppended(setup.writer_id, 4, 1, 1, 80))
        with trio.fail_after(5):
            assert (await fourth.wait()).event_number == 4


# -- one session on trio's clock ---------------------------------------------------------------


async def test_a_block_left_open_is_closed_after_20ms(autojump_clock: Any) -> None:
    client, server_stream = trio.testing.memory_stream_pair()
    server = Scripted(server_stream)
    acked: list[Any] = []
    appender = Appender(lambda _s, _w, tokens, _o: acked.extend(t for t, _ in tokens))
    appender.add("s", [b"1" * 100], ["one"])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_appender, client, appender)
        await server.accept()
        started = trio.current_time()
        (first,) = await server.appends_until(1)
        assert trio.current_time() == started  # nothing in flight: sent at once, unbatched
        # 100 bytes in flight: #2 streams into a batched block of that size, which waits
        # for more events until its timer closes it.
        appender.add("s", [b"two"], ["two"])
        opened = trio.current_time()
        with trio.fail_after(1):
            (second,) = await server.appends_until(2)
        assert trio.current_time() - opened == pytest.approx(0.02)
        assert events_of([second]) == [(2, b"two")]
        await server.send(DataAppended(first.writer_id, 2, NULL_EVENT_NUMBER, 1, 119))
        await trio.testing.wait_all_tasks_blocked()
        assert acked == ["one", "two"]
        nursery.cancel_scope.cancel()


async def test_an_idle_connection_sends_keepalives_and_fails_without_answers(
    autojump_clock: Any,
) -> None:
    client, server_stream = trio.testing.memory_stream_pair()
    server = Scripted(server_stream)
    appender = Appender(lambda *_: None)
    settings = WriterSettings(keepalive_initial=20.0, keepalive_interval=10.0, timeout=30.0)
    async with trio.open_nursery() as nursery:
        ended = trio.Event()
        failure: list[BaseException] = []

        async def run() -> None:
            try:
                await run_appender(client, appender, settings)
            except BaseException as e:  # what ended the session is the point
                failure.append(e)
            ended.set()

        nursery.start_soon(run)
        assert await server.event() == Hello(17, 5)
        await server.send(Hello())
        began = trio.current_time()
        with trio.fail_after(21):
            assert await server.event() == KeepAlive()
        assert trio.current_time() - began == pytest.approx(20.0)
        await trio.sleep(1.0)
        await server.send(KeepAlive())  # answered: the next one only after 10 s of silence
        with trio.fail_after(20):
            assert await server.event() == KeepAlive()
        assert trio.current_time() - began == pytest.approx(40.0)
        with trio.fail_after(31):
            await ended.wait()  # never answered: the connection counts as lost
        assert trio.current_time() - began == pytest.approx(70.0)
        assert "no answer" in repr(failure[0])


# -- reading ----------------------------------------------------------------------------------


async def test_a_reader_follows_the_tail(tmp_path: Path) -> None:
    async with (
        gateway(tmp_path, read_wait="100ms") as gw,
        SegmentWriter.connect(address(gw)) as writer,
        SegmentReader.connect(address(gw)) as reader,
    ):
        await writer.append("s", b"early")
        events = reader.read("s", 0)
        assert await events.__anext__() == (0, b"early")
        assert events.position == 13

        async def later() -> None:
            # Past a few empty replies at the tail. Real time: the store appends in a
            # worker thread, which the mock clock would not wait for.
            await trio.sleep(0.3)
            await writer.append_many("s", [b"late", b"later"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(later)
            with trio.fail_after(5):
                assert await events.__anext__() == (13, b"late")
                assert await events.__anext__() == (25, b"later")
        assert events.position == 38


async def test_a_reader_starts_anywhere_and_knows_refusals(tmp_path: Path) -> None:
    async with gateway(tmp_path) as gw, SegmentReader.connect(address(gw)) as reader:
        with pytest.raises(NoSuchSegmentError):
            [e async for e in reader.read("nowhere", follow=False)]
        async with SegmentWriter.connect(address(gw)) as writer:
            await writer.append_many("s", payloads(3))
        assert [o async for o, _ in reader.read("s", 19, follow=False)] == [19, 38]
        segment_of(gw, "s").truncate_before(2)
        with pytest.raises(SegmentTruncatedError) as truncated:
            [e async for e in reader.read("s", 0, follow=False)]
        assert truncated.value.start_offset == 38


async def test_a_reader_puts_replies_cut_anywhere_back_together() -> None:
    client, server_stream = trio.testing.memory_stream_pair()
    server = Scripted(server_stream)
    data = b"".join(event_frame(p) for p in payloads(4))  # 4 events of 19 bytes
    events = SegmentReader(client).read("s", 0, follow=False, suggested_length=1000)
    requested: list[int] = []

    async def serve() -> None:
        """Each request answered by two replies (cut inside events), the second as an
        old server would send it (request id -1); later requests overlap earlier replies."""
        assert await server.event() == Hello(17, 5)
        while True:
            request = await server.event()
            assert isinstance(request, ReadSegment)
            requested.append(request.offset)
            start = request.offset
            rids = [request.request_id, -1]
            for stop in [c for c in (5, 30, 50, 70) if c > start][:2] or [len(data)]:
                stop = min(stop, len(data))
                tail = stop == len(data)
                await server.send(
                    SegmentRead("s", start, tail, False, data[start:stop], rids.pop(0))
                )
                start = stop

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        got = [e async for e in events]
        nursery.cancel_scope.cancel()
    assert got == [(19 * i, p) for i, p in enumerate(payloads(4))]
    assert events.at_tail
    assert events.position == len(data)
    assert requested == sorted(set(requested))  # each request goes on from the data so far
    assert len(requested) > 1
