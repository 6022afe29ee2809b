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
from streamkeeper.state.spark_state import canonically_named, state_frame, state_types
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
