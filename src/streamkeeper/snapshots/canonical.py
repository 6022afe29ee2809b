"""Canonical savepoints through the canonical-state package, `streamkeeper.state`.

The only place the savepoint lifecycle touches canonical state, imported lazily:
without the package, native savepoints work and a canonical one is refused with a
clear error. What it uses of it:

- `state.export.export_canonical(spark, checkpoint_dir, batch_id, uids, target)`: each
  operator's state after batch N as a Delta table `state/{uid}` below the savepoint
  folder `target`; returns the operators (`OperatorState`) for the manifest;
- `state.positions.read_source_positions(checkpoint_dir, batch_id)`: the source
  positions a restore resumes from (`to_manifest()`: the manifest's `source`);
- `state.restore.restore_canonical(...)`: a fresh checkpoint for the job's (maybe
  changed) query and partition count, from the tables and the positions;
- `state.restore.prepare_bootstrap(...)`: that restore's bootstrap batch, run before
  the savepoint exists (an upgrade's green, while blue runs).

The savepoint's `manifest.json` is both ours (snapshots/savepoint_manifest.py) and
canonical state's `CanonicalManifest`: each reads its own fields.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper.errors import IncompatibleSavepointError, SavepointError, StreamkeeperError
from streamkeeper.spec import JobSpec
from streamkeeper.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from streamkeeper.snapshots.savepoint_manifest import SavepointManifest

PACKAGE = "streamkeeper.state"


def available() -> bool:
    """Whether the canonical-state package is installed."""
    try:
        _module("format")
    except SavepointError:
        return False
    return True


def _module(name: str) -> Any:
    try:
        return importlib.import_module(f"{PACKAGE}.{name}")
    except ImportError as error:
        raise SavepointError(
            f"canonical savepoints need the package {PACKAGE!r}, which is not available "
            f"({error}); take a native savepoint (--format native), or install a "
            "streamkeeper that includes canonical state"
        ) from None


def operator_uids(spec: JobSpec) -> dict[int, str]:
    """The spec's operator uids by Spark operator id (`state.operators`; empty if none)."""
    state = getattr(spec, "state", None)  # the spec's `state:` section, when it has one
    return dict(state.operator_uids()) if state is not None else {}


def export_state(
    spark: SparkSession, checkpoint_dir: Path, folder: Location, batch_id: int, uids: dict
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Export every operator's state after batch `batch_id` into the savepoint `folder`.

    Returns:
        The operators (manifest form) and the source positions (the manifest's `source`).

    Raises:
        SavepointError: no canonical state here, or an operator it cannot carry.
    """
    export = _module("export").export_canonical
    positions = _module("positions").read_source_positions
    try:
        operators = export(spark, checkpoint_dir, batch_id, uids, folder)
        source = positions(checkpoint_dir, batch_id).to_manifest()
    except StreamkeeperError as error:
        raise SavepointError(f"canonical export failed: {error}") from error
    return [op.to_dict() for op in operators], source


def restore_state(
    spark: SparkSession,
    spec: JobSpec,
    manifest: SavepointManifest,
    folder: Location,
    checkpoint_dir: Path,
    output: DataFrame,
    *,
    uid_mapping: dict[str, str],
    allow_non_restored_state: bool,
    bootstrap: Any = None,
) -> None:
    """Write a canonical savepoint's state into the empty `checkpoint_dir` for `output`.

    `bootstrap` is `prepare_restore`'s, taken if it fits (removed either way).

    Raises:
        IncompatibleSavepointError: the uids or the state schemas do not fit the job.
    """
    operator_state = _module("format").OperatorState
    restore = _module("restore").restore_canonical
    source = manifest.source or {}
    try:
        restore(
            spark,
            savepoint_location=folder,
            operators=[operator_state.from_dict(vars(op)) for op in manifest.operators],
            source_offsets=source.get("offsets"),
            source_log=source.get("log"),
            new_output=output,
            new_uids=operator_uids(spec) or None,
            checkpoint_dir=checkpoint_dir,
            shuffle_partitions=spec.spark.shuffle_partitions,
            state_backend=spec.state_backend,
            uid_mapping=uid_mapping,
            allow_non_restored_state=allow_non_restored_state,
            output_mode=spec.output_mode,
            bootstrap=bootstrap,
        )
    except StreamkeeperError as error:
        raise IncompatibleSavepointError(
            f"savepoint {manifest.id!r} cannot be restored into this job: {error}"
        ) from error


def prepare_restore(
    spark: SparkSession, spec: JobSpec, checkpoint_dir: Path, output: DataFrame, work: Path
) -> Any:
    """Run the bootstrap of a later canonical restore of `spec` into `checkpoint_dir`,
    in `work` (beside it); `restore_state(..., bootstrap=...)` takes it.

    Raises:
        IncompatibleSavepointError: the new code cannot run over an empty input.
    """
    prepare = _module("restore").prepare_bootstrap
    try:
        return prepare(
            spark,
            output,
            checkpoint_dir,
            work,
            shuffle_partitions=spec.spark.shuffle_partitions,
            state_backend=spec.state_backend,
            output_mode=spec.output_mode,
        )
    except StreamkeeperError as error:
        raise IncompatibleSavepointError(
            f"the job's new code cannot be restored into: {error}"
        ) from error
