"""What the lifecycle property test's actors do: the real code of a runner, a handover, a
rollback, each as one operation the scheduler runs step by step.

A runner here is `JobRunner` without Spark: the same `LineageStart` (checks, epoch,
tables, savepoint sweep, restores, recovery), the same `BatchWriter` and executor-side
writer, the same `CommitCoordinator` (its commits driven here rather than by its thread),
the same `SavepointTaker` and `CommandExecutor`. What Spark would do is synthetic
(world.py).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from streamkeeper.client import StreamkeeperClient
from streamkeeper.commit.batch import BatchContext, BatchWriter
from streamkeeper.commit.coordinator import CommitCoordinator
from streamkeeper.lineage.commands import Command, CommandBox
from streamkeeper.runtime.commands import CommandExecutor, Outcome
from streamkeeper.runtime.options import RunOptions
from streamkeeper.runtime.ownership import LineageStart
from streamkeeper.runtime.savepointing import QueryAttempt, SavepointRequest, SavepointTaker
from streamkeeper.snapshots.index import read_index
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.upgrade import points
from streamkeeper.upgrade.handover import settle_dead_handover, stop_blue
from streamkeeper.upgrade.record import UpgradeRecords
from streamkeeper.upgrade.rollback import restore_tables
from streamkeeper.upgrade.steps import savepoint_manifest, set_aside
from tests.support.lifecycle.scheduler import Actor, pause_here
from tests.support.lifecycle.world import JOB, SCHEMA, SyntheticFrame, SyntheticQuery, World


@dataclass(frozen=True)
class RunnerPlan:
    """What one runner does: its start options, then batches and savepoints."""

    job: str = JOB
    batches: int = 3
    savepoint_after: int | None = None  # a savepoint once this many batches ran
    from_savepoint: str | None = None
    allow_rewind: bool = False
    from_checkpoint: str | None = None
    until_input_ends: bool = False  # run every batch there is, then stop (a final run)


class _Taker(SavepointTaker):
    """The real savepoint taker; the stateful operators' metadata (Spark's) is none."""

    def _operators_of(self, attempt: QueryAttempt, batch_id: int) -> list:
        return []


class SimRunner:
    """One start of one job, its batches run by the scheduler's actor."""

    def __init__(self, world: World, plan: RunnerPlan, actor: Actor) -> None:
        self.world = world
        self.plan = plan
        self.actor = actor
        self.spec = world.spec(plan.job)
        self.paths = world.paths(plan.job)
        self.stopping: str | None = None

    def run(self, after_start: Any = None) -> str:
        plan, paths = self.plan, self.paths
        options = RunOptions(
            takeover=True,
            spec_dir=self.world.base,
            from_savepoint=plan.from_savepoint,
            allow_rewind=plan.allow_rewind,
            from_checkpoint=plan.from_checkpoint,
        )
        start = LineageStart(self.spec, options, paths)
        start.check()
        fence = start.take()
        start.own(self.world.schemas(plan.job))
        coordinator, sequence, _report = start.attempt(health=None)
        checkpoint = SparkCheckpoint(paths.checkpoint_dir)
        coordinator._checkpoint = checkpoint  # committed from here, not by its thread
        writer = BatchWriter(
            BatchContext(
                spec=self.spec,
                layout=paths.layout,
                coordinator=coordinator,
                sequence=sequence,
                checkpoint=checkpoint,
                fence=fence,
                output_columns=list(SCHEMA.names),
                before_first_batch=lambda: start.recover_again(coordinator, sequence),
            )
        )
        query = SyntheticQuery(
            paths.checkpoint_dir, self.world.inputs[plan.job], self.world.batch_size
        )
        query.ensure_started()
        attempt = QueryAttempt(SimpleNamespace(isActive=True), writer, coordinator)  # type: ignore[arg-type]
        taker = _Taker(
            spec=self.spec,
            spec_dir=self.world.base,
            paths=paths,
            fence=fence,
            spark=SimpleNamespace(version="synthetic"),  # type: ignore[arg-type]
            checkpoints=start.checkpoints,
        )
        commands = CommandExecutor(
            CommandBox(paths.root.store(), paths.layout),
            fence,
            handlers={
                "stop": lambda command: self._stop(taker, attempt, command),
                "savepoint": lambda command: self._savepoint(taker, attempt, command),
                "cancel": lambda command: self._cancel(),
            },
            interval=0.0,
        )
        if after_start is not None:
            after_start()
        ran = 0
        while True:
            commands.poll()
            if self.stopping is not None:
                break
            if ran >= plan.batches and not plan.until_input_ends:
                pause_here("idle")  # a running job with nothing to do: it waits for commands
                continue
            planned = query.next_batch()
            if planned is None:
                if plan.until_input_ends:
                    break
                pause_here("idle")
                continue
            batch_id, rows = planned
            writer(SyntheticFrame(rows), batch_id)
            query.complete(batch_id)
            _commit_completed(coordinator)
            ran += 1
            if plan.savepoint_after == ran:
                taker.take(SavepointRequest("native", True), attempt)
        _commit_completed(coordinator)
        commands.finish_deferred(True, self.stopping)
        return self.stopping or "ran out of input"

    def _stop(self, taker: SavepointTaker, attempt: QueryAttempt, command: Command) -> Outcome:
        def drain() -> None:
            attempt.writer.boundary.drain(f"stop command {command.id}")

        if command.savepoint:
            request = SavepointRequest("native", True, command.id, command.hold)
            taken = taker.take(request, attempt, then=drain)
            self.stopping = f"stopped with savepoint {taken.savepoint_id}"
            return Outcome(savepoint_id=taken.savepoint_id, deferred=True)
        taker.stop_at_boundary(attempt, then=drain)
        self.stopping = "stopped at a batch boundary"
        return Outcome(deferred=True)

    def _savepoint(self, taker: SavepointTaker, attempt: QueryAttempt, command: Command) -> Outcome:
        taken = taker.take(SavepointRequest("native", True, command.id), attempt)
        return Outcome(savepoint_id=taken.savepoint_id)

    def _cancel(self) -> Outcome:
        self.stopping = "cancelled"
        return Outcome(deferred=True)


def _commit_completed(coordinator: CommitCoordinator) -> None:
    """Flink's notifyCheckpointComplete: commit every queued batch whose checkpoint is done."""
    while coordinator._commit_ready():
        pass


def runner(world: World, plan: RunnerPlan) -> Any:
    return lambda actor: SimRunner(world, plan, actor).run()


def client_of(world: World) -> StreamkeeperClient:
    return StreamkeeperClient(str(world.root))


def begin_handover(world: World) -> str:
    """An upgrade that reached its handover (green's shadow run touches nothing live)."""
    upgrade_id = f"up-{uuid.uuid4().hex[:8]}"
    records = UpgradeRecords(client_of(world).store, JOB)
    records.create(_record(upgrade_id))
    return upgrade_id


def _record(upgrade_id: str) -> Any:
    from streamkeeper.upgrade.record import UpgradeRecord

    return UpgradeRecord(
        id=upgrade_id,
        job=JOB,
        lineage=JOB,
        phase="handover_requested",
        blue={"spec_path": None, "savepoint": None, "checkpoint_dir": None, "launch": None},
        green={"spec_path": None, "shadow_job": f"{JOB}-shadow", "format": "native"},
    )


def green(world: World, upgrade_id: str, batches: int) -> Any:
    """Green's driver from the handover on: blue stopped with S1, then green's live run."""

    def operation(actor: Actor) -> str:
        client = client_of(world)
        records = UpgradeRecords(client.store, JOB)
        record = records.advance(upgrade_id, ("handover_requested",), "handing_over")
        s1 = stop_blue(
            client,
            records,
            record,
            blue_dir=world.live_dir,
            live_dir=world.live_dir,
            started=time.time(),
            timeout=600.0,
        )
        plan = RunnerPlan(batches=batches, from_savepoint=s1.id)
        return SimRunner(world, plan, actor).run()

    return operation


def rollback(
    world: World, savepoint_id: str, upgrade_id: str | None, plan: RunnerPlan | None = None
) -> Any:
    """The rollback task: fence and restore the tables to the savepoint, set the
    checkpoint folder aside, then (the launched driver) blue from the savepoint."""

    def operation(actor: Actor) -> str:
        client = client_of(world)
        records = UpgradeRecords(client.store, JOB)
        manifest = savepoint_manifest(client, JOB, savepoint_id)
        restored = restore_tables(client, JOB, manifest)
        if upgrade_id is not None:
            records.advance(
                upgrade_id, ("live", "rolling_back"), "rolling_back", rollback=restored.to_json()
            )
        set_aside(world.live_dir, f"rollback-{uuid.uuid4().hex[:8]}")
        points.reached("rollback_before_restart")
        restart = plan or RunnerPlan()
        restart = RunnerPlan(
            batches=restart.batches,
            from_savepoint=savepoint_id,  # the tables are at its versions: no rewind
            until_input_ends=restart.until_input_ends,
        )

        def rolled_back() -> None:
            if upgrade_id is not None:
                records.advance(upgrade_id, ("rolling_back",), "rolled_back", reason="rolled back")

        return SimRunner(world, restart, actor).run(after_start=rolled_back)

    return operation


def finishing_operation(world: World, record: Any, plan: RunnerPlan) -> Any:
    """What the DAGs do with what the example left, then the job to the end of its input.

    A green that went live and did not pass its probation (dead, or failed) is rolled
    back to blue's stop savepoint; a rollback left halfway is run again; anything else is
    a start of the job, as the start DAG makes it.
    """

    def operation(actor: Actor) -> str:
        nonlocal record
        client = client_of(world)
        if record is not None and record.phase in ("handover_requested", "handing_over"):
            # The handover task sees green gone: the handover ends failed (blue runs on)
            # or with a failed probation (blue stopped at S1: the rollback restarts it).
            record = (
                settle_dead_handover(client, JOB, record.id, "green's driver is gone") or record
            )
        pending = client.store.read_json(f"jobs/{JOB}/rewind-pending.json")
        if record is not None and record.phase in ("live", "rolling_back"):
            return rollback(world, record.handover["blue_savepoint"], record.id, plan)(actor)
        if pending is not None:
            return rollback(world, pending["savepoint"], None, plan)(actor)
        if (
            not _holds_files(world.live_dir)
            and read_index(client_of(world).store, world.layout()).ids
        ):
            # The machine (or its folder) is gone: the monitor restarts from the latest
            # externalized checkpoint.
            latest = RunnerPlan(until_input_ends=True, from_checkpoint="latest")
            return SimRunner(world, latest, actor).run()
        return SimRunner(world, plan, actor).run()

    return operation


def _holds_files(directory: Any) -> bool:
    return directory.is_dir() and any(directory.iterdir())


def delete_savepoint(world: World, savepoint_id: str) -> Any:
    """An operator deleting a savepoint (`streamkeeper savepoints delete`): refused for one
    that is protected, held, or that something still needs."""

    def operation(actor: Actor) -> str:
        client_of(world).delete_savepoint(savepoint_id)
        return f"deleted {savepoint_id}"

    return operation
