"""The blocking segment client (no trio): segment info, partitions, locating event
boundaries, reading exactly a byte range, and writers with caller-chosen event numbers.

Against a real gateway running in a thread of its own (the client blocks, as a
Spark executor does), with data written by the trio ``SegmentWriter`` and by the
hub (stored as envelopes); a few scripted servers on plain sockets cover what a
gateway never does (an old server, a silent one).
"""

from __future__ import annotations

import itertools
import pickle
import re
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import trio
from pipeline.conftest import GatewayThread

from gateway.config.certs import init_dir
from gateway.core.model import Message, Outcome, Source
from gateway.durable import envelope
from gateway.runtime.gateway import Gateway
from gateway.store import Segment, split_events
from protocols.segment import (
    NULL_EVENT_NUMBER,
    AppendSetup,
    Hello,
    ServerCodec,
    SetupAppend,
    encode,
)
from protocols.segment.blocking import (
    SegmentClient,
    SegmentClientError,
    StoredEvent,
    TlsFiles,
)
from protocols.segment.client import SegmentWriter
from protocols.segment.errors import NoSuchSegmentError, SegmentError, SegmentTruncatedError

W = UUID("6f1d9a52-3c1e-4b8e-9d2a-0c5b7e1f4a10")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return init_dir(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def gw(tmp_path: Path, certs: dict[str, Path]) -> Iterator[GatewayThread]:
    """A gateway in a thread: segment listeners (plain and TLS) and the durable
    destinations ``logs`` (one partition) and ``parts`` (three, keyed by ``key``)."""
    tls = {"cert": str(certs["server_cert"]), "key": str(certs["server_key"])}
    config = {
        "gateway": {"data_dir": str(tmp_path / "data"), "drain_timeout": "100ms"},
        "listeners": [
            {"name": "segment", "protocol": "segment", "bind": "127.0.0.1:0"},
            {"name": "segtls", "protocol": "segment", "bind": "127.0.0.1:0", "tls": tls},
            {"name": "small", "protocol": "segment", "bind": "127.0.0.1:0", "max_read_bytes": 1000},
        ],
        "destinations": [
            {"name": "logs", "store": "embedded"},
            {"name": "parts", "store": "embedded", "partitions": 3, "partition_key": "key"},
        ],
    }
    thread = GatewayThread(config).start()
    try:
        yield thread
    finally:
        thread.stop()


def segment(gw: GatewayThread, name: str) -> Segment:
    store = gw.gateway.store
    assert store is not None
    found = store.segment(name, create=False)
    assert found is not None
    return found


def write_raw(gw: GatewayThread, name: str, payloads: list[bytes]) -> None:
    """Append with the trio client, from this thread."""

    async def write() -> None:
        async with SegmentWriter.connect(gw.address("segment")) as writer:
            await writer.append_many(name, payloads)

    trio.run(write)


def publish(gw: GatewayThread, messages: list[Message]) -> None:
    """Publish through the hub (stored as envelopes), in the gateway's thread."""

    async def run(gateway: Gateway) -> None:
        receipt = await gateway.hub.publish(messages)
        assert await receipt.wait() == Outcome.DELIVERED

    gw.run(run)


def client(gw: GatewayThread, **options: Any) -> SegmentClient:
    return SegmentClient(gw.address("segment"), **options)


SOURCE = Source("test", "here", "127.0.0.1:9")


def mixed(gw: GatewayThread) -> tuple[list[bytes], list[Message]]:
    """``logs/0`` holding raw events, then messages, then raw events again."""
    raw = [f"raw-{i}".encode() for i in range(5)]
    messages = [
        Message("logs", b"msg-%d" % i, {"n": str(i)}, "text/plain", SOURCE) for i in range(4)
    ]
    write_raw(gw, "logs/0", raw[:3])
    publish(gw, messages)
    write_raw(gw, "logs/0", raw[3:])
    return raw, messages


# -- importing ---------------------------------------------------------------------------------


def test_importing_the_client_imports_no_trio_and_no_runtime() -> None:
    code = (
        "import sys, protocols.segment.blocking\n"
        "bad = [m for m in sys.modules if m.partition('.')[0] == 'trio'"
        " or m.startswith('gateway.runtime')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])


# -- info, partitions, locate ------------------------------------------------------------------


def test_info_of_a_segment_and_of_a_missing_one(gw: GatewayThread) -> None:
    mixed(gw)
    stored = segment(gw, "logs/0")
    with client(gw) as c:
        info = c.info("logs/0")
        assert (info.segment, info.exists, info.sealed) == ("logs/0", True, False)
        assert (info.start, info.end) == (0, stored.durable_end)
        assert (info.first_event, info.next_event) == (0, 9)
        assert info.last_modified_ms > 0
        missing = c.info("nowhere")
        assert (missing.exists, missing.start, missing.end) == (False, 0, 0)
        assert gw.gateway.store is not None
        assert gw.gateway.store.segment("nowhere", create=False) is None  # not created


def test_partitions_of_a_destination(gw: GatewayThread) -> None:
    publish(gw, [Message("parts", b"p%d" % i, {"key": f"k{i}"}) for i in range(30)])
    with client(gw) as c:
        parts = c.partitions("parts")
        assert [p.segment for p in parts] == ["parts/0", "parts/1", "parts/2"]
        assert sum(p.next_event - p.first_event for p in parts) == 30
        assert [p.end for p in parts] == [segment(gw, p.segment).durable_end for p in parts]
        assert [p.segment for p in c.partitions("logs")] == ["logs/0"]
        assert c.partitions("nothing") == []


def test_locate_finds_event_boundaries_from_the_index(gw: GatewayThread) -> None:
    payloads = [b"x" * n for n in range(1, 40)]  # frames of 9..47 bytes
    write_raw(gw, "plain", payloads)
    offsets = [0]
    for p in payloads:
        offsets.append(offsets[-1] + 8 + len(p))
    with client(gw) as c:
        for k in (0, 1, 7, 38):
            assert c.locate("plain", offsets[k]) == (offsets[k], k)
            assert c.locate("plain", offsets[k] + 3) == (offsets[k], k)
            assert c.locate("plain", offsets[k], events=5) == (
                offsets[min(k + 5, 39)],
                min(k + 5, 39),
            )
        assert c.locate("plain", 10**9) == (offsets[-1], 39)  # clamped to the end
        assert c.locate("plain", 0, events=1000) == (offsets[-1], 39)
        with pytest.raises(NoSuchSegmentError):
            c.locate("nowhere", 0)
        assert c.info("plain").next_event == 39  # the connection goes on


# -- reading -----------------------------------------------------------------------------------


def test_read_tells_raw_events_from_envelopes(gw: GatewayThread) -> None:
    raw, messages = mixed(gw)
    with client(gw) as c:
        info = c.info("logs/0")
        events = list(c.read("logs/0", info.start, info.end))
    assert [e.format for e in events] == [0, 0, 0, 1, 1, 1, 1, 0, 0]
    assert [e.payload for e in events if e.format == 0] == raw
    decoded = [envelope.decode(e.payload, "logs") for e in events if e.format == 1]
    assert [(m.body, dict(m.headers), m.content_type) for m in decoded] == [
        (m.body, dict(m.headers), m.content_type) for m in messages
    ]
    assert [m.source.protocol for m in decoded if m.source] == ["test"] * 4
    stored = split_events(segment(gw, "logs/0").read(0, info.end))
    assert [e.payload for e in events] == stored
    assert events[0].offset == 0
    assert all(a.offset + 8 + len(a.payload) == b.offset for a, b in itertools.pairwise(events))


def test_read_gives_exactly_the_events_of_a_range_across_replies(gw: GatewayThread) -> None:
    # 2500 events of 1..1200 bytes: replies (1 MiB at most) and chunks cut inside them.
    payloads = [bytes([i % 251]) * (1 + (i * 7919) % 1200) for i in range(2500)]
    write_raw(gw, "big", payloads)
    offsets = [0]
    for p in payloads:
        offsets.append(offsets[-1] + 8 + len(p))
    with client(gw) as c:
        for a, b, chunk in [(0, 2500, 4 << 20), (17, 2400, 100_000), (1000, 1001, 1), (5, 5, 64)]:
            got = list(c.read("big", offsets[a], offsets[b], chunk=chunk))
            assert [e.payload for e in got] == payloads[a:b]
            assert [e.offset for e in got] == offsets[a:b]
        with pytest.raises(SegmentClientError, match="no whole event at offset"):
            list(c.read("big", offsets[3] + 5, offsets[9]))  # not an event boundary
        with pytest.raises(SegmentClientError, match="no whole event at offset"):
            list(c.read("big", offsets[3], offsets[9] - 5))
        chunks = list(c.read_chunks("big", offsets[10], offsets[2000], chunk=300_000))
    assert len(chunks) > 3
    assert b"".join(data for _, data, _ in chunks) == segment(gw, "big").read(
        offsets[10], offsets[2000] - offsets[10]
    )
    for (offset, data, formats), following in itertools.pairwise(chunks):
        assert offset + len(data) == following[0]
        assert offset in offsets  # every chunk starts and ends on a boundary
        assert formats == [(offset, 0)]


def test_reads_go_on_where_a_server_answers_less_than_asked(gw: GatewayThread) -> None:
    payloads = [bytes([65 + i % 26]) * (1 + (i * 31) % 700) for i in range(600)]
    write_raw(gw, "cut", payloads)
    with SegmentClient(gw.address("small")) as c:  # at most 1000 bytes a reply
        info = c.info("cut")
        assert [e.payload for e in c.read("cut", 0, info.end, chunk=5000)] == payloads
        start = c.locate("cut", info.end // 3)[0]
        chunks = list(c.read_chunks("cut", start, info.end))
        assert b"".join(data for _, data, _ in chunks) == segment(gw, "cut").read(
            start, info.end - start
        )


def test_read_chunks_report_where_the_format_changes(gw: GatewayThread) -> None:
    mixed(gw)
    with client(gw) as c:
        info = c.info("logs/0")
        ((offset, data, formats),) = c.read_chunks("logs/0", 0, info.end)
        events = list(c.read("logs/0", 0, info.end))
    assert (offset, len(data)) == (0, info.end)
    assert formats == [(0, 0), (events[3].offset, 1), (events[7].offset, 0)]


def test_reading_below_the_start_or_past_the_end(gw: GatewayThread) -> None:
    write_raw(gw, "short", [b"first", b"second", b"third"])

    async def truncate(gateway: Gateway) -> None:
        segment(gw, "short").truncate_before(1)

    gw.run(truncate)
    with client(gw, timeout=5) as c:
        info = c.info("short")
        assert (info.start, info.first_event, info.end) == (13, 1, 13 + 14 + 13)
        with pytest.raises(SegmentTruncatedError) as truncated:
            list(c.read("short", 0, info.end))
        assert truncated.value.start_offset == 13
        assert [e.payload for e in c.read("short", 13, info.end)] == [b"second", b"third"]
        with pytest.raises(SegmentClientError, match="ends at 40"):
            list(c.read("short", 13, info.end + 100))  # at once, not after the read wait
        with pytest.raises(NoSuchSegmentError):
            list(c.read("nowhere", 0, 10))
        with pytest.raises(ValueError):
            list(c.read("short", 20, 13))


def test_a_read_given_up_leaves_the_client_usable(gw: GatewayThread) -> None:
    payloads = [b"e" * 1000] * 5000
    write_raw(gw, "long", payloads)
    with client(gw) as c:
        end = c.info("long").end
        events = c.read("long", 0, end, chunk=64 << 10)
        assert next(events) == StoredEvent(0, 0, b"e" * 1000)
        del events  # closed with replies still on their way
        assert c.locate("long", 5000) == (4032, 4)
        assert sum(1 for _ in c.read("long", 0, end)) == 5000


# -- connecting --------------------------------------------------------------------------------


def test_tls_pickling_and_failover(gw: GatewayThread, certs: dict[str, Path]) -> None:
    write_raw(gw, "t", [b"over tls"])
    tls = gw.address("segtls")
    files = TlsFiles(ca_file=str(certs["ca_cert"]))
    with SegmentClient(tls, ssl_context=files, server_hostname="localhost") as c:
        assert c.info("t").next_event == 1
        copy = pickle.loads(pickle.dumps(c))  # a used client: its connection stays here
    assert [e.payload for e in copy.read("t", 0, copy.info("t").end)] == [b"over tls"]
    copy.close()
    context = ssl.create_default_context(cafile=str(certs["ca_cert"]))
    with SegmentClient(tls, ssl_context=context, server_hostname="localhost") as c:
        assert c.info("t").exists
        with pytest.raises(TypeError, match="TlsFiles"):
            pickle.dumps(c)
    with SegmentClient(tls, timeout=5) as plain, pytest.raises((OSError, SegmentClientError)):
        plain.info("t")  # no TLS to a TLS listener
    with SegmentClient(f"127.0.0.1:1, {gw.address('segment')}", timeout=5) as c:
        assert c.info("t").exists  # the first address refuses: the second one answers


def test_a_silent_server_times_out() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:  # never accepts, never answers
        host, port = server.getsockname()[:2]
        with SegmentClient(f"{host}:{port}", timeout=0.3) as c, pytest.raises(TimeoutError):
            c.info("s")


# -- writing -----------------------------------------------------------------------------------


def test_the_same_numbers_twice_are_stored_once(gw: GatewayThread) -> None:
    with client(gw) as c:
        writer = c.writer("w", W)
        assert writer.last_event_number is None
        assert writer.append([b"a", b"b", b"c"], 1) == 3
        assert writer.last_event_number == 3
        assert writer.append([b"a", b"b", b"c"], 1) == 0  # a retried task
        assert writer.append([b"c", b"d"], 3) == 1  # overlapping: only d is new
        assert writer.append([b"e"], 100) == 1  # numbers may jump
        writer.close()
        again = c.writer("w", W)  # a second writer object with the same id resumes
        assert again.last_event_number == 100
        assert again.append([b"e", b"f"], 100) == 1
        again.close()
        stored = [e.payload for e in c.read("w", 0, c.info("w").end)]
        assert stored == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert segment(gw, "w").last_event_number(W) == 101


def test_large_appends_go_in_blocks_several_in_flight(gw: GatewayThread) -> None:
    payloads = [bytes([i % 256]) * 3000 for i in range(2000)] + [b"L" * (3 << 20)]
    with client(gw) as c, c.writer("blocks", W) as writer:
        writer.block_bytes = 64 << 10
        assert writer.append(payloads, 1 << 32) == 2001
        assert writer.last_event_number == (1 << 32) + 2000
    stored = segment(gw, "blocks")
    assert split_events(stored.read(0, stored.durable_end)) == payloads
    assert stored.stats()["appends"] > 10


def test_concurrent_writers_with_one_id_store_each_event_once(gw: GatewayThread) -> None:
    payloads = [b"event-%05d" % i for i in range(20000)]
    results: list[int] = []
    errors: list[BaseException] = []

    def attempt() -> None:
        try:
            with client(gw) as c, c.writer("race", W) as writer:
                writer.block_bytes = 4096
                for start in range(0, len(payloads), 2500):
                    results.append(writer.append(payloads[start : start + 2500], start + 1))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    # Each event is counted by the attempt that stored it (or by both, when the
    # server closed on one before its ack went out).
    assert sum(results) >= 20000
    stored = segment(gw, "race")
    assert split_events(stored.read(0, stored.durable_end)) == payloads


def test_envelope_writers_make_messages(gw: GatewayThread) -> None:
    messages = [
        Message("logs", b"body-%d" % i, {"h": str(i)}, "application/json") for i in range(3)
    ]
    source = Source("spark", "sink-1")
    payloads = envelope.encode_many([m._replace(source=source) for m in messages])

    async def subscribe(gateway: Gateway) -> list[Message]:
        sub = gateway.hub.subscribe("logs", "readers", start="earliest")
        got: list[Message] = []
        with trio.fail_after(10):
            while len(got) < 3:
                got += [d.message for d in await sub.receive()]
        return got

    with client(gw) as c, c.writer("logs/0", W, envelope=True) as writer:
        assert writer.append(payloads, 1) == 3
        events = list(c.read("logs/0", 0, c.info("logs/0").end))
    assert [e.format for e in events] == [1, 1, 1]
    got = gw.run(subscribe)
    assert [(m.body, dict(m.headers), m.content_type) for m in got] == [
        (m.body, dict(m.headers), m.content_type) for m in messages
    ]
    assert {(m.source.protocol, m.source.listener) for m in got if m.source} == {
        ("spark", "sink-1")
    }


def test_a_bad_envelope_is_refused_and_nothing_of_its_block_stored(gw: GatewayThread) -> None:
    good = envelope.encode_many([Message("logs", b"ok")])[0]
    with client(gw) as c, c.writer("logs/0", W, envelope=True) as writer:
        with pytest.raises(SegmentError, match="event 1 of the block"):
            writer.append([good, b"not an envelope"], 1)
        assert c.info("logs/0").end == 0


class CuttingProxy:
    """Forwards to ``target``. Its first connection passes only the server's first
    ``replies`` bytes (so blocks are stored whose acks never arrive) and is cut once
    ``cut_after`` bytes went to the server; later connections pass everything."""

    def __init__(self, target: str, cut_after: int, replies: int) -> None:
        self.target = target
        self.cut_after = cut_after
        self.replies = replies
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        host, port = self.sock.getsockname()[:2]
        self.address = f"{host}:{port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            first = self.connections == 1
            host, _, port = self.target.rpartition(":")
            server = socket.create_connection((host, int(port)))
            up = (client, server, self.cut_after if first else None, None)
            down = (server, client, None, self.replies if first else None)
            for args in (up, down):
                threading.Thread(target=self._pump, args=args, daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, cut: int | None, keep: int | None) -> None:
        passed = 0
        try:
            while data := src.recv(65536):
                if keep is not None:
                    data = data[: max(keep - passed, 0)]
                dst.sendall(data)
                passed += len(data)
                if cut is not None and passed >= cut:
                    break
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


def test_a_writer_goes_on_after_a_lost_connection_without_duplicates(gw: GatewayThread) -> None:
    payloads = [b"%04d" % i + b"." * 996 for i in range(1000)]
    # The server's Hello and AppendSetup pass, no ack does.
    replies = len(encode(Hello())) + len(encode(AppendSetup(1, "cut", W, NULL_EVENT_NUMBER)))
    proxy = CuttingProxy(gw.address("segment"), cut_after=300_000, replies=replies)
    try:
        with SegmentClient(proxy.address, timeout=10) as c, c.writer("cut", W) as writer:
            writer.block_bytes = 64 << 10
            assert writer.append(payloads, 1) == 1000  # those stored unacked count too
            assert writer.last_event_number == 1000
    finally:
        proxy.close()
    assert proxy.connections == 2
    stored = segment(gw, "cut")
    assert split_events(stored.read(0, stored.durable_end)) == payloads


class OldServer:
    """A segment server of before payload formats: its AppendSetup has no such field."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        host, port = self.sock.getsockname()[:2]
        self.address = f"{host}:{port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        codec = ServerCodec()
        with conn:
            while data := conn.recv(65536):
                codec.receive_data(data)
                while isinstance(event := codec.next_event(), Hello | SetupAppend):
                    if isinstance(event, Hello):
                        conn.sendall(codec.send(Hello()))
                    else:
                        reply = AppendSetup(event.request_id, event.segment, event.writer_id, 0)
                        conn.sendall(codec.send(reply))


def test_an_envelope_writer_refuses_a_server_too_old_for_it() -> None:
    server = OldServer()
    with (
        SegmentClient(server.address, timeout=5) as c,
        pytest.raises(SegmentClientError, match="too old"),
    ):
        c.writer("s", W, envelope=True)


# -- the documented example ------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocols" / "segment-append.md"


def test_the_documented_example_prints_what_the_doc_says(gw: GatewayThread, tmp_path: Path) -> None:
    section = DOC.read_text(encoding="utf-8").split("\n## Clients\n", 1)[1].split("\n## ", 1)[0]
    ((script, printed),) = re.findall(r"```python\n(.*?)```.*?```text\n(.*?)```", section, re.S)
    path = tmp_path / "example.py"
    path.write_text(script.replace("127.0.0.1:12345", gw.address("segment")), encoding="utf-8")
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, timeout=60, cwd=root
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == printed
