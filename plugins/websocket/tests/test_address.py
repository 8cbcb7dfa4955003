"""Addresses: what ``check_address`` (so ``gateway check``) accepts and refuses, in its words."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from interchange_websocket.address import DEFAULT_MAX_MESSAGE, WsAddress, parse_ws_address
from interchange_websocket.transport import WebSocketTransport

from gateway.sdk import RemoteProtocolError


def test_a_full_address() -> None:
    address = parse_ws_address(
        "WSS://[::1]:8443/rs?subprotocol=rs.msgpack&subprotocol=rs.v0"
        "&origin=https://App.example&origin=http://localhost:8000&max_message=4096"
    )
    assert address == WsAddress(
        secure=True,
        host="::1",
        port=8443,
        path="/rs",
        subprotocols=("rs.msgpack", "rs.v0"),
        origins=("https://app.example", "http://localhost:8000"),
        max_message=4096,
    )
    assert address.host_header == "[::1]:8443"


def test_defaults() -> None:
    address = parse_ws_address("ws://gw.example:80")
    assert (address.path, address.subprotocols, address.origins) == ("/", (), ())
    assert address.max_message == DEFAULT_MAX_MESSAGE == 1 << 20
    assert not address.secure


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("ws://h/p", "needs a port"),
        ("ws://:80/p", "needs a host"),
        ("ws://h:99999/p", "websocket addresses look like ws://HOST:PORT/PATH"),
        ("ws://user@h:1/", "no user name or password"),
        ("ws://h:1/#x", "no #fragment"),
        ("ws://h:1/?colour=red", "unknown websocket address option 'colour'"),
        ("ws://h:1/?subprotocol=a b", "subprotocol must be a token"),
        ("ws://h:1/?subprotocol=", "subprotocol must be a token"),
        ("ws://h:1/?origin=example.com", "origin must be SCHEME://HOST[:PORT]"),
        ("ws://h:1/?origin=https://a.example/path", "origin must be SCHEME://HOST[:PORT]"),
        ("ws://h:1/?max_message=0", "max_message must be a number of bytes 1..67108864, not '0'"),
        ("ws://h:1/?max_message=1k", "max_message must be a number of bytes"),
        ("ws://h:1/?max_message=1&max_message=2", "max_message is given more than once"),
        ("ws://h:1/?novalue", "a websocket address query is KEY=VALUE"),
        ("http://h:1/", "websocket addresses look like"),
    ],
)
def test_bad_addresses_are_refused_naming_the_problem(address: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("?", r"\?").replace("[", r"\[")):
        WebSocketTransport().check_address(address)


def test_the_transport_claims_ws_and_wss() -> None:
    transport = WebSocketTransport()
    assert transport.claims("ws://h:1/")
    assert transport.claims("WSS://h:1/")
    assert not transport.claims("h:1")
    assert transport.handshakes
    assert transport.server_name("wss://gw.example:443/x?origin=https://a.example") == "gw.example"


async def test_wss_without_tls_and_ws_with_tls_fail_naming_the_mistake() -> None:
    transport = WebSocketTransport()
    ours, _ = trio.testing.memory_stream_pair()
    with pytest.raises(RemoteProtocolError, match="wss:// needs a tls table on the upstream"):
        await transport.connected(ours, "wss://h:1/")
    with pytest.raises(RemoteProtocolError, match="wss:// needs a tls table on the listener"):
        await transport.accepted(ours, "wss://h:1/")
