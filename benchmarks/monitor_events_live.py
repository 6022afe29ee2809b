"""Event-driven monitoring through a real scheduler and triggerer: a health change to its run.

Not in CI (a scheduler start costs it too much); the proof that the unit tests of the
watcher (tests/airflow/test_health_trigger.py) do not give. A fresh Airflow (SQLite,
LocalExecutor; api-server, scheduler, dag-processor, triggerer on 127.0.0.1) parses
dags/monitor.py for a copy of the sample job (restarts off, `monitor_poll_interval`
2 s) whose control plane is written by hand, no Spark: STOPPED, then FAILED, then
STOPPED again. Printed and checked: the watcher starts in the triggerer; the FAILED
heartbeat becomes an asset-triggered monitor run whose check fails with the reason (and
an alert), how many seconds after the write; the recovery is a second run that
succeeds; no run follows while nothing changes. The first unpause also runs the daily
safety net once (the latest tick, as any cron DAG with catchup off).

    .venv/bin/python benchmarks/monitor_events_live.py      # ~1 minute
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DAG_ID = "keyed-totals.monitor"


def prepare(place: Path) -> Path:
    """DAG folder, jobs folder, storage root and this process's Airflow environment."""
    dags, jobs, root = place / "dags", place / "jobs", place / "data"
    for folder in (dags, jobs, root, place / "airflow"):
        folder.mkdir(parents=True)
    (dags / "monitor.py").symlink_to(REPO / "dags" / "monitor.py")
    shutil.copytree(REPO / "jobs" / "keyed_totals", jobs / "keyed_totals")
    spec = jobs / "keyed_totals" / "job.yaml"
    text = spec.read_text().replace("restart: {enabled: true", "restart: {enabled: false")
    spec.write_text(
        text.replace("  monitor: events", "  monitor_poll_interval: 2s\n  monitor: events")
    )
    connection = {"conn_type": "streamkeeper", "extra": {"root": str(root)}}
    paths = [str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]
    os.environ.update(
        AIRFLOW_HOME=str(place / "home"),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False",
        AIRFLOW__STREAMKEEPER__JOBS_FOLDER=str(jobs),
        AIRFLOW__STREAMKEEPER__ALERT_SINK=str(place / "alerts.jsonl"),
        AIRFLOW_CONN_STREAMKEEPER_DEFAULT=json.dumps(connection),
        PYTHONPATH=os.pathsep.join(p for p in paths if p),
    )
    return root


def write_job(root: Path, state: str) -> None:
    from tests.unit.test_client import write_control_plane

    beat = {"state": state, "time": time.time(), "epoch": 3}
    if state == "FAILED":
        beat["reason"] = "OutOfMemoryError in batch 7"
    write_control_plane(root, seqs=range(3), heartbeat=beat)


def runs() -> list[dict[str, Any]]:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return [
            {
                "run_id": run.run_id,
                "type": str(run.run_type).rsplit(".", 1)[-1].lower(),
                "state": str(run.state).rsplit(".", 1)[-1].lower(),
                "events": [e.extra.get("payload") for e in run.consumed_asset_events],
            }
            for run in session.query(DagRun).filter_by(dag_id=DAG_ID).order_by(DagRun.id)
        ]


def wait_for_runs(count: int, timeout: float = 180) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = runs()
        if sum(run["state"] in ("success", "failed") for run in found) >= count:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{count} finished runs expected in {timeout} s: {found}")
        time.sleep(0.5)


def wait_for_text(log: Path, text: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not (log.exists() and text in log.read_text(errors="replace")):
        if time.monotonic() > deadline:
            raise AssertionError(f"{log.name} never said {text!r}")
        time.sleep(0.5)


def change(root: Path, state: str, count: int) -> dict[str, Any]:
    """Write `state`; the run it starts (the `count`-th to finish) and the seconds to it."""
    from tests.support.airflow_runs import task_states

    written = time.monotonic()
    write_job(root, state)
    run = wait_for_runs(count)[-1]
    run["seconds"] = time.monotonic() - written
    run["tasks"] = {k: v[0] for k, v in task_states(DAG_ID, run["run_id"]).items()}
    print(f"{state}: {run['type']} run {run['state']} {run['seconds']:.1f} s after the write;")
    print(f"  tasks {run['tasks']}; event {run['events']}")
    return run


def main() -> int:
    place = Path(tempfile.mkdtemp(prefix="sk-monitor-live-"))
    root = prepare(place)
    sys.path.insert(0, str(REPO))
    from infra.components.airflow import start_airflow
    from tests.support.airflow_runs import migrate_metadata_db

    write_job(root, "STOPPED")
    migrate_metadata_db(dict(os.environ))
    services = start_airflow(place / "airflow", {})
    try:
        wait_for_text(place / "airflow" / "airflow-triggerer.log", "watching health from STOPPED")
        (net,) = wait_for_runs(1)
        print(f"safety net at first unpause: {net['type']} run {net['state']}")
        failed = change(root, "FAILED", 2)
        assert failed["type"] == "asset_triggered" and failed["state"] == "failed", failed
        assert failed["tasks"] == {"check": "failed", "restart": "skipped"}, failed
        assert failed["events"][0]["event"] == "unhealthy"
        alert = json.loads((place / "alerts.jsonl").read_text().splitlines()[-1])
        print(f"  alert: {alert['message']}")
        assert "is FAILED: " in alert["message"] and alert["run_id"] == failed["run_id"]
        recovered = change(root, "STOPPED", 3)
        assert recovered["state"] == "success" and recovered["events"][0]["event"] == "recovered"
        time.sleep(10)
        assert len(runs()) == 3, runs()
        print("no run in the next 10 s without a change")
    finally:
        services.stop()
        shutil.rmtree(place, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
