"""`streamkeeper state SAVEPOINT`: the rows of a savepoint's state, for people.

A canonical savepoint's state is Delta tables (one per operator uid), read with
delta-rs. A native one is Spark's own files: they are restored into a temporary
directory and read with Spark's `statestore` reader (a local SparkSession).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.restore import download
from streamkeeper.snapshots.savepoint_check import check_savepoint
from streamkeeper.snapshots.savepoint_manifest import (
    SavepointManifest,
    SavepointPlace,
    StateOperatorInfo,
)
from streamkeeper.snapshots.savepoints import locate
from streamkeeper.storage import Location


@dataclass(frozen=True)
class StateRows:
    savepoint_id: str
    uid: str
    rows: list[dict[str, Any]]


def read_state(
    root: Location, savepoint_id: str, *, uid: str | None, key: str | None, limit: int
) -> list[StateRows]:
    """Up to `limit` rows per operator (or of operator `uid`), of key `key` if given.

    Raises:
        UnknownSavepointError, BrokenSavepointError, SavepointError: naming the fix.
    """
    store = root.store()
    lineage, entry = locate(store, savepoint_id)
    layout = LineageLayout(root, lineage, entry.job)
    place = SavepointPlace(store, layout.savepoint(savepoint_id))
    manifest = check_savepoint(place, savepoint_id, entry=entry, layout=layout).raise_if_broken()
    operators = [manifest.operator(uid)] if uid is not None else manifest.operators
    if manifest.format == "canonical":
        folder = root.child(layout.savepoint(savepoint_id))
        return [_canonical_rows(manifest, folder, op, key, limit) for op in operators]
    return _native_rows(place, manifest, operators, key, limit)


def _key_text(value: Any) -> str:
    """A key as `--key` spells it: a one-column key as its value, else its JSON."""
    if isinstance(value, dict) and len(value) == 1:
        return str(next(iter(value.values())))
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def _canonical_rows(
    manifest: SavepointManifest,
    folder: Location,
    op: StateOperatorInfo,
    key: str | None,
    limit: int,
) -> StateRows:
    from deltalake import DeltaTable

    location = folder.child(op.table or f"state/{op.uid}")
    dataset = DeltaTable(
        location.uri, storage_options=location.storage_options()
    ).to_pyarrow_dataset()
    rows: list[dict[str, Any]] = []
    for batch in dataset.to_batches(use_threads=False):
        for row in batch.to_pylist():
            first = row.get("key", next(iter(row.values()), None))
            if key is None or _key_text(first) == key:
                rows.append(row)
                if len(rows) >= limit:
                    return StateRows(manifest.id, op.uid, rows)
    return StateRows(manifest.id, op.uid, rows)


def _native_rows(
    place: SavepointPlace,
    manifest: SavepointManifest,
    operators: list[StateOperatorInfo],
    key: str | None,
    limit: int,
) -> list[StateRows]:
    from pyspark.sql import functions as F

    work = Path(tempfile.mkdtemp(prefix="streamkeeper-state-"))
    directory = work / "checkpoint"
    try:
        download(
            place.store,
            manifest.files,
            directory,
            label=f"savepoint {manifest.id}",
            keys=lambda f: place.file_key(manifest, f),
        )
        spark = _session()
        found = []
        for op in operators:
            rows: list[dict[str, Any]] = []
            fields = json.loads(op.key_schema).get("fields", [])
            for store_name in op.store_names:
                frame = (
                    spark.read.format("statestore")
                    .option("operatorId", op.operator_id)
                    .option("storeName", store_name)
                    .option("batchId", manifest.batch_id)
                    .load(str(directory))
                )
                if key is not None:  # the key schema is the first store's (most have one)
                    text = (
                        F.col("key").getField(fields[0]["name"]).cast("string")
                        if len(fields) == 1
                        else F.to_json(F.col("key"))
                    )
                    frame = frame.where(text == key)
                for row in frame.limit(limit - len(rows)).collect():
                    rows.append({"store": store_name, **row.asDict(recursive=True)})
                if len(rows) >= limit:
                    break
            found.append(StateRows(manifest.id, op.uid, rows))
        return found
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _session() -> Any:
    import os
    import sys

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.appName("streamkeeper-state")
        .master("local[1]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel(os.environ.get("STREAMKEEPER_SPARK_LOG_LEVEL", "ERROR"))
    return session
