"""The lifecycle DAGs through Airflow itself: a real scheduler (LocalExecutor), task
execution API, DAG processor and triggerer on a SQLite metadata database, triggered as
a user would (`airflow dags trigger`), running a real Spark driver on local storage.

start (deferred to the triggerer until the job is RUNNING with a checkpoint) -> savepoint
(answered within the operator's quick wait) -> stop with a canonical savepoint; the
canary credential of the connection reaches no component's log. OpenLineage (the
provider's listener, file transport) sees the start's source and tables, its run and
the savepoints, and the driver carries the start task's run as its parent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.components.airflow import AirflowServices, start_airflow
from streamkeeper.client import StreamkeeperClient
from tests.airflow.conftest import CANARY_KEY, CANARY_SECRET
from tests.support.airflow_runs import (
    drivers_with_token,
    prepare_scheduled_job,
    stop_job_drivers,
    task_states,
    xcoms,
)

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.timeout(900)]

JOB = "keyed-totals"
REPO = Path(__file__).resolve().parents[2]
READER_DAG = Path(__file__).parent / "asset_dags" / "committed_totals_reader.py"
READER = f"{JOB}.committed-reader"
OPENLINEAGE_EVENTS = "openlineage-events.jsonl"


def _openlineage_env(place: Path) -> dict[str, str]:
    """OpenLineage on, into a file (one JSON event a line), with the parent run injected
    into the driver's Spark properties as the Spark provider's operators do."""
    transport = {"type": "file", "log_file_path": str(place / OPENLINEAGE_EVENTS), "append": True}
    return {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport),
        "AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO": "true",
    }


@pytest.fixture
def airflow(
    tmp_path: Path, conn_env: Any, monkeypatch: pytest.MonkeyPatch, airflow_db: float
) -> Iterator[tuple[AirflowServices, Path]]:
    root = prepare_scheduled_job(tmp_path, conn_env, monkeypatch)
    reader = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / READER_DAG.name
    reader.symlink_to(READER_DAG)  # it needs the job's spec and connection to parse
    try:
        services = start_airflow(tmp_path / "airflow", _openlineage_env(tmp_path))
        try:
            yield services, tmp_path
        finally:
            services.stop()
            stop_job_drivers(root, JOB)
    finally:
        reader.unlink()


def _unpause(dag_id: str, timeout: float = 180) -> None:
    """Unpause the DAG once the DAG processor has parsed it."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with create_session() as session:
            if session.query(DagModel).filter_by(dag_id=dag_id).update({"is_paused": False}):
                return
        time.sleep(2)
    raise AssertionError(f"DAG {dag_id} not parsed within {timeout} s")


def _trigger_log(dag_id: str, run_id: str, task_id: str, expected: str) -> str:
    """What the triggerer logged for the task's deferrals, once it holds `expected`: the
    triggerer writes its log file on its own schedule, which can trail the run's end (by
    more than a minute on a loaded machine)."""
    folder = Path(os.environ["AIRFLOW_HOME"], "logs", f"dag_id={dag_id}", f"run_id={run_id}")
    deadline = time.monotonic() + 180
    while True:
        text = "".join(p.read_text() for p in folder.glob(f"task_id={task_id}/*.trigger.*.log"))
        if expected in text or time.monotonic() > deadline:
            return text
        time.sleep(1)


def _trigger(services: AirflowServices, dag_id: str, conf: dict[str, Any]) -> str:
    """`airflow dags trigger`, as a user would; the run id."""
    _unpause(dag_id)
    deadline = time.monotonic() + 60
    while True:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "airflow",
                "dags",
                "trigger",
                dag_id,
                "--conf",
                json.dumps(conf),
                "--output",
                "json",
            ],
            env=services.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode == 0:
            listing = [line for line in done.stdout.splitlines() if line.startswith("[")]
            return json.loads(listing[-1])[0]["dag_run_id"]  # after any warning lines
        if time.monotonic() > deadline:
            raise AssertionError(f"cannot trigger {dag_id}: {done.stderr[-2000:]}")
        time.sleep(3)


def _finished(dag_id: str, run_id: str, timeout: float = 600) -> str:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with create_session() as session:
            run = session.query(DagRun).filter_by(dag_id=dag_id, run_id=run_id).one_or_none()
            state = None if run is None else str(run.state)
        if state in ("success", "failed"):
            return state
        time.sleep(2)
    raise AssertionError(
        f"{dag_id} {run_id} still {state} after {timeout} s: {task_states(dag_id, run_id)}"
    )


def _openlineage_event(place: Path, dag_id: str, task_id: str, timeout: float = 60) -> Any:
    """The COMPLETE event of a task: the listener writes it from a forked process, which
    can finish after the run is marked done."""
    events = place / OPENLINEAGE_EVENTS
    deadline = time.monotonic() + timeout
    while True:
        lines = events.read_text().splitlines() if events.exists() else []
        for line in lines:
            event = json.loads(line)
            if event["eventType"] == "COMPLETE" and event["job"]["name"] == f"{dag_id}.{task_id}":
                return event
        if time.monotonic() > deadline:
            raise AssertionError(f"no COMPLETE event of {dag_id}.{task_id} in {len(lines)} events")
        time.sleep(1)


def _start_lineage_is_the_jobs(place: Path, overrides: dict[str, str], report: Any) -> None:
    """The start's COMPLETE event: the source folder as input and each sink's table as an
    output (named from the spec and the root, as OpenLineage names local files), the run
    facet of the run the control plane shows; the driver got the task's run as parent."""
    from streamkeeper.spec import load_spec
    from tests.support.airflow_runs import launch_record

    event = _openlineage_event(place, f"{JOB}.start", "start")
    spec = load_spec(place / "jobs" / "keyed_totals" / "job.yaml", overrides)
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [
        ("file", str(Path(spec.source.path).resolve()))
    ]
    tables = {("file", str((place / "data" / sink.table_path).resolve())) for sink in spec.sinks}
    assert {(d["namespace"], d["name"]) for d in event["outputs"]} == tables
    recorded = {Path(table.removeprefix("file://")).resolve() for table in report.tables.values()}
    assert tables == {("file", str(path)) for path in recorded}  # where the runtime writes
    run = event["run"]["facets"]["streamkeeper_run"]
    assert run["runToken"] == report.runner.run_token and run["epoch"] == report.runner.epoch
    assert (run["job"], run["startFrom"], run["state"]) == (JOB, "resume", "RUNNING")
    parent = launch_record(place / "data", JOB)["request"]["spark_conf"]
    assert parent["spark.openlineage.parentRunId"] == event["run"]["runId"]
    assert parent["spark.openlineage.parentJobName"] == event["job"]["name"]
    assert parent["spark.openlineage.parentJobNamespace"] == event["job"]["namespace"]
    [driver] = drivers_with_token(report.runner.run_token)
    given = f"spark.conf.spark.openlineage.parentRunId={event['run']['runId']}"
    assert given in driver.cmdline()  # `--set`: the driver's session gets it


def _savepoint_facet(place: Path, dag_id: str, task_id: str) -> dict[str, Any]:
    return _openlineage_event(place, dag_id, task_id)["run"]["facets"]["streamkeeper_savepoint"]


def _reads_each_stable_commit_as_of_its_version(place: Path) -> None:
    """The job's tables as Assets: a DAG scheduled on `totals` runs on the job's stable
    commits (the triggerer's watcher) and reads the table as of the version each names;
    what it read must be the totals of exactly the files the batch had consumed (one
    file per batch: maxFilesPerTrigger 1), so a lost or doubled batch fails it."""
    from jobs.keyed_totals.sample_events import expected_results, write_event_files
    from streamkeeper.stable import StableView

    _unpause(READER)
    triggerer_log = place / "airflow" / "airflow-triggerer.log"
    _wait_for_text(triggerer_log, f"{JOB}: watching commits after seq")
    write_event_files(place / "events", files=2, events_per_file=200, first_file=3)
    reads = _reads_until(READER, batch_id=4)
    files = sorted((place / "events").glob("events-*.json"))
    for read in reads:
        totals, _ = expected_results(files[: read["batch_id"] + 1])
        got = {row["key"]: (row["events"], row["total"]) for row in read["rows"]}
        assert got == totals, f"batch {read['batch_id']} (seq {read['seq']}) read wrong totals"
    view = StableView(str(place / "data"), JOB)
    last = reads[-1]
    marker = view.store.read_json(view.layout.marker(last["seq"]))
    assert last["version"] == marker["versions"]["totals"]  # the commit's own version


def _wait_for_text(log: Path, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and text in log.read_text(errors="replace"):
            return
        time.sleep(1)
    raise AssertionError(f"{log.name} never said {text!r} in {timeout} s")


def _reads_until(dag_id: str, batch_id: int, timeout: float = 300) -> list[dict[str, Any]]:
    """What each successful run of the reader read, once one read `batch_id`."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    deadline = time.monotonic() + timeout
    while True:
        with create_session() as session:
            runs = session.query(DagRun).filter_by(dag_id=dag_id).all()
            finished = sorted((run.run_id, str(run.state)) for run in runs)
        assert all(state != "failed" for _, state in finished), finished
        reads = [xcoms(dag_id, run_id)["read"] for run_id, state in finished if state == "success"]
        reads.sort(key=lambda read: read["seq"])
        if reads and reads[-1]["batch_id"] >= batch_id:
            return reads
        if time.monotonic() > deadline:
            raise AssertionError(f"no run of {dag_id} read batch {batch_id}: {finished}")
        time.sleep(2)


def test_start_savepoint_and_stop_through_the_scheduler_and_the_triggerer(
    airflow: tuple[AirflowServices, Path],
) -> None:
    services, place = airflow
    client = StreamkeeperClient(str(place / "data"))
    overrides = {
        "source.path": str(place / "events"),
        "checkpoint.dir": str(place / "checkpoint"),
        "spark.master": "local[2]",
        "spark.shuffle_partitions": "2",
    }

    start_run = _trigger(services, f"{JOB}.start", {"overrides": overrides, "new_checkpoints": 1})
    assert _finished(f"{JOB}.start", start_run) == "success", task_states(f"{JOB}.start", start_run)
    started = xcoms(f"{JOB}.start", start_run)
    assert started["start.start"]["action"] == "launched"
    assert started["start"]["status_report"]["state"] == "RUNNING"
    token = started["start"]["run_token"]
    report = client.status(JOB)
    assert report.state == "RUNNING" and report.runner.run_token == token
    assert len(drivers_with_token(token)) == 1
    # The task page's extra links, computed by the worker when the task ended.
    assert started["start._link_StreamingJobLink"] == f"/streamkeeper/#job={JOB}"
    assert started["start._link_SparkUILink"] == (report.runner.spark_ui or "")
    # The wait ran in the triggerer, not in a worker slot.
    trigger = "CheckpointProgressTrigger"
    assert trigger in _trigger_log(f"{JOB}.start", start_run, "start", trigger)
    _start_lineage_is_the_jobs(place, overrides, report)

    _reads_each_stable_commit_as_of_its_version(place)

    savepoint_run = _trigger(
        services, f"{JOB}.savepoint", {"format": "native", "self_contained": False}
    )
    assert _finished(f"{JOB}.savepoint", savepoint_run) == "success"
    saved = xcoms(f"{JOB}.savepoint", savepoint_run)["savepoint"]
    assert saved["status"] == "success" and saved["savepoint_id"]
    entry = {entry.id: entry for entry in client.savepoints(JOB)}[saved["savepoint_id"]]
    assert (entry.format, entry.storage) == ("native", "pinned")  # the Params, as chosen
    facet = _savepoint_facet(place, f"{JOB}.savepoint", "savepoint")
    assert (facet["savepointId"], facet["format"], facet["storage"]) == (
        entry.id,
        entry.format,
        entry.storage,
    )

    stop_run = _trigger(
        services, f"{JOB}.stop", {"mode": "stop", "savepoint": True, "format": "canonical"}
    )
    assert _finished(f"{JOB}.stop", stop_run) == "success"
    stopped = xcoms(f"{JOB}.stop", stop_run)["stop"]
    assert stopped["status"] == "success" and stopped["savepoint_id"]
    deadline = time.monotonic() + 120
    while drivers_with_token(token) and time.monotonic() < deadline:
        time.sleep(1)
    assert not drivers_with_token(token), "the driver still runs after the stop DAG"
    assert client.status(JOB).runner.state == "STOPPED"
    formats = sorted(entry.format for entry in client.savepoints(JOB))
    assert formats == ["canonical", "native"]
    facet = _savepoint_facet(place, f"{JOB}.stop", "stop")
    assert (facet["savepointId"], facet["format"], facet["command"]) == (
        stopped["savepoint_id"],
        "canonical",
        "stop",
    )

    for log in [*(place / "airflow").glob("*.log"), place / OPENLINEAGE_EVENTS]:
        text = log.read_text(errors="replace")
        assert CANARY_SECRET not in text and CANARY_KEY not in text, log
