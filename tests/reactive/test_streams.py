"""Reactive Streams rules over one connection: demand, split, cancel, terminals, ids."""

from __future__ import annotations

import pytest

from gateway.sdk import LocalProtocolError, RemoteProtocolError
from protocols.reactive import (
    MAX_DEMAND,
    NON_POSITIVE_REQUEST,
    Accepted,
    BadRequest,
    Cancel,
    Cancelled,
    Completed,
    Connection,
    DemandAdded,
    Elements,
    Failed,
    OnComplete,
    OnError,
    OnNext,
    OnNextLastPart,
    OnNextPacked,
    OnNextPart,
    Request,
    Role,
    Subscribe,
    Subscribed,
    SubscribeRequested,
)
from protocols.reactive.messages import Limits

from .helpers import feed, pair, subscribed


def test_initial_demand_is_a_first_request_and_demand_adds_up() -> None:
    client, server = subscribed(demand=2)
    assert server.outstanding(1) == 2
    assert feed(server, client.send(Request(1, 3))) == [DemandAdded(1, 3, 5)]
    server.send_elements(1, [b"x"] * 5)
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"over"))  # the publisher refuses over-delivery


def test_demand_saturates_and_then_is_unbounded() -> None:
    client, server = subscribed(demand=MAX_DEMAND - 1)
    assert feed(server, client.send(Request(1, 10))) == [DemandAdded(1, 10, MAX_DEMAND)]
    wire = server.send_elements(1, [b"x"] * 1000)
    assert server.outstanding(1) == MAX_DEMAND
    assert feed(client, wire) == [Elements(1, (b"x",) * 1000)]
    assert client.mine.live[1].outstanding == MAX_DEMAND


def test_a_request_of_zero_is_a_stream_error_owing_on_error() -> None:
    client, server = subscribed(demand=1)
    with pytest.raises(LocalProtocolError):
        client.send(Request(1, 0))  # our side refuses to send it at all
    assert feed(server, Request(1, 0)) == [BadRequest(1, NON_POSITIVE_REQUEST)]
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"x"))  # the stream owes onError, nothing else
    with pytest.raises(LocalProtocolError):
        server.send(OnComplete(1))
    assert feed(client, server.send(OnError(1, NON_POSITIVE_REQUEST))) == [
        Failed(1, NON_POSITIVE_REQUEST)
    ]


def test_packed_elements_count_each() -> None:
    client, server = subscribed(element_size=1, demand=3)
    with pytest.raises(LocalProtocolError):
        server.send(OnNextPacked(1, 4, b"abcd"))
    with pytest.raises(LocalProtocolError):
        server.send(OnNextPacked(1, 2, b"abc"))  # not count*elementSize
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"ab"))  # not elementSize
    assert feed(client, server.send(OnNextPacked(1, 3, b"abc"))) == [
        Elements(1, (b"a", b"b", b"c"))
    ]
    assert server.outstanding(1) == 0


def test_over_delivery_by_the_peer_is_a_protocol_error() -> None:
    client, _server = subscribed(demand=1)
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNext(1, b"a"), OnNext(1, b"b"))
    client, _server = subscribed(element_size=1, demand=2)
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNextPacked(1, 3, b"abc"))


def test_a_packed_bin_of_the_wrong_length_is_a_protocol_error() -> None:
    client, _server = subscribed(element_size=2, demand=9)
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNextPacked(1, 2, b"abc"))
    client, _server = subscribed(element_size=2, demand=9)
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNext(1, b"abc"))
    client, _server = subscribed(element_size=0, demand=9)
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNextPacked(1, 1, b"a"))  # packing needs a fixed elementSize


def test_a_split_element_counts_one_charged_at_its_first_part() -> None:
    client, server = subscribed(demand=1)
    wire = server.send(OnNextPart(1, 5, b"ab"))
    assert server.outstanding(1) == 0
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"x"))  # a split is open
    with pytest.raises(LocalProtocolError):
        server.send(OnNextPart(1, 6, b"x"))  # another element inside it
    wire += server.send(OnNextPart(1, 5, b"cd")) + server.send(OnNextLastPart(1, 5, b"e"))
    assert feed(client, wire) == [Elements(1, (b"abcde",))]
    assert client.held_bytes == 0


def test_elements_inside_a_split_are_a_protocol_error() -> None:
    client, _server = subscribed(demand=5)
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNextPart(1, 5, b"ab"), OnNext(1, b"x"))
    client, _server = subscribed(demand=5)
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNextPart(1, 5, b"ab"), OnNextPart(1, 6, b"x"))
    client, _server = subscribed(demand=5)
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNextPart(1, 5, b"ab"), OnComplete(1))


def test_split_is_forbidden_with_a_fixed_element_size() -> None:
    client, server = subscribed(element_size=4, demand=5)
    with pytest.raises(LocalProtocolError):
        server.send(OnNextPart(1, 1, b"ab"))
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNextLastPart(1, 1, b"abcd"))


def test_a_reassembled_element_is_limited() -> None:
    client = Connection(Role.CLIENT, Limits(max_element=10))
    client.hello()
    feed(client, Connection(Role.SERVER).hello())
    client.send(Subscribe("p", 1, 1))
    feed(client, Subscribed(1, 0), OnNextPart(1, 1, b"x" * 6))
    assert client.held_bytes >= 6
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNextPart(1, 1, b"x" * 6))
    assert client.held_bytes == 0


def test_cancel_abandons_reassembly_and_late_elements_are_dropped() -> None:
    client, server = subscribed(demand=3)
    in_flight = server.send(OnNextPart(1, 1, b"ab"))
    feed(client, in_flight)
    assert client.held_bytes > 0
    cancel = client.send(Cancel(1))
    assert client.held_bytes == 0
    late = server.send(OnNextLastPart(1, 1, b"cd")) + server.send(OnNext(1, b"x"))
    late += server.send(OnComplete(1))
    assert feed(client, late) == []  # parsed and dropped: no events
    assert feed(server, cancel) == []  # the stream had ended: a cancel for it is ignored
    assert client.send(Request(1, 1)) == b""  # RS §3.6: a no-op after cancel
    assert client.send(Cancel(1)) == b""  # cancel is idempotent
    with pytest.raises(LocalProtocolError):
        client.send(Cancel(99))  # never subscribed


def test_a_cancel_reaches_the_publisher() -> None:
    client, server = subscribed(demand=3)
    assert feed(server, client.send(Cancel(1))) == [Cancelled(1)]
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"x"))


def test_a_cancel_for_an_unknown_id_is_ignored() -> None:
    _client, server = pair()
    assert feed(server, Cancel(42)) == []


def test_on_error_without_subscribed_is_a_rejection() -> None:
    client, server = pair()
    assert feed(server, client.send(Subscribe("nope", 1, 1))) == [SubscribeRequested(1, "nope", 1)]
    with pytest.raises(LocalProtocolError):
        server.send(OnComplete(1))  # completing needs subscribed first
    assert feed(client, server.send(OnError(1, "no such publisher"))) == [
        Failed(1, "no such publisher")
    ]


def test_on_complete_before_subscribed_is_a_protocol_error() -> None:
    client, server = pair()
    feed(server, client.send(Subscribe("p", 1, 1)))
    with pytest.raises(RemoteProtocolError):
        feed(client, OnComplete(1))


def test_a_signal_after_the_terminal_of_a_cancelled_subscription_is_an_error() -> None:
    client, _server = subscribed(demand=1)
    client.send(Cancel(1))
    assert feed(client, OnComplete(1)) == []
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNext(1, b"x"))


def test_requests_above_the_maximum_saturate() -> None:
    _client, server = subscribed(demand=0)
    assert feed(server, Request(1, 2**64 - 1)) == [DemandAdded(1, 2**64 - 1, MAX_DEMAND)]


def test_a_request_crossing_our_terminal_signal_is_ignored() -> None:
    _client, server = subscribed(demand=1)
    server.send(OnComplete(1))
    assert feed(server, Request(1, 5)) == []
    with pytest.raises(RemoteProtocolError):
        feed(server, Request(77, 5))  # never subscribed


def test_elements_before_subscribed_are_refused_both_sides() -> None:
    client, server = pair()
    feed(server, client.send(Subscribe("p", 1, 1)))
    with pytest.raises(LocalProtocolError):
        server.send(OnNext(1, b"x"))
    with pytest.raises(RemoteProtocolError):
        feed(client, OnNext(1, b"x"))


@pytest.mark.parametrize(
    "message", [OnNext(9, b"x"), OnComplete(9), OnError(9, "e"), Subscribed(9, 0), Request(9, 1)]
)
def test_a_signal_for_an_unknown_id_is_a_connection_error(message: object) -> None:
    client, server = subscribed(demand=1)
    conn = server if isinstance(message, Request) else client
    with pytest.raises(RemoteProtocolError):
        feed(conn, message)  # type: ignore[arg-type]


def test_terminal_signals_once_and_nothing_after() -> None:
    client, server = subscribed(demand=3)
    assert feed(client, server.send(OnComplete(1))) == [Completed(1)]
    with pytest.raises(LocalProtocolError):
        server.send(OnComplete(1))
    with pytest.raises(LocalProtocolError):
        server.send(OnError(1, "again"))
    with pytest.raises(RemoteProtocolError):
        feed(client, OnError(1, "again"))


def test_a_second_subscribed_is_a_protocol_error() -> None:
    client, server = subscribed(demand=1)
    with pytest.raises(LocalProtocolError):
        server.send(Subscribed(1, 0))
    with pytest.raises(RemoteProtocolError):
        feed(client, Subscribed(1, 0))


def test_ids_are_never_reused_within_a_connection() -> None:
    client, server = subscribed(demand=1)
    feed(client, server.send(OnComplete(1)))
    with pytest.raises(LocalProtocolError):
        client.send(Subscribe("again", 1, 1))
    with pytest.raises(RemoteProtocolError):
        feed(server, Subscribe("again", 1, 1))


def test_both_peers_subscribe_on_one_connection_with_their_own_ids() -> None:
    client, server = pair()
    feed(server, client.send(Subscribe("a", 1, 1)))
    assert feed(client, server.send(Subscribe("b", 1, 2))) == [SubscribeRequested(1, "b", 2)]
    assert feed(server, client.send(Subscribed(1, 0))) == [Accepted(1, 0)]
    assert feed(client, server.send(Subscribed(1, 0))) == [Accepted(1, 0)]
    assert feed(client, server.send(OnNext(1, b"to client"))) == [Elements(1, (b"to client",))]
    assert feed(server, client.send_elements(1, [b"to", b"server"])) == [
        Elements(1, (b"to", b"server"))
    ]


def test_one_batch_per_subscription_in_a_read() -> None:
    client, server = pair()
    for sub in (1, 2):
        feed(server, client.send(Subscribe("p", sub, 5)))
        feed(client, server.send(Subscribed(sub, 0)))
    wire = (
        server.send_elements(1, [b"a", b"b"])
        + server.send_elements(2, [b"c"])
        + server.send_elements(1, [b"d"])
    )
    assert feed(client, wire) == [
        Elements(1, (b"a", b"b")),
        Elements(2, (b"c",)),
        Elements(1, (b"d",)),
    ]


def test_send_elements_refuses_beyond_demand_and_changes_nothing() -> None:
    _client, server = subscribed(demand=2)
    with pytest.raises(LocalProtocolError):
        server.send_elements(1, [b"a", b"b", b"c"])
    assert server.outstanding(1) == 2
    assert server.send_elements(1, []) == b""


def test_send_split_cuts_one_element_into_parts_charged_once() -> None:
    client, server = subscribed(demand=2)
    wire = server.send_split(1, b"abcdefg", 3)
    assert wire == bytes.fromhex(
        "94 0d 01 00 c4 03 61 62 63  94 0d 01 00 c4 03 64 65 66  94 0e 01 00 c4 01 67"
    )
    assert server.outstanding(1) == 1
    wire += server.send_split(1, b"", 3)  # an empty element: one last part
    assert feed(client, wire) == [Elements(1, (b"abcdefg", b""))]
    with pytest.raises(LocalProtocolError):
        server.send_split(1, b"x", 3)  # no demand left


def test_send_split_is_refused_with_a_fixed_element_size() -> None:
    _client, server = subscribed(element_size=4, demand=2)
    with pytest.raises(LocalProtocolError):
        server.send_split(1, b"abcd", 2)
    assert server.outstanding(1) == 2
