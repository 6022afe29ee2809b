"""A canary credential never leaves its store.

SeaweedFS is started with a canary access key and secret, and the only place the test
process knows them from is the Airflow connection (no AWS_* variable is set). The job
then lives a whole life through its DAGs on that S3 root: start, savepoint, the
operations page's API, stop with a savepoint. Afterwards every byte the life produced is
searched for the canary: every object under the root (Parquet files decoded too: their
pages are compressed), every file under the test's folders (the driver's log, Spark's
checkpoint, the launch records, the alerts), Airflow's home (the SQLite metadata DB with
its XComs, task logs), the captured output of the DAG runs, and the page's responses.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobs.keyed_totals.sample_events import write_event_files
from tests.airflow.conftest import CANARY_KEY, CANARY_SECRET
from tests.airflow.test_dag_runs import JOB, JobPlace, run_dag
from tests.support.airflow_runs import all_xcom_text, stop_driver

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.s3]

BUCKET = "canary"
CANARIES = (CANARY_KEY.encode(), CANARY_SECRET.encode())


@pytest.fixture(scope="module")
def canary_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A SeaweedFS whose only credential is the canary (its own folder is its store)."""
    from tests.support.services import start_seaweedfs

    folder = tmp_path_factory.mktemp("canary-s3")
    server = start_seaweedfs(folder, BUCKET, CANARY_KEY, CANARY_SECRET)
    yield server
    server.stop()


@pytest.fixture
def s3_place(
    tmp_path: Path,
    canary_s3: Any,
    conn_env: Any,
    monkeypatch: pytest.MonkeyPatch,
    airflow_db: float,
) -> Iterator[JobPlace]:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)  # the connection is the only way to the credential
    place = JobPlace(
        root=tmp_path / "unused-local-root",
        work=tmp_path / "work",
        events=tmp_path / "events",
        alerts=tmp_path / "alerts.jsonl",
        checkpoint=tmp_path / "checkpoint",
    )
    write_event_files(place.events, files=3, events_per_file=200)
    root = f"s3://{BUCKET}/{tmp_path.name}"
    conn_env("streamkeeper_default", root, host=canary_s3.endpoint_url)
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__WORKDIR", str(place.work))
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__TRIGGER_OVERRIDES", "source.path, checkpoint.dir")
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__ALERT_SINK", str(place.alerts))
    monkeypatch.setenv("STREAMKEEPER_SPARK_LOG_LEVEL", "ERROR")
    place.root = root  # type: ignore[assignment] - an S3 root for this test
    yield place
    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook

    store = StreamkeeperHook().store  # the launch record, then the heartbeat, name the pid
    for name in ("launch.json", "heartbeat.json"):
        stop_driver((store.read_json(f"jobs/{JOB}/{name}") or {}).get("pid"))


def _bucket_objects(server: Any, prefix: str) -> dict[str, bytes]:
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=server.endpoint_url,
        aws_access_key_id=CANARY_KEY,
        aws_secret_access_key=CANARY_SECRET,
        region_name="us-east-1",
    )
    found = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for item in page.get("Contents", []):
            found[item["Key"]] = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
    return found


def _decoded(name: str, body: bytes) -> bytes:
    """The bytes, and for a Parquet file its rows as text (its pages are compressed)."""
    if not name.endswith(".parquet"):
        return body
    import pyarrow.parquet as pq

    rows = pq.read_table(io.BytesIO(body)).to_pylist()
    return body + json.dumps(rows, default=str).encode()


def _files_below(folder: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _airflow_home_files(home: Path, scratch: Path) -> dict[str, bytes]:
    """AIRFLOW_HOME's files (the SQLite DB with its WAL, task logs), read from a copy.

    The copy is made by another process: closing any descriptor of the DB in this one
    drops the POSIX locks its SQLite connections hold. Airflow's components, started
    later by another test on this worker, would then take the WAL for unused and
    reset it, and this process's next query would read a "malformed" database.
    """
    copy = scratch / "airflow-home-copy"
    subprocess.run(["cp", "-a", str(home), str(copy)], check=True)
    return {
        str(home / name[len(str(copy)) + 1 :]): body for name, body in _files_below(copy).items()
    }


def _leaks(artifacts: dict[str, bytes]) -> list[str]:
    return [name for name, body in artifacts.items() if any(c in body for c in CANARIES)]


def test_the_canary_credential_is_in_no_artifact_of_a_jobs_life(
    s3_place: JobPlace,
    canary_s3: Any,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    capfd: pytest.CaptureFixture[str],
) -> None:
    from fastapi.testclient import TestClient

    from streamkeeper_airflow.hooks.streamkeeper import StreamkeeperHook
    from streamkeeper_airflow.ui.app import create_app

    started = run_dag(f"{JOB}.start", overrides=s3_place.overrides, new_checkpoints=2)
    assert started.state == "success", started.tasks
    savepoint = run_dag(f"{JOB}.savepoint")
    assert savepoint.state == "success", savepoint.tasks

    page = TestClient(
        create_app(client_factory=lambda: StreamkeeperHook().client, authenticate=False)
    )
    responses = {
        url: page.get(url)
        for url in ("/api/jobs", f"/api/jobs/{JOB}", f"/api/jobs/{JOB}?window=1000")
    }
    assert all(r.status_code == 200 for r in responses.values()), responses
    assert responses[f"/api/jobs/{JOB}"].json()["savepoints"]  # the page read the S3 root
    assert responses["/api/jobs"].json()["jobs"][0]["state"] == "RUNNING"

    stopped = run_dag(f"{JOB}.stop")
    assert stopped.state == "success", stopped.tasks

    objects = _bucket_objects(canary_s3, f"{tmp_path.name}/")
    names = {key.rsplit("/", 1)[-1] for key in objects}
    assert {"heartbeat.json", "job.json", "launch.json"} <= names, sorted(names)
    for part in ("/markers/", "/history/", "/savepoints/", "/_delta_log/"):
        assert any(part in key for key in objects), (part, sorted(objects)[:20])
    artifacts = {f"s3://{BUCKET}/{k}": _decoded(k, body) for k, body in objects.items()}
    artifacts |= _files_below(tmp_path)
    home_files = _airflow_home_files(
        Path(os.environ["AIRFLOW_HOME"]), tmp_path_factory.mktemp("home")
    )
    assert any(name.endswith("airflow.db") for name in home_files), sorted(home_files)
    artifacts |= home_files
    artifacts["captured output"] = "".join(capfd.readouterr()).encode()
    artifacts["xcom"] = all_xcom_text().encode()
    artifacts |= {f"GET {url}": r.content for url, r in responses.items()}

    assert any(str(tmp_path / "work") in name for name in artifacts)  # the driver's log
    assert not _leaks(artifacts), _leaks(artifacts)
    # The search can fail: a copy planted in an artifact is found.
    planted = dict(artifacts, planted=artifacts["xcom"] + CANARY_SECRET.encode())
    assert _leaks(planted) == ["planted"]
