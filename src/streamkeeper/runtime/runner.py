"""Run a job spec's streaming query with the write-ahead Delta sink.

Order of a start (each step safe to crash in, see commit/PROTOCOL.md):

1. probe storage; start Spark; build the output and validate everything read-only
   (transform, columns, predicates, existing tables' schemas and writers, a savepoint to
   restore and its topology); a canonical savepoint is written into the empty local
   checkpoint directory here (its uids and state schemas checked on the way): a spec or
   a savepoint that cannot run changes nothing in storage and fences nobody;
2. take the lineage's next epoch (fences every older runner) and start the heartbeat;
3. fence the tables: create missing ones, then commit the epoch to every target table,
   so an older runner's in-flight commit is refused by the table itself;
4. finish what older runners left of savepoints; restore an externalized checkpoint
   (--from-checkpoint) or a native savepoint (--from-savepoint, checked in step 1),
   claim the checkpoint index; 5. recover the WAL against the commit log; 6. run the
   query with the commit coordinator, the supervisor, the heartbeat and the commands
   executor (savepoint, stop, cancel: runtime/commands.py).

From step 2 on every side effect passes the `Fence`: a runner that learns it is fenced
(from a check, a table, or its heartbeat) stops at once and fails with FencedError; it
never recovers, deletes, uploads, applies retention or records a final state.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper import injection
from streamkeeper.commit.batch import BatchContext, BatchWriter
from streamkeeper.commit.coordinator import CommitCoordinator
from streamkeeper.commit.maintenance import (
    MaintenancePolicy,
    ProtectedVersions,
    TableMaintenance,
    lineage_protected_seqs,
)
from streamkeeper.commit.recovery import RecoveryReport, recover
from streamkeeper.commit.sequence import CommitSequence, initial_sequence, lineage_head
from streamkeeper.commit.tables import claim_table, ensure_table, fence_table
from streamkeeper.commit.wal import WriteAheadLog
from streamkeeper.errors import (
    FencedError,
    IncompatibleSavepointError,
    QueryFailedError,
    RewindPendingError,
    SavepointError,
)
from streamkeeper.lineage.commands import Command, CommandBox
from streamkeeper.lineage.control import ControlPlane, Fence
from streamkeeper.lineage.heartbeat import Heartbeat
from streamkeeper.lineage.markers import latest_marker
from streamkeeper.observability.health import CheckpointHealth
from streamkeeper.observability.history import CheckpointHistory
from streamkeeper.observability.progress import ProgressListener
from streamkeeper.runtime.commands import CommandExecutor, Outcome
from streamkeeper.runtime.job import JobPaths, build_output, check_tables, resolve_paths
from streamkeeper.runtime.savepointing import QueryAttempt, SavepointRequest, SavepointTaker
from streamkeeper.runtime.session import build_session
from streamkeeper.runtime.supervisor import QuerySupervisor
from streamkeeper.snapshots import savepoint_points
from streamkeeper.snapshots.externalized import CheckpointUploader, ExternalizedCheckpoints
from streamkeeper.snapshots.restore import check_restorable, restore_checkpoint
from streamkeeper.snapshots.savepoint_disposal import sweep_savepoints
from streamkeeper.snapshots.savepoint_restore import (
    RestorePlan,
    plan_restore,
    restore_canonical,
    restore_native,
)
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.spec import JobSpec
from streamkeeper.storage import probe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["JobPaths", "JobRunner", "RunOptions", "RunResult", "resolve_paths", "run_job"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """How to run a job, beyond its spec."""

    master: str | None = None
    available_now: bool = False  # process what is available, then stop (Trigger.AvailableNow)
    takeover: bool = False
    spec_dir: Path = Path(".")
    from_checkpoint: str | None = None  # restore this externalized checkpoint first: latest|id
    progress: ProgressListener | None = None  # shown on a terminal by the CLI
    # Who started this run (e.g. an Airflow task): recorded in the heartbeat and the job
    # record, so a retried starter finds the driver it launched instead of starting another.
    run_token: str | None = None
    from_savepoint: str | None = None  # restore this savepoint first: an id, or a copied folder
    allow_rewind: bool = False  # restore a savepoint the lineage's head is past
    uid_mapping: dict[str, str] = field(default_factory=dict)  # canonical: old uid -> new
    allow_non_restored_state: bool = False  # canonical: state of operators the job lost
    command_poll_interval: float = 1.0  # how often the commands folder is listed
    # An upgrade's shadow run: (job, lineage) of the running version, whose savepoint
    # (a folder path) it starts from (streamkeeper.upgrade).
    shadow_of: tuple[str, str] | None = None


@dataclass
class RunResult:
    """What a finished run did."""

    batches: int
    last_committed_seq: int
    recovery: RecoveryReport
    tables: dict[str, str]
    visibility_delays_ms: list[float] = field(default_factory=list)  # the newest 10 000
    savepoint_id: str | None = None  # taken by a stop-with-savepoint


class JobRunner:
    """One start of one job: owns the Spark query and the commit coordinator."""

    def __init__(self, spec: JobSpec, options: RunOptions) -> None:
        self.spec = spec
        self.options = options
        self.paths = resolve_paths(spec)
        self.store = self.paths.root.store()
        self.control = ControlPlane(self.store, self.paths.layout)
        self.fence: Fence | None = None
        self._stop_requested = threading.Event()
        self._stopped_by: str | None = None  # the signal that asked us to stop
        self._query: StreamingQuery | None = None
        self._coordinator: CommitCoordinator | None = None
        self._supervisor: QuerySupervisor | None = None
        self._checkpoints: ExternalizedCheckpoints | None = None
        self._restore: RestorePlan | None = None
        self._spark: Any = None
        self._output: Any = None
        self._commands: CommandExecutor | None = None
        self._savepoints: SavepointTaker | None = None
        self._cancelled = False  # a cancel (SIGTERM, cancel command), not a stop
        self._stop_reason: str | None = None  # a stop or cancel command's, for the heartbeat
        self._stop_savepoint: str | None = None
        self._schemas: dict[str, Any] | None = None  # set by warm_up
        self._probed = False
        self._rewind_pending: dict[str, Any] | None = None  # set by _check_rewind_pending

    def run(self) -> RunResult:
        # From the first instant: a SIGTERM while Spark starts or recovery runs stops the
        # job once it is safe (before its query starts), rather than killing it mid-step.
        self._install_stop_signal()
        self._probe()
        self._check_restore_options()
        self._check_rewind_pending()
        spark, output, schemas = self.warm_up()
        if self._restore is not None and self._restore.manifest.format == "native":
            from streamkeeper.snapshots.state_metadata import check_topology, planned_operators

            check_topology(self._restore.manifest, planned_operators(spark, output))
        self._restore_canonical()
        self.fence = fence = Fence(
            self.control, self.control.acquire(takeover=self.options.takeover)
        )
        log.info("took epoch %d of lineage %s", fence.epoch, self.paths.layout.lineage)
        health = CheckpointHealth(self.spec.checkpoint.tolerable_failures)
        heartbeat = Heartbeat(
            self.control, fence, lambda: self._facts(health), on_fenced=self._on_fenced
        )
        heartbeat.start()
        try:
            self._write_job_record()
            self._prepare_tables(schemas)
            self._sweep_savepoints()
            self._externalize()
            self._clear_rewind_pending()
            self._start_commands(spark)
            result = self._run_attempts(output, health)
            fence.check()
            if self._checkpoints is not None:
                self._checkpoints.on_stop(cancelled=self._cancelled)
        except BaseException as error:
            failure = _as_fenced(error)
            reason = f"{type(failure).__name__}: {failure}"
            heartbeat.stop("FAILED", reason=reason)
            self._answer_stop(False, reason)
            if failure is not error:
                raise failure from None
            raise
        final_state, reason = self._final_state(result)
        result.savepoint_id = self._stop_savepoint
        heartbeat.stop(final_state, reason=reason, savepoint_id=self._stop_savepoint)
        self._answer_stop(True, reason)
        return result

    def warm_up(self) -> tuple[Any, Any, dict[str, Any]]:
        """Start Spark, build the output, check the tables: read-only, and done once.

        An upgrade's green calls it before blue stops, so the handover does not wait for
        it; `run` calls it otherwise.
        """
        if self._schemas is None:
            self._probe()
            spark = build_session(self.spec, self.options.master)
            log.info("spark session ready (master %s)", spark.sparkContext.master)
            self._spark = spark
            self._output = build_output(spark, self.spec, self.options.spec_dir)
            self._schemas = check_tables(self.spec, self.paths, self._output)
        return self._spark, self._output, self._schemas

    def _probe(self) -> None:
        if not self._probed:
            probe(self.paths.root)
            self._probed = True

    def _check_rewind_pending(self) -> None:
        """A rollback that restored the tables and did not finish: only the start from its
        savepoint may run (state the tables no longer hold would otherwise run on them)."""
        self._rewind_pending = pending = self.store.read_json(self.paths.layout.rewind_pending)
        restoring = None if self._restore is None else self._restore.manifest.id
        if pending is not None and pending.get("savepoint") != restoring:
            savepoint = pending.get("savepoint")
            raise RewindPendingError(
                f"job {self.spec.name!r}: a rollback restored its tables to savepoint "
                f"{savepoint!r} and did not finish; a start from "
                f"{'its head' if restoring is None else repr(restoring)} would run state "
                "the tables no longer hold. Run the rollback again, or start from that "
                f"savepoint: --from-savepoint {savepoint} --allow-rewind --takeover"
            )

    def _clear_rewind_pending(self) -> None:
        """The start from the rolled-back-to savepoint holds its state and owns the tables.

        Read again, now that this runner holds the lineage: a rollback that ran since the
        check may have recorded another savepoint, which is not this start's to clear.
        """
        if self._rewind_pending is None:
            return  # none at the check: nothing of this start's to clear
        layout = self.paths.layout
        pending = self.store.read_json(layout.rewind_pending)
        if pending is not None and pending.get("savepoint") == self._rewind_pending["savepoint"]:
            self.store.delete([layout.rewind_pending])
            log.info("rollback to savepoint %s completed by this start", pending["savepoint"])

    def _check_restore_options(self) -> None:
        """Every restore option checked, and the savepoint found and checked: reads only."""
        options = self.options
        if options.from_checkpoint is not None and options.from_savepoint is not None:
            raise SavepointError(
                "--from-checkpoint and --from-savepoint exclude each other; pass one"
            )
        if options.from_checkpoint is not None:
            check_restorable(
                self.store, self.paths.layout, self.paths.checkpoint_dir, options.from_checkpoint
            )
        if options.from_savepoint is None:
            if options.uid_mapping or options.allow_non_restored_state or options.allow_rewind:
                raise SavepointError(
                    "--uid-mapping, --allow-non-restored-state and --allow-rewind apply to "
                    "a restore from a savepoint; add --from-savepoint ID, or drop them"
                )
            return
        self._restore = plan = plan_restore(
            self.paths.root,
            self.paths.layout,
            options.from_savepoint,
            self.paths.checkpoint_dir,
            head_seq=self._committed_seq(),
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

    def _restore_canonical(self) -> None:
        """Write a canonical savepoint's state into the checkpoint directory, before the
        epoch is taken.

        It writes only the local directory (through a work folder it removes on failure),
        so a savepoint whose uids or state schemas do not fit the job is refused having
        changed nothing: no epoch, no heartbeat, no table fenced. A start that fails after
        it (a live runner, say) resumes from the directory: its marker names the savepoint.
        """
        plan = self._restore
        if plan is None or plan.already_restored or plan.manifest.format != "canonical":
            return
        options = self.options
        restore_canonical(
            plan,
            self.paths.checkpoint_dir,
            self._spark,
            self.spec,
            self._output,
            uid_mapping=options.uid_mapping,
            allow_non_restored_state=options.allow_non_restored_state,
        )
        self._restore = replace(plan, already_restored=True)

    def _committed_seq(self) -> int | None:
        """The highest seq the lineage committed anywhere (None if it never did); reads only."""
        targets = self.paths.targets.values()
        committed = [t.committed_seq() for t in targets if t.exists()]
        near = max(committed, default=-1)
        head = latest_marker(self.store, self.paths.layout, near=near if near >= 0 else None)
        seen = [*committed, -1 if head is None else int(head["seq"])]
        return max(seen) if max(seen) >= 0 else None

    def _answer_stop(self, ok: bool, reason: str) -> None:
        """Answer the stop or cancel command under way, if any (never fails the run)."""
        if self._commands is None or self._commands.deferred is None:
            return
        try:
            self._commands.finish_deferred(ok, reason)
        except Exception:  # noqa: BLE001 - fenced, or storage gone: the log says why
            log.warning("could not answer the stop command", exc_info=True)

    def _final_state(self, result: RunResult) -> tuple[str, str]:
        """What a run that ended without failing records, and why (read by `status`)."""
        if self._stop_reason is not None:
            return "STOPPED", self._stop_reason
        if self._stop_requested.is_set():
            return "STOPPED", f"{self._stopped_by or 'a stop'} received"
        if not self.options.available_now:
            return "FINISHED", "the query ended"
        if result.batches == 0:
            return "FINISHED", "all input processed (nothing new)"
        return "FINISHED", "all input processed"

    # -- start-up, after the epoch is ours -------------------------------------------

    def _write_job_record(self) -> None:
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
            "restored_from_savepoint": None if self._restore is None else self._restore.reference(),
        }
        self.control.write_owned(self.paths.layout.job_record, self.fence.lease, record)

    def _prepare_tables(self, schemas: dict[str, Any]) -> None:
        """Create missing tables, record this lineage as a writer, commit our epoch."""
        assert self.fence is not None
        for sink in self.spec.sinks:
            target = self.paths.targets[sink.name]
            self.fence.check()
            ensure_table(target, schemas[sink.name])
            claim_table(target, self.spec.name, sink.shared)
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

    def _sweep_savepoints(self) -> None:
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

    def _externalize(self) -> None:
        """Restore an externalized checkpoint or a savepoint if asked; set up uploads."""
        assert self.fence is not None
        layout, directory = self.paths.layout, self.paths.checkpoint_dir
        plan = self._restore
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
        self._checkpoints = ExternalizedCheckpoints.for_spec(
            self.spec.checkpoint.externalized, self.store, layout, directory, self.fence
        )
        if self._checkpoints is not None:
            self._checkpoints.take_ownership()

    def _on_fenced(self, error: FencedError) -> None:
        """The heartbeat found a newer owner: stop the query now; the run fails with it."""
        if self.fence is not None:
            self.fence.mark_fenced(error)
        query = self._query
        if query is not None:
            threading.Thread(target=query.stop, daemon=True).start()

    def _facts(self, health: CheckpointHealth) -> dict[str, Any]:
        facts = health.facts()
        facts.update(interval=self.spec.checkpoint.interval, timeout=self.spec.checkpoint.timeout)
        facts["run_token"] = self.options.run_token
        if self._restore is not None:
            facts["restored_from_savepoint"] = self._restore.manifest.id
        if self._coordinator is not None:
            facts.update(self._coordinator.facts())
        if self._supervisor is not None:
            facts["data_available"] = self._supervisor.data_available
        return facts

    # -- attempts --------------------------------------------------------------------

    def _run_attempts(self, output: DataFrame, health: CheckpointHealth) -> RunResult:
        """Run the query; after a tolerated failed checkpoint, recover and run it again."""
        assert self.fence is not None
        batches = 0
        while True:
            coordinator, writer, report = self._prepare_attempt(output, health)
            try:
                self._run_query(output, writer, coordinator, health)
                self.fence.check()  # a query stopped because we were fenced is no success
                return self._result(batches + writer.batches_seen, coordinator, report)
            except QueryFailedError as error:
                batches += writer.batches_seen
                if self._stop_requested.is_set():
                    raise
                self.fence.check()  # FencedError is never tolerated, however it surfaced
                if _as_fenced(error) is not error:
                    raise _as_fenced(error) from None
                health.failed(str(error))  # raises once failures exceed the tolerable number
                log.warning("failed checkpoint tolerated (%s); restarting the query", error)
                if self._stop_requested.wait(max(self.spec.checkpoint.min_pause, 1.0)):
                    log.warning("stop requested while restarting; not restarting the query")
                    return self._result(batches, coordinator, report)

    def _result(
        self, batches: int, coordinator: CommitCoordinator, report: RecoveryReport
    ) -> RunResult:
        return RunResult(
            batches=batches,
            last_committed_seq=coordinator.stats.last_seq,
            recovery=report,
            tables={name: t.location.uri for name, t in self.paths.targets.items()},
            visibility_delays_ms=list(coordinator.stats.visibility_delays_ms),
        )

    def _prepare_attempt(
        self, output: DataFrame, health: CheckpointHealth
    ) -> tuple[CommitCoordinator, BatchWriter, RecoveryReport]:
        """A fresh coordinator and batch writer, after recovering the WAL."""
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
            checkpoints=self._checkpoints,
            maintenance=self._table_maintenance(),
        )
        checkpoint = SparkCheckpoint(self.paths.checkpoint_dir)
        sequence = CommitSequence(initial_sequence(store, layout, targets, (head, committed)))
        report = recover(coordinator, checkpoint, sequence, self.control)
        log.info("recovery: %s", report)
        writer = BatchWriter(
            BatchContext(
                spec=self.spec,
                layout=layout,
                coordinator=coordinator,
                sequence=sequence,
                checkpoint=checkpoint,
                fence=self.fence,
                output_columns=list(output.columns),
            )
        )
        self._coordinator = coordinator
        return coordinator, writer, report

    def _table_maintenance(self) -> TableMaintenance:
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

    def _run_query(
        self,
        output: DataFrame,
        writer: BatchWriter,
        coordinator: CommitCoordinator,
        health: CheckpointHealth,
    ) -> None:
        if self._stop_requested.is_set():
            return
        self._query = query = self._start_query(output, writer)
        coordinator.start(writer.ctx.checkpoint)
        attempt = QueryAttempt(query, writer, coordinator)
        commands = self._commands
        self._supervisor = QuerySupervisor(
            query=query,
            coordinator=coordinator,
            health=health,
            history=CheckpointHistory(self.paths.history),
            timeout=self.spec.checkpoint.timeout,
            stop_requested=self._stop_requested,
            progress=self.options.progress,
            on_poll=None if commands is None else lambda: self._poll_commands(attempt),
            history_kept=self.spec.maintenance.history_checkpoints,
            history_every=self.spec.maintenance.every,
        )
        self._supervisor.watch_until_done()

    def _start_query(self, output: DataFrame, writer: BatchWriter) -> StreamingQuery:
        stream = (
            output.writeStream.queryName(f"streamkeeper-{self.spec.name}")
            .foreachBatch(writer)
            .outputMode(self.spec.output_mode)
            .option("checkpointLocation", str(self.paths.checkpoint_dir))
        )
        if self.options.available_now:
            stream = stream.trigger(availableNow=True)
        else:
            stream = stream.trigger(
                processingTime=f"{int(self.spec.checkpoint.interval * 1000)} milliseconds"
            )
        return stream.start()

    def _install_stop_signal(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def request_stop(signum: int, _frame: object) -> None:
            log.warning("signal %s: stopping at the next batch boundary", signum)
            self._stopped_by = signal.Signals(signum).name
            self._cancelled = True
            self._stop_requested.set()
            self._stop_query()

        signal.signal(signal.SIGTERM, request_stop)

    def _stop_query(self) -> None:
        """Stop the query from another thread (it may wait for a batch to let go)."""
        query = self._query
        if query is not None:
            threading.Thread(target=query.stop, daemon=True).start()

    # -- commands (savepoint, stop, cancel) --------------------------------------------

    def _start_commands(self, spark: Any) -> None:
        assert self.fence is not None
        self._savepoints = SavepointTaker(
            spec=self.spec,
            spec_dir=self.options.spec_dir,
            paths=self.paths,
            fence=self.fence,
            spark=spark,
            checkpoints=self._checkpoints,
        )
        box = CommandBox(self.store, self.paths.layout)
        self._commands = CommandExecutor(
            box, self.fence, handlers={}, interval=self.options.command_poll_interval
        )
        try:
            self._commands.acknowledge_old_results()
        except Exception:  # noqa: BLE001 - housekeeping; the next start tries again
            log.warning("could not archive old command results", exc_info=True)

    def _poll_commands(self, attempt: QueryAttempt) -> None:
        assert self._commands is not None
        self._commands.handlers = {
            "savepoint": lambda command: self._savepoint(attempt, command),
            "stop": lambda command: self._stop(attempt, command),
            "cancel": lambda command: self._cancel(command),
        }
        self._commands.poll()

    def _savepoint(self, attempt: QueryAttempt, command: Command) -> Outcome:
        assert self._savepoints is not None
        request = SavepointRequest(command.format, command.self_contained, command.id)
        taken = self._savepoints.take(request, attempt)
        return _savepoint_outcome(taken)

    def _stop(self, attempt: QueryAttempt, command: Command) -> Outcome:
        """Stop at a batch boundary, after a savepoint unless the command says not to."""
        assert self._savepoints is not None
        reason = f"stop command {command.id}"

        def drain() -> None:
            attempt.writer.boundary.drain(f"the job is stopping ({reason})")
            self._stop_requested.set()

        if command.savepoint:
            request = SavepointRequest(command.format, command.self_contained, command.id)
            taken = self._savepoints.take(request, attempt, then=drain)
            self._stop_savepoint = taken.savepoint_id
            self._stop_reason = f"stopped with savepoint {taken.savepoint_id} ({reason})"
            outcome = _savepoint_outcome(taken)
            savepoint_points.reached("stop_after_savepoint")
        else:
            drained = self._savepoints.stop_at_boundary(attempt, then=drain)
            self._stop_reason = f"stopped at batch boundary {drained} ({reason})"
            outcome = Outcome(details={"drained_batch": drained})
        self._stop_query()
        outcome.deferred = True  # answered once the query has stopped
        return outcome

    def _cancel(self, command: Command) -> Outcome:
        """Stop now: the batch in flight is interrupted; the last checkpoint stays."""
        self._cancelled = True
        self._stop_reason = f"cancelled (cancel command {command.id})"
        self._stop_requested.set()
        self._stop_query()
        return Outcome(deferred=True)


def _savepoint_outcome(taken: Any) -> Outcome:
    manifest = taken.manifest
    return Outcome(
        savepoint_id=taken.savepoint_id,
        timings=dict(taken.timings),
        details={
            "seq": manifest.seq,
            "batch_id": manifest.batch_id,
            "format": manifest.format,
            "storage": manifest.storage,
            "files": len(manifest.files),
            "bytes": manifest.size,
            "in_flight_batch": taken.in_flight,
            "deleted_by_retention": taken.deleted_by_retention,
        },
    )


def _as_fenced(error: BaseException) -> BaseException:
    """A FencedError that reached us wrapped in Spark's query exception, unwrapped."""
    if isinstance(error, QueryFailedError) and "FencedError" in str(error):
        return FencedError(str(error))
    return error


def run_job(spec: JobSpec, options: RunOptions) -> RunResult:
    """Run `spec` until it finishes (available-now), is stopped, or fails."""
    injection.load_from_environment()
    started = time.monotonic()
    result = JobRunner(spec, options).run()
    log.info(
        "job %s ran %d batches in %.1fs", spec.name, result.batches, time.monotonic() - started
    )
    return result


def main_guard() -> None:
    """Make the PySpark driver's own logging quiet enough to read."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)
