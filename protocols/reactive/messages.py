"""One reactive-streams protocol message: msgpack bytes to a message and back.

Every message is one msgpack array ``[type, field1, ...]`` with its fields in
a fixed order, every field always present (``docs/protocols/reactive-streams.md``
has the table). Elements and part data are msgpack ``bin``, strings ``str``
(UTF-8), ids and counts unsigned integers. Types 1-14 are the core, 64-127
belong to extensions (keepalive: ping 64, pong 65); any other type, a message
that is not an array, a wrong field count or a field of the wrong type is a
:class:`RemoteProtocolError`. An extension message this connection did not
negotiate is returned as :class:`Unknown` (it is self-delimiting: skipped).

:class:`MessageReader` cuts messages from a byte stream with msgpack's
streaming ``Unpacker``, within :class:`Limits`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from gateway.sdk import RemoteProtocolError

__all__ = [
    "MAX_DEMAND",
    "Cancel",
    "ClientHello",
    "Goodbye",
    "GoodbyeAck",
    "Limits",
    "Message",
    "MessageReader",
    "OnComplete",
    "OnError",
    "OnNext",
    "OnNextLastPart",
    "OnNextPacked",
    "OnNextPart",
    "Ping",
    "Pong",
    "Request",
    "ServerHello",
    "Subscribe",
    "Subscribed",
    "Unknown",
    "bin_header",
    "decode",
    "encode",
    "on_next_packed",
    "on_next_run",
]

#: Demand saturates here: this much outstanding means "unbounded".
MAX_DEMAND: Final = 2**63 - 1
_MAX_U64: Final = 2**64 - 1
MiB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    """What a connection accepts; msgpack checks each length before the bytes arrive."""

    #: Largest message, all bytes (also the largest bin).
    max_message: int = 16 * MiB
    #: Largest string (publisher names, reasons, errors).
    max_str: int = 64 * 1024
    #: Largest element reassembled from parts.
    max_element: int = 16 * MiB
    #: Largest array (a hello's extension list, an extension message's fields).
    max_array: int = 1024


class Message:
    """Base of every protocol message; ``TYPE`` is its number on the wire."""

    __slots__ = ()
    TYPE: int = 0


def _message(type_: int) -> Callable[[type[Any]], type[Any]]:
    def mark(cls: type[Any]) -> type[Any]:
        cls.TYPE = type_
        return cls

    return mark


@_message(1)
@dataclass(frozen=True, slots=True)
class ClientHello(Message):
    """The client's hello: its protocol version and the extension ids it supports."""

    version: int
    extensions: tuple[int, ...]


@_message(2)
@dataclass(frozen=True, slots=True)
class ServerHello(Message):
    """The server's hello: its protocol version and the extension ids it supports."""

    version: int
    extensions: tuple[int, ...]


@_message(3)
@dataclass(frozen=True, slots=True)
class Goodbye(Message):
    """The end of the connection (also the answer to the peer's goodbye)."""

    reason: str


@_message(4)
@dataclass(frozen=True, slots=True)
class GoodbyeAck(Message):
    """An answer to a goodbye (counts as one, like a goodbye)."""

    message: str


@_message(5)
@dataclass(frozen=True, slots=True)
class Subscribe(Message):
    """Subscribe to ``publisher``; ``subscriber`` is the sender's id for it."""

    publisher: str
    subscriber: int
    initial_demand: int


@_message(6)
@dataclass(frozen=True, slots=True)
class Request(Message):
    """More demand for the sender's subscription ``subscriber``."""

    subscriber: int
    demand: int


@_message(7)
@dataclass(frozen=True, slots=True)
class Cancel(Message):
    """The sender cancels its subscription ``subscriber``."""

    subscriber: int


@_message(8)
@dataclass(frozen=True, slots=True)
class Subscribed(Message):
    """The receiver's subscription is accepted; elements are ``element_size`` bytes each
    (0: any size)."""

    subscriber: int
    element_size: int


@_message(9)
@dataclass(frozen=True, slots=True)
class OnNext(Message):
    """One element for the receiver's subscription."""

    subscriber: int
    element: bytes


@_message(10)
@dataclass(frozen=True, slots=True)
class OnComplete(Message):
    """The receiver's subscription ended normally."""

    subscriber: int


@_message(11)
@dataclass(frozen=True, slots=True)
class OnError(Message):
    """The receiver's subscription ended with ``error`` (or was refused)."""

    subscriber: int
    error: str


@_message(12)
@dataclass(frozen=True, slots=True)
class OnNextPacked(Message):
    """``count`` elements of the subscription's ``element_size``, in one bin."""

    subscriber: int
    count: int
    elements: bytes


@_message(13)
@dataclass(frozen=True, slots=True)
class OnNextPart(Message):
    """A part of an element split over several messages (more follow)."""

    subscriber: int
    element_id: int
    data: bytes


@_message(14)
@dataclass(frozen=True, slots=True)
class OnNextLastPart(Message):
    """The last part of a split element."""

    subscriber: int
    element_id: int
    data: bytes


@_message(64)
@dataclass(frozen=True, slots=True)
class Ping(Message):
    """Keepalive (extension 1): answered with a :class:`Pong` of the same payload."""

    payload: bytes


@_message(65)
@dataclass(frozen=True, slots=True)
class Pong(Message):
    """Keepalive (extension 1): the answer to a :class:`Ping`."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class Unknown(Message):
    """An extension message (type 64-127) of an extension not negotiated: skipped."""

    type: int


_U: Final = "uint"
_S: Final = "str"
_B: Final = "bin"
_L: Final = "ids"

#: Each core and known extension type: its class and the kinds of its fields.
SCHEMA: Final[dict[int, tuple[type[Any], tuple[str, ...]]]] = {
    1: (ClientHello, (_U, _L)),
    2: (ServerHello, (_U, _L)),
    3: (Goodbye, (_S,)),
    4: (GoodbyeAck, (_S,)),
    5: (Subscribe, (_S, _U, _U)),
    6: (Request, (_U, _U)),
    7: (Cancel, (_U,)),
    8: (Subscribed, (_U, _U)),
    9: (OnNext, (_U, _B)),
    10: (OnComplete, (_U,)),
    11: (OnError, (_U, _S)),
    12: (OnNextPacked, (_U, _U, _B)),
    13: (OnNextPart, (_U, _U, _B)),
    14: (OnNextLastPart, (_U, _U, _B)),
    64: (Ping, (_B,)),
    65: (Pong, (_B,)),
}

#: Which extension each extension message type belongs to.
EXTENSION_OF: Final = {64: 1, 65: 1}


def encode(message: Message) -> bytes:
    """The msgpack bytes of ``message``."""
    fields: list[Any] = [message.TYPE]
    names: tuple[str, ...] = getattr(type(message), "__slots__", ())
    for name in names:
        value = getattr(message, name)
        fields.append(list(value) if isinstance(value, tuple) else value)
    wire: bytes = msgpack.packb(fields, use_bin_type=True)
    return wire


def bin_header(length: int) -> bytes:
    """The msgpack ``bin`` header of ``length`` bytes (the narrowest, as msgpack packs)."""
    if length < 0x100:
        return b"\xc4" + length.to_bytes(1, "big")
    if length < 0x10000:
        return b"\xc5" + length.to_bytes(2, "big")
    return b"\xc6" + length.to_bytes(4, "big")


def on_next_run(subscriber: int, elements: Sequence[bytes], sizes: list[int]) -> bytes:
    """The ``onNext`` messages of ``elements`` back to back (``sizes``: their lengths),
    byte for byte what :func:`encode` gives each: the header before an element
    depends only on its length, so a run of one size is one ``join``."""
    head = b"\x93\x09" + msgpack.packb(subscriber)
    if sizes.count(sizes[0]) == len(sizes):
        separator = head + bin_header(sizes[0])
        return separator + separator.join(elements)
    headers: dict[int, bytes] = {}
    parts: list[bytes] = []
    for element, size in zip(elements, sizes, strict=True):
        header = headers.get(size)
        if header is None:
            header = headers[size] = head + bin_header(size)
        parts += (header, element)
    return b"".join(parts)


def on_next_packed(subscriber: int, elements: Sequence[bytes], length: int) -> bytes:
    """One ``onNextPacked`` of ``elements`` (``length``: their total bytes), the bin
    built in the same ``join`` as the header rather than copied into it."""
    head = msgpack.packb([12, subscriber, len(elements)])
    head = b"\x94" + head[1:] + bin_header(length)
    return b"".join([head, *elements])


def _check(kind: str, value: Any) -> Any:
    if kind == _U:
        if type(value) is not int or not 0 <= value <= _MAX_U64:
            raise RemoteProtocolError(f"expected an unsigned integer, got {value!r:.40}")
        return value
    if kind == _S:
        if type(value) is not str:
            raise RemoteProtocolError(f"expected a string, got {type(value).__name__}")
        return value
    if kind == _B:
        if type(value) is not bytes:
            raise RemoteProtocolError(f"expected bin, got {type(value).__name__}")
        return value
    if type(value) is not list:
        raise RemoteProtocolError(f"expected an array of ids, got {type(value).__name__}")
    return tuple(_check(_U, v) for v in value)


def decode(obj: Any, negotiated: frozenset[int] = frozenset()) -> Message:
    """The message a decoded msgpack object is; ``negotiated``: the extension ids whose
    messages are parsed (the others are :class:`Unknown`)."""
    if type(obj) is not list or not obj or type(obj[0]) is not int:
        raise RemoteProtocolError("a message is an array starting with its type")
    type_ = obj[0]
    if 64 <= type_ <= 127 and EXTENSION_OF.get(type_) not in negotiated:
        return Unknown(type_)
    entry = SCHEMA.get(type_)
    if entry is None:
        raise RemoteProtocolError(f"unknown message type {type_}")
    cls, kinds = entry
    if len(obj) != len(kinds) + 1:
        raise RemoteProtocolError(
            f"message type {type_} has {len(kinds)} fields, not {len(obj) - 1}"
        )
    try:
        message: Message = cls(*(_check(k, v) for k, v in zip(kinds, obj[1:], strict=True)))
    except RemoteProtocolError as e:
        raise RemoteProtocolError(f"message type {type_}: {e}") from None
    return message


class MessageReader:
    """Cuts messages from received bytes with msgpack's streaming ``Unpacker``.

    ``feed`` takes the bytes; ``next`` gives the next whole msgpack object, or None
    until more arrive. No more than ``limits.max_message`` bytes are buffered:
    the rest waits in ``pending`` until the unpacker has room.
    """

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._unpacker = msgpack.Unpacker(
            raw=False,
            use_list=True,
            strict_map_key=False,
            max_buffer_size=limits.max_message,
            max_bin_len=limits.max_message,
            max_str_len=limits.max_str,
            max_array_len=limits.max_array,
            max_map_len=limits.max_array,
            max_ext_len=limits.max_message,
        )
        self._fed = 0
        self.pending = bytearray()

    @property
    def held(self) -> int:
        """Bytes received and not yet returned as a message."""
        return self._fed - self._unpacker.tell() + len(self.pending)

    @property
    def partial(self) -> bool:
        """Whether a message has begun and not ended."""
        return self._fed > self._unpacker.tell()

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        self.pending += data

    def next(self) -> Any | None:
        """The next msgpack object, or None (more bytes needed)."""
        while True:
            try:
                return self._unpacker.unpack()
            except msgpack.OutOfData:
                if not self._refill():
                    return None
            except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as e:
                # FormatError, StackError, limits exceeded, bad UTF-8, unhashable map keys.
                raise RemoteProtocolError(f"not msgpack: {e}") from None

    def _refill(self) -> bool:
        room = self.limits.max_message - (self._fed - self._unpacker.tell())
        if not self.pending:
            return False
        if room <= 0:
            raise RemoteProtocolError(f"a message longer than {self.limits.max_message} bytes")
        chunk = bytes(self.pending[:room])
        del self.pending[:room]
        self._unpacker.feed(chunk)
        self._fed += len(chunk)
        return True

    def drop(self) -> None:
        """Forget everything held (the connection ended or failed)."""
        self.pending = bytearray()
        self._unpacker = msgpack.Unpacker()
        self._fed = 0
