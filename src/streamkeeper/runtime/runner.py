"""Run a job spec's streaming query with the write-ahead Delta sink.

Order of a start (each step safe to crash in, see commit/PROTOCOL.md):

1. probe storage; start Spark; build the output and validate everything read-only
   (transform, columns, predicates, existing tables' schemas and writers): a spec that
   cannot run changes nothing and fences nobody;
2. take the lineage's next epoch (fences every older runner) and start the heartbeat;
3. fence the tables: create missing ones, then commit the epoch to every target table,
   so an older runner's in-flight commit is refused by the table itself;
4. restore an externalized checkpoint if asked (--from-checkpoint), claim the checkpoint
   index; 5. recover the WAL against the commit log; 6. run the query with the commit
   coordinator, the supervisor and the heartbeat.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper import injection
from streamkeeper.commit.batch import BatchContext, BatchWriter
from streamkeeper.commit.coordinator import CommitCoordinator
from streamkeeper.commit.recovery import RecoveryReport, recover
from streamkeeper.commit.sequence import CommitSequence, initial_sequence, lineage_head
from streamkeeper.commit.tables import claim_table, ensure_table, fence_table
from streamkeeper.commit.wal import WriteAheadLog
from streamkeeper.errors import FencedError, QueryFailedError
from streamkeeper.lineage.control import ControlPlane, Fence
from streamkeeper.lineage.heartbeat import Heartbeat
from streamkeeper.observability.health import CheckpointHealth
from streamkeeper.observability.history import CheckpointHistory
from streamkeeper.observability.progress import ProgressListener
from streamkeeper.runtime.job import JobPaths, build_output, check_tables, resolve_paths
from streamkeeper.runtime.session import build_session
from streamkeeper.runtime.supervisor import QuerySupervisor
from streamkeeper.snapshots.externalized import ExternalizedCheckpoints
from streamkeeper.snapshots.restore import check_restorable, restore_checkpoint
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


@dataclass
class RunResult:
    """What a finished run did."""

    batches: int
    last_committed_seq: int
    recovery: RecoveryReport
    tables: dict[str, str]
    visibility_delays_ms: list[float] = field(default_factory=list)


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

    def run(self) -> RunResult:
        probe(self.paths.root)
        if self.options.from_checkpoint is not None:
            check_restorable(
                self.store,
                self.paths.layout,
                self.paths.checkpoint_dir,
                self.options.from_checkpoint,
            )
        spark = build_session(self.spec, self.options.master)
        log.info("spark session ready (master %s)", spark.sparkContext.master)
        output = build_output(spark, self.spec, self.options.spec_dir)
        schemas = check_tables(self.spec, self.paths, output)
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
            self._externalize()
            result = self._run_attempts(output, health)
            fence.check()
            if self._checkpoints is not None:
                self._checkpoints.on_stop(cancelled=self._stop_requested.is_set())
        except BaseException as error:
            failure = _as_fenced(error)
            heartbeat.stop("FAILED", reason=f"{type(failure).__name__}: {failure}")
            if failure is not error:
                raise failure from None
            raise
        final_state, reason = self._final_state(result)
        heartbeat.stop(final_state, reason=reason)
        return result

    def _final_state(self, result: RunResult) -> tuple[str, str]:
        """What a run that ended without failing records, and why (read by `status`)."""
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

    def _externalize(self) -> None:
        """Restore an externalized checkpoint if asked; set up uploads if the spec says so."""
        assert self.fence is not None
        layout, directory = self.paths.layout, self.paths.checkpoint_dir
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
            visibility_delays_ms=coordinator.stats.visibility_delays_ms,
        )

    def _prepare_attempt(
        self, output: DataFrame, health: CheckpointHealth
    ) -> tuple[CommitCoordinator, BatchWriter, RecoveryReport]:
        """A fresh coordinator and batch writer, after recovering the WAL."""
        assert self.fence is not None
        store, layout, targets = self.store, self.paths.layout, self.paths.targets
        head, _ = lineage_head(store, layout, targets)
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
        )
        checkpoint = SparkCheckpoint(self.paths.checkpoint_dir)
        sequence = CommitSequence(initial_sequence(store, layout, targets))
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

    def _run_query(
        self,
        output: DataFrame,
        writer: BatchWriter,
        coordinator: CommitCoordinator,
        health: CheckpointHealth,
    ) -> None:
        self._install_stop_signal()
        if self._stop_requested.is_set():
            return
        self._query = query = self._start_query(output, writer)
        coordinator.start(writer.ctx.checkpoint)
        self._supervisor = QuerySupervisor(
            query=query,
            coordinator=coordinator,
            health=health,
            history=CheckpointHistory(self.paths.history),
            timeout=self.spec.checkpoint.timeout,
            stop_requested=self._stop_requested,
            progress=self.options.progress,
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
            self._stop_requested.set()
            query = self._query
            if query is not None:
                threading.Thread(target=query.stop, daemon=True).start()

        signal.signal(signal.SIGTERM, request_stop)


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
