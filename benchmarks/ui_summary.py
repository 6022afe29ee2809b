"""The operations page's summary endpoint with many long-lived jobs: p95 response time.

Run:  .venv/bin/python benchmarks/ui_summary.py [--jobs 50] [--rows 10000]
          [--rows-per-commit 2] [--requests 40] [--page-size 50] [--workdir DIR]

A storage root is filled with `--jobs` RUNNING jobs, each with a control plane as a
long-lived runner leaves it: a job record, a fresh heartbeat, one commit marker per
checkpoint and a checkpoint history table of `--rows` rows appended the way the runner
appends them (one Delta commit per flush of `--rows-per-commit` rows, so 10 000 rows are
5 000 commits; delta-rs checkpoints its log every 100 commits), plus a few savepoints.
One job's control plane is built, then hard-linked for the others (the same bytes, other
lineages). Building it takes about 4 minutes; it is kept in `--workdir` and reused.

The summary endpoint (`GET /streamkeeper/api/jobs`) of the plugin's FastAPI app is then
called `--requests` times through an in-process ASGI client (no network, no Airflow
auth: the app's own work), after 3 warm-up calls, and p50/p95/max are printed, for the
whole list and for one page of 20. The baseline is the same jobs young, with
`--baseline-rows` checkpoints each: the ratio of the p95s says whether a refresh costs
more as jobs age (it must not). For comparison, the whole list once more with the
status's health rows read by the table's own reader (`CheckpointHistory.read(last=20)`,
which loads every data file's add action) instead of the log's tail. The last line is
one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from streamkeeper.lineage.layout import seq_name  # noqa: E402
from streamkeeper.observability.history import CheckpointHistory, CheckpointRecord  # noqa: E402
from streamkeeper.storage import Location, S3Settings, resolve_root  # noqa: E402

TEMPLATE = "job-000"


def _record(seq: int) -> CheckpointRecord:
    operators = [
        {"operator": "stateStoreSave", "rows": 1000 + seq, "rows_updated": 10, "bytes": 65536}
    ]
    return CheckpointRecord(
        checkpoint_id=seq,
        batch_id=seq,
        query_id="q-1",
        run_id="r-1",
        trigger_time=time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(1.7e9 + seq)),
        duration_ms=400 + seq % 50,
        latest_offset_ms=5,
        planning_ms=30,
        write_ms=300,
        wal_commit_ms=10,
        commit_offsets_ms=8,
        input_rows=1000,
        input_rows_per_second=1000.0,
        processed_rows_per_second=2500.0,
        source_offsets="[]",
        state_rows=1000 + seq,
        state_bytes=65536,
        state_operators=json.dumps(operators),
        commit_seq=seq,
        visibility_delay_ms=120.0,
        bytes_uploaded=4096,
    )


def build_template(root: Path, rows: int, per_commit: int) -> None:
    """One job's control plane with `rows` checkpoints (markers and history)."""
    lineage = root / "lineages" / TEMPLATE
    markers = lineage / "markers"
    markers.mkdir(parents=True)
    for seq in range(rows):
        marker = {"seq": seq, "batch_id": seq, "committed_at": 1.7e9 + seq, "versions": {}}
        marker["visibility_delay_ms"] = 120.0
        (markers / f"{seq_name(seq)}.json").write_text(json.dumps(marker))
    history = CheckpointHistory(
        Location(resolve_root(str(root)), S3Settings.from_env()).child(
            f"lineages/{TEMPLATE}/history"
        )
    )
    started = time.monotonic()
    for first in range(0, rows, per_commit):
        history.append([_record(s) for s in range(first, min(rows, first + per_commit))])
        if first % (per_commit * 500) == 0:
            print(f"  history: {first} rows, {time.monotonic() - started:.0f} s", flush=True)
    registry = {
        "savepoints": [
            {"id": f"sp-{i}", "job": TEMPLATE, "lineage": TEMPLATE, "format": "native"}
            | {"storage": "pinned", "state": "complete", "size": 1 << 20, "seq": rows - 1}
            for i in range(5)
        ]
    }
    (lineage / "savepoints").mkdir()
    (lineage / "savepoints" / "registry.json").write_text(json.dumps(registry))


def fill_root(root: Path, jobs: int, rows: int, per_commit: int) -> None:
    """`jobs` jobs below `root`; the lineages are hard links of the template's."""
    template = root / "lineages" / TEMPLATE
    if not (template / "history").exists():
        shutil.rmtree(root, ignore_errors=True)
        build_template(root, rows, per_commit)
    for index in range(jobs):
        name = f"job-{index:03d}"
        if not (root / "lineages" / name).exists():
            shutil.copytree(template, root / "lineages" / name, copy_function=os.link)
        folder = root / "jobs" / name
        folder.mkdir(parents=True, exist_ok=True)
        record = {"lineage": name, "interval": 1.0, "timeout": 600.0, "epoch": 3, "tables": {}}
        (folder / "job.json").write_text(json.dumps(record))
    beat(root, jobs, rows)


def beat(root: Path, jobs: int, rows: int) -> None:
    """Fresh heartbeats: live runners (status reads a live runner's history tail)."""
    for index in range(jobs):
        name = f"job-{index:03d}"
        record = {
            "job": name,
            "lineage": name,
            "state": "RUNNING",
            "time": time.time(),
            "pid": 4242,
            "host": "worker-1",
            "epoch": 3,
            "interval": 1.0,
            "timeout": 600.0,
            "last_committed_seq": rows - 1,
            "last_checkpoint_at": time.time(),
            "pending_commits": 0,
            "consecutive_failures": 0,
            "data_available": True,
        }
        # Replaced whole, as runners write it (a reader never sees half a heartbeat).
        target = root / "jobs" / name / "heartbeat.json"
        temporary = target.with_name(".heartbeat.json.bench.tmp")
        temporary.write_text(json.dumps(record))
        os.replace(temporary, target)


class Heartbeats:
    """Keeps the jobs' heartbeats fresh while the endpoint is measured, as runners do."""

    def __init__(self, root: Path, jobs: int, rows: int) -> None:
        self.args = (root, jobs, rows)
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(5.0):
            beat(*self.args)

    def __enter__(self) -> Heartbeats:
        beat(*self.args)
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.done.set()
        self.thread.join()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure(root: Path, requests: int, page_size: int) -> dict[str, float]:
    from fastapi.testclient import TestClient

    from streamkeeper.client import StreamkeeperClient
    from streamkeeper_airflow.ui.app import create_app

    app = create_app(client_factory=lambda: StreamkeeperClient(str(root)), authenticate=False)
    with TestClient(app) as http:
        url = f"/api/jobs?limit={page_size}"
        for _ in range(3):
            assert http.get(url).status_code == 200
        times = []
        for _ in range(requests):
            started = time.perf_counter()
            response = http.get(url)
            times.append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.text
        body = response.json()
        states = {job["state"] for job in body["jobs"]}
        assert body["total"] >= page_size and states == {"RUNNING"}, body["jobs"][0]
    return {
        "p50_ms": statistics.median(times),
        "p95_ms": _percentile(times, 0.95),
        "max_ms": max(times),
    }


class _FullTableReader:
    """The baseline: health rows through the table's own reader."""

    def __init__(self, history: CheckpointHistory) -> None:
        self.history = history

    def read(self, last: int) -> list[dict]:
        return self.history.read(last=last)


def measure_full_reader(root: Path, requests: int, page_size: int) -> dict[str, float]:
    from streamkeeper.client import StreamkeeperClient

    original = StreamkeeperClient._history_tail
    StreamkeeperClient._history_tail = lambda self, layout: _FullTableReader(  # type: ignore[method-assign]
        self._history(layout)
    )
    try:
        return measure(root, requests, page_size)
    finally:
        StreamkeeperClient._history_tail = original  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rows-per-commit", type=int, default=2)
    parser.add_argument("--baseline-rows", type=int, default=100)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--page-size", type=int, default=50)
    parser.add_argument("--workdir", default=str(REPO / ".streamkeeper" / "bench-ui"))
    args = parser.parse_args()
    root = Path(args.workdir) / f"root-{args.rows}-{args.rows_per_commit}"
    started = time.monotonic()
    fill_root(root, args.jobs, args.rows, args.rows_per_commit)
    print(f"root {root}: {args.jobs} jobs ready in {time.monotonic() - started:.0f} s")
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    young_name = f"all_with_{args.baseline_rows}_rows_per_job"
    young = Path(args.workdir) / f"root-{args.baseline_rows}-{args.rows_per_commit}"
    fill_root(young, args.jobs, args.baseline_rows, args.rows_per_commit)
    with Heartbeats(young, args.jobs, args.baseline_rows):
        baseline = measure(young, args.requests, args.jobs)
    with Heartbeats(root, args.jobs, args.rows):
        figures = {
            "jobs": args.jobs,
            "history_rows_per_job": args.rows,
            "all": measure(root, args.requests, args.jobs),
            "page_of_20": measure(root, args.requests, min(20, args.jobs)),
            "all_with_full_table_reader": measure_full_reader(root, args.requests // 3, args.jobs),
            young_name: baseline,
        }
    figures["p95_ratio_to_young_jobs"] = figures["all"]["p95_ms"] / baseline["p95_ms"]
    for name in ("all", "page_of_20", "all_with_full_table_reader", young_name):
        f = figures[name]
        print(
            f"summary endpoint ({name}): p50 {f['p50_ms']:.1f} ms, p95 {f['p95_ms']:.1f} ms, "
            f"max {f['max_ms']:.1f} ms"
        )
    print(
        f"p95 with {args.rows} rows per job / with {args.baseline_rows}: "
        f"{figures['p95_ratio_to_young_jobs']:.2f} (1.0: the cost does not grow with history)"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
