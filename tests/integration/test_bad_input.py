"""Bad input fails fast, names the fix, and writes nothing: storage, spec and table schema."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from jobs.keyed_totals.sample_events import write_event_files
from streamkeeper.errors import StorageError
from streamkeeper.lineage.driver_beat import beat_key
from streamkeeper.storage import LocalStore, Location, S3Settings, probe
from tests.support.services import free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SAMPLE_SPEC = REPO / "jobs" / "keyed_totals" / "job.yaml"


def run_cli(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "streamkeeper", *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def unreachable_endpoint() -> str:
    return f"http://127.0.0.1:{free_port()}"


def test_probe_unreachable_endpoint_fails_fast() -> None:
    endpoint = unreachable_endpoint()
    settings = S3Settings(endpoint_url=endpoint, access_key="ak", secret_key="sk", allow_http=True)
    started = time.monotonic()
    with pytest.raises(StorageError) as caught:
        probe(Location("s3://bucket/prefix", settings))
    # A refused connection is retried for probe.RETRY_SECONDS (5 s), then reported.
    assert time.monotonic() - started < 10
    assert endpoint in str(caught.value) and "AWS_ENDPOINT_URL" in str(caught.value)


@pytest.mark.s3
def test_probe_accepts_the_real_server(s3_root: str) -> None:
    location = Location(s3_root, S3Settings.from_env())
    probe(location)
    assert location.store().list("_probe") == []


@pytest.mark.s3
def test_probe_wrong_secret_key(s3_root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret")
    with pytest.raises(StorageError) as caught:
        probe(Location(s3_root, S3Settings.from_env()))
    assert "refused the credentials" in str(caught.value)
    assert "AWS_SECRET_ACCESS_KEY" in str(caught.value)


@pytest.mark.s3
def test_probe_nonexistent_bucket(s3_env: dict[str, str]) -> None:
    bucket = f"no-such-bucket-{uuid.uuid4().hex[:8]}"
    with pytest.raises(StorageError) as caught:
        probe(Location(f"s3://{bucket}/prefix", S3Settings.from_env()))
    assert f"bucket {bucket!r} does not exist" in str(caught.value)
    assert s3_env["AWS_ENDPOINT_URL"] in str(caught.value)


def test_cli_malformed_spec_exits_2_naming_the_field(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(SAMPLE_SPEC.read_text().replace("interval: 1s", "intervall: 1s"))
    result = run_cli(
        ["run", str(spec), "--root", str(tmp_path / "root"), "--available-now"],
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "checkpoint.intervall" in result.stderr and "unknown field" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]  # nothing written


def test_cli_unreachable_storage_writes_nothing(tmp_path: Path) -> None:
    events = tmp_path / "events"
    write_event_files(events, files=1, events_per_file=10)
    endpoint = unreachable_endpoint()
    env = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "ak", "AWS_SECRET_ACCESS_KEY": "sk"}
    result = run_cli(
        [
            "run",
            str(SAMPLE_SPEC),
            "--root",
            "s3://bucket/prefix",
            "--available-now",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--set",
            f"source.path={events}",
        ],
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2  # a root that cannot be used is bad input (README)
    assert f"cannot reach object storage at {endpoint}" in result.stderr
    assert "AWS_ENDPOINT_URL" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events"]  # no checkpoint, no state


def create_table(uri: str, schema: pa.Schema) -> int:
    DeltaTable.create(uri, schema=schema)
    return DeltaTable(uri).version()


def test_cli_schema_mismatch_fails_before_any_commit(tmp_path: Path) -> None:
    events = tmp_path / "events"
    write_event_files(events, files=2, events_per_file=20)
    root = tmp_path / "root"
    totals, changes = str(root / "tables" / "totals"), str(root / "tables" / "changes")
    wrong = pa.schema([("key", pa.string()), ("events", pa.int64()), ("total", pa.string())])
    right = pa.schema([("key", pa.string()), ("events", pa.int64()), ("total", pa.int64())])
    before = {"totals": create_table(totals, wrong), "changes": create_table(changes, right)}

    result = run_cli(
        [
            "run",
            str(SAMPLE_SPEC),
            "--root",
            str(root),
            "--available-now",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--set",
            f"source.path={events}",
            "--run-token",
            "af-mismatch",
        ],
        cwd=tmp_path,
    )
    assert result.returncode != 0, result.stdout
    assert f"table {totals!r}" in result.stderr and "sink 'totals'" in result.stderr
    # Its starter, on any host, reads why it ended from the driver's beat.
    beat = LocalStore(root).read_json(beat_key("af-mismatch"))
    assert beat is not None and beat["state"] == "exited"
    assert beat["exit_code"] == result.returncode and "sink 'totals'" in beat["error"]
    assert beat["epoch"] is None  # it never ran as the job
    assert "total: table has" in result.stderr
    after = {"totals": DeltaTable(totals).version(), "changes": DeltaTable(changes).version()}
    assert after == before
    assert len(DeltaTable(changes).to_pyarrow_table()) == 0
    assert not (root / "lineages" / "keyed-totals" / "wal").exists()


def test_cli_run_beats_until_its_runner_takes_over_then_says_it_exited(tmp_path: Path) -> None:
    events = tmp_path / "events"
    write_event_files(events, files=1, events_per_file=10)
    root = tmp_path / "root"
    args = ["run", str(SAMPLE_SPEC), "--root", str(root), "--available-now"]
    args += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--set", f"source.path={events}"]
    result = run_cli([*args, "--run-token", "af-ok"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    beat = LocalStore(root).read_json(beat_key("af-ok"))
    heartbeat = LocalStore(root).read_json("jobs/keyed-totals/heartbeat.json") or {}
    assert beat is not None and beat["state"] == "exited" and beat["exit_code"] == 0
    assert beat["error"] is None and beat["seq"] >= 3  # booting, handed-over, exited
    assert beat["epoch"] == heartbeat.get("epoch") == 1  # handed over to epoch 1's heartbeat
