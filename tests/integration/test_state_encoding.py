"""Our UnsafeRow encoder against the bytes Spark itself stored, for many state types.

A streaming aggregation keyed by many types (with nulls, empty and multi-byte strings,
negative numbers, a window struct) and with many aggregation buffers runs one batch on
RocksDB; Spark's raw state reader shows each entry's key and value bytes. Encoding the
rows its ordinary reader shows must give exactly those bytes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamkeeper.state.schema import reshape
from streamkeeper.state.spark_state import (
    canonically_named,
    session_conf,
    state_frame,
    state_types,
)
from streamkeeper.state.unsafe_row import encode_struct
from tests.support.state import run_query, state_store

pytestmark = pytest.mark.integration

ROWS = [
    {
        "i": 1,
        "l": -5,
        "s": "a",
        "b": True,
        "x": 1.5,
        "n": "12.25",
        "big": "1234567890123456789012.5",
    },
    {"i": -7, "l": 2**40, "s": "", "b": False, "x": -0.5, "n": "-3.10", "big": "-2.5"},
    {"i": None, "l": None, "s": None, "b": None, "x": None, "n": None, "big": None},
    {"i": 3, "l": 0, "s": "ünïcødé-long-string-here", "b": True, "x": 2.0, "n": "0", "big": "0"},
    {"i": 3, "l": 0, "s": "ünïcødé-long-string-here", "b": True, "x": 4.0, "n": "1", "big": "7"},
]


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = SparkSession.builder.master("local[2]").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session


def test_encoded_rows_equal_the_bytes_spark_stored(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    lines = [json.dumps({**row, "t": 1_700_000_000 + 90 * n}) for n, row in enumerate(ROWS)]
    (tmp_path / "in" / "rows.json").write_text("\n".join(lines))
    schema = "i INT, l BIGINT, s STRING, b BOOLEAN, x DOUBLE, n STRING, big STRING, t BIGINT"
    source = spark.readStream.schema(schema).json(str(tmp_path / "in"))
    typed = source.select(
        "i", "l", "s", "b", "x",
        F.col("n").cast("decimal(10,2)").alias("n"),
        F.col("big").cast("decimal(25,3)").alias("big"),
        F.timestamp_seconds("t").alias("ts"),
        F.to_date(F.timestamp_seconds("t")).alias("day"),
    )  # fmt: skip
    output = typed.groupBy(
        "i", "l", "s", "b", "n", "day", F.window("ts", "2 minutes").alias("w")
    ).agg(
        F.count(F.lit(1)).alias("events"),
        F.sum("big").alias("big_sum"),
        F.avg("x").alias("mean"),
        F.max("s").alias("largest"),
        F.min("n").alias("smallest"),
        F.first("s").alias("first"),
        F.sum(F.col("i").cast("tinyint")).alias("tiny"),
    )
    with state_store(spark, "rocksdb", 2):
        run_query(output, tmp_path / "ckpt")

    raw = state_frame(spark, tmp_path / "ckpt", 0, 0, raw=True).collect()
    stored = {(bytes(r.key_bytes), bytes(r.value_bytes)) for r in raw}
    frame = state_frame(spark, tmp_path / "ckpt", 0, 0)
    key_type, value_type = state_types(frame)
    rows = canonically_named(frame).toArrow()
    # Through the canonical form and back, as a savepoint stores and restores them.
    keys = reshape(reshape(rows["key"], key_type, canonical=True), key_type, canonical=True)
    values = reshape(rows["value"], value_type, canonical=True)
    encoded = set(
        zip(
            encode_struct(keys, key_type).to_pylist(),
            encode_struct(values, value_type).to_pylist(),
            strict=True,
        )
    )
    assert len(stored) == len(ROWS)  # every row its own window
    assert encoded == stored


def test_direct_reader_equals_sparks_reader(spark: SparkSession, tmp_path: Path) -> None:
    """hdfs_files reads the HDFS-backed store's files (a delta chain over batches, with a
    snapshot) into the same canonical rows as Spark's `statestore` reader."""
    from streamkeeper.state.hdfs_files import partition_reader
    from streamkeeper.state.positions import read_offsets_lines
    from streamkeeper.state.spark_state import read_operators, state_columns

    (tmp_path / "in").mkdir()
    schema = "i INT, l BIGINT, s STRING, b BOOLEAN, x DOUBLE, n STRING, big STRING, t BIGINT"
    for batch in range(3):  # later batches update keys of earlier ones
        lines = [
            json.dumps({**row, "t": 1_700_000_000 + 90 * n, "x": row["x"] and row["x"] + batch})
            for n, row in enumerate(ROWS[: 3 + batch % 3])
        ]
        (tmp_path / "in" / f"rows-{batch}.json").write_text("\n".join(lines))
    source = (
        spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(str(tmp_path / "in"))
    )
    typed = source.select(
        "i", "l", "s", "b", "x",
        F.col("n").cast("decimal(10,2)").alias("n"),
        F.col("big").cast("decimal(25,3)").alias("big"),
        F.timestamp_seconds("t").alias("ts"),
    )  # fmt: skip
    output = typed.groupBy("i", "l", "s", "b", "n", F.window("ts", "2 minutes").alias("w")).agg(
        F.count(F.lit(1)).alias("events"),
        F.sum("big").alias("big_sum"),
        F.avg("x").alias("mean"),
        F.first("s").alias("first"),
    )
    checkpoint = tmp_path / "ckpt"
    with (
        state_store(spark, "hdfs", 3),
        session_conf(spark, {"spark.sql.streaming.stateStore.minDeltasForSnapshot": "2"}),
    ):
        run_query(output, checkpoint)
    batch = 2
    frame = state_frame(spark, checkpoint, batch, 0)
    columns = state_columns(frame)
    expected = canonically_named(frame).toArrow()
    expected_rows = {
        json.dumps(r, default=str, sort_keys=True)
        for r in zip(
            reshape(expected["key"], columns["key"], canonical=True).to_pylist(),
            reshape(expected["value"], columns["value"], canonical=True).to_pylist(),
            strict=True,
        )
    }
    (op,) = read_operators(spark, checkpoint)
    conf = json.loads(read_offsets_lines(checkpoint, batch)[0])["conf"]
    reader = partition_reader(
        checkpoint, conf, 0, op.partitions, batch + 1, columns["key"], columns["value"]
    )
    assert reader is not None
    import pyarrow as pa

    batches = list(reader(iter([pa.RecordBatch.from_pydict({"id": list(range(3))})])))
    got = {
        json.dumps(r, default=str, sort_keys=True)
        for b in batches
        for r in zip(b.column("key").to_pylist(), b.column("value").to_pylist(), strict=True)
    }
    assert len(got) == len(expected_rows) == 5
    assert got == expected_rows
