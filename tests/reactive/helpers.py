"""Two reactive-streams connections wired to each other, for the tests."""

from __future__ import annotations

from typing import Any

from gateway.sdk import NEED_DATA
from protocols.reactive import Connection, Role
from protocols.reactive.messages import Message, encode


def drain(conn: Connection) -> list[Any]:
    """Every event the connection makes of what it holds."""
    events: list[Any] = []
    while (event := conn.next_event()) is not NEED_DATA:
        events.append(event)
        if type(event).__name__ == "ConnectionClosed":
            break
    return events


def feed(conn: Connection, *messages: Message | bytes) -> list[Any]:
    """Feed raw messages (or bytes) to ``conn``; its events."""
    data = b"".join(m if isinstance(m, bytes) else encode(m) for m in messages)
    if data:  # b"" would mean the end of input
        conn.receive_data(data)
    return drain(conn)


def pair() -> tuple[Connection, Connection]:
    """A client and a server past their hellos."""
    client, server = Connection(Role.CLIENT), Connection(Role.SERVER)
    server.receive_data(client.hello())
    client.receive_data(server.hello())
    drain(server)
    drain(client)
    return client, server


def subscribed(element_size: int = 0, demand: int = 0) -> tuple[Connection, Connection]:
    """A pair where the client's subscription 1 was accepted with ``demand``."""
    client, server = pair()
    server.receive_data(client.send(_subscribe(demand)))
    drain(server)
    client.receive_data(server.send(_subscribed(element_size)))
    drain(client)
    return client, server


def _subscribe(demand: int) -> Message:
    from protocols.reactive import Subscribe

    return Subscribe("pub", 1, demand)


def _subscribed(size: int) -> Message:
    from protocols.reactive import Subscribed

    return Subscribed(1, size)
