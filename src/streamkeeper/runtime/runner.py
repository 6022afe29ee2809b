"""Run a job spec's streaming query with the write-ahead Delta sink.

Order of a start (each step safe to crash in, see PROTOCOL.md):
probe storage -> take the lineage's next epoch (fences older runners) -> restore an
externalized checkpoint if asked (--from-checkpoint) -> start Spark ->
create or check the target tables -> recover the WAL against the commit log -> start
the query, the commit coordinator and the heartbeat.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper import injection
from streamkeeper.commit.batch import BatchContext, BatchWriter, check_sink_columns
from streamkeeper.commit.coordinator import CommitCoordinator, CommitSequence, initial_sequence
from streamkeeper.commit.recovery import RecoveryReport, recover
from streamkeeper.commit.tables import TableTarget, ensure_table
from streamkeeper.commit.wal import WriteAheadLog
from streamkeeper.errors import SpecError
from streamkeeper.lineage.control import ControlPlane, Heartbeat, Lease
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.observability.health import CheckpointHealth
from streamkeeper.observability.history import CheckpointHistory
from streamkeeper.runtime.session import build_session
from streamkeeper.runtime.supervisor import QueryFailedError, QuerySupervisor
from streamkeeper.snapshots.externalized import ExternalizedCheckpoints
from streamkeeper.snapshots.restore import restore_checkpoint
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.sources import build_source
from streamkeeper.spec import JobSpec
from streamkeeper.storage import Location, S3Settings, probe, resolve_root

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """How to run a job, beyond its spec."""

    master: str | None = None
    available_now: bool = False  # process what is available, then stop (Trigger.AvailableNow)
    takeover: bool = False
    spec_dir: Path = Path(".")
    from_checkpoint: str | None = None  # restore this externalized checkpoint first: latest|id


@dataclass
class RunResult:
    """What a finished run did."""

    batches: int
    last_committed_seq: int
    recovery: RecoveryReport
    tables: dict[str, str]
    visibility_delays_ms: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class JobPaths:
    """Resolved locations of one job."""

    root: Location
    layout: LineageLayout
    checkpoint_dir: Path
    targets: dict[str, TableTarget]

    @property
    def history(self) -> Location:
        """The lineage's checkpoint history table."""
        return self.root.child(f"{self.layout.base}/history")


def resolve_paths(spec: JobSpec) -> JobPaths:
    """Resolve the storage root, checkpoint directory and every sink's table."""
    root = Location(resolve_root(spec.storage.root), S3Settings.from_env(spec.storage))
    layout = LineageLayout(root, spec.lineage_id, spec.name)
    checkpoint = Path(spec.checkpoint.dir or f".streamkeeper/checkpoints/{spec.lineage_id}")
    targets = {
        sink.name: TableTarget(
            sink=sink.name,
            location=root.child(sink.table or f"tables/{sink.name}"),
            data_app_id=layout.data_app_id(sink.name),
            fence_app_id=layout.fence_app_id(),
        )
        for sink in spec.sinks
    }
    return JobPaths(root, layout, checkpoint.resolve(), targets)


def load_transform(spec: JobSpec, spec_dir: Path) -> Callable[[DataFrame], DataFrame]:
    """Import `module:function` or `file.py:function` (relative to the spec's folder)."""
    module_ref, function_name = spec.transform.split(":")
    try:
        if module_ref.endswith(".py"):
            path = (spec_dir / module_ref).resolve()
            module_spec = importlib.util.spec_from_file_location(f"_sk_{spec.name}", path)
            if module_spec is None or module_spec.loader is None or not path.is_file():
                raise FileNotFoundError(path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(module_ref)
        return getattr(module, function_name)
    except (ImportError, FileNotFoundError, AttributeError) as error:
        raise SpecError(
            f"transform {spec.transform!r} cannot be loaded ({type(error).__name__}: {error}); "
            "expected 'package.module:function' or 'file.py:function' next to the spec"
        ) from None


def _arrow_schema(output: DataFrame, columns: list[str]) -> Any:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(output.select(*columns).schema)


class JobRunner:
    """One start of one job: owns the Spark query and the commit coordinator."""

    def __init__(self, spec: JobSpec, options: RunOptions) -> None:
        self.spec = spec
        self.options = options
        self.paths = resolve_paths(spec)
        self.store = self.paths.root.store()
        self.control = ControlPlane(self.store, self.paths.layout)
        self._stop_requested = threading.Event()
        self._coordinator: CommitCoordinator | None = None
        self._supervisor: QuerySupervisor | None = None
        self._checkpoints: ExternalizedCheckpoints | None = None

    def run(self) -> RunResult:
        probe(self.paths.root)
        lease = self.control.acquire(takeover=self.options.takeover)
        health = CheckpointHealth(self.spec.checkpoint.tolerable_failures)
        heartbeat = Heartbeat(self.control, lease, lambda: self._facts(health))
        heartbeat.start()
        try:
            self._externalize(lease)
            spark = build_session(self.spec, self.options.master)
            log.info("spark session ready (master %s)", spark.sparkContext.master)
            output = self._build_output(spark)
            log.info("tables ready: %s", {n: t.location.uri for n, t in self.paths.targets.items()})
            result = self._run_attempts(output, lease, health)
            if self._checkpoints is not None:
                self._checkpoints.on_stop(cancelled=self._stop_requested.is_set())
        except BaseException as error:
            heartbeat.stop("FAILED", reason=f"{type(error).__name__}: {error}")
            raise
        heartbeat.stop("STOPPED" if self._stop_requested.is_set() else "FINISHED")
        return result

    def _externalize(self, lease: Lease) -> None:
        """Restore an externalized checkpoint if asked; set up uploads if the spec says so."""
        layout, directory = self.paths.layout, self.paths.checkpoint_dir
        if self.options.from_checkpoint is not None:
            restore_checkpoint(self.store, layout, directory, self.options.from_checkpoint)
        self._checkpoints = ExternalizedCheckpoints.for_spec(
            self.spec.checkpoint.externalized,
            self.store,
            layout,
            directory,
            guard=lambda: self.control.check_not_fenced(lease),
        )

    def _facts(self, health: CheckpointHealth) -> dict[str, Any]:
        facts = health.facts()
        facts.update(interval=self.spec.checkpoint.interval, timeout=self.spec.checkpoint.timeout)
        if self._coordinator is not None:
            facts.update(self._coordinator.facts())
        if self._supervisor is not None:
            facts["data_available"] = self._supervisor.data_available
        return facts

    def _run_attempts(self, output: DataFrame, lease: Lease, health: CheckpointHealth) -> RunResult:
        """Run the query; after a tolerated failed checkpoint, recover and run it again."""
        batches = 0
        while True:
            coordinator, writer, report = self._prepare_attempt(output, lease, health)
            try:
                self._run_query(output, writer, coordinator, health)
                return RunResult(
                    batches=batches + writer.batches_seen,
                    last_committed_seq=coordinator.stats.last_seq,
                    recovery=report,
                    tables={name: t.location.uri for name, t in self.paths.targets.items()},
                    visibility_delays_ms=coordinator.stats.visibility_delays_ms,
                )
            except QueryFailedError as error:
                batches += writer.batches_seen
                if self._stop_requested.is_set():
                    raise
                health.failed(str(error))  # raises once failures exceed the tolerable number
                log.warning("failed checkpoint tolerated (%s); restarting the query", error)
                time.sleep(max(self.spec.checkpoint.min_pause, 1.0))

    def _prepare_attempt(
        self, output: DataFrame, lease: Lease, health: CheckpointHealth
    ) -> tuple[CommitCoordinator, BatchWriter, RecoveryReport]:
        """A fresh coordinator and batch writer, after recovering the WAL."""
        coordinator = CommitCoordinator(
            store=self.store,
            layout=self.paths.layout,
            wal=WriteAheadLog(self.store, self.paths.layout),
            targets=self.paths.targets,
            control=self.control,
            lease=lease,
            health=health,
            checkpoints=self._checkpoints,
        )
        checkpoint = SparkCheckpoint(self.paths.checkpoint_dir)
        sequence = CommitSequence(
            initial_sequence(self.store, self.paths.layout, self.paths.targets)
        )
        report = recover(coordinator, checkpoint, sequence)
        log.info("recovery: %s", report)
        writer = BatchWriter(
            BatchContext(
                spec=self.spec,
                layout=self.paths.layout,
                coordinator=coordinator,
                sequence=sequence,
                checkpoint=checkpoint,
                lease=lease,
                output_columns=list(output.columns),
            )
        )
        self._coordinator = coordinator
        return coordinator, writer, report

    def _build_output(self, spark: SparkSession) -> DataFrame:
        transform = load_transform(self.spec, self.options.spec_dir)
        output = transform(build_source(spark, self.spec.source))
        check_sink_columns(self.spec, list(output.columns))
        for sink in self.spec.sinks:
            columns = list(sink.columns or output.columns)
            ensure_table(self.paths.targets[sink.name], _arrow_schema(output, columns))
        return output

    def _run_query(
        self,
        output: DataFrame,
        writer: BatchWriter,
        coordinator: CommitCoordinator,
        health: CheckpointHealth,
    ) -> None:
        query = self._start_query(output, writer)
        coordinator.start(writer.ctx.checkpoint)
        self._install_stop_signal(query)
        self._supervisor = QuerySupervisor(
            query=query,
            coordinator=coordinator,
            health=health,
            history=CheckpointHistory(self.paths.history),
            timeout=self.spec.checkpoint.timeout,
            stop_requested=self._stop_requested,
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

    def _install_stop_signal(self, query: StreamingQuery) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def request_stop(signum: int, _frame: object) -> None:
            log.warning("signal %s: stopping at the next batch boundary", signum)
            self._stop_requested.set()
            threading.Thread(target=query.stop, daemon=True).start()

        signal.signal(signal.SIGTERM, request_stop)


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
