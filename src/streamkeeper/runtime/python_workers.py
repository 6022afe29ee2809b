"""Spark's Python workers, started while the driver starts so the first batch need not.

Every batch's files are written by `mapInArrow` in Spark's Python workers. In a fresh JVM
the first such task starts the worker daemon, forks a worker per core, sets up Arrow on
both sides and imports pyarrow and the writer: about 2 s on 2 vCPU, on the critical path
of every start and restart (plain PySpark writing Parquet from the JVM pays none of it).

A two-task job run in the background as soon as the session exists pays that while the
driver builds the plan, takes its epoch, recovers and plans the first batch, which keep
the JVM on one core. Spark keeps idle workers for the next task (`spark.python.worker.reuse`,
on by default), so the first batch's tasks find them with the writer already imported.
Best effort: a warm-up that fails or is still running changes nothing but the timing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

REUSE_KEY = "spark.python.worker.reuse"
DESCRIPTION = "streamkeeper: start Python workers"


def warm_python_workers(spark: SparkSession) -> threading.Thread | None:
    """Start one Python worker per core in the background; None when Spark would not
    keep them (worker reuse turned off), where warming would be wasted work."""
    if spark.sparkContext.getConf().get(REUSE_KEY, "true").strip().lower() == "false":
        return None
    thread = threading.Thread(
        target=_run_warm_up, args=(spark,), name="streamkeeper-python-workers", daemon=True
    )
    thread.start()
    return thread


def _run_warm_up(spark: SparkSession) -> None:
    try:
        context = spark.sparkContext
        context.setLocalProperty("spark.job.description", DESCRIPTION)
        tasks = max(1, context.defaultParallelism)
        spark.range(0, tasks, numPartitions=tasks).mapInArrow(
            import_batch_writer, "ready boolean"
        ).collect()
        log.debug("Python workers started (%d tasks)", tasks)
    except Exception:  # noqa: BLE001 - only the timing depends on it; the batch starts its own
        log.debug("could not start Python workers ahead of the first batch", exc_info=True)


def import_batch_writer(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Runs in a Python worker: import what each batch's writer imports."""
    import psutil  # noqa: F401 - the writer names the JVM that runs it with it
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401 - the writer filters with it
    import pyarrow.parquet  # noqa: F401 - the writer writes with it

    import streamkeeper.commit.writer  # noqa: F401

    rows: list[dict[str, Any]] = [{"ready": True} for _ in batches]
    yield pa.RecordBatch.from_pylist(rows, schema=pa.schema([("ready", pa.bool_())]))
