"""What both Micromessage2 drivers share: a :class:`~gateway.sdk.Session` on either codec.

Both roles receive MESSAGE frames and hand them to the hub, and both send
MESSAGE frames within the ack window, so the rules live here once:

* **receiving** (:meth:`PeerSession.hand_off`): the MESSAGE frames of one
  read (one :class:`~.events.Messages` event) are published as one batch;
  once its receipt settles, one cumulative ack (the batch's last sequence
  number) answers them all, in order with the batches before. A failed
  batch is not acked: the codec forgets it (``rewind``), so the peer's
  resends after the expiry are published again and no later ack covers it
  meanwhile. A rejected message gets an ERROR frame naming its sequence
  number and the reason, then the connection closes;
* **duplicates**: a resend of a batch already acked is acked again at once
  and dropped; one whose ack is still coming is dropped;
* **sending** (:meth:`PeerSession.send_messages`): a batch of MESSAGE
  frames takes its places in the window (it waits for room) and goes out in
  one write; a ``dotnet`` type frame goes before a message whose type
  differs from the last one sent; frames not acked within the expiry are sent again
  (same bytes) by one task;
* **the peer's acks** settle our outstanding frames; an ack for nothing
  outstanding is ignored and logged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import itemgetter
from typing import Any

import trio

from gateway.sdk import (
    Message,
    NotKept,
    Outcome,
    Receipt,
    RemoteProtocolError,
    Session,
    Source,
)

from .codec import ClientCodec, ServerCodec
from .events import Ack, Duplicate, Error, Extension, Messages, TypeName
from .events import Message as Frame
from .properties import format_properties, parse_properties

#: A MESSAGE frame's properties and payload (fields 2 and 3 of the named tuple).
_PROPERTIES = itemgetter(2)
_PAYLOAD = itemgetter(3)

__all__ = ["JSON", "TYPE_HEADER", "PeerError", "PeerSession"]

#: The header that carries a ``dotnet`` type name (what the type frames say).
TYPE_HEADER = "dotnet-type"
#: The content type of payloads on a connection that negotiated ``json``.
JSON = "application/json"
#: The headers of a message without properties (shared: headers are read-only).
NO_HEADERS: Mapping[str, str] = Message._field_defaults["headers"]
#: MESSAGE frames sent per batch when no ack window bounds them.
UNWINDOWED = 1000


class PeerError(RemoteProtocolError):
    """The peer sent an ERROR frame: it is closing; we send none back."""


class Rejected(NotKept):
    """A message we received was rejected by the hub: the ERROR frame went out; close."""


class PeerSession(Session):
    """A Micromessage2 connection in either role (see the module docstring)."""

    codec: ServerCodec | ClientCodec

    def __init__(self, *args: Any, untyped_as_text: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.untyped_as_text = untyped_as_text
        #: The type the peer's ``dotnet`` frames named last, and the one we sent last.
        self.type_in: str | None = None
        self.type_out: str | None = None
        #: EXTENSION frames of extensions not negotiated, skipped by their length.
        self.skipped = 0
        #: Senders waiting for their turn (room in the window, their sequence number).
        self._turn = trio.lowlevel.ParkingLot()

    # -- what a role says --------------------------------------------------------------------
    def destinations_of(self, frames: tuple[Frame, ...]) -> list[str]:
        """The local destination of each received MESSAGE."""
        raise NotImplementedError

    def source(self) -> Source:
        raise NotImplementedError

    def peer_acked(self, seq: int, settled: int) -> None:
        """The peer acked our MESSAGE frames up to ``seq`` (``settled`` of them)."""

    # -- events both roles handle ----------------------------------------------------------
    async def handle_common(self, event: Any) -> bool:
        """Handle ``event`` if both roles treat it alike; whether it was one of those."""
        if type(event) is Messages:
            await self.hand_off(event.frames)
        elif isinstance(event, Ack):
            if not event.settled:
                self.log.info("ack for MESSAGE %d, which is not outstanding: ignored", event.seq)
            else:
                self._wake()
                self.peer_acked(event.seq, event.settled)
        elif isinstance(event, Duplicate):
            self.write(self.codec.reack(event))
        elif isinstance(event, TypeName):
            self.type_in = event.name
        elif isinstance(event, Extension):
            self.skipped += 1
        elif isinstance(event, Error):
            raise PeerError(f"the peer sent an ERROR frame: {event.message}")
        else:
            return False
        return True

    def error_reply(self, error: RemoteProtocolError) -> bytes | None:
        if isinstance(error, PeerError):
            return None
        return self.codec.send(Error(str(error)))

    def windowed(self) -> None:
        """The handshake is done: start resending if an ack window was negotiated."""
        if self.codec.send_window is not None:
            self.nursery.start_soon(self._resend)

    # -- receiving ---------------------------------------------------------------------------
    def to_messages(self, frames: tuple[Frame, ...]) -> list[Message]:
        """The hub messages received MESSAGE frames stand for (one source for the batch)."""
        source = self.source()
        content_type = JSON if self.codec.has("json") else None
        type_in = self.type_in
        untyped = self.untyped_as_text
        destinations = self.destinations_of(frames)
        new = tuple.__new__
        if type_in is None and not any(map(_PROPERTIES, frames)):
            # The usual batch: no properties, so no headers; made in one pass.
            parts = zip(
                destinations,
                map(_PAYLOAD, frames),
                repeat(NO_HEADERS),
                repeat(content_type),
                repeat(source),
            )
            return list(map(new, repeat(Message), parts))
        out = []
        for frame, destination in zip(frames, destinations, strict=True):
            headers: Mapping[str, str] = NO_HEADERS
            if frame.properties or type_in is not None:
                headers = parse_properties(frame.properties, untyped_as_text=untyped)
                if type_in is not None:
                    headers[TYPE_HEADER] = type_in
            out.append(new(Message, (destination, frame.payload, headers, content_type, source)))
        return out

    async def hand_off(self, frames: tuple[Frame, ...]) -> None:
        """Publish one batch; ack it once safe (see the module docstring)."""
        messages = self.to_messages(frames)
        if self.shutdown is not None and self.shutdown.is_set():
            self.codec.rewind(frames[0].seq)  # not taken: resent on the next connection
            return
        publish = self.publish
        await self.submit(lambda: publish(messages), lambda r: self._answer(r, frames))

    def publish(self, messages: list[Message]) -> Any:
        """The hub's publish (an awaitable of a receipt)."""
        raise NotImplementedError

    def _answer(self, receipt: Receipt, frames: tuple[Frame, ...]) -> bytes:
        codec = self.codec
        first, last = frames[0].seq, frames[-1].seq
        if receipt.outcome is Outcome.DELIVERED:
            return codec.send(Ack(last)) if codec.receive_window is not None else b""
        if receipt.outcome is Outcome.REJECTED:
            index, reason = _rejected(receipt)
            text = f"MESSAGE {frames[index].seq} rejected: {reason}"
            self.write(codec.send(Error(text)))
            raise Rejected(text)
        codec.rewind(first)
        self.log.warning(
            "MESSAGE %d..%d not kept (%s): not acked, the peer resends them",
            first,
            last,
            receipt.reason or "failed",
        )
        return b""

    # -- sending -----------------------------------------------------------------------------
    async def send_messages(self, seqs: list[int] | None, messages: Sequence[Message]) -> None:
        """Send ``messages`` as MESSAGE frames numbered ``seqs`` (a subscriber's tags; None:
        the codec's next ones), in one write, once it is their turn and the window has
        room for all of them.

        Frames go out in sequence order whatever order tasks wake in (cumulative acks
        need it): numbered ones wait until the first is the codec's next.
        """
        await self._turn_for(seqs[0] if seqs else None, len(messages))
        codec = self.codec
        out: list[bytes] = []
        items: list[tuple[str, str, bytes]] = []
        dotnet = codec.has("dotnet")
        for m in messages:
            headers = m.headers
            props = ""
            if headers:
                kind = headers.get(TYPE_HEADER)
                if dotnet and kind is not None and kind != self.type_out:
                    out.append(codec.send_bodies(items))
                    items = []
                    self.type_out = kind
                    out.append(codec.send(TypeName(kind)))
                props = format_properties(headers)
            items.append((m.destination, props, m.body))
        out.append(codec.send_bodies(items))
        self.write_now(b"".join(out))  # a whole batch: one system call, no task switch
        self._wake()

    async def wait_window(self) -> int:
        """Wait until the ack window has room; how many MESSAGE frames fit (no window:
        :data:`UNWINDOWED`)."""
        codec = self.codec
        while codec.window_room == 0:
            await self._turn.park()
        room = codec.window_room
        return UNWINDOWED if room is None else room

    async def _turn_for(self, seq: int | None, count: int) -> None:
        """Wait until the window has room for ``count``, ``seq`` (if given) is the next to
        send, and the output is under its high water; no await may follow before the
        write."""
        codec = self.codec
        while True:
            room = codec.window_room
            if (room is not None and room < count) or (seq is not None and codec.next_seq != seq):
                await self._turn.park()
            elif not self.has_room:
                await self.wait_for_room()
            else:
                return

    def _wake(self) -> None:
        if self._turn:
            self._turn.unpark_all()

    async def _resend(self) -> None:
        """Send again what the peer did not ack within the expiry."""
        codec = self.codec
        while True:
            due = codec.next_due
            if due is None:
                await self._turn.park()  # woken by each send
                continue
            await trio.sleep_until(due)
            wire = codec.due()
            if wire:
                self.write(wire)


def _rejected(receipt: Receipt) -> tuple[int, str]:
    """The index and reason of the first rejected message of a publish."""
    for i, result in enumerate(receipt.results()):
        if result.outcome is Outcome.REJECTED:
            return i, result.reason or "rejected"
    return 0, receipt.reason or "rejected"
