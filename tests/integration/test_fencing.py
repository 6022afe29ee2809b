"""One writer per lineage: a detached runner, a refused second start, and a takeover."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.reader import read_table_rows
from tests.support.driver import run_command

pytestmark = pytest.mark.integration


def _command(tmp_path: Path, checkpoint: str, *extra: str) -> list[str]:
    settings = [
        f"source.path={tmp_path / 'events'}",
        "spark.master=local[1]",
        "spark.shuffle_partitions=2",
        "checkpoint.interval=500ms",
    ]
    return run_command(str(tmp_path / "data"), tmp_path / checkpoint, settings, *extra)


def _wait_for(condition: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def _heartbeat(tmp_path: Path) -> dict:
    path = tmp_path / "data" / "jobs" / "keyed-totals" / "heartbeat.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _marker_batches(tmp_path: Path) -> list[tuple[int, int]]:
    folder = tmp_path / "data" / "lineages" / "keyed-totals" / "markers"
    markers = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return [(m["epoch"], m["batch_id"]) for m in markers]


def _stop(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)  # the group of a runner this test started
    except ProcessLookupError:
        pass


def test_takeover_fences_the_older_runner(tmp_path: Path) -> None:
    files = write_event_files(tmp_path / "events", files=2, events_per_file=200)
    detached = subprocess.run(
        _command(tmp_path, "checkpoint-a", "--detach"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    runner_a = json.loads(detached.stdout.strip().splitlines()[-1])
    b: subprocess.Popen | None = None
    try:
        _wait_for(lambda: _heartbeat(tmp_path).get("pid") == runner_a["pid"], 60, "A's heartbeat")
        _wait_for(lambda: len(_marker_batches(tmp_path)) == 2, 120, "A's two commits")
        assert _heartbeat(tmp_path)["state"] == "RUNNING"

        refused = subprocess.run(
            _command(tmp_path, "checkpoint-a", "--available-now"),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 1
        assert "held by a live runner" in refused.stderr and "--takeover" in refused.stderr

        # B restores A's checkpoint elsewhere (a copy, as on another machine) and takes over.
        shutil.copytree(tmp_path / "checkpoint-a", tmp_path / "checkpoint-b")
        b = subprocess.Popen(
            _command(tmp_path, "checkpoint-b", "--takeover"),
            cwd=tmp_path,
            stdout=open(tmp_path / "b.log", "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        _wait_for(lambda: _heartbeat(tmp_path).get("epoch") == 2, 60, "B's epoch")
        files += write_event_files(tmp_path / "events", files=1, events_per_file=200, first_file=2)

        _wait_for(
            lambda: not psutil.pid_exists(runner_a["pid"])
            or psutil.Process(runner_a["pid"]).status() == psutil.STATUS_ZOMBIE,
            120,
            "A to exit",
        )
        log_a = Path(runner_a["log"]).read_text()
        assert "is fenced by epoch 2" in log_a and "final state FAILED not recorded" in log_a
        _wait_for(lambda: (2, 2) in _marker_batches(tmp_path), 120, "B to commit batch 2")
        assert all(epoch == 1 for epoch, batch in _marker_batches(tmp_path) if batch < 2)
        assert [e for e, batch in _marker_batches(tmp_path) if batch == 2] == [2]

        b.send_signal(signal.SIGTERM)
        assert b.wait(timeout=120) == 0
        assert _heartbeat(tmp_path)["state"] == "STOPPED"
    finally:
        _stop(runner_a["pid"])
        if b is not None:
            _stop(b.pid)
    rows = read_table_rows(str(tmp_path / "data" / "tables" / "totals"))
    assert {r["key"]: (r["events"], r["total"]) for r in rows} == expected_results(files)[0]
    changes = read_table_rows(str(tmp_path / "data" / "tables" / "changes"))
    assert (
        sorted((r["key"], r["events"], r["total"]) for r in changes) == expected_results(files)[1]
    )
