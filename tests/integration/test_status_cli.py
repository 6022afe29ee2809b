"""What a new user sees: the sample job run to completion and restarted with no new input,
then looked at with `streamkeeper status`, `checkpoints` and `jobs` in a subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jobs.keyed_totals.sample_events import write_event_files
from streamkeeper.client import StreamkeeperClient
from streamkeeper.runtime.runner import RunOptions, resolve_paths, run_job
from streamkeeper.spec import JobSpec
from tests.conftest import SAMPLE_SPEC
from tests.support.specs import local_spec

pytestmark = pytest.mark.integration

JOB = "keyed-totals"


def _spec(tmp_path: Path, **overrides: object) -> JobSpec:
    return local_spec(tmp_path, SAMPLE_SPEC, **overrides)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`streamkeeper ARGS` as a user runs it (not on a terminal: no progress drawn)."""
    return subprocess.run(
        [sys.executable, "-m", "streamkeeper", *args],
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    )


class Recorder:
    """A progress listener that keeps what the runner told it."""

    def __init__(self) -> None:
        self.batches: dict[tuple[str, int], int] = {}
        self.committed = 0

    def restore(self, done: int, total: int) -> None:  # pragma: no cover - no restore here
        pass

    def query(self, progresses: list[dict[str, Any]], committed: int) -> None:
        for p in progresses:
            self.batches[(p["runId"], p["batchId"])] = p["numInputRows"]
        self.committed = max(self.committed, committed)


def _markers(spec: JobSpec) -> list[dict]:
    paths = resolve_paths(spec)
    store = paths.root.store()
    return [store.read_json(k) for k in store.list(paths.layout.markers)]


def test_a_finished_job_restarted_without_input_reports_where_its_lineage_stands(
    tmp_path: Path,
) -> None:
    write_event_files(tmp_path / "events", files=3, events_per_file=200)
    spec = _spec(tmp_path)
    recorder = Recorder()
    options = RunOptions(available_now=True, spec_dir=SAMPLE_SPEC.parent, progress=recorder)
    assert run_job(spec, options).batches == 3
    assert sorted(recorder.batches.values()) == [200, 200, 200]  # each batch reported once
    assert recorder.committed == 3
    for _ in range(2):  # a user runs it again: nothing new
        assert (
            run_job(spec, RunOptions(available_now=True, spec_dir=SAMPLE_SPEC.parent)).batches == 0
        )
    markers = _markers(spec)
    head = markers[-1]
    root = str(tmp_path / "data")

    status = cli("status", JOB, "--root", root, "--json")
    assert status.returncode == 0, status.stderr
    data = json.loads(status.stdout)
    assert (data["last_committed_seq"], data["last_committed_batch"]) == (
        head["seq"],
        head["batch_id"],
    )
    assert data["last_commit_at"] == head["committed_at"]
    assert data["state"] == "STOPPED" and data["healthy"] is True
    assert data["reason"].startswith("finished ") and " ago, all input processed" in data["reason"]
    assert data["runner"]["state"] == "FINISHED"
    assert data["runner"]["reason"] == "all input processed (nothing new)"
    assert set(data["tables"]) == {"totals", "changes"}

    table = cli("status", JOB, "--root", root)
    assert table.returncode == 0 and "finished" in table.stdout
    assert f"last committed checkpoint (seq) │ {head['seq']}" in table.stdout

    history = cli("checkpoints", JOB, "--root", root, "--last", "5", "--json")
    assert history.returncode == 0, history.stderr
    rows = json.loads(history.stdout)["checkpoints"]
    assert [r["checkpoint_id"] for r in rows] == [m["seq"] for m in markers]  # no phantoms
    assert [r["batch_id"] for r in rows] == [m["batch_id"] for m in markers]
    assert [r["input_rows"] for r in rows] == [200, 200, 200]
    assert cli("checkpoints", JOB, "--root", root, "--last", "5").returncode == 0

    unknown = cli("status", "nope", "--root", root)
    assert unknown.returncode == 2
    assert "no job 'nope'" in unknown.stderr and JOB in unknown.stderr

    jobs = cli("jobs", "--root", root, "--json")
    assert [(j["job"], j["last_committed_seq"]) for j in json.loads(jobs.stdout)["jobs"]] == [
        (JOB, head["seq"])
    ]
    assert JOB in cli("jobs", "--root", root).stdout
    assert cli("status", JOB, "--root", root, "--check").returncode == 0


def test_a_run_stopped_by_sigterm_says_so(tmp_path: Path) -> None:
    write_event_files(tmp_path / "events", files=2, events_per_file=100)
    spec = _spec(tmp_path, **{"checkpoint.interval": "200ms"})

    def stop_after_the_first_checkpoint() -> None:
        deadline = time.monotonic() + 120
        while not _markers(spec) and time.monotonic() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)  # what `kill PID` does to a runner

    previous = signal.getsignal(signal.SIGTERM)
    stopper = threading.Thread(target=stop_after_the_first_checkpoint, daemon=True)
    stopper.start()
    try:
        run_job(spec, RunOptions(spec_dir=SAMPLE_SPEC.parent))
    finally:
        signal.signal(signal.SIGTERM, previous)
        stopper.join()
    report = StreamkeeperClient(str(tmp_path / "data")).status(JOB)
    assert report.runner is not None and report.runner.state == "STOPPED"
    assert report.state == "STOPPED" and "ago: SIGTERM received" in report.reason
    assert report.head is not None and report.head.seq == _markers(spec)[-1]["seq"]


def test_a_sigterm_while_spark_starts_stops_the_run_before_its_query(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamkeeper.runtime import runner

    write_event_files(tmp_path / "events", files=2, events_per_file=100)
    spec = _spec(tmp_path)
    start_spark = runner.build_session

    def start_spark_then_sigterm(*args: Any, **kwargs: Any) -> Any:
        session = start_spark(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # arrives before the query exists
        return session

    monkeypatch.setattr(runner, "build_session", start_spark_then_sigterm)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        result = run_job(spec, RunOptions(spec_dir=SAMPLE_SPEC.parent))
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.batches == 0
    assert _markers(spec) == []  # no batch ran
    report = StreamkeeperClient(str(tmp_path / "data")).status(JOB)
    assert report.runner is not None and report.runner.state == "STOPPED"
    assert "SIGTERM received" in report.reason


@pytest.mark.s3
def test_the_client_and_cli_read_a_control_plane_on_s3(s3_root: str) -> None:
    from typer.testing import CliRunner

    from streamkeeper.cli import app
    from tests.unit.test_client import write_control_plane

    write_control_plane(s3_root, seqs=range(12), history_files=3)
    write_control_plane(s3_root, job="other-job", seqs=range(2), history_files=1)
    client = StreamkeeperClient(s3_root)
    assert client.jobs() == [JOB, "other-job"]
    report = client.status(JOB)
    assert (report.head.seq, report.head.batch_id) == (11, 11)
    assert [c.checkpoint_id for c in client.history(JOB, last=3)] == [9, 10, 11]
    runner = CliRunner()
    data = json.loads(runner.invoke(app, ["status", JOB, "--root", s3_root, "--json"]).stdout)
    assert data["last_committed_seq"] == 11 and data["root"] == s3_root
    unknown = runner.invoke(app, ["status", "nope", "--root", s3_root])
    assert unknown.exit_code == 2 and "keyed-totals, other-job" in unknown.stderr
