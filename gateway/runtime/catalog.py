"""The ``[[destinations]]`` table: which destinations are queues, logs or
fixed-size element streams, and the provider that builds them on first use.

A destination name that no entry matches is a plain in-memory topic. Entries
are matched in the order written, by exact name or glob (``*``, ``?``); the
first match decides.

With ``--workers N`` each stateful destination has one *home* worker
(:meth:`Catalog.home`): a durable one worker 0 (the only worker that opens the
store), any other (a queue, a ``retain`` log, a topic with declared groups)
worker :func:`home_worker` of its name. Every worker computes the same.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gateway.core.destination import QUEUE_GROUP, Destination, DestinationInfo
from gateway.core.memory_log import MemoryLog
from gateway.core.routing import UPSTREAM_PREFIX, compile_glob
from gateway.core.topic import Topic, TopicLimits

if TYPE_CHECKING:
    from gateway.store import Store

__all__ = ["Catalog", "DestinationSpec", "home_worker"]


def home_worker(name: str, workers: int) -> int:
    """The worker, of ``workers``, where the in-memory stateful destination ``name``
    lives: the CRC-32 of its UTF-8 bytes (:func:`zlib.crc32`) modulo ``workers``."""
    return zlib.crc32(name.encode()) % workers


@dataclass(frozen=True, slots=True)
class DestinationSpec:
    """One ``[[destinations]]`` entry."""

    #: A destination name, or a glob over names.
    name: str
    kind: Literal["topic", "queue"] = "topic"
    #: Keep an in-memory log of this many bytes (replayable, with positions); None: no log.
    retain: int | None = None
    #: For a log: wait for groups (``block``) or drop the oldest data they still need.
    overflow: Literal["block", "drop_oldest"] = "block"
    #: Every body must be exactly this many bytes (fixed-size elements).
    element_size: int | None = None
    #: Named groups that exist from the destination's creation, collecting.
    groups: tuple[str, ...] = ()
    #: Per-group bounds of a topic or queue (None: the gateway's defaults).
    buffer_bytes: int | None = None
    buffer_messages: int | None = None
    #: Where a durable log is kept (``"embedded"``: the segment store); None: memory.
    store: str | None = None
    #: For a durable log: seconds its data is kept at most (None: no age limit).
    retain_age: float | None = None
    #: For a durable log: segments ``<name>/0`` … ``<name>/<partitions - 1>``.
    partitions: int = 1
    #: For a partitioned log: the header whose value picks the partition (None: round-robin).
    partition_key: str | None = None

    @property
    def is_glob(self) -> bool:
        return "*" in self.name or "?" in self.name

    @property
    def stateful(self) -> bool:
        """It keeps state that one process must hold (a queue, a log, named groups)."""
        return (
            self.store is not None
            or self.retain is not None
            or self.kind != "topic"
            or bool(self.groups)
        )


class Catalog:
    """A :class:`~gateway.core.destination.DestinationProvider` built from the table."""

    def __init__(self, specs: Iterable[DestinationSpec], defaults: TopicLimits) -> None:
        self.specs = list(specs)
        self._defaults = defaults
        self._patterns = [(compile_glob(s.name), s) for s in self.specs]
        #: Where durable destinations live; set by the runtime once the store is open.
        self.store: Store | None = None

    def replace(self, specs: Iterable[DestinationSpec]) -> None:
        """New declarations (a reload): they apply to destinations created from now on."""
        self.specs = list(specs)
        self._patterns = [(compile_glob(s.name), s) for s in self.specs]

    def spec(self, name: str) -> DestinationSpec | None:
        """The entry that configures ``name``, if any."""
        if name.startswith(UPSTREAM_PREFIX):
            return None
        for regex, spec in self._patterns:
            if regex.match(name):
                return spec
        return None

    def home(self, name: str, workers: int) -> int | None:
        """The worker where ``name`` lives, of ``workers``; None for a plain topic
        (every worker has its own, forwarding by interest)."""
        spec = self.spec(name)
        if spec is None or not spec.stateful:
            return None
        if spec.store is not None:
            return 0
        return home_worker(name, workers)

    def info(self, name: str) -> DestinationInfo:
        """What the destination ``name`` is, from its entry alone (as a proxy of it
        in another worker than its home tells it)."""
        spec = self.spec(name)
        if spec is None:
            return DestinationInfo(name, "topic")
        log = spec.store is not None or spec.retain is not None
        return DestinationInfo(
            name,
            "log" if log else spec.kind,
            spec.element_size,
            positions=log,
            queue_group=QUEUE_GROUP if spec.kind == "queue" else None,
        )

    def open(self, name: str) -> Destination | None:
        spec = self.spec(name)
        if spec is None:
            return None
        log: Destination
        if spec.store is not None:
            log = self._durable(name, spec)
        elif spec.retain is not None:
            log = MemoryLog(
                name,
                retain_bytes=spec.retain,
                kind=spec.kind,
                overflow=spec.overflow,
                element_size=spec.element_size,
            )
        else:
            limits = TopicLimits(
                spec.buffer_bytes or self._defaults.max_bytes,
                spec.buffer_messages or self._defaults.max_messages,
                self._defaults.budget,
            )
            return Topic(
                name, limits, kind=spec.kind, element_size=spec.element_size, groups=spec.groups
            )
        for group in spec.groups:
            log.declare_group(group)
        return log

    def _durable(self, name: str, spec: DestinationSpec) -> Destination:
        """A durable log in the store: one segment per partition, ``NAME/0`` … , each
        with the entry's age bound; more than one partition makes a
        :class:`~gateway.durable.partitioned.PartitionedLog` over them."""
        from gateway.durable.log import DurableLog
        from gateway.durable.partitioned import PartitionedLog

        if self.store is None:
            raise LookupError(f"destination {name!r} is durable but no store is open")
        assert spec.retain is not None  # the config fills in the store's default
        parts: list[DurableLog] = []
        try:
            for p in range(spec.partitions):
                segment = self.store.segment(f"{name}/{p}")
                segment.retain_age = spec.retain_age
                parts.append(
                    DurableLog(
                        name,
                        segment,
                        self.store,
                        retain_bytes=spec.retain,
                        kind=spec.kind,
                        overflow=spec.overflow,
                        element_size=spec.element_size,
                        partition=p,
                    )
                )
        except BaseException:
            for part in parts:  # they follow their segments: stop that
                part.close()
            raise
        if len(parts) > 1:
            return PartitionedLog(name, parts, partition_key=spec.partition_key)
        return parts[0]

    def names(self) -> list[str]:
        """The entries that name one destination (no glob): created at start-up."""
        return [s.name for s in self.specs if not s.is_glob]
