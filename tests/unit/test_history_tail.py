"""The history tail reader: the same rows as the full reader, from the log's tail only."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

from streamkeeper.observability.history import CheckpointHistory, record_from_progress
from streamkeeper.observability.history_tail import HistoryTail
from streamkeeper.storage import LocalStore, Location
from tests.unit.test_client import _progress

PREFIX = "lineages/j/history"


def _history(root: Path, appends: int, rows_per_append: int = 1) -> CheckpointHistory:
    history = CheckpointHistory(Location(str(root)).child(PREFIX))
    for first in range(0, appends * rows_per_append, rows_per_append):
        seqs = range(first, first + rows_per_append)
        history.append([record_from_progress(_progress(s), commit_seq=s) for s in seqs])
    return history


def _tail(root: Path) -> HistoryTail:
    return HistoryTail(LocalStore(root), PREFIX, Location(str(root)).child(PREFIX))


def _spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    opened: list[str] = []
    original = HistoryTail._read_file

    def spy(self: HistoryTail, path: str) -> list[dict]:
        opened.append(path)
        return original(self, path)

    monkeypatch.setattr(HistoryTail, "_read_file", spy)
    return opened


def test_no_table_is_no_rows(tmp_path: Path) -> None:
    assert _tail(tmp_path).read(20) == []


def test_past_a_log_checkpoint_the_tail_reads_only_the_newest_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = _history(tmp_path, appends=105, rows_per_append=2)  # log checkpoint at 99
    assert (Path(history.location.fs_path) / "_delta_log" / "_last_checkpoint").exists()
    opened = _spy_reads(monkeypatch)
    rows = _tail(tmp_path).read(20)
    assert rows == history.read(last=20)
    assert [r["checkpoint_id"] for r in rows] == list(range(190, 210))
    assert len(opened) == 10  # 2 rows a file: nothing older was read


def test_fewer_rows_than_asked_gives_them_all(tmp_path: Path) -> None:
    history = _history(tmp_path, appends=3)
    assert _tail(tmp_path).read(20) == history.read()


def test_a_compacted_table_is_read_by_the_full_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = _history(tmp_path, appends=6)
    DeltaTable(history.location.uri).optimize.compact()  # removes the small files
    opened = _spy_reads(monkeypatch)
    rows = _tail(tmp_path).read(4)
    assert [r["checkpoint_id"] for r in rows] == [2, 3, 4, 5]
    assert opened == []  # the tail held a remove: the table's own reader answered
