"""Checkpoint history: one row per completed checkpoint, in a Delta table any engine can read.

Rows join Spark's progress report for batch N (durations, rates, offsets, state) with
what the commit coordinator knows (commit seq, visibility delay) and the externalized
upload (bytes uploaded). The table lives at `{root}/lineages/{lineage}/history`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

    from streamkeeper.storage import Location


@dataclass(frozen=True)
class CheckpointRecord:
    """What Flink's checkpoint history shows, for one micro-batch."""

    checkpoint_id: int
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
    commit_seq: int | None = None
    visibility_delay_ms: float | None = None
    bytes_uploaded: int | None = None


def record_from_progress(
    progress: dict[str, Any],
    *,
    commit_seq: int | None = None,
    visibility_delay_ms: float | None = None,
    bytes_uploaded: int | None = None,
) -> CheckpointRecord:
    """Build a record from a StreamingQueryProgress as JSON (`json.loads(progress.json)`)."""
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
        checkpoint_id=int(progress["batchId"]),
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
            storage_options=self.location.storage_options(),
        )

    def read(self, last: int | None = None) -> list[dict[str, Any]]:
        """Records ordered by checkpoint id (the last `last` of them if given)."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            table = DeltaTable(self.location.uri, storage_options=self.location.storage_options())
        except TableNotFoundError:
            return []
        rows = table.to_pyarrow_dataset().to_table(use_threads=False).to_pylist()
        rows.sort(key=lambda r: (r["trigger_time"], r["checkpoint_id"]))
        return rows[-last:] if last else rows
