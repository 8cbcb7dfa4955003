"""Progress lines of a running pipeline, from Spark's streaming query progress.

Spark reports one progress record per micro-batch (``query.lastProgress``,
``query.recentProgress``): its batch id, input rows, rates, durations, and for
each source the offsets it read up to (``endOffset``) and the newest the source
knew of (``latestOffset``, which the ``interchange`` source reports from each
partition's durable end). Both are the source's offsets, JSON
``{"DEST": {"PARTITION": byte offset}}``, so their difference is the consumer lag
in bytes per partition. This module turns a record (a plain dict, or PySpark's
dict subclass whose offsets are JSON strings) into one line::

    stats batch 3: 1200 rows, 4512 rows/s, 266 ms; lag logs/0 0 B, logs/1 1.2 MiB
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ProgressPrinter", "format_progress", "lag"]


def lag(source: Mapping[str, Any]) -> dict[str, int] | None:
    """Bytes between what ``source`` (a progress record's source entry) read up to
    and the latest offset it knew of, per segment (``DEST/PARTITION``); None when
    the source reports no latest offset."""
    latest = _offsets(source.get("latestOffset"))
    if latest is None:
        return None
    end = _offsets(source.get("endOffset")) or {}
    result = {}
    for destination, partitions in sorted(latest.items()):
        read = end.get(destination, {})
        for partition, offset in sorted(partitions.items(), key=lambda item: int(item[0])):
            behind = int(offset) - max(0, int(read.get(partition, 0)))
            result[f"{destination}/{partition}"] = max(0, behind)
    return result


def format_progress(progress: Mapping[str, Any]) -> str:
    """One line for a progress record: query name, batch id, input rows, rows/s
    processed, the batch's duration and the lag per partition."""
    name = progress.get("name") or str(progress.get("id", "query"))[:8]
    rows = int(progress.get("numInputRows") or 0)
    rate = float(progress.get("processedRowsPerSecond") or 0.0)
    durations = progress.get("durationMs") or {}
    took = durations.get("triggerExecution")
    if rows == 0 and "addBatch" not in durations:
        # Spark's heartbeat while no data comes (about every 10 s): no batch ran,
        # and batchId is the next one's.
        line = f"{name} waiting for data (batch {progress.get('batchId')} next)"
        took = None
    else:
        line = f"{name} batch {progress.get('batchId')}: {rows} rows, {rate:.0f} rows/s"
    if took is not None:
        line += f", {took} ms"
    lags: dict[str, int] = {}
    known = False
    for source in progress.get("sources") or ():
        found = lag(source)
        if found is not None:
            known = True
            lags.update(found)
    if known:
        parts = [f"{segment} {human_bytes(behind)}" for segment, behind in lags.items()]
        line += "; lag " + (", ".join(parts) if parts else "none")
    return line


def human_bytes(count: int) -> str:
    """``0 B``, ``512 B``, ``1.2 KiB``, ``3.4 MiB``, ``5.6 GiB``."""
    if count < 1024:
        return f"{count} B"
    value = float(count)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


class ProgressPrinter:
    """Remembers which progress records were printed, so that polling
    ``recentProgress`` every second prints each record once."""

    def __init__(self) -> None:
        self._seen: dict[str, str] = {}

    def new_lines(self, query_id: str, records: Iterable[Mapping[str, Any]]) -> list[str]:
        """Lines for the records of ``query_id`` newer than those already seen (by
        their ``timestamp``, ISO 8601 in UTC, which sorts as text)."""
        last = self._seen.get(query_id, "")
        lines = []
        for record in records:
            stamp = str(record.get("timestamp") or "")
            if stamp > last:
                lines.append(format_progress(record))
                last = stamp
        self._seen[query_id] = last
        return lines


def _offsets(value: Any) -> dict[str, dict[str, int]] | None:
    """Offsets as a dict, from a dict or its JSON text; None for none or "null"."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, Mapping):
        return None
    return {
        str(dest): {str(p): int(o) for p, o in parts.items()}
        for dest, parts in value.items()
        if isinstance(parts, Mapping)
    }
