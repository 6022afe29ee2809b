"""The quickstart: the sample job's whole lifecycle through Airflow, on embedded defaults.

Run by `infra/quickstart.sh` (which sets up the environment first). Airflow's
components (api-server, scheduler with the LocalExecutor, dag-processor, triggerer) start
one by one on 127.0.0.1 with a SQLite metadata database in `.streamkeeper/airflow`;
events arrive in `.streamkeeper/demo/events`; the job writes Delta tables below
`.streamkeeper/data` on local Spark. Then, as a user would from the UI:

1. `keyed-totals.start`      the job starts and completes a checkpoint;
2. `keyed-totals.savepoint`  a savepoint;
3. `keyed-totals.upgrade`    blue-green to version 2 (jobs/keyed_totals/versions/v2.yaml):
                             shadow run, quality gate, handover, probation.

It prints what happened and where to look (the UI's address and login, the tables, the
CLI commands), and keeps Airflow and the job running until Ctrl-C (`--exit`: stop at
once), then stops the job with a savepoint and Airflow's components.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
JOB = "keyed-totals"
V2 = REPO / "jobs" / "keyed_totals" / "versions" / "v2.yaml"
LOGIN = ("admin", "admin")


def configure(workdir: Path) -> Path:
    """Airflow's and the job's settings for a run in `workdir` (the job's relative paths,
    `.streamkeeper/...`, resolve there); returns its state folder. Airflow reads its
    settings when first imported: call this before."""
    state = workdir / ".streamkeeper"
    os.environ.update(
        {
            "AIRFLOW_HOME": str(state / "airflow"),
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),  # the operations page
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{LOGIN[0]}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(
                state / "airflow" / "simple_auth_manager_passwords.json"
            ),
            "AIRFLOW__STREAMKEEPER__WORKDIR": str(workdir),
            "AIRFLOW__STREAMKEEPER__ALERT_SINK": str(state / "alerts.jsonl"),
            "AIRFLOW_CONN_STREAMKEEPER_DEFAULT": json.dumps(
                {"conn_type": "streamkeeper", "extra": {"root": str(state / "data")}}
            ),
            "STREAMKEEPER_SPARK_LOG_LEVEL": "ERROR",
        }
    )
    return state


sys.path[:0] = [str(REPO), str(REPO / "src")]

from infra.components.airflow import AirflowServices, start_airflow  # noqa: E402
from jobs.keyed_totals.sample_events import write_event_files  # noqa: E402


class Feeder(threading.Thread):
    """A new event file every `period` seconds: the job's input, as a stream."""

    def __init__(self, directory: Path, period: float) -> None:
        super().__init__(daemon=True)
        self.directory, self.period = directory, period
        existing = sorted(directory.glob("events-*.json")) if directory.exists() else []
        self.count = len(existing)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            write_event_files(self.directory, files=1, events_per_file=2000, first_file=self.count)
            self.count += 1
            self.halt.wait(self.period)


def _airflow(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "airflow", *args], env=env, capture_output=True, text=True
    )


def _unpause(dag_id: str, timeout: float = 300) -> None:
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with create_session() as session:
            if session.query(DagModel).filter_by(dag_id=dag_id).update({"is_paused": False}):
                return
        time.sleep(2)
    raise SystemExit(f"the DAG processor did not parse {dag_id} within {timeout:.0f} s")


def run_dag(services: AirflowServices, dag_id: str, conf: dict[str, Any]) -> tuple[str, float]:
    """Trigger a DAG as a user would and wait for its end: (state, seconds)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    _unpause(dag_id)
    started = time.monotonic()
    done = _airflow(
        "dags", "trigger", dag_id, "--conf", json.dumps(conf), "-o", "json", env=services.env
    )
    if done.returncode != 0:
        raise SystemExit(f"cannot trigger {dag_id}: {done.stderr[-2000:]}")
    listing = [line for line in done.stdout.splitlines() if line.startswith("[")]
    run_id = json.loads(listing[-1])[0]["dag_run_id"]
    print(f"  {dag_id}: triggered ({run_id})", flush=True)
    while True:
        with create_session() as session:
            run = session.query(DagRun).filter_by(dag_id=dag_id, run_id=run_id).one()
            state = str(run.state)
        if state in ("success", "failed"):
            seconds = time.monotonic() - started
            print(f"  {dag_id}: {state} in {seconds:.0f} s", flush=True)
            return state, seconds
        time.sleep(2)


def _password(state: Path) -> str:
    path = state / "airflow" / "simple_auth_manager_passwords.json"
    try:
        return json.loads(path.read_text()).get(LOGIN[0], "?")
    except (OSError, ValueError):
        return "(see the api-server log)"


def summary(state: Path, services: AirflowServices, timings: dict[str, tuple[str, float]]) -> str:
    from streamkeeper.client import StreamkeeperClient
    from streamkeeper.upgrade.record import UpgradeRecords

    client = StreamkeeperClient(str(state / "data"))
    status = client.status(JOB)
    upgrades = UpgradeRecords(client.store, JOB).list()
    upgrade = upgrades[-1] if upgrades else None
    cli = f"{Path(sys.executable).parent / 'streamkeeper'}"
    root = state / "data"
    lines = ["", "What happened:"]
    lines += [
        f"  {dag:<24} {outcome:<8} {seconds:5.0f} s" for dag, (outcome, seconds) in timings.items()
    ]
    if upgrade is not None:
        handover = upgrade.handover or {}
        lines += [
            f"  upgrade {upgrade.id}: {upgrade.phase}"
            + (f" ({upgrade.reason})" if upgrade.reason else ""),
            f"    blue's savepoint {upgrade.blue.get('savepoint')}, stop savepoint "
            f"{handover.get('blue_savepoint')}; gap in live output "
            f"{handover.get('gap_s', '?')} s (blue's last commit to green's first)",
        ]
    lines += [
        f"  the job is {status.state} ({status.reason}), last commit seq "
        f"{status.head.seq if status.head else '-'}",
        "",
        f"Airflow UI: {services.api_url}  (login {LOGIN[0]} / {_password(state)})",
        f"  the jobs' operations page: {services.api_url}/plugin/streamkeeper",
        f"  DAGs keyed-totals.*; logs in {state / 'airflow' / 'logs'}",
        "Tables (Delta):",
        *(f"  {name:<8} {uri}" for name, uri in status.tables.items()),
        "Look at the job:",
        f"  {cli} status {JOB} --root {root}",
        f"  {cli} checkpoints {JOB} --root {root} --last 10",
        f"  {cli} upgrades {JOB} --root {root}",
        f"  {cli} savepoints list {JOB} --root {root}",
    ]
    return "\n".join(lines)


def start_demo(state: Path) -> tuple[AirflowServices, Feeder]:
    """A fresh state folder (Airflow's database kept), events arriving every 2 s, and
    Airflow's components on 127.0.0.1."""
    for leftover in ("data", "demo", "checkpoints", "logs"):
        shutil.rmtree(state / leftover, ignore_errors=True)
    (state / "airflow").mkdir(parents=True, exist_ok=True)
    feeder = Feeder(state / "demo" / "events", period=2.0)
    feeder.start()
    print("Migrating Airflow's metadata database (SQLite) ...", flush=True)
    migrated = _airflow("db", "migrate", env=dict(os.environ))
    if migrated.returncode != 0:
        feeder.halt.set()
        raise SystemExit(f"airflow db migrate failed: {migrated.stderr[-2000:]}")
    print("Starting Airflow on 127.0.0.1 (api-server, scheduler, dag-processor, triggerer) ...")
    return start_airflow(state / "airflow", {}), feeder


def upgrade_conf(probation: int) -> dict[str, Any]:
    return {
        "green_spec_path": str(V2),
        "format": "native",  # v2 keeps v1's state layout
        "probation_seconds": probation,
        "probation_checkpoints": 3,
    }


def run_story(
    services: AirflowServices, story: list[tuple[str, dict[str, Any]]]
) -> dict[str, tuple[str, float]]:
    """Each DAG in turn until one fails: {dag: (state, seconds from trigger to end)}."""
    timings: dict[str, tuple[str, float]] = {}
    for dag_id, conf in story:
        timings[dag_id] = outcome = run_dag(services, dag_id, conf)
        if outcome[0] != "success":
            print(f"{dag_id} failed: see its task logs in the UI or in AIRFLOW_HOME's logs")
            break
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exit", action="store_true", help="stop everything after the story")
    parser.add_argument("--probation", type=int, default=20, help="seconds of green's probation")
    args = parser.parse_args()
    state = configure(REPO)
    services, feeder = start_demo(state)
    timings: dict[str, tuple[str, float]] = {}
    try:
        story = [
            (f"{JOB}.start", {"new_checkpoints": 1}),
            (f"{JOB}.savepoint", {}),
            (f"{JOB}.upgrade", upgrade_conf(args.probation)),
        ]
        timings = run_story(services, story)
        print(summary(state, services, timings), flush=True)
        if not args.exit:
            print("\nAirflow and the job keep running; Ctrl-C stops both.", flush=True)
            while all(s.is_running() for s in services.services):
                time.sleep(2)
    except KeyboardInterrupt:
        pass
    finally:
        feeder.halt.set()
        stop_job(state)
        services.stop()
    return 0 if all(outcome == "success" for outcome, _ in timings.values()) else 1


def stop_job(state: Path) -> None:
    """Stop the job with a savepoint (a later quickstart resumes it)."""
    from streamkeeper.client import StreamkeeperClient
    from streamkeeper.errors import StreamkeeperError

    client = StreamkeeperClient(str(state / "data"))
    try:
        if client.status(JOB).state in ("RUNNING", "DEGRADED", "FAILING"):
            command = client.send_command(JOB, "stop")
            client.wait_for_result(JOB, command.id, timeout=120)
            print("The job stopped with a savepoint.")
    except StreamkeeperError as error:
        print(f"could not stop the job: {error}")


if __name__ == "__main__":
    raise SystemExit(main())
