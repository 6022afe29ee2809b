"""Taking a lineage: what a start does between its checks and its query, Spark-free.

The order (each step safe to crash in, see commit/PROTOCOL.md):

1. `check`: every restore option, a savepoint to restore and a rollback left halfway;
   reads only, so a start that cannot run changes nothing and fences nobody;
2. `take`: the lineage's next epoch (fences every older runner);
3. `own`: the job record, the tables (created, claimed, fenced with the epoch), what
   older runners left of savepoints, a restore of an externalized checkpoint or a native
   savepoint, the checkpoint index; a rollback's record is cleared by the start from its
   savepoint;
4. `attempt`: a commit coordinator for the query's attempt, after recovering the WAL.

From step 2 on every side effect passes the `Fence`. The runner (runner.py) wraps these
steps around its Spark session and query; the lifecycle property test drives them with
synthetic batches.
"""

from __future__ import annotations

import logging
from typing import Any

from streamkeeper.commit.coordinator import CommitCoordinator
from streamkeeper.commit.maintenance import (
    MaintenancePolicy,
    ProtectedVersions,
    TableMaintenance,
    lineage_protected_seqs,
)
from streamkeeper.commit.recovery import RecoveryReport, recover
from streamkeeper.commit.sequence import (
    CommitSequence,
    initial_sequence,
    lineage_head,
    lineage_position,
)
from streamkeeper.commit.tables import claim_table, ensure_table, fence_table
from streamkeeper.commit.wal import WriteAheadLog
from streamkeeper.errors import (
    CheckpointRestoreError,
    FencedError,
    IncompatibleSavepointError,
    RewindPendingError,
    SavepointError,
)
from streamkeeper.lineage.control import ControlPlane, Fence
from streamkeeper.lineage.rewind import rewind_advice
from streamkeeper.observability.health import CheckpointHealth
from streamkeeper.runtime.job import JobPaths
from streamkeeper.runtime.options import RunOptions
from streamkeeper.snapshots.externalized import CheckpointUploader, ExternalizedCheckpoints
from streamkeeper.snapshots.restore import check_restorable, restore_checkpoint
from streamkeeper.snapshots.savepoint_disposal import sweep_savepoints
from streamkeeper.snapshots.savepoint_restore import RestorePlan, plan_restore, restore_native
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.spec import JobSpec

log = logging.getLogger(__name__)


class LineageStart:
    """One start's hold on its job's lineage, from the checks to a recovered attempt."""

    def __init__(self, spec: JobSpec, options: RunOptions, paths: JobPaths) -> None:
        self.spec = spec
        self.options = options
        self.paths = paths
        self.store = paths.root.store()
        self.control = ControlPlane(self.store, paths.layout)
        self.fence: Fence | None = None
        self.restore: RestorePlan | None = None
        self.checkpoints: ExternalizedCheckpoints | None = None
        self.rewind_pending: dict[str, Any] | None = None  # set by check_rewind_pending

    def check(self) -> None:
        """Step 1: everything a start checks before it changes anything; reads only."""
        self.check_restore_options()
        self.check_lineage_state()

    def take(self) -> Fence:
        """Step 2: the lineage's next epoch.

        What the start found at its check can change before it holds the lineage (a
        driver's Spark session takes seconds to start): a handover or a rollback may have
        moved the checkpoint folder aside, or a rollback restored the tables. Checked
        again just before the epoch is taken (so a start refused then fences nobody) and
        once more under it (nothing that moves the folder or restores tables runs past a
        newer epoch unnoticed).
        """
        self.check_lineage_state()
        self.fence = Fence(self.control, self.control.acquire(takeover=self.options.takeover))
        log.info("took epoch %d of lineage %s", self.fence.epoch, self.paths.layout.lineage)
        self.check_lineage_state()
        return self.fence

    def check_lineage_state(self) -> None:
        """The checks that read what other actors change: a rollback halfway, and the
        checkpoint folder a new query would start from."""
        self.check_rewind_pending()
        self.check_fresh_start()

    def own(self, schemas: dict[str, Any]) -> None:
        """Step 3: records, tables, savepoints, restores (see the module docstring)."""
        self.sweep_unfinished_writes()
        self.write_job_record()
        self.prepare_tables(schemas)
        self.sweep_savepoints()
        self.externalize()
        self.clear_rewind_pending()

    def sweep_unfinished_writes(self) -> None:
        """Spark's log writes a killed driver left half done (see SparkCheckpoint)."""
        assert self.fence is not None
        self.fence.check()
        removed = SparkCheckpoint(self.paths.checkpoint_dir).sweep_unfinished_writes()
        if removed:
            log.info("removed unfinished checkpoint writes of an earlier run: %s", removed)

    def _release_rollback_hold(self, savepoint_id: str) -> None:
        """The rollback's target is an ordinary savepoint again (retention may take it)."""
        from streamkeeper.errors import UnknownSavepointError
        from streamkeeper.snapshots.savepoints import ROLLBACK_HOLDER, SavepointRegistry

        try:
            SavepointRegistry(self.store, self.paths.layout).release(savepoint_id, ROLLBACK_HOLDER)
        except UnknownSavepointError:
            pass  # deleted by hand meanwhile, after the rollback had run

    def check_restore_options(self) -> None:
        """Every restore option checked, and the savepoint found and checked: reads only."""
        options = self.options
        if options.from_checkpoint is not None and options.from_savepoint is not None:
            raise SavepointError(
                "--from-checkpoint and --from-savepoint exclude each other; pass one"
            )
        if options.from_checkpoint is not None:
            self.check_checkpoint_restore(options.from_checkpoint)
        if options.from_savepoint is None:
            if options.uid_mapping or options.allow_non_restored_state:
                raise SavepointError(
                    "--uid-mapping and --allow-non-restored-state apply to a restore from a "
                    "savepoint; add --from-savepoint ID, or drop them"
                )
            if options.allow_rewind and options.from_checkpoint is None:
                raise SavepointError(
                    "--allow-rewind applies to a restore (--from-savepoint ID or "
                    "--from-checkpoint ID); add one, or drop it"
                )
            return
        self.restore = plan = plan_restore(
            self.paths.root,
            self.paths.layout,
            options.from_savepoint,
            self.paths.checkpoint_dir,
            head_seq=self.position(),
            allow_rewind=options.allow_rewind,
            shadow_of=options.shadow_of,
        )
        native = plan.manifest.format == "native"
        if native and (options.uid_mapping or options.allow_non_restored_state):
            raise SavepointError(
                f"savepoint {plan.manifest.id!r} is native: it restores into the same "
                "operators, so --uid-mapping and --allow-non-restored-state do not apply; "
                "drop them, or restore a canonical savepoint"
            )
        backend = self.spec.state_backend.type
        if native and plan.manifest.state_backend != backend:
            # Spark keeps the provider its checkpoint names: the spec's would be ignored.
            raise IncompatibleSavepointError(
                f"savepoint {plan.manifest.id!r} is native, with state backend "
                f"{plan.manifest.state_backend!r}; this spec's state_backend.type is "
                f"{backend!r}, which Spark would silently ignore. Take a canonical savepoint "
                f"(--format canonical) to move the state into {backend!r}, or keep "
                f"state_backend.type: {plan.manifest.state_backend}"
            )
        uids = sorted(op.uid for op in plan.manifest.operators)
        unknown = sorted(set(options.uid_mapping) - set(uids))
        if unknown:  # before Spark starts
            raise IncompatibleSavepointError(
                f"--uid-mapping renames {unknown}, which savepoint {plan.manifest.id!r} does "
                f"not have; its uids are {uids}: map those (`streamkeeper savepoints "
                f"describe {plan.manifest.id}`)"
            )
        if plan.rewinds:
            log.warning(
                "restoring savepoint %s rewinds lineage %s to seq %d: the batches after it "
                "run again (--allow-rewind)",
                plan.manifest.id,
                self.paths.layout.lineage,
                plan.manifest.seq,
            )

    def check_rewind_pending(self) -> None:
        """A rollback that restored the tables and did not finish: only the start from its
        savepoint may run (state the tables no longer hold would otherwise run on them)."""
        self.rewind_pending = pending = self.store.read_json(self.paths.layout.rewind_pending)
        restoring = None if self.restore is None else self.restore.manifest.id
        if pending is None:
            return
        if pending.get("marker_seq") is None or pending.get("savepoint") != restoring:
            raise RewindPendingError(f"job {self.spec.name!r}: {rewind_advice(pending)}")

    def position(self) -> int | None:
        """The seq whose output the tables hold (None if the lineage never committed)."""
        return lineage_position(self.store, self.paths.layout, self.paths.targets)

    def check_checkpoint_restore(self, checkpoint: str) -> None:
        """An externalized checkpoint older than where the lineage stands rewinds it: the
        batches after it would be written again. Refused unless asked for, as a savepoint."""
        layout = self.paths.layout
        # Where the lineage stands is read before `latest` is resolved: a runner still
        # running externalizes each checkpoint before its commit, so a checkpoint read
        # after the position is at or above it (read the other way round, a commit
        # landing in between made the latest checkpoint look like a rewind).
        position = self.position()
        manifest = check_restorable(self.store, layout, self.paths.checkpoint_dir, checkpoint)
        if position is None or manifest.checkpoint_id >= position or self.options.allow_rewind:
            return
        raise CheckpointRestoreError(
            f"checkpoint {manifest.checkpoint_id} (batch {manifest.batch_id}) is older than "
            f"where lineage {layout.lineage!r} stands (seq {position}): restoring it rewinds "
            "the job, and the batches after it run again, their output written twice. "
            "Restore the latest checkpoint (--from-checkpoint latest), or pass --allow-rewind "
            "to rewind anyway"
        )

    def check_fresh_start(self) -> None:
        """A start with nothing to resume from, under a lineage that committed, would run a
        new query that reads its input from the start and writes it all again."""
        options = self.options
        restoring = options.from_checkpoint is not None or options.from_savepoint is not None
        directory = self.paths.checkpoint_dir
        if restoring or options.allow_fresh_start or SparkCheckpoint(directory).query_id():
            return
        from streamkeeper.snapshots.index import read_index

        position = self.position()
        if position is not None:
            stands = f"has committed up to seq {position}"
        else:
            # Nothing committed yet, but Spark completed batches whose checkpoint was
            # externalized before their commit: the WAL still holds them, and a restore of
            # that checkpoint commits them. A new query would discard them (its recovery
            # cannot vouch for another query's batches) and a later restore would then
            # skip them: their rows lost (found by the deep profile, seed 13).
            externalized = read_index(self.store, self.paths.layout).ids
            if not externalized:
                return
            stands = f"has externalized checkpoint {externalized[-1]}, not yet committed"
        raise CheckpointRestoreError(
            f"job {self.spec.name!r}: its checkpoint directory {str(directory)!r} holds no "
            f"checkpoint, but lineage {self.paths.layout.lineage!r} {stands}: a new query "
            f"would read its input from the start again and write it twice. Resume where "
            f"it stands: {self._restore_advice()}; or, to start the input over on purpose, "
            "--allow-fresh-start"
        )

    def _restore_advice(self) -> str:
        """The restores that would resume this lineage, newest first, as options."""
        from streamkeeper.snapshots.index import read_index
        from streamkeeper.snapshots.savepoints import SavepointRegistry

        layout = self.paths.layout
        advice = []
        if read_index(self.store, layout).ids:
            advice.append("--from-checkpoint latest (its latest externalized checkpoint)")
        complete = [
            e
            for e in SavepointRegistry(self.store, layout).read().savepoints
            if e.state == "complete"
        ]
        if complete:
            newest = max(complete, key=lambda e: (-1 if e.seq is None else e.seq, e.created_at))
            advice.append(f"--from-savepoint {newest.id} (its newest savepoint)")
        advice.append("move the job's checkpoint folder back into place")
        return ", or ".join(advice)

    def clear_rewind_pending(self) -> None:
        """The start from the rolled-back-to savepoint holds its state and owns the tables.

        Read again, now that this runner holds the lineage: a rollback that ran since the
        check may have recorded another savepoint, which is not this start's to clear.
        """
        if self.rewind_pending is None:
            return  # none at the check: nothing of this start's to clear
        assert self.fence is not None
        layout = self.paths.layout
        pending, version = self.store.read_versioned(layout.rewind_pending)
        if (
            pending is not None
            and version is not None
            and pending.get("savepoint") == self.rewind_pending["savepoint"]
            and int(pending.get("epoch", 0) or 0) < self.fence.epoch  # not a newer rollback's
            and self.store.delete_if(layout.rewind_pending, version)
        ):
            log.info("rollback to savepoint %s completed by this start", pending["savepoint"])
            self._release_rollback_hold(str(pending["savepoint"]))

    def write_job_record(self) -> None:
        """What any reader (CLI, Airflow) needs to find this job's lineage and tables."""
        assert self.fence is not None
        checkpoint = self.spec.checkpoint
        record = {
            "job": self.spec.name,
            "lineage": self.paths.layout.lineage,
            "root": self.paths.root.uri,
            "checkpoint_dir": str(self.paths.checkpoint_dir),
            "interval": checkpoint.interval,
            "timeout": checkpoint.timeout,
            "max_concurrent": checkpoint.max_concurrent,
            "tables": {
                sink.name: {
                    "table": self.paths.targets[sink.name].location.uri,
                    "output": sink.output,
                    "mode": self.spec.sink_mode(sink),
                }
                for sink in self.spec.sinks
            },
            "started_at": self.fence.lease.started_at,
            "run_token": self.options.run_token,
            # Savepoint retention never deletes the savepoint a job was restored from.
            "restored_from_savepoint": None if self.restore is None else self.restore.reference(),
        }
        self.control.write_owned(self.paths.layout.job_record, self.fence.lease, record)

    def prepare_tables(self, schemas: dict[str, Any]) -> None:
        """Create missing tables, record this lineage as a writer, commit our epoch."""
        assert self.fence is not None
        for sink in self.spec.sinks:
            target = self.paths.targets[sink.name]
            self.fence.check()
            ensure_table(target, schemas[sink.name])
            claim_table(target, self.spec.name, sink.shared, sink.output)
            try:
                fence_table(target, self.fence.epoch)
            except FencedError as error:
                self.fence.mark_fenced(error)
                raise
        log.info(
            "tables ready and fenced at epoch %d: %s",
            self.fence.epoch,
            {n: t.location.uri for n, t in self.paths.targets.items()},
        )

    def sweep_savepoints(self) -> None:
        """Finish what older runners left half done: savepoints, uploads for savepoints."""
        assert self.fence is not None
        self.fence.check()
        try:
            sweep_savepoints(self.store, self.paths.layout, self.fence.epoch)
        except FencedError as error:
            self.fence.mark_fenced(error)
            raise
        index_exists = self.store.exists(self.paths.layout.checkpoint_index)
        if not self.spec.checkpoint.externalized.enabled and index_exists:
            # Savepoints uploaded checkpoints to pin them: own the index, sweep leftovers.
            uploader = CheckpointUploader(
                self.store, self.paths.layout, self.paths.checkpoint_dir, self.fence.epoch
            )
            uploader.take_ownership()

    def externalize(self) -> None:
        """Restore an externalized checkpoint or a savepoint if asked; set up uploads."""
        assert self.fence is not None
        layout, directory = self.paths.layout, self.paths.checkpoint_dir
        plan = self.restore
        if plan is not None and not plan.already_restored:  # native (canonical: done)
            self.fence.check()
            restore_native(plan, directory)
        elif plan is not None:
            log.info("%s already holds savepoint %s; resuming", directory, plan.manifest.id)
        if self.options.from_checkpoint is not None:
            self.fence.check()
            restore_checkpoint(
                self.store,
                layout,
                directory,
                self.options.from_checkpoint,
                progress=None if self.options.progress is None else self.options.progress.restore,
            )
        self.checkpoints = ExternalizedCheckpoints.for_spec(
            self.spec.checkpoint.externalized, self.store, layout, directory, self.fence
        )
        if self.checkpoints is not None:
            self.checkpoints.take_ownership()
            if plan is not None and plan.manifest.lineage == layout.lineage and not plan.rewinds:
                # Flink's restore point: until this run's first checkpoint completes, a
                # restart must resume from the savepoint, and retention may long have
                # retired the checkpoint it was taken at (a rollback forgets the later
                # ones). A restart from the latest checkpoint, its machine lost, would
                # otherwise rewind, or read the input from the start again.
                self.checkpoints.restore_point(plan.manifest.seq, plan.manifest.id)

    def attempt(
        self, health: CheckpointHealth | None
    ) -> tuple[CommitCoordinator, CommitSequence, RecoveryReport]:
        """Step 4: a fresh coordinator and commit sequence, after recovering the WAL."""
        assert self.fence is not None
        store, layout, targets = self.store, self.paths.layout, self.paths.targets
        head, committed = lineage_head(store, layout, targets)
        coordinator = CommitCoordinator(
            store=store,
            layout=layout,
            wal=WriteAheadLog(store, layout),
            targets=targets,
            fence=self.fence,
            head=head,
            max_pending=self.spec.checkpoint.max_concurrent,
            health=health,
            checkpoints=self.checkpoints,
            maintenance=self.table_maintenance(),
        )
        checkpoint = SparkCheckpoint(self.paths.checkpoint_dir)
        sequence = CommitSequence(initial_sequence(store, layout, targets, (head, committed)))
        report = recover(coordinator, checkpoint, sequence, self.control)
        log.info("recovery: %s", report)
        return coordinator, sequence, report

    def recover_again(self, coordinator: CommitCoordinator, sequence: CommitSequence) -> None:
        """Recovery once more, at the attempt's first batch (`BatchWriter._run_batch`)."""
        checkpoint = SparkCheckpoint(self.paths.checkpoint_dir)
        report = recover(coordinator, checkpoint, sequence, self.control)
        if report.committed or report.discarded or report.swept_claims:
            log.warning("recovery at the first batch (a fenced runner's late batch): %s", report)

    def table_maintenance(self) -> TableMaintenance:
        store, layout, settings = self.store, self.paths.layout, self.spec.maintenance
        return TableMaintenance(
            targets=self.paths.targets,
            shared={sink.name for sink in self.spec.sinks if sink.shared},
            protected=ProtectedVersions(
                store, layout, seqs=lambda: lineage_protected_seqs(store, layout)
            ),
            policy=MaintenancePolicy(
                settings.every, settings.history_retention, settings.markers_kept
            ),
        )
