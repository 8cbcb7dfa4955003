"""Durations and sizes as people write them in config: ``"10s"``, ``"64MiB"``."""

from __future__ import annotations

import math
import re
from decimal import Decimal

__all__ = ["parse_duration", "parse_size"]

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*\Z")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}

#: Larger sizes are surely typos (and overflow the C integers below the sockets).
MAX_SIZE = 2**63 - 1

_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*\Z", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_duration(value: object) -> float:
    """Seconds from ``"500ms"``, ``"10s"``, ``"5m"``, ``"1h"``, ``"1d"`` or a number.

    Raises ``ValueError`` with a reason fit for a config error.
    """
    if isinstance(value, bool):
        raise ValueError('expected a duration such as "10s" or "500ms"')
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise ValueError(f'expected a duration such as "10s" or "500ms", got {value!r}')
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be a finite number, got {value!r}")
    if seconds < 0:
        raise ValueError("a duration must not be negative")
    return seconds


def parse_size(value: object) -> int:
    """Bytes from ``"64MiB"``, ``"10MB"``, ``"512B"`` or an integer."""
    if isinstance(value, bool):
        raise ValueError('expected a size such as "64MiB"')
    if isinstance(value, int):
        size = value
    elif isinstance(value, str) and (m := _SIZE.match(value)):
        unit = (m.group(2) or "B").lower()
        size = int(Decimal(m.group(1)) * _SIZE_UNITS[unit])
    else:
        raise ValueError(f'expected a size such as "64MiB" or "512KiB", got {value!r}')
    if size < 0:
        raise ValueError("a size must not be negative")
    if size > MAX_SIZE:
        raise ValueError(f"a size must be at most {MAX_SIZE} bytes")
    return size
