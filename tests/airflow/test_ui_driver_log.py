"""The driver-log route of the operations page (in-process): the tail of the log the
launch record names, only from the drivers' log folder of this host, secrets masked.

The launch record is read from storage, so whoever can write there must not make the
page read another file: each refusal below names where the log is and shows nothing of
the file it was pointed at. The browser test reads the route through a real Airflow
after a real start (test_ui_browser.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from streamkeeper.client import StreamkeeperClient
from streamkeeper_airflow.ui import driver_log
from streamkeeper_airflow.ui.app import create_app
from tests.unit.test_client import JOB, write_control_plane

SECRET = "canary-Secret-51d4b87f3a9c2e"


@pytest.fixture
def place(tmp_path: Path) -> Path:
    write_control_plane(tmp_path / "data")
    (tmp_path / "work" / ".streamkeeper" / "logs").mkdir(parents=True)
    return tmp_path


def _launched(place: Path, log: str, host: str | None = None) -> None:
    record = {
        "token": "t1",
        "job": JOB,
        "state": "launched",
        "requested_at": 1.0,
        "host": host or socket.gethostname(),
        "after_epoch": 0,
        "baseline_seq": -1,
        "log": log,
    }
    (place / "data" / "jobs" / JOB / "launch.json").write_text(json.dumps(record))


def _get(place: Path, job: str = JOB) -> tuple[int, str]:
    app = create_app(
        client_factory=lambda: StreamkeeperClient(str(place / "data")),
        secrets=lambda: [SECRET],
        authenticate=False,
        drivers_workdir=lambda: str(place / "work"),
    )
    reply = TestClient(app).get(f"/api/jobs/{job}/driver-log")
    return reply.status_code, reply.text


def test_the_tail_of_the_launched_drivers_log_with_secrets_masked(place: Path) -> None:
    log = place / "work" / ".streamkeeper" / "logs" / f"{JOB}.log"
    lines = [f"line {i}: committed batch {i}" for i in range(20_000)]
    lines[-2] = f"connected with password={SECRET}"
    log.write_text("\n".join(lines) + "\n")
    _launched(place, str(log))
    status, text = _get(place)
    assert status == 200
    body = text.split("\n", 1)[1]
    assert log.read_text().endswith(body.replace("***", SECRET))  # the file's own tail
    assert len(body.encode()) <= driver_log.MAX_BYTES and "line 0:" not in body
    assert lines[-1] in body and SECRET not in text
    assert f"of {log} on host {socket.gethostname()}" in text.splitlines()[0]


@pytest.mark.parametrize(
    "where",
    ["outside the folder", "symlink out of it", "dot-dot out of it", "not a log file"],
)
def test_a_record_pointing_elsewhere_reads_nothing(place: Path, where: str) -> None:
    logs = place / "work" / ".streamkeeper" / "logs"
    secret_file = place / "secret.log"
    secret_file.write_text(f"private {SECRET}-other\n")
    pointed = {
        "outside the folder": secret_file,
        "symlink out of it": logs / "link.log",
        "dot-dot out of it": logs / ".." / ".." / ".." / "secret.log",
        "not a log file": logs / "spec.yaml",
    }[where]
    (logs / "link.log").symlink_to(secret_file)
    (logs / "spec.yaml").write_text("private: yes\n")
    _launched(place, str(pointed))
    status, text = _get(place)
    assert status == 404 and "private" not in text
    assert "outside the drivers' log folder" in text and "[streamkeeper] workdir" in text


def test_a_driver_on_another_host_is_named_not_read(place: Path) -> None:
    log = place / "work" / ".streamkeeper" / "logs" / f"{JOB}.log"
    log.write_text("from this host\n")
    _launched(place, str(log), host="gateway-7")
    status, text = _get(place)
    assert status == 404 and "from this host" not in text
    assert f"the driver's log is {log} on host gateway-7; it shipped none" in text


def test_a_driver_on_another_host_is_read_from_what_it_shipped(place: Path) -> None:
    """A real driver beat ships its own log (its stderr is a file) to the control plane;
    the page serves that for a launch on another host, secrets masked."""
    log = place / "gateway-disk" / f"{JOB}.log"
    log.parent.mkdir()
    log.write_text("an earlier run's line\n")
    script = (
        "import sys; from pathlib import Path\n"
        "from streamkeeper.lineage.driver_beat import DriverBeat\n"
        "from streamkeeper.storage import LocalStore\n"
        "beat = DriverBeat(LocalStore(Path(sys.argv[1])), 't1', sys.argv[2]).start()\n"
        f"print('driver line with {SECRET}', file=sys.stderr, flush=True)\n"
        "beat.close(0)\n"
    )
    with open(log, "ab") as stderr:
        subprocess.run(
            [sys.executable, "-c", script, str(place / "data"), JOB], stderr=stderr, check=True
        )
    _launched(place, str(log), host="gateway-7")
    status, text = _get(place)
    assert status == 200, text
    assert f"of {log} on host gateway-7, as the driver shipped them at" in text
    assert "driver line with" in text and SECRET not in text and "***" in text
    assert "an earlier run's line" not in text  # this run's output only


def test_a_shipped_log_is_found_by_token_never_by_a_path(place: Path) -> None:
    _launched(place, "/etc/passwd.log", host="gateway-7")
    record = json.loads((place / "data" / "jobs" / JOB / "launch.json").read_text())
    record["token"] = "../../etc/passwd"
    (place / "data" / "jobs" / JOB / "launch.json").write_text(json.dumps(record))
    status, text = _get(place)
    assert status == 404 and "it shipped none" in text and "root:" not in text


def test_no_launch_and_unknown_jobs(place: Path) -> None:
    status, text = _get(place)
    assert status == 404 and "no driver of" in text and "launched through Airflow" in text
    assert _get(place, "no-such-job")[0] == 404
