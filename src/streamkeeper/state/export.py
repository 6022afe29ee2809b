"""Export: a checkpoint's state at a completed batch, as one Delta table per operator uid.

Spark's `statestore` reader gives each operator's rows (`key`, `value`) whatever the
state store (HDFS-backed or RocksDB, with or without changelog checkpointing); the rows
travel to the driver as Arrow and delta-rs writes them (Spark has no Delta writer here),
locally or on S3. The partition of a row is not kept: a restore recomputes it for the
new job's partition count.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from streamkeeper.errors import CheckpointRestoreError
from streamkeeper.state import deltas
from streamkeeper.state.errors import OperatorUidError, UnsupportedOperatorError
from streamkeeper.state.format import OperatorState, state_table_path
from streamkeeper.state.schema import reshape
from streamkeeper.state.spark_state import (
    DEFAULT_STORE,
    OperatorInfo,
    canonically_named,
    read_operators,
    state_frame,
    state_types,
)
from streamkeeper.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Operators whose state is not one key -> value store the reader shows whole.
_UNSUPPORTED = {
    "symmetricHashJoin": "a stream-stream join keeps four stores per side",
    "transformWithStateExec": "transformWithState keeps one store per state variable",
    "transformWithStateInPandasExec": "transformWithState keeps one store per state variable",
    "transformWithStateInPySparkExec": "transformWithState keeps one store per state variable",
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
        if reason is None and op.store_names != (DEFAULT_STORE,):
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
    import pyarrow as pa

    frame = state_frame(spark, checkpoint_dir, batch_id, op.operator_id)
    key_type, value_type = state_types(frame)
    rows = canonically_named(frame).toArrow()
    table = pa.table(
        {
            "key": reshape(rows["key"], key_type, canonical=True),
            "value": reshape(rows["value"], value_type, canonical=True),
        }
    )
    relative = state_table_path(uid)
    size = deltas.overwrite(target.child(relative), table)
    log.info(
        "exported operator %s (%s): %d rows, %d bytes", uid, op.operator_name, len(table), size
    )
    return OperatorState(
        uid=uid,
        operator_id=op.operator_id,
        operator_name=op.operator_name,
        store_names=list(op.store_names),
        partitions=op.partitions,
        key_schema=_json(key_type),
        value_schema=_json(value_type),
        table=relative,
        rows=table.num_rows,
        bytes=size,
    )


def _json(value: object) -> str:
    import json

    return json.dumps(value, separators=(",", ":"))
