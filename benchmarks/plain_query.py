"""The sample job's query in plain PySpark, the baseline of `restart_vs_plain.py`.

The same source (JSON files, one file a batch), the same transform
(jobs/keyed_totals/transform.py), the same session settings as a streamkeeper driver
(local master, 2 shuffle partitions, HDFS-backed state, no UI, bound to 127.0.0.1) and a
1 s trigger; each batch's rows appended as Parquet by `foreachBatch` (Spark's Delta jars
are not installable here). No write-ahead log, no fence, no commit protocol: what a user
without streamkeeper runs. It runs until it is killed.

    python benchmarks/plain_query.py EVENTS CHECKPOINT OUTPUT [KEY=VALUE ...]

Each KEY=VALUE is one more session setting (`restart_vs_plain.py` gives one side
streamkeeper's checkpoint file manager).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

SCHEMA = "event_id BIGINT, key STRING, value BIGINT"


def main(events: str, checkpoint: str, output: str, *settings: str) -> None:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import DataFrame, SparkSession

    from jobs.keyed_totals.transform import build

    spark = (
        SparkSession.builder.appName("plain-keyed-totals")
        .master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
        )
    )
    for setting in settings:
        key, _, value = setting.partition("=")
        spark = spark.config(key, value)
    spark = spark.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")

    def append(batch: DataFrame, batch_id: int) -> None:
        batch.write.mode("append").parquet(output)

    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).json(events)
    query = (
        build(stream)
        .writeStream.outputMode("update")
        .foreachBatch(append)
        .option("checkpointLocation", checkpoint)
        .trigger(processingTime="1 second")
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main(*sys.argv[1:])
