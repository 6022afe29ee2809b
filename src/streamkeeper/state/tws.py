"""transformWithState: restored through its own `initialState`, checked here.

Its state is one column family per state variable, shaped by the user's processor
(`handleInitialState` decides what an initial row becomes), so a restore does not
write it: the new job passes the savepoint's rows as `initialState` (see
processor.initial_state), Spark applies them in the bootstrap batch, and the restore
checks that every state variable came back whole before it goes on. RocksDB only: the
HDFS-backed store has no column families.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from streamkeeper.errors import CheckpointRestoreError
from streamkeeper.state.errors import UnsupportedOperatorError
from streamkeeper.state.format import OperatorState
from streamkeeper.state.schema import check_compatible
from streamkeeper.state.spark_state import OperatorInfo, state_columns, state_frame

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FIX = (
    "build the new job's output inside streamkeeper.state.processor.restoring(savepoint), "
    "pass initial_state(spark, uid, variable) as transformWithState's initialState, and "
    "set every state variable in handleInitialState"
)


def refuse_without_column_families(output: DataFrame, backend: str) -> None:
    """transformWithState needs RocksDB; say so before Spark fails less clearly."""
    plan = output._jdf.queryExecution().analyzed().toString()  # the JVM plan
    if backend != "rocksdb" and "TransformWithState" in plan:
        raise UnsupportedOperatorError(
            "the new job uses transformWithState, whose state (and its restore through "
            "initialState) needs the RocksDB state store; set state_backend.type: rocksdb"
        )


def check_restored(
    spark: SparkSession, staging: Path, uid: str, old: OperatorState, new: OperatorInfo
) -> None:
    """After the bootstrap: the state variables hold every row of the savepoint's.

    Raises:
        StateSchemaError: the key changed type.
        CheckpointRestoreError: a variable is missing or did not get all its rows.
    """
    new_variables = {v["stateName"] for v in new.state_variables()}
    for variable in old.state_variables():
        name = variable["name"]
        if name not in new_variables:
            raise CheckpointRestoreError(
                f"operator {uid!r}: state variable {name!r} of the savepoint is not in the new "
                f"job's processor (it has {sorted(new_variables)}); keep the variable, or "
                "drop the operator's state with allow_non_restored_state"
            )
        frame = state_frame(spark, staging, 0, new.operator_id, state_variable=name)
        columns = state_columns(frame)
        check_compatible(uid, old.key_type(), {"fields": []}, columns["key"], {"fields": []})
        restored = frame.count()
        if restored != variable["rows"]:
            raise CheckpointRestoreError(
                f"operator {uid!r} ({new.operator_name}) restores through initialState, but "
                f"its state variable {name!r} has {restored} row(s) after the bootstrap where "
                f"the savepoint has {variable['rows']}; {FIX}"
            )
