"""Input that outruns processing turns the status DEGRADED ("falling behind"); a low rate
does not, and the state clears once the backlog is worked off.

One real driver (`streamkeeper run` of the sample job, 1 s trigger interval, one file per
batch). Control: a small file every 4 s (batches well apart; on a loaded 2-core machine a
batch of 50 events took 1.5-4 s) while the status is read every second: RUNNING
throughout. Overload: a file every 0.4 s while batches 9-20 are slowed to take 1.5 s
longer (`STREAMKEEPER_SLOW_BATCHES`: a slow transformation), so files pile up: DEGRADED
with the falling-behind reason (Spark's two rates, printed, can stay close: the rate rule
alone does not see it). Then the input stops, the batches after 20 drain the backlog, and
the status returns to RUNNING.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import write_event_files
from streamkeeper.client import StreamkeeperClient
from streamkeeper.observability.status import StatusReport
from tests.support.driver import driver_env, run_command

pytestmark = pytest.mark.integration

JOB = "keyed-totals"
CONTROL_FILES = 8  # batches 1..8 (batch 0 reads the seed file)
CONTROL_PERIOD = 4  # s: apart even when a small batch takes 2-4 s on a loaded machine
SLOW = range(CONTROL_FILES + 1, CONTROL_FILES + 13)  # batches 9..20


class World:
    def __init__(self, tmp_path: Path) -> None:
        self.events = tmp_path / "events"
        self.root = tmp_path / "data"
        # The seed touches every key, so the state is full from the first batch on.
        self.files = write_event_files(self.events, files=1, events_per_file=2000)
        self.client = StreamkeeperClient(str(self.root))
        self.readings: list[tuple[float, str, str]] = []

    def feed(self) -> None:
        self.files += write_event_files(
            self.events, files=1, events_per_file=50, first_file=len(self.files)
        )

    def status(self) -> StatusReport | None:
        try:
            report = self.client.status(JOB)
        except Exception:  # noqa: BLE001 - not registered yet
            return None
        self.readings.append((time.monotonic(), report.state, report.reason))
        return report

    def committed_batches(self) -> int:
        report = self.status()
        return -1 if report is None or report.head is None else report.head.batch_id


def test_status_turns_degraded_when_input_outruns_processing(tmp_path: Path) -> None:
    world = World(tmp_path)
    slow = ",".join(str(b) for b in SLOW) + ":1.5"
    log = open(tmp_path / "driver.log", "wb")  # noqa: SIM115
    driver = subprocess.Popen(
        run_command(
            str(world.root),
            tmp_path / "checkpoint",
            [f"source.path={world.events}", "checkpoint.interval=1s"],
        ),
        env=driver_env(STREAMKEEPER_SLOW_BATCHES=slow),
        stdout=log,
        stderr=log,
    )
    try:
        _wait(lambda: world.committed_batches() >= 0, 180, "the first checkpoint", driver)

        # Control: one small file every 4 s, well within what the job processes.
        control_from = len(world.readings)
        for _ in range(CONTROL_FILES):
            world.feed()
            for _ in range(CONTROL_PERIOD):
                time.sleep(1.0)
                world.status()
        _wait(lambda: world.committed_batches() >= CONTROL_FILES, 60, "the control", driver)
        control = world.readings[control_from:]
        assert [r for r in control if r[1] != "RUNNING"] == []

        # Overload: a file every 0.4 s while each batch takes over 1.5 s.
        overload_from = len(world.readings)
        degraded = None
        deadline = time.monotonic() + 60
        while degraded is None and time.monotonic() < deadline:
            world.feed()
            time.sleep(0.4)
            report = world.status()
            if report is not None and report.state == "DEGRADED":
                degraded = report
            assert driver.poll() is None, "the driver exited"
        assert degraded is not None, world.readings[overload_from:]
        assert degraded.reason.startswith("falling behind: the last 3 batches each took"), (
            degraded.reason
        )
        backlog = len(world.files) - 1 - degraded.head.batch_id
        assert backlog >= 5, f"only {backlog} files waited when DEGRADED appeared"
        history = world.client.history(JOB, last=5)
        rates = [(r.input_rows_per_second, r.processed_rows_per_second) for r in history]
        print(f"DEGRADED with {backlog} files waiting: {degraded.reason}; Spark's rates {rates}")

        # The input stops; the batches after the slow ones work the backlog off.
        written = len(world.files) - 1
        _wait(lambda: world.committed_batches() >= written, 120, "the backlog drained", driver)
        _wait(lambda: _state(world.status()) == "RUNNING", 30, "RUNNING again", driver)
    finally:
        driver.terminate()
        try:
            driver.wait(timeout=60)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait()
        log.close()


def _state(report: StatusReport | None) -> str | None:
    return None if report is None else report.state


def _wait(condition, timeout: float, what: str, driver: subprocess.Popen) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not condition():
        if driver.poll() is not None:
            raise AssertionError(f"the driver exited ({driver.returncode}) waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)
