"""Transforms the bad-input corpus restores savepoints into."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def double_totals(events: DataFrame) -> DataFrame:
    """The sample job's aggregation, but summing doubles: its state's `sum` is a double
    where the sample job's savepoints hold a bigint (a state schema that does not fit)."""
    return events.groupBy("key").agg(
        F.count(F.lit(1)).alias("events"),
        F.sum(F.col("value").cast("double")).alias("total"),
    )


def length_keyed_totals(events: DataFrame) -> DataFrame:
    """The sample job's aggregation keyed by the key's length: an int key where the
    sample job's savepoints hold a string one."""
    return events.groupBy(F.length("key").alias("key")).agg(
        F.count(F.lit(1)).alias("events"),
        F.sum("value").alias("total"),
    )
