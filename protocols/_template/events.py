"""TEMPLATE: the events of a protocol, one frozen dataclass per kind of frame.

Copy this folder to start a protocol (see ``docs/codecs.md``). Events hold
what a frame says, as bytes and numbers, never a decoded payload: the gateway
passes bodies through untouched. The end of input is the toolkit's
:class:`~gateway.sdk.ConnectionClosed`, shared by every protocol and
re-exported here.

The template's protocol is one line per frame:

* client to server: ``PUB <bytes>`` publishes the bytes (:class:`Publish`);
* server to client: ``OK`` (:class:`Ok`) once the oldest publish is safe,
  ``FAIL <reason>`` (:class:`Failed`) when it was not kept (resend it),
  ``ERR <message>`` (:class:`Error`) before closing on a protocol error.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.sdk import ConnectionClosed

__all__ = ["ConnectionClosed", "Error", "Event", "Failed", "Ok", "Publish"]


class Event:
    """Base of every event of the protocol; never instantiated itself."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Publish(Event):
    """``PUB <data>``: publish ``data`` to the listener's destination."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Ok(Event):
    """``OK``: the oldest publish not yet answered is safe."""


@dataclass(frozen=True, slots=True)
class Failed(Event):
    """``FAIL <reason>``: the oldest publish not yet answered was not kept."""

    reason: str


@dataclass(frozen=True, slots=True)
class Error(Event):
    """``ERR <message>``: the peer broke the protocol; the connection closes after it."""

    message: str
