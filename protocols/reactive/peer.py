"""One reactive-streams connection driven by the gateway, in either role.

Both peers may subscribe on one connection, so a session has two sides:
:class:`~.outgoing.Outgoing` (the peer subscribed to us: we publish hub
subscriptions) and :class:`~.incoming.Incoming` (we subscribed to the peer:
we publish what it sends into the hub). This module does what is common to
the connection:

* **Handshake**: our hello goes out at once; the peer's must arrive within
  ``handshake_timeout``. A client subscribes right after its hello
  (pipelining); a server once the client's hello arrived.
* **Keepalive** (the extension both hellos offer): a ``ping`` is answered
  with a ``pong`` carrying its payload. With ``keepalive`` set, a peer we
  heard nothing from for that long gets a ``ping``; if nothing at all arrives
  within ``keepalive_timeout`` after it, the connection is closed as dead
  (``trio.TooSlowError``, logged as a timeout; an upstream reconnects). A ping is not
  progress for the listener's ``idle_timeout``, and an open subscription,
  even with zero demand, keeps the connection from being idle.
* **Goodbye**: the peer's goodbye is answered with ours and the connection
  closes once it is written; a protocol error gets
  ``goodbye("protocol-error: …")``. When the gateway drains, we say goodbye
  and close once the peer answers (``drain_timeout`` bounds the wait).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trio

from gateway.sdk import LocalProtocolError, RemoteProtocolError, Session, Source

from . import messages as m
from .codec import KEEPALIVE, Connection, Phase, Role, goodbye_reason
from .events import GoodbyeAnswered, GoodbyeReceived, Hello, Pinged, Ponged
from .incoming import Incoming, Publish, RemoteSubscription
from .metrics import PeerMetrics
from .outgoing import Opener, Outgoing

__all__ = ["SHUTTING_DOWN", "PeerSession"]

#: The goodbye reason sent when the gateway drains.
SHUTTING_DOWN = "going-away: the gateway is shutting down"


class PeerSession(Session):
    """One reactive-streams connection, publishing and subscribing (see the module)."""

    codec: Connection
    read_while_draining = True  # the peer's answer to our goodbye still arrives

    def __init__(
        self,
        stream: trio.abc.Stream,
        role: Role,
        *,
        opener: Opener,
        publish: Publish,
        source: Callable[[], Source],
        subscriptions: Sequence[RemoteSubscription] = (),
        ack_on_demand: bool = False,
        part_size: int = 64 * 1024,
        handshake_timeout: float = 10.0,
        keepalive: float = 0.0,
        keepalive_timeout: float = 10.0,
        metrics: PeerMetrics | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(stream, Connection(role), **kwargs)
        self.role = role
        self.handshake_timeout = handshake_timeout
        #: Seconds of silence before we ping (0: never), and for the answer.
        self.ping_after = keepalive
        self.ping_timeout = keepalive_timeout
        self.metrics = metrics or PeerMetrics()
        self.outgoing = Outgoing(self, opener, ack_on_demand=ack_on_demand, part_size=part_size)
        self.incoming = Incoming(self, subscriptions, publish, source, self.metrics)
        #: When we last heard from the peer.
        self._heard = trio.current_time()

    # -- the skeleton's hooks ---------------------------------------------------------------
    def started(self) -> None:
        self.subscriber = self.outgoing.start()
        self.write(self.codec.hello())
        if self.role is Role.CLIENT:
            self.incoming.start()
        self.set_deadline(
            trio.current_time() + self.handshake_timeout,
            f"no hello within {self.handshake_timeout:g}s",
        )

    def useful(self, event: Any) -> bool:
        return not isinstance(event, Pinged | Ponged)

    def received(self) -> None:
        """Anything at all from the peer shows it is alive."""
        self._heard = trio.current_time()

    def error_reply(self, error: RemoteProtocolError) -> bytes | None:
        return self.codec.send(m.Goodbye(goodbye_reason(error)))

    def draining(self) -> None:
        super().draining()
        self.send_message(m.Goodbye(SHUTTING_DOWN))

    def busy(self) -> bool:
        """A drain also waits for the answer to our goodbye (``drain_timeout`` bounds it)."""
        return super().busy() or self.codec.phase is Phase.GOODBYE_SENT

    def finished(self) -> None:
        self.outgoing.clear()
        self.incoming.clear()

    # -- events -------------------------------------------------------------------------------
    async def handle(self, event: Any) -> None:
        if self.outgoing.handle(event) or await self.incoming.handle(event):
            return
        if isinstance(event, Pinged):
            self.send_message(m.Pong(event.payload))
        elif isinstance(event, Hello):
            self.clear_deadline()
            self.incoming.start()
            if self.ping_after and KEEPALIVE in self.codec.extensions:
                self.nursery.start_soon(self._keepalive)
        elif isinstance(event, GoodbyeReceived | GoodbyeAnswered):
            self._goodbye(event)

    def _goodbye(self, event: GoodbyeReceived | GoodbyeAnswered) -> None:
        """The peer said goodbye (answered) or answered ours: close once written."""
        if isinstance(event, GoodbyeReceived) and not event.answers_ours:
            self.send_message(m.Goodbye(event.reason))
        self.stop()
        self.progress()  # a drain waiting for the answer looks again

    async def _keepalive(self) -> None:
        """Ping a peer silent for ``keepalive``; end the connection if nothing at all
        arrives within ``keepalive_timeout`` after the ping."""
        payload = 0
        while True:
            await trio.sleep_until(self._heard + self.ping_after)
            pinged = trio.current_time()
            if pinged < self._heard + self.ping_after:
                continue  # heard from meanwhile
            payload += 1
            self.metrics.pings.inc()
            self.send_message(m.Ping(payload.to_bytes(8, "big")))
            await trio.sleep(self.ping_timeout)
            if self._heard < pinged:
                self.metrics.keepalive_timeouts.inc()
                raise trio.TooSlowError(
                    f"keepalive-timeout: no answer to a ping within {self.ping_timeout:g}s"
                )

    def send_message(self, message: m.Message) -> None:
        """Queue ``message``, unless the stream or connection it is for has ended on the
        peer's side meanwhile (a cancel crossing our onComplete, say)."""
        try:
            self.write(self.codec.send(message))
        except LocalProtocolError:
            pass
