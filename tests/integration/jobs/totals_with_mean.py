"""The sample job's changed code: the same state, one more output column (`mean`)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs.keyed_totals.transform import build as totals


def build(events: DataFrame) -> DataFrame:
    return totals(events).withColumn("mean", F.col("total") / F.col("events"))
