"""Rate-limited logging: warnings that a client can provoke must not flood the log.

A peer that opens connections as fast as it can, or a machine out of file
descriptors, makes the same warning fire thousands of times a second; logged
one by one they would fill the disk and bury every other line. A
:class:`Throttled` logger logs the first line for a *reason* (a short key such
as ``"accept:tcp:EMFILE"``) at once, then counts, without logging them, the
lines with the same reason for ``interval`` seconds. The next line after that
carries the count as a suffix, so no event goes unmentioned, and the count is
also kept in a Prometheus counter (``interchange_log_lines_suppressed_total``).

Reasons are meant to come from a bounded set (a listener name and an errno, a
protection's name), never from client input; even so the state is capped at
``max_reasons`` entries, the least recently logged going first.

A :class:`Throttled` belongs to one thread (the trio thread): it takes no lock.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeAlias

import prometheus_client
import trio

__all__ = ["ExcInfo", "Throttled"]

#: What :meth:`logging.Logger.log` takes as ``exc_info``.
ExcInfo: TypeAlias = (
    bool
    | BaseException
    | tuple[type[BaseException], BaseException, TracebackType | None]
    | tuple[None, None, None]
    | None
)


@dataclass
class _Reason:
    """What a :class:`Throttled` remembers of one reason."""

    #: Clock time of the last line logged for this reason: its interval starts there.
    logged_at: float
    #: Lines not logged since then.
    suppressed: int = 0
    #: The highest level, the template and the arguments among the suppressed lines
    #: (the last ones), for :meth:`Throttled.flush`.
    level: int = logging.NOTSET
    msg: str = ""
    args: tuple[object, ...] = ()


class Throttled:
    """One log line per reason per interval, with a count of the suppressed ones.

    ``suppressed``, a counter family with a ``reason`` label (such as
    ``Metrics().log_lines_suppressed``), counts every line not logged.
    ``clock`` gives the time in seconds; by default it is
    :func:`trio.current_time` inside a trio run (so that a test's mock clock
    drives the intervals) and :func:`time.monotonic` outside one. A clock that
    went backwards (another trio run's clock) ends every interval.
    """

    def __init__(
        self,
        logger: logging.Logger | logging.LoggerAdapter[Any],
        interval: float = 10.0,
        *,
        suppressed: prometheus_client.Counter | None = None,
        clock: Callable[[], float] | None = None,
        max_reasons: int = 1024,
    ) -> None:
        if interval < 0:
            raise ValueError(f"interval must be >= 0, not {interval}")
        if max_reasons < 1:
            raise ValueError(f"max_reasons must be >= 1, not {max_reasons}")
        self.logger = logger
        self.interval = interval
        self.max_reasons = max_reasons
        self._suppressed = suppressed
        self._clock = clock
        # Least recently logged first: the one dropped when there are too many.
        self._reasons: OrderedDict[str, _Reason] = OrderedDict()

    def log(
        self, level: int, reason: str, msg: str, *args: object, exc_info: ExcInfo = None
    ) -> None:
        """Log ``msg % args`` at ``level`` unless ``reason`` was logged within the interval."""
        self._log(level, reason, msg, args, exc_info)

    def info(self, reason: str, msg: str, *args: object, exc_info: ExcInfo = None) -> None:
        self._log(logging.INFO, reason, msg, args, exc_info)

    def warning(self, reason: str, msg: str, *args: object, exc_info: ExcInfo = None) -> None:
        self._log(logging.WARNING, reason, msg, args, exc_info)

    def error(self, reason: str, msg: str, *args: object, exc_info: ExcInfo = None) -> None:
        self._log(logging.ERROR, reason, msg, args, exc_info)

    def pending(self) -> dict[str, int]:
        """The number of lines suppressed and not yet reported, by reason."""
        return {reason: r.suppressed for reason, r in self._reasons.items() if r.suppressed}

    def flush(self) -> None:
        """Log one summary line for every reason that has suppressed lines (at shutdown).

        The line has the level of the most severe suppressed line and shows the
        last one. The counts start again from zero; the intervals go on.
        """
        now = self._now()
        for reason, r in self._reasons.items():
            if not r.suppressed:
                continue
            self.logger.log(
                r.level,
                "%d more like this suppressed in the last %s (%s); the last: %s",
                r.suppressed,
                _seconds(max(0.0, now - r.logged_at)),
                reason,
                _format(r.msg, r.args),
                stacklevel=2,
            )
            r.suppressed, r.level, r.msg, r.args = 0, logging.NOTSET, "", ()

    def _log(
        self,
        level: int,
        reason: str,
        msg: str,
        args: tuple[object, ...],
        exc_info: ExcInfo,
    ) -> None:
        now = self._now()
        r = self._reasons.get(reason)
        if r is not None and 0 <= now - r.logged_at < self.interval:
            r.suppressed += 1
            r.level = max(r.level, level)
            r.msg, r.args = msg, args
            if self._suppressed is not None:
                self._suppressed.labels(reason=reason).inc()
            return
        if r is not None and r.suppressed:
            since = _seconds(max(0.0, now - r.logged_at))
            args = (_format(msg, args), r.suppressed, since)
            msg = "%s (and %d more like it in the last %s)"
        if r is None:
            self._reasons[reason] = _Reason(now)
            while len(self._reasons) > self.max_reasons:
                self._reasons.popitem(last=False)
        else:
            r.logged_at, r.suppressed, r.level, r.msg, r.args = now, 0, logging.NOTSET, "", ()
            self._reasons.move_to_end(reason)
        # stacklevel 3: the record names the caller of log()/warning(), not this module.
        self.logger.log(level, msg, *args, exc_info=exc_info, stacklevel=3)

    def _now(self) -> float:
        if self._clock is not None:
            return self._clock()
        try:
            return trio.current_time()
        except RuntimeError:  # not in a trio run
            return time.monotonic()


def _seconds(seconds: float) -> str:
    """``10s``, ``2.5s``, ``0.05s``: a duration as people write it."""
    return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.2g}s"


def _format(msg: str, args: tuple[object, ...]) -> str:
    """``msg % args`` as logging would do it, never raising."""
    if not args:
        return msg
    # A lone mapping is formatted by name, as logging.LogRecord does.
    values: object = args[0] if len(args) == 1 and isinstance(args[0], Mapping) else args
    try:
        return msg % values
    except (TypeError, ValueError):
        return f"{msg} {args!r}"
