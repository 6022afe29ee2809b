"""The sample job on a Spark standalone cluster: executors write the pre-commit files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.reader import read_table_rows
from tests.conftest import SAMPLE_SPEC
from tests.support.services import SparkStandalone, start_spark_standalone

pytestmark = [pytest.mark.integration, pytest.mark.cluster]


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SparkStandalone]:
    started = start_spark_standalone(tmp_path / "cluster", cores=2, memory="1g")
    yield started
    started.stop()


def test_executors_write_the_pre_commit_files(tmp_path: Path, cluster: SparkStandalone) -> None:
    files = write_event_files(tmp_path / "events", files=3, events_per_file=400)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "streamkeeper",
            "run",
            str(SAMPLE_SPEC),
            "--available-now",
            "--master",
            cluster.master_url,
            "--root",
            str(tmp_path / "data"),
            "--checkpoint-dir",
            str(tmp_path / "checkpoint"),
            "--set",
            f"source.path={tmp_path / 'events'}",
            "--set",
            "spark.conf.spark.executor.memory=512m",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    markers = [
        json.loads(p.read_text())
        for p in sorted((tmp_path / "data/lineages/keyed-totals/markers").glob("*.json"))
    ]
    assert [m["batch_id"] for m in markers] == [0, 1, 2]
    writers = {w for m in markers for w in m["writers"]}
    assert writers and all(w.startswith("executor-") for w in writers), writers
    totals = read_table_rows(str(tmp_path / "data/tables/totals"))
    assert {r["key"]: (r["events"], r["total"]) for r in totals} == expected_results(files)[0]
    changes = read_table_rows(str(tmp_path / "data/tables/changes"))
    assert (
        sorted((r["key"], r["events"], r["total"]) for r in changes) == expected_results(files)[1]
    )
