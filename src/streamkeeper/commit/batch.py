"""The foreachBatch function: pre-commit a micro-batch to every sink (see PROTOCOL.md).

One Spark action per batch: executors write every sink's Parquet files in a single
`mapInArrow` pass and return file metadata. A second action would read the source again.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamkeeper import injection
from streamkeeper.commit import crashpoints
from streamkeeper.commit.coordinator import CommitCoordinator, CommitSequence
from streamkeeper.commit.merge_rows import (
    EXAMPLES,
    check_one_row_per_key,
    duplicate_key_error,
    unique_columns,
)
from streamkeeper.commit.tables import read_staged_files
from streamkeeper.commit.wal import DataFile, Manifest, SinkBatch
from streamkeeper.commit.writer import RESULT_SCHEMA, SinkWritePlan, make_partition_writer
from streamkeeper.errors import SpecError
from streamkeeper.lineage.control import Lease
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
    """What the batch function needs; built once by the runner."""

    spec: JobSpec
    layout: LineageLayout
    coordinator: CommitCoordinator
    sequence: CommitSequence
    checkpoint: SparkCheckpoint
    lease: Lease
    output_columns: list[str]


class BatchWriter:
    """Callable passed to `DataStreamWriter.foreachBatch`."""

    def __init__(self, context: BatchContext) -> None:
        self.ctx = context
        self.batches_seen = 0
        self.min_pause = MinPause(context.spec.checkpoint.min_pause)

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        ctx = self.ctx
        self.min_pause.before_batch()
        injection.reached("batch_start", batch_id=batch_id)
        # A fenced runner must not even pre-commit: its batch fails and the query stops.
        ctx.coordinator.control.check_not_fenced(ctx.lease)
        query_id = ctx.checkpoint.query_id() or "unknown"
        seq = ctx.sequence.for_batch(query_id, batch_id)
        reserved = ctx.sequence.is_reserved(query_id, batch_id)
        previous = ctx.coordinator.wal.read(seq) if reserved else None
        done = self._already_committed(previous, seq)
        plans = [
            self._plan(index, sink, seq)
            for index, sink in enumerate(ctx.spec.sinks)
            if sink.name not in done
        ]
        files = self._write_files(batch_df, plans, seq) if plans else {}
        crashpoints.reached("batch_before_manifest")
        manifest = Manifest(
            lineage=ctx.layout.lineage,
            seq=seq,
            query_id=query_id,
            batch_id=batch_id,
            checkpoint_dir=str(ctx.checkpoint.directory),
            epoch=ctx.lease.epoch,
            sinks={
                sink.name: done.get(sink.name)
                or SinkBatch(
                    table=ctx.coordinator.targets[sink.name].location.uri,
                    output=sink.output,
                    mode=ctx.spec.sink_mode(sink),
                    key=list(sink.key),
                    files=files.get(sink.name, []),
                    order_by=sink.order_by,
                )
                for sink in ctx.spec.sinks
            },
        )
        ctx.coordinator.wal.write(manifest)
        log.info(
            "batch %d pre-committed as seq %d: %s",
            batch_id,
            seq,
            {name: part.rows for name, part in manifest.sinks.items()},
        )
        crashpoints.reached("batch_after_manifest")
        in_batch = [
            name
            for name, part in manifest.sinks.items()
            if part.mode != "exactly_once" and name not in done
        ]
        if in_batch:
            ctx.coordinator.commit_sinks(manifest, in_batch)
        crashpoints.reached("batch_after_commit")
        ctx.coordinator.submit(manifest)
        self.batches_seen += 1
        self.min_pause.after_batch()

    def _already_committed(self, previous: Manifest | None, seq: int) -> dict[str, SinkBatch]:
        """Parts an idempotent sink committed before a crash; the replay must skip them."""
        if previous is None:
            return {}
        return {
            name: part
            for name, part in previous.sinks.items()
            if part.mode == "idempotent"
            and self.ctx.coordinator.targets[name].committed_seq() >= seq
        }

    def _plan(self, index: int, sink: SinkSpec, seq: int) -> SinkWritePlan:
        target = self.ctx.coordinator.targets[sink.name]
        staged = sink.output == "merge"
        return SinkWritePlan(
            sink=sink.name,
            directory=self.ctx.layout.staging(seq, sink.name) if staged else target.location,
            columns=tuple(sink.columns or self.ctx.output_columns),
            mask_column=mask_column(index) if sink.where else None,
            relative_paths=not staged,
            unique=tuple(unique_columns(sink.key, sink.order_by)) if staged else (),
        )

    def _write_files(
        self, batch_df: DataFrame, plans: list[SinkWritePlan], seq: int
    ) -> dict[str, list[DataFile]]:
        from pyspark.sql import functions as F

        frame = batch_df
        for index, sink in enumerate(self.ctx.spec.sinks):
            if sink.where:
                frame = frame.withColumn(mask_column(index), F.expr(sink.where))
        rows = frame.mapInArrow(make_partition_writer(plans, seq), RESULT_SCHEMA).collect()
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
                )
            )
            if row["duplicates"]:
                repeated.setdefault(row["sink"], []).extend(json.loads(row["duplicates"]))
        refuse_duplicate_keys(self.ctx.spec.sinks, plans, files, repeated)
        return files
