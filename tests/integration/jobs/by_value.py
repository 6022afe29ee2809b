"""The sample job's aggregate keyed by another column: a different state topology."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def build(events: DataFrame) -> DataFrame:
    return events.groupBy(F.col("value").cast("string").alias("key")).agg(
        F.count(F.lit(1)).alias("events"),
        F.sum("value").alias("total"),
    )
