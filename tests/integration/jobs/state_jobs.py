"""Stateful sample jobs for the savepoint tests, in pairs: the old code and changed code.

Every job reads events `event_id BIGINT, key STRING, value BIGINT` (the sample job's);
`ts` (event time) is derived from the event id so that repeats share it.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

EPOCH = 1_700_000_000


def _event_time() -> Column:
    return F.timestamp_seconds(F.lit(EPOCH) + F.col("event_id"))


def totals(events: DataFrame) -> DataFrame:
    """The sample job: count and sum per key (one aggregation)."""
    return events.groupBy("key").agg(
        F.count(F.lit(1)).alias("events"), F.sum("value").alias("total")
    )


def totals_with_mean(events: DataFrame) -> DataFrame:
    """Changed code: the same state, one more output column."""
    return totals(events).withColumn("mean", F.col("total") / F.col("events"))


def totals_with_max(events: DataFrame) -> DataFrame:
    """Changed code: one more aggregate, so the value gains a nullable field."""
    return events.groupBy("key").agg(
        F.count(F.lit(1)).alias("events"),
        F.sum("value").alias("total"),
        F.max("value").alias("largest"),
    )


def totals_of_doubles(events: DataFrame) -> DataFrame:
    """Incompatible code: the sum's state becomes a double."""
    return events.groupBy("key").agg(
        F.count(F.lit(1)).alias("events"), F.sum(F.col("value").cast("double")).alias("total")
    )


def unique_totals(events: DataFrame) -> DataFrame:
    """Two stateful operators: deduplicate events by id, then count and sum per key."""
    return totals(events.dropDuplicates(["event_id"]))


def unique_totals_by_upper_key(events: DataFrame) -> DataFrame:
    """Changed code of unique_totals: the same state, keys shown upper-cased."""
    return unique_totals(events).withColumn("key_upper", F.upper("key"))


def unique_events(events: DataFrame) -> DataFrame:
    """Deduplication with a watermark (append mode): each event id once."""
    return (
        events.withColumn("ts", _event_time())
        .withWatermark("ts", "2 hours")
        .dropDuplicates(["event_id", "ts"])
    )


def unique_events_tagged(events: DataFrame) -> DataFrame:
    """Changed code of unique_events: one more output column."""
    return unique_events(events).withColumn("tag", F.lit("v2"))


def only_dedup(events: DataFrame) -> DataFrame:
    """unique_totals without its aggregation: the totals state has no operator."""
    return events.dropDuplicates(["event_id"]).select("event_id", "key", "value")
