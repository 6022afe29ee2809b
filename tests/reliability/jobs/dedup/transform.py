"""dedup: each event once, however often it arrives (a producer's retries resend events).

Event time is derived from the event id (`ts = EPOCH + event_id` seconds), so a resent
event carries its original time; the watermark bounds the state: an id is forgotten an
hour of event time after the newest seen (resends come within a few files)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

EPOCH = 1_700_000_000


def build(events: DataFrame) -> DataFrame:
    """Append mode: an event is emitted in the batch that first sees it, never again."""
    return (
        events.withColumn("ts", F.timestamp_seconds(F.lit(EPOCH) + F.col("event_id")))
        .withWatermark("ts", "1 hour")
        .dropDuplicates(["event_id", "ts"])
    )
