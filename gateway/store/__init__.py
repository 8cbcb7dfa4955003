"""The embedded durable segment store (docs/store.md).

Segments of event-framed records on disk, addressed by byte offset and by
event index, with a per-writer ledger of event numbers (exactly-once appends
for segment append), group-committed fsync, crash recovery that never refuses
to start, retention by size and age, and small per-owner state documents.
"""

from __future__ import annotations

from gateway.store.records import RecordFormat, frame_events, split_events
from gateway.store.recovery import RecoveryReport
from gateway.store.segment import Appended, Segment, SegmentTruncated
from gateway.store.store import FsyncPolicy, Store, StoreLocked

__all__ = [
    "Appended",
    "FsyncPolicy",
    "RecordFormat",
    "RecoveryReport",
    "Segment",
    "SegmentTruncated",
    "Store",
    "StoreLocked",
    "frame_events",
    "split_events",
]
