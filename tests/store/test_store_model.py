"""Random sequences of appends, reopens (clean and after a crash), truncations and
reads against a model: a list of every payload ever appended, and a first event."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.store import RecordFormat, SegmentTruncated, Store, frame_events

WRITERS = [uuid.UUID(int=i + 1) for i in range(3)]

appends = st.tuples(
    st.just("append"),
    st.lists(st.integers(0, 40), min_size=1, max_size=6),  # payload sizes
    st.integers(0, len(WRITERS)),  # a writer, or none
)
operations = st.lists(
    st.one_of(
        appends,
        appends,
        appends,
        st.tuples(st.just("reopen")),
        st.tuples(st.just("crash")),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("read"), st.floats(0, 1), st.integers(0, 200)),
        st.tuples(st.just("events"), st.floats(0, 1), st.integers(1, 20), st.integers(0, 200)),
    ),
    max_size=40,
)


def copy_tolerantly(source: Path, target: Path) -> None:
    """Copy a store that is open (a crash image); files may vanish under the copy."""
    for root, _, files in os.walk(source):
        relative = Path(root).relative_to(source)
        (target / relative).mkdir(parents=True, exist_ok=True)
        for name in files:
            try:
                shutil.copyfile(Path(root) / name, target / relative / name)
            except FileNotFoundError:
                continue


class Model:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.first = 0
        self.ledger: dict[uuid.UUID, int] = {}
        self.counter = 0

    def framed_from(self, event: int) -> bytes:
        return frame_events(self.payloads[event:])


async def run(ops: list[tuple[object, ...]], directory: Path, chunk_bytes: int) -> None:
    model = Model()
    generation = 0
    path = directory / "0"
    while True:
        async with Store.open(path, chunk_bytes=chunk_bytes) as store:
            segment = store.segment("s/0")
            assert segment is not None
            # What a reopen must give back.
            assert segment.next_event == len(model.payloads)
            assert segment.first_event <= model.first
            model.first = segment.first_event
            assert segment.read(segment.start, 10**6) == model.framed_from(model.first)
            for writer in WRITERS:
                assert segment.last_event_number(writer) == model.ledger.get(writer)
            reopen = None
            while ops:
                op = ops.pop(0)
                kind = op[0]
                if kind == "append":
                    sizes, w = op[1], op[2]
                    assert isinstance(sizes, list)
                    assert isinstance(w, int)
                    batch = [bytes([model.counter % 256]) * n for n in sizes]
                    model.counter += 1
                    writer = WRITERS[w - 1] if w else None
                    number = model.counter if writer else None
                    appended = segment.append(
                        frame_events(batch), len(batch), writer=writer, last_event_number=number
                    )
                    assert appended.first_event == len(model.payloads)
                    model.payloads += batch
                    if writer is not None and number is not None:
                        model.ledger[writer] = number
                elif kind == "truncate":
                    assert isinstance(op[1], float)
                    target = int(op[1] * len(model.payloads))
                    segment.truncate_before(target)
                    model.first = max(model.first, target)
                    assert segment.first_event == model.first
                elif kind == "read":
                    assert isinstance(op[1], float)
                    assert isinstance(op[2], int)
                    whole = frame_events(model.payloads)
                    start = segment.start
                    offset = start + int(op[1] * (len(whole) - start))
                    assert segment.read(offset, op[2]) == whole[offset : offset + op[2]]
                    try:
                        segment.read(start - 1, 1)
                        raise AssertionError("read below the start")
                    except (SegmentTruncated, ValueError):
                        pass
                elif kind == "events":
                    assert isinstance(op[1], float)
                    assert isinstance(op[2], int)
                    assert isinstance(op[3], int)
                    first = model.first + int(op[1] * (len(model.payloads) - model.first))
                    got = segment.read_events(first, op[2], op[3])
                    expected = model.payloads[first : first + op[2]]
                    assert [p for _, p in got] == expected[: len(got)]
                    assert all(f is RecordFormat.RAW for f, _ in got)
                    if expected:
                        assert got
                        if len(got) < len(expected):
                            assert sum(map(len, expected[: len(got) + 1])) > op[3]
                    assert segment.event_offset(first) == len(frame_events(model.payloads[:first]))
                else:
                    reopen = kind
                    break
            if reopen == "crash":
                generation += 1
                crash = directory / str(generation)
                copy_tolerantly(path, crash)
        if reopen is None:
            return
        if reopen == "crash":
            path = crash


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(ops=operations, chunk_bytes=st.sampled_from([40, 200, 10**6]))
def test_random_sequences_match_the_model(ops: list[tuple[object, ...]], chunk_bytes: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        trio.run(run, list(ops), Path(directory), chunk_bytes)
