"""When appends become durable under each fsync policy, and what a group commit costs."""

from __future__ import annotations

import os
import threading
import uuid
from pathlib import Path

import pytest
import trio
import trio.testing

from gateway.store import Store, frame_events

ONE = frame_events([b"event"])


async def settled(store: Store) -> None:
    """Wait for the committer's first commit (the new segment's directories)."""
    while not store.stats()["commits"]:
        await trio.sleep(0.01)


async def test_never_is_durable_once_written(tmp_path: Path) -> None:
    async with Store.open(tmp_path, fsync="never") as store:
        segment = store.segment("s")
        assert segment is not None
        writer = uuid.uuid4()
        appended = segment.append(ONE, 1, writer=writer, last_event_number=7)
        assert segment.durable_end == appended.end
        assert segment.last_event_number(writer) == 7
        called: list[str] = []
        segment.when_durable(appended.end, lambda: called.append("now"))
        assert called == ["now"]  # synchronously
        assert store.stats()["fsyncs"] == 0


async def test_interval_group_commit(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with Store.open(tmp_path, fsync="interval", fsync_interval=0.5) as store:
        segment = store.segment("s")
        assert segment is not None
        await settled(store)  # the creation's directory syncs
        before = store.stats()
        t0 = trio.current_time()
        writer = uuid.uuid4()
        ends = [
            segment.append(ONE, 1, writer=writer, last_event_number=n).end for n in range(1, 1001)
        ]
        assert segment.durable_end == 0
        assert segment.last_event_number(writer) is None
        assert segment.last_event_number(writer, durable=False) == 1000
        await segment.durable(ends[-1])
        assert trio.current_time() - t0 >= 0.5  # no sooner than the interval allows
        assert segment.durable_end == ends[-1]
        assert segment.last_event_number(writer) == 1000
        after = store.stats()
        # A thousand appends, one commit: the data and the index of the chunk.
        assert after["commits"] - before["commits"] == 1
        assert after["fsyncs"] - before["fsyncs"] == 2


async def test_interval_waits_between_commits(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with Store.open(tmp_path, fsync="interval", fsync_interval=1.0) as store:
        segment = store.segment("s")
        assert segment is not None
        durable_at: list[float] = []
        for _ in range(3):
            end = segment.append(ONE, 1).end
            await segment.durable(end)
            durable_at.append(trio.current_time())
        assert durable_at[1] - durable_at[0] >= 1.0
        assert durable_at[2] - durable_at[1] >= 1.0


async def test_callbacks_run_in_order_of_end(tmp_path: Path) -> None:
    async with Store.open(tmp_path, fsync="interval", fsync_interval=0.001) as store:
        segment = store.segment("s")
        assert segment is not None
        ends = [segment.append(ONE, 1).end for _ in range(3)]
        order: list[int] = []
        for end in reversed(ends):
            segment.when_durable(end, lambda end=end: order.append(end))
        assert order == []
        await segment.durable(ends[-1])
        assert order == ends


async def test_always_needs_an_fsync_that_started_after_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.fdatasync
    entered = threading.Event()
    release = threading.Event()

    def slow_fdatasync(fd: int) -> None:
        entered.set()
        release.wait(10)
        real(fd)

    async with Store.open(tmp_path, fsync="always") as store:
        segment = store.segment("s")
        assert segment is not None
        await settled(store)  # the creation's directory syncs
        monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
        first = segment.append(ONE, 1).end
        await trio.to_thread.run_sync(entered.wait)  # the committer is inside its fsync
        second = segment.append(ONE, 1).end  # written while that fsync runs
        release.set()
        await segment.durable(first)
        assert segment.durable_end == first  # the fsync in flight does not count for it
        await segment.durable(second)
        assert segment.durable_end == second


async def test_always_ignores_the_interval(tmp_path: Path) -> None:
    async with Store.open(tmp_path, fsync="always", fsync_interval=3600) as store:
        segment = store.segment("s")
        assert segment is not None
        with trio.fail_after(10):
            for _ in range(5):
                await segment.durable(segment.append(ONE, 1).end)


async def test_close_makes_everything_durable(tmp_path: Path) -> None:
    called: list[int] = []
    async with Store.open(tmp_path, fsync="interval", fsync_interval=3600) as store:
        segment = store.segment("s")
        assert segment is not None
        await segment.durable(segment.end)
        end = segment.append(ONE, 1).end
        segment.when_durable(end, lambda: called.append(end))
    assert called == [end]
    assert segment.durable_end == end


@pytest.mark.parametrize("fsync", ["never", "interval", "always"])
async def test_a_state_saved_just_before_close_is_kept(tmp_path: Path, fsync: str) -> None:
    # The committer takes the pending state as the close arrives: it must still be
    # written (by that commit or the final one), not lost between the two.
    for round_ in range(5):
        async with Store.open(tmp_path, fsync=fsync) as store:  # type: ignore[arg-type]
            await trio.sleep(0.01)  # the committer is idle, waiting for work
            store.save_state("owner", {"round": round_})
        async with Store.open(tmp_path) as store:
            assert store.load_state("owner") == {"round": round_}
