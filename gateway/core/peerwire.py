"""The link between two workers, as bytes: a sans-IO framing, no sockets here.

Workers of one gateway forward in-memory topic messages to each other
(:mod:`gateway.core.peers`). One link carries one direction of traffic: the
worker that dialled sends batches, the worker that accepted answers each
batch with its outcome and announces which topics it has subscribers for.

A frame is a 4-byte big-endian length, then one msgpack array whose first
item says what it is:

======================================  ==============================================
``[0, version, worker]``                 hello: the first frame each way
``[1, added, removed]``                  interest: topic names gained and lost
``[2, batch, destination, messages]``    a batch of one publish run for ``destination``
``[3, batch, failures]``                 the answer: the batch's messages not delivered
======================================  ==============================================

A message is its body alone (``bin``) when it has no headers, content type
or source, else ``[body, headers, content_type, source]`` with ``source`` as
``[protocol, listener, peer, received_at, upstream]`` or nil. A failure is
``[index, outcome, reason, reason_code]``; an answer without failures says
every message was delivered.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from gateway.core.model import Message, Outcome, Source
from gateway.core.reasons import Reason

__all__ = [
    "VERSION",
    "Answer",
    "Batch",
    "Failure",
    "Frame",
    "Hello",
    "Interest",
    "PeerWire",
    "WireError",
]

#: The framing's version, sent in the hello.
VERSION = 1
_LENGTH = struct.Struct(">I")
_HELLO, _INTEREST, _BATCH, _ANSWER = range(4)


class WireError(ValueError):
    """The peer sent something that is no frame of this link."""


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    #: The sending worker's index.
    worker: int


@dataclass(frozen=True, slots=True)
class Interest:
    #: Topics that gained their first local group, and those that lost their last.
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Batch:
    batch: int
    destination: str
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class Failure:
    """One message of a batch that was not delivered, and why."""

    index: int
    outcome: Outcome
    reason: str
    reason_code: Reason


@dataclass(frozen=True, slots=True)
class Answer:
    batch: int
    failures: tuple[Failure, ...] = ()


Frame = Hello | Interest | Batch | Answer


class PeerWire:
    """Encodes frames to bytes and decodes bytes, fed in any pieces, to frames."""

    def __init__(self, max_frame: int = 256 * 1024 * 1024) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()

    # -- sending ----------------------------------------------------------------
    def encode(self, frame: Frame) -> bytes:
        """The bytes of ``frame``, length prefix included."""
        payload = msgpack.packb(_to_wire(frame), use_bin_type=True)
        return _LENGTH.pack(len(payload)) + payload

    # -- receiving --------------------------------------------------------------
    def receive_data(self, data: bytes | bytearray) -> list[Frame]:
        """Take ``data`` and return the frames it completed (none: wait for more)."""
        buffer = self._buffer
        buffer += data
        frames: list[Frame] = []
        start = 0
        while len(buffer) - start >= _LENGTH.size:
            (size,) = _LENGTH.unpack_from(buffer, start)
            if size > self.max_frame:
                raise WireError(f"frame of {size} bytes exceeds the bound of {self.max_frame}")
            end = start + _LENGTH.size + size
            if len(buffer) < end:
                break
            frames.append(_decode(bytes(buffer[start + _LENGTH.size : end])))
            start = end
        del buffer[:start]
        return frames

    @property
    def pending(self) -> int:
        """Bytes received that do not make a whole frame yet."""
        return len(self._buffer)


def _to_wire(frame: Frame) -> list[Any]:
    if isinstance(frame, Batch):
        return [_BATCH, frame.batch, frame.destination, [_message(m) for m in frame.messages]]
    if isinstance(frame, Answer):
        failures = [
            [f.index, int(f.outcome), f.reason, f.reason_code.value] for f in frame.failures
        ]
        return [_ANSWER, frame.batch, failures]
    if isinstance(frame, Interest):
        return [_INTEREST, list(frame.added), list(frame.removed)]
    return [_HELLO, frame.version, frame.worker]


def _message(m: Message) -> bytes | list[Any]:
    if not m.headers and m.content_type is None and m.source is None:
        return m.body
    source = None
    if m.source is not None:
        s = m.source
        source = [s.protocol, s.listener, s.peer, s.received_at, s.upstream]
    return [m.body, dict(m.headers) if m.headers else None, m.content_type, source]


def _decode(payload: bytes) -> Frame:
    try:
        item = msgpack.unpackb(payload, raw=False, use_list=True, strict_map_key=True)
        kind = item[0]
        if kind == _BATCH:
            _, batch, destination, messages = item
            return Batch(int(batch), str(destination), _messages(str(destination), messages))
        if kind == _ANSWER:
            _, batch, failures = item
            return Answer(int(batch), tuple(_failure(f) for f in failures))
        if kind == _INTEREST:
            _, added, removed = item
            return Interest(tuple(map(str, added)), tuple(map(str, removed)))
        if kind == _HELLO:
            _, version, worker = item
            return Hello(int(version), int(worker))
    except (ValueError, TypeError, IndexError, KeyError, msgpack.UnpackException) as e:
        raise WireError(f"not a frame: {e}") from None
    raise WireError(f"unknown frame type {kind!r}")


def _messages(destination: str, items: Sequence[Any]) -> tuple[Message, ...]:
    out = []
    for item in items:
        if isinstance(item, bytes):
            out.append(Message(destination, item))
            continue
        body, headers, content_type, source = item
        out.append(
            Message(
                destination,
                bytes(body),
                headers or Message._field_defaults["headers"],
                content_type,
                _source(source) if source is not None else None,
            )
        )
    return tuple(out)


def _source(item: Sequence[Any]) -> Source:
    protocol, listener, peer, received_at, upstream = item
    return Source(protocol, listener, peer, received_at=float(received_at), upstream=str(upstream))


def _failure(item: Sequence[Any]) -> Failure:
    index, outcome, reason, code = item
    return Failure(int(index), Outcome(outcome), str(reason), Reason(code))
