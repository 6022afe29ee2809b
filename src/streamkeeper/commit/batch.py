"""The foreachBatch function: pre-commit a micro-batch to every sink (see PROTOCOL.md).

One Spark action per batch: executors write every sink's Parquet files in a single
`mapInArrow` pass and return file metadata. A second action would read the source again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamkeeper import injection
from streamkeeper.commit import crashpoints
from streamkeeper.commit.boundary import BatchBoundary
from streamkeeper.commit.coordinator import CommitCoordinator
from streamkeeper.commit.merge_rows import (
    EXAMPLES,
    check_one_row_per_key,
    duplicate_key_error,
    unique_columns,
)
from streamkeeper.commit.sequence import CommitSequence
from streamkeeper.commit.tables import read_staged_files
from streamkeeper.commit.wal import DataFile, Manifest, SinkBatch
from streamkeeper.commit.writer import RESULT_SCHEMA, SinkWritePlan, make_partition_writer
from streamkeeper.errors import FencedError, SpecError
from streamkeeper.lineage.control import Fence
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.runtime.pacing import MinPause
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.spec import JobSpec, SinkSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)


def mask_column(index: int) -> str:
    return f"__streamkeeper_sink_{index}"


def check_sink_columns(spec: JobSpec, output_columns: list[str]) -> None:
    """Every column a sink names must be in the job's output."""
    for sink in spec.sinks:
        wanted = [*(sink.columns or []), *sink.key, *([sink.order_by] if sink.order_by else [])]
        missing = [c for c in wanted if c not in output_columns]
        if missing:
            raise SpecError(
                f"sink {sink.name!r} names columns {missing} that the transformation does not "
                f"produce; its output columns are {output_columns}"
            )


def refuse_duplicate_keys(
    sinks: list[SinkSpec],
    plans: list[SinkWritePlan],
    files: dict[str, list[DataFile]],
    repeated: dict[str, list[dict[str, Any]]],
) -> None:
    """Refuse a merge sink's batch with two rows for one key, before its manifest exists.

    Refused at commit time, after its checkpoint completed, the batch could never be
    committed. Each task checked its own file (`repeated`: what they found); across files
    only the unique columns are read back, and only when a sink has more than one file.

    Raises:
        DuplicateKeyError: naming the sink, the repeated values and the fix.
    """
    by_name = {sink.name: sink for sink in sinks}
    for plan in plans:
        if not plan.unique:
            continue
        sink = by_name[plan.sink]
        if plan.sink in repeated:
            examples = repeated[plan.sink][:EXAMPLES]
            raise duplicate_key_error(sink.name, sink.key, sink.order_by, examples)
        staged = files.get(plan.sink, [])
        if len(staged) > 1:
            values = read_staged_files(staged, plan.directory, columns=list(plan.unique))
            check_one_row_per_key(values, sink.name, sink.key, sink.order_by)


@dataclass
class BatchContext:
    """What the batch function needs; built once per attempt by the runner."""

    spec: JobSpec
    layout: LineageLayout
    coordinator: CommitCoordinator
    sequence: CommitSequence
    checkpoint: SparkCheckpoint
    fence: Fence
    output_columns: list[str]
    # Called once, before the attempt's first batch claims anything: recovery again (see
    # `BatchWriter._run_batch`).
    before_first_batch: Callable[[], None] | None = None


class BatchWriter:
    """Callable passed to `DataStreamWriter.foreachBatch`."""

    def __init__(self, context: BatchContext) -> None:
        self.ctx = context
        self.batches_seen = 0
        self.min_pause = MinPause(context.spec.checkpoint.min_pause)
        self.boundary = BatchBoundary()

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        self.min_pause.before_batch()
        # Held for the whole batch: a savepoint or a stop waits for it, and a draining
        # job refuses the batch here, before anything of it is written.
        with self.boundary.batch(batch_id):
            self._run_batch(batch_df, batch_id)
        self.min_pause.after_batch()

    def _run_batch(self, batch_df: DataFrame, batch_id: int) -> None:
        ctx = self.ctx
        injection.reached("batch_start", batch_id=batch_id)
        # A fenced runner must not even pre-commit: its batch fails and the query stops.
        ctx.fence.check()
        if self.batches_seen == 0 and ctx.before_first_batch is not None:
            # A runner this one fenced, on the same checkpoint folder, may have finished a
            # batch after this runner's recovery looked (sealed its manifest, and its Spark
            # wrote commits/N): this query then starts after that batch. Recovering again
            # now commits it before any seq of ours is committed above it.
            ctx.before_first_batch()
        manifest, done = self._claim(batch_id)
        try:
            self._pre_commit(batch_df, manifest, done)
        except FencedError:
            raise  # not ours any more: touch nothing
        except BaseException:
            if manifest.version is not None and not manifest.complete:
                self._abandon(manifest)
            raise
        crashpoints.reached("batch_after_manifest")
        in_batch = [
            name
            for name, part in manifest.sinks.items()
            if part.mode != "exactly_once" and name not in done
        ]
        if in_batch:
            ctx.coordinator.commit_sinks(manifest, in_batch)
        crashpoints.reached("batch_after_commit")
        ctx.coordinator.submit(manifest)  # waits while too many commits are pending
        self.batches_seen += 1

    def _pre_commit(
        self, batch_df: DataFrame, manifest: Manifest, done: dict[str, SinkBatch]
    ) -> None:
        """Write the batch's files and seal its manifest with them."""
        ctx = self.ctx
        plans = [
            self._plan(index, sink, manifest.seq)
            for index, sink in enumerate(ctx.spec.sinks)
            if sink.name not in done
        ]
        files = self._write_files(batch_df, plans) if plans else {}
        crashpoints.reached("batch_before_manifest")
        for sink in ctx.spec.sinks:
            if sink.name not in done:
                manifest.sinks[sink.name].files = files.get(sink.name, [])
        ctx.coordinator.wal.seal(manifest)
        log.info(
            "batch %d pre-committed as seq %d: %s",
            manifest.batch_id,
            manifest.seq,
            {name: part.rows for name, part in manifest.sinks.items()},
        )

    def _abandon(self, manifest: Manifest) -> None:
        """A batch that failed before its seal: remove its files now, and void its claim.

        The claim is voided, not retired: the batch's tasks can outlive this call (a
        cancelled Spark job's tasks finish the files they were writing), and only the
        claim leads a later sweep to what they wrote. The next recovery (this runner's
        next attempt, the next start, a rollback) sweeps its folders again and forgets the
        claim once this runner is gone. Best effort; recovery does all of it if this
        cannot.
        """
        from streamkeeper.commit.disposal import sweep_unheld

        ctx = self.ctx
        try:
            ctx.fence.check()
            if not ctx.coordinator.wal.void(manifest, ctx.fence.epoch):
                return  # changed under us: a newer runner's recovery resolves it
            for name, part in manifest.sinks.items():
                if part.output == "append":
                    target = ctx.coordinator.targets[name]
                    sweep_unheld(target, ctx.layout, manifest.seq)
            store = ctx.coordinator.store
            store.delete(store.list(ctx.layout.staging_prefix(manifest.seq)))
        except Exception:  # noqa: BLE001 - the batch's own error is the one to report
            log.warning(
                "could not clean up failed batch %d (seq %d); recovery will",
                manifest.batch_id,
                manifest.seq,
                exc_info=True,
            )

    def _claim(self, batch_id: int) -> tuple[Manifest, dict[str, SinkBatch]]:
        """This batch's manifest, claimed: a fresh seq, or the one a crash left reserved.

        Returns:
            The manifest (state `writing`) and the parts an idempotent sink already
            committed under a reserved seq (the replay must not write them again).
        """
        ctx = self.ctx
        query_id = ctx.checkpoint.query_id() or "unknown"
        reserved = ctx.sequence.reserved(query_id, batch_id)
        previous = ctx.coordinator.wal.read(reserved) if reserved is not None else None
        done = self._already_committed(previous, reserved) if previous is not None else {}
        while True:
            head = ctx.coordinator.stats.last_seq
            seq = reserved if previous is not None else ctx.sequence.take_next(after=head)
            manifest = Manifest(
                lineage=ctx.layout.lineage,
                seq=seq,
                query_id=query_id,
                batch_id=batch_id,
                checkpoint_dir=str(ctx.checkpoint.directory),
                epoch=ctx.fence.epoch,
                sinks={
                    sink.name: done.get(sink.name) or self._part(sink) for sink in ctx.spec.sinks
                },
                offsets_sha256=ctx.checkpoint.offsets_sha256(batch_id),
            )
            if previous is not None:
                manifest.version = previous.version  # ours already: recovery kept it
                return manifest, done
            if ctx.coordinator.wal.claim(manifest):
                return manifest, done
            log.warning("seq %d is claimed by another runner; taking the next one", seq)

    def _part(self, sink: SinkSpec) -> SinkBatch:
        return SinkBatch(
            table=self.ctx.coordinator.targets[sink.name].location.uri,
            output=sink.output,
            mode=self.ctx.spec.sink_mode(sink),
            key=list(sink.key),
            order_by=sink.order_by,
        )

    def _already_committed(self, previous: Manifest, seq: int | None) -> dict[str, SinkBatch]:
        """Parts an idempotent sink committed before a crash; the replay must skip them."""
        return {
            name: part
            for name, part in previous.sinks.items()
            if part.mode == "idempotent"
            and seq is not None
            and self.ctx.coordinator.targets[name].committed_seq() >= seq
        }

    def _plan(self, index: int, sink: SinkSpec, seq: int) -> SinkWritePlan:
        target = self.ctx.coordinator.targets[sink.name]
        if sink.output == "merge":
            directory, relative = self.ctx.layout.staging(seq, sink.name), None
        else:
            relative = self.ctx.layout.precommit_dir(seq)
            directory = target.location.child(relative)
        return SinkWritePlan(
            sink=sink.name,
            directory=directory,
            columns=tuple(sink.columns or self.ctx.output_columns),
            mask_column=mask_column(index) if sink.where else None,
            relative_to=relative,
            unique=tuple(unique_columns(sink.key, sink.order_by)) if relative is None else (),
        )

    def _write_files(
        self, batch_df: DataFrame, plans: list[SinkWritePlan]
    ) -> dict[str, list[DataFile]]:
        from pyspark.sql import functions as F

        frame = batch_df
        for index, sink in enumerate(self.ctx.spec.sinks):
            if sink.where:
                frame = frame.withColumn(mask_column(index), F.expr(sink.where))
        writer = make_partition_writer(plans, self.ctx.fence.epoch)
        rows = frame.mapInArrow(writer, RESULT_SCHEMA).collect()
        files: dict[str, list[DataFile]] = {}
        repeated: dict[str, list[dict[str, Any]]] = {}  # found by executors, per sink
        for row in rows:
            files.setdefault(row["sink"], []).append(
                DataFile(
                    path=row["path"],
                    size=row["size"],
                    rows=row["rows"],
                    stats=row["stats"],
                    writer=row["writer"],
                    attempt=row["attempt"],
                )
            )
            if row["duplicates"]:
                repeated.setdefault(row["sink"], []).extend(json.loads(row["duplicates"]))
        refuse_duplicate_keys(self.ctx.spec.sinks, plans, files, repeated)
        return files
