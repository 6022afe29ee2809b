# ruff: noqa: F811 - `place` is a fixture, imported to be used by name
"""The upgrade and rollback DAGs end to end with `dag.test()`: a real metadata DB, real
Spark drivers (blue started by the start DAG, green by the upgrade DAG), local storage,
input arriving all along. An upgrade that passes hands over and is promoted, exactly once;
a broken green is rejected and blue is untouched; a green that fails its probation is
rolled back (Delta RESTORE, blue restarted from its stop savepoint), exactly once; the
rollback DAG returns the job to an earlier savepoint."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.reader import read_table_rows
from streamkeeper.upgrade.record import UpgradeRecords
from tests.airflow.conftest import CANARY_KEY, CANARY_SECRET
from tests.airflow.test_dag_runs import JOB, JobPlace, place, run_dag  # noqa: F401 - fixture
from tests.support.airflow_runs import all_xcom_text, launch_record, stop_job_drivers
from tests.support.traffic import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.airflow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[2]
V2_SPEC = REPO / "jobs" / "keyed_totals" / "versions" / "v2.yaml"
FAST = {"probation_seconds": 8, "probation_checkpoints": 2, "shadow_checkpoints": 2}


class Feeder(threading.Thread):
    """A new event file every `period` seconds into the job's input, until halted; calls
    `on_tick` first each time (a test arms something at the right moment).

    A file every 2 s, which the job keeps up with (a batch per file): what is left to
    drain at the end is the backlog of the upgrade's outages, not minutes of a faster
    input (a file every 0.7 s left 140 one-file batches to drain after a rollback)."""

    def __init__(self, place: JobPlace, period: float = 2.0, on_tick=None) -> None:
        super().__init__(daemon=True)
        self.directory = place.events
        self.period = period
        self.files = sorted(place.events.glob("events-*.json"))
        self.on_tick = on_tick
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(self.period):
            if self.on_tick is not None:
                self.on_tick()
            self.files += write_event_files(
                self.directory, files=1, events_per_file=200, first_file=len(self.files)
            )

    def stop(self) -> list[Path]:
        self.halt.set()
        if self.is_alive():
            self.join()
        return list(self.files)


def _green_spec(tmp_path: Path, transform: Path) -> Path:
    """v2 with another transform, beside a copy of it (transforms resolve by the spec)."""
    shutil.copy(transform, tmp_path / transform.name)
    spec = tmp_path / "green.yaml"
    spec.write_text(V2_SPEC.read_text().replace("transform_v2.py", transform.name))
    return spec


def _rows(place: JobPlace, sink: str) -> list[dict]:
    return read_table_rows(str(place.root / "tables" / sink))


def _totals(place: JobPlace) -> dict[str, tuple[int, int]]:
    return {r["key"]: (r["events"], r["total"]) for r in _rows(place, "totals")}


def _drain_and_check(place: JobPlace, feeder: Feeder) -> None:
    """Stop the input, let the job catch up, stop it; the live tables are exact."""
    files = feeder.stop()
    totals, changes = expected_results(files)
    wait_for(lambda: _totals(place) == totals, 300, "the live job to process every file")
    stopped = run_dag(f"{JOB}.stop", mode="stop", savepoint=False)
    assert stopped.state == "success", stopped.tasks
    rows = sorted((r["key"], r["events"], r["total"]) for r in _rows(place, "changes"))
    assert rows == changes, "the live changes are not exactly once"
    assert _totals(place) == totals


def _stop_shadows(place: JobPlace) -> None:
    for folder in (place.root / "jobs").glob(f"{JOB}-shadow-*"):
        stop_job_drivers(place.root, folder.name)


def _upgrades(place: JobPlace) -> list:
    return UpgradeRecords(place.client().store, JOB).list()


def _start_blue(place: JobPlace) -> None:
    started = run_dag(f"{JOB}.start", overrides=place.overrides, new_checkpoints=2)
    assert started.state == "success", started.tasks


def test_an_upgrade_hands_over_is_promoted_and_rolled_back_on_demand_exactly_once(
    place: JobPlace,
) -> None:
    feeder = Feeder(place)
    feeder.start()
    try:
        _start_blue(place)
        blue_epoch = place.client().status(JOB).runner.epoch
        run = run_dag(f"{JOB}.upgrade", green_spec_path=str(V2_SPEC), **FAST)
        assert run.state == "success", run.tasks
        assert {t: s for t, (s, _) in run.tasks.items()}["rollback"] == "skipped"
        (record,) = _upgrades(place)
        assert record.phase == "promoted", record.reason
        assert record.validation["success"] and record.validation["comparison"]["success"]
        assert record.validation["quality"]["success"]
        handover = run.xcom["handover"]
        print(f"handover gap {handover['gap_s']:.2f} s")
        assert handover["gap_s"] > 0 and handover["green_first_seq"] == handover["seq"] + 1
        status = place.client().status(JOB)
        assert status.runner.epoch > blue_epoch and status.state in ("RUNNING", "DEGRADED")
        assert launch_record(place.root, JOB)["request"]["spec_path"] == str(V2_SPEC)
        assert _rows(place, "means"), "green's new table is empty"

        # On demand, back past the upgrade: to blue's stop savepoint S1, with v1's spec.
        back = run_dag(
            f"{JOB}.rollback",
            savepoint_id=record.handover["blue_savepoint"],
            overrides=place.overrides,
        )
        assert back.state == "success", back.tasks
        status = place.client().status(JOB)
        assert status.state in ("RUNNING", "DEGRADED") and status.runner.epoch > blue_epoch + 1
        assert launch_record(place.root, JOB)["request"]["spec_path"] == record.blue["spec_path"]
        _drain_and_check(place, feeder)
        text = all_xcom_text()
        assert CANARY_SECRET not in text and CANARY_KEY not in text
    finally:
        feeder.stop()
        _stop_shadows(place)


def test_a_broken_green_is_rejected_and_blue_keeps_running(place: JobPlace, tmp_path: Path) -> None:
    bad = _green_spec(
        tmp_path, REPO / "tests" / "integration" / "jobs" / "upgrade" / "bad_totals.py"
    )
    feeder = Feeder(place)
    feeder.start()
    try:
        _start_blue(place)
        blue = place.client().status(JOB).runner
        run = run_dag(f"{JOB}.upgrade", green_spec_path=str(bad), **FAST)
        assert run.state == "failed"
        states = {t: s for t, (s, _) in run.tasks.items()}
        assert states["validate"] == "failed" and states["handover"] == "upstream_failed"
        assert states["rollback"] == "skipped" and states["outcome"] == "failed"
        (record,) = _upgrades(place)
        assert record.phase == "rejected" and "differs" in record.reason
        assert not record.validation["quality"]["success"], "GX did not catch negative totals"
        now = place.client().status(JOB).runner
        assert (now.epoch, now.pid) == (blue.epoch, blue.pid), "blue was touched"
        _drain_and_check(place, feeder)
        # The shadow run stopped at a batch boundary: nothing of its lineage is left in a
        # WAL that no start would ever recover (a cancel left its batch in flight there).
        shadow = record.green["shadow_job"]
        wait_for(
            lambda: place.client().status(shadow).runner.state in ("STOPPED", "FAILED"),
            180,
            "green's shadow run to stop",
        )
        assert place.client().status(shadow).runner.state == "STOPPED"
        left = place.client().store.list(f"lineages/{shadow}/wal")
        assert left == [], f"the shadow left WAL entries: {left}"
    finally:
        feeder.stop()
        _stop_shadows(place)


def test_a_green_failing_probation_is_rolled_back_exactly_once(
    place: JobPlace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = tmp_path / "bomb"
    monkeypatch.setenv("STREAMKEEPER_TEST_BOMB", str(bomb))
    green = _green_spec(tmp_path, Path(__file__).parent / "jobs" / "bomb_totals.py")

    def arm() -> None:  # once green passed validation: its live batches go wrong
        if any(r.phase not in ("shadow", "rejected") for r in _upgrades(place)):
            bomb.touch()

    feeder = Feeder(place, on_tick=arm)
    feeder.start()
    try:
        _start_blue(place)
        run = run_dag(f"{JOB}.upgrade", green_spec_path=str(green), **FAST)
        assert run.state == "failed"
        states = {t: s for t, (s, _) in run.tasks.items()}
        assert states["handover"] == "success" and states["probation"] == "failed"
        assert states["rollback"] == "success" and states["outcome"] == "failed"
        (record,) = _upgrades(place)
        assert record.phase == "rolled_back" and bomb.exists()
        assert "quality gate" in record.probation["reason"]
        restored = record.rollback["tables"]
        assert {n: t["to"] for n, t in restored.items()} == {
            n: t["version"] for n, t in record.handover["tables"].items()
        }
        status = place.client().status(JOB)
        assert status.runner.epoch > record.rollback["epoch"]
        assert launch_record(place.root, JOB)["request"]["spec_path"] == record.blue["spec_path"]
        _drain_and_check(place, feeder)
    finally:
        feeder.stop()
        _stop_shadows(place)


def test_a_green_dying_at_the_handover_is_rolled_back_at_once(
    place: JobPlace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blue stopped with its savepoint S1, green dies restoring it (SIGKILL at its second
    restore; the first was the shadow run's): the handover fails once green's beat goes
    stale (30 s; green may run on another host: no pid is consulted), not after its
    600 s timeout, and the rollback task restarts blue from S1, exactly once."""
    feeder = Feeder(place)
    feeder.start()
    try:
        _start_blue(place)
        # The drivers started from here on kill themselves at their 2nd restore's rename:
        # only green restores twice (S0 for the shadow run, S1 to go live).
        monkeypatch.setenv("STREAMKEEPER_INJECT", "tests.support.faults")
        monkeypatch.setenv("STREAMKEEPER_CRASH_AT", "restore_savepoint_after_rename:2")
        paths = [str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
        run = run_dag(f"{JOB}.upgrade", green_spec_path=str(V2_SPEC), **FAST)
        assert run.state == "failed"
        states = {t: s for t, (s, _) in run.tasks.items()}
        assert states["handover"] == "failed" and states["probation"] == "upstream_failed"
        assert states["rollback"] == "success" and states["outcome"] == "failed", states
        (record,) = _upgrades(place)
        assert record.phase == "rolled_back", record.reason
        assert "green died during the handover" in record.probation["reason"]
        assert "stopped beating" in record.probation["reason"]
        assert record.rollback["savepoint"] == record.handover["blue_savepoint"]
        status = place.client().status(JOB)
        assert (
            status.state in ("RUNNING", "DEGRADED")
            and status.runner.epoch > record.rollback["epoch"]
        )
        assert launch_record(place.root, JOB)["request"]["spec_path"] == record.blue["spec_path"]
        monkeypatch.delenv("STREAMKEEPER_CRASH_AT")
        _drain_and_check(place, feeder)
    finally:
        feeder.stop()
        _stop_shadows(place)


def test_an_upgrade_that_never_began_rolls_nothing_back(place: JobPlace) -> None:
    """Begin refuses a job that is not running: the rollback task skips (it used to fail
    as an on-demand rollback without a savepoint, and alert about that)."""
    run = run_dag(f"{JOB}.upgrade", green_spec_path=str(V2_SPEC), **FAST)
    assert run.state == "failed"
    states = {t: s for t, (s, _) in run.tasks.items()}
    assert states["begin"] == "failed" and states["rollback"] == "skipped", states
    assert states["outcome"] == "failed"
    alerts = place.alerts.read_text() if place.alerts.exists() else ""
    assert "savepoint_id" not in alerts, alerts
