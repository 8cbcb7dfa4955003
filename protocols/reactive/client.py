"""The reactive-streams upstream's session: the gateway as a client of a remote peer.

Both roles on the one outgoing connection:

* **subscriber**: the upstream's ``subscriptions`` are subscribed to right
  after our hello, and what the peer sends is published locally
  (:mod:`.incoming`);
* **publisher**: what routes send to ``upstream:NAME`` is a publisher the
  peer may subscribe to, under the name ``publisher`` (the upstream's name by
  default). Each peer subscription joins the upstream's queue group, so
  several compete for its messages; a delivery is acked to the hub once the
  peer's demand passed it (``ack = "demand"``: at least once, since what was
  sent but not processed goes back to the queue when the stream or the
  connection ends). Any other publisher name is answered ``onError``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trio

from gateway.sdk import HubFacade, Source, Subscription

from .codec import Role
from .incoming import RemoteSubscription
from .peer import PeerSession

__all__ = ["UpstreamSession"]


class UpstreamSession(PeerSession):
    """One connection of a reactive-streams upstream (see the module docstring)."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        hub: HubFacade,
        source: Callable[[], Source],
        *,
        publisher: str,
        egress: Callable[[], Subscription],
        subscriptions: Sequence[RemoteSubscription] = (),
        part_size: int = 64 * 1024,
        handshake_timeout: float = 10.0,
        **kwargs: Any,
    ) -> None:
        self.publisher = publisher
        self.egress = egress
        super().__init__(
            stream,
            Role.CLIENT,
            opener=self._open,
            publish=hub.publish,
            source=source,
            subscriptions=subscriptions,
            ack_on_demand=True,
            part_size=part_size,
            handshake_timeout=handshake_timeout,
            **kwargs,
        )

    def _open(self, publisher: str) -> tuple[Subscription, int]:
        if publisher != self.publisher:
            raise LookupError(f"no publisher {publisher!r} here (this is {self.publisher!r})")
        return self.egress(), 0
