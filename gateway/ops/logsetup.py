"""How ``gateway run`` logs: text for people or JSON lines for machines.

:func:`setup_logging` installs one handler on the root logger, writing to
standard error either the classic text line (``time level logger: message``)
or one JSON object per line with ``time`` (UTC, ISO 8601, milliseconds),
``level``, ``logger``, ``message``, then every extra field of the record:
those passed with ``extra=`` and those of the :func:`log_context` of the
task that logged (``listener`` and ``peer`` for everything logged about a
connection, ``upstream`` for an upstream), and ``exception`` with the
traceback when there is one. A worker process of ``gateway run --workers N``
says which it is on every line (:func:`log_process`): ``"worker": 2`` in
JSON, ``[worker 2]`` after the level in text.

Levels and formats are case-insensitive: ``INFO``, ``Debug`` and ``info`` are
the same level. Every line's length, and the rate of lines about peers, are
bounded (:class:`gateway.ops.loglines.LineGuard`).
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import sys
from collections.abc import Mapping
from typing import IO, Any

from gateway.ops.loglines import line_guard

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "TEXT_FORMAT",
    "ContextFilter",
    "JsonFormatter",
    "check_format",
    "check_level",
    "log_context",
    "log_process",
    "parse_format",
    "parse_level",
    "setup_logging",
]

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")
#: The text format's line.
TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"

#: Fields added to every record this process logs (:func:`log_process`).
_process: dict[str, object] = {}

#: Fields added to every record the current task (and the tasks it starts) logs.
_context: contextvars.ContextVar[Mapping[str, object] | None] = contextvars.ContextVar(
    "interchange_log_context", default=None
)

#: What every LogRecord has; anything else on a record is an extra field.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def log_context(**fields: object) -> None:
    """Add ``fields`` (``listener=…``, ``peer=…``) to every record logged from now on
    by the current trio task, and by the tasks it starts from now on.

    A trio task runs in a copy of its parent's context, so this never leaks
    into other connections' tasks.
    """
    current = _context.get()
    _context.set({**current, **fields} if current else fields)


def log_process(worker: int) -> None:
    """Mark every record of this process as worker ``worker``'s (call before
    :func:`setup_logging`, whose text format then shows it)."""
    _process["worker"] = worker


def parse_level(value: str) -> str:
    """``"INFO"`` → ``"info"``; ValueError for anything but a level of :data:`LOG_LEVELS`."""
    level = str(value).lower()
    if level not in LOG_LEVELS:
        raise ValueError(f"must be one of {', '.join(map(repr, LOG_LEVELS))}, got {value!r}")
    return level


def parse_format(value: str) -> str:
    """``"JSON"`` → ``"json"``; ValueError for anything but a format of :data:`LOG_FORMATS`."""
    fmt = str(value).lower()
    if fmt not in LOG_FORMATS:
        raise ValueError(f"must be one of {', '.join(map(repr, LOG_FORMATS))}, got {value!r}")
    return fmt


def check_level(value: object) -> None:
    """Raise ValueError unless ``value`` names a level, in any case (config checks)."""
    parse_level(str(value))


def check_format(value: object) -> None:
    """Raise ValueError unless ``value`` names a format, in any case (config checks)."""
    parse_format(str(value))


class ContextFilter(logging.Filter):
    """Puts the logging task's :func:`log_context` fields on each record (never
    overriding a field the call passed with ``extra=``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _process.items():
            if key not in record.__dict__:
                setattr(record, key, value)
        fields = _context.get()
        if fields:
            for key, value in fields.items():
                if key not in record.__dict__:
                    setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, then the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": _iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_") and key not in out:
                out[key] = _plain(value)
        if record.exc_text:
            out["exception"] = record.exc_text
        elif record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False, default=str)


#: The name of the handler :func:`setup_logging` installs.
_HANDLER = "interchange"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is logged (never a stale one)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, value: IO[str]) -> None:
        pass


def _iso_time(created: float) -> str:
    """``2026-01-02T03:04:05.678Z``."""
    when = dt.datetime.fromtimestamp(created, tz=dt.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _plain(value: object) -> object:
    """``value`` if JSON has it as such, else its ``str``."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def setup_logging(
    level: str = "info",
    fmt: str = "text",
    stream: IO[str] | None = None,
    *,
    unless_configured: bool = False,
) -> logging.Handler | None:
    """Log records at ``level`` and above to ``stream`` (standard error) in ``fmt``.

    Replaces a handler an earlier call installed; handlers of others stay.
    With ``unless_configured``, does nothing (and returns None) when the root
    logger has handlers of others already, as :func:`logging.basicConfig`
    does: an application embedding the gateway (or a test run) keeps its own.
    Raises ValueError for an unknown level or format.
    """
    name = parse_level(level)
    fmt = parse_format(fmt)
    root = logging.getLogger()
    if unless_configured and any(h.get_name() != _HANDLER for h in root.handlers):
        return None
    handler = _StderrHandler() if stream is None else logging.StreamHandler(stream)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        text = TEXT_FORMAT
        if "worker" in _process:
            text = text.replace("%(name)s", f"[worker {_process['worker']}] %(name)s")
        handler.setFormatter(logging.Formatter(text))
    handler.addFilter(ContextFilter())
    # After the context: it guards the lines about peers (those with a peer field).
    handler.addFilter(line_guard)
    handler.set_name(_HANDLER)
    for old in list(root.handlers):
        if old.get_name() == _HANDLER:
            root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, name.upper()))
    return handler
