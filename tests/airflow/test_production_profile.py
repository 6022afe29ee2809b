"""The production profile: Airflow's metadata database on PostgreSQL (Debian's package,
started here on 127.0.0.1) and the LocalExecutor running tasks side by side.

The components run on Postgres while this test process's own Airflow stays on its
SQLite home, so the test reads the DAG runs and task instances with SQL from the Postgres
database itself (which also proves where they are). start -> savepoint and monitor at
once (their tasks overlap: parallelism > 1) -> stop with a savepoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from infra.components.airflow import AirflowServices, start_airflow
from streamkeeper.client import StreamkeeperClient
from tests.support.airflow_runs import (
    drivers_with_token,
    migrate_metadata_db,
    prepare_scheduled_job,
    stop_job_drivers,
)
from tests.support.services.postgres import PostgresServer, postgres_bin, start_postgres

pytestmark = [
    pytest.mark.integration,
    pytest.mark.airflow,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        postgres_bin() is None,
        reason="PostgreSQL is not installed (infra/setup.sh installs Debian's postgresql)",
    ),
]

JOB = "keyed-totals"
PARALLELISM = 4


@pytest.fixture
def production(
    tmp_path: Path, conn_env: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[AirflowServices, PostgresServer, Path]]:
    root = prepare_scheduled_job(tmp_path, conn_env, monkeypatch)
    database = start_postgres(tmp_path / "postgres.log")
    services = None
    try:
        profile = {
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database.sqlalchemy_url,
            "AIRFLOW__CORE__PARALLELISM": str(PARALLELISM),
        }
        migrate_metadata_db({**os.environ, **profile})
        services = start_airflow(tmp_path / "airflow", profile)
        yield services, database, tmp_path
    finally:
        if services is not None:
            services.stop()
        stop_job_drivers(root, JOB)
        database.stop()


def _sql(database: PostgresServer, query: str, *args: Any) -> list[tuple]:
    with contextlib.closing(database.connect()) as connection:
        cursor = connection.cursor()
        cursor.execute(query, args)
        return cursor.fetchall() if cursor.description else []


def _wait_parsed(database: PostgresServer, dag_ids: list[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = _sql(database, "SELECT dag_id FROM dag WHERE dag_id = ANY(%s)", dag_ids)
        if len(found) == len(dag_ids):
            return
        time.sleep(2)
    raise AssertionError(f"the DAG processor did not write {dag_ids} to Postgres")


def _unpause(database: PostgresServer, *dag_ids: str) -> None:
    _sql(database, "UPDATE dag SET is_paused = false WHERE dag_id = ANY(%s)", list(dag_ids))


def _trigger(services: AirflowServices, dag_id: str, conf: dict[str, Any]) -> subprocess.Popen:
    """`airflow dags trigger` as a user would (in the background: two can run at once)."""
    argv = [sys.executable, "-m", "airflow", "dags", "trigger", dag_id, "--conf"]
    return subprocess.Popen(
        [*argv, json.dumps(conf), "--output", "json"],
        env=services.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run_id(trigger: subprocess.Popen) -> str:
    out, err = trigger.communicate(timeout=180)
    assert trigger.returncode == 0, err[-2000:]
    listing = [line for line in out.splitlines() if line.startswith("[")]
    return json.loads(listing[-1])[0]["dag_run_id"]


def _finished(database: PostgresServer, dag_id: str, run_id: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    state = None
    while time.monotonic() < deadline:
        rows = _sql(
            database, "SELECT state FROM dag_run WHERE dag_id = %s AND run_id = %s", dag_id, run_id
        )
        state = rows[0][0] if rows else None
        if state in ("success", "failed"):
            return state
        time.sleep(2)
    raise AssertionError(f"{dag_id} {run_id} still {state} after {timeout} s")


def _task_spans(
    database: PostgresServer, dag_id: str, run_id: str
) -> list[tuple[datetime, datetime]]:
    query = "SELECT start_date, end_date FROM task_instance WHERE dag_id = %s AND run_id = %s"
    return [(start, end) for start, end in _sql(database, query, dag_id, run_id) if start]


def test_the_lifecycle_on_postgres_with_tasks_side_by_side(
    production: tuple[AirflowServices, PostgresServer, Path],
) -> None:
    services, database, place = production
    client = StreamkeeperClient(str(place / "data"))
    dags = [f"{JOB}.{action}" for action in ("start", "savepoint", "monitor", "stop")]
    _wait_parsed(database, dags)

    _unpause(database, f"{JOB}.start")
    overrides = {
        "source.path": str(place / "events"),
        "checkpoint.dir": str(place / "checkpoint"),
        "spark.master": "local[2]",
        "spark.shuffle_partitions": "2",
    }
    start = _run_id(_trigger(services, f"{JOB}.start", {"overrides": overrides}))
    assert _finished(database, f"{JOB}.start", start) == "success"
    token = client.status(JOB).runner.run_token
    assert client.status(JOB).state == "RUNNING" and len(drivers_with_token(token)) == 1

    # Both runs queue while their DAGs are paused, then become schedulable in one update:
    # with parallelism > 1 the scheduler runs their tasks at the same time.
    savepoint = _trigger(services, f"{JOB}.savepoint", {"format": "native"})
    monitor = _trigger(services, f"{JOB}.monitor", {})
    savepoint_run, monitor_run = _run_id(savepoint), _run_id(monitor)
    _unpause(database, f"{JOB}.savepoint", f"{JOB}.monitor")
    assert _finished(database, f"{JOB}.savepoint", savepoint_run) == "success"
    assert _finished(database, f"{JOB}.monitor", monitor_run) == "success"
    saving = _task_spans(database, f"{JOB}.savepoint", savepoint_run)
    checking = _task_spans(database, f"{JOB}.monitor", monitor_run)
    assert saving and checking
    overlapping = [(a, b) for a in saving for b in checking if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, f"no two tasks ran at once: savepoint {saving}, monitor {checking}"
    assert [entry.format for entry in client.savepoints(JOB)] == ["native"]

    _unpause(database, f"{JOB}.stop")
    stop = _run_id(_trigger(services, f"{JOB}.stop", {"mode": "stop", "savepoint": True}))
    assert _finished(database, f"{JOB}.stop", stop) == "success"
    deadline = time.monotonic() + 120
    while drivers_with_token(token) and time.monotonic() < deadline:
        time.sleep(1)
    assert not drivers_with_token(token), "the driver still runs after the stop DAG"
    assert client.status(JOB).runner.state == "STOPPED"
    assert len(client.savepoints(JOB)) == 2
