"""The reactive-streams listener's session: destinations published to the peer.

A peer's ``subscribe`` names a destination the listener exposes, with the
publisher string of :mod:`.publisher_names`: a name the ``publishers`` globs
do not match, a malformed string or a subscription the hub refuses is
answered ``onError``; a peer cannot create destinations by subscribing. The
listener's ``subscriptions``, if any, are made to every connecting peer (see
:mod:`.incoming`). Everything else is :class:`~.peer.PeerSession`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.sdk import ServerConnection, Subscription

from .codec import Role
from .incoming import RemoteSubscription
from .peer import PeerSession
from .publisher_names import exposed, parse_publisher

__all__ = ["ReactiveSession"]


class ReactiveSession(PeerSession):
    """One accepted reactive-streams connection."""

    def __init__(
        self,
        conn: ServerConnection,
        *,
        publishers: tuple[str, ...],
        subscriptions: Sequence[RemoteSubscription] = (),
        ack_on_demand: bool = False,
        part_size: int = 64 * 1024,
        max_unacked: int = 1024,
        handshake_timeout: float = 10.0,
        **kwargs: Any,
    ) -> None:
        self.conn = conn
        self.publishers = publishers
        self.max_unacked = max_unacked
        super().__init__(
            conn.stream,
            Role.SERVER,
            opener=self._open,
            publish=conn.hub.publish,
            source=conn.source,
            subscriptions=subscriptions,
            ack_on_demand=ack_on_demand,
            part_size=part_size,
            handshake_timeout=handshake_timeout,
            log=conn.log,
            shutdown=conn.shutdown,
            **kwargs,
        )

    def _open(self, publisher: str) -> tuple[Subscription, int]:
        """The hub subscription a publisher string names (ValueError, LookupError:
        refused)."""
        name = parse_publisher(publisher)
        if not exposed(name.destination, self.publishers):
            raise LookupError(f"publisher {name.destination!r} is not exposed")
        hub = self.conn.hub
        size = hub.info(name.destination).element_size or 0
        sub = hub.subscribe(
            name.destination,
            name.group,
            max_unacked=self.max_unacked,
            start=name.start,
            end=name.end,
            filter=name.filter,
            positions=False,  # elements carry bodies only
        )
        return sub, size
