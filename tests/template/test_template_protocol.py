"""The protocol template runs: its plugin, registered like a third party's, serves a
gateway; its driver publishes each line and answers once the receipt settles; its
client codec talks to it over a real socket."""

from __future__ import annotations

from typing import Any

import trio
from harness import host_port, running_gateway
from toy_line import registered

from gateway.protocol.conformance import drain
from gateway.runtime.gateway import Gateway
from protocols._template import ClientCodec, ConnectionClosed, Error, Failed, Ok, Publish
from protocols._template.plugin import TemplatePlugin

TIMEOUT = 10.0


def config(**options: Any) -> dict[str, Any]:
    return {
        # Elements of 4 bytes: a line of another size is rejected by the destination.
        "destinations": [{"name": "frames", "element_size": 4, "retain": "64KiB"}],
        "listeners": [
            {
                "name": "lines",
                "protocol": "template",
                "bind": "127.0.0.1:0",
                "destination": "frames",
                **options,
            }
        ],
    }


async def exchange(gw: Gateway, codec: ClientCodec, data: bytes) -> list[Any]:
    """Send ``data``; the events ``codec`` makes of what comes back, until every publish
    it sent is answered or the gateway closes the connection."""
    events: list[Any] = []
    with trio.fail_after(TIMEOUT):
        stream = await trio.open_tcp_stream(*host_port(gw.addresses["lines"][0]))
        async with stream:
            await stream.send_all(data)
            while codec.unanswered or not events:
                codec.receive_data(await stream.receive_some(4096))
                for event in drain(codec):
                    if isinstance(event, ConnectionClosed):
                        return events
                    events.append(event)
    return events


async def test_each_line_is_published_and_answered_in_order_once_settled() -> None:
    async with running_gateway(config(), registry=registered(TemplatePlugin)) as gw:
        reader = gw.hub.subscribe("frames", "reader", start="earliest")
        client = ClientCodec()
        lines = b"".join(client.send(Publish(body)) for body in (b"abcd", b"toolong", b"efgh"))
        events = await exchange(gw, client, lines)
        assert events[0] == Ok()
        assert isinstance(events[1], Failed)
        assert "element" in events[1].reason  # the destination's reason, for the client
        assert events[2:] == [Ok()]
        stored: list[bytes] = []
        with trio.fail_after(TIMEOUT):
            while len(stored) < 2:
                stored += [delivery.message.body for delivery in await reader.receive()]
        assert stored == [b"abcd", b"efgh"]


async def test_a_line_the_codec_refuses_is_answered_err_then_closed() -> None:
    async with running_gateway(config(), registry=registered(TemplatePlugin)) as gw:
        events = await exchange(gw, ClientCodec(), b"GET / HTTP/1.1\n")
        assert len(events) == 1
        assert isinstance(events[0], Error)
        assert "unknown command" in events[0].message


async def test_max_line_is_a_listener_option() -> None:
    async with running_gateway(config(max_line=8), registry=registered(TemplatePlugin)) as gw:
        client = ClientCodec()
        events = await exchange(gw, client, client.send(Publish(b"x" * 20)))
        assert len(events) == 1
        assert isinstance(events[0], Error)
        assert "longer than 8 bytes" in events[0].message
