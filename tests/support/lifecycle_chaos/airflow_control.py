"""What the lifecycle chaos harness asks of a running Airflow: trigger a DAG as a user
would (the REST API, as its default admin), read its run and task instances from the metadata DB,
and find the process that runs a task instance.

The metadata DB is read through Airflow's models in this process, so AIRFLOW_HOME must be
set before the first call (Airflow reads it when it is imported).
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from infra.components.process import HOST

PASSWORDS = "simple_auth_manager_passwords.json.generated"


@dataclass(frozen=True)
class TaskState:
    """One task instance of a DAG run, as the metadata DB has it."""

    task_id: str
    state: str | None
    try_number: int
    ti_id: str
    trigger_id: int | None

    def __str__(self) -> str:
        return f"{self.task_id}={self.state} (try {self.try_number})"


def _api(port: int, path: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        f"http://{HOST}:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


def trigger_dag(
    airflow_home: Path, port: int, dag_id: str, conf: dict[str, Any], timeout: float = 180
) -> str:
    """Trigger a run through the REST API as its default user (SimpleAuthManager's
    `admin`, password generated in AIRFLOW_HOME), retried until the DAG processor parsed
    the DAG; returns the run id."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            passwords = json.loads((airflow_home / PASSWORDS).read_text())
            login = {"username": "admin", "password": passwords["admin"]}
            token = _api(port, "/auth/token", login)["access_token"]
            body = {"logical_date": None, "conf": conf}
            run = _api(port, f"/api/v2/dags/{dag_id}/dagRuns", body, token)
            return str(run["dag_run_id"])
        except (OSError, KeyError, ValueError) as error:  # not parsed yet, API not up
            if time.monotonic() > deadline:
                detail = error.read().decode()[-1000:] if hasattr(error, "read") else error
                raise RuntimeError(f"cannot trigger {dag_id}: {detail}") from None
            time.sleep(2)


def run_state(dag_id: str, run_id: str) -> str | None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id=dag_id, run_id=run_id).one_or_none()
        return None if run is None else str(run.state)


def task_states(dag_id: str, run_id: str) -> dict[str, TaskState]:
    """task_id -> its task instance's state, try number, id and trigger."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        ).all()
        return {
            ti.task_id: TaskState(
                ti.task_id,
                None if ti.state is None else str(ti.state),
                int(ti.try_number or 0),
                str(ti.id),
                ti.trigger_id,
            )
            for ti in rows
        }


def wait_finished(dag_id: str, run_id: str, timeout: float) -> str:
    """The run's final state (success | failed); raises TimeoutError naming its tasks."""
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        state = run_state(dag_id, run_id)
        if state in ("success", "failed"):
            return state
        time.sleep(2)
    tasks = ", ".join(str(t) for t in task_states(dag_id, run_id).values())
    raise TimeoutError(f"{dag_id} {run_id} still {state} after {timeout:.0f} s: {tasks}")


def task_processes(ti_id: str) -> list[psutil.Process]:
    """The process running task instance `ti_id`: the task runner titles itself
    `airflow worker -- {ti_id}` (its LocalExecutor worker, the supervisor, is its parent)."""
    title = f"airflow worker -- {ti_id}"
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if title in " ".join(process.info.get("cmdline") or []):
            found.append(process)
    return found


def trigger_owner(trigger_id: int) -> int | None:
    """The id of the triggerer job that runs trigger `trigger_id` (None: unassigned)."""
    from airflow.models.trigger import Trigger
    from airflow.utils.session import create_session

    with create_session() as session:
        trigger = session.get(Trigger, trigger_id)
        return None if trigger is None else trigger.triggerer_id


def task_errors(airflow_home: Path, dag_id: str, run_id: str) -> dict[str, list[str]]:
    """task_id -> the exception each of its tries failed with, from the task logs
    (`attempt N: Type: message`); a try killed by a signal logged none."""
    folder = airflow_home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
    found: dict[str, list[str]] = {}
    for log in sorted(folder.glob("task_id=*/attempt=*.log")):
        task = log.parent.name.removeprefix("task_id=")
        attempt = log.stem.removeprefix("attempt=")
        for line in log.read_text(errors="replace").splitlines():
            if '"error_detail"' not in line:
                continue
            try:
                detail = json.loads(line)["error_detail"][-1]
            except (ValueError, KeyError, IndexError, TypeError):
                continue
            message = f"{detail.get('exc_type')}: {str(detail.get('exc_value'))[:400]}"
            found.setdefault(task, []).append(f"attempt {attempt}: {message}")
    return found
