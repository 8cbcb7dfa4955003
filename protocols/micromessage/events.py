"""The Micromessage2 frames, as frozen dataclasses, and the frame layer's constants.

Every frame after the handshake starts with one flags byte. Its low three
bits give the kind (none: MESSAGE, 1: COMMAND, 2: EXTENSION, 4: ERROR; at
most one of them), 8 (LARGE_PAYLOAD) makes the payload length 4 bytes
instead of 1, and 16 (CONTINUED) says more fragments of the same payload
follow. The dataclasses hold a whole frame: fragments are joined by the
decoder and cut by the encoder, so nothing above the frame layer sees them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NamedTuple

from gateway.sdk import SerialSpace

if TYPE_CHECKING:
    from .handshake import Agreement, Handshake

__all__ = [
    "FLAG_NAMES",
    "MAX_FRAGMENT",
    "MAX_HEADER",
    "MAX_PAYLOAD",
    "MAX_SMALL_LENGTH",
    "RESERVED_BITS",
    "SEQUENCE",
    "TYPE_BITS",
    "Ack",
    "Answered",
    "Command",
    "Duplicate",
    "Error",
    "Established",
    "Extension",
    "Flags",
    "Frame",
    "Message",
    "Messages",
    "Offered",
    "TypeName",
]


class Flags(enum.IntFlag):
    """The bits of a frame's first byte."""

    COMMAND = 0x01
    EXTENSION = 0x02
    ERROR = 0x04
    LARGE_PAYLOAD = 0x08
    CONTINUED = 0x10


#: The bits naming the frame's kind; none set is a MESSAGE.
TYPE_BITS: Final = Flags.COMMAND | Flags.EXTENSION | Flags.ERROR
#: Bits no version defines: a frame carrying one is rejected.
RESERVED_BITS: Final = 0xE0
#: The longest payload a 1-byte length holds; LARGE_PAYLOAD is set iff longer.
MAX_SMALL_LENGTH: Final = 255
#: The largest payload of one frame; longer payloads go out as CONTINUED fragments.
MAX_FRAGMENT: Final = 1 << 20
#: The default cap on a payload joined from CONTINUED fragments.
MAX_PAYLOAD: Final = 16 << 20
#: The longest header: flags, seq, destination (255), properties (65535), 4-byte length.
MAX_HEADER: Final = 1 + 2 + 1 + 255 + 2 + 65535 + 4
#: Sequence numbers of MESSAGE frames: 1..65535, 65535 followed by 1 (0 is never sent).
SEQUENCE: Final = SerialSpace(first=1, size=65535)
#: Names of the kinds, for error messages.
FLAG_NAMES: Final = {0: "MESSAGE", 1: "COMMAND", 2: "EXTENSION", 4: "ERROR"}


class Message(NamedTuple):
    """A MESSAGE frame: sent both ways, counted by the ack window.

    ``destination`` (at most 255 ASCII bytes) names a queue or topic;
    ``properties`` is the raw ASCII ``key:value;`` list (at most 65535
    bytes), parsed by the codec; ``seq`` is in :data:`SEQUENCE`. A named
    tuple rather than a dataclass, as the core's ``Message`` is: immutable
    too, and several times cheaper to make, which counts at wire speed.
    """

    seq: int
    destination: str = ""
    properties: str = ""
    payload: bytes = b""


@dataclass(frozen=True, slots=True)
class Command:
    """A COMMAND frame: ``name;key=value,...`` text such as ``subscribe;...``."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Extension:
    """An EXTENSION frame for the negotiated extension ``ext_id`` (1-based, 1..255).

    Its payload's layout belongs to the extension (an ack's is a 2-byte
    sequence number); the frame layer only frames it by its length.
    """

    ext_id: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Error:
    """An ERROR frame: a UTF-8 text, after which the sender disconnects."""

    message: str


#: Any frame.
Frame = Message | Command | Extension | Error


# -- what the codecs return beyond frames --------------------------------------------------
@dataclass(frozen=True, slots=True)
class Offered:
    """Server: the client's first handshake message arrived; ``answer`` is the codec's
    answer to it, which the driver sends (``codec.send(event.answer)``)."""

    offer: Handshake
    answer: Handshake


@dataclass(frozen=True, slots=True)
class Answered:
    """Client: the server answered; ``final`` is the codec's final message, which the
    driver sends (``codec.send(event.final)``)."""

    answer: Handshake
    final: Handshake


@dataclass(frozen=True, slots=True)
class Established:
    """The handshake is complete: frames flow, with these extensions."""

    agreement: Agreement


@dataclass(frozen=True, slots=True)
class Messages:
    """New MESSAGE frames, in sequence order: all the codec had whole at once (one read's
    worth), so a receiver hands them off as one batch and acks the last once safe."""

    frames: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A MESSAGE the codec had already returned came again (the peer resent it): it is
    dropped. ``acked``: we had acked it, so the driver acks ``ack`` again at once (our ack
    was lost or late); otherwise its ack is still to come."""

    seq: int
    acked: bool
    ack: int


@dataclass(frozen=True, slots=True)
class Ack:
    """An ack extension frame: every MESSAGE up to ``seq`` (in send order) was handed off.

    Received: ``settled`` is how many of our outstanding MESSAGE frames it settled
    (0: it acknowledged none outstanding, and was ignored). Sent: ``settled`` is unused."""

    seq: int
    settled: int = 0


@dataclass(frozen=True, slots=True)
class TypeName:
    """A ``dotnet`` extension frame: the type of the MESSAGE payloads that follow (sent
    only when it changes)."""

    name: str
