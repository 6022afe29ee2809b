"""Savepoints of a running job with 1M keys and over 100 MB of state, local and SeaweedFS.

Run:  /work/main/.venv/bin/python benchmarks/savepoints.py [--keys N] [--key-chars C]
          [--backends local,s3] [--partitions P] [--rescale-partitions Q] [--workdir DIR]

The sample job (keyed-totals: count and sum per key, exactly-once sinks) runs through
`run_job` on one Parquet file of N events with N distinct keys (default 1,000,000; the
keys are C random hex characters, default 100, so the state holds N x 144 bytes as
UnsafeRows and about 100 MB on disk after LZ4). Once its batch is committed and its
checkpoint externalized, savepoints are asked for over the control plane, as
`streamkeeper savepoint` does, and timed from the command to its result
(trigger-to-complete):

  native pinned          checkpoint N pinned in the content-addressed checkpoint store
  native self-contained  its files copied into the savepoint folder; beside it, a plain
                         copy of the same stored files to the same storage (local:
                         copyfile; S3: server-side CopyObject; same concurrency), both
                         repeated (--copy-repeats, medians): the copy ratio, the savepoint's
                         copy MB/s / plain copy MB/s (target >= 0.8), and the same with the
                         command's round trip (poll, claim, registry, result) included
  canonical              state exported as a Delta table per operator uid; MB/s of the
                         state's UnsafeRow bytes beside Flink's canonical savepoint of 1M
                         keys on this machine, 40-54 MB/s (DESIGN.md section 6)

Then restores, each into a fresh directory: native pinned and self-contained (download
and sha256 check), canonical on the same partition count and rescaled to Q (written in
Spark's own state format; the restored state is counted), and stop-with-savepoint
latency from the `stop` command to the job stopped. `--keys 20000` is a smoke run. The
last line printed is one JSON object with every figure.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sink_throughput import SAMPLE_SPEC, Backend, machine_info  # sets Spark's env defaults

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src")]

FLINK_CANONICAL_MB_S = (40.0, 54.0)
TARGET_COPY_RATIO = 0.8
MB = 1_000_000
JOB = "keyed-totals"


def write_input(directory: Path, keys: int, key_chars: int) -> None:
    """One Parquet file: `keys` events, each a new key of `key_chars` random hex chars."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    raw = np.random.default_rng(7).integers(
        0, 256, size=(keys, (key_chars + 1) // 2), dtype=np.uint8
    )
    names = [row.tobytes().hex()[:key_chars] for row in raw]
    table = pa.table(
        {
            "event_id": pa.array(np.arange(keys, dtype=np.int64)),
            "key": pa.array(names),
            "value": pa.array(np.arange(keys, dtype=np.int64) % 1000),
        }
    )
    pq.write_table(table, directory / "events.parquet")


def job_spec(root: str, work: Path, checkpoint: str, args: argparse.Namespace, **extra: Any):
    from streamkeeper.spec import load_spec

    return load_spec(
        SAMPLE_SPEC,
        {
            "source.path": str(work / "input"),
            "source.format": "parquet",
            "storage.root": root,
            "checkpoint.dir": str(work / checkpoint),
            "checkpoint.interval": "1s",
            "checkpoint.externalized.enabled": True,
            "spark.master": "local[2]",
            "spark.shuffle_partitions": args.partitions,
            "state_backend.type": args.state_store,
            "spark.conf.spark.driver.memory": "4g",
            **extra,
        },
    )


def wait_until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def take(client: Any, kind: str, **options: Any) -> tuple[float, Any]:
    """Send a command; seconds from sending to its result, and the result."""
    started = time.monotonic()
    command = client.send_command(JOB, kind, **options)
    result = client.wait_for_result(JOB, command.id, timeout=1800, poll=0.02)
    if not result.ok:
        raise SystemExit(f"{kind} {options} failed: {result}")
    return time.monotonic() - started, result


def plain_copy(store: Any, files: list[Any], folder: str) -> float:
    """Copy the same stored files within the same storage, plainly; seconds.

    Local: copyfile and fsync each file (cp, then sync); S3: a server-side CopyObject each.
    """
    from streamkeeper.snapshots.manifest import WORKERS
    from streamkeeper.storage import LocalStore

    if isinstance(store, LocalStore):
        root = store.root

        def one(f: Any) -> None:
            target = root / folder / f.path
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(root / f.key, target)
            with open(target, "rb+") as handle:  # durable, as the savepoint's copy (cp; sync)
                os.fsync(handle.fileno())

    else:
        client, bucket = store.client, store.bucket

        def one(f: Any) -> None:
            client.copy_object(
                Bucket=bucket,
                Key=store._key(f"{folder}/{f.path}"),
                CopySource={"Bucket": bucket, "Key": store._key(f.key)},
            )

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        list(pool.map(one, files))
    return time.monotonic() - started


def state_bytes(folder: Any, operators: list[Any]) -> int:
    """The canonical savepoint's state as UnsafeRow bytes (keys and values)."""
    from streamkeeper.state import deltas
    from streamkeeper.state.format import OperatorState
    from streamkeeper.state.unsafe_row import encode_struct

    total = 0
    for op in operators:
        state = OperatorState.from_dict(vars(op))
        table = deltas.read_table(folder.child(state.table))
        keys = encode_struct(table["key"], state.key_type())
        values = encode_struct(table["value"], state.value_type())
        total += int(sum(a.buffers()[2].size for a in (keys, values)))
    return total


def restore_native(client: Any, paths: Any, savepoint_id: str, target: Path) -> float:
    from streamkeeper.snapshots.savepoint_restore import plan_restore, restore_native

    started = time.monotonic()
    plan = plan_restore(
        client.location, paths.layout, savepoint_id, target, head_seq=None, allow_rewind=True
    )
    restore_native(plan, target)
    return time.monotonic() - started


def restore_canonical(client: Any, spec: Any, savepoint_id: str, target: Path) -> tuple[float, int]:
    from streamkeeper.runtime.job import build_output
    from streamkeeper.runtime.runner import resolve_paths
    from streamkeeper.runtime.session import build_session
    from streamkeeper.snapshots import canonical
    from streamkeeper.state.spark_state import state_frame

    spark = build_session(spec)
    manifest = client.describe_savepoint(savepoint_id).manifest
    folder = resolve_paths(spec).root.child(resolve_paths(spec).layout.savepoint(savepoint_id))
    started = time.monotonic()
    output = build_output(spark, spec, SAMPLE_SPEC.parent)
    canonical.restore_state(
        spark,
        spec,
        manifest,
        folder,
        target,
        output,
        uid_mapping={},
        allow_non_restored_state=False,
    )
    seconds = time.monotonic() - started
    rows = state_frame(spark, target, 1, 0).count()
    return seconds, rows


def compare_copy(client: Any, copied: dict[str, Any], taken: dict[str, Any], repeats: int) -> dict:
    """Self-contained savepoints and plain copies of the same files, alternated and
    repeated (object-store copies vary run to run); `copied` gets medians and ratios."""
    captures, ends, plains = [copied["capture_s"]], [copied["trigger_to_complete_s"]], []
    for repeat in range(repeats):
        plains.append(plain_copy(client.store, taken["native_pinned"][1].files, f"plain-{repeat}"))
        if repeat + 1 < repeats:
            seconds, result = take(client, "savepoint", self_contained=True)
            ends.append(seconds)
            captures.append(result.timings.get("capture", 0) / 1000)
    copied["repeats"] = {"capture_s": captures, "trigger_to_complete_s": ends, "plain_s": plains}
    copied["capture_s"] = statistics.median(captures)
    copied["trigger_to_complete_s"] = statistics.median(ends)
    plain_s = statistics.median(plains)
    copied["plain_copy_s"] = plain_s
    copied["mb_s"] = copied["bytes"] / MB / copied["trigger_to_complete_s"]
    copied["plain_copy_mb_s"] = copied["bytes"] / MB / plain_s
    copied["ratio"] = copied["mb_s"] / copied["plain_copy_mb_s"]
    copied["capture_ratio"] = plain_s / copied["capture_s"] if copied["capture_s"] else None
    return copied


def run_backend(backend: Backend, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from streamkeeper.client import StreamkeeperClient
    from streamkeeper.runtime.runner import RunOptions, resolve_paths
    from streamkeeper.snapshots.index import read_index
    from tests.support.traffic import BackgroundRun

    root = backend.root("savepoints")
    spec = job_spec(root, work, f"ck-{backend.name}", args)
    paths = resolve_paths(spec)
    client = StreamkeeperClient(root)
    run = BackgroundRun(spec, RunOptions(spec_dir=SAMPLE_SPEC.parent, command_poll_interval=0.05))
    started = time.monotonic()
    run.start()

    def head_seq() -> int:
        try:
            head = client.status(JOB).head
        except Exception:  # noqa: BLE001 - not started yet
            return -1
        return -1 if head is None else head.seq

    def externalized() -> bool:
        if run.error is not None:
            raise SystemExit(f"the job failed: {run.error!r}")
        seq = head_seq()
        return seq >= 0 and seq in read_index(client.store, paths.layout).ids

    wait_until(externalized, 3600, "the first batch committed and its checkpoint externalized")
    figures: dict[str, Any] = {"backend": backend.name, "build_s": time.monotonic() - started}
    local_state = sum(
        f.stat().st_size for f in (paths.checkpoint_dir / "state").rglob("*") if f.is_file()
    )
    figures["checkpoint_state_mb"] = local_state / MB
    print(
        f"  {backend.name}: state built and externalized in {figures['build_s']:.1f} s", flush=True
    )

    # The first savepoint of a query run reads Spark's state metadata (a Spark job, cached
    # for the run): reported apart, so that each format below is timed warm.
    figures["first_savepoint_s"], _ = take(client, "savepoint")
    taken: dict[str, Any] = {}
    for name, options in [
        ("native_pinned", {}),
        ("native_self_contained", {"self_contained": True}),
        ("canonical", {"format": "canonical"}),
    ]:
        seconds, result = take(client, "savepoint", **options)
        manifest = client.describe_savepoint(result.savepoint_id).manifest
        taken[name] = (result.savepoint_id, manifest)
        figures[name] = {
            "trigger_to_complete_s": seconds,
            "runner_total_s": result.timings.get("total", 0) / 1000,
            "capture_s": result.timings.get("capture", 0) / 1000,
            "files": len(manifest.files),
            "bytes": manifest.size,
        }
        print(f"  {backend.name}: {name} {seconds:.2f} s, {figures[name]}", flush=True)

    copied = compare_copy(client, figures["native_self_contained"], taken, args.copy_repeats)
    print(f"  {backend.name}: self-contained {copied}", flush=True)
    canon_id, canon_manifest = taken["canonical"]
    folder = paths.root.child(paths.layout.savepoint(canon_id))
    canon = figures["canonical"]
    canon["state_bytes"] = state_bytes(folder, canon_manifest.operators)
    canon["mb_s"] = canon["state_bytes"] / MB / canon["trigger_to_complete_s"]
    canon["keys"] = sum(op.rows for op in canon_manifest.operators)

    stop_started = time.monotonic()
    answered, result = take(client, "stop")
    run.finish(600)
    figures["stop_with_savepoint_s"] = time.monotonic() - stop_started  # command -> stopped
    figures["stop_answered_s"] = answered
    figures["stop_savepoint_ms"] = result.timings

    restores: dict[str, Any] = {}
    for name in ("native_pinned", "native_self_contained"):
        target = work / f"r-{name}-{backend.name}"
        restores[name] = restore_native(client, paths, taken[name][0], target)
        shutil.rmtree(target)
    for label, partitions in [
        ("canonical", args.partitions),
        ("canonical_rescaled", args.rescale_partitions),
    ]:
        target = work / f"r-{label}-{backend.name}"
        restore_spec = job_spec(
            root, work, target.name, args, **{"spark.shuffle_partitions": partitions}
        )
        seconds, rows = restore_canonical(client, restore_spec, canon_id, target)
        if rows != canon["keys"]:
            raise SystemExit(f"{label}: restored {rows} keys, expected {canon['keys']}")
        restores[label] = seconds
        shutil.rmtree(target)
    figures["restore_s"] = restores
    figures["rescale"] = f"{args.partitions} -> {args.rescale_partitions}"
    print(f"  {backend.name}: restores {restores}", flush=True)
    print(json.dumps(figures, default=str), flush=True)
    return figures


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    low, high = FLINK_CANONICAL_MB_S
    print(
        f"\nkeys {args.keys:,} ({args.key_chars} hex chars), {args.partitions} partitions, "
        f"{args.state_store} state store, local[2]"
    )
    header = f"{'':28}" + "".join(f"{r['backend']:>14}" for r in results)
    print(header)

    def line(label: str, values: list[str]) -> None:
        print(f"{label:28}" + "".join(f"{v:>14}" for v in values))

    line("checkpoint state MB", [f"{r['checkpoint_state_mb']:.1f}" for r in results])
    line("savepoint bytes MB", [f"{r['native_self_contained']['bytes'] / MB:.1f}" for r in results])
    line("canonical state MB", [f"{r['canonical']['state_bytes'] / MB:.1f}" for r in results])
    for name in ("native_pinned", "native_self_contained", "canonical"):
        line(f"{name} s", [f"{r[name]['trigger_to_complete_s']:.2f}" for r in results])
    line("self-contained MB/s", [f"{r['native_self_contained']['mb_s']:.0f}" for r in results])
    line(
        "plain copy MB/s", [f"{r['native_self_contained']['plain_copy_mb_s']:.0f}" for r in results]
    )
    line(
        f"copy ratio (target >= {TARGET_COPY_RATIO})",
        [f"{r['native_self_contained']['capture_ratio']:.2f}" for r in results],
    )
    line(
        "ratio with command round trip",
        [f"{r['native_self_contained']['ratio']:.2f}" for r in results],
    )
    line("canonical MB/s", [f"{r['canonical']['mb_s']:.0f}" for r in results])
    line("flink canonical MB/s", [f"{low:.0f}-{high:.0f}" for _ in results])
    for name in ("native_pinned", "native_self_contained", "canonical", "canonical_rescaled"):
        line(f"restore {name} s", [f"{r['restore_s'][name]:.2f}" for r in results])
    line("first savepoint of a run s", [f"{r['first_savepoint_s']:.2f}" for r in results])
    line("stop-with-savepoint s", [f"{r['stop_with_savepoint_s']:.2f}" for r in results])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--key-chars", type=int, default=100)
    parser.add_argument("--backends", default="local,s3")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--rescale-partitions", type=int, default=3)
    parser.add_argument("--state-store", default="hdfs", choices=["hdfs", "rocksdb"])
    parser.add_argument("--workdir", type=Path)
    parser.add_argument(
        "--copy-repeats", type=int, default=3, help="self-contained savepoints and plain copies"
    )
    args = parser.parse_args()

    machine = machine_info()
    print(
        f"machine: {machine['nproc']} CPUs ({machine['cpu_model']}), {machine['ram_gib']} GiB "
        f"RAM, load avg {machine['loadavg_at_start']}; pyspark {machine['pyspark']}",
        flush=True,
    )
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="sk-savepoints-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results = []
    try:
        write_input(work / "input", args.keys, args.key_chars)
        for name in args.backends.split(","):
            with Backend(name, work) as backend:
                results.append(run_backend(backend, args, work))
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    report(results, args)
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"\ntotal benchmark time {time.monotonic() - started:.0f} s; load avg at end {load}")
    print(
        json.dumps(
            {
                "benchmark": "savepoints",
                "machine": machine | {"loadavg_at_end": load},
                "config": {k: v for k, v in vars(args).items() if k != "workdir"},
                "flink_canonical_mb_s": FLINK_CANONICAL_MB_S,
                "results": results,
            },
            default=str,
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
