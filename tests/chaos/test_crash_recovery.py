"""SIGKILL the driver at every protocol point and at random instants; the output stays exact.

Kills on local storage, and on SeaweedFS S3 behind a fault-injecting proxy.
The same harness runs the at-least-once sink to show that it can see a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.commit.crashpoints import POINTS
from tests.chaos.harness import ChaosJob, InvariantViolation, crash_schedule
from tests.support.s3_proxy import Fault, FaultPlan, S3FaultProxy

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(2400)]

EVENTS_PER_FILE = 150
LOCAL_KILLS = int(os.environ.get("STREAMKEEPER_CHAOS_LOCAL_KILLS", "32"))
S3_KILLS = int(os.environ.get("STREAMKEEPER_CHAOS_S3_KILLS", "30"))
RECOVERY_POINTS = {"recovery_after_commit"}


def _ensure_backlog(job: ChaosJob, minimum: int = 4, add: int = 6) -> None:
    """Keep unprocessed files around so that in-batch crash points are reached."""
    if len(job.event_files) - job.completed_batches() < minimum:
        job.event_files += write_event_files(
            job.event_files[0].parent,
            files=add,
            events_per_file=EVENTS_PER_FILE,
            first_file=len(job.event_files),
        )


def _kill_and_check(job: ChaosJob, kind: str, value: object) -> None:
    _ensure_backlog(job)
    if kind == "random":
        delay = float(value)  # type: ignore[arg-type]
        # A driver that starts fast may finish its backlog before the kill: that run
        # counts as a clean one, and the kill is tried again earlier, with more input.
        while job.run(kill_after=delay) != "killed":
            job.check_invariants()
            _ensure_backlog(job, minimum=10, add=10)
            delay *= 0.7
    else:
        point = str(value)
        if point.split(":")[0] in RECOVERY_POINTS:
            # Leave a completed-but-uncommitted batch behind so recovery has work to do.
            job.run(crash_at="before_delta_commit:1")
            job.check_invariants()
            point = point.split(":")[0] + ":1"
        job.run(crash_at=point)
    job.check_invariants()


def _chaos(job: ChaosJob, kills: int, seed: int) -> None:
    points_per_round = len(POINTS)
    repeats = max(1, (kills * 2 // 3) // points_per_round)
    random_kills = max(1, kills - repeats * points_per_round)
    schedule = crash_schedule(list(POINTS), repeats, random_kills, seed)
    for kind, value in schedule:
        _kill_and_check(job, kind, value)
    while job.run() != "finished":  # pragma: no cover - a clean run always finishes
        pass
    batches = job.batch_files()
    assert sorted(p for files in batches for p in files) == sorted(job.event_files), job.log
    totals_at, changes_at = job.check_invariants()
    assert totals_at == changes_at == len(batches), job.log
    expected_totals, _ = expected_results(job.event_files)
    assert {
        r["key"]: (r["events"], r["total"]) for r in job.table_rows("totals")
    } == expected_totals
    assert job.unreferenced_files() == [], "recovery left orphaned pre-commit files behind"
    assert job.check_protected_versions() > 0, "maintenance never expired the Delta log"


def _new_job(tmp_path: Path, root: str, mode: str = "exactly_once") -> ChaosJob:
    files = write_event_files(tmp_path / "events", files=6, events_per_file=EVENTS_PER_FILE)
    return ChaosJob(workdir=tmp_path, root=root, event_files=files, sink_mode=mode)


def test_exactly_once_survives_kills_on_local_storage(tmp_path: Path) -> None:
    job = _new_job(tmp_path, str(tmp_path / "data"))
    _chaos(job, LOCAL_KILLS, seed=1)
    assert job.kills >= LOCAL_KILLS, job.log


# Between the drivers and SeaweedFS: errors that were not applied, delays, and writes that
# landed but whose answer was lost (often on the Delta log, where a blind retry duplicates).
S3_FAULTS = FaultPlan(
    [
        Fault("latency", 0.1, latency_ms=(5, 60)),
        Fault("error_503", 0.03),
        Fault("error_500", 0.02),
        Fault("reset_after_apply", 0.02, {"PUT", "POST", "DELETE"}),
        Fault("reset_after_apply", 0.08, {"PUT"}, r"_delta_log/"),
    ],
    seed=9,
)


@pytest.mark.s3
def test_exactly_once_survives_kills_and_s3_faults(
    tmp_path: Path, s3_root: str, seaweed: object
) -> None:
    job = _new_job(tmp_path, s3_root)
    # Tasks may fail on a fault (local[2,4]: up to 4 attempts, as on a cluster), and a
    # batch or commit may fail and be retried within the tolerance.
    job.master = "local[2,4]"
    job.settings = ["checkpoint.tolerable_failures=10"]
    with S3FaultProxy(f"127.0.0.1:{seaweed.port}", plan=S3_FAULTS) as proxy:  # type: ignore[attr-defined]
        job.env = {"AWS_ENDPOINT_URL": proxy.endpoint_url}
        _chaos(job, S3_KILLS, seed=2)
        stats = proxy.stats()
    assert job.kills >= S3_KILLS, job.log
    for kind in ("error_503", "error_500", "latency", "reset_after_apply"):
        assert stats[kind] > 0, stats


def test_harness_sees_at_least_once_duplicates(tmp_path: Path) -> None:
    """A kill after the in-batch append and before commits/N makes at-least-once repeat it."""
    job = _new_job(tmp_path, str(tmp_path / "data"), mode="at_least_once")
    assert job.run(crash_at="batch_after_commit:2") == "killed"
    assert job.run() == "finished"
    with pytest.raises(InvariantViolation, match="duplicated"):
        job.check_invariants()
