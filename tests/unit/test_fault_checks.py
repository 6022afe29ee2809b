"""The fault run's end-state checks (tests/support/fault_checks.py) on local tables written
through the runtime's committer: an exact lineage passes, and a repeated batch, a lost
one, a missing or repeated event, and leftovers are each reported."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.keyed_totals.sample_events import read_events, write_event_files
from streamkeeper.commit.tables import TableCommitter, TableTarget, ensure_table
from streamkeeper.commit.wal import DataFile, SinkBatch
from streamkeeper.storage import Location
from tests.support.fault_checks import (
    AWAITING_SWEEP,
    check_dedup,
    check_keyed,
    dedup_event,
    find_orphans,
    write_dedup_file,
)

CHANGES = pa.schema([("key", pa.string()), ("events", pa.int64()), ("total", pa.int64())])
UNIQUE = pa.schema([("event_id", pa.int64()), ("key", pa.string()), ("value", pa.int64())])


def _append(target: TableTarget, seq: int, rows: list[dict], schema: pa.Schema) -> None:
    """One batch's pre-committed file in `sk-lin/{seq}/`, committed with `seq`."""
    directory = Path(target.location.uri)
    relative = f"sk-lin/{seq:020d}/e1-{seq}.parquet"
    (directory / relative).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), directory / relative)
    stats = json.dumps({"numRecords": len(rows)})
    part = DataFile(relative, (directory / relative).stat().st_size, len(rows), stats, "test")
    batch = SinkBatch(target.location.uri, "append", "exactly_once", files=[part])
    TableCommitter(target, epoch=1).commit(batch, seq)


def _table(root: Path, name: str, schema: pa.Schema) -> TableTarget:
    target = TableTarget(name, Location(str(root / name)), f"data:lin:{name}", "fence:lin")
    ensure_table(target, schema)
    return target


def _keyed(root: Path, files: list[Path], cut: list[list[int]]) -> tuple[Location, Location]:
    """totals and changes as the sample job writes them, cutting `files` into `cut`."""
    changes = _table(root, "changes", CHANGES)
    counts: Counter = Counter()
    sums: Counter = Counter()
    for seq, batch in enumerate(cut, start=1):
        touched = set()
        for index in batch:
            for event in read_events(files[index]):
                counts[event["key"]] += 1
                sums[event["key"]] += event["value"]
                touched.add(event["key"])
        rows = [{"key": k, "events": counts[k], "total": sums[k]} for k in sorted(touched)]
        _append(changes, seq, rows, CHANGES)
    totals = _table(root, "totals", CHANGES)
    rows = [{"key": k, "events": counts[k], "total": sums[k]} for k in sorted(counts)]
    _append(totals, 1, rows, CHANGES)
    return totals.location, changes.location


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    return write_event_files(tmp_path / "events", files=5, events_per_file=30, keys=8)


def test_an_exact_changelog_in_any_cut_passes(tmp_path: Path, files: list[Path]) -> None:
    totals, changes = _keyed(tmp_path, files, [[0], [1, 2], [3], [4]])
    verdict = check_keyed(totals, changes, files)
    assert verdict.problems == [] and verdict.lost == verdict.duplicated == 0
    assert verdict.rows_checked > 8


def test_a_repeated_batch_is_reported(tmp_path: Path, files: list[Path]) -> None:
    totals, changes = _keyed(tmp_path, files, [[0], [1], [1], [2], [3], [4]])
    verdict = check_keyed(totals, changes, files)
    assert any("changelog of no run of input files from file 2" in p for p in verdict.problems)
    assert verdict.duplicated > 0  # the totals counted file 1 twice too


def test_a_lost_batch_is_reported(tmp_path: Path, files: list[Path]) -> None:
    totals, changes = _keyed(tmp_path, files, [[0], [1], [2], [3]])
    verdict = check_keyed(totals, changes, files)
    assert any("files 4..4" in p and "reached no batch" in p for p in verdict.problems)
    assert verdict.lost > 0


def test_dedup_counts_missing_and_repeated_events(tmp_path: Path) -> None:
    inputs = [write_dedup_file(tmp_path / "in", i, events=10, resends=5) for i in range(3)]
    unique = _table(tmp_path, "unique", UNIQUE)
    _append(unique, 1, [dedup_event(i) for i in range(30)], UNIQUE)
    assert check_dedup(unique.location, inputs).problems == []
    _append(unique, 2, [dedup_event(7), dedup_event(99)], UNIQUE)  # a repeat, a stray
    verdict = check_dedup(unique.location, inputs)
    assert verdict.duplicated == 2 and verdict.lost == 0, verdict
    inputs.append(write_dedup_file(tmp_path / "in", 3, events=10, resends=0))
    assert check_dedup(unique.location, inputs).lost == 10


def test_leftovers_are_found(tmp_path: Path, files: list[Path]) -> None:
    root = Location(str(tmp_path / "root"))
    target = _table(tmp_path / "root" / "tables", "changes", CHANGES)
    _append(target, 1, [{"key": "a", "events": 1, "total": 1}], CHANGES)
    tables = [target.location]
    checkpoint = tmp_path / "checkpoints" / "job"
    checkpoint.mkdir(parents=True)
    assert not any(find_orphans(root, tables, [checkpoint]).values())
    stray = Path(target.location.uri) / "sk-lin" / f"{2:020d}" / "e1-x.parquet"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"PAR1")
    root.store().write_json("lineages/lin/wal/manifests/00000000000000000002.json", {})
    (checkpoint.parent / ".job.restore-1a2b").mkdir()
    orphans = find_orphans(root, tables, [checkpoint])
    assert orphans["files"] == [f"{target.location.uri}/sk-lin/{2:020d}/e1-x.parquet"]
    assert orphans["wal"] == ["lineages/lin/wal/manifests/00000000000000000002.json"]
    assert orphans["staging"] == [str(checkpoint.parent / ".job.restore-1a2b")]


def test_a_history_file_awaiting_its_sweep_is_no_orphan_but_an_old_one_is(
    tmp_path: Path,
) -> None:
    from streamkeeper.observability.history import (
        UNREFERENCED_MIN_AGE,
        CheckpointHistory,
        record_from_progress,
    )
    from tests.unit.test_client import _progress

    root = Location(str(tmp_path / "root"))
    history = root.child("lineages/lin/history")
    CheckpointHistory(history).append([record_from_progress(_progress(0), commit_seq=0)])
    from streamkeeper.runtime.supervisor import HISTORY_SWEEP_SECONDS
    from tests.support.fault_checks import STOP_TO_CHECK_SECONDS

    folder = Path(history.uri)
    names = ("part-young.parquet", "part-of-age-at-the-stop.parquet", "part-old.parquet")
    for name in names:
        (folder / name).write_bytes(b"PAR1")
    # Of sweeping age only around the jobs' stop: no runner was left to sweep it.
    at_stop = time.time() - UNREFERENCED_MIN_AGE - 60
    os.utime(folder / names[1], (at_stop, at_stop))
    # Of sweeping age for longer than a sweep period before the jobs stopped: an orphan.
    old = time.time() - (UNREFERENCED_MIN_AGE + HISTORY_SWEEP_SECONDS + STOP_TO_CHECK_SECONDS) - 60
    os.utime(folder / names[2], (old, old))
    orphans = find_orphans(root, [history], [])
    assert orphans[AWAITING_SWEEP] == [f"{history.uri}/{n}" for n in sorted(names[:2])]
    assert orphans["files"] == [f"{history.uri}/part-old.parquet"]
