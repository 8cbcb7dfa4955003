"""TEMPLATE: one frame's bytes, to an event and back; no state, no I/O.

A frame here is one line; a binary protocol puts its header structs and
its encoders here instead. Parsing a frame checks everything the frame says
on its own (a :class:`~gateway.core.errors.RemoteProtocolError` names what
is wrong); whether the connection's state allows it is the codec's business
(:mod:`.codec`).
"""

from __future__ import annotations

from gateway.sdk import LocalProtocolError, RemoteProtocolError

from .events import Error, Event, Failed, Ok, Publish

__all__ = ["encode", "parse_client_frame", "parse_server_frame"]


def parse_client_frame(line: bytes) -> Event:
    """The event of one line a client sent (without its newline)."""
    verb, _, rest = line.partition(b" ")
    if verb == b"PUB":
        return Publish(rest)
    raise RemoteProtocolError(f"unknown command {verb[:32]!r}")


def parse_server_frame(line: bytes) -> Event:
    """The event of one line a server sent (without its newline)."""
    verb, _, rest = line.partition(b" ")
    if verb == b"OK" and not rest:
        return Ok()
    if verb in (b"FAIL", b"ERR"):
        try:
            text = rest.decode("utf-8")
        except UnicodeDecodeError:
            raise RemoteProtocolError(f"{verb.decode()} reason is not UTF-8") from None
        return Failed(text) if verb == b"FAIL" else Error(text)
    raise RemoteProtocolError(f"unknown answer {verb[:32]!r}")


def encode(event: Event) -> bytes:
    """The line of ``event``, newline included."""
    if isinstance(event, Publish):
        if b"\n" in event.data:
            raise LocalProtocolError("a published line cannot hold a newline")
        return b"PUB " + event.data + b"\n"
    if isinstance(event, Ok):
        return b"OK\n"
    if isinstance(event, Failed | Error):
        text = event.reason if isinstance(event, Failed) else event.message
        word = b"FAIL " if isinstance(event, Failed) else b"ERR "
        return word + text.replace("\n", " ").encode("utf-8") + b"\n"
    raise LocalProtocolError(f"not an event of this protocol: {event!r}")
