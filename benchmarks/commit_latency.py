"""Commit latency: a batch's end (Spark's `commits/N`) to its output visible in Delta.

Run:  .venv/bin/python benchmarks/commit_latency.py [--backends local,s3] [--seconds 60]
          [--rate 2000] [--externalized] [--set KEY=VALUE] [--workdir DIR] [--keep]

The sample job (keyed-totals: `totals` merged by key, `changes` appended, exactly once)
runs as a real driver (`streamkeeper run`, local[2], 1 s interval) at a steady rate (one
file of `--rate` events per interval: benchmarks/loadgen.py), on local storage and on
SeaweedFS. After a warm-up of 15 s, every commit marker of the next `--seconds` is read:
its `visibility_delay_ms` (batch end -> the tables committed) and where that went
(`visibility_phases_ms`: noticing the completed batch, externalizing its checkpoint,
each table's Delta commit); what is left is the coordinator's own work. Part of
"noticing" is Spark's: the delay starts at `commits/N`'s mtime, written to a hidden
file that Spark renames into place with its checksum; the gap to the rename (the file's
ctime) is printed as "of which Spark's commit log write".

The baseline, on the same backend in the same run: delta-rs alone, the floor of any
Delta commit of such a batch: from this process, the same number of rows appended to a
table of the same schema and merged by key into another (100 keys), one batch a
second, with none of the protocol (no WAL, fence, checkpoint, marker). Printed: p50 and
p95 of ours, of the baseline, their ratio, and the medians of each phase; the targets of
issue 26 (p50 <= 50 ms local, <= 150 ms SeaweedFS) with PASS/FAIL. Last line: one JSON
object.
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

from benchmarks.loadgen import (  # noqa: E402
    RateFeeder,
    driver_command,
    finite,
    load_average,
    machine,
    start_driver,
)
from benchmarks.sink_throughput import Backend, percentile, read_markers  # noqa: E402

TARGET_P50_MS = {"local": 50.0, "s3": 150.0}
WARMUP_SECONDS = 15.0
KEYS = 100


def _wait_for_markers(root: str, lineage: str, driver: Any, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if driver.poll() is not None:
            raise RuntimeError(f"the driver exited with {driver.returncode}")
        if len(read_markers(root, lineage)) >= count:
            return
        time.sleep(1)
    raise RuntimeError(f"fewer than {count} commits within {timeout:.0f} s")


def ours(backend: Backend, work: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The markers a real driver wrote over `--seconds` after its warm-up."""
    from streamkeeper.spec import load_spec

    root = backend.root("driver")
    events, checkpoint = work / "events", work / "checkpoint"
    extra = ["checkpoint.externalized.enabled=true"] if args.externalized else []
    extra += args.set
    argv = driver_command(root, checkpoint, events, "1s")  # type: ignore[arg-type] - a URI too
    argv += [x for setting in extra for x in ("--set", setting)]
    spec = load_spec(REPO / "jobs" / "keyed_totals" / "job.yaml")
    feeder = RateFeeder(events, rate=args.rate, period=1.0, keys=KEYS)
    feeder.start()
    driver = start_driver(argv, work / "driver.log", work)
    try:
        _wait_for_markers(root, spec.lineage_id, driver, 1, 300)
        time.sleep(WARMUP_SECONDS)
        since = time.time()
        time.sleep(args.seconds)
        until = time.time()
    finally:
        feeder.stop()
        driver.terminate()
        try:
            driver.wait(timeout=120)
        except Exception:  # noqa: BLE001 - a driver that does not stop is killed
            driver.kill()
    markers = read_markers(root, spec.lineage_id)
    return [m for m in markers if since <= m["committed_at"] <= until]


def commit_log_write_ms(checkpoint: Path, batches: list[int]) -> list[float]:
    """Spark's own part of the delay: `commits/N` is written to a hidden file and renamed
    (with its checksum file) into place; the delay starts at the write (its mtime), the
    checkpoint is complete at the rename (the file's ctime on a local disk)."""
    gaps = []
    for batch in batches:
        try:
            done = os.stat(checkpoint / "commits" / str(batch))
        except FileNotFoundError:  # purged by Spark
            continue
        gaps.append(max(0.0, (done.st_ctime - done.st_mtime) * 1000))
    return gaps


def baseline(backend: Backend, rows_per_batch: int, batches: int) -> list[float]:
    """delta-rs alone: an append and a merge of `rows_per_batch` rows, once a second."""
    import numpy as np
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from streamkeeper.storage import Location, S3Settings

    root = backend.root("baseline")
    location = Location(root, S3Settings.from_env())
    options = location.storage_options()
    rng = np.random.default_rng(11)

    def batch() -> pa.Table:
        keys = rng.integers(0, KEYS, rows_per_batch)
        return pa.table(
            {
                "key": [f"k{k:04d}" for k in keys.tolist()],
                "events": pa.array(rng.integers(1, 100, rows_per_batch), pa.int64()),
                "total": pa.array(rng.integers(0, 10_000, rows_per_batch), pa.int64()),
            }
        )

    def distinct(rows: pa.Table) -> pa.Table:  # a merge source holds each key once
        latest = rows.group_by("key").aggregate([("events", "max"), ("total", "max")])
        return latest.rename_columns(["key", "events", "total"])

    changes, totals = f"{root}/tables/changes", f"{root}/tables/totals"
    write_deltalake(changes, batch(), storage_options=options)
    write_deltalake(totals, distinct(batch()), storage_options=options)
    table = DeltaTable(totals, storage_options=options)
    delays: list[float] = []
    for _ in range(batches):
        rows = batch()
        due = time.monotonic() + 1.0
        started = time.perf_counter()
        write_deltalake(changes, rows, mode="append", storage_options=options)
        table.update_incremental()
        (
            table.merge(distinct(rows), "t.key = s.key", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )
        delays.append((time.perf_counter() - started) * 1000)
        time.sleep(max(0.0, due - time.monotonic()))
    return delays


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure(name: str, workdir: Path, args: argparse.Namespace) -> dict[str, Any]:
    work = workdir / name
    work.mkdir(parents=True)
    with Backend(name, work) as backend:
        load = load_average()
        markers = ours(backend, work, args)
        delays = [float(m["visibility_delay_ms"]) for m in markers if m.get("visibility_delay_ms")]
        phases = [m.get("visibility_phases_ms") or {} for m in markers]
        rows = [int(m["rows"].get("changes", 0)) for m in markers]
        rows_per_batch = max(1, round(_median(rows) or 1))
        spark_ms = commit_log_write_ms(work / "checkpoint", [m["batch_id"] for m in markers])
        bare = baseline(backend, rows_per_batch, max(10, len(markers)))
    tables = sorted({sink for p in phases for sink in p.get("tables", {})})
    phase_medians = {
        "of which Spark's commit log write": _median(spark_ms),
        "noticed": _median([p["noticed"] for p in phases if p.get("noticed") is not None]),
        "checkpoint": _median([p["checkpoint"] for p in phases if "checkpoint" in p]),
        **{
            f"table {sink}": _median([p["tables"][sink] for p in phases if sink in p["tables"]])
            for sink in tables
        },
    }
    result = {
        "backend": name,
        "load1_at_start": round(load, 2),
        "commits": len(delays),
        "rows_per_batch": rows_per_batch,
        "ours_p50_ms": percentile(delays, 50),
        "ours_p95_ms": percentile(delays, 95),
        "baseline_p50_ms": percentile(bare, 50),
        "baseline_p95_ms": percentile(bare, 95),
        "phase_medians_ms": phase_medians,
        "target_p50_ms": TARGET_P50_MS[name],
    }
    p50, base = result["ours_p50_ms"], result["baseline_p50_ms"]
    result["ratio_p50"] = None if not (p50 and base) else p50 / base
    result["pass"] = p50 is not None and p50 <= TARGET_P50_MS[name]
    return result


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backends", default="local,s3")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=2000.0, help="events per second")
    parser.add_argument("--externalized", action="store_true", help="externalize checkpoints")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="a job setting"
    )
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args(argv)
    print(f"machine: {machine()}", flush=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="commit-latency-"))
    results = []
    try:
        for name in args.backends.split(","):
            result = measure(name, workdir, args)
            results.append(result)
            print(
                f"{name}: {result['commits']} commits of ~{result['rows_per_batch']} rows; "
                f"ours p50 {_fmt(result['ours_p50_ms'])} ms p95 {_fmt(result['ours_p95_ms'])}"
                f" ms; delta-rs alone p50 {_fmt(result['baseline_p50_ms'])} ms p95 "
                f"{_fmt(result['baseline_p95_ms'])} ms; ratio "
                f"{_fmt(result['ratio_p50'])}; load {result['load1_at_start']}",
                flush=True,
            )
            phases = ", ".join(f"{k} {_fmt(v)}" for k, v in result["phase_medians_ms"].items())
            print(f"  phases (median ms): {phases}", flush=True)
            verdict = "PASS" if result["pass"] else "FAIL"
            print(f"  target p50 <= {result['target_p50_ms']:g} ms: {verdict}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = {"benchmark": "commit_latency", "machine": machine(), "results": results}
    print(json.dumps(finite(summary)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
