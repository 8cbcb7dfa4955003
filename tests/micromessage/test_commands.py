"""Micromessage2 COMMAND payloads: the subscribe vector byte for byte, the grammar's
rules (case-insensitive names, case-sensitive keys, each key once, a destination
always), bad escapes, and round trips of every field."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.sdk import LocalProtocolError, RemoteProtocolError
from protocols.micromessage.commands import (
    Subscribe,
    Unsubscribe,
    encode_command,
    parse_command,
)

#: The payload of the ``subscribe_cmd`` vector (its frame minus the flags and length bytes).
SUBSCRIBE_PAYLOAD = bytes.fromhex(
    "7375627363726962653b64657374696e6174696f6e3d746f706963253246646f6d61696e2d6576656e74"
    "732c66696c7465723d6167652533452533444e31382533426c6173742d6e616d652533435467617566"
)
SUBSCRIBE = Subscribe("topic/domain-events", "age>=N18;last-name<Tgauf")


def test_the_subscribe_vector_exactly() -> None:
    assert SUBSCRIBE_PAYLOAD == (
        b"subscribe;destination=topic%2Fdomain-events,filter=age%3E%3DN18%3Blast-name%3CTgauf"
    )
    assert encode_command(SUBSCRIBE) == SUBSCRIBE_PAYLOAD
    assert parse_command(SUBSCRIBE_PAYLOAD) == SUBSCRIBE


def test_unsubscribe() -> None:
    assert encode_command(Unsubscribe("topic/a b")) == b"unsubscribe;destination=topic%2Fa%20b"
    assert parse_command(b"unsubscribe;destination=topic%2Fa%20b") == Unsubscribe("topic/a b")


@pytest.mark.parametrize("name", [b"SUBSCRIBE", b"Subscribe", b"sUbScRiBe"])
def test_names_compare_case_insensitively(name: bytes) -> None:
    assert parse_command(name + b";destination=q") == Subscribe("q")
    assert parse_command(b"UnSubscribe;destination=q") == Unsubscribe("q")


def test_names_are_written_lower_case() -> None:
    assert encode_command(Subscribe("q")) == b"subscribe;destination=q"


def test_only_what_is_set_is_written() -> None:
    assert encode_command(Subscribe("q", "", None, None)) == b"subscribe;destination=q"
    assert encode_command(Subscribe("q", group="")) == b"subscribe;destination=q,group="
    assert (
        encode_command(Subscribe("q", "a=1", "g 1", "earliest"))
        == b"subscribe;destination=q,filter=a%3D1,group=g%201,start=earliest"
    )


@pytest.mark.parametrize(
    "command",
    [
        Subscribe("q", group="workers"),
        Subscribe("q", start="earliest"),
        Subscribe("q", start="latest"),
        Subscribe("log/1", "level=Terror", "g,h;i=j%k", "12345"),
        Subscribe("q", group=""),
        Subscribe("ü/§", "name=Tü", "grüppe", "0"),
        Unsubscribe("q,r;s=t%"),
    ],
)
def test_group_and_start_round_trip(command: Subscribe | Unsubscribe) -> None:
    assert parse_command(encode_command(command)) == command


def test_keys_may_come_in_any_order() -> None:
    assert parse_command(b"subscribe;start=earliest,group=g,destination=q") == Subscribe(
        "q", group="g", start="earliest"
    )


NEGATIVE = [
    (b"publish;destination=q", "unknown command 'publish'"),
    (b";destination=q", "unknown command ''"),
    (b"subscribe;destination=q,color=red", "unknown key 'color'"),
    (b"subscribe;Destination=q", "unknown key 'Destination'"),  # keys are case-sensitive
    (b"unsubscribe;destination=q,filter=x", "unknown key 'filter'"),
    (b"subscribe;destination=q,destination=r", "'destination' given twice"),
    (b"subscribe;destination=q,group=a,group=a", "'group' given twice"),
    (b"subscribe", "no destination"),
    (b"subscribe;", "no destination"),
    (b"subscribe;destination=", "no destination"),
    (b"subscribe;group=g", "no destination"),
    (b"unsubscribe", "no destination"),
    (b"subscribe;destination", "is not key=value"),
    (b"subscribe;destination=q,", "is not key=value"),
    (b"subscribe;destination=q%zz", "'%' must start a %XX escape"),
    (b"subscribe;destination=q%4", "'%' must start a %XX escape"),
    (b"subscribe;destination=q,filter=%ff", "not UTF-8"),
    (b"subscribe;destination=\xc3\xbc", "must be ASCII"),
]


@pytest.mark.parametrize(
    ("payload", "match"), NEGATIVE, ids=[n[0].decode("latin-1") for n in NEGATIVE]
)
def test_malformed_commands_are_refused(payload: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        parse_command(payload)


def test_an_unknown_name_is_echoed_short() -> None:
    with pytest.raises(RemoteProtocolError) as caught:
        parse_command(b"x" * 500 + b";destination=q")
    assert len(str(caught.value)) < 80


def test_a_command_needs_a_destination_to_be_sent() -> None:
    with pytest.raises(LocalProtocolError, match="needs a destination"):
        encode_command(Subscribe(""))
    with pytest.raises(LocalProtocolError, match="needs a destination"):
        encode_command(Unsubscribe(""))


TEXT = st.text(st.characters(codec="utf-8"), max_size=20)


@given(TEXT.filter(bool), TEXT, st.none() | TEXT, st.none() | TEXT)
def test_any_subscribe_round_trips(
    destination: str, expression: str, group: str | None, start: str | None
) -> None:
    command = Subscribe(destination, expression, group, start)
    payload = encode_command(command)
    assert payload.isascii()
    assert parse_command(payload) == command
