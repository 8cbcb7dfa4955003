"""Micromessage2 bridged to the other protocols, and to itself, over real sockets.

Each test runs one or two in-process gateways on loopback and talks to them with
each protocol's own client: the third-party ``pylogbeat`` (a Beats sender), the
ndjson client, a ttrpc ``Subscribe`` stream, the library Lumberjack server behind
an upstream, and the Micromessage2 client library (:mod:`protocols.micromessage.api`).
They check bodies and headers exactly, typed properties seen by other protocols'
filters and the other way round, the end-to-end promise of an ack (a publisher is
acked only once its subscribers or the server behind an upstream acked), the
gateway as a Micromessage2 client of another gateway (egress and ingress, payloads
over 1 MiB, a server that restarts), and that members of a named group or
consumers of a queue coming and going lose nothing.

Real sockets need the real clock, so every wait is guarded by ``trio.fail_after``;
"nothing arrives" is checked over a short real interval.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pylogbeat
import pytest
import trio
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from interchange_ndjson.events import Deliver
from waits import subscribed

from gateway.config.loader import parse
from gateway.core.filters import Filter
from gateway.runtime.gateway import Gateway
from protocols.lumberjack.server import ServerSettings
from protocols.lumberjack.standalone import Batch, open_server
from protocols.micromessage import Client, Received
from protocols.micromessage.filters import encode_text
from protocols.ttrpc import messaging_pb2 as pb
from protocols.ttrpc.client import open_client
from protocols.ttrpc.codec import CallKind
from protocols.ttrpc.messaging import SERVICE

GUARD = 10.0  # seconds any one expected event may take (generous for a loaded machine)
QUIET = 0.3  # seconds in which an unexpected message or ack would have arrived
AT = "2014-10-13T11:00:00.250000Z"  # a header the library sends as a D property
VERSION = importlib.metadata.version("interchange-gateway")  # in the Beats @metadata

# -- configuration ----------------------------------------------------------------------------
# Two listeners may not both bind "127.0.0.1:0" (the config refuses a duplicate bind),
# so each protocol's listener has a loopback address of its own.


def mm_listener(name: str = "mm") -> dict[str, Any]:
    return {"name": name, "protocol": "micromessage", "bind": "127.0.0.1:0", "destination": "logs"}


def nd_listener() -> dict[str, Any]:
    return {"name": "nd", "protocol": "ndjson", "bind": "127.0.0.2:0", "destination": "logs"}


def lj_listener(**options: Any) -> dict[str, Any]:
    listener = {"name": "lj", "protocol": "lumberjack", "bind": "127.0.0.3:0"}
    return listener | {"destination": "logs"} | options


def rpc_listener() -> dict[str, Any]:
    return {"name": "rpc", "protocol": "ttrpc", "bind": "127.0.0.4:0"}


def gateway_config(*listeners: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"gateway": {"drain_timeout": "500ms"}, "listeners": list(listeners), **extra}


# -- clients ----------------------------------------------------------------------------------


async def mm_client(gw: Gateway, listener: str = "mm", **kwargs: Any) -> Client:
    """A Micromessage2 client of ``gw``'s listener (use it in ``async with``)."""
    return await Client.connect(*host_port(gw.addresses[listener][0]), **kwargs)


@asynccontextmanager
async def ndjson(gw: Gateway) -> AsyncIterator[NdjsonClient]:
    async with await NdjsonClient.connect(*host_port(gw.addresses["nd"][0])) as c:
        yield c


async def receive(client: Client, count: int) -> list[Received]:
    """The next ``count`` messages delivered to ``client``."""
    with trio.fail_after(GUARD):
        return [await client.receive() for _ in range(count)]


async def receive_now(client: Client, seconds: float = QUIET) -> list[Received]:
    """What arrives within ``seconds``."""
    out: list[Received] = []
    with trio.move_on_after(seconds):
        while True:
            out.append(await client.receive())
    return out


async def nd_deliveries(c: NdjsonClient, n: int) -> list[Deliver]:
    out: list[Deliver] = []
    with trio.fail_after(GUARD):
        while len(out) < n:
            event = await c.receive()
            assert isinstance(event, Deliver), event
            out.append(event)
    return out


async def nd_nothing_more(c: NdjsonClient) -> bool:
    """No delivery arrives on ``c`` for a while."""
    with trio.move_on_after(QUIET):
        await c.receive()
        return False
    return True


async def acked_all(client: Client) -> None:
    with trio.fail_after(GUARD):
        await client.wait_acked()


async def still_unacked(client: Client, count: int) -> bool:
    """After a while, ``count`` of ``client``'s publishes are still not acked."""
    await trio.sleep(QUIET)
    return client.unacked == count


# -- 1. pylogbeat -> Lumberjack listener -> filtered Micromessage2 subscriber ---------------------


class Beat:
    """A ``pylogbeat`` sender driven from worker threads, one blocking call at a time."""

    def __init__(self, gw: Gateway) -> None:
        self.client = pylogbeat.PyLogBeatClient(*host_port(gw.addresses["lj"][0]), timeout=10)
        self.sent = trio.Event()

    async def connect(self) -> str:
        """Connect; returns the sender's address as the listener sees it (``ip:port``)."""
        await trio.to_thread.run_sync(self.client.connect)
        host, port = self.client._socket.getsockname()[:2]
        return f"{host}:{port}"

    async def send(self, events: list[str]) -> None:
        """Send one window; returns once the listener acked all of it."""
        await trio.to_thread.run_sync(self.client.send, events, abandon_on_cancel=True)
        self.sent.set()

    async def close(self) -> None:
        await trio.to_thread.run_sync(self.client.close)


async def test_pylogbeat_events_reach_a_micromessage_subscriber_filtered_by_sender() -> None:
    """Only the events of one Beats sender reach the filtered Micromessage2 subscriber.

    Lumberjack ``J`` events (all pylogbeat sends) become messages whose body is
    the event's JSON unchanged and which carry none of its fields as headers, so
    no filter can pick events by content. The listener's ``enrich = "headers"``
    adds the header ``lumberjack.peer`` (the sender's ``ip:port``): the filter
    picks one sender's events by it. The other sender is acked at once (nobody
    wants its events); the picked one only once the subscriber acked.
    """
    cfg = gateway_config(mm_listener(), lj_listener(enrich="headers"))
    async with running_gateway(cfg) as gw, await mm_client(gw) as sub:
        picked, other = Beat(gw), Beat(gw)
        peer = await picked.connect()
        await other.connect()
        await sub.subscribe("logs", filter="lumberjack.peer=T" + encode_text(peer))
        await subscribed(gw, "logs")
        with trio.fail_after(GUARD):
            await other.send(['{"from":"other","n":1}', '{"from":"other","n":2}'])
        events = ['{"from":"picked","n":1}', '{"from":"picked","n":2}', '{"n":3}']
        async with trio.open_nursery() as nursery:
            nursery.start_soon(picked.send, events)
            got = await receive(sub, 3)
            assert [(m.destination, m.payload, m.headers) for m in got] == [
                ("logs", e.encode(), {"lumberjack.peer": peer}) for e in events
            ]
            await trio.sleep(QUIET)
            assert not picked.sent.is_set(), "the sender was acked before the subscriber acked"
            assert sub.ack(got[-1].seq)
            with trio.fail_after(GUARD):
                await picked.sent.wait()
        assert await receive_now(sub) == []  # nothing of the other sender's
        await picked.close()
        await other.close()


# -- 2. Micromessage2 publisher -> ndjson subscriber ---------------------------------------------


async def test_a_micromessage_n_property_is_filtered_by_an_ndjson_subscriber() -> None:
    """``age:N42`` is the header ``age`` = ``42``, a number to ndjson's ``age >= 18``."""
    cfg = gateway_config(mm_listener(), nd_listener())
    async with (
        running_gateway(cfg) as gw,
        ndjson(gw) as sub,
        await mm_client(gw) as pub,
    ):
        await sub.subscribe("people", filter=Filter.from_json([["age", ">=", 18]]))
        await subscribed(gw, "people")
        await pub.publish("people", b"grown-up", {"age": "42", "at": AT, "who": "x y"})
        await pub.publish("people", b"child", {"age": "7"})
        (got,) = await nd_deliveries(sub, 1)
        assert (got.destination, got.body, dict(got.headers), got.content_type) == (
            "people",
            b"grown-up",
            {"age": "42", "at": AT, "who": "x y"},
            None,
        )
        assert await nd_nothing_more(sub)  # age 7 did not match
        assert pub.unacked >= 1, "acked before the ndjson subscriber acked"
        await sub.ack(got.tag)
        await acked_all(pub)


# -- 3. ndjson publisher -> Micromessage2 subscribers with N and D filters ----------------------


async def test_ndjson_headers_match_micromessage_n_and_d_filters() -> None:
    """``{"age": "42"}`` matches ``age>=N18`` (``"7"`` does not), and an ISO time
    ``when>D1700000000``; both arrive as typed properties, read back as the same text."""
    cfg = gateway_config(mm_listener(), nd_listener())
    async with (
        running_gateway(cfg) as gw,
        ndjson(gw) as pub,
        await mm_client(gw) as ages,
        await mm_client(gw) as times,
    ):
        await ages.subscribe("people", filter="age>=N18")
        await times.subscribe("times", filter="when>D1700000000")
        await subscribed(gw, "people")
        await subscribed(gw, "times")
        ids = await pub.publish_nowait([b"old"], "people", headers={"age": "42", "k": "v"})
        ids += await pub.publish_nowait([b"young"], "people", headers={"age": "7"})
        ids += await pub.publish_nowait(
            [b"recent"], "times", headers={"when": "2024-01-01T00:00:00Z"}
        )
        ids += await pub.publish_nowait([b"long ago"], "times", headers={"when": AT})
        (age,) = await receive(ages, 1)
        (when,) = await receive(times, 1)
        assert (age.destination, age.payload, age.headers) == (
            "people",
            b"old",
            {"age": "42", "k": "v"},
        )
        assert (when.destination, when.payload, when.headers) == (
            "times",
            b"recent",
            {"when": "2024-01-01T00:00:00Z"},
        )
        assert await receive_now(ages, 0.05) + await receive_now(times) == []
        ages.ack(age.seq)
        times.ack(when.seq)
        with trio.fail_after(GUARD):
            answers = await pub.wait_answers(ids)
        assert [a.status for a in answers] == ["delivered"] * 4


# -- typed values across protocols, case by case -----------------------------------------------

#: An ndjson publisher's headers, a Micromessage2 subscriber's filter, whether it matches
#: (docs/protocols/micromessage2.md, "Which messages match").
NDJSON_TO_FILTER = [
    ({"age": "42"}, "age>=N18", True),
    ({"age": "7"}, "age>=N18", False),
    ({"age": "42.5"}, "age>N42", True),  # a plain decimal number is a number
    ({"age": "abc"}, "age!=N5", False),  # a type mismatch never matches, != too
    ({"other": "1"}, "age!=N5", False),  # nor does a missing property
    ({"age": "42"}, "age=T42", True),  # T compares the text, whatever its type
    ({"when": "2024-01-01T00:00:00Z"}, "when>D1700000000", True),
    ({"when": AT}, "when>D1700000000", False),
    ({"when": "2024-01-01T01:00:00+01:00"}, "when=D1704067200", True),  # any ISO 8601
    ({"when": "1700000001"}, "when>D1700000000", True),  # plain seconds are a time
    ({"when": "2024-01-01T00:00:00Z"}, "when>N0", False),  # a time is never a number
    ({"X-Level": "warn"}, "%58-%4Cevel=Twarn", True),  # names outside [a-z0-9-] escaped
    ({"name": "Hello world"}, "name<THello;name>Tworld;name&To%20w", True),
    ({"name": "Hello world"}, "name~Tworld", False),
]


@pytest.mark.parametrize(("headers", "expression", "matches"), NDJSON_TO_FILTER)
async def test_an_ndjson_header_against_a_micromessage_filter(
    headers: dict[str, str], expression: str, matches: bool
) -> None:
    cfg = gateway_config(mm_listener(), nd_listener())
    async with running_gateway(cfg) as gw, ndjson(gw) as pub, await mm_client(gw) as sub:
        await sub.subscribe("t", filter=expression)
        await subscribed(gw, "t")
        ids = await pub.publish_nowait([b"body"], "t", headers=headers)
        if matches:
            (got,) = await receive(sub, 1)
            assert (got.payload, got.headers) == (b"body", headers)
            sub.ack(got.seq)
        else:
            assert await receive_now(sub) == []
        with trio.fail_after(GUARD):
            assert [a.status for a in await pub.wait_answers(ids)] == ["delivered"]


#: A Micromessage2 publisher's headers (typed by the library), an ndjson subscriber's
#: filter (JSON form), whether it matches.
PROPERTY_TO_FILTER: list[tuple[dict[str, str], Any, bool]] = [
    ({"age": "42"}, [["age", ">=", 18]], True),  # age:N42
    ({"age": "42"}, [["age", "=", 42]], True),
    ({"age": "42"}, {"age": "42"}, True),  # text equality
    ({"age": "007"}, [["age", "=", 7]], True),  # age:T007, a plain decimal number still
    ({"at": AT}, [["at", ">", {"date": "2014-10-13T11:00:00Z"}]], True),  # at:D…
    ({"at": AT}, [["at", "<", {"date": "2014-10-13T11:00:00.250000Z"}]], False),
    ({"at": AT}, [["at", ">", 0]], False),  # a date is never a number
    ({"Content-Type": "text/x"}, {"Content-Type": "text/x"}, True),  # %43ontent-%54ype
]


@pytest.mark.parametrize(("headers", "spec", "matches"), PROPERTY_TO_FILTER)
async def test_a_micromessage_property_against_an_ndjson_filter(
    headers: dict[str, str], spec: Any, matches: bool
) -> None:
    cfg = gateway_config(mm_listener(), nd_listener())
    async with running_gateway(cfg) as gw, ndjson(gw) as sub, await mm_client(gw) as pub:
        await sub.subscribe("t", filter=Filter.from_json(spec))
        await subscribed(gw, "t")
        await pub.publish("t", b"body", headers)
        if matches:
            (got,) = await nd_deliveries(sub, 1)
            assert (got.body, dict(got.headers)) == (b"body", headers)
            await sub.ack(got.tag)
        else:
            assert await nd_nothing_more(sub)
        await acked_all(pub)


# -- 4. Micromessage2 publisher -> Lumberjack upstream -------------------------------------------


@asynccontextmanager
async def lumberjack_server() -> AsyncIterator[Any]:
    async with open_server("127.0.0.1", 0, settings=ServerSettings(keepalive=0.1)) as server:
        yield server


async def received_events(server: Any, count: int) -> tuple[list[dict[str, Any]], list[Batch]]:
    """The next ``count`` events the Lumberjack server got (parsed), and their batches."""
    events: list[dict[str, Any]] = []
    batches: list[Batch] = []
    with trio.fail_after(GUARD):
        while len(events) < count:
            batch: Batch = await server.receive()
            batches.append(batch)
            events += [json.loads(payload) for _, payload in batch.events]  # type: ignore[arg-type]
    return events, batches


async def test_a_micromessage_publisher_to_a_lumberjack_upstream_acks_after_the_server() -> None:
    async with lumberjack_server() as server:
        upstream = {
            "name": "next",
            "protocol": "lumberjack",
            "connect": f"127.0.0.1:{server.port}",
            "backoff_initial": "50ms",
            "backoff_max": "100ms",
        }
        routes = [{"from": "logs", "to": ["upstream:next"]}]
        cfg = gateway_config(mm_listener(), upstreams=[upstream], routes=routes)
        async with running_gateway(cfg) as gw, await mm_client(gw) as pub:
            await pub.publish("logs", b'{"a":1}', {"ignored": "x"})
            await pub.publish("logs", b"plain text", {"age": "42", "at": AT})
            events, batches = await received_events(server, 2)
            metadata = {"beat": "interchange", "type": "_doc", "version": VERSION}
            assert [event.pop("@metadata") for event in events] == [metadata] * 2
            # A JSON object goes as it is; anything else is wrapped, with the headers.
            assert events == [{"a": 1}, {"message": "plain text", "age": "42", "at": AT}]
            assert await still_unacked(pub, 2), "acked before the Lumberjack server acked"
            for batch in batches:
                batch.ack()
            await acked_all(pub)


# -- 5. Micromessage2 publisher -> ttrpc Subscribe -----------------------------------------------


async def test_a_micromessage_publisher_reaches_a_ttrpc_subscribe_stream() -> None:
    cfg = gateway_config(mm_listener(), rpc_listener())
    async with (
        running_gateway(cfg) as gw,
        open_client(gw.addresses["rpc"][0]) as rpc,
        await mm_client(gw) as pub,
    ):
        request = pb.SubscribeRequest(destination="feed").SerializeToString()
        async with rpc.stream(SERVICE, "Subscribe", CallKind.SERVER_STREAMING, request) as stream:
            await subscribed(gw, "feed")
            await pub.publish("feed", b"\x00\xffbinary", {"age": "42", "at": AT, "who": "x y"})
            await pub.publish("feed", b"two")
            with trio.fail_after(GUARD):
                got = [pb.Delivery.FromString(await stream.receive()) for _ in range(2)]
            # Subscribe acks what it wrote to the socket: the publisher is acked.
            await acked_all(pub)
    messages = [(d.message.destination, d.message.body, dict(d.message.headers)) for d in got]
    assert messages == [
        ("feed", b"\x00\xffbinary", {"age": "42", "at": AT, "who": "x y"}),
        ("feed", b"two", {}),
    ]
    assert not any(d.message.HasField("content_type") for d in got)


# -- 6. the gateway's client role against its server role -----------------------------------------


def relay_config(server: str, *subscribe: dict[str, str]) -> dict[str, Any]:
    """Gateway A: a Micromessage2 listener, ``orders`` routed to the upstream ``hq``
    (a Micromessage2 client of ``server``), which also subscribes as ``subscribe`` says."""
    upstream = {
        "name": "hq",
        "protocol": "micromessage",
        "connect": server,
        "backoff_initial": "50ms",
        "backoff_max": "100ms",
        "subscribe": list(subscribe),
    }
    routes = [{"from": "orders", "to": ["upstream:hq"]}]
    return gateway_config(mm_listener(), upstreams=[upstream], routes=routes)


@asynccontextmanager
async def two_gateways() -> AsyncIterator[tuple[Gateway, Gateway]]:
    """Gateway A routes ``orders`` to its upstream ``hq``, gateway B's listener, and
    pulls B's ``alerts`` with ``sev>=N3`` into its own ``local-alerts``."""
    async with running_gateway(gateway_config(mm_listener())) as b:
        alerts = {"destination": "alerts", "filter": "sev>=N3", "into": "local-alerts"}
        async with running_gateway(relay_config(b.addresses["mm"][0], alerts)) as a:
            yield a, b


async def test_a_gateway_publishes_to_another_through_a_micromessage_upstream() -> None:
    """Egress: A's publisher is acked only once B's subscriber acked."""
    async with (
        two_gateways() as (a, b),
        await mm_client(b, identity="b-sub") as sub,
        await mm_client(a, identity="a-pub") as pub,
    ):
        await sub.subscribe("orders")
        await subscribed(b, "orders")
        # A name outside [a-z0-9-] is percent-encoded on each hop, and read back.
        sent = [(b"first", {"id": "1", "at": AT}), (b"second", {"X-Level": "warn", "who": "x y"})]
        for body, headers in sent:
            await pub.publish("orders", body, headers)
        got = await receive(sub, 2)
        assert [(m.destination, m.payload, m.headers) for m in got] == [
            ("orders", body, headers) for body, headers in sent
        ]
        assert await still_unacked(pub, 2), "acked before B's subscriber acked"
        sub.ack(got[-1].seq)
        await acked_all(pub)
        assert await receive_now(sub) == []  # sent once


async def test_a_gateway_pulls_filtered_messages_from_another_through_its_upstream() -> None:
    """Ingress: A's upstream subscribes to B's ``alerts`` with ``sev>=N3``; an A
    subscriber of ``local-alerts`` gets only those, and B's publisher is acked once
    it acked them."""
    async with (
        two_gateways() as (a, b),
        await mm_client(a, identity="a-sub") as sub,
        await mm_client(b, identity="b-pub") as pub,
    ):
        await sub.subscribe("local-alerts")
        await subscribed(a, "local-alerts")
        await subscribed(b, "alerts")  # A's upstream connected and subscribed
        for sev in range(1, 6):
            await pub.publish("alerts", b"alert %d" % sev, {"sev": str(sev), "at": AT})
        got = await receive(sub, 3)
        assert [(m.destination, m.payload, m.headers) for m in got] == [
            ("local-alerts", b"alert %d" % sev, {"sev": str(sev), "at": AT}) for sev in (3, 4, 5)
        ]
        assert await receive_now(sub) == []  # sev 1 and 2 stayed in B
        # 3 to 5 wait for A's subscriber (1 and 2 too, when they came in one read with them).
        assert pub.unacked >= 3, "B's publisher was acked before A's subscriber acked"
        sub.ack(got[-1].seq)
        await acked_all(pub)


async def test_payloads_over_1_mib_and_utf8_headers_cross_the_upstream_both_ways() -> None:
    """CONTINUED fragments written and joined by both roles, each way."""
    big = bytes(range(256)) * (10 * 1024)  # 2.5 MiB: three fragments
    headers = {"sev": "9", "naïve": "ä ö;:%,=", "empty": ""}
    async with (
        two_gateways() as (a, b),
        await mm_client(a, identity="a") as on_a,
        await mm_client(b, identity="b") as on_b,
    ):
        await on_b.subscribe("orders")
        await on_a.subscribe("local-alerts")
        await subscribed(b, "orders")
        await subscribed(a, "local-alerts")
        await subscribed(b, "alerts")
        await on_a.publish("orders", big, headers)
        await on_b.publish("alerts", big[::-1], headers)
        (there,) = await receive(on_b, 1)
        (back,) = await receive(on_a, 1)
        assert (there.payload == big, there.headers) == (True, headers)
        assert (back.payload == big[::-1], back.headers) == (True, headers)
        on_b.ack(there.seq)
        on_a.ack(back.seq)
        await acked_all(on_a)
        await acked_all(on_b)


def queue_server(bind: str = "127.0.0.1:0") -> dict[str, Any]:
    """Gateway B where ``orders`` is a queue: it keeps what arrives until a consumer acks."""
    listener = mm_listener() | {"bind": bind}
    return gateway_config(listener, destinations=[{"name": "orders", "kind": "queue"}])


async def test_an_upstream_resends_what_a_restarted_server_had_not_acked() -> None:
    """B stops holding messages its consumer did not ack; a new B on the same address
    gets them from A's upstream (at least once) and A's publisher is acked for all."""
    sent = [b"m%d" % i for i in range(10)]
    received: list[bytes] = []
    b1 = Gateway(parse(queue_server()))
    async with trio.open_nursery() as nursery:
        await nursery.start(b1.run)
        address = b1.addresses["mm"][0]
        async with running_gateway(relay_config(address)) as a, await mm_client(a) as pub:
            async with await mm_client(b1) as first:
                await first.subscribe("orders")
                await subscribed(b1, "orders")
                for body in sent:
                    await pub.publish("orders", body)
                got = await receive(first, 10)
                first.ack(got[4].seq)
                received += [m.payload for m in got[:5]]
            with trio.fail_after(GUARD):
                b1.shutdown()  # drains for 500 ms: the unacked messages are given up
                while nursery.child_tasks:
                    await trio.sleep(0.01)
            assert pub.unacked > 0
            async with running_gateway(queue_server(address)) as b2, await mm_client(b2) as second:
                await second.subscribe("orders")
                with trio.fail_after(GUARD):
                    while set(received) != set(sent):
                        m = await second.receive()
                        received.append(m.payload)
                        second.ack(m.seq)
                await acked_all(pub)
    assert received[:5] == sent[:5]


# -- 7. subscribers of a named group come and go --------------------------------------------------

TOTAL = 500


class Churn:
    """Members of a group (or consumers of a queue) that come and go: most take a few
    messages, ack part of them and leave the rest unacked; some drain what is there."""

    WINDOW = 16  # each member's ack window: it holds at most this many unacked
    IDLE = 0.2  # seconds without a message after which a member leaves

    def __init__(self, gw: Gateway, destination: str, group: str | None) -> None:
        self.gw = gw
        self.destination = destination
        self.group = group
        self.acked: set[bytes] = set()
        self.received = 0
        self.left_unacked = 0  # messages members left without acking
        self.members = 0

    async def member(self, take: int, ack: int, joined: trio.Event | None = None) -> None:
        """One member's life: receive up to ``take`` (leaving when idle), ack the
        first ``ack`` of them (acks are cumulative: one ack per message received, so
        what it acked is known exactly), leave the rest unacked. ``joined`` is set
        once the member is in the hub."""
        self.members += 1
        async with await mm_client(self.gw, window=self.WINDOW) as c:
            await c.subscribe(self.destination, group=self.group)
            if joined is not None:
                await subscribed(self.gw, self.destination, group=self.group)
                joined.set()
            for n in range(take):
                with trio.move_on_after(self.IDLE):
                    m = await c.receive()
                    self.received += 1
                    if n < ack:
                        c.ack(m.seq)
                        self.acked.add(m.payload)
                    else:
                        self.left_unacked += 1
                    continue
                break

    async def until_all_acked(self, started: trio.Event) -> None:
        """Rounds of members until every message was acked by one; a drainer (which
        acks all it gets) joins every third round, beside the one that leaves unacked."""
        await self.member(10, 5, joined=started)
        rounds = 0
        while len(self.acked) < TOTAL:
            rounds += 1
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.member, self.WINDOW - 2, 5)
                if rounds % 3 == 0:
                    nursery.start_soon(self.member, 60, 60)


@pytest.mark.parametrize(
    ("destinations", "group"),
    [([], "g"), ([{"name": "news", "kind": "queue"}], None)],
    ids=["topic-group-g", "queue"],
)
async def test_nothing_is_lost_while_group_members_come_and_go(
    destinations: list[dict[str, Any]], group: str | None
) -> None:
    """500 messages published while members connect, ack part of what they got and
    leave: every one is acked by some member (at least once), and to the publisher."""
    cfg = gateway_config(mm_listener(), destinations=destinations)
    async with running_gateway(cfg) as gw, await mm_client(gw) as pub:
        churn = Churn(gw, "news", group)
        started = trio.Event()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(churn.until_all_acked, started)
                await started.wait()
                for i in range(TOTAL):
                    await pub.publish("news", b"m%03d" % i, {"i": str(i)})
                await pub.wait_acked()
        assert churn.acked == {b"m%03d" % i for i in range(TOTAL)}
        assert pub.unacked == 0
        assert churn.left_unacked > 0  # so some were delivered again
        assert churn.members > 10
