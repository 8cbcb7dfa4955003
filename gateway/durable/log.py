"""Durable log destinations: a :class:`~gateway.core.log.LogDestination` whose
messages live in a segment of the store, so a restart loses nothing acked
and redelivers what was not.

Positions are the segment's event indexes, in the log's ``partition`` (0
unless it is one partition of a
:class:`~gateway.durable.partitioned.PartitionedLog`). ``put_many``
appends the run as one record of format ``ENVELOPE`` (one event per message,
:mod:`gateway.durable.envelope`), and its legs settle only when the store calls
back that the record is durable: under the ``interval`` fsync policy that is
the committer's next group commit, so one fsync covers many publishes.
Subscribers may be handed a message before it is durable (a crash then may
lose it, but its publisher was never acked and sends it again). Events other
writers append to the segment (format ``RAW``, from segment-append
connections) become messages ``Message(destination=name, body=payload)`` at
their index; events that fail their checksum (``CORRUPT``) or do not decode
are never delivered, and count as dropped for the groups that reach them
(in retention they count as empty messages).

In memory the log keeps the running byte totals of every retained entry
(8 bytes each, in an ``array``) and a bounded cache of the most recent
messages (``cache_bytes`` of ``Message.size``), so live subscribers never
touch the disk; older ones are read back from the segment a chunk at a time.

What survives a restart, besides the messages: each named group's committed
position and filter, and the log's first offset, saved as the store state
document of its ``state_owner`` whenever they change (the store writes the
latest atomically at its next commit). The owner is the destination's name
for partition 0 (what a destination of one partition always used) and the
segment's name (``NAME/p``) for another partition, so each partition keeps
its own groups. On open a named group resumes at its committed position and
everything after it is delivered again; anonymous groups are not kept.
A queue's selectors are its consumers' and are not saved: the entries they
passed over (held for another consumer) are above the committed position,
so they are read again after a restart, as is everything acked after the
oldest of them (at least once).
Opening reads every retained event once to rebuild the byte totals
(unpacking each envelope, but building no message: a few microseconds per
message plus the read, under a second for 200 000 messages with headers and
a source), then decodes the newest ``cache_bytes`` of them into the cache.

Logical eviction (retention bound in ``Message.size``, as in
:class:`~gateway.core.memory_log.MemoryLog`) calls ``segment.truncate_before``; the
store's own age and size retention (``on_truncate``) is taken as a
``drop_oldest`` eviction. Events others append are not held back by
``overflow="block"``: beyond the bound they push out what every group
committed past, and the rest waits for the next publish to make room.
"""

from __future__ import annotations

import bisect
import functools
import logging
import time
from array import array
from collections.abc import Sequence
from typing import Any, Literal

from gateway.core.destination import message_sizes
from gateway.core.filters import Filter
from gateway.core.log import QUEUE_GROUP, LogDestination, LogGroup, PositionRun
from gateway.core.model import MESSAGE_OVERHEAD, Message
from gateway.core.receipts import Receipt
from gateway.durable.envelope import decode_many, encode_many, message_size
from gateway.store.records import RecordFormat, frame_events
from gateway.store.segment import Appended, Segment, SegmentTruncated
from gateway.store.store import Store

__all__ = ["CACHE_BYTES", "DurableLog"]

log = logging.getLogger("gateway.store")

#: Default bound of the cache of recent messages (in ``Message.size``).
CACHE_BYTES = 16 * 2**20
#: A read from the segment takes at most this many events and payload bytes.
READ_EVENTS = 4096
READ_BYTES = 4 * 2**20
#: Version of the state document.
STATE_VERSION = 1

_new_message = functools.partial(tuple.__new__, Message)
_NO_HEADERS = Message._field_defaults["headers"]
_ENVELOPE = RecordFormat.ENVELOPE
_RAW = RecordFormat.RAW


class DurableLog(LogDestination):
    """A log destination kept in ``segment`` of ``store`` (see the module docstring).

    Construct it while the store is open; it reads what the segment retains and
    restores its groups before it returns.
    """

    _ends_type = functools.partial(array, "q")

    def __init__(
        self,
        name: str,
        segment: Segment,
        store: Store,
        *,
        retain_bytes: int,
        kind: Literal["topic", "queue"] = "topic",
        overflow: Literal["block", "drop_oldest"] = "block",
        element_size: int | None = None,
        cache_bytes: int | None = None,
        partition: int = 0,
    ) -> None:
        super().__init__(
            name,
            retain_bytes=retain_bytes,
            kind=kind,
            overflow=overflow,
            element_size=element_size,
            partition=partition,
        )
        self.segment = segment
        self.store = store
        #: Whose store state document keeps the groups (see the module docstring):
        #: partition 0 keeps the name a destination of one partition always had.
        self.state_owner = name if partition == 0 else segment.name
        self.cache_bytes = min(retain_bytes, CACHE_BYTES) if cache_bytes is None else cache_bytes
        self._holes: set[int] = set()
        #: Recent messages: ``_cache[o - _recent_base]`` for ``_recent_first <= o < tail``.
        self._cache: list[Message] = []
        self._recent = self._cache
        #: The last run read back from the segment, and its first offset.
        self._window: tuple[list[Message], int] = ([], 0)
        #: Set while our own append runs (the observer ignores it).
        self._appending = False
        state = self._load_state()
        first = min(max(segment.first_event, state.get("first", 0)), segment.next_event)
        segment.truncate_before(first)
        self._base = self._recent_base = self._recent_first = first
        self._size_retained()
        self._fill_cache()
        self._restore_groups(state.get("groups", {}))
        self._trim_to_bound()
        self._save()
        self._unobserve = segment.observe(self._on_append, self._on_truncate)

    # -- the storage hooks --------------------------------------------------------------
    def _store(self, messages: Sequence[Message], receipt: Receipt, index: int, first: int) -> None:
        n = len(messages)
        data = frame_events(encode_many(messages, time.time()))
        self._appending = True
        try:
            appended = self.segment.append(data, n, format=_ENVELOPE, verified=True)
        finally:
            self._appending = False
        if appended.first_event != first:
            raise RuntimeError(
                f"log {self.name!r} appended at event {appended.first_event}, expected {first}"
            )
        self._cache.extend(messages)
        receipt.add_legs(n)
        self.segment.when_durable(
            appended.end,
            functools.partial(
                receipt.settle_stored, index, self.name, PositionRun(first, n, self.partition)
            ),
        )

    def _append(
        self, messages: Sequence[Message], sizes: list[int], receipt: Receipt, index: int
    ) -> None:
        super()._append(messages, sizes, receipt, index)
        self._trim_cache()

    def _read(self, lo: int, hi: int) -> tuple[Sequence[Message], int, int]:
        window, base = self._window
        if base <= lo < base + len(window):
            return window, base, min(hi, base + len(window))
        # Read ahead up to the cache: sequential readers come back for the next ones.
        messages = self._read_back(lo, self._recent_first)
        self._window = (messages, lo)
        return messages, lo, min(hi, lo + len(messages))

    def _release(self, new_first: int, compacted: int) -> None:
        self.segment.truncate_before(new_first)
        if new_first > self._recent_first:
            self._recent_first = new_first
            self._compact_cache()
        holes = self._holes
        if holes:
            holes.difference_update([h for h in holes if h < new_first])

    def _changed(self) -> None:
        self._save()

    def _advanced(self, group: LogGroup | None = None) -> None:
        if group is None or not group.anonymous:
            self._save()
        super()._advanced(group)

    # -- reading the segment ------------------------------------------------------------
    def _read_back(self, lo: int, hi: int) -> list[Message]:
        """The messages of events ``lo``… (at least one, below ``hi``), read from the
        segment; unreadable ones (gone, corrupt, undecodable) become holes."""
        try:
            events = self.segment.read_events(lo, min(hi - lo, READ_EVENTS), READ_BYTES)
        except SegmentTruncated as e:
            # Store retention deleted them; its on_truncate evicts them soon.
            gone = max(lo + 1, min(e.first_event, hi, lo + READ_EVENTS))
            return self._unreadable(lo, gone - lo)
        return self._messages_of(lo, events)

    def _unreadable(self, lo: int, n: int) -> list[Message]:
        self._holes.update(range(lo, lo + n))
        return [_new_message((self.name, b"", _NO_HEADERS, None, None))] * n

    def _messages_of(self, lo: int, events: list[tuple[RecordFormat, bytes]]) -> list[Message]:
        """The messages of ``events`` (read from event ``lo`` on)."""
        name = self.name
        out: list[Message] = []
        i, n = 0, len(events)
        while i < n:
            fmt = events[i][0]
            j = i + 1
            while j < n and events[j][0] is fmt:
                j += 1
            run = [payload for _, payload in events[i:j]]
            if fmt is _RAW:
                out += [_new_message((name, p, _NO_HEADERS, None, None)) for p in run]
            elif fmt is _ENVELOPE:
                try:
                    out += decode_many(run, name)
                except ValueError:
                    out += self._decode_each(lo + i, run)
            else:
                out += self._unreadable(lo + i, j - i)
            i = j
        return out

    def _decode_each(self, lo: int, payloads: list[bytes]) -> list[Message]:
        """Envelopes one at a time: a bad one becomes a hole (logged)."""
        out: list[Message] = []
        for offset, payload in enumerate(payloads, lo):
            try:
                out += decode_many((payload,), self.name)
            except ValueError as e:
                if offset not in self._holes:
                    log.error("log %r: event %d does not decode (%s)", self.name, offset, e)
                out += self._unreadable(offset, 1)
        return out

    def _take_in(self, stop: int) -> None:
        """Read events from ``tail`` on (up to ``stop``) and take them in as entries."""
        lo = self.tail
        messages = self._read_back(lo, stop)
        self._extend(message_sizes(messages))
        self._cache_in(lo, messages)
        self._trim_cache()

    def _cache_in(self, lo: int, messages: list[Message]) -> None:
        """Append ``messages`` (from offset ``lo``, the cache's end) to the cache, which
        holds no hole: after a new one it starts again past it."""
        holes = [h for h in self._holes if h >= lo]
        if holes:
            after = max(holes) + 1
            del self._cache[:]
            self._cache += messages[after - lo :]
            self._recent_base = self._recent_first = after
        else:
            self._cache += messages

    def _size_retained(self) -> None:
        """Take in every retained event's size, building no message (on open)."""
        segment = self.segment
        while self.tail < segment.next_event:
            lo = self.tail
            events = segment.read_events(lo, READ_EVENTS, READ_BYTES)
            sizes: list[int] = []
            for offset, (fmt, payload) in enumerate(events, lo):
                if fmt is _RAW:
                    sizes.append(MESSAGE_OVERHEAD + len(payload))
                    continue
                if fmt is _ENVELOPE:
                    try:
                        sizes.append(message_size(payload))
                        continue
                    except ValueError:
                        pass
                self._holes.add(offset)
                sizes.append(MESSAGE_OVERHEAD)
            self._extend(sizes)

    def _fill_cache(self) -> None:
        """Read the newest ``cache_bytes`` of messages into the cache (on open)."""
        first, tail = self.first, self.tail
        start = first
        if self._cum(tail) - self._cum(first) > self.cache_bytes:
            start = self._offset_at(first, self._cum(tail) - self.cache_bytes)
        if self._holes:
            start = max(start, max(self._holes) + 1)
        self._recent_base = self._recent_first = start
        lo = start
        while lo < tail:
            messages = self._read_back(lo, tail)
            self._cache_in(lo, messages)
            lo += len(messages)

    # -- the cache ------------------------------------------------------------------------
    def _trim_cache(self) -> None:
        """Above ``cache_bytes``, keep the newest half of it."""
        top = self._cum(self.tail)
        if top - self._cum(self._recent_first) <= self.cache_bytes:
            return
        self._recent_first = self._offset_at(self._recent_first, top - self.cache_bytes // 2)
        self._compact_cache()

    def _offset_at(self, lo: int, target: int) -> int:
        """The first offset after ``lo`` with at least ``target`` bytes before it
        (``lo`` has fewer), or ``tail``."""
        i = bisect.bisect_left(self._ends, target, lo - self._base)
        return self._base + i + 1 if i < len(self._ends) else self.tail

    def _compact_cache(self) -> None:
        stale = self._recent_first - self._recent_base
        if stale * 2 > len(self._cache) or stale >= len(self._cache):
            del self._cache[:stale]
            self._recent_base = self._recent_first

    # -- what the segment tells ------------------------------------------------------------
    def _on_append(self, appended: Appended, fmt: RecordFormat) -> None:
        if self._appending or self._closed:
            return
        stop = appended.first_event + appended.count
        while self.tail < stop:
            self._take_in(stop)
        self._trim_to_bound()

    def _on_truncate(self, new_first: int) -> None:
        if new_first > self.first and not self._closed:
            self._evict(min(new_first, self.tail))
            # Room for publishers; a finite read may have reached its end.
            self._advanced()
            for g in self._groups.values():
                g.wake()

    def _trim_to_bound(self) -> None:
        """Beyond ``retain_bytes`` (others appended, or the bound shrank): evict the
        oldest entries, under ``block`` only those every group committed past."""
        excess = self.retained_bytes - self.retain_bytes
        if excess <= 0:
            return
        new_first = self._offset_at(self.first, self._cum(self.first) + excess)
        if self.overflow == "block":
            hold = min((g.committed for g in self._groups.values()), default=self.tail)
            new_first = min(new_first, hold)
        if new_first > self.first:
            self._evict(new_first)

    # -- the state document -------------------------------------------------------------------
    def _load_state(self) -> dict[str, Any]:
        state = self.store.load_state(self.state_owner)
        if state and state.get("version") != STATE_VERSION:
            log.warning(
                "log %r: state version %r unknown; groups start afresh",
                self.state_owner,
                state.get("version"),
            )
            return {}
        if not isinstance(state.get("first", 0), int) or not isinstance(
            state.get("groups", {}), dict
        ):
            log.warning("log %r: malformed state document; groups start afresh", self.state_owner)
            return {}
        return state

    def _restore_groups(self, groups: dict[Any, Any]) -> None:
        first, tail = self.first, self.tail
        queue = self._groups.get(QUEUE_GROUP)
        if queue is not None:
            queue.cursor = queue.committed = first
        for name, entry in groups.items():
            try:
                committed = entry["committed"]
                raw = entry.get("filter")
                if not isinstance(name, str) or not isinstance(committed, int):
                    raise TypeError("a group's name is a string and its position an integer")
                filter = Filter.from_json(raw) if raw is not None else None
            except (TypeError, KeyError, AttributeError, ValueError) as e:
                log.warning("log %r: group %r not restored: %s", self.state_owner, name, e)
                continue
            committed = min(max(committed, first), tail)
            if self.kind == "queue" and name != QUEUE_GROUP:
                continue
            self._groups[name] = LogGroup(name, False, filter, committed)

    def _save(self) -> None:
        groups = {
            name: {
                "committed": g.committed,
                "filter": g.filter.to_json() if g.filter is not None else None,
            }
            for name, g in self._groups.items()
            if not g.anonymous
        }
        self.store.save_state(
            self.state_owner, {"version": STATE_VERSION, "first": self.first, "groups": groups}
        )

    # -- life cycle -----------------------------------------------------------------------------
    def close(self) -> None:
        """Wake every waiter with ClosedResourceError and stop following the segment;
        the state is saved once more (the store writes it when it closes)."""
        if not self._closed:
            self._unobserve()
            self._save()
        super().close()

    def stats(self) -> dict[str, object]:
        """As a memory log's, plus ``cached`` (recent messages held in memory) and
        ``unreadable`` (retained events known not to be readable)."""
        stats = super().stats()
        stats["cached"] = self.tail - self._recent_first
        stats["unreadable"] = len(self._holes)
        return stats
