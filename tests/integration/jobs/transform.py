"""Keyed totals over a replayable source: count and sum of `value` per `key`."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def build(events: DataFrame) -> DataFrame:
    """The running aggregate; in update mode each batch emits the keys it changed."""
    return events.groupBy("key").agg(
        F.count(F.lit(1)).alias("events"),
        F.sum("value").alias("total"),
    )
