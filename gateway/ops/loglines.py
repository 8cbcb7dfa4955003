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

Lines a peer provokes without a reason key are guarded all the same: the
:class:`LineGuard` that :func:`gateway.ops.logsetup.setup_logging` puts on the
gateway's handler cuts every quoted value and every message to a bounded
length, and lets at most ``burst`` lines about peers (records that carry a
``peer`` field: everything logged while serving a connection) through per
logger and message template per interval, counting the rest the same way.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeAlias, TypeGuard

import prometheus_client
import trio

__all__ = ["TEMPLATE", "ExcInfo", "LineGuard", "Throttled", "line_guard", "quote"]

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
        return self._clock() if self._clock is not None else _now()


def _now() -> float:
    """trio's clock inside a trio run (a test's mock clock drives the intervals), else
    the monotonic clock."""
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


#: The record attribute that holds a message's template when an adapter put a prefix
#: (the peer's address) before it: lines are rate-limited by template.
TEMPLATE = "_template"
#: A value quoted in a log line is cut to this many characters.
MAX_QUOTE = 200
#: A log line's message (the traceback apart) is cut to this many characters.
MAX_MESSAGE = 2000
#: A traceback is cut to this many characters (its exception's text may quote a peer).
MAX_EXCEPTION = 8000


def quote(value: object, limit: int = MAX_QUOTE) -> str:
    """``repr(value)``, cut to ``limit`` characters with the length said: for peer input
    (names, paths, headers) in log lines and error texts."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters cut)"


class LineGuard(logging.Filter):
    """Bounds every line's length, and the rate of lines about peers.

    Length: a str, bytes or bytearray argument longer than MAX_QUOTE is cut, then a
    message longer than MAX_MESSAGE, then a traceback longer than MAX_EXCEPTION.
    Rate: a record with a ``peer`` field goes through if fewer than ``burst`` lines of
    its logger and template went through in the current ``interval``; the others are
    counted (in ``suppressed``, with the reason ``peer:LOGGER``, when set) and the
    next line that goes through says how many. Keys are code, never input: a logger
    name and a template; at most ``max_keys`` are remembered.
    """

    def __init__(
        self,
        interval: float = 10.0,
        burst: int = 5,
        *,
        clock: Callable[[], float] | None = None,
        max_keys: int = 1024,
    ) -> None:
        super().__init__()
        self.interval = interval
        self.burst = burst
        self.max_keys = max_keys
        #: ``Metrics().log_lines_suppressed`` once a gateway runs (it sets it).
        self.suppressed: prometheus_client.Counter | None = None
        self._clock = clock
        #: key -> [interval start, lines let through in it, lines suppressed since].
        self._windows: OrderedDict[tuple[str, str, int], list[float]] = OrderedDict()

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "peer", None) is not None and not self._admit(record):
            return False
        self._shorten(record)
        return True

    def _admit(self, record: logging.LogRecord) -> bool:
        now = self._clock() if self._clock is not None else _now()
        key = (record.name, str(getattr(record, TEMPLATE, record.msg)), record.levelno)
        window = self._windows.get(key)
        if window is None or not 0 <= now - window[0] < self.interval:
            missed = int(window[2]) if window is not None else 0
            window = self._windows[key] = [now, 0, 0]
            self._windows.move_to_end(key)
            while len(self._windows) > self.max_keys:
                self._windows.popitem(last=False)
            if missed:
                record.msg = (
                    f"{record.getMessage()} (and {missed} more like it suppressed in the last"
                    f" {_seconds(self.interval)})"
                )
                record.args = ()
        if window[1] >= self.burst:
            window[2] += 1
            if self.suppressed is not None:
                self.suppressed.labels(reason=f"peer:{record.name}").inc()
            return False
        window[1] += 1
        return True

    @staticmethod
    def _shorten(record: logging.LogRecord) -> None:
        args = record.args
        if isinstance(args, tuple) and any(_long(a) for a in args):
            record.args = tuple(_cut_value(a) if _long(a) else a for a in args)
        message = record.getMessage()
        if len(message) > MAX_MESSAGE:
            record.msg, record.args = _cut(message, MAX_MESSAGE), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and len(record.exc_text) > MAX_EXCEPTION:
            record.exc_text = _cut(record.exc_text, MAX_EXCEPTION)


def _cut_value(value: str | bytes | bytearray) -> str | bytes:
    """A long quoted value cut to MAX_QUOTE, of its own type (``%r`` still quotes it)."""
    if isinstance(value, str):
        return f"{value[:MAX_QUOTE]}… ({len(value)} characters)"
    return bytes(value[:MAX_QUOTE]) + b"... (%d bytes)" % len(value)


def _long(value: object) -> TypeGuard[str | bytes | bytearray]:
    return isinstance(value, str | bytes | bytearray) and len(value) > MAX_QUOTE


#: The guard :func:`gateway.ops.logsetup.setup_logging` installs on the gateway's handler.
line_guard = LineGuard()
