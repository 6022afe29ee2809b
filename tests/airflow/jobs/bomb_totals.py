"""A v2 of the sample job that goes wrong after the handover: its transform is built
again when green goes live, and from then on (if the flag file named by the environment
variable STREAMKEEPER_TEST_BOMB exists) every total is negated: green passes the quality
gate on its shadow run, then fails its probation."""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def build(events: DataFrame) -> DataFrame:
    flag = os.environ.get("STREAMKEEPER_TEST_BOMB")
    armed = bool(flag) and Path(flag).exists()
    total = -F.sum("value") if armed else F.sum("value")
    totals = events.groupBy("key").agg(F.count(F.lit(1)).alias("events"), total.alias("total"))
    return totals.withColumn("mean", F.col("total") / F.col("events"))
