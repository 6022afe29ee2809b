"""The Spark session of a job's driver: master, state backend, and local-only binding."""

from __future__ import annotations

import importlib
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

from streamkeeper.runtime.class_data import driver_java_options
from streamkeeper.spec import JobSpec

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# PySpark 4.2's py4j converter for Python lists (`can_convert` in pyspark/sql/types.py)
# imports this module, and with it pandas, unittest and protobuf, on the first JVM call
# after the gateway starts: about 0.4 s of CPU on the critical path of every start. It is
# imported in the background while the gateway's JVM launches (a second or more of
# waiting), so the call finds it loaded. Plain PySpark pays it after the launch.
CONVERTER_IMPORT = "pyspark.testing.utils"

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


MIN_BATCHES_KEY = "spark.sql.streaming.minBatchesToRetain"


def retention_conf(spec: JobSpec) -> dict[str, str]:
    """Keep enough of Spark's commit log that no batch awaiting its commit loses its entry.

    At most `checkpoint.max_concurrent` completed batches wait for their commit, so a
    log that keeps far more than that cannot race the committer (and a purged entry
    still reads as complete: snapshots.spark_checkpoint). Spark's default is 100.
    """
    asked = int(spec.spark.conf.get(MIN_BATCHES_KEY, 100))
    return {MIN_BATCHES_KEY: str(max(asked, 2 * spec.checkpoint.max_concurrent + 8))}


CHECKPOINT_FILE_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
# Spark's default (FileContext-based) manager has Hadoop fork `chmod` for every file it
# creates and `readlink` twice for every rename on a local disk, unless Hadoop's native
# library is installed (pip's PySpark has none): 35-50 ms per metadata file, on every
# batch's offsets and commit log and on every state file. The FileSystem-based manager
# writes and renames the same way (a hidden temp file, then rename(2), which is atomic
# on a local file system) with one fork: `commits/N`'s write 20-24 -> 5 ms.
# The job's checkpoint directory is always local (externalized to object storage by us).
LOCAL_CHECKPOINT_FILE_MANAGER = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)


def build_session(spec: JobSpec, master: str | None = None) -> SparkSession:
    """Start (or reuse) the driver's SparkSession for `spec`.

    The driver listens on `SPARK_LOCAL_IP` (loopback unless set: a gateway host sets its
    own address, which the cluster's executors reach). In a cluster-mode driver pod
    (`STREAMKEEPER_DEPLOY_MODE=cluster`, set by the launchers) Spark's own addresses stand.
    """
    in_cluster = os.environ.get("STREAMKEEPER_DEPLOY_MODE") == "cluster"
    if not in_cluster:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(f"streamkeeper-{spec.name}").master(
        master or spec.spark.master
    )
    if not in_cluster:
        address = os.environ["SPARK_LOCAL_IP"]
        builder = builder.config("spark.driver.host", address).config(
            "spark.driver.bindAddress", address
        )
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(spec.spark.shuffle_partitions))
        .config("spark.sql.streaming.stopGracefullyOnShutdown", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    for key, value in {
        CHECKPOINT_FILE_MANAGER_KEY: LOCAL_CHECKPOINT_FILE_MANAGER,  # the spec's may replace it
        **state_backend_conf(spec),
        **spec.spark.conf,
        **driver_java_options(spec),
        **retention_conf(spec),
    }.items():
        builder = builder.config(key, value)
    import_in_background(CONVERTER_IMPORT)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("STREAMKEEPER_SPARK_LOG_LEVEL", "WARN"))
    return session


def import_in_background(module: str) -> threading.Thread | None:
    """Import `module` in a daemon thread, unless it is loaded; None then.

    Only the timing depends on it: a failed import is logged at DEBUG, and whoever needs
    the module imports it (Python's import lock makes them wait for this one).
    """
    if module in sys.modules:
        return None
    thread = threading.Thread(
        target=_import_quietly, args=(module,), name=f"streamkeeper-import-{module}", daemon=True
    )
    thread.start()
    return thread


def _import_quietly(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception:  # noqa: BLE001 - the caller's own import reports it
        log.debug("could not import %s ahead of Spark's first call", module, exc_info=True)
