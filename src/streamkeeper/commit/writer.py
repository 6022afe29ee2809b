"""Executor side of the pre-commit: write a batch's rows as Parquet, return file metadata.

Runs inside `mapInArrow` on the executors, so the batch is never collected to the
driver; only one small metadata row per written file comes back. An append sink's files
go into its table's folder `sk-{lineage}/{seq}/` (invisible until committed), a merge
sink's into the WAL's staging folder; each is named `e{epoch}-{uuid}.parquet`: a retried
or speculative task writes a fresh name, only the files of the attempt Spark keeps are
listed in the manifest, and the folder says whose batch a file belongs to.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamkeeper.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa

RESULT_SCHEMA = (
    "sink string, path string, size long, rows long, stats string, writer string, attempt int"
)


def data_file_name(epoch: int) -> str:
    return f"e{epoch}-{uuid.uuid4().hex}.parquet"


@dataclass(frozen=True)
class SinkWritePlan:
    """What one task writes for one sink."""

    sink: str
    directory: Location  # the batch's folder in the table (append) or WAL staging (merge)
    columns: tuple[str, ...]
    mask_column: str | None  # boolean column selecting this sink's rows, if filtered
    relative_to: str | None  # append: the folder relative to the table, for add actions


class _OpenFile:
    def __init__(self, plan: SinkWritePlan, epoch: int, schema: pa.Schema) -> None:
        import pyarrow.parquet as pq

        self.plan = plan
        self.name = data_file_name(epoch)
        self.filesystem = plan.directory.arrow_filesystem()
        self.full_path = f"{plan.directory.fs_path}/{self.name}"
        if not plan.directory.is_s3:
            os.makedirs(plan.directory.fs_path, exist_ok=True)
        self.writer = pq.ParquetWriter(self.full_path, schema, filesystem=self.filesystem)
        self.stats = _StatsCollector(schema)

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.stats.add(table)

    def close(self, writer_id: str, attempt: int) -> dict[str, Any]:
        self.writer.close()
        size = self.filesystem.get_file_info(self.full_path).size
        relative = self.plan.relative_to
        path = f"{relative}/{self.name}" if relative else _uri(self.plan.directory, self.name)
        return {
            "sink": self.plan.sink,
            "path": path,
            "size": size,
            "rows": self.stats.rows,
            "stats": self.stats.to_json(),
            "writer": writer_id,
            "attempt": attempt,
        }


def _uri(directory: Location, name: str) -> str:
    return f"{directory.uri}/{name}"


class _StatsCollector:
    """Delta file statistics: numRecords, nullCount, and min/max of simple columns."""

    def __init__(self, schema: pa.Schema) -> None:
        import pyarrow as pa

        self.rows = 0
        self.nulls = {f.name: 0 for f in schema}
        self.minmax_columns = [
            f.name
            for f in schema
            if pa.types.is_integer(f.type)
            or pa.types.is_floating(f.type)
            or pa.types.is_string(f.type)
            or pa.types.is_large_string(f.type)
        ]
        self.minimum: dict[str, Any] = {}
        self.maximum: dict[str, Any] = {}

    def add(self, table: pa.Table) -> None:
        import pyarrow.compute as pc

        self.rows += table.num_rows
        for name in self.nulls:
            self.nulls[name] += table.column(name).null_count
        for name in self.minmax_columns:
            result = pc.min_max(table.column(name)).as_py()
            low, high = result["min"], result["max"]
            if low is None:
                continue
            self.minimum[name] = low if name not in self.minimum else min(self.minimum[name], low)
            self.maximum[name] = high if name not in self.maximum else max(self.maximum[name], high)

    def to_json(self) -> str:
        return json.dumps(
            {
                "numRecords": self.rows,
                "minValues": self.minimum,
                "maxValues": self.maximum,
                "nullCount": self.nulls,
            }
        )


def make_partition_writer(
    plans: list[SinkWritePlan], epoch: int
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function `mapInArrow` runs on each partition of the batch."""

    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyspark import TaskContext

        context = TaskContext.get()
        stage = context.stageId() if context else "?"
        attempt = context.attemptNumber() if context else 0
        writer_id = f"{_owning_jvm()}/stage{stage}/pid{os.getpid()}"
        open_files: dict[str, _OpenFile] = {}
        for batch in batches:
            table = pa.Table.from_batches([batch])
            for plan in plans:
                part = table
                if plan.mask_column is not None:
                    part = part.filter(pc.fill_null(part.column(plan.mask_column), False))
                if part.num_rows == 0:
                    continue
                part = part.select(list(plan.columns))
                if plan.sink not in open_files:
                    open_files[plan.sink] = _OpenFile(plan, epoch, part.schema)
                open_files[plan.sink].write(part)
        rows = [handle.close(writer_id, attempt) for handle in open_files.values()]
        yield pa.RecordBatch.from_pylist(rows, schema=_result_arrow_schema())

    return write_partition


def _owning_jvm() -> str:
    """'executor-<id>' when a cluster executor runs this task, else 'driver' (local mode)."""
    import psutil

    try:
        for process in psutil.Process().parents():
            command = process.cmdline()
            if any("CoarseGrainedExecutorBackend" in part for part in command):
                return f"executor-{command[command.index('--executor-id') + 1]}"
    except (psutil.Error, ValueError, IndexError):
        return "unknown"
    return "driver"


def _result_arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema(
        [
            ("sink", pa.string()),
            ("path", pa.string()),
            ("size", pa.int64()),
            ("rows", pa.int64()),
            ("stats", pa.string()),
            ("writer", pa.string()),
            ("attempt", pa.int32()),
        ]
    )
