"""Externalized checkpoints of the sample job keyed-totals: bytes uploaded vs changed state.

Run:  /work/venv/bin/python benchmarks/externalized_checkpoints.py [--keys N] [--batches B]
          [--change-fraction F] [--partitions P] [--repeats R] [--conf K=V] [--keep]

Input (Parquet): file 0 creates N distinct keys (one event each), files 1..B each touch
N*F distinct keys; maxFilesPerTrigger=1 makes one micro-batch per file. All runs in ONE
process (one SparkSession, warmed up by a run over the full input), each from scratch:
  a  rocksdb + changelog, externalized       b  the same, not externalized
  c  hdfs, externalized                      d  rocksdb without changelog, externalized
in the order a b c d, then b a, a b, ... until a and b ran R times each.
Per checkpoint of a change batch (batch 0, which creates the keys, is reported apart):
  uploaded = history `bytes_uploaded` (cross-checked with the checkpoint manifests)
  changed  = bytes of the state change files Spark wrote for the batch's state version:
             state/*/*/{batch+1}.changelog (.delta for hdfs; run a's for run d)
and the median Spark batch duration (history `duration_ms`) with externalizing on vs off.
See benchmarks/README.md. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from sink_throughput import SAMPLE_SPEC, machine_info  # also sets Spark's env defaults

RUNS = {  # name: (state backend, changelog, externalized, label)
    "a": ("rocksdb", True, True, "rocksdb+changelog on"),
    "b": ("rocksdb", True, False, "rocksdb+changelog off"),
    "c": ("hdfs", False, True, "hdfs on"),
    "d": ("rocksdb", False, True, "rocksdb (no changelog) on"),
}
KINDS = ("change", "snapshot", "other")
MEASURES = ("duration_ms", "visibility_ms", "externalize_ms")
TARGET_RATIO = 2.0  # the issue's target: uploaded <= 2 x changed state, rocksdb+changelog


def write_input(directory: Path, keys: int, batches: int, changed: int, seed: int = 7) -> None:
    """File 0: every key once; files 1..batches: `changed` distinct random keys each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng, width, event_id = random.Random(seed), len(str(keys - 1)), 0
    directory.mkdir(parents=True)
    for index in range(batches + 1):
        chosen = range(keys) if index == 0 else rng.sample(range(keys), changed)
        columns = {
            "event_id": pa.array(range(event_id, event_id + len(chosen)), pa.int64()),
            "key": pa.array([f"k{k:0{width}d}" for k in chosen]),
            "value": pa.array([rng.randrange(1000) for _ in chosen], pa.int64()),
        }
        event_id += len(chosen)
        tmp = directory / f".events-{index:05d}.parquet.tmp"  # hidden from the file source
        pq.write_table(pa.table(columns), tmp)
        stamp = 1_700_000_000 + index * 10  # distinct mtimes, as sample_events.write_event_files
        os.utime(tmp, (stamp, stamp))
        os.replace(tmp, directory / f"events-{index:05d}.parquet")


def kind(path: str) -> str:
    """What an uploaded checkpoint file is: state change, state snapshot, or other."""
    if path.startswith("state/") and path.endswith((".changelog", ".delta")):
        return "change"
    if path.startswith("state/") and path.endswith((".zip", ".sst", ".snapshot")):
        return "snapshot"
    return "other"  # offsets, commits, sources, metadata, state schemas, every .crc


def decoded(spark: Any, path: Path) -> tuple[int, int]:
    """(records, key+value bytes) of a change file, decompressed by Spark's own codec.

    Both formats are records of (int key size, key, int value size or -1, value); -1 ends.
    """
    jvm, conf = spark.sparkContext._jvm, spark.sparkContext._jsc.sc().conf()
    codec_name = spark.conf.get("spark.sql.streaming.stateStore.compression.codec", "lz4")
    codec = jvm.org.apache.spark.io.CompressionCodec.createCodec(conf, codec_name)
    stream = codec.compressedInputStream(jvm.java.io.FileInputStream(str(path)))
    data = bytes(stream.readAllBytes())
    stream.close()
    position = records = payload = 0
    while position < len(data):
        key_size = int.from_bytes(data[position : position + 4], "big", signed=True)
        if key_size < 0:
            break
        value_size = int.from_bytes(data[position + 4 + key_size :][:4], "big", signed=True)
        position += 8 + key_size + max(value_size, 0)
        records, payload = records + 1, payload + key_size + max(value_size, 0)
    return records, payload


def run(name: str, events: Path, base: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One run from scratch; returns its figures with one entry per checkpoint."""
    from streamkeeper.runtime.runner import RunOptions, resolve_paths, run_job
    from streamkeeper.spec import load_spec

    backend, changelog, externalized, label = RUNS[name]
    overrides = {
        "source.path": str(events),
        "source.format": "parquet",
        "storage.root": str(base / "root"),
        "checkpoint.dir": str(base / "checkpoint"),
        "spark.master": "local[2]",
        "spark.shuffle_partitions": args.partitions,
        "state_backend.type": backend,
        "state_backend.changelog": changelog,
        "checkpoint.externalized.enabled": externalized,
        # Keep every manifest, to break each checkpoint's increment down afterwards;
        # retention only deletes, it does not change what is uploaded (README).
        "checkpoint.externalized.retained": args.batches + 10,
    } | {f"spark.conf.{key}": value for key, value in args.conf}
    spec = load_spec(SAMPLE_SPEC, overrides)
    load1, started = os.getloadavg()[0], time.monotonic()
    result = run_job(spec, RunOptions(available_now=True, spec_dir=SAMPLE_SPEC.parent))
    wall = time.monotonic() - started
    paths = resolve_paths(spec)
    suffix = ".changelog" if changelog else ".delta" if backend == "hdfs" else None
    rows, last_visible = checkpoint_rows(paths, suffix)
    first_end = os.stat(paths.checkpoint_dir / "commits" / "0").st_mtime
    return {
        "run": name,
        "label": label,
        "batches": result.batches,
        "wall_s": wall,
        "load1": round(load1, 2),
        "e2e_s_per_change_batch": (last_visible - first_end) / max(1, len(rows) - 1),
        "checkpoints": rows,
    }


def checkpoint_rows(paths: Any, suffix: str | None) -> tuple[list[dict[str, Any]], float]:
    """Per checkpoint: its history row, manifest increment and state change files; and when
    the last batch became visible."""
    from pyspark.sql import SparkSession

    from streamkeeper.observability.history import CheckpointHistory
    from streamkeeper.snapshots.manifest import checkpoint_ids, read_manifest

    store, layout, checkpoint = paths.root.store(), paths.layout, paths.checkpoint_dir
    manifests = {i: read_manifest(store, layout, i) for i in checkpoint_ids(store, layout)}
    markers = {m["batch_id"]: m for m in map(store.read_json, store.list(layout.markers)) if m}
    spark, seen, rows = SparkSession.builder.getOrCreate(), set(), []
    for row in sorted(CheckpointHistory(paths.history).read(), key=lambda r: r["checkpoint_id"]):
        batch, manifest = row["batch_id"], manifests.get(row["checkpoint_id"])
        parts, externalize_ms = dict.fromkeys(KINDS, 0), None
        if manifest is not None:
            for f in {f.key: f for f in manifest.files if f.key not in seen}.values():
                parts[kind(f.path)] += f.size
            seen |= manifest.keys
            # The upload starts at commits/N, or when batch N-1's commit ended if later.
            begun = os.stat(checkpoint / "commits" / str(batch)).st_mtime
            if batch - 1 in markers:
                begun = max(begun, markers[batch - 1]["committed_at"])
            externalize_ms = (manifest.created_at - begun) * 1000
        files = sorted(checkpoint.glob(f"state/*/*/{batch + 1}{suffix}")) if suffix else []
        records = payload = None
        if files and batch > 0:  # decoding batch 0 (every key) would only cost time
            records, payload = map(sum, zip(*(decoded(spark, f) for f in files), strict=True))
        rows.append(
            {
                "batch": batch,
                "uploaded": row["bytes_uploaded"],
                "manifest_uploaded": None if manifest is None else manifest.uploaded_bytes,
                "breakdown": None if manifest is None else parts,
                "changed": sum(f.stat().st_size for f in files) if files else None,
                "change_records": records,
                "change_payload": payload,
                "rows_updated": sum(o["rows_updated"] for o in json.loads(row["state_operators"])),
                "duration_ms": row["duration_ms"],
                "visibility_ms": row["visibility_delay_ms"],
                "externalize_ms": externalize_ms,
            }
        )
    return rows, max(m["committed_at"] for m in markers.values())


def median(values: list[Any]) -> float | None:
    return statistics.median(values) if values and None not in values else None


def summarize(records: list[dict], reference: dict[int, int | None]) -> dict[str, Any]:
    """Figures over the change batches (batch >= 1) of every repeat of one run.

    `reference`: run a's changed-state bytes per batch, for a run without change files.
    """
    rows = [r for record in records for r in record["checkpoints"] if r["batch"] >= 1]
    own = bool(rows) and rows[0]["changed"] is not None
    changed = [r["changed"] if own else reference.get(r["batch"]) for r in rows]
    uploaded = [r["uploaded"] for r in rows]
    measured = bool(rows) and None not in uploaded and None not in changed
    ratios = [u / c for u, c in zip(uploaded, changed, strict=True)] if measured else []
    parts = [r["breakdown"] for r in rows if r["breakdown"]]
    decoded_rows = [r for r in rows if r["change_records"]]
    firsts = [record["checkpoints"][0] for record in records]
    return {
        "first_batch": {k: median([f[k] for f in firsts]) for k in ("uploaded", "changed")}
        | {f"{k}_median": median([f[k] for f in firsts]) for k in MEASURES},
        "repeats": len(records),
        "changed_from": "own change files" if own else "run a",
        "uploaded_per_checkpoint": uploaded,
        "changed_per_checkpoint": changed,
        "snapshot_per_checkpoint": [p["snapshot"] for p in parts],
        "uploaded_median": median(uploaded),
        "changed_median": median(changed),
        "ratio_median": median(ratios),
        "ratio_max": max(ratios, default=None),
        "ratio_total": sum(uploaded) / sum(changed) if measured else None,
        "breakdown_total": {k: sum(p[k] for p in parts) for k in KINDS} if parts else None,
        "e2e_s_per_change_batch": median([r["e2e_s_per_change_batch"] for r in records]),
        "history_equals_manifests": all(
            r["uploaded"] == r["manifest_uploaded"] == sum(r["breakdown"].values())
            for record in records
            for r in record["checkpoints"]
            if r["breakdown"]
        ),
        "records_equal_rows_updated": all(
            r["change_records"] == r["rows_updated"] for r in decoded_rows
        ),
        "payload_bytes_per_record": median(
            [r["change_payload"] / r["change_records"] for r in decoded_rows]
        ),
    } | {f"{k}_median": median([r[k] for r in rows]) for k in MEASURES}


def fmt(value: float | None, spec: str = ",.0f", scale: float = 1.0) -> str:
    return "-" if value is None else format(value / scale, spec)


def print_report(summary: dict[str, dict], args: argparse.Namespace) -> dict[str, Any]:
    """The tables, the target and the on/off ratios; returns the verdicts."""
    print(
        f"\n== {args.batches} change batches x {args.changed:,} keys: medians per checkpoint; "
        f"below, batch 0 ({args.keys:,} keys created) and each checkpoint's upload =="
    )
    header = (
        f"{'run (repeats)':32} {'upl KiB':>7} {'chg KiB':>7} {'ratio':>5} {'max':>5} "
        f"{'total':>5} {'Spark ms':>8} {'vis ms':>6} {'ext ms':>6} {'e2e s':>5}"
    )
    print(f"{header}  uploaded change/snapshot/other KiB\n{'-' * (len(header) + 36)}")
    for name, s in summary.items():
        parts, label = s["breakdown_total"], f"{name} {RUNS[name][3]} ({s['repeats']})"
        print(
            f"{label:32} {fmt(s['uploaded_median'], scale=1024):>7} "
            f"{fmt(s['changed_median'], scale=1024):>7} {fmt(s['ratio_median'], '.2f'):>5} "
            f"{fmt(s['ratio_max'], '.2f'):>5} {fmt(s['ratio_total'], '.2f'):>5} "
            f"{fmt(s['duration_ms_median']):>8} {fmt(s['visibility_ms_median']):>6} "
            f"{fmt(s['externalize_ms_median']):>6} {s['e2e_s_per_change_batch']:5.2f}  "
            + ("/".join(fmt(v, scale=1024) for v in parts.values()) if parts else "-")
            + ("" if s["changed_from"] == "own change files" else "  (changed: run a's)")
        )
        f = s["first_batch"]
        per = " ".join(fmt(x, scale=1024) for x in s["uploaded_per_checkpoint"])
        print(
            f"    batch 0: uploaded {fmt(f['uploaded'], scale=1024)} KiB, changed "
            f"{fmt(f['changed'], scale=1024)} KiB, Spark {fmt(f['duration_ms_median'])} ms, "
            f"visible after {fmt(f['visibility_ms_median'])} ms"
            + (f"; uploaded KiB per checkpoint: {per}" if parts else "")
        )
    verdicts: dict[str, Any] = {}
    a, b = summary.get("a"), summary.get("b")
    if a and a["ratio_max"] is not None:
        verdicts["median_pass"] = a["ratio_median"] <= TARGET_RATIO
        verdicts["every_checkpoint_pass"] = a["ratio_max"] <= TARGET_RATIO
        word = {True: "PASS", False: "FAIL"}
        print(
            f"\ntarget rocksdb+changelog uploaded <= {TARGET_RATIO:g}x changed state: median "
            f"{a['ratio_median']:.2f}x -> {word[verdicts['median_pass']]}; every checkpoint "
            f"(worst {a['ratio_max']:.2f}x) -> {word[verdicts['every_checkpoint_pass']]}; "
            f"total {a['ratio_total']:.2f}x; state snapshots uploaded: "
            f"{fmt(sum(a['snapshot_per_checkpoint']), scale=1024)} KiB"
        )
        print(
            "cross-checks (run a): change-file records == rows updated: "
            f"{a['records_equal_rows_updated']}, {fmt(a['payload_bytes_per_record'], '.1f')} B "
            "key+value per record uncompressed; history bytes_uploaded == manifests: "
            f"{a['history_equals_manifests']}"
        )
    if a and b:
        keys = ("duration_ms_median", "visibility_ms_median", "e2e_s_per_change_batch")
        ratio = verdicts["on_vs_off"] = {k: a[k] / b[k] if a[k] and b[k] else None for k in keys}
        print(
            "externalizing on/off (rocksdb+changelog, change batches): Spark batch duration "
            f"{fmt(a[keys[0]])} / {fmt(b[keys[0]])} ms = {fmt(ratio[keys[0]], '.2f')}; batch "
            f"end -> visible {fmt(a[keys[1]])} / {fmt(b[keys[1]])} ms = "
            f"{fmt(ratio[keys[1]], '.2f')}; end-to-end per batch {a[keys[2]]:.2f} / "
            f"{b[keys[2]]:.2f} s = {fmt(ratio[keys[2]], '.2f')}"
        )
    return verdicts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--keys", type=int, default=1_000_000, help="keys created by batch 0")
    parser.add_argument("--batches", type=int, default=8, help="change batches after batch 0")
    parser.add_argument("--change-fraction", type=float, default=0.01, help="keys per batch")
    parser.add_argument("--partitions", type=int, default=2, help="spark.shuffle_partitions")
    parser.add_argument("--repeats", type=int, default=2, help="runs of a and of b")
    parser.add_argument("--conf", action="append", default=[], help="extra Spark conf K=V")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temp directory")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    args.changed = round(args.keys * args.change_fraction)
    args.conf = [tuple(item.split("=", 1)) for item in args.conf]
    if any(len(item) != 2 for item in args.conf):
        parser.error("--conf takes KEY=VALUE")
    if min(args.keys - 9, args.batches, args.repeats, args.changed) < 1 or args.changed > args.keys:
        parser.error("need --keys >= 10, --batches, --repeats >= 1, 1 <= keys x fraction <= keys")
    return args


def run_all(args: argparse.Namespace, workdir: Path, failures: list[str]) -> dict[str, list]:
    """The warm-up, then every run; a failed run is reported and the others still go."""
    write_input(workdir / "events", args.keys, args.batches, args.changed)
    print(
        f"input: batch 0 creates {args.keys:,} keys, then {args.batches} batches x "
        f"{args.changed:,} distinct keys ({args.change_fraction:.1%}); Parquet, local[2], "
        f"{args.partitions} shuffle partitions, Trigger.AvailableNow; workdir {workdir}",
        flush=True,
    )
    # b a after c d, then a b, ...: a linear drift of the machine's load favours neither.
    order = ["warm-up", "a", "b", "c", "d"]
    order += [n for r in range(1, args.repeats) for n in ("ba" if r % 2 else "ab")]
    records: dict[str, list] = {}
    for index, name in enumerate(order):
        base = workdir / "runs" / f"{index}-{name}"  # a fresh storage root and checkpoint
        try:
            record = run("a" if name == "warm-up" else name, workdir / "events", base, args)
        except Exception as error:  # noqa: BLE001 - reported in the output and the JSON
            traceback.print_exc()
            failures.append(f"{name}: {type(error).__name__}: {error}")
            continue
        finally:
            if not args.keep:
                shutil.rmtree(base, ignore_errors=True)
        label = "warm-up (a, not counted)" if name == "warm-up" else f"{name} {RUNS[name][3]}"
        print(
            f"  {label:28} {record['batches']:3d} batches, wall {record['wall_s']:6.1f} s, "
            f"load {record['load1']:.1f}",
            flush=True,
        )
        if name != "warm-up":
            records.setdefault(name, []).append(record)
    return records


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started, machine = time.monotonic(), machine_info()
    print(
        f"machine: {machine['nproc']} CPUs ({machine['cpu_model']}), {machine['ram_gib']} GiB "
        f"RAM, load avg {machine['loadavg_at_start']}; pyspark {machine['pyspark']}"
    )
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="sk-ext-"))).resolve()
    failures: list[str] = []
    try:
        records = run_all(args, workdir, failures)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    reference = {r["batch"]: r["changed"] for r in records.get("a", [{}])[0].get("checkpoints", [])}
    summary = {name: summarize(records[name], reference) for name in RUNS if name in records}
    verdicts = print_report(summary, args)
    elapsed, load = time.monotonic() - started, [round(x, 2) for x in os.getloadavg()]
    print(f"\ntotal benchmark time {elapsed:.0f} s; load avg at end {load}")
    for failure in failures:
        print(f"FAILED {failure}")
    config = {k: vars(args)[k] for k in ("keys", "batches", "change_fraction", "partitions")}
    figures = {
        "benchmark": "externalized_checkpoints",
        "machine": machine | {"loadavg_at_end": load},
        "config": config | {"repeats": args.repeats, "conf": dict(args.conf), "master": "local[2]"},
        "results": summary,
        "verdicts": verdicts,
        "runs": records,
        "failures": failures,
        "elapsed_s": round(elapsed, 1),
    }
    print(json.dumps(figures, default=float), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
