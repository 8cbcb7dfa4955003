"""Peers cannot flood the log (docs/limits.md, "Logs").

Fifty segment-append connections each ask to append to a segment whose name is
65 535 bytes long, which the file system cannot take. Every connection gets its
protocol answer; the gateway's log (as ``gateway run`` sets it up) gets a few
short lines about it, not fifty lines of 131 KB each.
"""

from __future__ import annotations

import io
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from harness import host_port, running_gateway

from gateway.ops.loglines import MAX_MESSAGE
from gateway.ops.logsetup import setup_logging
from gateway.sdk import NEED_DATA, ConnectionClosed
from protocols.segment.codec import ClientCodec
from protocols.segment.events import Hello, SetupAppend

CONNECTIONS = 50


@pytest.fixture
def gateway_log() -> Iterator[io.StringIO]:
    """The gateway's own handler, writing to a buffer, for the test's length."""
    stream = io.StringIO()
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    setup_logging("info", "text", stream)
    try:
        yield stream
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


async def ask_for_a_long_name(address: str, name: str) -> list[object]:
    """Hello and SetupAppend for ``name``; the server's answers until it closes."""
    host, port = host_port(address)
    codec = ClientCodec()
    answers: list[object] = []
    async with await trio.open_tcp_stream(host, port) as stream:
        await stream.send_all(codec.send(Hello()) + codec.send(SetupAppend(1, uuid.uuid4(), name)))
        while len(answers) < 2 and (data := await stream.receive_some(65536)):
            codec.receive_data(data)
            while (event := codec.next_event()) is not NEED_DATA:
                answers.append(event)
                if isinstance(event, ConnectionClosed):
                    return answers
    return answers


async def test_long_peer_supplied_names_cannot_flood_the_log(
    tmp_path: Path, gateway_log: io.StringIO
) -> None:
    config = {
        "gateway": {"data_dir": str(tmp_path)},
        "listeners": [{"name": "seg", "protocol": "segment", "bind": "127.0.0.1:0"}],
    }
    name = "n" * 65535
    answers: list[list[object]] = []

    async def one() -> None:
        answers.append(await ask_for_a_long_name(gw.addresses["seg"][0], name))

    async with running_gateway(config) as gw:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                for _ in range(CONNECTIONS):
                    nursery.start_soon(one)
    # Each got its protocol answer (Hello, then the refusal of the segment).
    assert len(answers) == CONNECTIONS
    assert all(len(a) >= 2 for a in answers), answers[0]
    lines = gateway_log.getvalue().splitlines()
    about_it = [line for line in lines if "nnnnnnnnnn" in line]
    assert about_it, "the refusal is logged at least once"
    assert len(about_it) <= 5, "\n".join(line[:200] for line in about_it)
    assert max(len(line) for line in lines) < MAX_MESSAGE + 200
    assert len(gateway_log.getvalue()) < 40_000
