"""The shared accept loop (runtime.accept.accept_forever): out of descriptors is not a crash."""

from __future__ import annotations

import errno
import logging
import os
import re
import socket
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import trio
import trio.testing

from gateway.ops.loglines import Throttled
from gateway.ops.metrics import Metrics
from gateway.runtime.accept import CAPACITY_ERRNOS, accept_forever

LOGGER = "test.accept"


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


class FakeStream(trio.abc.Stream):
    """A stream that only knows whether it was closed."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        raise NotImplementedError

    async def wait_send_all_might_not_block(self) -> None:
        raise NotImplementedError

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        raise NotImplementedError

    async def aclose(self) -> None:
        self.closed = True
        await trio.lowlevel.checkpoint()


class FakeListener(trio.abc.Listener[trio.abc.Stream]):
    """Fails ``accept()`` with each of ``failures`` in turn, then hands out ``streams``
    streams, then waits forever."""

    def __init__(self, failures: list[OSError], streams: int = 0) -> None:
        self.failures = list(failures)
        self.streams = streams
        self.handed_out = 0
        self.closed = False

    async def accept(self) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        if self.failures:
            raise self.failures.pop(0)
        if self.handed_out < self.streams:
            self.handed_out += 1
            return FakeStream(self.handed_out)
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.closed = True
        await trio.lowlevel.checkpoint()


def emfile() -> OSError:
    return OSError(errno.EMFILE, os.strerror(errno.EMFILE))


def accept_errors(metrics: Metrics, listener: str, error: str) -> float | None:
    return metrics.value("interchange_accept_errors_total", {"listener": listener, "error": error})


def throttled(metrics: Metrics) -> Throttled:
    return Throttled(logging.getLogger(LOGGER), 10.0, suppressed=metrics.log_lines_suppressed)


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    tracebacks = [r for r in caplog.records if r.exc_info is not None or r.exc_text]
    assert tracebacks == []


@pytest.mark.parametrize("failures", [1, 50, 250])
async def test_emfile_is_counted_logged_once_per_interval_and_retried(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture, failures: int
) -> None:
    metrics = Metrics()
    listener = FakeListener([emfile() for _ in range(failures)], streams=3)
    handled: list[trio.abc.Stream] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: accept_forever(
                listener,
                handled.append,
                name="tcp",
                log=throttled(metrics),
                errors=metrics.accept_errors,
                retry=0.1,
            )
        )
        start = trio.current_time()
        while len(handled) < 3:
            await trio.sleep(0.01)
        elapsed = trio.current_time() - start
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()

    # The loop survived every failure, waiting 0.1 s after each, and handed on the streams.
    assert [s.n for s in handled] == [1, 2, 3]  # type: ignore[attr-defined]
    assert not any(s.closed for s in handled)  # type: ignore[attr-defined]
    assert elapsed == pytest.approx(failures * 0.1, abs=0.02)
    assert accept_errors(metrics, "tcp", "EMFILE") == failures
    assert listener.closed, "the listener is closed when the loop ends"

    warnings = [r for r in caplog.records if r.name == LOGGER]
    assert all(r.levelno == logging.WARNING for r in warnings)
    # At most one line per 10 s interval: at 0 s, 10 s, 20 s of failing.
    assert len(warnings) == 1 + int((failures - 1) * 0.1 // 10)
    assert warnings[0].getMessage() == (
        "listener tcp: accept failed: EMFILE (Too many open files); retrying in 0.1s"
    )
    if len(warnings) > 1:
        # 99 or 100 failures in 10 s, as the 0.1 s sleeps add up in floating point.
        assert re.search(
            r"\(and (99|100) more like it in the last 10s\)$", warnings[1].getMessage()
        )
    suppressed = failures - len(warnings)
    assert metrics.value(
        "interchange_log_lines_suppressed_total", {"reason": "accept:tcp:EMFILE"}
    ) == (suppressed or None)
    assert_no_traceback(caplog)


async def test_every_capacity_errno_is_survived_and_counted_apart(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    codes = sorted(CAPACITY_ERRNOS)
    listener = FakeListener([OSError(code, os.strerror(code)) for code in codes], streams=1)
    handled: list[trio.abc.Stream] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: accept_forever(
                listener,
                handled.append,
                name="l",
                log=throttled(metrics),
                errors=metrics.accept_errors,
            )
        )
        while not handled:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS} == CAPACITY_ERRNOS
    for code in codes:
        assert accept_errors(metrics, "l", errno.errorcode[code]) == 1
    # Different errnos are different reasons: each gets its line.
    assert len([r for r in caplog.records if r.name == LOGGER]) == len(codes)
    assert_no_traceback(caplog)


async def test_without_a_counter_the_loop_still_survives(
    autojump_clock: trio.abc.Clock, caplog: pytest.LogCaptureFixture
) -> None:
    listener = FakeListener([emfile(), emfile()], streams=1)
    handled: list[trio.abc.Stream] = []
    log = Throttled(logging.getLogger(LOGGER), 10.0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: accept_forever(listener, handled.append, name="l", log=log))
        while not handled:
            await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    assert log.pending() == {"accept:l:EMFILE": 1}


@pytest.mark.parametrize("code", [errno.EBADF, errno.EINVAL, errno.ENOTSOCK, None])
async def test_other_errors_propagate_and_close_the_listener(
    autojump_clock: trio.abc.Clock, code: int | None
) -> None:
    metrics = Metrics()
    failure = OSError(code, "boom") if code is not None else OSError("no errno")
    listener = FakeListener([emfile(), failure], streams=1)
    handled: list[trio.abc.Stream] = []
    with pytest.raises(OSError) as info:
        await accept_forever(
            listener,
            handled.append,
            name="l",
            log=throttled(metrics),
            errors=metrics.accept_errors,
        )
    assert info.value is failure
    assert handled == []
    assert listener.closed
    assert accept_errors(metrics, "l", "EMFILE") == 1


async def test_a_failing_handler_closes_its_stream_and_ends_the_loop(
    autojump_clock: trio.abc.Clock,
) -> None:
    listener = FakeListener([], streams=2)
    seen: list[FakeStream] = []

    def handle(stream: trio.abc.Stream) -> None:
        assert isinstance(stream, FakeStream)
        seen.append(stream)
        raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        await accept_forever(listener, handle, name="l", log=throttled(Metrics()))
    assert [s.closed for s in seen] == [True]
    assert listener.closed


async def test_cancelling_closes_the_listener(autojump_clock: trio.abc.Clock) -> None:
    listener = FakeListener([])
    with trio.move_on_after(1):
        await accept_forever(listener, lambda s: None, name="l", log=throttled(Metrics()))
    assert listener.closed


# -- for real: the process runs out of file descriptors --------------------------------


def open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.fixture
def nofile_limit() -> Iterator[tuple[int, int]]:
    """The process's RLIMIT_NOFILE, restored after the test whatever the test did to it."""
    resource = pytest.importorskip("resource")
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("needs /proc/self/fd to count open descriptors")
    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        yield limits
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


async def test_a_real_listener_survives_running_out_of_descriptors(
    autojump_clock: trio.abc.Clock,
    caplog: pytest.LogCaptureFixture,
    nofile_limit: tuple[int, int],
) -> None:
    import resource

    metrics = Metrics()
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    clients = 8
    handled: list[trio.abc.Stream] = []
    with ExitStack() as stack:
        # Connected before the limit is lowered: they wait in the backlog, unaccepted.
        for _ in range(clients):
            stack.enter_context(socket.create_connection(("127.0.0.1", port)))
        try:
            # Room for two more descriptors (new ones take the lowest free numbers).
            used = open_fds()
            limit = next(n for n in range(len(used) + 3) if n - len(used & set(range(n))) == 2)
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, nofile_limit[1]))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    lambda: accept_forever(
                        listener,
                        handled.append,
                        name="tcp",
                        log=throttled(metrics),
                        errors=metrics.accept_errors,
                    )
                )
                while not accept_errors(metrics, "tcp", "EMFILE"):
                    await trio.sleep(0.01)
                await trio.sleep(30)  # 300 more failures, three log lines
                assert 1 <= len(handled) < clients
                assert (accept_errors(metrics, "tcp", "EMFILE") or 0) >= 300

                resource.setrlimit(resource.RLIMIT_NOFILE, nofile_limit)
                while len(handled) < clients:
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, nofile_limit)
            for stream in handled:
                await trio.aclose_forcefully(stream)

    assert len(handled) == clients
    assert listener.socket.fileno() == -1, "the listener is closed when the loop ends"
    warnings = [r for r in caplog.records if r.name == LOGGER]
    assert 3 <= len(warnings) <= 4, [r.getMessage() for r in warnings]
    assert "accept failed: EMFILE (Too many open files)" in warnings[0].getMessage()
    assert_no_traceback(caplog)
