"""Executor side of an export: each task writes its rows as Parquet into the state table.

An operator's state never passes through the driver: one Spark action runs
`mapInArrow` over the state's rows, each task writes its partition's rows (canonical
form, schema.py) as one Parquet file straight into the Delta table's folder (local or
S3, through pyarrow's file systems) and returns only the file's name, size and row
count. The driver then commits all of them in one Delta transaction (deltas.commit_files),
which replaces any earlier attempt's table. A file of a failed or speculative task
attempt is never listed in the commit: it stays an unreferenced file of the folder.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from streamkeeper.state import deltas
from streamkeeper.state.schema import arrow_type, reshape
from streamkeeper.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

FILES_SCHEMA = "path string, size long, rows long"
ROW_GROUP_ROWS = 131_072


def table_schema(columns: dict[str, Any]) -> pa.Schema:
    """The stored (canonical) Arrow schema of a state table with these Spark columns."""
    import pyarrow as pa

    return pa.schema(
        [pa.field(name, arrow_type(kind, canonical=True)) for name, kind in columns.items()]
    )


class ParquetTask:
    """A mapInArrow function: rows in Spark's Arrow form -> one Parquet file per task.

    Picklable; `rows` (optional) turns the task's input batches into the state's rows
    first (the direct reader of the HDFS-backed store hands partition numbers in).
    """

    def __init__(
        self,
        location: Location,
        columns: dict[str, Any],
        rows: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]] | None = None,
    ) -> None:
        self.location = location
        self.columns = columns
        self.rows = rows

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = table_schema(self.columns)
        filesystem = self.location.arrow_filesystem()
        name = f"part-{uuid.uuid4().hex}.parquet"
        path = f"{self.location.fs_path}/{name}"
        writer, count = None, 0
        source = self.rows(batches) if self.rows is not None else batches
        try:
            for batch in source:
                if not batch.num_rows:
                    continue
                if writer is None:
                    if not self.location.is_s3:
                        os.makedirs(self.location.fs_path, exist_ok=True)
                    writer = pq.ParquetWriter(path, schema, filesystem=filesystem)
                arrays = [
                    reshape(batch.column(column), kind, canonical=True)
                    for column, kind in self.columns.items()
                ]
                writer.write_batch(
                    pa.RecordBatch.from_arrays(arrays, schema=schema), row_group_size=ROW_GROUP_ROWS
                )
                count += batch.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            return
        size = filesystem.get_file_info(path).size
        yield pa.RecordBatch.from_pylist(
            [{"path": name, "size": size, "rows": count}],
            schema=pa.schema([("path", pa.string()), ("size", pa.int64()), ("rows", pa.int64())]),
        )


def write_state_table(
    frame: DataFrame, location: Location, columns: dict[str, Any], task: ParquetTask | None = None
) -> tuple[int, int]:
    """Write `frame`'s rows (Spark's Arrow form of `columns`) as the Delta table at `location`.

    One Spark action: the executors write the Parquet files, the driver commits them.

    Returns:
        The table's rows and the bytes of its data files.
    """
    task = task or ParquetTask(location, columns)
    files = frame.mapInArrow(task, FILES_SCHEMA).collect()
    rows = sum(f.rows for f in files)
    actions = [(f.path, f.size, json.dumps({"numRecords": f.rows})) for f in files]
    deltas.commit_files(location, table_schema(columns), actions)
    return rows, sum(f.size for f in files)
