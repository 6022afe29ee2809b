"""Committing to real Delta tables with delta-rs on a local directory (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streamkeeper.commit.tables import TableCommitter, TableTarget, ensure_table
from streamkeeper.commit.wal import DataFile, SinkBatch
from streamkeeper.errors import DuplicateKeyError, FencedError, SchemaMismatchError
from streamkeeper.storage import Location

SCHEMA = pa.schema([("key", pa.string()), ("total", pa.int64())])


@pytest.fixture
def target(tmp_path: Path) -> TableTarget:
    location = Location(str(tmp_path / "table"))
    target = TableTarget("totals", location, "data:lin:totals", "fence:lin")
    ensure_table(target, SCHEMA)
    return target


def parquet_file(path: Path, rows: dict[str, list], relative_to: Path | None = None) -> DataFile:
    table = pa.table(rows, schema=SCHEMA)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    stats = {
        "numRecords": table.num_rows,
        "minValues": {},
        "maxValues": {},
        "nullCount": {"key": 0, "total": 0},
    }
    name = str(path.relative_to(relative_to)) if relative_to else str(path)
    return DataFile(
        path=name,
        size=path.stat().st_size,
        rows=table.num_rows,
        stats=json.dumps(stats),
        writer="test",
    )


def append_part(target: TableTarget, name: str, rows: dict[str, list]) -> SinkBatch:
    directory = Path(target.location.uri)
    data_file = parquet_file(directory / name, rows, relative_to=directory)
    return SinkBatch(
        table=target.location.uri, output="append", mode="exactly_once", files=[data_file]
    )


def contents(target: TableTarget) -> dict[str, int]:
    rows = target.open().to_pyarrow_table().to_pylist()
    return {row["key"]: row["total"] for row in rows}


def test_ensure_table_creates_the_table(target: TableTarget) -> None:
    table = target.open()
    assert table.version() == 0
    assert [f.name for f in table.schema().fields] == ["key", "total"]
    assert target.committed_seq() == -1
    ensure_table(target, SCHEMA)  # matching schema: no change
    assert target.open().version() == 0


def test_schema_mismatch_names_the_column_and_changes_nothing(target: TableTarget) -> None:
    other = pa.schema([("key", pa.string()), ("total", pa.string()), ("extra", pa.int32())])
    with pytest.raises(SchemaMismatchError) as caught:
        ensure_table(target, other)
    message = str(caught.value)
    assert target.location.uri in message and "'totals'" in message
    assert "total: table has" in message and "extra: table has no such column" in message
    assert "key:" not in message  # only the columns that differ
    assert target.open().version() == 0


def test_append_commit_is_visible_and_idempotent(target: TableTarget) -> None:
    committer = TableCommitter(target, epoch=1)
    part = append_part(target, "sk-1.parquet", {"key": ["a", "b"], "total": [1, 2]})
    version = committer.commit(part, seq=5)
    assert version == 1 == target.open().version()
    assert contents(target) == {"a": 1, "b": 2}
    assert target.open().transaction_version("data:lin:totals") == 5
    assert target.committed_seq() == 5
    assert target.open().transaction_version("fence:lin") == 1

    assert committer.commit(part, seq=5) == 1  # replay of the same seq: no-op
    assert committer.commit(part, seq=4) == 1  # an older seq too
    assert target.open().version() == 1
    assert len(target.open().to_pyarrow_table()) == 2


def test_a_refreshed_committer_holds_its_own_append_and_still_sees_a_newer_epoch(
    target: TableTarget,
) -> None:
    """The coordinator reads a table back after its commit (off the visibility path); a
    newer runner's commit after that is still seen before the next commit."""
    older = TableCommitter(target, epoch=1)
    assert older.commit(append_part(target, "sk-1.parquet", {"key": ["a"], "total": [1]}), 1) == 1
    assert older._table is not None and older._table.version() == 0  # before its own commit
    older.refresh()
    assert older._table.version() == 1  # nothing left to read on the next commit
    TableCommitter(target, epoch=2).commit(
        append_part(target, "sk-2.parquet", {"key": ["b"], "total": [2]}), seq=2
    )
    late = append_part(target, "sk-3.parquet", {"key": ["z"], "total": [9]})
    with pytest.raises(FencedError):
        older.commit(late, seq=3)
    assert contents(target) == {"a": 1, "b": 2}


def test_empty_part_commits_nothing(target: TableTarget) -> None:
    part = SinkBatch(table=target.location.uri, output="append", mode="exactly_once")
    assert TableCommitter(target, epoch=1).commit(part, seq=0) == 0
    assert target.open().version() == 0


def test_lower_epoch_is_fenced_and_adds_nothing(target: TableTarget) -> None:
    newer = TableCommitter(target, epoch=2)
    newer.commit(append_part(target, "sk-1.parquet", {"key": ["a"], "total": [1]}), seq=1)
    older = TableCommitter(target, epoch=1)
    late = append_part(target, "sk-2.parquet", {"key": ["z"], "total": [9]})
    with pytest.raises(FencedError) as caught:
        older.commit(late, seq=2)
    assert "epoch 1" in str(caught.value) and "epoch 2" in str(caught.value)
    assert target.open().version() == 1
    assert contents(target) == {"a": 1}
    assert target.committed_seq() == 1


def test_merge_upserts_and_greatest_order_by_wins(target: TableTarget, tmp_path: Path) -> None:
    committer = TableCommitter(target, epoch=1)
    committer.commit(
        append_part(target, "sk-0.parquet", {"key": ["a", "b"], "total": [1, 2]}), seq=0
    )
    staging = tmp_path / "staging"
    files = [
        parquet_file(staging / "f1.parquet", {"key": ["b", "c", "c"], "total": [20, 32, 31]}),
        parquet_file(staging / "f2.parquet", {"key": ["c", "d"], "total": [30, 40]}),
    ]
    merge = SinkBatch(
        table=target.location.uri,
        output="merge",
        mode="exactly_once",
        key=["key"],
        files=files,
        order_by="total",
    )
    version = committer.commit(merge, seq=1)
    assert version == 2
    assert contents(target) == {"a": 1, "b": 20, "c": 32, "d": 40}
    assert len(target.open().to_pyarrow_table()) == 4  # one row per key
    assert target.committed_seq() == 1
    assert committer.commit(merge, seq=1) == 2  # replayed merge: no-op
    assert target.open().version() == 2
    # A later batch with a late row (a lower order_by) does not replace the newer one.
    late = parquet_file(staging / "f3.parquet", {"key": ["c", "d"], "total": [5, 41]})
    committer.commit(
        SinkBatch(target.location.uri, "merge", "exactly_once", ["key"], [late], "total"), seq=2
    )
    assert contents(target) == {"a": 1, "b": 20, "c": 32, "d": 41}


def test_merge_refuses_duplicate_keys_without_order_by(target: TableTarget, tmp_path: Path) -> None:
    # Batches refuse these before their manifest; only an older manifest can get here.
    staged = parquet_file(tmp_path / "f.parquet", {"key": ["c", "c"], "total": [1, 2]})
    merge = SinkBatch(target.location.uri, "merge", "exactly_once", ["key"], [staged])
    with pytest.raises(DuplicateKeyError, match="merge sink 'totals'.*key='c'"):
        TableCommitter(target, epoch=1).commit(merge, seq=1)
    assert target.open().version() == 0 and target.committed_seq() == -1


def test_at_least_once_commits_without_checks_but_records_its_seq(target: TableTarget) -> None:
    part = append_part(target, "sk-1.parquet", {"key": ["a"], "total": [1]})
    part.mode = "at_least_once"
    committer = TableCommitter(target, epoch=1)
    assert committer.commit(part, seq=3) == 1
    assert committer.commit(part, seq=3) == 2  # no dedup check: the replay commits again
    assert target.committed_seq() == 3  # the lineage's progress reads the same in every mode
    assert target.open().transaction_version("fence:lin") is None  # and no fencing


def test_merge_treats_null_key_as_one_key(target: TableTarget, tmp_path: Path) -> None:
    committer = TableCommitter(target, epoch=1)
    for seq in range(2):
        staged = parquet_file(tmp_path / f"s{seq}.parquet", {"key": [None], "total": [seq]})
        committer.commit(
            SinkBatch(target.location.uri, "merge", "exactly_once", ["key"], [staged]), seq=seq
        )
    assert target.open().to_pyarrow_table().to_pylist() == [{"key": None, "total": 1}]


def test_recovery_keeps_only_the_files_a_table_references_in_a_seq_folder(
    target: TableTarget,
) -> None:
    """A fenced runner may seal seq 6 after its successor skipped it and committed 7: the
    table is past 6, but 6's files are not in it, so recovery must not keep them."""
    from streamkeeper.commit.disposal import referenced_now, sweep_precommit_folder
    from streamkeeper.lineage.layout import LineageLayout

    layout = LineageLayout(target.location, "lin", "job")
    skipped = append_part(
        target, f"{layout.precommit_dir(6)}/e1-a.parquet", {"key": ["a"], "total": [1]}
    )
    committed = append_part(
        target, f"{layout.precommit_dir(7)}/e2-b.parquet", {"key": ["b"], "total": [2]}
    )
    TableCommitter(target, epoch=2).commit(committed, seq=7)
    assert target.committed_seq() == 7 and skipped.files
    assert referenced_now(target, layout, 6) == set()
    assert referenced_now(target, layout, 7) == {"e2-b.parquet"}
    removed = sweep_precommit_folder(target, layout, 6, referenced_now(target, layout, 6))
    assert [uri.rsplit("/", 1)[-1] for uri in removed] == ["e1-a.parquet"]
    assert sweep_precommit_folder(target, layout, 7, referenced_now(target, layout, 7)) == []
    assert contents(target) == {"b": 2}


def test_a_claims_sweep_keeps_the_files_a_committed_version_holds(target: TableTarget) -> None:
    """A stale runner can claim seq 7 after another runner committed and retired it: the
    sweep of its claim (by recovery, or by the runner abandoning its batch) deletes what
    the claim wrote and keeps the commit's files."""
    from streamkeeper.commit.disposal import sweep_unheld
    from streamkeeper.lineage.layout import LineageLayout

    layout = LineageLayout(target.location, "lin", "job")
    committed = append_part(
        target, f"{layout.precommit_dir(7)}/e2-b.parquet", {"key": ["b"], "total": [2]}
    )
    TableCommitter(target, epoch=2).commit(committed, seq=7)
    append_part(target, f"{layout.precommit_dir(7)}/e1-stale.parquet", {"key": ["x"], "total": [9]})
    removed = sweep_unheld(target, layout, 7)
    assert [uri.rsplit("/", 1)[-1] for uri in removed] == ["e1-stale.parquet"]
    assert sweep_unheld(target, layout, 7) == []
    assert contents(target) == {"b": 2}
