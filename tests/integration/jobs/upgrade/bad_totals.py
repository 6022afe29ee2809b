"""A broken v2 of the sample job: every total is negated (the quality gate fails)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def build(events: DataFrame) -> DataFrame:
    totals = events.groupBy("key").agg(
        F.count(F.lit(1)).alias("events"),
        (-F.sum("value")).alias("total"),
    )
    return totals.withColumn("mean", F.col("total") / F.col("events"))
