"""The Micromessage2 server driver: a :class:`~.peer.PeerSession` over :class:`ServerCodec`.

* **Publishing**: MESSAGE frames go to their destination (the listener's
  when they name none), one batch per read, acked once safe (see
  :mod:`.peer`).
* **Subscribing**: ``subscribe`` COMMAND frames add a hub subscription to
  the connection's :class:`~gateway.sdk.Subscriber`, whose one window (the
  negotiated ack window) bounds every subscription together and whose tags
  are the MESSAGE sequence numbers (1..65535, wrapping); the client's
  cumulative acks settle them at the hub, and what it leaves unacked when
  it goes is delivered again (to another member of the group, or to it
  after a reconnect). Without an ack extension, deliveries are acked to the
  hub once written (at most once). A delivery's MESSAGE frame names the
  destination it came from.
"""

from __future__ import annotations

from typing import Any

import trio

from gateway.sdk import (
    Delivery,
    Feed,
    FeedStop,
    Message,
    RemoteProtocolError,
    ServerConnection,
    Source,
    Subscriber,
    UnknownTag,
)

from .codec import Limits, ServerCodec, Settings
from .commands import Subscribe, Unsubscribe
from .events import SEQUENCE, Established, Offered
from .events import Message as Frame
from .filters import parse_filter
from .peer import UNWINDOWED, PeerSession

__all__ = ["ServerSession", "start_position"]


def start_position(text: str | None) -> Any:
    """A ``start=`` value as the hub takes it: ``earliest``, ``latest`` or an offset."""
    if text is None or text in ("earliest", "latest"):
        return text
    if text.isdigit():
        return int(text)
    raise RemoteProtocolError(
        f"subscribe: start {text[:40]!r} is not earliest, latest or an offset"
    )


class ServerSession(PeerSession):
    """One accepted Micromessage2 connection."""

    codec: ServerCodec
    read_while_draining = True  # subscribers still ack what they were delivered

    def __init__(
        self,
        conn: ServerConnection,
        settings: Settings,
        limits: Limits,
        *,
        untyped_as_text: bool = False,
        handshake_timeout: float = 10.0,
        max_answers: int = 1000,
    ) -> None:
        super().__init__(
            conn.stream,
            ServerCodec(settings, limits, clock=trio.current_time),
            log=conn.log,
            shutdown=conn.shutdown,
            max_answers=max_answers,
            ordered=True,
            untyped_as_text=untyped_as_text,
        )
        self.conn = conn
        self.handshake_timeout = handshake_timeout
        #: Subscriptions by destination.
        self.feeds: dict[str, Feed] = {}
        #: Unsubscribed ones whose deliveries the client has yet to ack.
        self.stopped: list[Feed] = []

    def started(self) -> None:
        self.set_deadline(
            trio.current_time() + self.handshake_timeout,
            f"handshake not completed within {self.handshake_timeout:g}s",
        )

    # -- events ---------------------------------------------------------------------------
    async def handle(self, event: Any) -> None:
        if await self.handle_common(event):
            return
        if isinstance(event, Subscribe):
            self._subscribe(event)
        elif isinstance(event, Unsubscribe):
            self._unsubscribe(event)
        elif isinstance(event, Offered):
            self.write(self.codec.send(event.answer))
        elif isinstance(event, Established):
            self._established()

    def _established(self) -> None:
        self.clear_deadline()
        ack = self.codec.negotiated.ack if self.codec.negotiated is not None else None
        self.subscriber = Subscriber(
            self.nursery,
            ack="peer" if ack is not None else "write",
            window=ack.max_count if ack is not None else None,
            space=SEQUENCE,
            progress=self.progress,
        )
        self.windowed()

    # -- receiving --------------------------------------------------------------------------
    def destinations_of(self, frames: tuple[Frame, ...]) -> list[str]:
        default = self.conn.listener.destination
        return [frame.destination or default for frame in frames]

    def source(self) -> Source:
        return self.conn.source()

    def publish(self, messages: list[Message]) -> Any:
        return self.conn.hub.publish(messages)

    # -- subscriptions --------------------------------------------------------------------------
    def _subscribe(self, cmd: Subscribe) -> None:
        if self.conn.shutdown.is_set():
            raise RemoteProtocolError("the gateway is shutting down")
        if cmd.destination in self.feeds:
            raise RemoteProtocolError(f"already subscribed to {cmd.destination!r}")
        subscriber = self.subscriber
        assert subscriber is not None
        try:
            sub = self.conn.hub.subscribe(
                cmd.destination,
                cmd.group,
                max_unacked=subscriber.window or UNWINDOWED,
                start=start_position(cmd.start),
                filter=parse_filter(cmd.filter) if cmd.filter else None,
                positions=False,  # MESSAGE frames carry none
            )
        except (ValueError, LookupError) as e:
            raise RemoteProtocolError(f"cannot subscribe to {cmd.destination!r}: {e}") from None
        self.feeds[cmd.destination] = subscriber.add(
            sub,
            self._deliver,
            ended=self._ended,
            send_many=None if subscriber.ack_on_write else self._deliver_many,
        )

    def _unsubscribe(self, cmd: Unsubscribe) -> None:
        """Stop delivering; what was delivered stays for the client to ack (the
        subscription closes once it has, or when the connection goes)."""
        feed = self.feeds.pop(cmd.destination, None)
        if feed is None:
            raise RemoteProtocolError(f"unsubscribe: not subscribed to {cmd.destination!r}")
        feed.stop()
        self.stopped.append(feed)
        self._close_done()

    def _close_done(self) -> None:
        """Close the unsubscribed feeds whose deliveries are all settled."""
        if self.stopped:
            for feed in [f for f in self.stopped if f.done]:
                self.stopped.remove(feed)
                feed.close()

    async def _deliver(self, tag: int, d: Delivery) -> None:
        """One delivery, without an ack window (acked to the hub once written)."""
        await self.send_messages(None, [d.message])

    async def _deliver_many(self, tags: list[int], deliveries: list[Delivery]) -> None:
        """A batch of deliveries as MESSAGE frames whose sequence numbers are the tags."""
        await self.send_messages(tags, [d.message for d in deliveries])

    async def _ended(self, feed: Feed, why: FeedStop) -> None:
        if why is FeedStop.CLOSED:
            raise trio.ClosedResourceError(f"subscription to {feed.sub.destination!r} closed")

    def peer_acked(self, seq: int, settled: int) -> None:
        if self.subscriber is not None:
            try:
                self.subscriber.ack_through(seq)
            except UnknownTag:
                pass  # its subscription closed: handed back to the hub already
            self._close_done()
