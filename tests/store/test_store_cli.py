"""``gateway store inspect`` and ``gateway store verify``."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import trio

from gateway.cli import main
from gateway.store import Store, frame_events

WRITER = uuid.UUID("12345678-1234-5678-1234-567812345678")
RECORD = frame_events([b"x" * 10, b"y" * 10])  # 36 bytes


async def make_store(data_dir: Path) -> None:
    async with Store.open(data_dir / "store", chunk_bytes=100) as store:
        segment = store.segment("scope/stream/0")
        assert segment is not None
        for n in range(1, 6):
            segment.append(RECORD, 2, writer=WRITER, last_event_number=2 * n)
        store.segment("other")


def damage_second_record(data_dir: Path) -> None:
    (first, *_) = sorted((data_dir / "store" / "segments" / "scope%2Fstream%2F0").glob("*.data"))
    with open(first, "r+b") as f:
        f.seek(36 + 20)
        f.write(b"!")


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["store", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_inspect_lists_segments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trio.run(make_store, tmp_path)
    status, out, _ = cli(capsys, "inspect", "--data-dir", str(tmp_path))
    assert status == 0
    lines = out.splitlines()
    assert lines[0].startswith("other: events 0..0 (0)")
    assert lines[1].startswith(
        "scope/stream/0: events 0..10 (10), bytes 0..180 (180 stored), 3 chunks, 5 records"
    )
    assert f"{WRITER}=10" in lines[2]


def test_inspect_one_segment_in_detail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trio.run(make_store, tmp_path)
    status, out, _ = cli(capsys, "inspect", "--data-dir", str(tmp_path), "scope/stream/0")
    assert status == 0
    assert "  chunk at byte 72: 72 bytes, events 4..8, 2 records" in out
    assert f"  writer {WRITER}: last event number 10" in out
    status, _, err = cli(capsys, "inspect", "--data-dir", str(tmp_path), "missing")
    assert status == 1
    assert "no segment 'missing'" in err


def test_verify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trio.run(make_store, tmp_path)
    status, out, _ = cli(capsys, "verify", "--data-dir", str(tmp_path))
    assert status == 0
    assert "2 segments, 5 records, 180 bytes verified: 0 corrupt records" in out
    damage_second_record(tmp_path)
    # The store closed cleanly, so opening it would not look: verify reads every byte.
    status, out, _ = cli(capsys, "verify", "--data-dir", str(tmp_path))
    assert status == 1
    assert "scope/stream/0: corrupt record at byte 36 (events 2..3)" in out
    assert "1 corrupt records" in out
    # Read-only: the store's files are as they were, and it still opens cleanly.
    assert (tmp_path / "store" / "clean").exists()


def test_verify_without_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = cli(capsys, "verify", "--data-dir", str(tmp_path))
    assert status == 1
    assert "no store in" in err


def test_the_data_dir_comes_from_the_config(tmp_path: Path) -> None:
    trio.run(make_store, tmp_path / "var")
    config = tmp_path / "gateway.toml"
    config.write_text('[gateway]\ndata_dir = "var"\n')
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "store", "inspect", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path.parent,
    )
    assert result.returncode == 0, result.stderr
    assert "scope/stream/0: events 0..10 (10)" in result.stdout


async def make_crash_image(data_dir: Path) -> None:
    """``make_store``'s segment, in one chunk, as a crash leaves it (copied while open:
    no clean marker), in ``data_dir/store``."""
    async with Store.open(data_dir / "original") as store:
        segment = store.segment("scope/stream/0")
        for n in range(1, 6):
            segment.append(RECORD, 2, writer=WRITER, last_event_number=2 * n)
        shutil.copytree(data_dir / "original", data_dir / "store")


async def open_and_close(data_dir: Path) -> int:
    """Start the store (recovery runs) and close it cleanly; its corrupt records."""
    async with Store.open(data_dir / "store") as store:
        return store.stats()["recovery_corrupt_records"]


def verify(data_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", "store", "verify", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_verify_exits_1_while_a_record_recovery_flagged_is_there(tmp_path: Path) -> None:
    trio.run(make_crash_image, tmp_path)
    damage_second_record(tmp_path)
    # Recovery verifies the chunks a crash may have torn and flags the record in place.
    assert trio.run(open_and_close, tmp_path) == 1
    result = verify(tmp_path)
    assert result.returncode == 1, result.stdout
    assert (
        "scope/stream/0: corrupt record at byte 36 (events 2..3): flagged damaged before"
        in result.stdout
    )
    assert "1 corrupt records" in result.stdout
    # Another start changes nothing: the record is still damaged, still exit status 1.
    assert trio.run(open_and_close, tmp_path) == 1
    assert verify(tmp_path).returncode == 1


def test_verify_exits_1_for_index_damage_until_a_start_repairs_it(tmp_path: Path) -> None:
    trio.run(make_store, tmp_path)
    (index, *_) = sorted((tmp_path / "store" / "segments" / "scope%2Fstream%2F0").glob("*.index"))
    with open(index, "r+b") as f:
        f.seek(20)
        f.write(b"!")  # the header's start
    result = verify(tmp_path)
    assert result.returncode == 1
    assert "index header of the chunk at byte 0 damaged: can be rebuilt" in result.stdout
    assert "1 index repairs for the next start" in result.stdout
    assert trio.run(open_and_close, tmp_path) == 0
    result = verify(tmp_path)
    assert result.returncode == 0, result.stdout
    assert "5 records, 180 bytes verified: 0 corrupt records" in result.stdout
