"""Export: a checkpoint's state at a completed batch, as one Delta table per operator uid.

Each operator's rows are written on the executors (table_writer.py): one Spark action in
which every task writes its rows as a Parquet file into the table's folder, locally or
on S3, and the driver commits those files in one Delta transaction (delta-rs); the
state never passes through the driver. The rows come from the HDFS-backed store's own
files, read and decoded in the tasks (hdfs_files.py), where that is possible, and
otherwise from Spark's `statestore` reader (RocksDB, with or without changelog
checkpointing; other codecs; types the decoder does not know). The partition of a row
is not kept: a restore recomputes it for the new job's partition count.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from streamkeeper.errors import CheckpointRestoreError
from streamkeeper.state.errors import OperatorUidError, UnsupportedOperatorError
from streamkeeper.state.format import OperatorState, state_table_path, state_variable_path
from streamkeeper.state.hdfs_files import partition_reader
from streamkeeper.state.positions import read_offsets_lines
from streamkeeper.state.spark_state import (
    DEFAULT_STORE,
    OperatorInfo,
    canonically_named,
    read_operators,
    state_columns,
    state_frame,
    state_types,
)
from streamkeeper.state.table_writer import ParquetTask, write_state_table
from streamkeeper.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

# Operators whose state is not one key -> value store the reader shows whole.
_UNSUPPORTED = {
    "symmetricHashJoin": "a stream-stream join keeps four stores per side",
}


def export_canonical(
    spark: SparkSession,
    checkpoint_dir: Path,
    batch_id: int,
    uids: Mapping[int, str],
    target: Location,
) -> list[OperatorState]:
    """Write every stateful operator's state after batch `batch_id` as Delta tables.

    Args:
        checkpoint_dir: the query's local checkpoint directory.
        batch_id: a completed batch (its `commits/N` exists) whose state is still kept.
        uids: operator id -> uid (`uids.resolve_uids`); every operator needs one.
        target: the savepoint folder; operator `u` goes to `{target}/state/u`.

    Returns:
        One `OperatorState` per operator, by operator id, for the manifest.

    Raises:
        OperatorUidError: an operator has no uid.
        UnsupportedOperatorError: an operator's state cannot be exported canonically.
        CheckpointRestoreError: the batch is not complete.
    """
    if not (checkpoint_dir / "commits" / str(batch_id)).exists():
        raise CheckpointRestoreError(
            f"batch {batch_id} of checkpoint {str(checkpoint_dir)!r} has not completed (no "
            "commits entry); export a completed batch"
        )
    operators = read_operators(spark, checkpoint_dir)
    _check_exportable(operators, uids)
    return [
        _export_operator(spark, checkpoint_dir, batch_id, op, uids[op.operator_id], target)
        for op in operators
    ]


def _check_exportable(operators: list[OperatorInfo], uids: Mapping[int, str]) -> None:
    missing = [op.describe() for op in operators if op.operator_id not in uids]
    if missing:
        raise OperatorUidError(
            f"stateful operator(s) {missing} have no uid; name every operator in the spec's "
            "state.operators (or pass default uids op-N)"
        )
    repeated = sorted({u for u in uids.values() if list(uids.values()).count(u) > 1})
    if repeated:
        raise OperatorUidError(f"uid(s) {repeated} are given to more than one operator")
    for op in operators:
        reason = _UNSUPPORTED.get(op.operator_name)
        if reason is None and op.store_names != (DEFAULT_STORE,) and not op.is_transform_with_state:
            reason = f"it keeps several stores {list(op.store_names)}"
        if reason:
            raise UnsupportedOperatorError(
                f"operator {uids[op.operator_id]!r} ({op.operator_name}, id {op.operator_id}) "
                f"cannot go into a canonical savepoint: {reason}; take a native savepoint of "
                "this job instead"
            )


def _export_operator(
    spark: SparkSession,
    checkpoint_dir: Path,
    batch_id: int,
    op: OperatorInfo,
    uid: str,
    target: Location,
) -> OperatorState:
    if op.is_transform_with_state:
        return _export_state_variables(spark, checkpoint_dir, batch_id, op, uid, target)
    frame = state_frame(spark, checkpoint_dir, batch_id, op.operator_id)
    key_type, value_type = state_types(frame)
    relative = state_table_path(uid)
    rows, size = _write_operator(spark, checkpoint_dir, batch_id, op, frame, target.child(relative))
    log.info("exported %s (%s): %d rows, %d bytes", uid, op.operator_name, rows, size)
    return OperatorState(
        uid=uid,
        operator_id=op.operator_id,
        operator_name=op.operator_name,
        store_names=list(op.store_names),
        partitions=op.partitions,
        key_schema=_json(key_type),
        value_schema=_json(value_type),
        table=relative,
        rows=rows,
        bytes=size,
    )


def _write_operator(
    spark: SparkSession,
    checkpoint_dir: Path,
    batch_id: int,
    op: OperatorInfo,
    frame: DataFrame,
    location: Location,
) -> tuple[int, int]:
    """The operator's rows as the Delta table at `location`: its files read directly
    where hdfs_files can (HDFS-backed store), else through Spark's `statestore` reader."""
    columns = state_columns(frame)
    conf = json.loads(read_offsets_lines(checkpoint_dir, batch_id)[0]).get("conf", {})
    reader = partition_reader(
        checkpoint_dir,
        conf,
        op.operator_id,
        op.partitions,
        batch_id + 1,  # the state version a batch leaves behind
        columns["key"],
        columns["value"],
    )
    if reader is not None:
        tasks = max(1, min(op.partitions, 2 * spark.sparkContext.defaultParallelism))
        partitions = spark.range(0, op.partitions, 1, tasks)
        task = ParquetTask(location, columns, rows=reader)
        try:
            return write_state_table(partitions, location, columns, task)
        except Exception as error:  # noqa: BLE001 - Spark's reader is the fallback
            first = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
            log.warning(
                "reading operator %s's files directly failed (%s); reading through Spark",
                op.describe(),
                first,
            )
    return _write_frame(frame, location)


def _write_frame(frame: DataFrame, location: Location) -> tuple[int, int]:
    """A state frame's rows (canonical form) as the Delta table at `location`."""
    columns = state_columns(frame)
    named = canonically_named(frame).select(*columns)
    return write_state_table(named, location, columns)


def _export_state_variables(
    spark: SparkSession,
    checkpoint_dir: Path,
    batch_id: int,
    op: OperatorInfo,
    uid: str,
    target: Location,
) -> OperatorState:
    """transformWithState: one table per state variable, `state/{uid}/{variable}`."""
    variables, key_type, total_rows, total_bytes = [], None, 0, 0
    for variable in op.state_variables():
        name = variable["stateName"]
        frame = state_frame(spark, checkpoint_dir, batch_id, op.operator_id, state_variable=name)
        columns = state_columns(frame)
        key_type = columns.pop("key")
        rows, size = _write_frame(frame, target.child(state_variable_path(uid, name)))
        variables.append(
            {"name": name, "type": variable["stateVariableType"], "columns": columns, "rows": rows}
        )
        total_rows, total_bytes = total_rows + rows, total_bytes + size
    log.info("exported %s (%s): %d state variables", uid, op.operator_name, len(variables))
    return OperatorState(
        uid=uid,
        operator_id=op.operator_id,
        operator_name=op.operator_name,
        store_names=[v["name"] for v in variables],
        partitions=op.partitions,
        key_schema=_json(key_type or {"type": "struct", "fields": []}),
        value_schema=_json({"stateVariables": variables}),
        table=state_table_path(uid),
        rows=total_rows,
        bytes=total_bytes,
    )


def _json(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))
