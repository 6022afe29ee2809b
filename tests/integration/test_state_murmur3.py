"""streamkeeper.state.murmur3 against Spark's own `hash()`, type by type, nulls included."""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamkeeper.state import murmur3

pytestmark = pytest.mark.integration
ROWS = 600


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = SparkSession.builder.master("local[2]").getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session


def _text(rng: random.Random) -> str:
    # Every tail length (0-3 bytes past a whole word) and multi-byte UTF-8.
    alphabet = "ab\u00e9\u4e2d\U0001f600 z9"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 14)))


def _maybe(rng: random.Random, value: object) -> object:
    return None if rng.random() < 0.1 else value


def _rows() -> list[tuple]:
    rng = random.Random(7)
    ints = [0, 1, -1, 2**31 - 1, -(2**31), 42]
    longs = [0, -1, 2**63 - 1, -(2**63), 2**32, -(2**32) + 3]
    floats = [0.0, -0.0, float("nan"), float("inf"), -float("inf"), 1.5, -2.25]
    day = dt.date(1970, 1, 1)
    moment = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)
    rows = []
    for _ in range(ROWS):
        inner = (
            _maybe(rng, rng.choice(ints + [rng.randrange(-(2**31), 2**31)])),
            _maybe(rng, _text(rng)),
        )
        rows.append(
            (
                _maybe(rng, rng.choice(ints + [rng.randrange(-(2**31), 2**31)])),
                _maybe(rng, rng.choice(longs + [rng.randrange(-(2**63), 2**63)])),
                _maybe(rng, _text(rng)),
                _maybe(rng, bytes(rng.randrange(256) for _ in range(rng.randrange(0, 11)))),
                _maybe(rng, rng.choice(floats + [rng.uniform(-1e9, 1e9)])),
                _maybe(rng, rng.choice(floats + [rng.uniform(-1e3, 1e3)])),
                _maybe(rng, rng.random() < 0.5),
                _maybe(rng, rng.randrange(-128, 128)),
                _maybe(rng, rng.randrange(-(2**15), 2**15)),
                _maybe(rng, day + dt.timedelta(days=rng.randrange(-40_000, 40_000))),
                _maybe(rng, moment + dt.timedelta(microseconds=rng.randrange(-(10**15), 10**15))),
                _maybe(rng, inner),
            )
        )
    return rows


SCHEMA = (
    "i int, l long, s string, b binary, d double, f float, z boolean, y byte, h short, "
    "day date, ts timestamp, inner struct<n: int, t: string>"
)


@pytest.mark.parametrize(
    "columns",
    [["i"], ["l"], ["s"], ["b"], ["d"], ["f"], ["z"], ["y"], ["h"], ["day"], ["ts"],
     ["inner"], ["s", "i", "inner", "l", "d", "b"], ["z", "y", "h", "day", "ts", "f"]],
    ids=lambda columns: "+".join(columns),
)  # fmt: skip
def test_the_hash_and_partition_of_a_key_are_sparks(spark: SparkSession, columns: list) -> None:
    frame = spark.createDataFrame(_rows(), SCHEMA).select(F.struct(*columns).alias("key"))
    spark_type = json.loads(frame.schema["key"].dataType.json())
    assert murmur3.supports(spark_type)
    expected = frame.select(
        "key",
        F.hash("key").alias("hash"),
        *[F.pmod(F.hash("key"), F.lit(n)).alias(f"p{n}") for n in (1, 7, 200)],
    ).toArrow()

    ours = murmur3.spark_hash(expected.column("key"), spark_type)
    mismatched = np.nonzero(ours != expected.column("hash").to_numpy())[0]
    assert not len(mismatched), expected.slice(int(mismatched[0]), 1).to_pylist()
    for n in (1, 7, 200):
        partitions = murmur3.partition(expected.column("key"), spark_type, n)
        assert partitions.tolist() == expected.column(f"p{n}").to_pylist()


def test_types_spark_must_hash_itself_are_not_claimed() -> None:
    for spark_type in ["decimal(10,2)", {"type": "array", "elementType": "integer"}]:
        assert not murmur3.supports(spark_type)
        assert not murmur3.supports(
            {"type": "struct", "fields": [{"name": "k", "type": spark_type}]}
        )
    with pytest.raises(ValueError, match="decimal"):
        murmur3.spark_hash(pa.array([1]), "decimal(10,2)")
