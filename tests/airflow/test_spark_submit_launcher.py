"""The spark-submit launcher against a real Spark standalone master (127.0.0.1): the
start DAG's operator launches the sample job with `launcher=spark_submit`, the driver
runs in client mode with its executors on the cluster, registers with the master, and
checkpoints; a second start with the same run token attaches (no second application);
the output is exact."""

# ruff: noqa: F811 - `place` is a fixture, imported to be used by name
from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results
from streamkeeper.reader import read_table_rows
from tests.airflow.test_dag_runs import JOB, JobPlace, place, run_dag  # noqa: F401 - fixture
from tests.support.services import SparkStandalone, start_spark_standalone
from tests.support.traffic import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.cluster]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SparkStandalone]:
    started = start_spark_standalone(tmp_path / "cluster", cores=2, memory="1g")
    yield started
    started.stop()


def _apps(cluster: SparkStandalone) -> list[dict]:
    with urllib.request.urlopen(f"{cluster.webui_url}/json/", timeout=5) as response:
        return json.loads(response.read())["activeapps"]


def test_the_start_dag_launches_through_spark_submit_onto_the_master(
    place: JobPlace, cluster: SparkStandalone, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The operator allows this cluster and one more override (launch_policy.py).
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__SPARK_MASTERS", cluster.master_url)
    allowed = "source.path, checkpoint.dir, spark.conf.spark.executor.memory"
    monkeypatch.setenv("AIRFLOW__STREAMKEEPER__TRIGGER_OVERRIDES", allowed)
    overrides = {**place.overrides, "spark.conf.spark.executor.memory": "512m"}
    conf = {
        "overrides": overrides,
        "launcher": "spark_submit",
        "spark_master": cluster.master_url,
        "new_checkpoints": 2,
    }
    first = run_dag(f"{JOB}.start", **conf)
    assert first.state == "success", first.tasks
    assert first.xcom["start.start"]["action"] == "launched"
    (app,) = _apps(cluster)
    assert app["name"] == f"streamkeeper-{JOB}" and app["cores"] >= 1
    status = place.client().status(JOB)
    assert status.state == "RUNNING" and status.runner.run_token == first.xcom["start"]["run_token"]

    again = run_dag(f"{JOB}.start", **{**conf, "new_checkpoints": 0})
    assert again.state == "success" and again.xcom["start.start"]["action"] == "attached"
    assert [a["id"] for a in _apps(cluster)] == [app["id"]], "a second application started"

    totals, _ = expected_results(sorted(place.events.glob("events-*.json")))

    def exact() -> bool:
        rows = read_table_rows(str(place.root / "tables" / "totals"))
        return {r["key"]: (r["events"], r["total"]) for r in rows} == totals

    wait_for(exact, 300, "the cluster's output to be exact")
    stopped = run_dag(f"{JOB}.stop", mode="stop", savepoint=False)
    assert stopped.state == "success", stopped.tasks
    wait_for(lambda: not _apps(cluster), 120, "the application to leave the master")
