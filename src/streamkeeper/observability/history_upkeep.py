"""Checkpoint history upkeep: the table holds the checkpoints it keeps, in a few files.

The runner appends one small file and one log entry per flush (2 s), so a history
nobody keeps grows by thousands of objects an hour (benchmarks/README.md: soak). At the
first append after a start (a job killed every few batches still keeps its history) and
every `maintenance.every` appends after it, the runner makes a pass (`upkeep`):

1. sweep the files no version references any more, once `UNREFERENCED_MIN_AGE` old: what
   the previous pass compacted away (a pass apart: a reader holding the version before
   it has had that long) and what failed appends left;
2. delete the rows of checkpoints below the newest `maintenance.history_checkpoints`
   (the page's longest chart covers 1 000);
3. compact the small files into one (delta-rs optimize);
4. write a Delta checkpoint and expire the log below the newest checkpoint older than
   `UNREFERENCED_MIN_AGE`. The table's `delta.deletedFileRetentionDuration` is set to the
   same age: a checkpoint carries the remove actions (tombstones) younger than it, and
   with Delta's default (a week) every compaction's removes would ride in every
   checkpoint for a week, growing it to megabytes a reader loads on every status.

So the table holds a compacted file, the files appended since the last pass and those it
removed, and a few minutes of log. The tail reader (history_tail.py) reads only plain
appends: it sees a pass's removes and hands over to the full reader, which opens the
compacted file and the few appended since. A pass that fails (an S3 error, a conflict
with a runner being fenced out) is logged and made again at the next one.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from streamkeeper.commit.maintenance import expire_log_at
from streamkeeper.observability.history import UNREFERENCED_MIN_AGE, CheckpointHistory

log = logging.getLogger(__name__)

TOMBSTONE_RETENTION = "delta.deletedFileRetentionDuration"


@dataclass
class UpkeepReport:
    """What one pass did to the history table."""

    rows_deleted: int = 0
    files_compacted: int = 0
    log_entries_deleted: int = 0
    seconds: float = 0.0


def upkeep(
    history: CheckpointHistory, kept: int, now: float | None = None, min_age: float | None = None
) -> UpkeepReport:
    """One pass over the history table (module doc); nothing to do without a table.

    Args:
        kept: checkpoints whose rows stay (the newest by id).
        min_age: how old a log checkpoint must be to expire the log below it, and an
            unreferenced file to be swept (default `UNREFERENCED_MIN_AGE`).
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    began = time.monotonic()
    report = UpkeepReport()
    location = history.location
    try:
        table = DeltaTable(location.uri, storage_options=location.storage_options())
    except TableNotFoundError:
        return report
    age = UNREFERENCED_MIN_AGE if min_age is None else min_age
    history.sweep_unreferenced(min_age=age, now=now)
    newest = _newest_id(table)
    if newest is not None and newest - kept + 1 > 0:
        deleted = table.delete(f"checkpoint_id < {newest - kept + 1}")
        report.rows_deleted = int(deleted.get("num_deleted_rows", 0))
    compacted = table.optimize.compact()
    report.files_compacted = int(compacted.get("numFilesRemoved", 0))
    retention = f"interval {int(age)} seconds"
    if table.metadata().configuration.get(TOMBSTONE_RETENTION) != retention:
        table.alter.set_table_properties({TOMBSTONE_RETENTION: retention})
    table.create_checkpoint()
    _, report.log_entries_deleted = expire_log_at(location, table.version(), age, now)
    report.seconds = time.monotonic() - began
    log.info("checkpoint history upkeep: %s", report)
    return report


def _newest_id(table: object) -> int | None:
    """The highest checkpoint id in the table, from the files' statistics."""
    import pyarrow as pa

    actions = pa.table(table.get_add_actions(flatten=True))  # type: ignore[attr-defined]
    column = "max.checkpoint_id"
    if column not in actions.column_names or actions.num_rows == 0:
        return None
    values = [v for v in actions[column].to_pylist() if v is not None]
    return max(values) if values else None
