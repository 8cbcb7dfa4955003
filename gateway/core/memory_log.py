"""In-memory logs: a replayable sibling of :mod:`gateway.core.topic`.

:class:`MemoryLog` is a :class:`~gateway.core.log.LogDestination` (offsets,
groups with committed positions, finite reads, filters, retention bounded in
bytes with ``overflow = block | drop_oldest``: see :mod:`gateway.core.log`)
whose messages live in a plain list kept in step with the base's running byte
totals: the same moving head, compacted at the same time, so a run of offsets
is appended and handed out with C-level list operations.

A publisher's leg settles as soon as the copy is in the list. That safety is
in memory only: a :class:`MemoryLog` does not survive a restart. The durable
segment store's :class:`~gateway.durable.log.DurableLog` implements the
same interface and passes the same tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from gateway.core.log import QUEUE_GROUP, LogDestination, LogSubscription, PositionRun
from gateway.core.model import Message
from gateway.core.receipts import Receipt

__all__ = ["QUEUE_GROUP", "LogSubscription", "MemoryLog"]


class MemoryLog(LogDestination):
    """An in-memory, replayable, bounded log with committed positions per group.

    Not durable: what it holds is lost when the process ends.
    """

    def __init__(
        self,
        name: str,
        *,
        retain_bytes: int,
        kind: Literal["topic", "queue"] = "topic",
        overflow: Literal["block", "drop_oldest"] = "block",
        element_size: int | None = None,
    ) -> None:
        super().__init__(
            name,
            retain_bytes=retain_bytes,
            kind=kind,
            overflow=overflow,
            element_size=element_size,
        )
        #: ``_messages[i]`` is the message at offset ``_base + i`` (as ``_ends[i]``):
        #: every retained message is recent.
        self._messages: list[Message] = []
        self._recent = self._messages

    def _store(self, messages: Sequence[Message], receipt: Receipt, index: int, first: int) -> None:
        self._messages.extend(messages)
        n = len(messages)
        receipt.add_legs(n)
        receipt.settle_stored(index, self.name, PositionRun(first, n))

    def _release(self, new_first: int, compacted: int) -> None:
        if compacted:
            del self._messages[:compacted]
            self._recent_base = self._base
