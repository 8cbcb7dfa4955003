"""The vocabulary every sans-IO codec shares: "need more data" and "the peer closed".

A codec's ``next_event()`` returns :data:`NEED_DATA` when no whole event has
arrived yet and a :class:`ConnectionClosed` once the peer closed its side and
every event before that was returned. Errors are
:class:`~gateway.core.errors.RemoteProtocolError` (the peer broke the protocol) and
:class:`~gateway.core.errors.LocalProtocolError` (we asked the codec for something
its state does not allow). One shared vocabulary lets one driver run every
protocol; :mod:`gateway.protocol.lifecycle` gives every codec the same answers
with it (``ConnectionClosed`` every time once closed, a refusal naming the
state once in error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final

__all__ = ["NEED_DATA", "ConnectionClosed", "NeedData"]


@final
class NeedData:
    """The type of :data:`NEED_DATA`; there is only one."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"

    def __reduce__(self) -> str:
        return "NEED_DATA"


#: Returned by ``next_event`` when no whole event has arrived yet.
NEED_DATA: Final = NeedData()


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed its side; no event follows (a partly received unit was dropped)."""
