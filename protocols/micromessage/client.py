"""The Micromessage2 client driver: the gateway as a client of a Micromessage2 server.

One :class:`ClientSession` per connection of an upstream:

* **egress**: messages routed to ``upstream:NAME`` are sent as MESSAGE
  frames, as many as the ack window allows (each read of the hub's
  subscription goes out as one write); the server's cumulative ack settles
  them at the hub, in order. What is unacked when the connection is lost
  goes back to the upstream's queue and is sent again after reconnecting
  (at least once). Without an ack window (the server agreed to none) a
  message is acked to the hub once written;
* **ingress**: each configured subscription is a ``subscribe`` COMMAND
  (``pubsub`` must be agreed); what the server delivers is published into
  the subscription's local destination, one batch per read, and acked to
  the server only once the local receipt settled (:mod:`.peer`), so a full
  local destination slows the server's deliveries down to its window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from gateway.sdk import (
    HubFacade,
    Message,
    RemoteProtocolError,
    Source,
    Subscription,
)

from .codec import ClientCodec, Limits, Settings
from .commands import Subscribe
from .events import Answered, Established
from .events import Message as Frame
from .peer import PeerSession

__all__ = ["ClientSession", "RemoteSubscription"]


@dataclass(frozen=True, slots=True)
class RemoteSubscription:
    """A subscription to the server's ``destination``, published locally into ``into``."""

    destination: str
    into: str
    filter: str = ""
    group: str | None = None
    start: str | None = None

    def command(self) -> Subscribe:
        return Subscribe(self.destination, self.filter, self.group, self.start)


class ClientSession(PeerSession):
    """One connection to a Micromessage2 server (see the module docstring)."""

    codec: ClientCodec

    def __init__(
        self,
        stream: trio.abc.Stream,
        hub: HubFacade,
        source: Callable[[], Source],
        *,
        settings: Settings,
        limits: Limits | None = None,
        egress: Subscription | None = None,
        rename: str = "",
        subscriptions: Sequence[RemoteSubscription] = (),
        handshake_timeout: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            stream, ClientCodec(settings, limits, clock=trio.current_time), ordered=True, **kwargs
        )
        self.hub = hub
        self._source = source
        self.egress = egress
        self.rename = rename
        self.subscriptions = {s.destination: s for s in subscriptions}
        self.handshake_timeout = handshake_timeout
        #: Hub tags of the MESSAGE frames the server has not acked, in sequence order.
        self.unacked: deque[int] = deque()

    def started(self) -> None:
        self.set_deadline(
            trio.current_time() + self.handshake_timeout,
            f"handshake not completed within {self.handshake_timeout:g}s",
        )
        self.write(self.codec.send(self.codec.offer))

    def end_of_input(self) -> None:
        raise trio.BrokenResourceError("the server closed the connection")

    async def handle(self, event: Any) -> None:
        if await self.handle_common(event):
            return
        if isinstance(event, Answered):
            self.write(self.codec.send(event.final))
        elif isinstance(event, Established):
            self._established()

    def _established(self) -> None:
        self.clear_deadline()
        self.windowed()
        if self.subscriptions and not self.codec.has("pubsub"):
            raise RemoteProtocolError("the server did not agree to pubsub: cannot subscribe")
        for sub in self.subscriptions.values():
            self.write(self.codec.send(sub.command()))
        if self.egress is not None:
            self.nursery.start_soon(self._send_loop, self.egress)

    # -- ingress -------------------------------------------------------------------------------
    def destinations_of(self, frames: tuple[Frame, ...]) -> list[str]:
        """Each MESSAGE's subscription's local destination (the server names the
        destination it came from)."""
        out = []
        for frame in frames:
            sub = self.subscriptions.get(frame.destination)
            if sub is None:
                raise RemoteProtocolError(
                    f"MESSAGE {frame.seq} from {frame.destination!r}, which we did not subscribe to"
                )
            out.append(sub.into)
        return out

    def source(self) -> Source:
        return self._source()

    def publish(self, messages: list[Message]) -> Any:
        return self.hub.publish(messages)

    # -- egress --------------------------------------------------------------------------------
    async def _send_loop(self, sub: Subscription) -> None:
        windowed = self.codec.send_window is not None
        rename = self.rename
        while True:
            room = await self.wait_window()
            deliveries = await sub.receive(room)
            messages = [d.message for d in deliveries]
            if rename:
                messages = [m._replace(destination=rename) for m in messages]
            await self.send_messages(None, messages)
            if windowed:
                self.unacked.extend(d.tag for d in deliveries)
            else:
                await self.flush()
                sub.ack_many([d.tag for d in deliveries])

    def peer_acked(self, seq: int, settled: int) -> None:
        tags = [self.unacked.popleft() for _ in range(min(settled, len(self.unacked)))]
        if tags and self.egress is not None:
            self.egress.ack_many(tags)


def subscriptions_of(
    entries: Sequence[Mapping[str, Any]], ingress: str
) -> list[RemoteSubscription]:
    """The ``subscribe`` tables of an upstream's config as subscriptions (``into``
    defaults to the upstream's ingress destination)."""
    return [
        RemoteSubscription(
            e["destination"],
            e["into"] or ingress,
            e["filter"],
            e["group"] or None,
            e["start"] or None,
        )
        for e in entries
    ]
