"""The metric families that answer operators' questions, checked against known traffic.

Messages in and out per listener, per destination and per upstream; backlogs,
buffer fill, subscribers and unacked deliveries per group; publishes by
outcome and reason; build and process information. Traffic goes over real
sockets (ndjson) through a running gateway, and the figures are read both from
the registry and from ``GET /metrics``.
"""

from __future__ import annotations

import platform
from typing import Any

import pytest
import trio
import trio.testing
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver, Publish
from prometheus_client.parser import text_string_to_metric_families
from test_metrics_endpoint import http_request
from waits import subscribed

from gateway import __version__
from gateway.core.hub import Hub, HubLimits
from gateway.core.model import MESSAGE_OVERHEAD, Message, Outcome
from gateway.core.reasons import Reason
from gateway.ops.metrics import (
    ANONYMOUS_GROUP,
    PUBLISH_REASONS,
    HubCollector,
    Metrics,
)
from gateway.runtime.gateway import Gateway

BUFFER = 4096


def value(gw: Gateway | Metrics, name: str, **labels: str) -> float | None:
    metrics = gw.metrics if isinstance(gw, Gateway) else gw
    return metrics.value(name, labels)


async def until(gw: Gateway, name: str, expected: float, **labels: str) -> None:
    with trio.fail_after(5):
        while value(gw, name, **labels) != expected:
            await trio.sleep(0.01)


def receiver_config() -> dict[str, Any]:
    """Gateway B: whatever its upstream peer sends it is taken at once (no groups)."""
    return {"listeners": [{"name": "b", "protocol": "ndjson", "bind": "127.0.0.1:0"}]}


def gateway_config(upstream_address: str) -> dict[str, Any]:
    return {
        "gateway": {"buffer_bytes": f"{BUFFER}B", "drain_timeout": "100ms"},
        "metrics": {"bind": "127.0.0.1:0"},
        "listeners": [
            {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.1:0", "destination": "logs"}
        ],
        "destinations": [{"name": "jobs", "kind": "queue"}],
        "upstreams": [{"name": "up", "protocol": "ndjson", "connect": upstream_address}],
        "routes": [{"from": "fwd", "to": ["upstream:up"]}],
    }


async def test_known_traffic_gives_exact_figures() -> None:
    async with (
        running_gateway(receiver_config()) as b,
        running_gateway(gateway_config(b.addresses["b"][0])) as gw,
    ):
        address = host_port(gw.addresses["nd"][0])
        sub = await NdjsonClient.connect(*address)
        pub = await NdjsonClient.connect(*address)
        await sub.subscribe("logs")
        await subscribed(gw, "logs")

        # One publish of three messages, delivered to the subscriber, which acks.
        answers: list[Any] = []

        async def batch() -> None:
            # The answer comes once the subscriber's acks are in.
            answers.append(await pub.publish_many([Publish(b"a"), Publish(b"bb"), Publish(b"ccc")]))

        got = []
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(batch)
                while len(got) < 3:
                    event = await sub.receive()
                    assert isinstance(event, Deliver)
                    got.append(event)
                assert [d.body for d in got] == [b"a", b"bb", b"ccc"]
                await sub.ack(*(d.tag for d in got))
        [answer] = answers

        # A queue nobody consumes keeps one message; an oversize one is rejected.
        [job] = await pub.publish_nowait([b"job"], "jobs")
        too_big = await pub.publish(b"x" * BUFFER, "logs")
        assert too_big.status == "rejected"
        # Two publishes routed to the upstream, which gateway B takes at once.
        forwarded = await pub.publish_nowait([b"f1", b"f2"], "fwd")
        assert [a.status for a in await pub.wait_answers(forwarded)] == ["delivered"] * 2
        await until(gw, "interchange_destination_messages_acked_total", 3, destination="logs")
        await until(gw, "interchange_upstream_messages_acked_total", 2, upstream="up")
        await until(gw, "interchange_publishes_total", 3, outcome="delivered", reason="")
        assert answer.status == "delivered"

        m = gw
        # Per listener: 3 + 1 + 1 + 2 messages published, 3 handed to the subscriber.
        assert value(m, "interchange_messages_received_total", listener="nd") == 7
        assert value(m, "interchange_messages_sent_total", listener="nd") == 3
        # Publishes by outcome: the job is still in flight (not counted yet).
        assert value(m, "interchange_publishes_total", outcome="rejected", reason="too_large") == 1
        assert gw.hub.inflight == 1
        # Per destination.
        for dest, put, out, acked in (
            ("logs", 3, 3, 3),
            ("jobs", 1, 0, 0),
            ("upstream:up", 2, 2, 2),
        ):
            labels = {"destination": dest}
            assert value(m, "interchange_destination_messages_in_total", **labels) == put, dest
            assert value(m, "interchange_destination_messages_out_total", **labels) == out, dest
            assert value(m, "interchange_destination_messages_acked_total", **labels) == acked
        assert value(m, "interchange_destinations") == 3  # logs, jobs, upstream:up
        # The queue's backlog: one message nobody consumes.
        jobs = {"destination": "jobs", "group": "queue"}
        size = len(b"job") + MESSAGE_OVERHEAD
        assert value(m, "interchange_destination_backlog_messages", **jobs) == 1
        assert value(m, "interchange_destination_backlog_bytes", **jobs) == size
        assert value(m, "interchange_destination_buffer_fill_ratio", **jobs) == size / BUFFER
        assert value(m, "interchange_group_subscribers", **jobs) == 0
        assert value(m, "interchange_group_unacked_messages", **jobs) == 0
        # The anonymous subscriber of logs: everything acked.
        logs = {"destination": "logs", "group": ANONYMOUS_GROUP}
        assert value(m, "interchange_group_subscribers", **logs) == 1
        assert value(m, "interchange_destination_backlog_messages", **logs) == 0
        assert value(m, "interchange_group_unacked_messages", **logs) == 0
        assert (
            value(m, "interchange_destination_backlog_messages", destination="logs", group="") == 0
        )
        assert value(m, "interchange_destination_messages_discarded_total", destination="logs") == 0
        # Per upstream: two sent and acked by B; nothing received from it.
        assert value(m, "interchange_upstream_messages_sent_total", upstream="up") == 2
        assert value(m, "interchange_upstream_messages_received_total", upstream="up") == 0
        # B discarded what it got (no groups): its own figures say so.
        assert value(b, "interchange_messages_received_total", listener="b") == 2
        assert value(b, "interchange_destination_messages_discarded_total", destination="fwd") == 2

        # Build and process information, and the same figures over HTTP.
        reply = await http_request(gw.metrics_addresses[0])
        families = {f.name: f for f in text_string_to_metric_families(reply.body.decode("utf-8"))}
        [info] = families["interchange_build_info"].samples
        assert info.labels == {"version": __version__, "python": platform.python_version()}
        assert info.value == 1
        assert "python_info" in families
        if platform.system() == "Linux":
            assert families["process_resident_memory_bytes"].samples[0].value > 0
        [rejected] = [
            s
            for s in families["interchange_publishes"].samples
            if s.labels == {"outcome": "rejected", "reason": "too_large"}
        ]
        assert rejected.value == 1
        for name in (
            "interchange_destination_backlog_messages",
            "interchange_group_unacked_messages",
            "interchange_upstream_messages_sent",
            "interchange_messages_received",
            "interchange_tls_handshake_failures",
        ):
            assert name in families, name
        await sub.aclose()
        await pub.aclose()
        del job


# -- publish outcomes through the hub -------------------------------------------------------


def msg(destination: str, body: bytes = b"x") -> Message:
    return Message(destination=destination, body=body)


def publishes(metrics: Metrics) -> dict[tuple[str, str], float]:
    out = {}
    for family in metrics.registry.collect():
        if family.name == "interchange_publishes":
            for s in family.samples:
                out[(s.labels["outcome"], s.labels["reason"])] = s.value
    return out


async def test_each_failure_is_counted_once_with_its_reason() -> None:
    hub = Hub(limits=HubLimits(max_destinations=4, buffer_bytes=1024, buffer_messages=2))
    metrics = Metrics()
    metrics.watch_hub(hub)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(hub.run)
            sub = hub.subscribe("t")
            callee = hub.subscribe("svc")
            hub.destination("t2")  # no group: a call to it has nobody to answer
            # A nack without requeue: refused by the target, once for the whole publish.
            receipt = await hub.publish([msg("t"), msg("t")])
            deliveries = await sub.receive()
            sub.ack(deliveries[0].tag)
            sub.nack(deliveries[1].tag, requeue=False, outcome=Outcome.REJECTED, reason="no")
            assert receipt.outcome is Outcome.REJECTED
            # Delivered: acked, and taken by a topic nobody listens to.
            await hub.publish([msg("t")])
            sub.ack((await sub.receive())[0].tag)
            await hub.publish([msg("u")])
            # Too large for the buffer; one destination too many.
            await hub.publish([msg("t", b"x" * 2048)])
            await hub.publish([msg("v")])
            # A call nobody answers in time; one nobody could answer.
            await (await hub.call(msg("svc"), 0.01)).wait()
            await (await hub.call(msg("t2"), 1.0)).wait()
            # A publish waiting for room when the hub closes under it.
            await hub.publish([msg("t"), msg("t")])  # fills t's group: never acked

            async def publish_into_full_buffer() -> None:
                with pytest.raises(trio.ClosedResourceError):
                    await hub.publish([msg("t")])

            nursery.start_soon(publish_into_full_buffer)
            await trio.testing.wait_all_tasks_blocked()
            hub.close()
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    del callee
    assert publishes(metrics) == {
        ("delivered", ""): 2,
        ("rejected", "refused_by_target"): 1,
        ("rejected", "too_large"): 1,
        ("rejected", "no_destination"): 1,
        ("failed", "expired"): 1,
        ("failed", "no_reply"): 1,
        ("failed", "buffer_closed"): 1,
    }
    assert hub.inflight == 1  # the publish stored before the close, never acked


def test_reasons_map_to_a_bounded_set() -> None:
    cases = {
        Reason.TOO_LARGE: "too_large",
        Reason.WRONG_SIZE: "wrong_size",
        Reason.TOO_MANY_DESTINATIONS: "no_destination",
        Reason.NO_UPSTREAM: "no_destination",
        Reason.CLOSED: "buffer_closed",
        Reason.EXPIRED: "expired",
        Reason.NO_SUBSCRIBER: "no_reply",
        Reason.ABANDONED: "abandoned",
        Reason.REFUSED_BY_TARGET: "refused_by_target",
        Reason.OTHER: "other",
    }
    for code, expected in cases.items():
        assert code.label == expected, code
        assert expected in PUBLISH_REASONS
    assert {code.label for code in Reason} == set(PUBLISH_REASONS)


def test_destinations_exported_are_bounded() -> None:
    hub = Hub(limits=HubLimits(max_destinations=50))
    for i in range(20):
        hub.destination(f"d{i}")
    collector = HubCollector(hub, max_destinations=5)
    samples = {
        s.labels.get("destination")
        for family in collector.collect()
        if family.name == "interchange_destination_messages_in"
        for s in family.samples
    }
    assert samples == {f"d{i}" for i in range(5)}
    [total] = [f for f in collector.collect() if f.name == "interchange_destinations"]
    assert total.samples[0].value == 20


def test_anonymous_groups_are_one_series() -> None:
    hub = Hub()
    subs = [hub.subscribe("t") for _ in range(3)]
    hub.subscribe("t", "named")
    groups = {
        s.labels["group"]: s.value
        for family in HubCollector(hub).collect()
        if family.name == "interchange_group_subscribers"
        for s in family.samples
    }
    assert groups == {ANONYMOUS_GROUP: 3, "named": 1}
    del subs


# -- tallies: counters cheap enough for every publish ----------------------------------------


def test_a_tally_family_is_exported_as_a_counter() -> None:
    metrics = Metrics()
    family = metrics.tally("demo_messages", "Messages of the demo.", ["listener"])
    assert metrics.tally("demo_messages", "again", ["listener"]) is family  # same name, same one
    family.labels(listener="a").inc()
    family.labels("a").inc(2)
    family.labels(listener="b")  # a series from 0
    assert value(metrics, "demo_messages_total", listener="a") == 3
    assert value(metrics, "demo_messages_total", listener="b") == 0
    [parsed] = [
        f
        for f in text_string_to_metric_families(metrics.exposition().decode())
        if f.name == "demo_messages"
    ]
    assert parsed.type == "counter"
    assert parsed.documentation == "Messages of the demo."
    assert {s.labels["listener"]: s.value for s in parsed.samples} == {"a": 3, "b": 0}
    with pytest.raises(ValueError, match="labels must be exactly"):
        family.labels(peer="x")
    with pytest.raises(ValueError, match="labels must be exactly"):
        family.labels("a", "b")
    with pytest.raises(ValueError, match="is a TallyFamily, not a Counter"):
        metrics.counter("demo_messages", "as a prometheus_client counter", ["listener"])
