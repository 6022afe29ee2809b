"""Each lifecycle DAG's time from trigger to success, through a real Airflow.

The quickstart's setting (infra/quickstart_airflow.py) in a temporary folder: Airflow's
components on 127.0.0.1 (SQLite, LocalExecutor), the sample job on local Spark, an event
file every 2 s. The DAGs are triggered as a user would (`airflow dags trigger`), one
after another: start, savepoint, monitor, upgrade (blue-green to v2, native savepoints),
rollback (on demand, to blue's stop savepoint with v1), stop. The figure for each is
the time from the trigger to the run's end, as the scheduler reports it: the work plus
Airflow's own latency (scheduling, a task process, the triggerer's polls).

    .venv/bin/python benchmarks/dag_times.py            # about 5 minutes
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
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
        timings = demo.run_story(
            services,
            [
                (f"{job}.start", {"new_checkpoints": 1}),
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
    finally:
        feeder.halt.set()
        demo.stop_job(state)
        services.stop()
    print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{'DAG':<24} {'state':<8} {'trigger to end':>14}")
    for dag_id, (outcome, seconds) in timings.items():
        print(f"{dag_id:<24} {outcome:<8} {seconds:12.1f} s")
    print(f"upgrade gap in live output: {upgrade.handover.get('gap_s', '?')} s")
    print(f"\n{job}.upgrade by task (the validate task loads Great Expectations):")
    for task_id, seconds in _task_durations(state, f"{job}.upgrade"):
        print(f"  {task_id:<14} {seconds:8.1f} s")
    return 0 if all(outcome == "success" for outcome, _ in timings.values()) else 1


def _task_durations(state: Path, dag_id: str) -> list[tuple[str, float]]:
    """Each task's run time in the DAG's latest run, from Airflow's metadata DB."""
    import sqlite3

    with sqlite3.connect(state / "airflow" / "airflow.db") as db:
        return db.execute(
            "SELECT task_id, duration FROM task_instance WHERE dag_id = ? AND run_id = "
            "(SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1) "
            "AND duration IS NOT NULL ORDER BY start_date",
            (dag_id, dag_id),
        ).fetchall()


if __name__ == "__main__":
    raise SystemExit(main())
