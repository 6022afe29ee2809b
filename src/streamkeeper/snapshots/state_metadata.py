"""A query's stateful operators, as Spark sees them (needs a SparkSession).

- In a checkpoint: Spark's `state-metadata` reader lists each operator (id, name,
  store names, partitions); the `statestore` reader's schema gives each store's key and
  value schemas. A savepoint's manifest records them.
- In a query not started yet: the plan Spark would run (`explain` of the streaming
  DataFrame numbers the stateful operators as a run would), so that a native restore
  can refuse another topology before it touches anything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from streamkeeper.errors import IncompatibleSavepointError
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest, StateOperatorInfo

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Physical plan node -> the operator name Spark's state metadata records for it.
_WRITER_NAMES = {
    "StateStoreSave": "stateStoreSave",
    "StreamingDeduplicate": "dedupe",
    "StreamingDeduplicateWithinWatermark": "dedupeWithinWatermark",
    "StreamingSymmetricHashJoin": "symmetricHashJoin",
    "FlatMapGroupsWithState": "flatMapGroupsWithState",
    "FlatMapGroupsInPandasWithState": "applyInPandasWithState",
    "TransformWithState": "transformWithStateExec",
    "TransformWithStateInPandas": "transformWithStateInPandasExec",
    "SessionWindowStateStoreSave": "sessionWindowStateStoreSaveExec",
    "StreamingGlobalLimit": "globalLimit",
}
_READERS = ("StateStoreRestore", "SessionWindowStateStoreRestore")
_STATEFUL_NODE = re.compile(
    r"(?P<node>[A-Za-z]+)(?: \[(?P<keys>[^\]]*)\])?,? .*?state info \[.*?opId = (?P<op>\d+),"
    r".*?numPartitions = (?P<parts>\d+)\]"
)


def default_uid(operator_id: int) -> str:
    """The uid of an operator the spec names none for (canonical state's default too)."""
    return f"op-{operator_id}"


def read_operators(
    spark: SparkSession, directory: Path, batch_id: int, uids: dict[int, str]
) -> list[StateOperatorInfo]:
    """The checkpoint's stateful operators at batch `batch_id` (none for a stateless job).

    Args:
        uids: operator id -> the spec's uid for it.
    """
    if not (directory / "state").is_dir():
        return []
    rows = spark.read.format("state-metadata").load(str(directory)).collect()
    by_id: dict[int, list] = {}
    for row in rows:
        by_id.setdefault(int(row["operatorId"]), []).append(row)
    operators = []
    for operator_id, stores in sorted(by_id.items()):
        names = sorted(str(s["stateStoreName"]) for s in stores)
        key_schema, value_schema = _schemas(spark, directory, batch_id, operator_id, names[0])
        operators.append(
            StateOperatorInfo(
                uid=uids.get(operator_id) or default_uid(operator_id),
                operator_id=operator_id,
                operator_name=str(stores[0]["operatorName"]),
                store_names=names,
                partitions=int(stores[0]["numPartitions"]),
                key_schema=key_schema,
                value_schema=value_schema,
            )
        )
    return operators


def _schemas(
    spark: SparkSession, directory: Path, batch_id: int, operator_id: int, store: str
) -> tuple[str, str]:
    """The store's key and value schemas (Spark's JSON), from the `statestore` reader."""
    schema = (
        spark.read.format("statestore")
        .option("operatorId", operator_id)
        .option("storeName", store)
        .option("batchId", batch_id)
        .load(str(directory))
        .schema
    )
    return schema["key"].dataType.json(), schema["value"].dataType.json()


@dataclass(frozen=True)
class PlannedOperator:
    """A stateful operator of a query's plan."""

    operator_id: int
    name: str
    partitions: int
    keys: tuple[str, ...]  # the key columns' names


def planned_operators(spark: SparkSession, output: DataFrame) -> list[PlannedOperator]:
    """The stateful operators the query would run, from Spark's streaming `explain`."""
    text = spark._jvm.PythonSQLUtils.explainString(  # type: ignore[union-attr]
        output._jdf.queryExecution(), "simple"
    )
    found: dict[int, PlannedOperator] = {}
    for line in str(text).splitlines():
        match = _STATEFUL_NODE.search(line)
        if match is None or match["node"] in _READERS:
            continue
        keys = tuple(k.strip().split("#")[0] for k in (match["keys"] or "").split(",") if k.strip())
        node = match["node"]
        name = _WRITER_NAMES.get(node, node[:1].lower() + node[1:])
        operator_id = int(match["op"])
        found.setdefault(operator_id, PlannedOperator(operator_id, name, int(match["parts"]), keys))
    return [found[i] for i in sorted(found)]


def check_topology(manifest: SavepointManifest, planned: list[PlannedOperator]) -> None:
    """A native savepoint restores into the same stateful operators and partitions only.

    Raises:
        IncompatibleSavepointError: naming what differs and the fix.
    """
    fix = (
        "restore it with the code and spec it was taken with, or take a canonical savepoint "
        "(--format canonical), which restores into changed code and another partition count"
    )
    saved = [(o.operator_id, o.operator_name) for o in manifest.operators]
    now = [(o.operator_id, o.name) for o in planned]
    if saved != now:
        raise IncompatibleSavepointError(
            f"savepoint {manifest.id!r} holds state of the operators {saved} (id, name); the "
            f"job's query now has {now}; a native savepoint restores into the same topology "
            f"only: {fix}"
        )
    for saved_op, planned_op in zip(manifest.operators, planned, strict=True):
        if saved_op.partitions != planned_op.partitions:
            raise IncompatibleSavepointError(
                f"savepoint {manifest.id!r} has the state of operator {saved_op.uid!r} in "
                f"{saved_op.partitions} partitions; the spec asks for {planned_op.partitions} "
                f"(spark.shuffle_partitions): set spark.shuffle_partitions: "
                f"{saved_op.partitions}, or {fix}"
            )
        saved_keys = saved_op.key_names() if len(saved_op.store_names) == 1 else None
        if saved_keys is not None and planned_op.keys and saved_keys != planned_op.keys:
            raise IncompatibleSavepointError(
                f"operator {saved_op.uid!r} of savepoint {manifest.id!r} is keyed by "
                f"{list(saved_keys)}; the job's query keys it by {list(planned_op.keys)}: {fix}"
            )
