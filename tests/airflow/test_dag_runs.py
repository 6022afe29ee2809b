"""The DAGs end to end with `dag.test()`: a real metadata DB (SQLite), real Spark drivers
started by the launchers, real storage (local; SeaweedFS for one), the canary secret in
the connection. Each test stops the drivers it started."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jobs.keyed_totals.sample_events import write_event_files
from streamkeeper.client import StreamkeeperClient
from tests.airflow.conftest import CANARY_KEY, CANARY_SECRET
from tests.support.airflow_runs import (
    all_xcom_text,
    drivers_with_token,
    epochs,
    launch_record,
    stop_job_drivers,
    task_states,
    xcoms,
)

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

JOB = "keyed-totals"


def _dags() -> dict[str, Any]:
    """Parsed afresh for every run: `dag.test(run_conf=...)` leaves the conf in the DAG's
    Params, so a cached DAG would start the next test's run with this one's choices."""
    from airflow.dag_processing.dagbag import DagBag

    return dict(DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"]).dags)


@dataclass
class DagRunResult:
    dag_id: str
    run_id: str
    state: str
    seconds: float
    tasks: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    xcom: dict[str, Any] = field(default_factory=dict)


def run_dag(dag_id: str, **conf: Any) -> DagRunResult:
    """`dag.test()` with the Params in `conf`; the run's states and XComs."""
    started = time.monotonic()
    run = _dags()[dag_id].test(run_conf=conf)
    seconds = time.monotonic() - started
    print(f"DAG run {dag_id} {run.run_id}: {run.state} in {seconds:.1f} s")
    return DagRunResult(
        dag_id,
        run.run_id,
        str(run.state),
        seconds,
        task_states(dag_id, run.run_id),
        xcoms(dag_id, run.run_id),
    )


@dataclass
class JobPlace:
    """Where a test's job runs: its root, working directory, input and alerts."""

    root: Path
    work: Path
    events: Path
    alerts: Path
    checkpoint: Path

    @property
    def overrides(self) -> dict[str, str]:
        return {
            "source.path": str(self.events),
            "checkpoint.dir": str(self.checkpoint),
            "spark.master": "local[2]",
            "spark.shuffle_partitions": "2",
        }

    def client(self) -> StreamkeeperClient:
        return StreamkeeperClient(str(self.root))

    def driver_pid(self) -> int | None:
        beat = self.client().status(JOB).runner
        return None if beat is None else beat.pid


@pytest.fixture
def place(
    tmp_path: Path, conn_env: Any, monkeypatch: pytest.MonkeyPatch, airflow_db: float
) -> Iterator[JobPlace]:
    print(f"metadata DB migrated in {airflow_db:.1f} s")
    place = JobPlace(
        root=tmp_path / "data",
        work=tmp_path / "work",
        events=tmp_path / "events",
        alerts=tmp_path / "alerts.jsonl",
        checkpoint=tmp_path / "checkpoint",
    )
    place.root.mkdir()
    write_event_files(place.events, files=3, events_per_file=200)
    conn_env("streamkeeper_default", str(place.root))
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__WORKDIR", str(place.work))
    # The operator's choices (launch_policy.py): a test's input and checkpoint folders, and
    # its green specs beside them.
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__TRIGGER_OVERRIDES", "source.path, checkpoint.dir")
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__SPEC_FOLDERS", str(tmp_path))
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__ALERT_SINK", str(place.alerts))
    monkeypatch.setenv("STREAMKEEPER_SPARK_LOG_LEVEL", "ERROR")
    yield place
    stop_job_drivers(place.root, JOB)


def _no_secret(*texts: str) -> None:
    for text in texts:
        assert CANARY_SECRET not in text and CANARY_KEY not in text


def test_the_start_dag_runs_the_job_and_a_second_run_adopts_it(
    place: JobPlace, capfd: pytest.CaptureFixture[str]
) -> None:
    first = run_dag("keyed-totals.start", overrides=place.overrides, new_checkpoints=1)
    assert first.state == "success", first.tasks
    result = first.xcom["start"]
    assert result["status"] == "success" and first.xcom["start.start"]["action"] == "launched"
    assert result["status_report"]["state"] == "RUNNING" and result["new_checkpoints"]
    token = result["run_token"]
    assert token and token == first.xcom["start.start"]["token"]
    report = place.client().status(JOB)
    assert report.state == "RUNNING" and report.runner.run_token == token
    assert report.head is not None and report.head.seq >= 0
    pid = report.runner.pid
    assert [p.pid for p in drivers_with_token(token)] == [pid]

    second = run_dag("keyed-totals.start", overrides=place.overrides, new_checkpoints=0)
    assert second.state == "success", second.tasks
    adopted = second.xcom["start"]
    assert second.xcom["start.start"]["action"] == "attached" and adopted["run_token"] == token
    assert place.client().status(JOB).runner.pid == pid  # the same driver
    assert len(epochs(place.root, JOB)) == 1  # no second runner ever took the lineage

    logs = "".join(capfd.readouterr())
    driver_log = Path(launch_record(place.root, JOB)["log"]).read_text()
    _no_secret(logs, all_xcom_text(), driver_log, json.dumps(launch_record(place.root, JOB)))


def test_a_retried_start_task_attaches_to_the_driver_its_first_try_launched(
    place: JobPlace,
) -> None:
    run = run_dag("keyed-totals.retried-start", overrides=place.overrides)
    assert run.state == "success", run.tasks
    assert run.tasks["start"] == ("success", 2)  # the second try succeeded
    record = launch_record(place.root, JOB)
    assert record["origin"]["try_number"] == 1  # launched by try 1 only
    assert run.xcom["start.start"]["action"] == "attached"  # try 2 (try 1's was replaced)
    assert run.xcom["start"]["run_token"] == record["token"]
    assert place.driver_pid() == record["pid"]
    assert len(epochs(place.root, JOB)) == 1
    assert len(drivers_with_token(record["token"])) == 1


def _kill_and_wait_until_failed(place: JobPlace, timeout: float = 120) -> str:
    pid = place.driver_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        report = place.client().status(JOB)
        if report.state == "FAILED":
            return report.reason
        time.sleep(2)
    raise AssertionError(f"job not FAILED {timeout} s after SIGKILL: {report.reason}")


def _wait_for_a_checkpoint_after(place: JobPlace, since: float, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        head = place.client().status(JOB).head
        if head is not None and (head.committed_at or 0) > since:
            return
        time.sleep(1)
    raise AssertionError(f"no checkpoint committed within {timeout} s")


def test_the_monitor_alerts_on_a_failed_job_and_restarts_it_with_back_off(
    place: JobPlace,
) -> None:
    started = run_dag("keyed-totals.start", overrides=place.overrides, new_checkpoints=1)
    assert started.state == "success", started.tasks
    healthy = run_dag("keyed-totals.monitor", restart=False)
    assert healthy.state == "success" and healthy.xcom["check"]["state"] == "RUNNING"
    assert healthy.tasks["restart"][0] == "skipped"

    reason = _kill_and_wait_until_failed(place)
    assert "heartbeat lost" in reason
    alerted = run_dag("keyed-totals.monitor", restart=False)
    assert alerted.state == "failed", (alerted.tasks, alerted.xcom)
    assert alerted.tasks["check"][0] == "failed" and alerted.tasks["restart"][0] == "skipped"
    alerts = [json.loads(line) for line in place.alerts.read_text().splitlines()]
    assert alerts[-1]["task_id"] == "check" and "is FAILED: heartbeat lost" in alerts[-1]["message"]

    restarted = run_dag("keyed-totals.monitor", restart=True, backoff_seconds=600, max_attempts=2)
    assert restarted.state == "failed"  # the job was FAILED when checked: the run says so
    assert restarted.tasks["check"][0] == "failed" and restarted.tasks["restart"][0] == "success"
    assert restarted.xcom["restart"]["status_report"]["state"] == "RUNNING"
    assert restarted.xcom["restart.start"]["action"] == "launched"
    restarts = json.loads((place.root / "jobs" / JOB / "restarts.json").read_text())
    assert restarts["attempts"] == 1
    assert len(epochs(place.root, JOB)) == 2

    _kill_and_wait_until_failed(place)
    waiting = run_dag("keyed-totals.monitor", restart=True, backoff_seconds=600, max_attempts=2)
    assert waiting.tasks["restart"][0] == "skipped"  # back-off: attempt 2 is due in ~10 min
    assert place.client().status(JOB).state == "FAILED"
    given_up = run_dag("keyed-totals.monitor", restart=True, backoff_seconds=0, max_attempts=1)
    assert given_up.tasks["restart"][0] == "failed"
    alerts = [json.loads(line) for line in place.alerts.read_text().splitlines()]
    assert alerts[-1]["task_id"] == "restart" and "stays FAILED" in alerts[-1]["message"]
    assert "max_attempts=1" in alerts[-1]["message"]
    again = run_dag("keyed-totals.monitor", restart=True, backoff_seconds=0, max_attempts=2)
    assert again.tasks["restart"][0] == "success"  # attempt 2, at once with no back-off
    assert json.loads((place.root / "jobs" / JOB / "restarts.json").read_text())["attempts"] == 2
    write_event_files(place.events, files=1, events_per_file=200, first_file=3)
    _wait_for_a_checkpoint_after(place, time.time())
    settled = run_dag("keyed-totals.monitor", restart=True)
    assert settled.state == "success"
    assert json.loads((place.root / "jobs" / JOB / "restarts.json").read_text())["attempts"] == 0
    _no_secret(place.alerts.read_text(), all_xcom_text())
