"""Each lifecycle DAG's time from trigger to success, through a real Airflow.

The quickstart's setting (infra/quickstart_airflow.py) in a temporary folder: Airflow's
components on 127.0.0.1 (SQLite, LocalExecutor), the sample job on local Spark, an event
file every 2 s. The DAGs are triggered as a user would (`airflow dags trigger`), one
after another: start, savepoint, monitor, upgrade (blue-green to v2, native savepoints),
rollback (on demand, to blue's stop savepoint with v1), stop. The figure for each is
the time from the trigger to the run's end, as the scheduler reports it: the work plus
Airflow's own latency (scheduling, a task process, the triggerer's polls).

The start DAG runs twice: first on a fresh Airflow (its LocalExecutor's first task pays a
cold task process), then again after the stop, as on an Airflow that has been up a
while. For each, the start is split at the driver's launch, its first checkpoint and the
trigger's event (task and trigger logs, the job's checkpoint history), and the ratio of
"trigger to RUNNING with a checkpoint" to the driver's own start (launch to its first
checkpoint) is printed: issue 26's start row.

    .venv/bin/python benchmarks/dag_times.py            # about 5 minutes
"""

from __future__ import annotations

import argparse
import json
import platform
import sqlite3
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from infra import quickstart_airflow as demo  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probation", type=int, default=20, help="upgrade probation, seconds")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="sk-dag-times-"))
    state = demo.configure(workdir)
    services, feeder = demo.start_demo(state)
    job = demo.JOB
    try:
        timings = demo.run_story(services, [(f"{job}.start", {"new_checkpoints": 1})])
        starts = [_start_breakdown(state, f"{job}.start")]  # before an upgrade moves the job
        timings |= demo.run_story(
            services,
            [
                (f"{job}.savepoint", {}),
                (f"{job}.monitor", {}),
                (f"{job}.upgrade", demo.upgrade_conf(args.probation)),
            ],
        )
        from streamkeeper.client import StreamkeeperClient
        from streamkeeper.upgrade.record import UpgradeRecords

        store = StreamkeeperClient(str(state / "data")).store
        upgrade = UpgradeRecords(store, job).list()[-1]
        timings |= demo.run_story(
            services,
            [
                (f"{job}.rollback", {"savepoint_id": upgrade.handover["blue_savepoint"]}),
                (f"{job}.stop", {"mode": "stop", "savepoint": True}),
            ],
        )
        timings[f"{job}.start (again)"] = demo.run_dag(
            services, f"{job}.start", {"new_checkpoints": 1}
        )
        starts.append(_start_breakdown(state, f"{job}.start"))
    finally:
        feeder.halt.set()
        demo.stop_job(state)
        services.stop()
    print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{'DAG':<28} {'state':<8} {'trigger to end':>14}")
    for dag_id, (outcome, seconds) in timings.items():
        print(f"{dag_id:<28} {outcome:<8} {seconds:12.1f} s")
    print(f"upgrade gap in live output: {upgrade.handover.get('gap_s', '?')} s")
    print(f"\n{job}.start, from the trigger (queued) on:")
    for label, phases in zip(("fresh Airflow", "Airflow up"), starts, strict=True):
        shown = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
        print(f"  {label}: {shown}")
        to_running = phases["to launch"] + phases["driver: launch to checkpoint"]
        to_running += phases["checkpoint to trigger event"]
        own = phases["driver: launch to checkpoint"]
        print(
            f"    trigger to RUNNING with a checkpoint {to_running:.1f} s, driver's own start "
            f"{own:.1f} s: ratio {to_running / own:.2f} (target <= 1.2)"
        )
    print(f"\n{job}.upgrade by task (the validate task loads Great Expectations):")
    for task_id, seconds in _task_durations(state, f"{job}.upgrade"):
        print(f"  {task_id:<14} {seconds:8.1f} s")
    return 0 if all(outcome == "success" for outcome, _ in timings.values()) else 1


def _start_breakdown(state: Path, dag_id: str) -> dict[str, float]:
    """The latest start run's phases, in seconds: queued -> the driver's launch (task log)
    -> its first checkpoint after the launch (checkpoint history: trigger time plus the
    batch's duration) -> the trigger's event (trigger log) -> the run's end (metadata DB)."""
    from streamkeeper.client import StreamkeeperClient

    with sqlite3.connect(state / "airflow" / "airflow.db") as db:
        run_id, queued, ended = db.execute(
            "SELECT run_id, queued_at, end_date FROM dag_run WHERE dag_id = ? "
            "ORDER BY id DESC LIMIT 1",
            (dag_id,),
        ).fetchone()
    logs = state / "airflow" / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / "task_id=start"
    launched = _logged_at(logs / "attempt=1.log", ": launched")
    fired = min(_logged_at(p, "Trigger fired event") for p in logs.glob("attempt=1.log.trigger*"))
    job = dag_id.rsplit(".", 1)[0]
    ends = [
        _epoch(c.trigger_time) + c.duration_ms / 1000
        for c in StreamkeeperClient(str(state / "data")).history(job, last=50)
    ]
    checkpoint = min(end for end in ends if end > launched)
    return {
        "to launch": launched - _epoch(queued),
        "driver: launch to checkpoint": checkpoint - launched,
        "checkpoint to trigger event": fired - checkpoint,
        "trigger event to run end": _epoch(ended) - fired,
    }


def _logged_at(log: Path, text: str) -> float:
    """When a task or trigger log (JSON lines) first says `text`, in seconds since the epoch."""
    for line in log.read_text().splitlines():
        record = json.loads(line) if line.startswith("{") else {}
        if text in str(record.get("event", "")):
            return _epoch(record["timestamp"])
    raise SystemExit(f"{log} never says {text!r}")


def _epoch(stamp: str) -> float:
    moment = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    return moment.timestamp() if moment.tzinfo else moment.replace(tzinfo=UTC).timestamp()


def _task_durations(state: Path, dag_id: str) -> list[tuple[str, float]]:
    """Each task's run time in the DAG's latest run, from Airflow's metadata DB."""
    with sqlite3.connect(state / "airflow" / "airflow.db") as db:
        return db.execute(
            "SELECT task_id, duration FROM task_instance WHERE dag_id = ? AND run_id = "
            "(SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1) "
            "AND duration IS NOT NULL ORDER BY start_date",
            (dag_id, dag_id),
        ).fetchall()


if __name__ == "__main__":
    raise SystemExit(main())
