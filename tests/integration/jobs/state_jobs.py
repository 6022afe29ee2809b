"""Stateful sample jobs for the savepoint tests, in pairs: the old code and changed code.

Every job reads events `event_id BIGINT, key STRING, value BIGINT` (the sample job's);
`ts` (event time) is derived from the event id so that repeats share it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import LongType, StructField, StructType

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


class EventCounter(StatefulProcessor):
    """transformWithStateInPandas: events per key in a ValueState `count`."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.count = handle.getValueState("count", StructType([StructField("n", LongType())]))

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        n = self.count.get()[0] if self.count.exists() else 0
        for frame in rows:
            n += len(frame)
        self.count.update((n,))
        yield pd.DataFrame({"key": [key[0]], "n": [n]})

    def handleInitialState(self, key: Any, initialState: Any, timerValues: Any) -> None:
        self.count.update((int(initialState["n"].iloc[0]),))

    def close(self) -> None:
        pass


def counted(events: DataFrame) -> DataFrame:
    """Events per key with transformWithState; restored through its initialState."""
    from streamkeeper.state.processor import initial_state

    grouped = events.groupBy("key")
    seed = initial_state(events.sparkSession, "counter", "count")
    if seed is None:
        return grouped.transformWithStateInPandas(
            EventCounter(), "key string, n long", "Update", "None"
        )
    return grouped.transformWithStateInPandas(
        EventCounter(), "key string, n long", "Update", "None", initialState=seed.groupBy("key")
    )
