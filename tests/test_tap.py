"""Taps: passive views of the traffic that never hold an ack, credit or a publisher."""

from __future__ import annotations

import json

import pytest
import trio
from harness import receive_now

from gateway.core.filters import Filter
from gateway.core.hub import Hub
from gateway.core.model import Message, Outcome, Source
from gateway.core.routing import Route, Router
from gateway.ops.tap import Tap, TapEvent, render, tap_filter


def msg(n: int, destination: str = "logs", **headers: str) -> Message:
    return Message(destination, b'{"n":%d}' % n, headers)


async def test_a_tap_sees_what_is_stored_after_routing() -> None:
    hub = Hub(Router([Route("logs", ["archive", "logs"])]))
    archive = hub.tap("archive")
    everything = hub.tap("*")
    receipt = await hub.publish([msg(1), msg(2)])
    assert receipt.outcome is Outcome.DELIVERED  # no subscriber: discarded, never held
    seen = await archive.receive()
    assert [(e.destination, e.message.body) for e in seen] == [
        ("archive", b'{"n":1}'),
        ("archive", b'{"n":2}'),
    ]
    assert sorted(e.destination for e in await everything.receive()) == [
        "archive",
        "archive",
        "logs",
        "logs",
    ]


async def test_a_tap_filters_on_headers() -> None:
    hub = Hub()
    errors = hub.tap("logs", Filter.equals(level="error"))
    await hub.publish([msg(1, level="info"), msg(2, level="error")])
    assert [e.message.body for e in await errors.receive()] == [b'{"n":2}']
    assert errors.seen == 1


async def test_a_tap_never_slows_a_publisher_and_counts_its_drops() -> None:
    """A tap that reads nothing while 100 000 messages flow through a consumed queue."""
    hub = Hub()
    tap = hub.tap("jobs")
    sub = hub.subscribe("jobs", max_unacked=100_000)
    receipts = []
    with trio.fail_after(30):
        for start in range(0, 100_000, 1000):
            receipts.append(await hub.publish([msg(n, "jobs") for n in range(start, start + 1000)]))
            for d in await receive_now(sub):
                sub.ack(d.tag)
    assert all(r.outcome is Outcome.DELIVERED for r in receipts)
    assert tap.seen == 100_000
    assert tap.dropped == 100_000 - tap.max_queued
    assert len(await tap.receive(max_count=100_000)) == tap.max_queued


async def test_a_tap_holds_no_ack_for_a_subscriber_that_has_not_acked() -> None:
    """The receipt waits for the subscriber, and only for it: the tap is not a leg."""
    hub = Hub()
    hub.tap("logs")
    sub = hub.subscribe("logs")
    receipt = await hub.publish([msg(1)])
    assert not receipt.done()
    [d] = await receive_now(sub)
    sub.ack(d.tag)
    assert receipt.outcome is Outcome.DELIVERED


async def test_a_closed_tap_ends_its_reader_and_stops_seeing() -> None:
    hub = Hub()
    tap = hub.tap("logs")
    hub.untap(tap)
    await hub.publish([msg(1)])
    assert tap.seen == 0
    with pytest.raises(trio.EndOfChannel):
        await tap.receive()


def test_render_json_and_pretty() -> None:
    source = Source(protocol="ndjson", listener="nd", peer="127.0.0.1:5000")
    event = TapEvent("logs", Message("logs", b"hi", {"level": "error"}, "text/plain", source))
    assert json.loads(render(event)) == {
        "dest": "logs",
        "body": "hi",
        "headers": {"level": "error"},
        "content_type": "text/plain",
        "source": {"protocol": "ndjson", "listener": "nd", "peer": "127.0.0.1:5000"},
    }
    assert render(event, "pretty") == "logs [ndjson:nd 127.0.0.1:5000] level=error hi"
    binary = TapEvent("logs", Message("logs", b"\xff\x00"))
    assert json.loads(render(binary)) == {"dest": "logs", "body_b64": "/wA="}


def test_tap_filter_parses_the_ndjson_form() -> None:
    f = tap_filter('{"level":"error"}')
    assert f is not None
    assert f.matches({"level": "error"})
    assert tap_filter(None) is None
    with pytest.raises(ValueError, match="a filter is JSON"):
        tap_filter("{level")


def test_a_full_tap_drops_by_bytes_too() -> None:
    tap = Tap("logs", max_queued=100, max_queued_bytes=1000)
    tap.offer("logs", [Message("logs", b"x" * 600)] * 3)
    assert (tap.seen, tap.dropped) == (3, 2)  # 800 bytes each (with overhead): one fits
