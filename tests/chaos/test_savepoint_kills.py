"""SIGKILL the driver at every named step of taking, deleting and restoring a savepoint
(`streamkeeper.snapshots.savepoint_points`): the previous savepoint stays whole and
restorable, the job starts again and goes on, and the output stays exact.

One lineage, one driver process per kill (`streamkeeper run`, killed by its own crash
point). The take steps kill a running job while it takes a savepoint (pinned,
self-contained or canonical), runs savepoint retention or stops with a savepoint; the
restore steps kill a start from the stop's savepoint into a fresh directory. After each
kill: every complete savepoint is whole, the newest one downloads and verifies, and the
tables hold the result of a prefix of the input, each change once. At the end the
restored job has processed every file exactly once and nothing half taken or half
deleted is left. `STREAMKEEPER_SAVEPOINT_KILL_ROUNDS` repeats the take steps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from deltalake import DeltaTable

from jobs.keyed_totals.sample_events import expected_results, write_event_files
from streamkeeper.client import StreamkeeperClient
from streamkeeper.reader import read_table_rows
from streamkeeper.runtime.runner import resolve_paths
from streamkeeper.snapshots.savepoint_points import POINTS
from streamkeeper.snapshots.savepoint_restore import plan_restore, restore_native
from streamkeeper.snapshots.savepoints import SavepointRegistry
from streamkeeper.spec import load_spec
from tests.chaos.harness import SAMPLE_SPEC, _kill_group
from tests.support.driver import driver_env, run_command
from tests.support.traffic import check_changes, totals_prefix, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.timeout(1800)]

JOB = "keyed-totals"
ROUNDS = int(os.environ.get("STREAMKEEPER_SAVEPOINT_KILL_ROUNDS", "1"))
EVENTS_PER_FILE = 100


@dataclass(frozen=True)
class Step:
    point: str
    kind: str = "savepoint"  # savepoint | stop
    format: str = "native"
    self_contained: bool = False
    retained: int | None = None  # savepoint retention of that run

    @property
    def disposes(self) -> bool:
        return self.point.startswith("savepoint_dispose")


# In this order, no start's sweep reaches the next step's crash point before it is asked
# for a savepoint: the steps before a disposal leave nothing to delete.
TAKE_STEPS = [
    Step("savepoint_after_register"),
    Step("savepoint_after_pin"),
    Step("savepoint_during_copy", self_contained=True),
    Step("savepoint_after_pin", format="canonical"),
    Step("savepoint_before_manifest", self_contained=True),
    Step("savepoint_after_complete", format="canonical"),
    Step("savepoint_dispose_after_mark", retained=1),
    Step("savepoint_after_manifest"),  # its start finishes the deletion
    Step("savepoint_dispose_after_data", retained=1),  # its start completes the savepoint
]
STOP_STEP = Step("stop_after_savepoint", kind="stop")
RESTORE_POINTS = ["restore_savepoint_during_download", "restore_savepoint_after_rename"]
CANONICAL_RESTORE_POINTS = ["restore_state_after_pieces"]  # the last test below


class Lineage:
    """The sample job's driver processes, its input and its checks."""

    def __init__(self, tmp_path: Path) -> None:
        self.base = tmp_path
        self.root = str(tmp_path / "data")
        self.events = tmp_path / "events"
        self.files: list[Path] = []
        self.client = StreamkeeperClient(self.root)
        self.runs: list[str] = []
        spec = load_spec(SAMPLE_SPEC, {"storage.root": self.root})
        self.paths = resolve_paths(spec)

    def feed(self, files: int = 2) -> None:
        self.files += write_event_files(
            self.events, files=files, events_per_file=EVENTS_PER_FILE, first_file=len(self.files)
        )

    def start(
        self,
        checkpoint: str,
        crash_at: str | None = None,
        *,
        retained: int | None = None,
        from_savepoint: str | None = None,
        **env: str,
    ) -> subprocess.Popen:
        settings = [
            f"source.path={self.events}",
            "spark.master=local[2]",
            "spark.shuffle_partitions=2",
            "checkpoint.interval=300ms",
            "checkpoint.externalized.enabled=true",
            "maintenance.every=2",  # expire the Delta log as far as the floor allows
            "maintenance.history_retention=0s",
            *([] if retained is None else [f"savepoints.retained={retained}"]),
        ]
        command = run_command(self.root, self.base / checkpoint, settings)
        if from_savepoint is not None:
            command += ["--from-savepoint", from_savepoint]
        self.runs.append(f"{checkpoint} crash_at={crash_at} from={from_savepoint}")
        log = open(self.base / f"run-{len(self.runs):02d}.log", "wb")  # noqa: SIM115 - the child's
        with log:
            return subprocess.Popen(
                command,
                env=driver_env(crash_at, **env),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.base,
            )

    def head_seq(self) -> int:
        try:
            head = self.client.status(JOB).head
        except Exception:  # noqa: BLE001 - the job has not started yet
            return -1
        return -1 if head is None else head.seq

    def wait_for_batch(self, process: subprocess.Popen, after: int) -> None:
        """A batch of this run committed (the job runs and has state to save)."""
        self.wait_until(process, lambda: self.head_seq() > after, "a batch of the new run")

    def wait_until(
        self, process: subprocess.Popen, condition: Callable[[], bool], what: str
    ) -> None:
        """Wait for `condition` while the driver runs (a driver that ended fails at once)."""

        def reached() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the driver ended ({process.returncode}): {self._log()}")
            return condition()

        wait_for(reached, 300, what)

    def ended(self, process: subprocess.Popen, *, killed: bool, timeout: float = 300) -> None:
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            _kill_group(process)  # the driver's JVM is in its session
        expected = -9 if killed else 0
        assert code == expected, f"driver exit {code}, expected {expected}: {self._log()}"

    def _log(self) -> str:
        text = (self.base / f"run-{len(self.runs):02d}.log").read_text(errors="replace")
        return f"runs {self.runs}; last log:\n{text[-3000:]}"

    # -- checks ------------------------------------------------------------------------

    def complete(self) -> list[str]:
        """Complete savepoints, oldest first."""
        registry = SavepointRegistry(self.client.store, self.paths.layout).read()
        entries = sorted(registry.savepoints, key=lambda e: e.created_at)
        return [e.id for e in entries if e.state == "complete"]

    def check_restorable(self, savepoint_id: str) -> None:
        """Whole, and its files download into a fresh directory with their sha256."""
        described = self.client.describe_savepoint(savepoint_id)
        assert not described.broken, described.problems
        assert described.manifest is not None
        if described.manifest.format == "native":
            probe = self.base / "probe"
            plan = plan_restore(
                self.client.location,
                self.paths.layout,
                savepoint_id,
                probe,
                head_seq=None,
                allow_rewind=True,
            )
            restore_native(plan, probe)
            assert (probe / "commits" / str(described.manifest.batch_id)).is_file()
            shutil.rmtree(probe)

    def rows(self, sink: str) -> list[dict]:
        target = self.paths.targets[sink]
        try:
            return read_table_rows(target.location.uri, location=target.location)
        except Exception:  # noqa: BLE001 - no table before the first commit
            return []

    def check_output(self) -> int:
        """The totals are a prefix of the input; each change row once and explained."""
        totals = {r["key"]: (r["events"], r["total"]) for r in self.rows("totals")}
        changes = [(r["key"], r["events"], r["total"]) for r in self.rows("changes")]
        check_changes(changes, self.files)
        return totals_prefix(totals, self.files)


def _take_step(lineage: Lineage, step: Step) -> None:
    before = lineage.complete()
    lineage.feed()
    seq = lineage.head_seq()
    process = lineage.start("ck-0", f"{step.point}:1", retained=step.retained)
    lineage.wait_for_batch(process, seq)
    lineage.client.send_command(
        JOB, step.kind, format=step.format, self_contained=step.self_contained
    )
    lineage.ended(process, killed=True)
    after = lineage.complete()
    if step.disposes:  # retention deletes older ones; the one just taken is complete
        assert after and after[-1] not in before, (step, before, after)
    else:
        assert set(before) <= set(after), f"a complete savepoint was lost at {step}"
    for savepoint_id in after:
        assert not lineage.client.describe_savepoint(savepoint_id).broken, savepoint_id
    lineage.check_restorable(after[-1])
    lineage.check_output()


def test_sigkill_at_every_savepoint_step_leaves_the_previous_savepoint_and_the_job_intact(
    tmp_path: Path,
) -> None:
    lineage = Lineage(tmp_path)
    lineage.feed(3)
    process = lineage.start("ck-0")
    lineage.wait_for_batch(process, -1)
    first = lineage.client.send_command(JOB, "savepoint")
    assert lineage.client.wait_for_result(JOB, first.id, timeout=300).ok
    stop = lineage.client.send_command(JOB, "stop", savepoint=False)
    assert lineage.client.wait_for_result(JOB, stop.id, timeout=300).ok
    lineage.ended(process, killed=False)

    steps = [s for _ in range(ROUNDS) for s in TAKE_STEPS] + [STOP_STEP]
    reached = {s.point for s in steps} | set(RESTORE_POINTS) | set(CANONICAL_RESTORE_POINTS)
    assert reached == set(POINTS), f"not killed at {set(POINTS) - reached}"
    for step in steps:
        _take_step(lineage, step)
    # The stop's savepoint completed before the kill: nothing was committed after it.
    stopped = lineage.complete()[-1]
    manifest = lineage.client.describe_savepoint(stopped).manifest
    assert manifest is not None and manifest.seq == lineage.head_seq()

    for point in RESTORE_POINTS:  # the job moves to a fresh directory (another machine)
        process = lineage.start("ck-restored", f"{point}:1", from_savepoint=stopped)
        lineage.ended(process, killed=True)
        lineage.check_restorable(stopped)
        lineage.check_output()
    lineage.feed()
    process = lineage.start("ck-restored", from_savepoint=stopped)
    expected_totals = expected_results(lineage.files)[0]
    lineage.wait_until(process, lambda: lineage.check_output() == len(lineage.files), "every file")
    stop = lineage.client.send_command(JOB, "stop")
    assert lineage.client.wait_for_result(JOB, stop.id, timeout=300).ok
    lineage.ended(process, killed=False)

    totals = {r["key"]: (r["events"], r["total"]) for r in lineage.rows("totals")}
    assert totals == expected_totals
    latest: dict[str, tuple[int, int]] = {}
    for key, events, total in (
        (r["key"], r["events"], r["total"]) for r in lineage.rows("changes")
    ):
        latest[key] = max(latest.get(key, (0, 0)), (events, total))
    assert latest == expected_totals
    # Nothing half taken or half deleted is left: the sweeps finished every crash's work.
    registry = SavepointRegistry(lineage.client.store, lineage.paths.layout).read()
    assert {e.state for e in registry.savepoints} == {"complete"}, registry.savepoints
    folders = set(lineage.client.store.children(lineage.paths.layout.savepoints))
    assert folders == {e.id for e in registry.savepoints}
    for savepoint_id in lineage.complete():
        assert not lineage.client.describe_savepoint(savepoint_id).broken
    # Maintenance expired the tables' logs, but never below a savepoint's versions: each
    # savepoint can still roll the tables back (Delta RESTORE reads that version).
    for savepoint_id in lineage.complete():
        manifest = lineage.client.describe_savepoint(savepoint_id).manifest
        assert manifest is not None
        for name, table in manifest.tables.items():
            assert table.version is not None, (savepoint_id, name)
            DeltaTable(table.table, version=table.version)
    log_folder = Path(manifest.tables["totals"].table) / "_delta_log"
    assert not (log_folder / f"{0:020d}.json").exists(), "maintenance never expired the log"


def test_sigkill_between_a_canonical_restores_pieces_and_their_join_restores_again(
    tmp_path: Path,
) -> None:
    """The restore's tasks wrote the state's pieces (as a large state's tasks do), the
    driver is killed before it joins them: the checkpoint directory is still absent, the
    next start restores again, removes the killed restore's work folder, and the job
    goes on exactly from the savepoint."""
    lineage = Lineage(tmp_path)
    lineage.feed(3)
    process = lineage.start("ck-0")
    lineage.wait_for_batch(process, -1)
    stop = lineage.client.send_command(JOB, "stop", format="canonical")
    assert lineage.client.wait_for_result(JOB, stop.id, timeout=300).ok
    lineage.ended(process, killed=False)
    savepoint = lineage.complete()[-1]
    manifest = lineage.client.describe_savepoint(savepoint).manifest
    assert manifest is not None and manifest.format == "canonical"
    lineage.feed()

    on_executors = {"STREAMKEEPER_STATE_ON_EXECUTORS": "1"}
    process = lineage.start(
        "ck-restored", f"{CANONICAL_RESTORE_POINTS[0]}:1", from_savepoint=savepoint, **on_executors
    )
    lineage.ended(process, killed=True)
    assert not (tmp_path / "ck-restored").exists()
    (killed,) = tmp_path.glob(".ck-restored.restore-*")
    pieces = list(killed.rglob(".*.delta.piece-*"))
    assert pieces, f"killed before the tasks wrote their pieces: {list(killed.rglob('*'))}"
    lineage.check_output()

    process = lineage.start("ck-restored", from_savepoint=savepoint, **on_executors)
    lineage.wait_until(process, lambda: lineage.check_output() == len(lineage.files), "every file")
    stop = lineage.client.send_command(JOB, "stop", savepoint=False)
    assert lineage.client.wait_for_result(JOB, stop.id, timeout=300).ok
    lineage.ended(process, killed=False)

    expected_totals = expected_results(lineage.files)[0]
    totals = {r["key"]: (r["events"], r["total"]) for r in lineage.rows("totals")}
    assert totals == expected_totals
    assert not killed.exists(), "the killed restore's work folder was left"
    assert list(tmp_path.glob(".ck-restored.restore-*")) == []
