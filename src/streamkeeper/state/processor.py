"""The state processor API: read, change and write a canonical savepoint's state.

Flink's State Processor API, for Spark jobs. A canonical savepoint keeps each stateful
operator's state as a Delta table of `key` and `value` structs; these functions show it
as Spark DataFrames and write DataFrames back as a new savepoint that a job restores
from like any other (`streamkeeper.state.restore.restore_canonical`)::

    from pyspark.sql import functions as F
    from streamkeeper.state.processor import read_state, write_state
    from streamkeeper.state.format import read_canonical_manifest

    old = read_canonical_manifest(savepoint)
    totals = read_state(spark, savepoint, "totals")          # key: struct, value: struct
    fixed = totals.withColumn(                                # fix one key's count
        "value",
        F.when(F.col("key.key") == "k0042", F.col("value").withField("count", F.lit(0)))
        .otherwise(F.col("value")),
    ).where("key.key != 'k0007'")                             # and forget another key
    write_state(spark, new_savepoint, {"totals": fixed}, based_on=old, based_on_location=savepoint)

- `read_state` gives the rows with Spark's types; a struct's repeated field names (an
  aggregation buffer's `sum` of both `sum()` and `avg()`) read as `sum`, `sum__2`, ...
- `write_state` writes each given DataFrame as that uid's state; the other uids of
  `based_on` are copied unchanged, and its source positions and sink sequences are
  kept, so the restored job continues from the same input position. A DataFrame's
  `key` and `value` types become the savepoint's state schema: a restore checks them
  against the new job's like any savepoint's.
- Without `based_on` (state bootstrapped from a batch table, Flink's bootstrap
  transformation) the savepoint has no source positions: a job restored from it reads
  its file sources from the beginning (other sources need `based_on`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

from streamkeeper.state import deltas
from streamkeeper.state.errors import CanonicalManifestError, StateSchemaError
from streamkeeper.state.format import (
    CanonicalManifest,
    OperatorState,
    read_canonical_manifest,
    state_table_path,
    state_variable_path,
    write_canonical_manifest,
)
from streamkeeper.state.schema import reshape, with_canonical_names
from streamkeeper.storage import Location
from streamkeeper.storage.parquet import open_parquet_whole

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["initial_state", "read_state", "restoring", "state_uids", "write_state"]

READ_BATCH_ROWS = 65_536
BOOTSTRAP_OPERATOR = "bootstrap"  # operator name of state written without a based_on


def state_uids(savepoint_location: Location) -> list[str]:
    """The operator uids a canonical savepoint holds state for."""
    return [op.uid for op in read_canonical_manifest(savepoint_location).operators]


def read_state(
    spark: SparkSession,
    savepoint_location: Location,
    uid: str,
    *,
    state_variable: str | None = None,
    manifest: CanonicalManifest | None = None,
) -> DataFrame:
    """One operator's state in a canonical savepoint: a DataFrame of `key`, `value`.

    A transformWithState operator keeps one table per state variable: name it with
    `state_variable`; its columns are `key` and `value` (ValueState), `list_element`
    (ListState) or `user_map_key` and `user_map_value` (MapState).

    Read by the executors (local files or S3), so it scales with the state.

    Raises:
        CanonicalManifestError: no savepoint there, or it has no such uid or state
            variable (the error lists those it has).
    """
    from pyspark.sql.types import StructType

    manifest = manifest or read_canonical_manifest(savepoint_location)
    op = manifest.operator(uid)
    columns = {"key": op.key_type()}
    relative = op.table
    if op.is_transform_with_state:
        variable = _variable(op, state_variable)
        columns.update(variable["columns"])
        relative = state_variable_path(uid, variable["name"])
    else:
        columns["value"] = op.value_type()
    columns = {name: with_canonical_names(kind) for name, kind in columns.items()}
    schema = StructType.fromJson(
        {
            "type": "struct",
            "fields": [
                {"name": name, "type": kind, "nullable": True, "metadata": {}}
                for name, kind in columns.items()
            ],
        }
    )
    table = savepoint_location.child(relative)
    files = deltas.data_files(table)
    if not files:
        return spark.createDataFrame([], schema)
    paths = spark.createDataFrame([(path,) for path in files], "path string")
    return paths.repartition(len(files)).mapInArrow(_TableReader(table, columns), schema)


def _variable(op: OperatorState, name: str | None) -> dict[str, Any]:
    variables = op.state_variables()
    for variable in variables:
        if variable["name"] == name:
            return variable
    raise CanonicalManifestError(
        f"operator {op.uid!r} ({op.operator_name}) keeps its state per state variable; pass "
        f"state_variable= one of {[v['name'] for v in variables]} (got {name!r})"
    )


class _TableReader:
    """Executor side: a savepoint table's Parquet files as Spark-typed batches."""

    def __init__(self, location: Location, columns: dict[str, Any]) -> None:
        self.location = location
        self.columns = columns

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        filesystem = self.location.arrow_filesystem()
        for batch in batches:
            for path in batch.column("path").to_pylist():
                reader = open_parquet_whole(filesystem, path)  # retried on S3 errors
                for rows in reader.iter_batches(batch_size=READ_BATCH_ROWS):
                    yield pa.RecordBatch.from_arrays(
                        [
                            reshape(rows.column(name), kind, canonical=False)
                            for name, kind in self.columns.items()
                        ],
                        names=list(self.columns),
                    )


_RESTORING: ContextVar[Location | None] = ContextVar("streamkeeper_restoring", default=None)


@contextmanager
def restoring(savepoint_location: Location) -> Iterator[None]:
    """Mark the building of a job's output as part of a restore from this savepoint.

    transformWithState takes its restored state as `initialState`, which the job's own
    code passes when it builds its output: inside this block `initial_state` returns
    the savepoint's rows; outside it, None (a normal start). The restore's caller
    wraps the building of the new output in it.
    """
    token = _RESTORING.set(savepoint_location)
    try:
        yield
    finally:
        _RESTORING.reset(token)


def initial_state(spark: SparkSession, uid: str, state_variable: str) -> DataFrame | None:
    """The state to start transformWithState `uid` from, while a restore builds it.

    Returns the savepoint's rows of that state variable with the key's and the
    variable's fields as columns (for `.groupBy(<key columns>)`, then
    `transformWithStateInPandas(..., initialState=...)`), or None when the job is not
    being restored (start without initialState then)::

        seed = initial_state(events.sparkSession, "counter", "count")
        grouped = events.groupBy("key")
        if seed is None:
            return grouped.transformWithStateInPandas(Counter(), schema, "Update", "None")
        return grouped.transformWithStateInPandas(
            Counter(), schema, "Update", "None", initialState=seed.groupBy("key")
        )

    The processor's `handleInitialState` sets its state variables from these rows.
    """
    savepoint = _RESTORING.get()
    if savepoint is None:
        return None
    frame = read_state(spark, savepoint, uid, state_variable=state_variable)
    return frame.select(*(f"{column}.*" for column in frame.columns))


def write_state(
    spark: SparkSession,
    target: Location,
    states: Mapping[str, DataFrame],
    *,
    based_on: CanonicalManifest | None = None,
    based_on_location: Location | None = None,
    savepoint_id: str | None = None,
    job: str | None = None,
    lineage: str | None = None,
) -> CanonicalManifest:
    """Write a new canonical savepoint into `target` (a fresh folder).

    Args:
        states: uid -> DataFrame with columns `key` and `value` (structs).
        based_on: the savepoint these states derive from: its other uids are copied, its
            source positions, batch and sink sequences kept.
        based_on_location: where `based_on` lives (needed to copy its other uids).
        savepoint_id, job, lineage: for the manifest (defaults: a new id; based_on's).

    Returns:
        The manifest written last into `target` (the savepoint is complete with it).

    Raises:
        StateSchemaError: a DataFrame lacks struct columns `key` and `value`.
        ValueError: `based_on` without `based_on_location` while uids must be copied.
    """
    import pyarrow as pa

    operators = []
    known = {op.uid: op for op in based_on.operators} if based_on else {}
    for position, (uid, frame) in enumerate(states.items()):
        if uid in known and known[uid].is_transform_with_state:
            raise StateSchemaError(
                f"uid {uid!r} is a transformWithState operator, whose state write_state does "
                "not rewrite; change it in the processor's handleInitialState when restoring"
            )
        key_type, value_type = _frame_types(uid, frame)
        rows = frame.select("key", "value").toArrow()
        table = pa.table(
            {
                "key": reshape(rows["key"], key_type, canonical=True),
                "value": reshape(rows["value"], value_type, canonical=True),
            }
        )
        size = deltas.overwrite(target.child(state_table_path(uid)), table)
        origin = known.get(uid)
        operators.append(
            OperatorState(
                uid=uid,
                operator_id=origin.operator_id if origin else position,
                operator_name=origin.operator_name if origin else BOOTSTRAP_OPERATOR,
                store_names=origin.store_names if origin else ["default"],
                partitions=origin.partitions if origin else 0,
                key_schema=json.dumps(key_type),
                value_schema=json.dumps(value_type),
                table=state_table_path(uid),
                rows=table.num_rows,
                bytes=size,
            )
        )
    for uid, origin in known.items():
        if uid not in states:
            operators.append(_copy_operator(origin, based_on_location, target))
    manifest = CanonicalManifest(
        id=savepoint_id or f"sp-{uuid.uuid4().hex[:12]}",
        job=job or (based_on.job if based_on else "unknown"),
        lineage=lineage or (based_on.lineage if based_on else job or "unknown"),
        batch_id=based_on.batch_id if based_on else -1,
        checkpoint_id=based_on.checkpoint_id if based_on else None,
        operators=sorted(operators, key=lambda op: op.operator_id),
        source=based_on.source if based_on else {"offsets": None, "log": {}},
        sink_seqs=dict(based_on.sink_seqs) if based_on else {},
        spark_version=spark.version,
        created_at=time.time(),
        extra={"derived_from": based_on.id} if based_on else {"bootstrapped": True},
    )
    write_canonical_manifest(target, manifest)
    return manifest


def _frame_types(uid: str, frame: DataFrame) -> tuple[dict[str, Any], dict[str, Any]]:
    types = {field.name: json.loads(field.dataType.json()) for field in frame.schema.fields}
    for column in ("key", "value"):
        kind = types.get(column)
        if not (isinstance(kind, dict) and kind.get("type") == "struct"):
            raise StateSchemaError(
                f"the state of uid {uid!r} needs struct columns 'key' and 'value'; got "
                f"columns {frame.columns} ({column}: {kind!r}); select them, e.g. "
                "F.struct('id').alias('key'), F.struct('count').alias('value')"
            )
    return types["key"], types["value"]


def _copy_operator(
    origin: OperatorState, source: Location | None, target: Location
) -> OperatorState:
    if source is None:
        raise ValueError(
            f"based_on has uid {origin.uid!r}, which states does not replace; pass "
            "based_on_location so that its table can be copied"
        )
    table = deltas.read_table(source.child(origin.table))
    size = deltas.overwrite(target.child(state_table_path(origin.uid)), table)
    return OperatorState(
        **{**origin.to_dict(), "table": state_table_path(origin.uid), "bytes": size}
    )
