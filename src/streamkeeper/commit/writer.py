"""Executor side of the pre-commit: write a batch's rows as Parquet, return file metadata.

Runs inside `mapInArrow` on the executors, so the batch is never collected to the
driver; only one small metadata row per written file comes back. An append sink's files
go into its table's folder `sk-{lineage}/{seq}/` (invisible until committed), a merge
sink's into the WAL's staging folder; each is named `e{epoch}-{uuid}.parquet`: a retried
or speculative task writes a fresh name, only the files of the attempt Spark keeps are
listed in the manifest, and the folder says whose batch a file belongs to.
"""

from __future__ import annotations

import datetime
import decimal
import json
import math
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from streamkeeper.commit.merge_rows import find_duplicate_keys
from streamkeeper.storage import Location

if TYPE_CHECKING:
    import pyarrow as pa

RESULT_SCHEMA = (
    "sink string, path string, size long, rows long, stats string, writer string, "
    "attempt int, duplicates string"
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
    # merge: columns no two rows may share (key, and order_by); repeats are reported back.
    unique: tuple[str, ...] = ()


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
        self.unique_values: list[pa.Table] = []  # only the unique columns: small

    def write(self, table: pa.Table) -> None:
        self.writer.write_table(table)
        self.stats.add(table)
        if self.plan.unique:
            self.unique_values.append(table.select(list(self.plan.unique)))

    def duplicates(self) -> str | None:
        """JSON of some values of the unique columns that repeat in this file, or None."""
        import pyarrow as pa

        if not self.unique_values:
            return None
        found = find_duplicate_keys(pa.concat_tables(self.unique_values), self.plan.unique)
        return json.dumps(found, default=str) if found else None

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
            "duplicates": self.duplicates(),
        }


def _uri(directory: Location, name: str) -> str:
    return f"{directory.uri}/{name}"


# Delta's default string prefix for statistics (delta.dataSkippingStringPrefixLength).
STRING_STATS_PREFIX = 32
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_UNITS_PER_MILLISECOND = {"ms": 1, "us": 1_000, "ns": 1_000_000}


class _StatsCollector:
    """Delta file statistics: numRecords, nullCount, and min/max bounds readers can trust.

    Readers skip a file when a predicate cannot hold between a column's min and max, so a
    bound may be looser than the data but never tighter. Per column:
    - integers, booleans, dates: exact; decimals: exact when JSON can carry them exactly.
    - floats: exact, unless the file holds a NaN (engines order NaN differently, and
      JSON has no NaN) or an infinity (JSON has none): then the column has no bounds.
    - strings: min is cut to a 32-character prefix (a prefix sorts before the string);
      a longer max is cut too, its last character raised by one, so it still sorts
      after the string (code point order is UTF-8 byte order, which readers compare).
    - timestamps with a time zone: milliseconds (Delta's form), min rounded down, max up.
    - timestamps without one, structs: no bounds (their text form differs by engine).
    - binary, lists and maps: no bounds; readers never skip on them.
    If any other column holding a value has no bounds, the file gets no min/max at all:
    delta-rs' pyarrow reader (to_pyarrow_dataset, to_pandas(filters=...)) reads a missing
    bound as null and skips the file for any filter on that column, but never skips a
    file without min/max. nullCount is kept (structs get none: Delta expects a nested
    structure there).
    """

    def __init__(self, schema: pa.Schema) -> None:
        import pyarrow as pa

        self.rows = 0
        self.nulls = {f.name: 0 for f in schema if not pa.types.is_struct(f.type)}
        self.types = {f.name: f.type for f in schema if _is_skipping_column(f.type)}
        self.held: set[str] = set()  # columns holding a value (not only nulls)
        self.unbounded: set[str] = set()  # float columns holding a NaN
        self.minimum: dict[str, Any] = {}
        self.maximum: dict[str, Any] = {}

    def add(self, table: pa.Table) -> None:
        import pyarrow.compute as pc

        self.rows += table.num_rows
        for name in self.nulls:
            self.nulls[name] += table.column(name).null_count
        for name, data_type in self.types.items():
            column = table.column(name)
            if column.null_count < len(column):
                self.held.add(name)
            if name in self.unbounded or _bound_kind(data_type) is None:
                continue
            if _bound_kind(data_type) == "float" and pc.any(pc.is_nan(column)).as_py():
                self.unbounded.add(name)
                continue
            result = pc.min_max(_comparable(column)).as_py()  # skips nulls (and NaN)
            low, high = result["min"], result["max"]
            if low is None:
                continue  # only nulls so far
            self.minimum[name] = low if name not in self.minimum else min(self.minimum[name], low)
            self.maximum[name] = high if name not in self.maximum else max(self.maximum[name], high)

    def to_json(self) -> str:
        stats: dict[str, Any] = {"numRecords": self.rows}
        minimum, maximum = {}, {}
        for name in self.held - self.unbounded:
            if name in self.minimum:
                minimum[name] = self._bound(name, self.minimum[name], upper=False)
                maximum[name] = self._bound(name, self.maximum[name], upper=True)
        complete = all(
            minimum.get(name) is not None and maximum.get(name) is not None for name in self.held
        )
        if complete:
            stats |= {"minValues": minimum, "maxValues": maximum}
        stats["nullCount"] = self.nulls
        # allow_nan=False: NaN or Infinity would make the Delta log invalid JSON; fail here.
        return json.dumps(stats, allow_nan=False)

    def _bound(self, name: str, value: Any, *, upper: bool) -> Any:
        """`value` as a JSON bound never tighter than the data; None: there is none."""
        data_type = self.types[name]
        kind = _bound_kind(data_type)
        if kind == "float":
            return value if math.isfinite(value) else None
        if kind == "decimal":
            exact = float(value)
            return exact if decimal.Decimal(repr(exact)) == value else None
        if kind == "string":
            return _string_upper_bound(value) if upper else value[:STRING_STATS_PREFIX]
        if kind == "date":
            return value.isoformat()
        if kind == "timestamp":
            return _timestamp_text(_millis(value, data_type.unit, round_up=upper))
        return value  # integers, booleans


def _is_skipping_column(data_type: pa.DataType) -> bool:
    """Whether Delta readers may skip files by this column's min/max."""
    import pyarrow as pa

    never = (
        pa.types.is_binary,
        pa.types.is_large_binary,
        pa.types.is_fixed_size_binary,
        pa.types.is_list,
        pa.types.is_large_list,
        pa.types.is_fixed_size_list,
        pa.types.is_map,
        pa.types.is_null,
    )
    return not any(check(data_type) for check in never)


def _bound_kind(data_type: pa.DataType) -> str | None:
    """How a column's min/max are written; None: they are not."""
    import pyarrow as pa

    kinds = [
        ("int", pa.types.is_integer),
        ("bool", pa.types.is_boolean),
        ("float", lambda t: pa.types.is_float32(t) or pa.types.is_float64(t)),
        ("decimal", pa.types.is_decimal),
        ("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
        ("date", pa.types.is_date32),
        ("timestamp", lambda t: pa.types.is_timestamp(t) and t.tz is not None),
    ]
    return next((kind for kind, check in kinds if check(data_type)), None)


def _comparable(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Timestamps as integers in their unit since the epoch; other columns as they are."""
    import pyarrow as pa

    return column.cast(pa.int64()) if pa.types.is_timestamp(column.type) else column


def _string_upper_bound(value: str) -> str | None:
    """`value` if short enough, else the shortest prefix-based string sorting after it."""
    if len(value) <= STRING_STATS_PREFIX:
        return value
    prefix = value[:STRING_STATS_PREFIX]
    for end in range(len(prefix), 0, -1):
        code = ord(prefix[end - 1]) + 1
        if code == 0xD800:
            code = 0xE000  # surrogates have no UTF-8 form
        if code <= 0x10FFFF:
            return prefix[: end - 1] + chr(code)
    return None  # every character is U+10FFFF: nothing sorts after it in 32 characters


def _millis(value: int, unit: str, *, round_up: bool) -> int:
    """`value` (in `unit` since the epoch) in whole milliseconds, rounded down or up."""
    if unit == "s":
        return value * 1000
    per = _UNITS_PER_MILLISECOND[unit]
    return -(-value // per) if round_up else value // per


def _timestamp_text(millis: int) -> str | None:
    """'2024-05-01T12:30:01.123Z', Delta's form; None outside the years 1..9999."""
    try:
        moment = _EPOCH + datetime.timedelta(milliseconds=millis)
    except OverflowError:
        return None
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


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
            ("duplicates", pa.string()),
        ]
    )
