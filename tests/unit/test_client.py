"""The pyspark-free client, the history table's reading, and the CLI over a control plane
written here by hand (what a runner leaves behind), on local storage."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake
from typer.testing import CliRunner

from streamkeeper.cli import app
from streamkeeper.client import StreamkeeperClient, UnknownJobError
from streamkeeper.lineage.layout import seq_name
from streamkeeper.observability.health import HEARTBEAT_LOST_AFTER
from streamkeeper.observability.history import (
    CheckpointHistory,
    CheckpointRecord,
    record_from_progress,
)
from streamkeeper.storage import LocalStore, Location, S3Settings

REPO = Path(__file__).resolve().parents[2]
JOB = "keyed-totals"
NOW = 1_800_000_000.0

STATUS_FIELDS = {
    "job", "lineage", "root", "state", "healthy", "heartbeat_lost", "reason", "last_committed_seq",
    "last_committed_batch", "last_commit_at", "runner", "pending_commits",
    "consecutive_failures", "tolerable_failures", "failed_checkpoints", "last_failure",
    "rewind_pending", "tables", "checked_at",
}  # fmt: skip
RUNNER_FIELDS = {"state", "reason", "pid", "host", "epoch", "heartbeat_at", "run_token", "spark_ui"}
CHECKPOINT_FIELDS = {
    "checkpoint_id", "batch_id", "trigger_time", "duration_ms", "latest_offset_ms",
    "planning_ms", "write_ms", "wal_commit_ms", "commit_offsets_ms", "input_rows",
    "input_rows_per_second", "processed_rows_per_second", "source_offsets", "state_rows",
    "state_bytes", "state_operators", "visibility_delay_ms", "bytes_uploaded", "query_id",
    "run_id",
}  # fmt: skip


def _progress(batch: int, rows: int = 100) -> dict:
    return {
        "batchId": batch,
        "id": "q",
        "runId": "r",
        "timestamp": f"2027-01-15T08:00:{batch % 60:02d}.000Z",
        "numInputRows": rows,
        "inputRowsPerSecond": 50.0,
        "processedRowsPerSecond": 60.0,
        "durationMs": {"triggerExecution": 40, "addBatch": 30},
        "sources": [{"description": "FileStreamSource", "startOffset": None, "endOffset": 1}],
        "stateOperators": [{"operatorName": "agg", "numRowsTotal": 7, "memoryUsedBytes": 9}],
    }


def _record(seq: int, batch: int) -> CheckpointRecord:
    return record_from_progress(_progress(batch), commit_seq=seq, bytes_uploaded=seq * 10)


def write_control_plane(
    root: Path | str,
    *,
    seqs: range = range(40),
    heartbeat: dict | None = None,
    job: str = JOB,
    history_files: int = 4,
) -> Path | str:
    """What a job that committed `seqs` (batch = seq) leaves below the root (a path or URI)."""
    location = Location(str(root), S3Settings.from_env())
    store = location.store()
    store.write_json(
        f"jobs/{job}/job.json",
        {
            "job": job,
            "lineage": job,
            "root": location.uri,
            "checkpoint_dir": "/tmp/ck",
            "interval": 1.0,
            "timeout": 600.0,
            "max_concurrent": 2,
            "tables": {"totals": {"table": f"{location.uri}/tables/totals", "output": "merge"}},
            "started_at": NOW - 3600,
            "epoch": 3,
        },
    )
    beat = {
        "job": job,
        "lineage": job,
        "pid": 4242,
        "host": "h1",
        "epoch": 3,
        "state": "FINISHED",
        "reason": "all input processed (nothing new)",
        "time": NOW - 23 * 60,
        # The last run committed nothing: its own counters say -1, the lineage does not.
        "last_committed_seq": -1,
        "last_committed_batch": -1,
        "pending_commits": 0,
        "consecutive_failures": 0,
        "tolerable_failures": 0,
        "failed_checkpoints": 0,
        "last_failure": None,
        "interval": 1.0,
        "timeout": 600.0,
        **(heartbeat or {}),
    }
    store.write_json(f"jobs/{job}/heartbeat.json", beat)
    for seq in seqs:
        store.write_json(
            f"lineages/{job}/markers/{seq_name(seq)}.json",
            {
                "seq": seq,
                "batch_id": seq,
                "versions": {"totals": seq + 2},
                "committed_at": NOW - 1400 + seq,
            },
        )
    history = CheckpointHistory(location.child(f"lineages/{job}/history"))
    size = max(1, -(-len(seqs) // history_files))  # a file per flush, as a runner appends
    for start in range(0, len(seqs), size):
        history.append([_record(seq, seq) for seq in seqs[start : start + size]])
    return root


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write_control_plane(tmp_path / "data")


# -- the client ------------------------------------------------------------------------


def test_status_is_the_lineages_head_not_the_last_runs_counters(root: Path) -> None:
    report = StreamkeeperClient(str(root)).status(JOB, now=NOW)
    assert (report.head.seq, report.head.batch_id) == (39, 39)
    assert report.head.committed_at == NOW - 1400 + 39
    assert report.state == "STOPPED" and report.healthy
    assert report.reason == "finished 23 min ago, all input processed (nothing new)"
    assert report.runner is not None and report.runner.state == "FINISHED"
    data = report.to_json()
    assert set(data) == STATUS_FIELDS and set(data["runner"]) == RUNNER_FIELDS
    assert (data["last_committed_seq"], data["last_committed_batch"]) == (39, 39)
    assert data["tables"] == {"totals": str(root / "tables/totals")}
    json.dumps(data)  # JSON as it is


def test_the_head_is_found_near_the_heartbeats_seq_without_listing_every_marker(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    LocalStore(root).write_json(
        f"jobs/{JOB}/heartbeat.json",
        {"state": "RUNNING", "time": NOW, "last_committed_seq": 38, "lineage": JOB},
    )
    listed: list[str | None] = []
    original = LocalStore.list

    def spy(self: LocalStore, prefix: str, start_after: str | None = None) -> list[str]:
        if prefix.endswith("markers"):
            listed.append(start_after)
        return original(self, prefix, start_after)

    monkeypatch.setattr(LocalStore, "list", spy)
    report = StreamkeeperClient(str(root)).status(JOB, now=NOW)
    assert report.head.seq == 39
    assert listed and None not in listed  # never the whole folder


def test_a_lineage_that_never_committed_has_no_head(tmp_path: Path) -> None:
    root = write_control_plane(tmp_path / "data", seqs=range(0), history_files=1)
    report = StreamkeeperClient(str(root)).status(JOB, now=NOW)
    assert report.head is None and report.to_json()["last_committed_seq"] is None
    assert StreamkeeperClient(str(root)).history(JOB) == []


def test_an_unknown_job_names_the_jobs_there_are(root: Path) -> None:
    write_control_plane(root, job="other-job", seqs=range(2), history_files=1)
    client = StreamkeeperClient(str(root))
    assert client.jobs() == [JOB, "other-job"]
    for call in (client.status, client.history, client.job_record):
        with pytest.raises(UnknownJobError) as caught:
            call("nope")
        assert "'nope'" in str(caught.value)
        assert "keyed-totals, other-job" in str(caught.value)
    with pytest.raises(UnknownJobError, match="jobs there"):
        client.status("../keyed-totals")  # not a job name: never a path


def test_a_root_without_jobs_says_to_check_the_root(tmp_path: Path) -> None:
    with pytest.raises(UnknownJobError, match="no job has run under this root; check --root"):
        StreamkeeperClient(str(tmp_path)).status(JOB)


def test_history_has_one_row_per_commit_seq_with_its_batch(root: Path) -> None:
    rows = StreamkeeperClient(str(root)).history(JOB, last=5)
    assert [r.checkpoint_id for r in rows] == [35, 36, 37, 38, 39]
    assert [r.batch_id for r in rows] == [35, 36, 37, 38, 39]
    assert rows[-1].bytes_uploaded == 390
    assert rows[-1].state_operators[0]["operator"] == "agg"  # parsed, not a JSON string
    assert set(rows[-1].to_json()) == CHECKPOINT_FIELDS


def test_job_record(root: Path) -> None:
    record = StreamkeeperClient(str(root)).job_record(JOB)
    assert record.lineage == JOB and record.tables["totals"].output == "merge"
    assert record.to_json()["tables"]["totals"]["table"] == str(root / "tables/totals")


def test_the_client_never_imports_pyspark(root: Path) -> None:
    code = (
        "import sys\n"
        "from streamkeeper.client import StreamkeeperClient\n"
        f"c = StreamkeeperClient({str(root)!r})\n"
        f"c.jobs(); c.status({JOB!r}); c.history({JOB!r}); c.job_record({JOB!r})\n"
        "assert 'pyspark' not in sys.modules, 'pyspark imported'\n"
        "assert 'streamkeeper.runtime' not in sys.modules\n"
    )
    env = {"PYTHONPATH": f"{REPO / 'src'}:{REPO}", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# -- the history table -----------------------------------------------------------------


def test_an_older_history_table_keeps_working(tmp_path: Path) -> None:
    """Before batch_id: checkpoint_id held the batch id, and idle triggers had rows too."""
    location = Location(str(tmp_path / "history"))
    old = [
        {"checkpoint_id": 0, "commit_seq": 10, "trigger_time": "a", "input_rows": 5},
        {"checkpoint_id": 1, "commit_seq": 11, "trigger_time": "b", "input_rows": 5},
        {"checkpoint_id": 2, "commit_seq": None, "trigger_time": "c", "input_rows": 0},
        {"checkpoint_id": 2, "commit_seq": None, "trigger_time": "d", "input_rows": 0},
    ]
    schema = pa.schema(
        [("checkpoint_id", pa.int64()), ("commit_seq", pa.int64()),
         ("trigger_time", pa.string()), ("input_rows", pa.int64())]
    )  # fmt: skip
    write_deltalake(location.uri, pa.Table.from_pylist(old, schema=schema), mode="append")
    history = CheckpointHistory(location)
    history.append([_record(12, 0)])  # after a checkpoint reset: batch 0 again, seq 12
    rows = history.read()
    assert [(r["checkpoint_id"], r["batch_id"]) for r in rows] == [(10, 0), (11, 1), (12, 0)]


def test_reading_the_last_rows_reads_only_the_newest_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = CheckpointHistory(Location(str(tmp_path / "history")))
    for seq in range(12):
        history.append([_record(seq, seq)])  # one file per append
    opened: list[str] = []
    original = CheckpointHistory._read_file

    def spy(self: CheckpointHistory, path: str) -> list[dict]:
        opened.append(path)
        return original(self, path)

    monkeypatch.setattr(CheckpointHistory, "_read_file", spy)
    assert [r["checkpoint_id"] for r in history.read(last=3)] == [9, 10, 11]
    assert len(opened) == 3
    assert len(history.read()) == 12


# -- the CLI ---------------------------------------------------------------------------


def _beating(root: Path, seconds_ago: float) -> None:
    """The runner's last beat, RUNNING, `seconds_ago` before the wall clock's now."""
    write_control_plane(
        root, seqs=range(3), heartbeat={"state": "RUNNING", "time": time.time() - seconds_ago}
    )


def test_a_lost_heartbeat_is_flagged_apart_from_a_recorded_failure(tmp_path: Path) -> None:
    _beating(tmp_path, seconds_ago=45)
    lost = StreamkeeperClient(str(tmp_path)).status(JOB)
    assert (lost.state, lost.heartbeat_lost, lost.to_json()["heartbeat_lost"]) == (
        "FAILED",
        True,
        True,
    )
    assert lost.reason.startswith("heartbeat lost")
    write_control_plane(tmp_path, seqs=range(3), heartbeat={"state": "FAILED", "time": NOW})
    recorded = StreamkeeperClient(str(tmp_path)).status(JOB)
    assert (recorded.state, recorded.heartbeat_lost) == ("FAILED", False)


def test_a_settled_status_waits_out_a_lately_lost_heartbeat_until_the_runner_beats(
    tmp_path: Path,
) -> None:
    """A runner cut off from storage beats again after the outage: a decision taken on
    the settled status sees it RUNNING, not presumed dead."""
    _beating(tmp_path, seconds_ago=35)
    client = StreamkeeperClient(str(tmp_path))
    assert client.status(JOB).heartbeat_lost
    beats_again = threading.Timer(1.5, _beating, (tmp_path, 0.0))
    beats_again.start()
    began = time.monotonic()
    report = client.settled_status(JOB, poll=0.1)
    beats_again.join()
    assert report.state == "RUNNING" and not report.heartbeat_lost, report.reason
    assert time.monotonic() - began >= 1.4  # it did wait for the beat


def test_a_settled_status_answers_at_once_for_a_runner_silent_past_the_grace(
    tmp_path: Path,
) -> None:
    _beating(tmp_path, seconds_ago=HEARTBEAT_LOST_AFTER + 31)
    began = time.monotonic()
    report = StreamkeeperClient(str(tmp_path)).settled_status(JOB, grace=30, poll=0.1)
    assert report.heartbeat_lost and time.monotonic() - began < 1.0


def test_a_settled_status_gives_up_at_the_end_of_the_grace(tmp_path: Path) -> None:
    _beating(tmp_path, seconds_ago=HEARTBEAT_LOST_AFTER + 1)
    began = time.monotonic()
    report = StreamkeeperClient(str(tmp_path)).settled_status(JOB, grace=2.0, poll=0.1)
    waited = time.monotonic() - began
    assert report.heartbeat_lost and report.state == "FAILED"
    assert 0.5 < waited < 4.0, waited  # the grace's last second, then the presumption


def _cli(*args: str) -> object:
    return CliRunner(env={"COLUMNS": "200"}).invoke(app, list(args))


def test_cli_status_json_and_check(root: Path) -> None:
    result = _cli("status", JOB, "--root", str(root), "--json", "--check")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert set(data) == STATUS_FIELDS
    assert (data["state"], data["last_committed_seq"], data["last_committed_batch"]) == (
        "STOPPED",
        39,
        39,
    )
    assert data["reason"].startswith("finished ") and "all input processed" in data["reason"]


def test_cli_status_check_exits_1_when_unhealthy(root: Path) -> None:
    LocalStore(root).write_json(
        f"jobs/{JOB}/heartbeat.json",
        {"state": "FAILED", "reason": "QueryFailedError: boom", "time": NOW, "lineage": JOB},
    )
    result = _cli("status", JOB, "--root", str(root), "--check")
    assert result.exit_code == 1
    assert "FAILED" in result.stdout and "QueryFailedError: boom" in result.stdout
    assert _cli("status", JOB, "--root", str(root)).exit_code == 0  # without --check: 0


def test_cli_status_table_shows_the_head_and_the_runner(root: Path) -> None:
    result = _cli("status", JOB, "--root", str(root))
    assert result.exit_code == 0, result.output
    assert "last committed checkpoint (seq) │ 39" in result.stdout
    assert "FINISHED" in result.stdout and "all input processed" in result.stdout


def test_status_names_a_rollback_left_halfway_and_what_to_do(root: Path) -> None:
    assert StreamkeeperClient(str(root)).status(JOB, now=NOW).rewind_pending is None
    halfway = {"savepoint": "sp-0042", "seq": 30, "epoch": 7, "at": NOW - 60}
    LocalStore(root).write_json(f"jobs/{JOB}/rewind-pending.json", halfway)

    result = _cli("status", JOB, "--root", str(root), "--json", "--check")
    assert result.exit_code == 1  # STOPPED, but no start may run until the rollback ends
    data = json.loads(result.stdout)
    assert (data["state"], data["healthy"], data["rewind_pending"]) == ("STOPPED", False, halfway)
    table = _cli("status", JOB, "--root", str(root)).stdout
    assert "rollback left halfway" in table and "run the rollback again" in table
    assert "--from-savepoint" not in table  # tables not all restored: no start may run

    restored = {**halfway, "marker_seq": 41}  # every table restored, blue not started
    LocalStore(root).write_json(f"jobs/{JOB}/rewind-pending.json", restored)
    assert _cli("status", JOB, "--root", str(root), "--check").exit_code == 1
    table = _cli("status", JOB, "--root", str(root)).stdout
    assert "--from-savepoint sp-0042 --takeover" in table


def test_cli_unknown_job_is_exit_2_naming_the_real_ones(root: Path) -> None:
    for command in ("status", "checkpoints"):
        result = _cli(command, "nope", "--root", str(root))
        assert result.exit_code == 2
        assert "no job 'nope'" in result.stderr and JOB in result.stderr


def test_cli_jobs_lists_every_job_with_its_status(root: Path) -> None:
    write_control_plane(root, job="other-job", seqs=range(2), history_files=1)
    table = _cli("jobs", "--root", str(root))
    assert table.exit_code == 0, table.output
    assert JOB in table.stdout and "other-job" in table.stdout and "STOPPED" in table.stdout
    data = json.loads(_cli("jobs", "--root", str(root), "--json").stdout)
    assert data["root"] == str(root)
    assert [(j["job"], j["last_committed_seq"]) for j in data["jobs"]] == [
        (JOB, 39),
        ("other-job", 1),
    ]
    (root / "nothing-here").mkdir()
    empty = _cli("jobs", "--root", str(root / "nothing-here"))
    assert empty.exit_code == 0 and "no jobs under" in empty.stdout
    missing = _cli("jobs", "--root", str(root / "no-such-root"))
    assert missing.exit_code == 2, missing.output
    assert "no-such-root' does not exist" in missing.stderr and "storage.root" in missing.stderr


def test_cli_checkpoints_json_and_table(root: Path) -> None:
    data = json.loads(_cli("checkpoints", JOB, "--root", str(root), "--last", "3", "--json").stdout)
    assert (data["job"], data["lineage"]) == (JOB, JOB)
    assert [c["checkpoint_id"] for c in data["checkpoints"]] == [37, 38, 39]
    assert all(set(c) == CHECKPOINT_FIELDS for c in data["checkpoints"])
    table = _cli("checkpoints", JOB, "--root", str(root), "--last", "3")
    assert table.exit_code == 0 and "id = commit seq" in table.stdout
    assert _cli("checkpoints", JOB, "--root", str(root), "--last", "0").exit_code == 2
