"""Fan-in: two lineages append to one shared table while each is SIGKILLed and restarted.

Each lineage's recovery may only ever touch its own pre-committed files (they live in
`sk-{lineage}/` inside the table), and the table's commits from two writers must not
lose or repeat anything. The two drivers run at the same time, so their commits race
on the shared table's log.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
from collections import Counter
from pathlib import Path

import pytest

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.commit.crashpoints import POINTS
from tests.chaos.harness import ChaosJob, InvariantViolation

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(1800)]

KILLS_EACH = int(os.environ.get("STREAMKEEPER_CHAOS_FAN_IN_KILLS", "13"))
EVENTS_PER_FILE = 120


def _job(tmp_path: Path, name: str, seed: int) -> ChaosJob:
    workdir = tmp_path / name
    files = write_event_files(
        workdir / "events", files=6, events_per_file=EVENTS_PER_FILE, seed=seed
    )
    return ChaosJob(
        workdir=workdir,
        root=str(tmp_path / "data"),
        event_files=files,
        name=name,
        tables={"totals": f"tables/{name}-totals", "changes": "tables/all-changes"},
        settings=["sinks.1.shared=true"],
        master="local[1]",
    )


def _own_changes(job: ChaosJob, other: ChaosJob) -> list[tuple]:
    """The shared table's rows minus the other job's: the other job's rows are the
    reference after some prefix of its batches, so try each (few batches: cheap)."""
    rows = Counter((r["key"], r["events"], r["total"]) for r in job.table_rows("changes"))
    for _, theirs in other.references(other.batch_files()):
        if not theirs <= rows:  # the table lacks some of these rows of the other job
            continue
        remaining = sorted((rows - theirs).elements())
        try:
            job.check_invariants(changes=remaining)
            return remaining
        except InvariantViolation:
            continue
    raise InvariantViolation(
        f"the shared table matches no pair of prefixes of the two jobs' batches: "
        f"{job.log} / {other.log}"
    )


def _kill_loop(job: ChaosJob, seed: int, errors: list[BaseException]) -> None:
    rng = random.Random(seed)
    points = itertools.cycle(rng.sample(POINTS[:6], 6))  # the batch and commit points
    try:
        for n in range(KILLS_EACH):
            if len(job.event_files) - job.completed_batches() < 4:
                job.event_files += write_event_files(
                    job.event_files[0].parent,
                    files=4,
                    events_per_file=EVENTS_PER_FILE,
                    first_file=len(job.event_files),
                    seed=seed,
                )
            if n % 2:
                job.run(crash_at=f"{next(points)}:{rng.randint(1, 2)}")
            else:
                job.run(kill_after=rng.uniform(6.0, 12.0))
        while job.run() != "finished":  # pragma: no cover - a clean run finishes
            pass
    except BaseException as error:  # noqa: BLE001 - reported by the test thread
        errors.append(error)


def test_two_lineages_append_to_one_table_through_kills(tmp_path: Path) -> None:
    a, b = _job(tmp_path, "totals-a", seed=11), _job(tmp_path, "totals-b", seed=12)
    errors: list[BaseException] = []
    threads = [
        threading.Thread(target=_kill_loop, args=(a, 1, errors)),
        threading.Thread(target=_kill_loop, args=(b, 2, errors)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for job, other in ((a, b), (b, a)):
        own = _own_changes(job, other)
        totals_at, changes_at = job.check_invariants(changes=own)
        assert totals_at == changes_at == len(job.batch_files()), job.log
        # Every file was processed, in batches the checkpoint recorded (a restart may put
        # two files in one batch): the totals are the whole input's, the changes its batches'.
        batches = job.batch_files()
        assert sorted(p for files in batches for p in files) == sorted(job.event_files)
        assert {
            r["key"]: (r["events"], r["total"]) for r in job.table_rows("totals")
        } == expected_results(job.event_files)[0]
        assert sorted(own) == job.reference_after(batches)[1]
        assert job.unreferenced_files() == [], f"{job.name} left files behind"
        assert job.missing_files() == []
    shared = a.table_rows("changes")
    assert len(shared) == sum(len(j.reference_after(j.batch_files())[1]) for j in (a, b))
    assert a.kills + b.kills >= 2 * KILLS_EACH - 2, (a.log, b.log)  # a crash point may be missed
