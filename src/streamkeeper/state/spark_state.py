"""What Spark itself tells about a checkpoint's state: operators, schemas, rows.

Only public readers are used here: `state-metadata` (the operators, their stores and
partition counts) and `statestore` (an operator's rows at a batch, `key` and `value`
structs and `partition_id`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper.errors import CheckpointRestoreError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

DEFAULT_STORE = "default"
# The statestore reader's raw mode (UnsafeRow bytes per column family); what Spark's own
# state rewriter reads and what it checks a replacement frame's schema against.
RAW_OPTION = "_readAllColumnFamilies"


@dataclass(frozen=True)
class OperatorInfo:
    """A stateful operator of a checkpoint, as `state-metadata` lists it."""

    operator_id: int
    operator_name: str
    store_names: tuple[str, ...]
    partitions: int
    properties: str | None = None  # JSON; transformWithState lists its state variables

    def describe(self) -> str:
        return f"{self.operator_id} ({self.operator_name})"

    @property
    def is_transform_with_state(self) -> bool:
        return self.operator_name.startswith("transformWithState")

    def state_variables(self) -> list[dict[str, Any]]:
        """transformWithState's variables: [{"stateName", "stateVariableType", ...}]."""
        return json.loads(self.properties or "{}").get("stateVariables", [])


def ensure_state_coordinator(spark: SparkSession) -> None:
    """Start the driver's state store coordinator (created with the streaming manager).

    Reading RocksDB state in a session that never started a query fails without it.
    """
    spark._jsparkSession.streams()  # the JVM session's streaming manager


def read_operators(spark: SparkSession, checkpoint_dir: Path | str) -> list[OperatorInfo]:
    """The checkpoint's stateful operators, by operator id.

    Operator metadata v1 (every operator but transformWithState) is read from its files,
    `state/{op}/_metadata/metadata`, without a Spark job; anything else through Spark's
    `state-metadata` reader.

    Raises:
        CheckpointRestoreError: the directory is not a checkpoint with state metadata.
    """
    from pyspark.errors import AnalysisException

    from_files = _operators_from_v1_files(Path(checkpoint_dir))
    if from_files is not None:
        return from_files

    try:
        rows = spark.read.format("state-metadata").load(str(checkpoint_dir)).collect()
    except AnalysisException as error:
        first = str(error).strip().splitlines()[0]
        raise CheckpointRestoreError(
            f"cannot read the state metadata of checkpoint {str(checkpoint_dir)!r} ({first}); "
            "pass the checkpoint directory of a stateful query that completed a batch"
        ) from None
    stores: dict[int, dict[str, Any]] = {}
    for row in rows:
        entry = stores.setdefault(
            row.operatorId,
            {
                "name": row.operatorName,
                "stores": [],
                "parts": row.numPartitions,
                "properties": row.operatorProperties,
            },
        )
        entry["stores"].append(row.stateStoreName)
    return [
        OperatorInfo(
            op, entry["name"], tuple(sorted(entry["stores"])), entry["parts"], entry["properties"]
        )
        for op, entry in sorted(stores.items())
    ]


def _operators_from_v1_files(checkpoint_dir: Path) -> list[OperatorInfo] | None:
    """Operators from their v1 metadata files; None if any operator has none (or v2)."""
    state = checkpoint_dir / "state"
    if not state.is_dir():
        return None
    operators = []
    for folder in sorted(state.iterdir()):
        if not folder.name.isdigit():
            continue
        metadata = folder / "_metadata"
        if (metadata / "v2").exists() or not (metadata / "metadata").is_file():
            return None
        try:
            version, body = (metadata / "metadata").read_text().split("\n", 1)
            entry = json.loads(body)
            stores = entry["stateStoreInfo"]
            info = entry["operatorInfo"]
            if version.strip() != "v1" or not stores or int(info["operatorId"]) != int(folder.name):
                return None
            partitions = {int(store["numPartitions"]) for store in stores}
            if len(partitions) != 1:
                return None
            operators.append(
                OperatorInfo(
                    int(info["operatorId"]),
                    str(info["operatorName"]),
                    tuple(sorted(str(store["storeName"]) for store in stores)),
                    partitions.pop(),
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return sorted(operators, key=lambda op: op.operator_id) or None


def state_frame(
    spark: SparkSession,
    checkpoint_dir: Path | str,
    batch_id: int,
    operator_id: int,
    store_name: str = DEFAULT_STORE,
    *,
    raw: bool = False,
    state_variable: str | None = None,
) -> DataFrame:
    """An operator's state after batch `batch_id`: `key`, `value`, `partition_id`.

    With `raw`, Spark's internal form instead: `partition_key`, `key_bytes`,
    `value_bytes`, `column_family_name` (RocksDB only). A transformWithState variable
    reads as `key` and `value` (ValueState), `list_element` (ListState, one row per
    element) or `user_map_key` and `user_map_value` (MapState, one row per entry).
    """
    ensure_state_coordinator(spark)
    reader = (
        spark.read.format("statestore")
        .option("batchId", batch_id)
        .option("operatorId", operator_id)
        .option("storeName", store_name)
    )
    if raw:
        reader = reader.option(RAW_OPTION, "true")
    if state_variable is not None:
        reader = reader.option("stateVarName", state_variable)
    return reader.load(str(checkpoint_dir))


def state_types(frame: DataFrame) -> tuple[dict[str, Any], dict[str, Any]]:
    """The key and value struct types (Spark's schema JSON) of a `state_frame`."""
    schema = frame.schema
    return (
        json.loads(schema["key"].dataType.json()),
        json.loads(schema["value"].dataType.json()),
    )


def canonically_named(frame: DataFrame) -> DataFrame:
    """The state's columns (not `partition_id`), struct field names made unique.

    An aggregation buffer repeats names (`sum` of sum() and avg()), which Arrow refuses.
    """
    from pyspark.sql import functions as F

    from streamkeeper.state.schema import spark_data_type, with_canonical_names

    return frame.select(
        *(
            F.col(name).cast(spark_data_type(with_canonical_names(kind))).alias(name)
            for name, kind in state_columns(frame).items()
        )
    )


def state_columns(frame: DataFrame) -> dict[str, Any]:
    """name -> Spark type JSON of a state frame's columns, `partition_id` left out."""
    return {
        field.name: json.loads(field.dataType.json())
        for field in frame.schema.fields
        if field.name != "partition_id"
    }


@contextmanager
def session_conf(spark: SparkSession, values: dict[str, str | None]) -> Iterator[None]:
    """Set SQL confs for the duration of a block; restore what was there after."""
    before = {key: spark.conf.get(key, None) for key in values}
    try:
        for key, value in values.items():
            _set(spark, key, value)
        yield
    finally:
        for key, value in before.items():
            _set(spark, key, value)


def _set(spark: SparkSession, key: str, value: str | None) -> None:
    if value is None:
        spark.conf.unset(key)
    else:
        spark.conf.set(key, value)
