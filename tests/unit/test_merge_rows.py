"""Merge sinks get one row per key: duplicates are refused, or the greatest order_by wins."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from streamkeeper.commit.batch import refuse_duplicate_keys
from streamkeeper.commit.merge_rows import (
    check_one_row_per_key,
    find_duplicate_keys,
    last_row_per_key,
    unique_columns,
)
from streamkeeper.commit.tables import read_staged_rows
from streamkeeper.commit.wal import DataFile, SinkBatch
from streamkeeper.commit.writer import SinkWritePlan, make_partition_writer
from streamkeeper.errors import DuplicateKeyError
from streamkeeper.spec import SinkSpec
from streamkeeper.storage import Location


def rows(**columns: list) -> pa.Table:
    return pa.table(columns)


# -- pure functions ---------------------------------------------------------------------


def test_find_duplicate_keys_names_repeated_values_only() -> None:
    table = rows(k=["a", "b", "a", None, None, "c"], v=[1, 2, 3, 4, 5, 6])
    assert find_duplicate_keys(table, ["k"]) == [{"k": "a"}, {"k": None}]  # a null is one key
    assert find_duplicate_keys(table, ["k", "v"]) == []
    assert find_duplicate_keys(table, ["k"], limit=1) == [{"k": "a"}]
    assert find_duplicate_keys(table.slice(0, 1), ["k"]) == []
    assert find_duplicate_keys(rows(k=[1, 1, 1], j=[1, 2, 1]), ["k", "j"]) == [{"k": 1, "j": 1}]


def test_unique_columns() -> None:
    assert unique_columns(["a", "b"], None) == ["a", "b"]
    assert unique_columns(["a"], "ts") == ["a", "ts"]


def test_without_order_by_two_rows_for_a_key_are_refused_naming_key_and_fix() -> None:
    table = rows(customer=["c1", "c2", "c1"], total=[1, 2, 3])
    with pytest.raises(DuplicateKeyError) as caught:
        last_row_per_key(table, ["customer"], None, sink="totals")
    message = str(caught.value)
    assert "merge sink 'totals'" in message and "customer='c1'" in message
    assert "c2" not in message
    assert "add order_by: <column> to sink 'totals'" in message.lower()
    assert "emit one row per key ['customer']" in message


def test_without_order_by_unique_keys_pass_unchanged() -> None:
    table = rows(k=["a", "b", None], v=[1, 2, 3])
    assert last_row_per_key(table, ["k"], None).equals(table)


def test_the_greatest_order_by_wins_and_a_null_loses() -> None:
    table = rows(
        k=["a", "b", "a", "a", "b", None, None],
        seq=[2, 9, 7, None, 1, 3, 4],
        v=["a2", "b9", "a7", "a-null", "b1", "n3", "n4"],
    )
    kept = last_row_per_key(table, ["k"], "seq")
    assert sorted(kept.column("v").to_pylist()) == ["a7", "b9", "n4"]
    assert kept.schema == table.schema


def test_order_by_on_a_composite_key_and_timestamps() -> None:
    moments = pa.array([1_000, 3_000, 2_000], pa.timestamp("ms", tz="UTC"))
    table = pa.table({"a": [1, 1, 1], "b": ["x", "x", "y"], "at": moments, "v": [1, 2, 3]})
    kept = last_row_per_key(table, ["a", "b"], "at")
    assert sorted(kept.column("v").to_pylist()) == [2, 3]


def test_ties_on_key_and_order_by_are_refused() -> None:
    table = rows(k=["a", "a", "b"], seq=[5, 5, 1], v=[1, 2, 3])
    with pytest.raises(DuplicateKeyError) as caught:
        last_row_per_key(table, ["k"], "seq", sink="latest")
    message = str(caught.value)
    assert "merge sink 'latest'" in message and "k='a', seq=5" in message
    assert "same order_by 'seq' value" in message and "differs between a key's rows" in message


def test_check_one_row_per_key_accepts_distinct_orders() -> None:
    check_one_row_per_key(rows(k=["a", "a"], seq=[1, 2]), "s", ["k"], "seq")


# -- the pre-commit check: executors within a file, the driver across files --------------


def merge_plan(directory: Path, unique: tuple[str, ...]) -> SinkWritePlan:
    return SinkWritePlan(
        sink="latest",
        directory=Location(str(directory)),
        columns=("k", "seq", "v"),
        mask_column=None,
        relative_to=None,
        unique=unique,
    )


def write_task(plan: SinkWritePlan, table: pa.Table) -> dict:
    """One Spark task's work, without Spark: its file's metadata row."""
    (out,) = list(make_partition_writer([plan], epoch=3)(iter(table.to_batches())))
    (row,) = out.to_pylist()
    return row


def as_data_file(row: dict) -> DataFile:
    return DataFile(row["path"], row["size"], row["rows"], row["stats"], row["writer"])


def test_a_task_reports_keys_repeated_within_its_file(tmp_path: Path) -> None:
    plan = merge_plan(tmp_path, ("k",))
    row = write_task(plan, rows(k=["a", "b", "a"], seq=[1, 2, 3], v=[0, 0, 0]))
    assert json.loads(row["duplicates"]) == [{"k": "a"}]
    ordered = merge_plan(tmp_path, ("k", "seq"))
    assert (
        write_task(ordered, rows(k=["a", "b", "a"], seq=[1, 2, 3], v=[0, 0, 0]))["duplicates"]
        is None
    )


def test_refused_within_one_file_from_the_task_report(tmp_path: Path) -> None:
    sink = SinkSpec(name="latest", output="merge", key=["k"])
    plan = merge_plan(tmp_path, ("k",))
    row = write_task(plan, rows(k=["a", "a"], seq=[1, 2], v=[0, 0]))
    files = {"latest": [as_data_file(row)]}
    with pytest.raises(DuplicateKeyError, match="k='a'.*order_by"):
        refuse_duplicate_keys([sink], [plan], files, {"latest": json.loads(row["duplicates"])})


def test_refused_across_files_by_reading_back_the_key_columns(tmp_path: Path) -> None:
    sink = SinkSpec(name="latest", output="merge", key=["k"])
    plan = merge_plan(tmp_path, ("k",))
    first = write_task(plan, rows(k=["a", "b"], seq=[1, 2], v=[0, 0]))
    second = write_task(plan, rows(k=["c", "b"], seq=[3, 4], v=[0, 0]))
    assert first["duplicates"] is None and second["duplicates"] is None
    files = {"latest": [as_data_file(first), as_data_file(second)]}
    with pytest.raises(DuplicateKeyError, match="k='b'") as caught:
        refuse_duplicate_keys([sink], [plan], files, {})
    assert "'a'" not in str(caught.value)
    # With order_by, distinct orders pass; the commit keeps the greatest.
    ordered_sink = SinkSpec(name="latest", output="merge", key=["k"], order_by="seq")
    ordered_plan = merge_plan(tmp_path, ("k", "seq"))
    refuse_duplicate_keys([ordered_sink], [ordered_plan], files, {})
    part = SinkBatch("/t", "merge", "exactly_once", ["k"], files["latest"], order_by="seq")
    merged = read_staged_rows(part, Location(str(tmp_path)), sink="latest")
    pairs = zip(merged.column("k").to_pylist(), merged.column("seq").to_pylist(), strict=True)
    assert sorted(pairs) == [
        ("a", 1),
        ("b", 4),
        ("c", 3),
    ]


def test_a_single_file_without_a_report_is_not_read_back(tmp_path: Path) -> None:
    sink = SinkSpec(name="latest", output="merge", key=["k"])
    plan = merge_plan(tmp_path, ("k",))
    missing = DataFile(str(tmp_path / "gone.parquet"), 1, 1, "{}", "w")  # would fail to read
    refuse_duplicate_keys([sink], [plan], {"latest": [missing]}, {})
