"""Read-only views of a store directory: ``gateway store inspect`` and
``gateway store verify``.

Both run recovery's analysis without repairing anything (no file is written,
the clean-shutdown marker stays), so they are safe on a stopped store and
harmless on a running one, where a record being written at that moment may
show as a torn tail.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from gateway.store.layout import SEGMENTS_DIR, decode_name, encode_name
from gateway.store.recovery import RecoveredSegment, Verify, recover_segment

__all__ = ["inspect_lines", "scan", "verify_lines"]


def scan(
    directory: Path, *, verify: Verify, segment: str | None = None
) -> Iterator[RecoveredSegment]:
    """Every segment of the store in ``directory`` (or just ``segment``) as recovery
    would find it, without repairing. FileNotFoundError if there is no such store or
    segment."""
    segments_dir = directory / SEGMENTS_DIR
    if not segments_dir.is_dir():
        raise FileNotFoundError(f"no store in {directory} (no {SEGMENTS_DIR}/ there)")
    if segment is not None:
        path = segments_dir / encode_name(segment)
        if not path.is_dir():
            raise FileNotFoundError(f"no segment {segment!r} in the store in {directory}")
        yield recover_segment(path, verify=verify, repair=False)
        return
    for entry in sorted(os.scandir(segments_dir), key=lambda e: decode_name(e.name)):
        if entry.is_dir():
            yield recover_segment(Path(entry.path), verify=verify, repair=False)


def _time(us: int) -> str:
    if not us:
        return "-"
    return datetime.fromtimestamp(us / 1e6, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def inspect_lines(segment: RecoveredSegment, *, detail: bool) -> list[str]:
    """What ``gateway store inspect`` prints about one segment."""
    chunks = segment.chunks
    report = segment.report
    first_event = max(segment.first_event, chunks[0].first_event)
    next_event = chunks[-1].next_event
    size = sum(c.size for c in chunks)
    lines = [
        f"{segment.name}: events {first_event}..{next_event} ({next_event - first_event}), "
        f"bytes {chunks[0].start}..{chunks[-1].start + chunks[-1].size} ({size} stored), "
        f"{len(chunks)} chunk{'s' if len(chunks) != 1 else ''}, {report.records} records"
        + (f", {report.corrupt_records} corrupt" if report.corrupt_records else "")
        + f", newest {_time(max(c.newest_us for c in chunks))}"
    ]
    writers = sorted(segment.ledger.items(), key=lambda item: str(item[0]))
    if detail:
        for c in chunks:
            lines.append(
                f"  chunk at byte {c.start}: {c.size} bytes, events {c.first_event}.."
                f"{c.next_event}, {c.records} records, newest {_time(c.newest_us)}"
            )
        lines.extend(f"  writer {w}: last event number {n}" for w, n in writers)
        lines.extend(f"  problem: {p}" for p in report.problems)
    elif writers:
        lines.append(
            f"  {len(writers)} writer{'s' if len(writers) != 1 else ''}: "
            + ", ".join(f"{w}={n}" for w, n in writers[:5])
            + (", ..." if len(writers) > 5 else "")
        )
    if report.problems and not detail:
        lines.append(f"  {len(report.problems)} problems (gateway store verify lists them)")
    return lines


def verify_lines(segment: RecoveredSegment) -> list[str]:
    """What ``gateway store verify`` prints about one segment: every problem, with
    where it is."""
    report = segment.report
    return [f"{segment.name}: {problem}" for problem in report.problems]
