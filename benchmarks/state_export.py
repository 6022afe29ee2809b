"""Canonical savepoints of a keyed state: export and restore speed, beside Flink's.

Run:  /work/main/.venv/bin/python benchmarks/state_export.py [--keys N] [--backends hdfs,rocksdb]
          [--partitions P] [--restore-partitions Q] [--repeats R] [--workdir DIR] [--keep]

For each state store, one batch of the sample job's aggregation (count and sum per key)
over N distinct keys (default 1,000,000) builds the state; then, R times each:

  export   export_canonical: Spark's statestore reader -> Arrow -> one Delta table (local)
  restore  restore_canonical into a fresh checkpoint with Q partitions: the bootstrap
           batch over an empty input, then reading, encoding and writing the state

The state's size is the bytes of its UnsafeRow keys and values (what the store holds,
framing excluded); MB/s = that size / the time. Flink 2.3 (PyFlink, this machine, same
job): a canonical savepoint of 1M keys in 1.1-1.4 s = 40-54 MB/s. The restore is
checked: the restored state has every key. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

FLINK_MB_S = (40.0, 54.0)  # canonical savepoint, 1M keys, DESIGN.md section 6
FLINK_SECONDS = (1.1, 1.4)
MB = 1_000_000


def write_keys(directory: Path, keys: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    width = len(str(keys - 1))
    names = pa.array([f"k{i:0{width}d}" for i in range(keys)])
    values = pa.array(np.arange(keys, dtype=np.int64) % 1000)
    pq.write_table(pa.table({"key": names, "value": values}), directory / "keys.parquet")


def build_state(spark: Any, inputs: Path, checkpoint: Path, backend: str, partitions: int) -> float:
    from tests.support.state import state_store

    with state_store(spark, backend, partitions):
        started = time.monotonic()
        query = (
            _output(spark, inputs)
            .writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    return time.monotonic() - started


def _output(spark: Any, inputs: Path) -> Any:
    from pyspark.sql import functions as F

    events = spark.readStream.schema("key STRING, value BIGINT").parquet(str(inputs))
    return events.groupBy("key").agg(
        F.count(F.lit(1)).alias("events"), F.sum("value").alias("total")
    )


def state_bytes(savepoint: Path, operator: Any) -> int:
    """The UnsafeRow bytes of the keys and values, as the state store holds them."""
    from streamkeeper.state import deltas
    from streamkeeper.state.unsafe_row import encode_struct
    from streamkeeper.storage import Location

    table = deltas.read_table(Location(str(savepoint)).child(operator.table))
    keys = encode_struct(table["key"], operator.key_type())
    values = encode_struct(table["value"], operator.value_type())
    return int(sum(a.buffers()[2].size for a in (keys, values)))


def run_backend(spark: Any, args: argparse.Namespace, work: Path, backend: str) -> dict:
    from streamkeeper.spec import StateBackendSpec
    from streamkeeper.state.export import export_canonical
    from streamkeeper.state.positions import read_source_positions
    from streamkeeper.state.restore import restore_canonical
    from streamkeeper.state.spark_state import state_frame
    from streamkeeper.storage import Location

    checkpoint = work / f"{backend}-state"
    build = build_state(spark, work / "input", checkpoint, backend, args.partitions)
    exports, restores, parts = [], [], []
    size = rows = table_bytes = 0
    for attempt in range(args.repeats):
        savepoint = work / f"{backend}-savepoint-{attempt}"
        started = time.monotonic()
        operators = export_canonical(spark, checkpoint, 0, {0: "totals"}, Location(str(savepoint)))
        exports.append(time.monotonic() - started)
        rows, table_bytes = operators[0].rows, operators[0].bytes
        size = size or state_bytes(savepoint, operators[0])
        positions = read_source_positions(checkpoint, 0).to_manifest()
        restored = work / f"{backend}-restored-{attempt}"
        report = restore_canonical(
            spark,
            savepoint_location=Location(str(savepoint)),
            operators=operators,
            source_offsets=positions["offsets"],
            source_log=positions["log"],
            new_output=_output(spark, work / "input"),
            new_uids={0: "totals"},
            checkpoint_dir=restored,
            shuffle_partitions=args.restore_partitions,
            state_backend=StateBackendSpec(type=backend),
        )
        restores.append(report.seconds)
        parts.append((report.bootstrap_seconds, report.state_seconds))
        restored_rows = state_frame(spark, restored, 1, 0).count()
        if restored_rows != rows:
            raise SystemExit(f"{backend}: restored {restored_rows} rows, expected {rows}")
        print(
            f"  {backend} #{attempt + 1}: export {exports[-1]:.2f}s, restore {report.seconds:.2f}s "
            f"(bootstrap {report.bootstrap_seconds:.2f}s, state {report.state_seconds:.2f}s), "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        if not args.keep:
            shutil.rmtree(savepoint)
            shutil.rmtree(restored)
    export_s, restore_s = statistics.median(exports), statistics.median(restores)
    state_s = statistics.median(p[1] for p in parts)
    return {
        "backend": backend,
        "keys": rows,
        "state_bytes": size,
        "table_bytes": table_bytes,
        "build_s": round(build, 2),
        "export_s": [round(x, 3) for x in exports],
        "restore_s": [round(x, 3) for x in restores],
        "restore_parts_s": [[round(a, 3), round(b, 3)] for a, b in parts],
        "export_mb_s": round(size / MB / export_s, 1),
        "restore_mb_s": round(size / MB / restore_s, 1),
        "restore_state_mb_s": round(size / MB / state_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--backends", default="hdfs,rocksdb")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--restore-partitions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    from pyspark.sql import SparkSession

    work = args.workdir or Path(tempfile.mkdtemp(prefix="sk-state-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()}, work {work}", flush=True)
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "4g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    write_keys(work / "input", args.keys)
    results = []
    try:
        for backend in args.backends.split(","):
            results.append(run_backend(spark, args, work, backend))
    finally:
        if not args.keep and args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    low, high = FLINK_MB_S
    print(
        f"\n{'store':8} {'keys':>9} {'state MB':>9} {'export s':>9} {'MB/s':>6}"
        f" {'restore s':>10} {'MB/s':>6} {'(state part MB/s)':>18}"
    )
    for r in results:
        print(
            f"{r['backend']:8} {r['keys']:>9} {r['state_bytes'] / MB:>9.1f} "
            f"{statistics.median(r['export_s']):>9.2f} {r['export_mb_s']:>6.1f} "
            f"{statistics.median(r['restore_s']):>10.2f} {r['restore_mb_s']:>6.1f} "
            f"{r['restore_state_mb_s']:>18.1f}"
        )
    print(
        f"flink    {1_000_000:>9} {'':>9} {FLINK_SECONDS[0]:>5}-{FLINK_SECONDS[1]} "
        f"{low:.0f}-{high:.0f} (canonical savepoint, heap/RocksDB, this machine)"
    )
    print(json.dumps({"load": os.getloadavg(), "flink_mb_s": FLINK_MB_S, "results": results}))


if __name__ == "__main__":
    main()
