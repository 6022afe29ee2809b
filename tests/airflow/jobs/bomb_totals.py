"""A v2 of the sample job that goes wrong after the handover: once the flag file named by
the environment variable STREAMKEEPER_TEST_BOMB exists, every total it writes is negated.
The flag is read when each batch runs (not when the query is built: green builds its
live query while warming up, before the test can arm it), so green passes the quality
gate on its shadow run, then fails its probation."""

from __future__ import annotations

import os
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType


def _armed() -> bool:
    flag = os.environ.get("STREAMKEEPER_TEST_BOMB")
    return bool(flag) and Path(flag).exists()


def build(events: DataFrame) -> DataFrame:
    armed = F.udf(_armed, BooleanType()).asNondeterministic()
    totals = events.groupBy("key").agg(
        F.count(F.lit(1)).alias("events"), F.sum("value").alias("total")
    )
    sign = F.when(armed(), F.lit(-1)).otherwise(F.lit(1))
    return totals.withColumn("total", F.col("total") * sign).withColumn(
        "mean", F.col("total") / F.col("events")
    )
