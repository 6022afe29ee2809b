"""The Spark session of a job's driver: master, state backend, and local-only binding."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from streamkeeper.spec import JobSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
CHANGELOG_KEY = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def state_backend_conf(spec: JobSpec) -> dict[str, str]:
    """Spark settings for the spec's state backend (Flink's state backend knob).

    Both keys are always set: a session reused in one process (tests, notebooks) must
    not keep an earlier job's backend.
    """
    rocksdb = spec.state_backend.type == "rocksdb"
    return {
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER
        if rocksdb
        else HDFS_PROVIDER,
        CHANGELOG_KEY: str(rocksdb and spec.state_backend.changelog).lower(),
    }


def build_session(spec: JobSpec, master: str | None = None) -> SparkSession:
    """Start (or reuse) the driver's SparkSession for `spec`."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.appName(f"streamkeeper-{spec.name}")
        .master(master or spec.spark.master)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(spec.spark.shuffle_partitions))
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for key, value in {**state_backend_conf(spec), **spec.spark.conf}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("STREAMKEEPER_SPARK_LOG_LEVEL", "WARN"))
    return session
