"""A segment service in memory, for planning and row tests that need no gateway:
segments of events of given sizes, with a retained start, answering ``info``,
``partitions`` and ``locate`` as the gateway's ``GetStreamSegmentInfo`` and
``LocateOffset`` do."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from protocols.segment.blocking import SegmentInfo


@dataclass
class FakeSegment:
    """Events framed in 8-byte headers: ``sizes`` are payload lengths."""

    sizes: list[int] = field(default_factory=list)
    #: Index of the first retained event (retention dropped those before).
    dropped: int = 0

    @property
    def boundaries(self) -> list[int]:
        out = [0]
        for size in self.sizes:
            out.append(out[-1] + 8 + size)
        return out

    def info(self, name: str) -> SegmentInfo:
        b = self.boundaries
        first, end = b[self.dropped], b[-1]
        return SegmentInfo(name, True, False, first, end, self.dropped, len(self.sizes), 0)


class FakeService:
    """Destinations of fake segments, counting the calls made."""

    def __init__(self, **destinations: list[FakeSegment]) -> None:
        self.segments = {
            f"{name}/{p}": seg for name, segs in destinations.items() for p, seg in enumerate(segs)
        }
        self.calls: list[tuple[str, ...]] = []

    def add(self, name: str, *sizes: int) -> FakeSegment:
        seg = FakeSegment(list(sizes))
        self.segments[name] = seg
        return seg

    def partitions(self, destination: str) -> list[SegmentInfo]:
        self.calls.append(("partitions", destination))
        out = []
        while f"{destination}/{len(out)}" in self.segments:
            name = f"{destination}/{len(out)}"
            out.append(self.segments[name].info(name))
        return out

    def locate(self, segment: str, target: int, events: int | None = None) -> tuple[int, int]:
        self.calls.append(("locate", segment))
        seg = self.segments[segment]
        b = seg.boundaries
        target = min(max(target, b[seg.dropped]), b[-1])
        index = bisect.bisect_right(b, target) - 1
        if events is not None and events >= 0:
            index = min(index + events, len(b) - 1)
        return b[index], index
