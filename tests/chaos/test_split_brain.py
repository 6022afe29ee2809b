"""Split brain: a running job is taken over again and again by a new driver on another
checkpoint directory (restored from the externalized checkpoint), at random instants,
while input keeps arriving and batches are in flight on both sides.

The old driver tolerates failed checkpoints (`tolerable_failures: 3`), so nothing but
fencing stops it: it must notice that it lost the lineage, stop without recovering,
deleting, uploading or recording a final state, and fail with the reason. The output
must be exact and no table may reference a missing file.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results, read_events, write_event_files
from tests.chaos.harness import ChaosJob
from tests.support.driver import driver_env

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(1800)]

SAMPLE_SPEC = Path(__file__).resolve().parents[2] / "jobs" / "keyed_totals" / "job.yaml"
TAKEOVERS = int(os.environ.get("STREAMKEEPER_CHAOS_TAKEOVERS", "10"))


class Feeder(threading.Thread):
    """Writes a new event file every `period` seconds until stopped."""

    def __init__(self, directory: Path, period: float = 1.5) -> None:
        super().__init__(daemon=True)
        self.directory = directory
        self.period = period
        self.files = write_event_files(directory, files=3, events_per_file=100)
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.period):
            self.files += write_event_files(
                self.directory, files=1, events_per_file=100, first_file=len(self.files)
            )


def _start(tmp_path: Path, index: int) -> tuple[subprocess.Popen, Path]:
    command = [sys.executable, "-m", "streamkeeper", "run", str(SAMPLE_SPEC)]
    command += ["--root", str(tmp_path / "data"), "--checkpoint-dir", str(tmp_path / f"ck-{index}")]
    for setting in (
        f"source.path={tmp_path / 'events'}",
        "spark.master=local[1]",
        "spark.shuffle_partitions=2",
        "checkpoint.interval=500ms",
        "checkpoint.tolerable_failures=3",
        "checkpoint.externalized.enabled=true",
        "maintenance.every=2",  # expire the Delta log as far as the floor allows
        "maintenance.history_retention=0s",
    ):
        command += ["--set", setting]
    if index > 0:
        command += ["--takeover", "--from-checkpoint", "latest"]
    log = tmp_path / f"runner-{index}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, env=driver_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return process, log


def _markers(tmp_path: Path) -> list[dict]:
    folder = tmp_path / "data" / "lineages" / "keyed-totals" / "markers"
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


def _wait(condition, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


def _check_changes(changes: list[tuple], files: list[Path]) -> None:
    """Every change row is one key's running state at a file boundary, none repeated."""
    assert len(changes) == len(set(changes)), "a change row was committed twice"
    boundaries: dict[str, set[tuple[int, int]]] = defaultdict(set)
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for path in files:
        for event in read_events(path):
            state = counts[event["key"]]
            state[0] += 1
            state[1] += event["value"]
        for key, (events, total) in counts.items():
            boundaries[key].add((events, total))
    strays = [row for row in changes if (row[1], row[2]) not in boundaries[row[0]]]
    assert not strays, f"change rows no prefix of the input explains: {strays[:5]}"


def test_repeated_takeovers_keep_the_output_exact(tmp_path: Path) -> None:
    feeder = Feeder(tmp_path / "events")
    runners: list[tuple[subprocess.Popen, Path]] = []
    rng = random.Random(5)
    try:
        runners.append(_start(tmp_path, 0))
        feeder.start()
        for index in range(1, TAKEOVERS + 1):
            # Runner i holds epoch i: let it commit, then take over at a random instant
            # (a batch is in flight most of the time: the trigger fires every 500 ms).
            epoch = index
            _wait(
                lambda epoch=epoch: any(m["epoch"] == epoch for m in _markers(tmp_path)),
                180,
                f"runner {index - 1} (epoch {epoch}) to commit",
            )
            time.sleep(rng.uniform(0.0, 3.0))
            runners.append(_start(tmp_path, index))
        # The last runner must own input of its own: on a loaded machine its start can
        # outlast the feeder, and the runner it fenced would have processed everything.
        _wait(
            lambda: any(m["epoch"] == TAKEOVERS + 1 for m in _markers(tmp_path)),
            180,
            f"the last runner (epoch {TAKEOVERS + 1}) to commit",
        )
        time.sleep(rng.uniform(2.0, 4.0))
        feeder.halt.set()
        feeder.join()
        expected, _ = expected_results(feeder.files)
        job = ChaosJob(workdir=tmp_path, root=str(tmp_path / "data"), event_files=feeder.files)

        def caught_up() -> bool:
            rows = job.table_rows("totals")
            return {r["key"]: (r["events"], r["total"]) for r in rows} == expected

        _wait(caught_up, 600, "the last runner to process every file")
        last, last_log = runners[-1]
        last.send_signal(signal.SIGTERM)
        assert last.wait(timeout=120) == 0, last_log.read_text()[-3000:]
        for process, log in runners[:-1]:
            code = process.wait(timeout=180)  # fenced runners stop by themselves
            text = log.read_text()
            assert code == 1, f"runner exit {code}, not a fenced failure: {text[-3000:]}"
            assert "fenced" in text, text[-3000:]
    finally:
        feeder.halt.set()
        for process, _log in runners:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    changes = [(r["key"], r["events"], r["total"]) for r in job.table_rows("changes")]
    _check_changes(changes, feeder.files)
    latest = {}
    for key, events, total in changes:
        latest[key] = max(latest.get(key, (0, 0)), (events, total))
    assert latest == expected  # the last change of each key is its final total
    assert len(changes) == sum(m["rows"]["changes"] for m in _markers(tmp_path))
    assert job.missing_files() == []
    epochs = {m["epoch"] for m in _markers(tmp_path)}
    assert epochs == set(range(1, TAKEOVERS + 2)), f"epochs that committed: {sorted(epochs)}"
    beat = json.loads((tmp_path / "data" / "jobs" / "keyed-totals" / "heartbeat.json").read_text())
    assert beat["state"] == "STOPPED" and beat["epoch"] == TAKEOVERS + 1

    # Fenced runners may have been writing after the last owner's recovery: the next
    # start's recovery removes what they left, and only that.
    job.workdir = tmp_path / "final"
    job.workdir.mkdir()
    (tmp_path / f"ck-{TAKEOVERS}").rename(job.checkpoint_dir)
    assert job.run() == "finished"
    assert job.unreferenced_files() == []
    assert sorted((r["key"], r["events"], r["total"]) for r in job.table_rows("changes")) == sorted(
        changes
    )
