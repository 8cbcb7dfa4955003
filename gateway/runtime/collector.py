"""How the gateway process sets CPython's garbage collector.

Reference counting frees almost everything a gateway allocates (frames,
messages, receipts) the moment it is done with. The cyclic collector only
finds cycles, and it is triggered by counting allocations: with CPython's
default thresholds (700, 10, 10) a gateway moving 100 000 messages a second
runs a young collection about a thousand times a second and, every few
seconds, a full one that walks every object alive, every message a buffer
or a retained log holds included. Measured with the Micromessage2 and
Lumberjack benchmarks (docs/performance.md), that cost a fifth of the CPU
and stalled acks for up to 175 ms at a time.

So ``gateway run`` collects the youngest generation every
:data:`YOUNG_THRESHOLD` allocations instead, and freezes what start-up made
(modules, config, plugins: never garbage) out of every collection. Cycles
are still collected; only less often, in larger and rarer passes.
"""

from __future__ import annotations

import gc
from typing import Final

__all__ = ["YOUNG_THRESHOLD", "tune_collector"]

#: Allocations between two collections of the youngest generation.
YOUNG_THRESHOLD: Final = 50_000
#: Young collections between two of the middle generation, and those between two full
#: ones (CPython also waits until a quarter of the old objects are new since the last).
MIDDLE_THRESHOLD: Final = 20
OLD_THRESHOLD: Final = 100


def tune_collector() -> None:
    """Set the thresholds above and freeze the objects alive now (call after start-up)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
