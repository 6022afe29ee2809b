"""Restore a canonical savepoint into a fresh checkpoint for the new code.

Steps (each before the next; nothing outside a work folder is touched until the last):

1. match uids: every savepoint uid (renamed by `uid_mapping`) must be an operator of the
   new job, unless `allow_non_restored_state`; a new uid starts empty, with a warning;
2. bootstrap (bootstrap.py): Spark runs the new code over an empty input as batch 0,
   pinning the new state store and partition count, and writing the operators'
   metadata and schemas (`prepare_bootstrap` runs it ahead, before the savepoint
   exists: an upgrade's green does, while blue still runs);
3. check every operator's state schema, old against new (schema.py): an incompatible
   change stops the restore here, having written nothing;
4. write the source positions as batch 1 (`offsets/1`, and the file source's log),
   each operator's state as state version 2 (writers.py), then `commits/1`;
5. move the finished checkpoint into `checkpoint_dir`. Started on it, the new query
   resumes at batch 2 from the savepoint's positions and state.

A failure at any step removes the work folder: `checkpoint_dir` stays as it was (empty).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper.errors import CheckpointRestoreError
from streamkeeper.runtime.session import CHANGELOG_KEY, HDFS_PROVIDER, ROCKSDB_PROVIDER
from streamkeeper.spec import StateBackendSpec
from streamkeeper.state import deltas, tws
from streamkeeper.state.bootstrap import run_bootstrap
from streamkeeper.state.errors import OperatorUidError, StateSchemaError
from streamkeeper.state.format import OperatorState
from streamkeeper.state.positions import (
    SourcePositions,
    check_sources,
    read_offsets_lines,
    write_restored_commit,
    write_restored_positions,
    write_text_atomically,
)
from streamkeeper.state.schema import ValuePlan, check_compatible
from streamkeeper.state.spark_state import (
    OperatorInfo,
    read_operators,
    session_conf,
    state_frame,
    state_types,
)
from streamkeeper.state.uids import resolve_uids
from streamkeeper.state.work_folders import create_work_folder, sweep_stale_work_folders
from streamkeeper.state.writers import (
    CODEC_CONF,
    DRIVER_STATE_BYTES,
    SavepointRows,
    raw_state_schema,
    rewrite_rocksdb,
    savepoint_rows,
    warm_python_workers,
    write_hdfs_version,
)
from streamkeeper.storage import Location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

RESTORED_BATCH = 1  # batch 0 is the bootstrap; the query resumes at batch 2
_PINNED_OFF = {  # confs the restore can only write for their default value
    "spark.sql.streaming.stateStore.rowChecksum.enabled": "false",
}


@dataclass(frozen=True)
class RestoredOperator:
    """One operator of the new job after the restore."""

    uid: str
    operator_id: int
    operator_name: str
    restored_from: str | None  # the savepoint uid its state came from; None: started empty
    rows: int


@dataclass(frozen=True)
class RestoreReport:
    """What a restore wrote, and what it had to leave behind."""

    checkpoint_dir: Path
    restored_batch: int  # the query resumes at the batch after it
    partitions: int
    state_backend: str
    operators: list[RestoredOperator]
    not_restored: list[str]  # savepoint uids without an operator (allow_non_restored_state)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0  # in all
    bootstrap_seconds: float = 0.0  # Spark's batch 0 over the empty input
    state_seconds: float = 0.0  # reading, converting and writing the state

    @property
    def rows(self) -> int:
        return sum(op.rows for op in self.operators)


@dataclass(frozen=True)
class _Assignment:
    """The new operator and the savepoint state (if any) it starts from."""

    new: OperatorInfo
    uid: str
    old: OperatorState | None
    plan: ValuePlan | None = None
    key_type: dict[str, Any] | None = None
    value_type: dict[str, Any] | None = None
    raw_schema: Any = None


@dataclass
class PreparedBootstrap:
    """A restore's bootstrap batch, run before its savepoint exists (`prepare_bootstrap`).

    The bootstrap depends only on the new code, its partition count, state store and
    output mode, so an upgrade's green runs it while blue still runs; `restore_canonical`
    of the same output into the same directory then starts at step 3. Whoever prepared
    it calls `discard` when no restore took it (a restore removes what it takes).
    """

    output: Any  # the new job's output stream (the same DataFrame object)
    checkpoint_dir: Path
    shuffle_partitions: int
    state_backend: StateBackendSpec
    output_mode: str
    work: Path
    kinds: list[str]
    seconds: float

    def fits(
        self,
        output: Any,
        checkpoint_dir: Path,
        shuffle_partitions: int,
        state_backend: StateBackendSpec,
        output_mode: str,
    ) -> bool:
        return (
            output is self.output
            and (checkpoint_dir, shuffle_partitions, state_backend, output_mode)
            == (self.checkpoint_dir, self.shuffle_partitions, self.state_backend, self.output_mode)
            and (self.work / "checkpoint" / "commits" / "0").is_file()
        )

    def discard(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def prepare_bootstrap(
    spark: SparkSession,
    new_output: DataFrame,
    checkpoint_dir: Path,
    work: Path,
    *,
    shuffle_partitions: int,
    state_backend: StateBackendSpec,
    output_mode: str = "update",
) -> PreparedBootstrap:
    """Run the bootstrap of a later `restore_canonical` into `work` (created; beside
    `checkpoint_dir`, on its file system: the restore moves it into place in one rename).

    Raises:
        CheckpointRestoreError: the bootstrap batch failed (`work` is removed).
    """
    started = time.monotonic()
    tws.refuse_without_column_families(new_output, state_backend.type)
    work.mkdir(parents=True)
    try:
        with session_conf(spark, _restore_conf(state_backend, shuffle_partitions)):
            kinds = run_bootstrap(spark, new_output, work / "checkpoint", output_mode, work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    log.info("restore bootstrap prepared in %s (%.1fs)", work, time.monotonic() - started)
    return PreparedBootstrap(
        output=new_output,
        checkpoint_dir=checkpoint_dir,
        shuffle_partitions=shuffle_partitions,
        state_backend=state_backend,
        output_mode=output_mode,
        work=work,
        kinds=kinds,
        seconds=time.monotonic() - started,
    )


def restore_canonical(
    spark: SparkSession,
    *,
    savepoint_location: Location,
    operators: list[OperatorState],
    source_offsets: dict[str, Any] | None,
    source_log: dict[str, Any] | None,
    new_output: DataFrame,
    new_uids: Mapping[int, str] | None,
    checkpoint_dir: Path,
    shuffle_partitions: int,
    state_backend: StateBackendSpec,
    uid_mapping: Mapping[str, str] | None = None,
    allow_non_restored_state: bool = False,
    output_mode: str = "update",
    bootstrap: PreparedBootstrap | None = None,
) -> RestoreReport:
    """Write a fresh checkpoint from which `new_output` continues the savepoint.

    Args:
        savepoint_location: the savepoint folder (its tables are below it).
        operators: the manifest's operators.
        source_offsets, source_log: the manifest's `source.offsets` and `source.log`
            (None: the savepoint has no positions; file sources start from the beginning).
        new_output: the new job's output stream, built from the new code.
        new_uids: the new job's operator id -> uid (its spec's
            `state.operator_uids()`); None or empty: the default uids `op-N`.
        checkpoint_dir: where the new checkpoint goes; must be empty or absent.
        shuffle_partitions: the new job's number of state partitions.
        state_backend: the new job's state store.
        uid_mapping: savepoint uid -> new uid, for renamed operators.
        allow_non_restored_state: drop the state of savepoint uids the new job lacks
            instead of failing (Flink's --allowNonRestoredState).
        output_mode: the new job's output mode.
        bootstrap: the bootstrap, run ahead (`prepare_bootstrap`); taken (and removed
            with the work folder) if it fits this restore, else discarded and run again.

    Raises:
        OperatorUidError: a savepoint uid has no operator in the new job (and state may
            not be dropped), or the uids or the mapping do not fit.
        StateSchemaError: an operator's state schema changed incompatibly.
        CheckpointRestoreError: the checkpoint directory is not empty, or Spark failed.
    """
    started = time.monotonic()
    if bootstrap is not None and not bootstrap.fits(
        new_output, checkpoint_dir, shuffle_partitions, state_backend, output_mode
    ):
        log.info("restore: the bootstrap prepared in %s does not fit; run again", bootstrap.work)
        bootstrap.discard()
        bootstrap = None
    try:
        _check_empty(checkpoint_dir)
        positions = SourcePositions.from_manifest(source_offsets, source_log)
        by_new_uid = _match_uids(operators, uid_mapping or {})
        tws.refuse_without_column_families(new_output, state_backend.type)
    except BaseException:
        if bootstrap is not None:
            bootstrap.discard()
        raise
    warnings: list[str] = []
    sweep_stale_work_folders(checkpoint_dir)  # a killed restore's, into this directory
    if bootstrap is None:
        work = create_work_folder(checkpoint_dir)
    else:
        work = bootstrap.work
    staging = work / "checkpoint"
    warmed = None
    try:
        with session_conf(spark, _restore_conf(state_backend, shuffle_partitions)):
            if bootstrap is None:
                if sum(op.bytes for op in operators) > DRIVER_STATE_BYTES:  # tasks will write
                    warmed = warm_python_workers(spark)
                kinds = run_bootstrap(spark, new_output, staging, output_mode, work)
            else:
                kinds = bootstrap.kinds
            bootstrapped = time.monotonic()
            positions = check_sources(positions, kinds)
            _check_pinned_confs(staging)
            assignments = _assign(spark, staging, new_uids, by_new_uid, warnings)
            not_restored = _left_out(by_new_uid, assignments, allow_non_restored_state, warnings)
            planned = [_plan(spark, staging, a, state_backend) for a in assignments]
            warnings += [w for a in planned if a.plan for w in a.plan.warnings]
            for warning in warnings:
                log.warning("restore: %s", warning)
            write_restored_positions(staging, positions, read_offsets_lines(staging, 0))
            if warmed is not None:
                warmed()
            writing = time.monotonic()
            _write_state(spark, staging, planned, savepoint_location, state_backend)
            written = time.monotonic()
            write_restored_commit(staging, positions)
        _move_into_place(staging, checkpoint_dir)
    finally:
        if warmed is not None:
            warmed()  # a restore that failed early does not leave its job behind
        shutil.rmtree(work, ignore_errors=True)
    report = RestoreReport(
        checkpoint_dir=checkpoint_dir,
        restored_batch=RESTORED_BATCH,
        partitions=shuffle_partitions,
        state_backend=state_backend.type,
        operators=[
            RestoredOperator(
                uid=a.uid,
                operator_id=a.new.operator_id,
                operator_name=a.new.operator_name,
                restored_from=a.old.uid if a.old else None,
                rows=a.old.rows if a.old else 0,
            )
            for a in planned
        ],
        not_restored=not_restored,
        warnings=warnings,
        seconds=time.monotonic() - started,
        bootstrap_seconds=bootstrapped - started,
        state_seconds=written - writing,
    )
    log.info(
        "restored %d rows of %d operator(s) into %s (%d partitions, %s) in %.2fs: "
        "bootstrap %.2fs, plan %.2fs, state %.2fs",
        report.rows,
        len(report.operators),
        checkpoint_dir,
        shuffle_partitions,
        state_backend.type,
        report.seconds,
        report.bootstrap_seconds,
        writing - bootstrapped,
        report.state_seconds,
    )
    return report


def _check_empty(checkpoint_dir: Path) -> None:
    if checkpoint_dir.exists() and (not checkpoint_dir.is_dir() or any(checkpoint_dir.iterdir())):
        raise CheckpointRestoreError(
            f"checkpoint directory {str(checkpoint_dir)!r} is not empty; a savepoint is "
            "restored into a fresh checkpoint: point checkpoint.dir at a new directory or "
            "remove the old checkpoint"
        )


def _match_uids(
    operators: list[OperatorState], mapping: Mapping[str, str]
) -> dict[str, OperatorState]:
    """new uid -> savepoint operator, after renaming by `uid_mapping`."""
    known = {op.uid for op in operators}
    unknown = sorted(set(mapping) - known)
    if unknown:
        raise OperatorUidError(
            f"uid_mapping renames {unknown}, which the savepoint does not have; its uids are "
            f"{sorted(known)}"
        )
    by_new: dict[str, OperatorState] = {}
    for op in operators:
        target = mapping.get(op.uid, op.uid)
        if target in by_new:
            raise OperatorUidError(
                f"uid_mapping maps both {by_new[target].uid!r} and {op.uid!r} to {target!r}; "
                "an operator's state comes from one savepoint uid"
            )
        by_new[target] = op
    return by_new


def _restore_conf(backend: StateBackendSpec, partitions: int) -> dict[str, str | None]:
    return {
        "spark.sql.streaming.stateStore.providerClass": (
            ROCKSDB_PROVIDER if backend.type == "rocksdb" else HDFS_PROVIDER
        ),
        # Written synchronously, so nothing is uploaded into the work folder later; the
        # job may turn changelog checkpointing on when it runs (Spark allows that).
        CHANGELOG_KEY: "false",
        "spark.sql.shuffle.partitions": str(partitions),
        # The rewriter writes partition p from task p: no coalescing of our partitions.
        "spark.sql.adaptive.enabled": "false",
    }


def _check_pinned_confs(staging: Path) -> None:
    import json

    confs = json.loads(read_offsets_lines(staging, 0)[0]).get("conf", {})
    for key, expected in _PINNED_OFF.items():
        if confs.get(key, expected) != expected:
            raise CheckpointRestoreError(
                f"the new job sets {key}={confs[key]}; canonical restore writes state only "
                f"with {key}={expected}: unset it for the restore"
            )


def _assign(
    spark: SparkSession,
    staging: Path,
    new_uids: Mapping[int, str] | None,
    by_new_uid: dict[str, OperatorState],
    warnings: list[str],
) -> list[_Assignment]:
    new_operators = read_operators(spark, staging)
    uids = resolve_uids(new_uids, new_operators)
    assignments = []
    for op in new_operators:
        old = by_new_uid.get(uids[op.operator_id])
        if old is not None and old.is_transform_with_state != op.is_transform_with_state:
            raise StateSchemaError(
                f"operator {uids[op.operator_id]!r} is {old.operator_name} in the savepoint but "
                f"{op.operator_name} in the new job; a uid's state restores into the same kind "
                "of operator: map the uid to another operator (uid_mapping) or drop its state "
                "(allow_non_restored_state)"
            )
        if old is None:
            warnings.append(
                f"operator {uids[op.operator_id]!r} ({op.describe()}) has no state in the "
                "savepoint; it starts empty"
            )
        assignments.append(_Assignment(op, uids[op.operator_id], old))
    return assignments


def _left_out(
    by_new_uid: dict[str, OperatorState],
    assignments: list[_Assignment],
    allow_non_restored: bool,
    warnings: list[str],
) -> list[str]:
    """Savepoint uids the new job lacks: an error, unless their state may be dropped."""
    new_uids = sorted(a.uid for a in assignments)
    lost = {old.uid: uid for uid, old in by_new_uid.items() if uid not in new_uids}
    left = sorted(lost)
    if not left:
        return []
    if not allow_non_restored:
        renamed = [f"{old!r} -> {new!r}" for old, new in sorted(lost.items()) if old != new]
        mapped = f" (mapped by uid_mapping: {', '.join(renamed)})" if renamed else ""
        raise OperatorUidError(
            f"savepoint operator uid(s) {left}{mapped} have no operator in the new job (its "
            f"uids: {new_uids}); give the operator that uid in the new job's state.operators, "
            f"map it with uid_mapping (--uid-mapping, e.g. "
            f"{{{left[0]!r}: {new_uids[0] if new_uids else 'new'!r}}}), or pass "
            "allow_non_restored_state (--allow-non-restored-state) to drop that state"
        )
    warnings.append(
        f"savepoint operator uid(s) {left} have no operator in the new job: their state "
        "is dropped (allow_non_restored_state)"
    )
    return left


def _plan(
    spark: SparkSession, staging: Path, assignment: _Assignment, backend: StateBackendSpec
) -> _Assignment:
    """Check the operator's state schema (old -> new) and prepare its writing."""
    if assignment.new.is_transform_with_state:
        if assignment.old is not None:
            tws.check_restored(spark, staging, assignment.uid, assignment.old, assignment.new)
        return assignment
    frame = state_frame(spark, staging, 0, assignment.new.operator_id)
    key_type, value_type = state_types(frame)
    raw = (
        state_frame(spark, staging, 0, assignment.new.operator_id, raw=True).schema
        if backend.type == "rocksdb"
        else raw_state_schema(key_type)
    )
    plan = None
    if assignment.old is not None:
        plan = check_compatible(
            assignment.uid,
            assignment.old.key_type(),
            assignment.old.value_type(),
            key_type,
            value_type,
        )
    return _Assignment(
        assignment.new, assignment.uid, assignment.old, plan, key_type, value_type, raw
    )


def _write_state(
    spark: SparkSession,
    staging: Path,
    planned: list[_Assignment],
    savepoint: Location,
    backend: StateBackendSpec,
) -> None:
    small = sum(a.old.bytes for a in planned if a.old is not None) <= DRIVER_STATE_BYTES
    rows = {}
    for a in planned:
        if a.old is None or a.new.is_transform_with_state:  # the latter: via initialState
            continue
        table = savepoint.child(a.old.table)
        rows[a.new.operator_id] = savepoint_rows(
            deltas.data_files(table), table, a.key_type, a.value_type, a.plan, a.raw_schema
        )
    partitions = int(spark.conf.get("spark.sql.shuffle.partitions"))
    if backend.type == "rocksdb":
        frames = {op: r.frame(spark, on_driver=small) for op, r in rows.items()}
        rewrite_rocksdb(spark, staging, frames, partitions, read_batch=0, write_batch=1)
        return
    import json

    codec = json.loads(read_offsets_lines(staging, 0)[0])["conf"].get(CODEC_CONF, "lz4")
    for a in planned:
        write_hdfs_version(
            spark,
            rows.get(a.new.operator_id) or SavepointRows(None, a.raw_schema),
            staging,
            a.new.operator_id,
            partitions,
            RESTORED_BATCH + 1,
            codec,
            on_driver=small,
        )


def _move_into_place(staging: Path, checkpoint_dir: Path) -> None:
    """Make the finished checkpoint visible in one rename.

    Operator metadata v2 (transformWithState) names its schema files by absolute path;
    those are rewritten for the checkpoint's final place first.
    """
    for metadata in staging.glob("state/*/_metadata/v2/*"):
        if metadata.name.startswith("."):
            continue
        text = metadata.read_text()
        if str(staging) in text:
            write_text_atomically(metadata, text.replace(str(staging), str(checkpoint_dir)))
    checkpoint_dir.parent.mkdir(parents=True, exist_ok=True)
    if checkpoint_dir.exists():
        checkpoint_dir.rmdir()  # empty, checked at the start
    os.replace(staging, checkpoint_dir)
