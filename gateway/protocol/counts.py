"""What a protocol's driver counts into, without depending on a metrics library.

A session or client calls ``inc``/``observe`` on what it is given: the
gateway's plugin passes metric children labelled with the listener or
upstream (``prometheus_client`` children and :class:`~gateway.ops.metrics.Tally`
both fit), a library user passes nothing, and :data:`NOTHING` counts nothing.
"""

from __future__ import annotations

from typing import Protocol

from gateway.core.facade import Count

__all__ = ["NOTHING", "Count", "Observe"]


class Observe(Protocol):
    def observe(self, amount: float) -> None: ...


class _Nothing:
    """Counts and observes nothing: the default where no metrics are wanted."""

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass


#: The counter and observer of nothing.
NOTHING = _Nothing()
