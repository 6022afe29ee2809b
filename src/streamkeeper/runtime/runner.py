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
   claim the checkpoint index; 5. recover the WAL against the commit log (steps 1-5
   are Spark-free: `ownership.LineageStart`); 6. run the query with the commit
   coordinator, the supervisor, the heartbeat and the commands executor (savepoint,
   stop, cancel: runtime/commands.py).

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
from streamkeeper.commit.recovery import RecoveryReport
from streamkeeper.errors import FencedError, QueryFailedError
from streamkeeper.lineage.commands import Command, CommandBox
from streamkeeper.lineage.control import ControlPlane, Fence
from streamkeeper.lineage.heartbeat import Heartbeat
from streamkeeper.observability.health import CheckpointHealth
from streamkeeper.observability.history import CheckpointHistory
from streamkeeper.runtime.commands import CommandExecutor, Outcome
from streamkeeper.runtime.job import JobPaths, build_output, check_tables, resolve_paths
from streamkeeper.runtime.options import RunOptions
from streamkeeper.runtime.ownership import LineageStart
from streamkeeper.runtime.python_workers import warm_python_workers
from streamkeeper.runtime.savepointing import QueryAttempt, SavepointRequest, SavepointTaker
from streamkeeper.runtime.session import build_session
from streamkeeper.runtime.start_phases import StartPhases
from streamkeeper.runtime.supervisor import QuerySupervisor
from streamkeeper.snapshots import savepoint_points
from streamkeeper.snapshots.savepoint_restore import restore_canonical
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.spec import JobSpec
from streamkeeper.storage import probe

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["JobPaths", "JobRunner", "RunOptions", "RunResult", "resolve_paths", "run_job"]

log = logging.getLogger(__name__)


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
        self._start: LineageStart | None = None  # set by run
        self._spark: Any = None
        self._output: Any = None
        self._commands: CommandExecutor | None = None
        self._savepoints: SavepointTaker | None = None
        self._cancelled = False  # a cancel (SIGTERM, cancel command), not a stop
        self._stop_reason: str | None = None  # a stop or cancel command's, for the heartbeat
        self._stop_savepoint: str | None = None
        self._schemas: dict[str, Any] | None = None  # set by warm_up
        self._probed = False
        self._spark_ui: str | None = None  # the driver's Spark UI, for the operators' links
        self._phases = StartPhases()  # where the start's time goes (logged at INFO)
        self._bootstrap: Any = None  # a canonical restore's bootstrap, run ahead
        self._planned: list[Any] | None = None  # the query's stateful operators, planned once

    def run(self) -> RunResult:
        # From the first instant: a SIGTERM while Spark starts or recovery runs stops the
        # job once it is safe (before its query starts), rather than killing it mid-step.
        self._install_stop_signal()
        phases = self._phases
        self._probe()
        phases.lap("storage probe")
        self._start = start = LineageStart(self.spec, self.options, self.paths)
        start.check()
        phases.lap("lineage checks")
        spark, output, schemas = self.warm_up()
        self._spark_ui = spark.sparkContext.uiWebUrl  # None with spark.ui.enabled=false
        phases.lap("Spark session and plan")
        if start.restore is not None and start.restore.manifest.format == "native":
            from streamkeeper.snapshots.state_metadata import check_topology

            check_topology(start.restore.manifest, self.planned_operators())
        self._restore_canonical()
        phases.lap("restore")
        self.fence = fence = start.take()
        health = CheckpointHealth(self.spec.checkpoint.tolerable_failures)
        heartbeat = Heartbeat(
            self.control,
            fence,
            lambda: self._facts(health),
            on_fenced=self._on_fenced,
            beats=lambda: ControlPlane(self.paths.root.store(fail_fast=True), self.paths.layout),
        )
        heartbeat.start()
        if self.options.on_heartbeat is not None:
            self.options.on_heartbeat(fence.lease.epoch)
        phases.lap("fence and heartbeat")
        try:
            start.own(schemas)
            self._start_commands(spark)
            phases.lap("records, tables and checkpoints")
            result = self._run_attempts(output, health)
            fence.check()
            if start.checkpoints is not None:
                start.checkpoints.on_stop(cancelled=self._cancelled)
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
            warm_python_workers(spark)  # while the plan, fence and recovery run
            self._spark = spark
            self._output = build_output(spark, self.spec, self.options.spec_dir)
            self._schemas = check_tables(self.spec, self.paths, self._output)
        return self._spark, self._output, self._schemas

    def planned_operators(self) -> list[Any]:
        """The query's stateful operators (Spark's streaming `explain`), planned once.

        A native restore checks the savepoint's topology against them. An upgrade's green
        plans them after `warm_up`, while blue still runs, so the check in the handover's
        gap reads them (the explain is 0.05-0.1 s of py4j and planning).
        """
        if self._planned is None:
            from streamkeeper.snapshots.state_metadata import planned_operators

            spark, output, _ = self.warm_up()
            self._planned = planned_operators(spark, output)
        return self._planned

    def prepare_canonical_restore(self, work: Path) -> None:
        """Run the bootstrap of a canonical restore ahead, into `work` (beside the
        checkpoint directory): `run` with a canonical savepoint then starts the restore
        at its state. An upgrade's green calls it after `warm_up`, while blue still runs;
        `discard_prepared` removes it if no restore takes it.
        """
        from streamkeeper.snapshots import canonical

        spark, output, _ = self.warm_up()
        self._bootstrap = canonical.prepare_restore(
            spark, self.spec, self.paths.checkpoint_dir, output, work
        )

    def discard_prepared(self) -> None:
        """Remove a prepared bootstrap that no restore took (nothing if none is left)."""
        if self._bootstrap is not None:
            self._bootstrap.discard()
            self._bootstrap = None

    def _probe(self) -> None:
        if not self._probed:
            probe(self.paths.root)
            self._probed = True

    def _restore_canonical(self) -> None:
        """Write a canonical savepoint's state into the checkpoint directory, before the
        epoch is taken.

        It writes only the local directory (through a work folder it removes on failure),
        so a savepoint whose uids or state schemas do not fit the job is refused having
        changed nothing: no epoch, no heartbeat, no table fenced. A start that fails after
        it (a live runner, say) resumes from the directory: its marker names the savepoint.
        """
        assert self._start is not None
        plan = self._start.restore
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
            bootstrap=self._bootstrap,
        )
        self._bootstrap = None  # taken (and removed) by the restore
        self._start.restore = replace(plan, already_restored=True)

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
        facts["spark_ui"] = self._spark_ui
        restore = None if self._start is None else self._start.restore
        if restore is not None:
            facts["restored_from_savepoint"] = restore.manifest.id
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
        assert self.fence is not None and self._start is not None
        coordinator, sequence, report = self._start.attempt(health)
        if not self._phases.logged:
            self._phases.lap("recovery")
        writer = BatchWriter(
            BatchContext(
                spec=self.spec,
                layout=self.paths.layout,
                coordinator=coordinator,
                sequence=sequence,
                checkpoint=SparkCheckpoint(self.paths.checkpoint_dir),
                fence=self.fence,
                output_columns=list(output.columns),
                before_first_batch=lambda: self._start.recover_again(coordinator, sequence),
            )
        )
        self._coordinator = coordinator
        return coordinator, writer, report

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
        if not self._phases.logged:
            self._phases.lap("query start")
            self._phases.log_once()
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
            checkpoints=None if self._start is None else self._start.checkpoints,
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
        request = SavepointRequest.of(command)
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
            request = SavepointRequest.of(command)
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
