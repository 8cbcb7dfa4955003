"""A gateway whose store's disk fills up lives through it (docs/store.md, "A full disk").

The gateway runs as a process with its data directory on a 4 MiB tmpfs that
the test mounts (it must run as root, as ``.ci/run`` does). A durable queue
``logs`` takes 1000 ndjson publishes, then a file fills the rest of the disk:

- a consumer still reads and acks (its positions wait in memory);
- new publishes, over ndjson, Lumberjack and ttrpc, are held: never acked, never
  answered with an error, their connections never closed;
- ``/readyz`` answers 503 with the reason, the status has the hint and the
  metrics ``interchange_store_disk_full 1``; one ERROR line says so, with no
  traceback anywhere in the log;
- stopping and starting again on the full disk work;
- once the file is removed, everything resumes by itself: the held publishes
  are acked and the consumer's positions are saved.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver

from gateway.store import Store
from protocols.lumberjack.client import ClientSettings, LumberjackClient
from protocols.segment.client import SegmentWriter
from protocols.ttrpc import messaging_pb2 as pb
from protocols.ttrpc.client import open_client
from protocols.ttrpc.messaging import SERVICE

pytestmark = pytest.mark.slow

DISK = "4m"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs mounted for the test (the real file system path: no I/O seam)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(
            "this test mounts a 4 MiB tmpfs and needs root for it (.ci/run runs as root):"
            f" mount said {done.stderr.strip()!r}"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> int:
    """Write a file until the disk is full; the bytes written."""
    written = 0
    with contextlib.suppress(OSError), open(disk / "fill", "wb", buffering=0) as f:
        while True:
            written += f.write(b"\0" * 65536)
    return written


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def fetch(url: str) -> tuple[int, str]:
    return await trio.to_thread.run_sync(get, url)


async def until_not_ready(admin: str, limit: float = 10) -> tuple[int, str]:
    """Poll ``/readyz`` until it answers 503; that answer."""
    with trio.fail_after(limit):
        while True:
            status, body = await fetch(admin + "/readyz")
            if status == 503:
                return status, body
            await trio.sleep(0.05)


def event(n: int) -> bytes:
    """A segment event of 1 KiB: a batch of them needs new pages of the disk (a write
    into a page the file has already is not refused by a full disk)."""
    return b"e%d-" % n + b"x" * 1000


def config(disk: Path, faults: ModuleType) -> dict[str, Any]:
    ports = {k: faults.free_port() for k in ("ndjson", "lumberjack", "ttrpc", "admin", "metrics")}
    return {
        "gateway": {"data_dir": str(disk), "drain_timeout": "1s"},
        "admin": {"bind": f"127.0.0.1:{ports['admin']}"},
        "metrics": {"bind": f"127.0.0.1:{ports['metrics']}"},
        "listeners": [
            {
                "name": "nd",
                "protocol": "ndjson",
                "bind": f"127.0.0.1:{ports['ndjson']}",
                "destination": "logs",
            },
            {
                "name": "lj",
                "protocol": "lumberjack",
                "bind": f"127.0.0.1:{ports['lumberjack']}",
                "destination": "logs",
            },
            {"name": "tt", "protocol": "ttrpc", "bind": f"127.0.0.1:{ports['ttrpc']}"},
        ],
        "destinations": [{"name": "logs", "kind": "queue", "store": "embedded"}],
    }


async def consume(port: int, count: int) -> list[int]:
    """Receive and ack ``count`` messages of ``logs``; their numbers."""
    got = []
    async with await NdjsonClient.connect("127.0.0.1", port) as client:
        await client.subscribe("logs", window=count)
        while len(got) < count:
            delivery = await client.receive()
            assert isinstance(delivery, Deliver)
            got.append(json.loads(delivery.body)["n"])
            await client.ack(delivery.tag)
        # An ndjson ack has no answer: a round trip through the gateway says it was read.
        await client.publish(b'{"n":-1}', "flush")
    return got


async def test_a_full_disk_holds_publishers_and_everything_resumes(
    small_disk: Path,
    tmp_path: Path,
    faults: ModuleType,
    gateway_process: Any,
    nursery: trio.Nursery,
) -> None:
    settings = config(small_disk, faults)
    ports = {ls["name"]: int(ls["bind"].rsplit(":", 1)[1]) for ls in settings["listeners"]}
    admin = "http://" + settings["admin"]["bind"]
    metrics = "http://" + settings["metrics"]["bind"] + "/metrics"
    path = tmp_path / "gateway.toml"
    path.write_text(faults.toml_config(settings))
    gw = gateway_process(path)
    await gw.start()

    async with await NdjsonClient.connect("127.0.0.1", ports["nd"]) as client:
        ids = await client.publish_nowait([b'{"n":%d}' % n for n in range(1000)])
        answers = await client.wait_answers(ids)
    assert {a.status for a in answers} == {"delivered"}
    assert fill(small_disk) > 0

    # Readers and consumers go on; their acks wait in memory.
    with trio.fail_after(30):
        assert await consume(ports["nd"], 10) == list(range(10))
    # The acks' positions are saved at the next group commit, which finds no room.
    status, body = await until_not_ready(admin)
    assert "the store's disk is full" in json.loads(body)["reasons"][0]

    # Publishers are held: not acked, not refused, not disconnected.
    held = await NdjsonClient.connect("127.0.0.1", ports["nd"])
    held_ids = await held.publish_nowait([b'{"n":1000}'])
    lumberjack = await LumberjackClient.connect(
        "127.0.0.1", ports["lj"], settings=ClientSettings(timeout=60)
    )
    lumberjack_acked = trio.Event()

    async def send_window() -> None:
        await lumberjack.send([{"n": 1001}])
        lumberjack_acked.set()

    nursery.start_soon(send_window)
    ttrpc_answer: list[Any] = []

    async def publish_over_ttrpc() -> None:
        stream = await trio.open_tcp_stream("127.0.0.1", ports["tt"])
        async with open_client(stream) as client:
            request = pb.PublishRequest(
                messages=[pb.Message(destination="logs", body=b'{"n":1002}')]
            )
            answer = await client.call(SERVICE, "Publish", request.SerializeToString())
            ttrpc_answer.append(pb.PublishResponse.FromString(answer))

    nursery.start_soon(publish_over_ttrpc)
    with trio.move_on_after(3) as waited:
        await held.wait_answers(held_ids)
    assert waited.cancelled_caught, "a publish was answered while the disk was full"
    assert not lumberjack_acked.is_set()
    assert not ttrpc_answer

    _, body = await fetch(admin + "/api/status")
    snapshot = json.loads(body)
    assert snapshot["store"]["full"] is True
    assert any(h["subject"] == "store" and "is full" in h["text"] for h in snapshot["hints"])
    _, text = await fetch(metrics)
    assert "interchange_store_disk_full 1.0" in text

    # Space comes back: the held publishes are acked, by themselves.
    os.unlink(small_disk / "fill")
    with trio.fail_after(15):
        (answer,) = await held.wait_answers(held_ids)
        await lumberjack_acked.wait()
    assert answer.status == "delivered"
    with trio.fail_after(15):
        while not ttrpc_answer:
            await trio.sleep(0.05)
    assert [r.outcome for r in ttrpc_answer[0].results] == [pb.OUTCOME_DELIVERED]
    status, _ = await fetch(admin + "/readyz")
    assert status == 200
    await held.aclose()
    await lumberjack.aclose()

    # Stop and start on a full disk, then a consumer after the restart: the acks of
    # the first consumer were saved once there was room (none of 0..9 comes again).
    fill(small_disk)
    assert await gw.stop() == 0
    await gw.start()
    await until_not_ready(admin)
    with trio.fail_after(30):
        assert await consume(ports["nd"], 5) == list(range(10, 15))
    assert await gw.stop() == 0
    os.unlink(small_disk / "fill")
    await gw.start()
    with trio.fail_after(30):
        assert await consume(ports["nd"], 1) == [15]  # 10..14 were acked on the full disk
    assert await gw.stop() == 0

    log = list(gw.log)
    assert not [line for line in log if "Traceback" in line], "\n".join(log)
    full_errors = [line for line in log if " ERROR " in line and "disk is full" in line]
    assert 1 <= len(full_errors) <= 3, "\n".join(log)  # one per run that met the full disk
    assert not [line for line in log if " ERROR " in line and "disk is full" not in line], (
        "\n".join(log)
    )


async def test_a_segment_writer_is_held_on_a_full_disk_and_stays_exactly_once(
    small_disk: Path, tmp_path: Path, faults: ModuleType, gateway_process: Any
) -> None:
    port = faults.free_port()
    path = tmp_path / "gateway.toml"
    path.write_text(
        faults.toml_config(
            {
                "gateway": {"data_dir": str(small_disk), "drain_timeout": "1s"},
                "listeners": [{"name": "seg", "protocol": "segment", "bind": f"127.0.0.1:{port}"}],
            }
        )
    )
    gw = gateway_process(path)
    await gw.start()
    address = f"127.0.0.1:{port}"
    writer_id = uuid.UUID(int=7)
    async with SegmentWriter.connect(address, writer_id=writer_id) as writer:
        await writer.append_many("s/0", [event(n) for n in range(100)])
        fill(small_disk)
        appended = trio.Event()

        async def append_more() -> None:
            await writer.append_many("s/0", [event(n) for n in range(100, 200)])
            appended.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(append_more)
            # Real time (the gateway is another process): ample for an ack to come back
            # if the full disk were ignored; nothing can be waited for instead of an ack.
            await trio.sleep(3)
            assert not appended.is_set(), "an append was acked while the disk was full"
            os.unlink(small_disk / "fill")
            with trio.fail_after(15):
                await appended.wait()
    assert await gw.stop() == 0
    async with Store.open(small_disk / "store") as store:
        segment = store.segment("s/0", create=False)
        assert segment is not None
        events = segment.read_events(0, 1000, 1 << 20)
    assert [payload for _, payload in events] == [event(n) for n in range(200)]
    log = list(gw.log)
    assert not [line for line in log if "Traceback" in line or "connection failed" in line], (
        "\n".join(log)
    )
