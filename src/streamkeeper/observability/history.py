"""Checkpoint history: one row per completed checkpoint, in a Delta table any engine can read.

Rows join Spark's progress report for batch N (durations, rates, offsets, state) with
what the commit coordinator knows (commit seq, visibility delay) and the externalized
upload (bytes uploaded). The table lives at `{root}/lineages/{lineage}/history`.

A checkpoint's id is its commit seq, everywhere (`--from-checkpoint ID`, externalized
checkpoint ids, this table): Spark's batch id restarts at 0 after a checkpoint reset,
so it is kept beside it as `batch_id`. Only committed checkpoints get a row.

Tables written before `batch_id` existed held the batch id in `checkpoint_id` and also
rows for triggers that committed nothing (`commit_seq` null); `read` translates the
first and drops the second, and `append` adds the column (schema evolution).

A failed append leaves its data file behind: delta-rs writes the file, then commits,
and a commit that fails (an S3 error through its retries) references nothing.
`sweep_unreferenced` deletes such files once they are `UNREFERENCED_MIN_AGE` old; the
age keeps it off a file whose append is still under way (another runner's, say one
being fenced out), as Delta's vacuum retention does. The runner sweeps when it starts
and after a failed append (runtime/supervisor.py).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from streamkeeper.storage.parquet import open_parquet_whole

if TYPE_CHECKING:
    import pyarrow as pa

    from streamkeeper.storage import Location


@dataclass(frozen=True)
class CheckpointRecord:
    """What Flink's checkpoint history shows, for one committed micro-batch."""

    checkpoint_id: int  # the commit seq
    batch_id: int  # Spark's batch id
    query_id: str
    run_id: str
    trigger_time: str
    duration_ms: int
    latest_offset_ms: int
    planning_ms: int
    write_ms: int
    wal_commit_ms: int
    commit_offsets_ms: int
    input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    source_offsets: str
    state_rows: int
    state_bytes: int
    state_operators: str
    commit_seq: int  # equal to checkpoint_id; kept for readers of the older schema
    visibility_delay_ms: float | None = None
    bytes_uploaded: int | None = None


def record_from_progress(
    progress: dict[str, Any],
    *,
    commit_seq: int,
    visibility_delay_ms: float | None = None,
    bytes_uploaded: int | None = None,
) -> CheckpointRecord:
    """Build the record of a committed batch from its StreamingQueryProgress as JSON."""
    durations = progress.get("durationMs", {})
    operators = [
        {
            "operator": op.get("operatorName", "?"),
            "rows": op.get("numRowsTotal", 0),
            "rows_updated": op.get("numRowsUpdated", 0),
            "bytes": op.get("memoryUsedBytes", 0),
        }
        for op in progress.get("stateOperators", [])
    ]
    offsets = [
        {"source": s.get("description"), "start": s.get("startOffset"), "end": s.get("endOffset")}
        for s in progress.get("sources", [])
    ]
    return CheckpointRecord(
        checkpoint_id=commit_seq,
        batch_id=int(progress["batchId"]),
        query_id=str(progress.get("id", "")),
        run_id=str(progress.get("runId", "")),
        trigger_time=str(progress.get("timestamp", "")),
        duration_ms=int(durations.get("triggerExecution", progress.get("batchDuration", 0))),
        latest_offset_ms=int(durations.get("latestOffset", 0)),
        planning_ms=int(durations.get("queryPlanning", 0)),
        write_ms=int(durations.get("addBatch", 0)),
        wal_commit_ms=int(durations.get("walCommit", 0)),
        commit_offsets_ms=int(durations.get("commitOffsets", 0)),
        input_rows=int(progress.get("numInputRows", 0)),
        input_rows_per_second=float(progress.get("inputRowsPerSecond") or 0.0),
        processed_rows_per_second=float(progress.get("processedRowsPerSecond") or 0.0),
        source_offsets=json.dumps(offsets),
        state_rows=sum(int(op["rows"]) for op in operators),
        state_bytes=sum(int(op["bytes"]) for op in operators),
        state_operators=json.dumps(operators),
        commit_seq=commit_seq,
        visibility_delay_ms=visibility_delay_ms,
        bytes_uploaded=bytes_uploaded,
    )


@dataclass(frozen=True)
class Checkpoint:
    """One row of `streamkeeper checkpoints JOB`; `to_json()` is the documented form."""

    checkpoint_id: int  # the commit seq
    batch_id: int | None
    trigger_time: str
    duration_ms: int
    latest_offset_ms: int
    planning_ms: int
    write_ms: int
    wal_commit_ms: int
    commit_offsets_ms: int
    input_rows: int
    input_rows_per_second: float
    processed_rows_per_second: float
    source_offsets: list[dict[str, Any]]
    state_rows: int
    state_bytes: int
    state_operators: list[dict[str, Any]]
    visibility_delay_ms: float | None
    bytes_uploaded: int | None
    query_id: str
    run_id: str

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Checkpoint:
        """From a `CheckpointHistory.read()` row (JSON columns parsed)."""
        values = {f.name: row.get(f.name) for f in fields(cls)}
        for name in ("source_offsets", "state_operators"):
            values[name] = json.loads(row.get(name) or "[]")
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    kinds = {
        "int": pa.int64(),
        "float": pa.float64(),
        "str": pa.string(),
        "int | None": pa.int64(),
        "float | None": pa.float64(),
    }
    return pa.schema([(f.name, kinds[str(f.type)]) for f in fields(CheckpointRecord)])


def normalize(row: dict[str, Any]) -> dict[str, Any] | None:
    """A row in today's meaning (checkpoint_id = commit seq), or None if it is no checkpoint."""
    seq = row.get("commit_seq")
    if seq is None:
        return None  # an older table's row for a trigger that committed nothing
    if row.get("batch_id") is None:  # older schema: checkpoint_id held the batch id
        row = {**row, "batch_id": row.get("checkpoint_id")}
    return {**row, "checkpoint_id": int(seq)}


UNREFERENCED_MIN_AGE = 600.0  # seconds: far longer than an append takes, retries and all


class CheckpointHistory:
    """Appends records to, and reads them from, the lineage's history table."""

    def __init__(self, location: Location) -> None:
        self.location = location

    def append(self, records: list[CheckpointRecord]) -> None:
        if not records:
            return
        import pyarrow as pa
        from deltalake import write_deltalake

        table = pa.Table.from_pylist([asdict(r) for r in records], schema=_arrow_schema())
        write_deltalake(
            self.location.uri,
            table,
            mode="append",
            schema_mode="merge",  # tables from before batch_id gain the column
            storage_options=self.location.storage_options(),
        )

    def sweep_unreferenced(
        self, min_age: float = UNREFERENCED_MIN_AGE, now: float | None = None
    ) -> int:
        """Delete the data files no commit references that are older than `min_age` s.

        Returns how many unreferenced files were younger and kept (sweep again later).
        """
        import pyarrow as pa
        import pyarrow.fs as pafs
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        filesystem = self.location.arrow_filesystem()
        found = filesystem.get_file_info(
            pafs.FileSelector(self.location.fs_path, allow_not_found=True)
        )
        try:
            table = DeltaTable(self.location.uri, storage_options=self.location.storage_options())
            actions = pa.table(table.get_add_actions(flatten=True))
            referenced = {unquote(path) for path in actions["path"].to_pylist()}
        except TableNotFoundError:  # the first append failed: no commit references anything
            referenced = set()
        cutoff = (time.time() if now is None else now) - min_age
        kept, old = 0, []
        for info in found:
            if info.type != pafs.FileType.File or not info.base_name.endswith(".parquet"):
                continue  # _delta_log/ is a folder; nothing else is written here
            if info.base_name in referenced:
                continue
            if info.mtime is None or info.mtime.timestamp() >= cutoff:
                kept += 1
            else:
                old.append(info.base_name)
        # Through the object store: pyarrow's S3 delete leaves a folder marker object.
        self.location.store().delete(old)
        return kept

    def read(self, last: int | None = None) -> list[dict[str, Any]]:
        """Checkpoints ordered by id (the last `last` of them if given), one row per id.

        With `last`, only the newest data files are read (newest first, by the time the
        log records for them) until enough rows are gathered: a long-lived lineage's
        history is never scanned whole for a status.
        """
        try:
            return self._read(last)
        except OSError:  # a file an upkeep pass swept after this snapshot was taken
            return self._read(last)

    def _read(self, last: int | None) -> list[dict[str, Any]]:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(self.location.uri, storage_options=self.location.storage_options())
        except TableNotFoundError:
            return []
        rows: dict[int, dict[str, Any]] = {}
        enough_at = None  # files written in the same millisecond are read together
        for written, path in self._files_newest_first(table):
            if enough_at is not None and written < enough_at:
                break
            for raw in self._read_file(path):
                row = normalize(raw)
                if row is not None:
                    rows.setdefault(row["checkpoint_id"], row)  # a newer file's row wins
            if last is not None and enough_at is None and len(rows) >= last:
                enough_at = written
        ordered = [rows[i] for i in sorted(rows)]
        return ordered[-last:] if last else ordered

    @staticmethod
    def _files_newest_first(table: Any) -> list[tuple[int, str]]:
        """(modification time in ms, path) of the table's data files, newest first."""
        import pyarrow as pa

        actions = pa.table(table.get_add_actions(flatten=True)).select(
            ["path", "modification_time"]
        )
        times = actions["modification_time"].cast(pa.int64()).to_pylist()
        paths = [unquote(p) for p in actions["path"].to_pylist()]
        return sorted(zip(times, paths, strict=True), reverse=True)

    def _read_file(self, path: str) -> list[dict[str, Any]]:
        full = f"{self.location.fs_path}/{path}"
        file = open_parquet_whole(self.location.arrow_filesystem(), full)
        return file.read(use_threads=False).to_pylist()
