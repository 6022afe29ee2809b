"""The checkpoint history's sweep of data files that a failed append left unreferenced."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from streamkeeper.observability.history import (
    UNREFERENCED_MIN_AGE,
    CheckpointHistory,
    record_from_progress,
)
from streamkeeper.storage import Location
from tests.unit.test_client import _progress

PREFIX = "lineages/j/history"


def _left_file(folder: Path, name: str, age: float) -> Path:
    """A data file as a failed append leaves it: written, never committed."""
    path = folder / name
    pq.write_table(pa.table({"checkpoint_id": [99]}), path)
    then = time.time() - age
    os.utime(path, (then, then))
    return path


def test_old_unreferenced_files_go_young_ones_wait_and_committed_rows_stay(
    tmp_path: Path,
) -> None:
    history = CheckpointHistory(Location(str(tmp_path)).child(PREFIX))
    for seq in range(3):
        history.append([record_from_progress(_progress(seq), commit_seq=seq)])
    folder = tmp_path / PREFIX
    committed = sorted(p.name for p in folder.glob("*.parquet"))
    old = _left_file(folder, "part-00000-old-c000.snappy.parquet", UNREFERENCED_MIN_AGE + 60)
    young = _left_file(folder, "part-00000-young-c000.snappy.parquet", 5)

    assert history.sweep_unreferenced() == 1  # the young one waits for a later sweep
    assert not old.exists() and young.exists()
    assert sorted(p.name for p in folder.glob("*.parquet")) == sorted([*committed, young.name])
    assert [r["checkpoint_id"] for r in history.read()] == [0, 1, 2]
    assert (folder / "_delta_log").is_dir()

    assert history.sweep_unreferenced(now=time.time() + UNREFERENCED_MIN_AGE) == 0
    assert not young.exists()
    assert [r["checkpoint_id"] for r in history.read()] == [0, 1, 2]


def test_a_table_whose_first_append_failed_is_swept_whole(tmp_path: Path) -> None:
    history = CheckpointHistory(Location(str(tmp_path)).child(PREFIX))
    folder = tmp_path / PREFIX
    folder.mkdir(parents=True)
    left = _left_file(folder, "part-00000-first-c000.snappy.parquet", UNREFERENCED_MIN_AGE + 1)
    assert history.sweep_unreferenced() == 0
    assert not left.exists() and history.read() == []


def test_no_folder_is_nothing_to_sweep(tmp_path: Path) -> None:
    history = CheckpointHistory(Location(str(tmp_path)).child(PREFIX))
    assert history.sweep_unreferenced() == 0
