"""Keepalives never look like an ack of the window that is still waiting."""

from __future__ import annotations

import trio
from harness import host_port, running_gateway

from protocols.lumberjack import encode_window


async def read_frames(stream: trio.abc.Stream, seconds: float) -> list[bytes]:
    """Every 6-byte ack frame that arrives within ``seconds``."""
    data = b""
    with trio.move_on_after(seconds):
        while True:
            data += await stream.receive_some()
    assert len(data) % 6 == 0
    return [data[i : i + 6] for i in range(0, len(data), 6)]


async def test_keepalive_after_an_acked_window_carries_zero() -> None:
    listener = {
        "name": "beats",
        "protocol": "lumberjack",
        "bind": "127.0.0.1:0",
        "destination": "logs",
        "keepalive": "100ms",
    }
    async with running_gateway({"listeners": [listener]}) as gw:
        tap = gw.hub.subscribe("logs")
        client = await trio.open_tcp_stream(*host_port(gw.addresses["beats"][0]))
        window = encode_window(2, [b'{"n":1}', b'{"n":2}'])  # seq 1..2, as Beats numbers

        await client.send_all(window)
        first = await tap.receive()
        tap.ack_many(d.tag for d in first)
        assert (await read_frames(client, 0.3))[0] == b"2A\x00\x00\x00\x02"

        # The same numbering again: while it waits, only "A 0" may arrive.
        await client.send_all(window)
        second = await tap.receive()
        waiting = await read_frames(client, 0.5)
        assert len(waiting) >= 3
        assert set(waiting) == {b"2A\x00\x00\x00\x00"}
        tap.ack_many(d.tag for d in second)
        assert (await read_frames(client, 0.3))[-1] == b"2A\x00\x00\x00\x02"
