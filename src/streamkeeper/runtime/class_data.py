"""A class-data sharing archive for drivers: Spark's classes mapped at start, not loaded.

A driver's JVM spends most of its first seconds loading and verifying some 9,000 classes
of Spark, Scala, Netty and Arrow. `streamkeeper driver-archive PATH` runs a short
streaming query (file source, a keyed aggregate on each state backend, `foreachBatch`,
`mapInArrow`) in a child process whose JVM writes the classes it loaded to PATH when it
exits (the JDK's dynamic archive, `-XX:ArchiveClassesAtExit`). A job whose spec names the
archive (`spark.class_data_archive`) starts its driver with `-XX:SharedArchiveFile`.

Safe by the JVM's own checks: it maps an archive only if it was made by the same JDK
build with a matching class path, and otherwise logs a warning and loads classes as usual;
the archive holds class metadata only, so what a job computes cannot change. Make it on
each driver host (or in the driver's image) after installing or upgrading Java or pyspark,
and after changing the driver's jars. Only JVMs that Python starts read the spec's setting
(`streamkeeper run`, the embedded launcher); a driver that spark-submit starts takes
`--driver-java-options -XX:SharedArchiveFile=PATH` on its command line instead.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from streamkeeper.errors import StreamkeeperError
from streamkeeper.spec import JobSpec

log = logging.getLogger(__name__)

JAVA_OPTIONS_KEY = "spark.driver.extraJavaOptions"
DUMP_OPTION = "-XX:ArchiveClassesAtExit="
MAP_OPTION = "-XX:SharedArchiveFile="
PROVIDERS = (
    "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
)


def driver_java_options(spec: JobSpec) -> dict[str, str]:
    """The driver's JVM options with the spec's archive added to the spec's own options.

    Empty when the spec names no archive. An archive that is not there is left out, with
    a warning naming the command that makes it: the driver starts as it would without.
    """
    archive = spec.spark.class_data_archive
    if archive is None:
        return {}
    own = spec.spark.conf.get(JAVA_OPTIONS_KEY, "").strip()
    if not Path(archive).is_file():
        log.warning(
            "spark.class_data_archive %s does not exist; the driver starts without it "
            "(make it on this host with `streamkeeper driver-archive %s`)",
            archive,
            archive,
        )
        return {JAVA_OPTIONS_KEY: own} if own else {}
    return {JAVA_OPTIONS_KEY: f"{own} {MAP_OPTION}{archive}".strip()}


def create_archive(archive: Path, timeout: float = 600.0) -> int:
    """Write a class-data archive for this host's JDK and pyspark to `archive`.

    Written beside it under a temporary name and renamed into place, so a driver
    starting meanwhile maps the old archive or the new one, never half of one.

    Returns:
        The archive's size in bytes.

    Raises:
        StreamkeeperError: the run failed, or its JVM wrote no archive.
    """
    archive = archive.expanduser().absolute()
    if any(c.isspace() for c in str(archive)):
        raise StreamkeeperError(
            f"archive path {str(archive)!r} has a space, which a JVM option cannot carry; "
            "choose a path without spaces"
        )
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(f".{archive.name}.{os.getpid()}.partial")
    partial.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-m", "streamkeeper.runtime.class_data", str(partial)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        raise StreamkeeperError(
            f"the run that makes the class-data archive failed ({done.returncode}): "
            f"{done.stderr.strip()[-2000:]}"
        )
    _await_jvm_exit(partial, deadline=time.monotonic() + timeout)
    if not partial.is_file() or partial.stat().st_size == 0:
        partial.unlink(missing_ok=True)
        raise StreamkeeperError(
            f"the JVM wrote no class-data archive to {archive}: it needs a JDK of version 13 "
            "or later (`java -version`), and PYSPARK_SUBMIT_ARGS must not set "
            "--driver-java-options (it replaces the option that writes the archive)"
        )
    partial.replace(archive)
    return archive.stat().st_size


def _await_jvm_exit(partial: Path, deadline: float) -> None:
    """The JVM outlives its Python process while it writes the archive."""
    import psutil

    marker = f"{DUMP_OPTION}{partial}"
    while time.monotonic() < deadline:
        writing = False
        for process in psutil.process_iter(["cmdline"]):
            if any(marker in part for part in process.info["cmdline"] or ()):
                writing = True
                break
        if not writing:
            return
        time.sleep(0.2)
    raise StreamkeeperError(f"the JVM writing {partial} did not exit in time")


def _run_workload(partial: str) -> None:
    """In the child: the classes a driver loads, through a short query on each backend."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from streamkeeper.runtime.python_workers import import_batch_writer

    work = Path(tempfile.mkdtemp(prefix="streamkeeper-archive-"))
    try:
        events = work / "events"
        events.mkdir()
        for n in range(2):
            rows = [{"key": f"k{i % 7}", "value": i} for i in range(100)]
            (events / f"{n}.json").write_text("\n".join(json.dumps(row) for row in rows))
        address = os.environ["SPARK_LOCAL_IP"]
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("streamkeeper-driver-archive")
            .config("spark.driver.host", address)
            .config("spark.driver.bindAddress", address)
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.sql.execution.arrow.pyspark.enabled", "true")
            .config(JAVA_OPTIONS_KEY, f"{DUMP_OPTION}{partial}")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")

        def write(batch, batch_id: int) -> None:  # type: ignore[no-untyped-def]
            batch.mapInArrow(import_batch_writer, "ready boolean").collect()
            batch.write.mode("append").parquet(str(work / "output"))

        for n, provider in enumerate(PROVIDERS):
            spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
            stream = spark.readStream.schema("key STRING, value BIGINT")
            totals = (
                stream.option("maxFilesPerTrigger", 1)
                .json(str(events))
                .groupBy("key")
                .agg(F.sum("value").alias("total"))
            )
            query = (
                totals.writeStream.outputMode("update")
                .foreachBatch(write)
                .option("checkpointLocation", str(work / f"checkpoint-{n}"))
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    _run_workload(sys.argv[1])
