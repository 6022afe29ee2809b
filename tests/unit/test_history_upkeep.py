"""The checkpoint history's upkeep (observability/history_upkeep.py) on a real Delta table."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow.parquet as pq

from streamkeeper.observability.history import CheckpointHistory, record_from_progress
from streamkeeper.observability.history_tail import HistoryTail
from streamkeeper.observability.history_upkeep import upkeep
from streamkeeper.runtime.supervisor import QuerySupervisor
from streamkeeper.storage import LocalStore, Location
from tests.unit.test_client import _progress

PREFIX = "lineages/j/history"


def _append(history: CheckpointHistory, seqs: range, per_flush: int = 3) -> None:
    for first in range(seqs.start, seqs.stop, per_flush):
        batch = range(first, min(first + per_flush, seqs.stop))
        history.append([record_from_progress(_progress(s), commit_seq=s) for s in batch])


def _ids(rows: list[dict]) -> list[int]:
    return [r["checkpoint_id"] for r in rows]


def test_a_pass_keeps_the_newest_checkpoints_in_a_few_files(tmp_path: Path) -> None:
    history = CheckpointHistory(Location(str(tmp_path)).child(PREFIX))
    tail = HistoryTail(LocalStore(tmp_path), PREFIX, history.location)
    folder = tmp_path / PREFIX
    _append(history, range(150))
    assert len(list(folder.glob("*.parquet"))) == 50

    report = upkeep(history, kept=50, min_age=0)

    assert report.rows_deleted == 100 and report.files_compacted > 0
    assert _ids(history.read()) == list(range(100, 150))
    assert _ids(tail.read(20)) == list(range(130, 150))  # the removes: the full reader
    assert len(list((folder / "_delta_log").glob("*.json"))) == 1  # the log was expired

    _append(history, range(150, 160))
    assert _ids(tail.read(5)) == list(range(155, 160))  # plain appends again: the tail
    assert _ids(history.read(last=20)) == list(range(140, 160))
    upkeep(history, kept=50, min_age=0)

    # The first pass's removed files were swept by the second; its own wait for the third:
    # the compacted file, the one the delete wrote in its place, and the 4 appended.
    assert _ids(history.read()) == list(range(110, 160))
    assert len(list(folder.glob("*.parquet"))) == 1 + (2 + 4)
    upkeep(history, kept=50, min_age=0)
    assert len(list(folder.glob("*.parquet"))) == 1
    assert _ids(history.read()) == list(range(110, 160))
    # The checkpoint carries no remove older than the retention (here 0 s): it stays small.
    (checkpoint,) = (folder / "_delta_log").glob("*.checkpoint.parquet")
    removes = pq.read_table(checkpoint).column("remove").to_pylist()
    assert not any(removes)


def test_fewer_checkpoints_than_kept_lose_no_row(tmp_path: Path) -> None:
    history = CheckpointHistory(Location(str(tmp_path)).child(PREFIX))
    _append(history, range(30))
    report = upkeep(history, kept=1000, min_age=0)
    assert report.rows_deleted == 0
    assert _ids(history.read()) == list(range(30))


def test_no_table_is_nothing_to_do(tmp_path: Path) -> None:
    history = CheckpointHistory(Location(str(tmp_path)).child(PREFIX))
    assert upkeep(history, kept=10).rows_deleted == 0
    assert not (tmp_path / PREFIX).exists()


class _Progress:
    def __init__(self, batch: int) -> None:
        self.json = json.dumps(_progress(batch))


class _Query:
    def __init__(self) -> None:
        self.recentProgress: list[_Progress] = []


class _Coordinator:
    def checkpoint_facts(self, batch: int) -> dict:
        return {"commit_seq": batch}


def _supervisor(history: CheckpointHistory, query: _Query, kept: int | None, every: int):
    return QuerySupervisor(
        query=query,  # type: ignore[arg-type]
        coordinator=_Coordinator(),  # type: ignore[arg-type]
        health=None,  # type: ignore[arg-type]
        history=history,
        timeout=60.0,
        stop_requested=threading.Event(),
        history_kept=kept,
        history_every=every,
    )


def test_the_supervisor_keeps_the_history_every_so_many_appends(tmp_path: Path) -> None:
    history = CheckpointHistory(Location(str(tmp_path)).child(PREFIX))
    query = _Query()
    supervisor = _supervisor(history, query, kept=5, every=4)
    for batch in range(12):  # one checkpoint per flush, a pass after the 1st, 5th and 9th
        query.recentProgress.append(_Progress(batch))
        supervisor._flush_history()
        supervisor._flush_history()  # nothing new: no append, so it counts for nothing

    assert _ids(history.read()) == list(range(4, 12))  # the 9th's pass kept 4..8, then 3 more
    supervisor.history_kept = None  # no upkeep: rows are only added
    for batch in range(12, 20):
        query.recentProgress.append(_Progress(batch))
        supervisor._flush_history()
    assert _ids(history.read()) == list(range(4, 20))


def test_a_restarted_supervisor_keeps_the_history_at_its_first_append(tmp_path: Path) -> None:
    """A job killed every few batches never reaches `every` appends in one life."""
    history = CheckpointHistory(Location(str(tmp_path)).child(PREFIX))
    query = _Query()
    before = _supervisor(history, query, kept=None, every=100)  # a life that kept nothing
    for batch in range(12):
        query.recentProgress.append(_Progress(batch))
        before._flush_history()
    after = _supervisor(history, _Query(), kept=5, every=100)  # the next start
    after.query.recentProgress.append(_Progress(12))
    after._flush_history()
    assert _ids(history.read()) == list(range(8, 13))
