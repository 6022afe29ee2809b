"""The commit path's cost per batch, and a start's recovery cost, as a lineage ages.

Run:  python benchmarks/commit_path.py [--checkpoints-at 1000,10000]
          [--backend local|s3] [--window 200] [--keep]
          [--every 100] [--history-retention 60s] [--no-maintenance]

Drives the real commit coordinator of one lineage with two target tables (a merge
table `totals` and an append table `changes`, a few rows each) and externalized
checkpoints, batch after batch, with no Spark: every batch claims and seals its WAL
manifest, pre-writes its files, and is committed by `CommitCoordinator.commit_manifest`
(upload of the checkpoint's new files, both Delta commits, the commit marker, retiring
the manifest, retention, and every `--every` commits a table maintenance pass:
commit/maintenance.py). A synthetic Spark checkpoint directory gets `offsets/N`,
`commits/N` and a state file per batch and keeps the last 100, as Spark does.

Printed per checkpoint (`--checkpoints-at`): the mean and p95 cost per batch of the
commit path over the last `--window` batches before it, and the cost of a start's
recovery work there (lineage head, initial seq, recovery with nothing pending, taking
the checkpoint index over); then the ratio of each figure at the last checkpoint to the
first. Flat means the ratios stay near 1. Each line also shows how many entries each
table's `_delta_log` holds: what a Delta commit lists, which maintenance keeps bounded
(`--no-maintenance` shows the growth without it). The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sink_throughput import machine_info  # noqa: E402  (sets Spark's env defaults too)

from streamkeeper.commit.coordinator import CommitCoordinator  # noqa: E402
from streamkeeper.commit.maintenance import (  # noqa: E402
    MaintenancePolicy,
    ProtectedVersions,
    TableMaintenance,
    lineage_protected_seqs,
)
from streamkeeper.commit.recovery import recover  # noqa: E402
from streamkeeper.commit.sequence import (  # noqa: E402
    CommitSequence,
    initial_sequence,
    lineage_head,
)
from streamkeeper.commit.tables import TableTarget, ensure_table  # noqa: E402
from streamkeeper.commit.wal import DataFile, Manifest, SinkBatch, WriteAheadLog  # noqa: E402
from streamkeeper.lineage.control import ControlPlane, Fence  # noqa: E402
from streamkeeper.lineage.layout import LineageLayout  # noqa: E402
from streamkeeper.snapshots.externalized import ExternalizedCheckpoints  # noqa: E402
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint  # noqa: E402
from streamkeeper.spec import ExternalizedSpec, parse_duration  # noqa: E402
from streamkeeper.storage import Location, S3Settings  # noqa: E402

LINEAGE = "bench"
SPARK_KEEPS = 100  # spark.sql.streaming.minBatchesToRetain's default


class Lineage:
    """One lineage's storage, tables and a synthetic Spark checkpoint directory."""

    def __init__(self, root: Location, workdir: Path, policy: MaintenancePolicy) -> None:
        import pyarrow as pa

        self.root = root
        self.policy = policy
        self.store = root.store()
        self.layout = LineageLayout(root, LINEAGE, LINEAGE)
        self.control = ControlPlane(self.store, self.layout)
        self.checkpoint = SparkCheckpoint(workdir / "checkpoint")
        self.query_id = str(uuid.uuid4())
        self.schema = pa.schema([("key", pa.string()), ("n", pa.int64())])
        self.targets = {
            name: TableTarget(
                name,
                root.child(f"tables/{name}"),
                self.layout.data_app_id(name),
                self.layout.fence_app_id(),
            )
            for name in ("totals", "changes")
        }
        for target in self.targets.values():
            ensure_table(target, self.schema)
        (self.checkpoint.directory / "commits").mkdir(parents=True, exist_ok=True)
        (self.checkpoint.directory / "offsets").mkdir(exist_ok=True)
        (self.checkpoint.directory / "metadata").write_text(json.dumps({"id": self.query_id}))

    def start(self) -> tuple[CommitCoordinator, ExternalizedCheckpoints, dict[str, float]]:
        """A runner start: epoch, the index taken over, head, sequence, recovery (timed)."""
        timings: dict[str, float] = {}
        began = time.perf_counter()
        fence = Fence(self.control, self.control.acquire(takeover=True))
        timings["acquire_ms"] = (time.perf_counter() - began) * 1000
        began = time.perf_counter()
        spec = ExternalizedSpec(enabled=True, retained=3)
        hook = ExternalizedCheckpoints(
            self.store, self.layout, self.checkpoint.directory, spec, fence
        )
        hook.take_ownership()
        timings["take_index_ms"] = (time.perf_counter() - began) * 1000
        began = time.perf_counter()
        known = lineage_head(self.store, self.layout, self.targets)
        head = known[0]
        coordinator = CommitCoordinator(
            store=self.store,
            layout=self.layout,
            wal=WriteAheadLog(self.store, self.layout),
            targets=self.targets,
            fence=fence,
            head=head,
            checkpoints=hook,
            maintenance=self._maintenance(),
        )
        self.sequence = CommitSequence(
            initial_sequence(self.store, self.layout, self.targets, known)
        )
        recover(coordinator, self.checkpoint, self.sequence, self.control)
        timings["recovery_ms"] = (time.perf_counter() - began) * 1000
        return coordinator, hook, timings

    def _maintenance(self) -> TableMaintenance | None:
        if self.policy.every <= 0:
            return None  # --no-maintenance: what the commit path costs without it
        store, layout = self.store, self.layout
        return TableMaintenance(
            targets=self.targets,
            shared=set(),
            protected=ProtectedVersions(
                store, layout, seqs=lambda: lineage_protected_seqs(store, layout)
            ),
            policy=self.policy,
        )

    def log_entries(self) -> dict[str, int]:
        """How many entries each table's `_delta_log` holds now."""
        return {n: len(t.location.store().list("_delta_log/")) for n, t in self.targets.items()}

    def batch(self, coordinator: CommitCoordinator, batch_id: int) -> Manifest:
        """What a batch does before its commit: claim, pre-write, seal; then `commits/N`."""
        import pyarrow.parquet as pq

        directory = self.checkpoint.directory
        (directory / "offsets" / str(batch_id)).write_text(f"v1\n{{}}\n{batch_id}")
        seq = self.sequence.take_next()
        manifest = Manifest(
            lineage=LINEAGE,
            seq=seq,
            query_id=self.query_id,
            batch_id=batch_id,
            checkpoint_dir=str(directory),
            epoch=coordinator.fence.epoch,
            sinks={
                "totals": SinkBatch(
                    self.targets["totals"].location.uri, "merge", "exactly_once", ["key"]
                ),
                "changes": SinkBatch(
                    self.targets["changes"].location.uri, "append", "exactly_once"
                ),
            },
            offsets_sha256=self.checkpoint.offsets_sha256(batch_id),
        )
        coordinator.wal.claim(manifest)
        rows = self._rows(batch_id)
        relative = self.layout.precommit_dir(seq)
        for name, folder, path_of in (
            (
                "changes",
                self.targets["changes"].location.child(relative),
                lambda f: f"{relative}/{f}",
            ),
            ("totals", self.layout.staging(seq, "totals"), None),
        ):
            name_of_file = f"e{coordinator.fence.epoch}-{uuid.uuid4().hex}.parquet"
            filesystem = folder.arrow_filesystem()
            if not folder.is_s3:
                Path(folder.fs_path).mkdir(parents=True, exist_ok=True)
            full = f"{folder.fs_path}/{name_of_file}"
            pq.write_table(rows, full, filesystem=filesystem)
            size = filesystem.get_file_info(full).size
            path = path_of(name_of_file) if path_of else f"{folder.uri}/{name_of_file}"
            stats = json.dumps({"numRecords": rows.num_rows})
            manifest.sinks[name].files = [DataFile(path, size, rows.num_rows, stats, "bench")]
        coordinator.wal.seal(manifest)
        self._spark_writes(batch_id)
        return manifest

    def _rows(self, batch_id: int):  # noqa: ANN202 - pyarrow table
        import pyarrow as pa

        keys = [f"k{(batch_id * 7 + i) % 50:02d}" for i in range(5)]
        return pa.table({"key": keys, "n": [batch_id] * 5}, schema=self.schema)

    def _spark_writes(self, batch_id: int) -> None:
        """`commits/N` and a state file; older entries purged as Spark purges them."""
        directory = self.checkpoint.directory
        state = directory / "state" / "0" / "0"
        state.mkdir(parents=True, exist_ok=True)
        (state / f"{batch_id + 1}.delta").write_bytes(uuid.uuid4().bytes * 64)
        (directory / "commits" / str(batch_id)).write_text("v1\n{}")
        old = batch_id - SPARK_KEEPS
        if old >= 0:
            for stale in (
                directory / "commits" / str(old),
                directory / "offsets" / str(old),
                state / f"{old + 1}.delta",
            ):
                stale.unlink(missing_ok=True)


def _summary(costs: list[float]) -> dict[str, float]:
    ordered = sorted(costs)
    return {
        "mean_ms": round(statistics.fmean(ordered), 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))], 2),
    }


def _root(backend: str, workdir: Path, stack: list) -> Location:
    if backend == "local":
        return Location(str(workdir / "data"))
    from tests.support.services import start_seaweedfs

    server = start_seaweedfs(workdir / "s3", "commit-bench", "bench", "bench-secret-key")
    stack.append(server)
    import os

    os.environ.update(server.env())
    return Location("s3://commit-bench/lineage", S3Settings.from_env())


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="commit-bench-"))
    stack: list = []
    try:
        every = 0 if args.no_maintenance else args.every
        policy = MaintenancePolicy(every=every, history_retention=args.history_retention)
        lineage = Lineage(_root(args.backend, workdir, stack), workdir, policy)
        coordinator, _hook, _ = lineage.start()
        points = sorted(args.checkpoints_at)
        results: list[dict[str, Any]] = []
        costs: list[float] = []
        started = time.monotonic()
        for batch_id in range(points[-1]):
            manifest = lineage.batch(coordinator, batch_id)
            began = time.perf_counter()
            coordinator.commit_manifest(manifest, batch_end=None)
            costs.append((time.perf_counter() - began) * 1000)
            if batch_id + 1 in points:
                window = costs[-args.window :]
                _, _, start = lineage.start()  # a restart at this age (a new epoch)
                coordinator, _hook, _ = lineage.start()
                entries = lineage.log_entries()
                row = {"batches": batch_id + 1, **_summary(window), **start, "log": entries}
                results.append(row)
                print(
                    f"after {batch_id + 1:>6} batches: commit path mean {row['mean_ms']:.1f} ms "
                    f"(p95 {row['p95_ms']:.1f}); Delta log entries {entries}; "
                    f"start: acquire {start['acquire_ms']:.1f} ms, "
                    f"take index {start['take_index_ms']:.1f} ms, "
                    f"head+seq+recovery {start['recovery_ms']:.1f} ms "
                    f"[{time.monotonic() - started:.0f}s]",
                    flush=True,
                )
        first, last = results[0], results[-1]
        ratios = {
            key: round(last[key] / first[key], 2) if first[key] else None
            for key in ("mean_ms", "p95_ms", "acquire_ms", "take_index_ms", "recovery_ms")
        }
        return {
            "backend": args.backend,
            "window": args.window,
            "maintenance": None
            if not policy.every
            else {"every": policy.every, "history_retention_s": policy.history_retention},
            "points": results,
            "ratio_last_to_first": ratios,
        }
    finally:
        for server in stack:
            server.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("local", "s3"), default="local")
    parser.add_argument(
        "--checkpoints-at", type=lambda s: [int(x) for x in s.split(",")], default=[1000, 10000]
    )
    parser.add_argument("--window", type=int, default=200)
    parser.add_argument("--every", type=int, default=100, help="commits between passes")
    parser.add_argument(
        "--history-retention",
        type=parse_duration,
        default=60.0,
        help="maintenance.history_retention (the job default is 1h; shorter reaches the "
        "steady state within the run)",
    )
    parser.add_argument("--no-maintenance", action="store_true")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    print(json.dumps(machine_info()))
    report = run(args)
    print("ratio at the last checkpoint to the first:", report["ratio_last_to_first"])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
