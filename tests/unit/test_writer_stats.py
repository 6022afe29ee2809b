"""Delta file statistics from the executor-side writer: valid JSON, never tighter than the data.

A reader skips a file whose min/max rule a predicate out, so a wrong bound loses rows
silently; the last tests read files through delta-rs with filters to prove none is lost.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, QueryBuilder
from deltalake.transaction import AddAction

from streamkeeper.commit.writer import SinkWritePlan, make_partition_writer
from streamkeeper.storage import Location

NAN, INF = math.nan, math.inf
MOMENT = datetime.datetime(2024, 5, 1, 12, 30, 1, 123456, tzinfo=datetime.UTC)
TS = pa.timestamp("us", tz="UTC")


def write(directory: Path, batches: list[pa.RecordBatch]) -> dict[str, Any]:
    """Run the partition writer over `batches`; the one file's metadata row."""
    folder = "sk-lin/00000000000000000001"  # the batch's folder, relative to the table
    plan = SinkWritePlan(
        sink="s",
        directory=Location(str(directory / folder)),
        columns=tuple(batches[0].schema.names),
        mask_column=None,
        relative_to=folder,
    )
    out = list(make_partition_writer([plan], epoch=1)(iter(batches)))
    (row,) = out[0].to_pylist()
    return row


def strict_json(text: str) -> dict[str, Any]:
    """json.loads, refusing the NaN/Infinity extensions Python would otherwise accept."""

    def refuse(constant: str) -> None:
        raise ValueError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def stats_of(tmp_path: Path, *batches: dict[str, pa.Array]) -> dict[str, Any]:
    return strict_json(write(tmp_path, [pa.RecordBatch.from_pydict(b) for b in batches])["stats"])


def test_exact_bounds_for_plain_columns(tmp_path: Path) -> None:
    stats = stats_of(
        tmp_path,
        {
            "id": pa.array([3, 1], pa.int32()),
            "x": pa.array([2.5, -0.5], pa.float32()),
            "flag": [True, None],
            "day": pa.array([datetime.date(2024, 5, 1), datetime.date(2023, 1, 2)]),
            "amount": pa.array([decimal.Decimal("1.50"), decimal.Decimal("0.10")]),
            "text": pa.array(["b", "a"], pa.large_string()),
            "at": pa.array([MOMENT, MOMENT + datetime.timedelta(seconds=1)], TS),
            "raw": pa.array([b"\xff", b"\x00"]),  # no bounds, and none needed
        },
        {
            "id": pa.array([2], pa.int32()),
            "x": pa.array([None], pa.float32()),
            "flag": [False],
            "day": pa.array([None], pa.date32()),
            "amount": pa.array([None], pa.decimal128(3, 2)),
            "text": pa.array([None], pa.large_string()),
            "at": pa.array([None], TS),
            "raw": pa.array([None], pa.binary()),
        },
    )
    assert stats == {
        "numRecords": 3,
        "minValues": {
            "id": 1,
            "x": -0.5,
            "flag": False,
            "day": "2023-01-02",
            "amount": 0.1,
            "text": "a",
            "at": "2024-05-01T12:30:01.123Z",  # rounded down to milliseconds
        },
        "maxValues": {
            "id": 3,
            "x": 2.5,
            "flag": True,
            "day": "2024-05-01",
            "amount": 1.5,
            "text": "b",
            "at": "2024-05-01T12:30:02.124Z",  # rounded up
        },
        "nullCount": {
            "id": 0,
            "x": 1,
            "flag": 1,
            "day": 1,
            "amount": 1,
            "text": 1,
            "at": 1,
            "raw": 1,
        },
    }


def test_long_strings_get_a_prefix_min_and_a_raised_prefix_max(tmp_path: Path) -> None:
    low, high, top = "a" * 40, "b" * 31 + "z" * 9, "c" * 31 + "\U0010ffff" * 5
    stats = stats_of(
        tmp_path,
        {"text": [high, low], "other": ["x" * 32, None]},
        {"text": pa.array([None], pa.string()), "other": ["x" * 32]},
    )
    assert stats["minValues"]["text"] == "a" * 32  # a prefix sorts before the string
    assert stats["maxValues"]["text"] == "b" * 31 + "{"  # "z" raised: after "bb...bzzz..."
    assert stats["maxValues"]["text"] > high
    assert stats["minValues"]["other"] == stats["maxValues"]["other"] == "x" * 32  # exact
    # The last character cannot be raised: the one before it is.
    stats = stats_of(tmp_path / "top", {"text": [top]})
    assert stats["maxValues"]["text"] == "c" * 30 + "d" and stats["maxValues"]["text"] > top


def test_a_column_of_nulls_only_has_a_null_count_and_no_bounds(tmp_path: Path) -> None:
    nothing = pa.array([None, None], pa.int64())
    stats = stats_of(tmp_path, {"id": [1, 2], "empty": nothing, "all_nan_or_null": [None, None]})
    assert stats["minValues"] == {"id": 1} and stats["maxValues"] == {"id": 2}
    assert stats["nullCount"] == {"id": 0, "empty": 2, "all_nan_or_null": 2}


@pytest.mark.parametrize(
    ("column", "why"),
    [
        (pa.array([1.0, NAN, 3.0]), "a NaN"),
        (pa.array([NAN, NAN]), "only NaN"),
        (pa.array([1.0, INF]), "+infinity as max"),
        (pa.array([-INF, 2.0], pa.float32()), "-infinity as min"),
        (pa.array([decimal.Decimal("0.1000000000000000000001")]), "a decimal float cannot carry"),
        (pa.array([datetime.datetime(2024, 1, 1)], pa.timestamp("us")), "no time zone"),
        (pa.array([{"a": 1}]), "a struct"),
    ],
)
def test_a_column_without_bounds_leaves_the_file_without_min_max(
    tmp_path: Path, column: pa.Array, why: str
) -> None:
    ids = pa.array(range(len(column)), pa.int64())
    text = stats_of(tmp_path, {"id": ids, "odd": column})
    assert "minValues" not in text and "maxValues" not in text, why
    assert text["numRecords"] == len(column) and text["nullCount"]["id"] == 0


def test_a_nan_in_a_later_batch_still_counts(tmp_path: Path) -> None:
    stats = stats_of(tmp_path, {"x": [1.0, 2.0]}, {"x": [NAN]})
    assert "minValues" not in stats and stats["nullCount"] == {"x": 0}


# -- what delta-rs readers make of it ---------------------------------------------------

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("x", pa.float64()),
        ("text", pa.string()),
        ("at", TS),
        ("flag", pa.bool_()),
        ("empty", pa.int64()),
    ]
)
FILES = {
    "nan": {"id": [1, 2, 3], "x": [1.0, NAN, 3.0]},
    "inf": {"id": [4, 5, 6], "x": [-INF, 0.0, INF]},
    "long text": {"id": [7, 8, 9], "text": ["a" * 40, "b" * 40, "b" * 33]},
    "timestamp": {"id": [10, 11], "at": [MOMENT, MOMENT]},
    "flags": {"id": [12, 13], "flag": [True, None]},
    "plain": {"id": [100, 101], "x": [10.0, 11.0], "text": ["m", "n"], "flag": [False, False]},
}


def table_of_written_files(root: Path, *, with_stats: bool = True) -> DeltaTable:
    """A Delta table of the writer's files, added with the writer's stats (or none at all)."""
    DeltaTable.create(str(root), schema=SCHEMA)
    table = DeltaTable(str(root))
    now_ms = int(time.time() * 1000)
    actions = []
    for columns in FILES.values():
        rows = len(columns["id"])
        data = {f.name: columns.get(f.name, [None] * rows) for f in SCHEMA}
        row = write(root, [pa.RecordBatch.from_pydict(data, schema=SCHEMA)])
        stats = row["stats"] if with_stats else None
        actions.append(AddAction(row["path"], row["size"], {}, now_ms, True, stats))
    table.create_write_transaction(actions, mode="append", schema=table.schema())
    return DeltaTable(str(root))


def _at(delta: datetime.timedelta) -> pc.Expression:
    return pa.scalar(MOMENT + delta, TS)


FILTERS = {
    "x > 2.5": pc.field("x") > 2.5,
    "x < 1.5": pc.field("x") < 1.5,
    "x > 1e308": pc.field("x") > 1e308,
    "x < -1e308": pc.field("x") < -1e308,
    "text > 'b' * 32": pc.field("text") > "b" * 32,
    "text = 'b' * 40": pc.field("text") == "b" * 40,
    "text = 'a' * 40": pc.field("text") == "a" * 40,
    "at > MOMENT - 256us": pc.field("at") > _at(-datetime.timedelta(microseconds=256)),
    "at < MOMENT + 44us": pc.field("at") < _at(datetime.timedelta(microseconds=44)),
    "flag = true": pc.field("flag") == True,  # noqa: E712 - an Arrow expression
    "empty is null": pc.field("empty").is_null(),
    "id > 12": pc.field("id") > 12,
}


def test_no_file_is_wrongly_skipped_by_the_pyarrow_reader(tmp_path: Path) -> None:
    dataset = table_of_written_files(tmp_path / "t").to_pyarrow_dataset()
    # The same files without statistics: nothing can be skipped there.
    reference = table_of_written_files(tmp_path / "ref", with_stats=False).to_pyarrow_dataset()
    for name, predicate in FILTERS.items():
        expected = sorted(reference.to_table(filter=predicate).column("id").to_pylist())
        assert expected, f"{name}: a filter that matches nothing proves nothing"
        got = dataset.to_table(filter=predicate, use_threads=False).column("id").to_pylist()
        assert sorted(got) == expected, name
    # Statistics are still used where they are exact: the plain file (x in 10..11) and the
    # files whose x is only null are skipped; the NaN and infinity files, unbounded, are not.
    kept = list(dataset.get_fragments(filter=pc.field("x") < 5))
    assert len(kept) == 2, [f.partition_expression for f in kept]


@pytest.mark.parametrize(
    "sql",
    [
        "x > 2.5",
        "x > 1e308",
        "x < -1e308",
        "text > repeat('b', 32)",
        "text = repeat('b', 40)",
        "at > TIMESTAMP '2024-05-01T12:30:01.1232Z'",
        "at < TIMESTAMP '2024-05-01T12:30:01.1235Z'",
        "flag",
        "empty IS NULL",
    ],
)
def test_no_file_is_wrongly_skipped_by_datafusion(tmp_path: Path, sql: str) -> None:
    def ids(table: DeltaTable) -> list[int]:
        result = QueryBuilder().register("t", table).execute(f"SELECT id FROM t WHERE {sql}")
        return sorted(result.read_all().column("id").to_pylist())

    expected = ids(table_of_written_files(tmp_path / "ref", with_stats=False))
    assert expected, f"{sql}: a filter that matches nothing proves nothing"
    assert ids(table_of_written_files(tmp_path / "t")) == expected
