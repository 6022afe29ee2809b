"""Helpers for tests that run DAGs: a migrated metadata DB, a run's task states and XComs,
and stopping the drivers a test's DAG runs launched."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[2]


def migrate_metadata_db(env: dict[str, str] | None = None, timeout: float = 600) -> float:
    """`airflow db migrate` for the AIRFLOW_HOME in `env`; returns the seconds it took."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed: {done.stderr[-3000:]}")
    return time.monotonic() - started


def task_states(dag_id: str, run_id: str) -> dict[str, tuple[str | None, int]]:
    """task_id -> (state, try_number) of one DAG run, from the metadata DB."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        ).all()
        return {ti.task_id: (ti.state, ti.try_number) for ti in rows}


def xcoms(dag_id: str, run_id: str) -> dict[str, Any]:
    """`task_id` -> its return value, `task_id.key` -> its other XComs, of one DAG run."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(XComModel).where(XComModel.dag_id == dag_id, XComModel.run_id == run_id)
        ).all()
        return {
            row.task_id if row.key == "return_value" else f"{row.task_id}.{row.key}": (
                XComModel.deserialize_value(row)
            )
            for row in rows
        }


def all_xcom_text() -> str:
    """Every XCom value in the metadata DB as text (for the no-secret checks)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        return "\n".join(json.dumps(row.value) for row in session.scalars(select(XComModel)))


def stop_driver(pid: int | None, grace: float = 60.0) -> None:
    """SIGTERM a driver (it records STOPPED), SIGKILL it if it lingers; children too."""
    if not pid:
        return
    try:
        process = psutil.Process(pid)
        children = process.children(recursive=True)
    except psutil.Error:
        return
    with contextlib.suppress(psutil.Error):
        process.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs([process], timeout=grace)
    for leftover in [*alive, *children]:
        with contextlib.suppress(psutil.Error):
            leftover.kill()
    psutil.wait_procs([*alive, *children], timeout=10)


def stop_job_drivers(root: Path, job: str) -> None:
    """Stop whatever driver the job's launch record or heartbeat under `root` names (the
    launch record exists before the driver writes its first heartbeat)."""
    for name in ("launch.json", "heartbeat.json"):
        record = root / "jobs" / job / name
        if record.is_file():
            stop_driver(json.loads(record.read_text()).get("pid"))


def drivers_with_token(token: str) -> list[psutil.Process]:
    """Live processes whose command line carries `--run-token TOKEN` (drivers and launchers)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info.get("cmdline") or []
        if token in cmdline and "--run-token" in cmdline and "--detach" not in cmdline:
            found.append(process)
    return found


def launch_record(root: Path, job: str) -> dict[str, Any]:
    return json.loads((root / "jobs" / job / "launch.json").read_text())


def epochs(root: Path, lineage: str) -> list[str]:
    folder = root / "lineages" / lineage / "epochs"
    return sorted(p.name for p in folder.glob("*.json"))


def prepare_scheduled_job(
    place: Path, set_connection: Callable[[str, str], object], monkeypatch: Any
) -> Path:
    """Events, the default connection and a copy of the sample job without its schedules
    (only the runs a test triggers happen) for components started from this environment;
    returns the storage root."""
    from jobs.keyed_totals.sample_events import write_event_files

    root = place / "data"
    root.mkdir()
    write_event_files(place / "events", files=3, events_per_file=200)
    set_connection("streamkeeper_default", str(root))
    jobs = place / "jobs"
    shutil.copytree(REPO / "jobs" / "keyed_totals", jobs / "keyed_totals")
    spec = jobs / "keyed_totals" / "job.yaml"
    text = re.sub(r"(monitor|savepoint)_schedule: .*", r"\1_schedule: null", spec.read_text())
    # nor a monitor run on the health changes it causes (events mode's watcher)
    text = re.sub(r"(?m)^(\s*)monitor: .*", r"\1monitor: schedule", text)
    spec.write_text(text)
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__JOBS_FOLDER", str(jobs))
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__WORKDIR", str(place / "work"))
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__TRIGGER_OVERRIDES", "source.path, checkpoint.dir")
    monkeypatch.setenv("STREAMKEEPER_SPARK_LOG_LEVEL", "ERROR")
    return root
