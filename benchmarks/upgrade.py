"""The gap in live output during a blue-green upgrade of the sample job, beside a plain
stop-and-restart of the same job.

Run:  /work/main/.venv/bin/python benchmarks/upgrade.py [--repeats N] [--interval 1s]
          [--formats native,canonical] [--workdir DIR]

The sample job (keyed-totals) runs as a detached driver (`streamkeeper run`) on local
storage at a 1 s trigger interval, with a new event file every 0.5 s. Each round:

  upgrade (native | canonical)  blue -> v2 (jobs/keyed_totals/versions/v2.yaml) through
                                the upgrade steps the DAG runs: savepoint, green's shadow
                                run, handover. The gap: blue's last live commit to green's
                                first (commit markers' timestamps); its parts from the
                                upgrade record (blue's stop with savepoint, the rest)
  stop-and-restart              the job stopped with a (native) savepoint, then a new
                                driver started from it: last commit to first commit

Beside Flink's stop-with-savepoint + restore of a comparable job on this machine:
7.8-13.1 s (DESIGN.md). Target (issue 26): gap <= interval + 1 s. The last line printed
is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from jobs.keyed_totals.sample_events import write_event_files  # noqa: E402
from streamkeeper.client import StreamkeeperClient  # noqa: E402
from streamkeeper.lineage.layout import LineageLayout  # noqa: E402
from streamkeeper.lineage.markers import latest_marker, marker_seqs_after  # noqa: E402
from streamkeeper.upgrade.record import UpgradeRecords  # noqa: E402
from streamkeeper.upgrade.shadow import new_upgrade_id  # noqa: E402
from streamkeeper.upgrade.steps import (  # noqa: E402
    begin_upgrade,
    handover_gap,
    request_handover,
    set_aside,
)

JOB = "keyed-totals"
V1 = REPO / "jobs" / "keyed_totals" / "job.yaml"
V2 = REPO / "jobs" / "keyed_totals" / "versions" / "v2.yaml"
FLINK_STOP_RESTORE_S = (7.8, 13.1)


class Feeder(threading.Thread):
    def __init__(self, directory: Path, period: float) -> None:
        super().__init__(daemon=True)
        self.directory, self.period = directory, period
        self.files = write_event_files(directory, files=2, events_per_file=200)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.period):
            self.files += write_event_files(
                self.directory, files=1, events_per_file=200, first_file=len(self.files)
            )


class World:
    """One job's storage root, checkpoint directory and input, and its drivers."""

    def __init__(self, work: Path, interval: str) -> None:
        self.work = work
        self.root = work / "data"
        self.checkpoint = work / "checkpoint"
        self.events = work / "events"
        self.interval = interval
        self.client = StreamkeeperClient(str(self.root))
        self.processes: list[subprocess.Popen] = []

    def sets(self) -> list[str]:
        settings = {
            "source.path": str(self.events),
            "storage.root": str(self.root),
            "checkpoint.dir": str(self.checkpoint),
            "checkpoint.interval": self.interval,
            "spark.master": "local[2]",
            "spark.shuffle_partitions": "2",
        }
        return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]

    def launch(self, command: str, spec: Path, *extra: str) -> subprocess.Popen:
        log = open(self.work / f"driver-{len(self.processes)}.log", "wb")  # noqa: SIM115
        env = {**os.environ, "STREAMKEEPER_SPARK_LOG_LEVEL": "ERROR"}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
        argv = [sys.executable, "-m", "streamkeeper", command, str(spec), *self.sets(), *extra]
        process = subprocess.Popen(argv, cwd=self.work, env=env, stdout=log, stderr=log)
        self.processes.append(process)
        return process

    def head(self, job: str = JOB) -> int:
        try:
            head = self.client.status(job).head
        except Exception:  # noqa: BLE001 - not started yet
            return -1
        return -1 if head is None else head.seq

    def wait(self, condition: Any, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            for process in self.processes:
                if process.poll() not in (None, 0):
                    raise SystemExit(f"a driver failed ({process.args[3]}); see {self.work}")
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}; see {self.work}")
            time.sleep(0.1)

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def upgrade_round(world: World, fmt: str, spec: Path, green: Path) -> dict[str, Any]:
    """Upgrade the running job from `spec` to `green`; the gap and its parts."""
    upgrade_id = new_upgrade_id()
    start = world.head()
    world.wait(lambda: world.head() >= start + 3, 240, "blue's commits")
    began = time.time()
    record = begin_upgrade(
        world.client, JOB, upgrade_id, green_spec_path=str(green), blue_spec_path=str(spec), fmt=fmt
    )
    world.launch("upgrade-green", green, "--upgrade-id", upgrade_id)
    shadow = record.green["shadow_job"]
    world.wait(lambda: world.head(shadow) >= 2, 240, "green's shadow commits")
    shadow_ready = time.time()
    request_handover(world.client, JOB, upgrade_id)
    records = UpgradeRecords(world.client.store, JOB)
    gap = world.wait(
        lambda: handover_gap(world.client, records.read(upgrade_id)), 240, "green's first commit"
    )
    handover = records.read(upgrade_id).handover or {}
    return {
        "kind": f"upgrade ({fmt})",
        "gap_s": round(gap.gap_s, 3),
        "blue_stop_s": round(handover["blue_stopped_at"] - handover["requested_at"], 3),
        "blue_stop_parts_ms": handover.get("blue_stop_ms"),
        "from_blue_stopped_to_green_commit_s": round(
            gap.green_first_commit_at - handover["blue_stopped_at"], 3
        ),
        "savepoint_to_shadow_ready_s": round(shadow_ready - began, 1),
    }


def restart_round(world: World, spec: Path) -> dict[str, Any]:
    """Stop the job with a native savepoint, start a new driver from it."""
    start = world.head()
    world.wait(lambda: world.head() >= start + 3, 240, "the job's commits")
    asked = time.time()
    command = world.client.send_command(JOB, "stop", format="native")
    result = world.client.wait_for_result(JOB, command.id, timeout=240, poll=0.05)
    assert result.ok and result.savepoint_id, result.reason
    stopped = time.time()
    set_aside(world.checkpoint, f"restart-{int(asked)}")
    layout = LineageLayout(world.client.location, JOB, JOB)
    last = latest_marker(world.client.store, layout)
    assert last is not None
    world.launch("run", spec, "--from-savepoint", result.savepoint_id)
    first = world.wait(
        lambda: marker_seqs_after(world.client.store, layout, int(last["seq"])), 300, "a commit"
    )
    marker = world.client.store.read_json(layout.marker(first[0])) or {}
    return {
        "kind": "stop-and-restart",
        "gap_s": round(float(marker["committed_at"]) - float(last["committed_at"]), 3),
        "blue_stop_s": round(stopped - asked, 3),
        "from_blue_stopped_to_green_commit_s": round(float(marker["committed_at"]) - stopped, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--interval", default="1s")
    parser.add_argument("--formats", default="native,canonical")
    parser.add_argument("--workdir", type=Path)
    args = parser.parse_args()
    os.environ.pop("PYSPARK_SUBMIT_ARGS", None)  # the benchmark's drivers start as users' do
    work = args.workdir or Path(tempfile.mkdtemp(prefix="sk-upgrade-bench-"))
    world = World(work, args.interval)
    feeder = Feeder(world.events, period=0.5)
    feeder.start()
    rounds: list[dict[str, Any]] = []
    try:
        world.launch("run", V1)
        world.wait(lambda: world.head() >= 2, 300, "the job's first commits")
        specs = [V1, V2]
        for _ in range(args.repeats):
            for fmt in args.formats.split(","):
                rounds.append(upgrade_round(world, fmt, specs[0], specs[1]))
                print(json.dumps(rounds[-1]), flush=True)
                specs.reverse()  # and back again: v2 -> v1 is an upgrade too
            rounds.append(restart_round(world, specs[0]))
            print(json.dumps(rounds[-1]), flush=True)
    finally:
        feeder.halt.set()
        world.stop_all()
    summary: dict[str, Any] = {"interval": args.interval, "machine": f"{os.cpu_count()} cpus"}
    for kind in sorted({r["kind"] for r in rounds}):
        gaps = [r["gap_s"] for r in rounds if r["kind"] == kind]
        summary[kind] = {"gaps_s": gaps, "median_s": round(statistics.median(gaps), 3)}
    print(f"work folder: {work}")
    for kind, figures in summary.items():
        if isinstance(figures, dict):
            print(f"{kind:<22} gap median {figures['median_s']:.2f} s  {figures['gaps_s']}")
    print(f"Flink stop-with-savepoint + restore on this machine: {FLINK_STOP_RESTORE_S} s")
    print(json.dumps({"rounds": rounds, "summary": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
