"""The SSH gateway launcher against a real OpenSSH server on 127.0.0.1 (the "gateway"):
a start DAG's operator launches the sample job with `launcher="ssh"` (both modes), the
driver runs detached on the gateway, beats and commits after the SSH connection and even
sshd are gone, no process ever shows a credential on its command line, and the stop DAG
stops it through the control plane. Failures name the gateway, the exit and the fix."""

# ruff: noqa: F811 - `place` is a fixture, imported to be used by name
from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.reader import read_table_rows
from streamkeeper_airflow.errors import LaunchError
from streamkeeper_airflow.launchers import launcher_for
from streamkeeper_airflow.launchers.base import LaunchRequest
from tests.airflow.conftest import CANARY_KEY, CANARY_SECRET
from tests.airflow.test_dag_runs import JOB, JobPlace, place, run_dag  # noqa: F401 - fixture
from tests.support.airflow_runs import all_xcom_text, launch_record
from tests.support.sshd import Sshd, free_port, start_sshd
from tests.support.traffic import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.airflow]

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"
CONN_ID = "sk_gateway"
# What the gateway's administrator set in its login environment (sshd's SetEnv here).
GATEWAY_ENV = {
    "SPARK_LOCAL_IP": "127.0.0.1",
    "STREAMKEEPER_SPARK_LOG_LEVEL": "ERROR",
    "STREAMKEEPER_GATEWAY_MARK": "set-on-the-gateway",
}
SECRETS = (CANARY_SECRET, CANARY_KEY)


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Sshd]:
    server = start_sshd(tmp_path / "sshd", set_env=GATEWAY_ENV)
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", server.connection_json())
    # A worker variable the allow-list passes: it must not travel to the gateway.
    monkeypatch.setenv("STREAMKEEPER_WORKER_ONLY", "worker-value")
    yield server
    server.stop()


class CmdlineWatch:
    """Reads every process's command line (/proc/*/cmdline) in a loop, in a thread, and
    keeps those holding a secret: short-lived ones (sh, the probe, `run --detach`) too."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.secrets = [s.encode() for s in secrets]
        self.hits: list[str] = []
        self.scans = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CmdlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.scan()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.scan()

    def scan(self) -> None:
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # gone meanwhile
            if any(secret in cmdline for secret in self.secrets):
                self.hits.append(f"{entry.name}: {cmdline[:200]!r}")
        self.scans += 1


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


DAG_FILE = """\
from airflow.sdk import DAG

from streamkeeper_airflow.dag_factory import START_DATE
from streamkeeper_airflow.operators.start import StartJobOperator

with DAG(dag_id={dag_id!r}, schedule=None, start_date=START_DATE) as dag:
    StartJobOperator(task_id="start", **{arguments!r})
"""


def _start_dag(dag_id: str, place: JobPlace, options: dict[str, Any], **kwargs: Any) -> Any:
    """Run a one-task start DAG like the generated one, with the SSH launcher's options (the
    generated DAGs take no launcher_options). `dag.test()` runs only DAGs of the DAGs
    folder (this process's temporary one): the file is there for this run only."""
    arguments = {
        "job": JOB,
        "spec_path": str(SPEC),
        "launcher": "ssh",
        "launcher_options": {"ssh_conn_id": CONN_ID, "remote_python": sys.executable, **options},
        "overrides": place.overrides,
        "poll_interval": 1.0,
        "start_timeout": 600,
        **kwargs,
    }
    dag_file = Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / f"{dag_id.replace('.', '_')}.py"
    dag_file.write_text(DAG_FILE.format(dag_id=dag_id, arguments=arguments))
    try:
        return run_dag(dag_id)
    finally:
        dag_file.unlink()


def _exact(place: JobPlace) -> bool:
    totals, _ = expected_results(sorted(place.events.glob("events-*.json")))
    rows = read_table_rows(str(place.root / "tables" / "totals"))
    return {r["key"]: (r["events"], r["total"]) for r in rows} == totals


def _stop_through_the_control_plane(place: JobPlace, pid: int) -> None:
    stopped = run_dag(f"{JOB}.stop", mode="stop", savepoint=False)
    assert stopped.state == "success", stopped.tasks
    wait_for(lambda: not psutil.pid_exists(pid), 120, "the driver to exit")
    assert place.client().status(JOB).runner.state == "STOPPED"


def test_the_driver_runs_detached_on_the_gateway_and_outlives_ssh(
    place: JobPlace, gateway: Sshd, capfd: pytest.CaptureFixture[str]
) -> None:
    with CmdlineWatch(SECRETS) as watch:
        run = _start_dag("keyed-totals.ssh-start", place, {}, new_checkpoints=1)
    assert run.state == "success", run.tasks
    xcom = run.xcom
    assert xcom["start.start"]["action"] == "launched"
    record = launch_record(place.root, JOB)
    assert record["launcher"] == "ssh"
    assert record["host"] == os.uname().nodename  # as the gateway names itself
    report = place.client().status(JOB)
    assert report.state == "RUNNING" and report.runner.run_token == xcom["start"]["run_token"]
    pid = report.runner.pid
    assert watch.scans > 10 and watch.hits == [], watch.hits

    # Detached on the gateway: not under sshd, and its environment is the gateway's
    # (login environment, allow-listed) plus the connection's credentials.
    driver = psutil.Process(pid)
    assert gateway.process.pid not in [p.pid for p in driver.parents()]
    assert os.getsid(pid) != os.getsid(0)
    env = _environ(pid)
    assert env["AWS_SECRET_ACCESS_KEY"] == CANARY_SECRET and env["AWS_ACCESS_KEY_ID"] == CANARY_KEY
    assert env["STREAMKEEPER_GATEWAY_MARK"] == "set-on-the-gateway"
    assert "STREAMKEEPER_WORKER_ONLY" not in env  # the worker's variables stay there
    assert not [k for k in env if k.startswith("SSH_")]  # nor the SSH session's
    assert Path(record["log"]).is_file() and record["log"].startswith(str(place.work))

    # The SSH connection is closed and sshd itself goes away: the driver goes on.
    wait_for(lambda: not _sshd_sessions(gateway), 30, "the SSH session to end")
    gateway.stop(remove=False)
    since = time.time()
    write_event_files(place.events, files=1, events_per_file=200, first_file=3)
    wait_for(lambda: _committed_after(place, since), 180, "a checkpoint after sshd stopped")
    assert psutil.pid_exists(pid) and place.client().status(JOB).runner.pid == pid
    wait_for(lambda: _exact(place), 180, "the output to be exact")

    with CmdlineWatch(SECRETS) as watch:
        _stop_through_the_control_plane(place, pid)
    assert watch.hits == [], watch.hits
    logs = "".join(capfd.readouterr())
    for text in (logs, all_xcom_text(), Path(record["log"]).read_text(), str(record)):
        assert CANARY_SECRET not in text and CANARY_KEY not in text


def test_spark_submit_mode_starts_the_driver_detached_through_spark_submit(
    place: JobPlace, gateway: Sshd
) -> None:
    with CmdlineWatch(SECRETS) as watch:
        run = _start_dag(
            "keyed-totals.ssh-submit",
            place,
            {"mode": "spark_submit", "conf": {"spark.ui.enabled": "false"}},
            spark_master="local[2]",
            new_checkpoints=1,
        )
    assert run.state == "success", run.tasks
    assert watch.hits == [], watch.hits
    record = launch_record(place.root, JOB)
    assert record["log"].endswith(f"{JOB}.spark-submit.log")
    submitted = psutil.Process(record["pid"])  # the JVM spark-submit became
    assert os.getsid(submitted.pid) == submitted.pid  # setsid: a session of its own
    assert "org.apache.spark.deploy.SparkSubmit" in submitted.cmdline()
    report = place.client().status(JOB)
    assert report.state == "RUNNING" and report.runner.run_token == run.xcom["start"]["run_token"]
    assert submitted.pid in [p.pid for p in psutil.Process(report.runner.pid).parents()]
    wait_for(lambda: _exact(place), 180, "the output to be exact")
    _stop_through_the_control_plane(place, report.runner.pid)
    wait_for(lambda: not psutil.pid_exists(submitted.pid), 60, "spark-submit to exit")


def _sshd_sessions(gateway: Sshd) -> list[psutil.Process]:
    try:
        return psutil.Process(gateway.process.pid).children(recursive=True)
    except psutil.Error:
        return []


def _committed_after(place: JobPlace, since: float) -> bool:
    head = place.client().status(JOB).head
    return head is not None and (head.committed_at or 0) > since


# -- failures -------------------------------------------------------------------------------


def _request(tmp_path: Path, spec: Path = SPEC) -> LaunchRequest:
    return LaunchRequest(
        job=JOB,
        spec_path=str(spec),
        root=str(tmp_path / "data"),
        run_token="af-ssh-failure",
        workdir=str(tmp_path / "work"),
        env={"AWS_ACCESS_KEY_ID": CANARY_KEY, "AWS_SECRET_ACCESS_KEY": CANARY_SECRET},
    )


def _refusal(tmp_path: Path, request: LaunchRequest | None = None, **options: Any) -> str:
    launcher = launcher_for(
        "ssh", ssh_conn_id=CONN_ID, connect_attempts=1, connect_timeout=5, **options
    )
    with pytest.raises(LaunchError) as raised:
        launcher.launch(request or _request(tmp_path))
    message = str(raised.value)
    assert CANARY_SECRET not in message and CANARY_KEY not in message
    return message


def test_an_unreachable_gateway_is_a_clear_launch_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()  # nobody listens there
    conn = f'{{"conn_type": "ssh", "host": "127.0.0.1", "port": {port}, "login": "root"}}'
    monkeypatch.setenv(f"AIRFLOW_CONN_{CONN_ID.upper()}", conn)
    message = _refusal(tmp_path, remote_python=sys.executable)
    assert f"127.0.0.1:{port}" in message and "sshd runs there" in message
    assert "Connection refused" in message or "Unable to connect" in message
    monkeypatch.delenv(f"AIRFLOW_CONN_{CONN_ID.upper()}")
    undefined = _refusal(tmp_path)
    assert f"SSH connection {CONN_ID!r} is unusable" in undefined
    assert f"AIRFLOW_CONN_{CONN_ID.upper()}" in undefined


def test_a_bad_remote_python_or_no_pid_line_is_a_clear_launch_error(
    tmp_path: Path, gateway: Sshd
) -> None:
    missing = _refusal(tmp_path, remote_python="/opt/no-such/python3")
    assert "'/opt/no-such/python3' did not run on the gateway 127.0.0.1" in missing
    assert "exit 127" in missing and "remote_python" in missing

    bare = _refusal(tmp_path, remote_python="/usr/bin/python3")  # Debian's: no streamkeeper
    assert "streamkeeper does not import in /usr/bin/python3" in bare and "pip install" in bare

    # A wrapper that answers the probe but swallows the CLI's output.
    quiet = tmp_path / "quiet-python"
    quiet.write_text(
        f'#!/bin/sh\n[ "$1" = -c ] && exec {sys.executable} "$@"\necho "started, I think"\n'
    )
    quiet.chmod(0o755)
    no_pid = _refusal(tmp_path, remote_python=str(quiet))
    assert "printed no pid" in no_pid and "started, I think" in no_pid
    assert f"on the gateway {os.uname().nodename}" in no_pid

    slow = tmp_path / "slow-python"
    slow.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exec {sys.executable} "$@"\nsleep 6\n')
    slow.chmod(0o755)
    timed_out = _refusal(tmp_path, remote_python=str(slow), command_timeout=2)
    assert "gave no exit status within 2 s" in timed_out and "command_timeout" in timed_out

    bad_spec = _refusal(
        tmp_path, _request(tmp_path, spec=tmp_path / "none.yaml"), remote_python=sys.executable
    )
    assert "(exit 2)" in bad_spec and "none.yaml" in bad_spec and "not found" in bad_spec

    workdir = _refusal(tmp_path, remote_python=sys.executable, remote_workdir="/proc/no/such")
    assert "(exit 3)" in workdir and "remote_workdir" in workdir

    submit = _refusal(
        tmp_path,
        remote_python=sys.executable,
        mode="spark_submit",
        remote_spark_submit="/opt/no-such/spark-submit",
    )
    assert "needs a Spark master" in submit  # refused before anything runs
    with_master = replace(_request(tmp_path), master="local[1]")
    no_submit = _refusal(
        tmp_path,
        with_master,
        remote_python=sys.executable,
        mode="spark_submit",
        remote_spark_submit="/opt/no-such/spark-submit",
    )
    assert "(exit 127)" in no_submit and "remote_spark_submit" in no_submit
