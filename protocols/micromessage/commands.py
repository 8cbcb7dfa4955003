"""Micromessage2 COMMAND frames: ``subscribe`` and ``unsubscribe``, parsed and written.

A COMMAND's payload is ASCII text ``name;key=value,key=value`` with every
value URL-encoded (the draft's COMMAND grammar; the draft defines no
command, so these two are ours, valid once ``pubsub`` was negotiated)::

    subscribe;destination=<enc>[,filter=<enc(expression)>][,group=<enc>][,start=<enc>]
    unsubscribe;destination=<enc>

* ``destination``: the queue or topic to receive from (required);
* ``filter``: a filter expression (:mod:`.filters`), URL-encoded once more
  as a whole; absent or empty: every message;
* ``group``: a named, resumable subscription: the members of one group
  share its messages, and it keeps collecting while none is connected
  (absent: a subscription of its own, gone when the connection goes);
* ``start``: for log and durable destinations, where a new group starts:
  ``earliest``, ``latest`` (the default) or an offset.

Command names compare case-insensitively and are written lower-case; keys
are case-sensitive; an unknown key or command, a key given twice, or a
missing destination is a :class:`RemoteProtocolError`. No reply frame
exists: success is silent, failure is an ERROR frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final
from urllib.parse import quote

from gateway.sdk import LocalProtocolError, RemoteProtocolError

from .filters import decode_text

__all__ = ["Subscribe", "Unsubscribe", "encode_command", "parse_command"]

_KEYS: Final = {
    "subscribe": ("destination", "filter", "group", "start"),
    "unsubscribe": ("destination",),
}
_ECHO: Final = 40


@dataclass(frozen=True, slots=True)
class Subscribe:
    """``subscribe``: deliver ``destination``'s messages that match ``filter``."""

    destination: str
    #: The filter expression, outer encoding removed ("" : every message).
    filter: str = ""
    group: str | None = None
    #: ``earliest``, ``latest`` or an offset (as text); None: the destination's default.
    start: str | None = None


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """``unsubscribe``: stop delivering ``destination``; what was delivered is still acked."""

    destination: str


Command = Subscribe | Unsubscribe


def _echo(text: str) -> str:
    return repr(text if len(text) <= _ECHO else text[: _ECHO - 3] + "...")


def _pairs(name: str, text: str) -> dict[str, str]:
    """``key=value,...`` of command ``name``, values decoded, keys checked."""
    allowed = _KEYS[name]
    out: dict[str, str] = {}
    for pair in text.split(",") if text else ():
        key, eq, value = pair.partition("=")
        if not eq:
            raise RemoteProtocolError(f"{name} command: {_echo(pair)} is not key=value")
        if key not in allowed:
            raise RemoteProtocolError(
                f"{name} command: unknown key {_echo(key)} (known: {', '.join(allowed)})"
            )
        if key in out:
            raise RemoteProtocolError(f"{name} command: {key!r} given twice")
        out[key] = decode_text(value, f"{name} command: {key}")
    if not out.get("destination"):
        raise RemoteProtocolError(f"{name} command: no destination")
    return out


def parse_command(payload: bytes) -> Command:
    """The command a COMMAND frame's payload states (RemoteProtocolError if malformed)."""
    try:
        text = payload.decode("ascii")
    except UnicodeDecodeError:
        raise RemoteProtocolError("a COMMAND frame's text must be ASCII") from None
    raw_name, _, rest = text.partition(";")
    name = raw_name.lower()
    if name not in _KEYS:
        raise RemoteProtocolError(f"unknown command {_echo(raw_name)}")
    pairs = _pairs(name, rest)
    if name == "unsubscribe":
        return Unsubscribe(pairs["destination"])
    return Subscribe(
        pairs["destination"], pairs.get("filter", ""), pairs.get("group"), pairs.get("start")
    )


def encode_command(command: Command) -> bytes:
    """The payload of a COMMAND frame for ``command`` (values URL-encoded)."""
    if not command.destination:
        raise LocalProtocolError("a command needs a destination")
    pairs = [("destination", command.destination)]
    if isinstance(command, Subscribe):
        name = "subscribe"
        for key, value in (
            ("filter", command.filter or None),
            ("group", command.group),
            ("start", command.start),
        ):
            if value is not None:
                pairs.append((key, value))
    else:
        name = "unsubscribe"
    body = ",".join(f"{key}={quote(value, safe='')}" for key, value in pairs)
    return f"{name};{body}".encode("ascii")
