"""A committer slower than the batches, with a 100 ms trigger, until Spark purges old
commit-log entries: the queue stays bounded (the batches wait for it) and no batch is lost.

Before the commit queue was bounded, the pending manifests of a fast source outran a
slow committer without limit; once Spark purged `commits/N` of a still-queued batch
(spark.sql.streaming.minBatchesToRetain), that batch never counted as complete and its
output was never committed.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.reader import read_table_rows
from tests.support.driver import driver_env

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(600)]

SAMPLE_SPEC = Path(__file__).resolve().parents[2] / "jobs" / "keyed_totals" / "job.yaml"
FILES = 30
MAX_CONCURRENT = 2


def _markers(root: Path) -> list[dict]:
    folder = root / "lineages" / "keyed-totals" / "markers"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def test_a_slow_committer_loses_nothing_when_spark_purges_its_log(tmp_path: Path) -> None:
    files = write_event_files(tmp_path / "events", files=FILES, events_per_file=50)
    root, checkpoint = tmp_path / "data", tmp_path / "checkpoint"
    command = [sys.executable, "-m", "streamkeeper", "run", str(SAMPLE_SPEC)]
    command += ["--root", str(root), "--checkpoint-dir", str(checkpoint)]
    for setting in (
        f"source.path={tmp_path / 'events'}",
        "spark.master=local[2]",
        "spark.shuffle_partitions=2",
        "checkpoint.interval=100ms",
        f"checkpoint.max_concurrent={MAX_CONCURRENT}",
        # Spark keeps this many log entries; the runtime raises it to 2 x bound + 8 = 12.
        "spark.conf.spark.sql.streaming.minBatchesToRetain=3",
    ):
        command += ["--set", setting]
    env = driver_env(STREAMKEEPER_SLOW_COMMITS="0.25")  # per table: two tables, 0.5 s a batch
    with open(tmp_path / "driver.log", "wb") as log:
        driver = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 400
        while len(_markers(root)) < FILES and time.monotonic() < deadline:
            assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
            time.sleep(0.5)
        assert len(_markers(root)) == FILES, "not every batch was committed in time"
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=120) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert commits[0] > 0, "Spark never purged its commit log: the scenario did not happen"
    assert commits[-1] == FILES - 1
    beat = json.loads((root / "jobs" / "keyed-totals" / "heartbeat.json").read_text())
    assert 1 <= beat["peak_pending_commits"] <= MAX_CONCURRENT  # backpressure held the bound
    assert [m["batch_id"] for m in _markers(root)] == list(range(FILES))
    totals = read_table_rows(str(root / "tables" / "totals"))
    assert {r["key"]: (r["events"], r["total"]) for r in totals} == expected_results(files)[0]
    changes = read_table_rows(str(root / "tables" / "changes"))
    got = sorted((r["key"], r["events"], r["total"]) for r in changes)
    assert got == expected_results(files)[1]
