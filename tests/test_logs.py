"""Rate-limited logging (gateway.ops.loglines.Throttled): one line per reason per interval."""

from __future__ import annotations

import logging

import pytest
import trio

import gateway.ops.loglines
from gateway.ops.loglines import Throttled
from gateway.ops.metrics import Metrics

LOGGER = "test.throttled"


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    return caplog


def throttled(clock: FakeClock, metrics: Metrics | None = None, **kw: object) -> Throttled:
    suppressed = metrics.log_lines_suppressed if metrics is not None else None
    return Throttled(
        logging.getLogger(LOGGER),
        10.0,
        suppressed=suppressed,
        clock=clock,
        **kw,  # type: ignore[arg-type]
    )


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


def suppressed(metrics: Metrics, reason: str) -> float | None:
    return metrics.value("interchange_log_lines_suppressed_total", {"reason": reason})


def test_the_first_line_is_logged_at_once_naming_its_caller(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    t = throttled(clock)
    t.warning("r", "listener %s: %s", "tcp", "EMFILE")
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "listener tcp: EMFILE"
    assert record.exc_info is None
    # The record points at the code that logged, not at gateway/ops/loglines.py.
    assert record.funcName == "test_the_first_line_is_logged_at_once_naming_its_caller"
    assert record.pathname == __file__


def test_repeats_within_the_interval_are_counted_not_logged(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    t = throttled(clock, metrics)
    t.warning("r", "full: %d", 0)
    for i in range(1, 1235):
        clock.now += 0.001
        t.warning("r", "full: %d", i)
    assert messages(caplog) == ["full: 0"]
    assert suppressed(metrics, "r") == 1234
    assert t.pending() == {"r": 1234}

    clock.now = 1000.0 + 9.999  # still within the interval of the first line
    t.warning("r", "full: %d", 1235)
    assert messages(caplog) == ["full: 0"]
    assert suppressed(metrics, "r") == 1235

    clock.now = 1000.0 + 10.0  # the interval has ended: the next line says what was missed
    t.warning("r", "full: %d", 1236)
    assert messages(caplog) == ["full: 0", "full: 1236 (and 1235 more like it in the last 10s)"]
    assert caplog.records[-1].levelno == logging.WARNING
    assert t.pending() == {}
    assert suppressed(metrics, "r") == 1235  # the logged line is not counted

    # A new interval starts at that line.
    clock.now += 5
    t.warning("r", "full: %d", 1237)
    clock.now += 5
    t.error("r", "gone")
    assert messages(caplog)[2:] == ["gone (and 1 more like it in the last 10s)"]
    assert caplog.records[-1].levelno == logging.ERROR


def test_a_line_after_a_quiet_interval_has_no_suffix(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    t = throttled(clock)
    t.info("r", "one")
    clock.now += 60
    t.info("r", "two")
    assert messages(caplog) == ["one", "two"]


def test_the_suffix_names_the_time_since_the_last_logged_line(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    t = throttled(clock)
    t.info("r", "one")
    clock.now += 1
    t.info("r", "suppressed")
    clock.now += 119
    t.info("r", "two")
    assert messages(caplog) == ["one", "two (and 1 more like it in the last 120s)"]


def test_percent_signs_and_arguments_survive_the_suffix(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    t = throttled(clock)
    t.warning("a", "disk 100% full")
    t.warning("a", "disk 100% full")
    t.warning("b", "%(what)s is %(how)s", {"what": "disk", "how": "full"})
    t.warning("b", "x")
    clock.now += 10
    t.warning("a", "disk 100% full")
    t.warning("b", "%(what)s is %(how)s", {"what": "disk", "how": "full"})
    assert messages(caplog) == [
        "disk 100% full",
        "disk is full",
        "disk 100% full (and 1 more like it in the last 10s)",
        "disk is full (and 1 more like it in the last 10s)",
    ]


def test_reasons_are_independent(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics()
    t = throttled(clock, metrics)
    t.warning("accept:a:EMFILE", "a")
    t.warning("accept:b:EMFILE", "b")
    t.warning("accept:a:EMFILE", "a again")
    t.warning("accept:a:ENFILE", "a, other errno")
    assert messages(caplog) == ["a", "b", "a, other errno"]
    assert suppressed(metrics, "accept:a:EMFILE") == 1
    assert suppressed(metrics, "accept:b:EMFILE") is None
    assert t.pending() == {"accept:a:EMFILE": 1}


def test_log_takes_a_level_and_exc_info(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    t = throttled(clock)
    try:
        raise ValueError("boom")
    except ValueError:
        t.log(logging.ERROR, "r", "failed: %s", "x", exc_info=True)
        t.log(logging.ERROR, "r", "failed: %s", "y", exc_info=True)
    [record] = caplog.records
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "failed: x"
    assert record.exc_info is not None
    assert record.exc_info[0] is ValueError


def test_a_logger_adapter_is_accepted(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    adapter = logging.LoggerAdapter(logging.getLogger(LOGGER), {"listener": "tcp"})
    t = Throttled(adapter, 10.0, clock=clock)
    t.warning("r", "one")
    t.warning("r", "two")
    [record] = caplog.records
    assert record.getMessage() == "one"
    assert record.funcName == "test_a_logger_adapter_is_accepted"


def test_flush_summarises_every_reason_with_suppressed_lines(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    t = throttled(clock)
    t.warning("quiet", "logged once")
    t.info("busy", "first")
    clock.now += 3
    t.info("busy", "n=%d", 1)
    t.warning("busy", "n=%d", 2)
    t.info("busy", "n=%d", 3)
    caplog.clear()

    t.flush()
    [record] = caplog.records
    # The most severe level among the suppressed lines, the count, the reason, the last one.
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "3 more like this suppressed in the last 3s (busy); the last: n=3"
    assert record.exc_info is None

    caplog.clear()
    t.flush()  # nothing new was suppressed
    assert caplog.records == []
    # The interval goes on: a line within it is still suppressed.
    t.info("busy", "n=%d", 4)
    assert caplog.records == []
    assert t.pending() == {"busy": 1}


def test_state_is_bounded_dropping_the_least_recently_logged(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    t = throttled(clock, max_reasons=3)
    for reason in ["a", "b", "c"]:
        t.warning(reason, reason)
    clock.now += 10
    t.warning("a", "a")  # logged again: now the most recently logged
    for i in range(1000):
        t.warning(f"r{i}", "flood")
    assert len(t._reasons) == 3
    assert list(t._reasons) == ["r997", "r998", "r999"]
    caplog.clear()
    t.warning("a", "a, forgotten, so logged")
    t.warning("r999", "still remembered, so suppressed")
    assert messages(caplog) == ["a, forgotten, so logged"]


def test_the_default_clock_outside_trio_is_monotonic(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [50.0]
    monkeypatch.setattr(gateway.ops.loglines.time, "monotonic", lambda: now[0])
    t = Throttled(logging.getLogger(LOGGER), 10.0)
    t.warning("r", "one")
    t.warning("r", "two")
    now[0] += 10
    t.warning("r", "three")
    assert messages(caplog) == ["one", "three (and 1 more like it in the last 10s)"]


async def test_the_default_clock_inside_trio_is_trio_time(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    t = Throttled(logging.getLogger(LOGGER), 10.0)
    t.warning("r", "one")
    await trio.sleep(9)
    t.warning("r", "two")
    await trio.sleep(1)
    t.warning("r", "three")
    assert messages(caplog) == ["one", "three (and 1 more like it in the last 10s)"]


def test_a_clock_that_went_backwards_ends_the_interval(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    t = throttled(clock)
    t.warning("r", "one")
    clock.now -= 500  # another trio run's clock, say
    t.warning("r", "two")
    assert messages(caplog) == ["one", "two"]


def test_zero_interval_logs_everything(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    t = Throttled(logging.getLogger(LOGGER), 0, clock=clock)
    for i in range(3):
        t.warning("r", "n=%d", i)
    assert messages(caplog) == ["n=0", "n=1", "n=2"]


@pytest.mark.parametrize(("interval", "max_reasons"), [(-1.0, 10), (10.0, 0)])
def test_bad_arguments_are_refused(interval: float, max_reasons: int) -> None:
    with pytest.raises(ValueError):
        Throttled(logging.getLogger(LOGGER), interval, max_reasons=max_reasons)


# -- the line guard: every line bounded, lines about peers rate-limited ------------------


def guarded(clock: FakeClock, metrics: Metrics | None = None) -> tuple[logging.Logger, list[str]]:
    """A logger whose one handler has a fresh LineGuard; returns it and its output."""
    guard = gateway.ops.loglines.LineGuard(clock=clock)
    if metrics is not None:
        guard.suppressed = metrics.log_lines_suppressed
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.addFilter(guard)
    logger = logging.getLogger("test.guard")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    return logger, lines


def test_a_long_quoted_value_is_cut_with_its_length(clock: FakeClock) -> None:
    logger, lines = guarded(clock)
    name = "s" * 65535
    logger.warning("cannot create segment %r: %s", name, "too long", extra={"peer": "1.2.3.4:5"})
    assert len(lines) == 1
    assert len(lines[0]) < 400
    assert "(65535 characters)'" in lines[0]
    assert lines[0].endswith(": too long")


def test_a_long_message_and_a_long_traceback_are_cut(clock: FakeClock) -> None:
    logger, lines = guarded(clock)
    logger.warning("x" * 10_000)
    try:
        raise ValueError("y" * 100_000)
    except ValueError:
        logger.exception("failed")
    assert len(lines[0]) < gateway.ops.loglines.MAX_MESSAGE + 100
    assert "more characters cut" in lines[0]
    assert len(lines[1]) < gateway.ops.loglines.MAX_EXCEPTION + 200


def test_lines_about_peers_are_rate_limited_per_template(clock: FakeClock) -> None:
    metrics = Metrics()
    logger, lines = guarded(clock, metrics)
    for i in range(50):
        logger.warning("bad name from %s", i, extra={"peer": f"10.0.0.{i}:1"})
        logger.warning("other line %s", i, extra={"peer": f"10.0.0.{i}:1"})
        logger.warning("no peer %s", i)
    assert sum("bad name" in line for line in lines) == 5
    assert sum("other line" in line for line in lines) == 5
    assert sum("no peer" in line for line in lines) == 50  # not about a peer: all of them
    clock.now += 10
    logger.warning("bad name from %s", 99, extra={"peer": "10.0.0.99:1"})
    assert lines[-1] == "bad name from 99 (and 45 more like it suppressed in the last 10s)"
    value = metrics.registry.get_sample_value(
        "interchange_log_lines_suppressed_total", {"reason": "peer:test.guard"}
    )
    assert value == 90
