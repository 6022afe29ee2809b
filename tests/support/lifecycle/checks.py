"""What must hold in the lifecycle property test's world, after every step and at the end.

Each check reads storage only, and compares with a reference computed from the input
(world.py), never with the tables' own markers: a lost or doubled batch fails it.
"""

from __future__ import annotations

from pathlib import Path

from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.index import read_index
from streamkeeper.snapshots.manifest import read_manifest
from streamkeeper.snapshots.savepoint_manifest import SavepointPlace
from streamkeeper.snapshots.savepoints import SavepointRegistry
from tests.support.lifecycle.world import (
    JOB,
    OTHER_JOB,
    World,
    describe_ids,
    last_of_prefix,
    prefix_length,
)


class Violation(AssertionError):
    """An invariant of invariants 1-5 (shared/DESIGN.md) does not hold."""


def output_is_a_prefix(world: World) -> None:
    """Invariants 1 and 2 mid-run: each table holds the effect of a prefix of the input,
    every event at most once (a batch whose checkpoint never completed shows as a gap or
    a repeat once the batch runs again)."""
    ledger = [r["id"] for r in world.rows("ledger")]
    if prefix_length(ledger) is None:
        raise Violation(f"ledger is not a prefix of the input: {describe_ids(ledger)}")
    last = {r["key"]: r["value"] for r in world.rows("last")}
    highest = max(last.values(), default=-1)
    if last != last_of_prefix(highest + 1):
        raise Violation(
            f"last is the merge of no prefix of the input: {sorted(last.items())} vs "
            f"{sorted(last_of_prefix(highest + 1).items())}"
        )
    shared = [r["id"] for r in world.rows("shared")]
    split = world.inputs[OTHER_JOB].offset
    for job, offset in ((JOB, 0), (OTHER_JOB, split)):
        ids = [i for i in shared if (i >= split) == (job == OTHER_JOB)]
        if prefix_length(ids, offset) is None:
            raise Violation(
                f"the shared table holds no prefix of job {job!r}'s input: "
                f"{describe_ids(ids, offset)}"
            )


def output_is_exact(world: World) -> None:
    """Invariant 1 at the end: every event of the input exactly once, in every table."""
    count = world.inputs[JOB].count
    ledger = [r["id"] for r in world.rows("ledger")]
    if sorted(ledger) != list(range(count)):
        raise Violation(f"ledger after the last run is not the input: {describe_ids(ledger)}")
    last = {r["key"]: r["value"] for r in world.rows("last")}
    if last != last_of_prefix(count):
        raise Violation(f"last after the last run: {sorted(last.items())}")
    if world.shared_table:
        split = world.inputs[OTHER_JOB].offset
        shared = [r["id"] for r in world.rows("shared")]
        ours = sorted(i for i in shared if i < split)
        if ours != list(range(count)):
            raise Violation(f"shared after the last run, job {JOB!r}: {describe_ids(ours)}")
        theirs = sorted(i for i in shared if i >= split)
        if theirs != list(range(split, split + world.inputs[OTHER_JOB].count)):
            raise Violation(
                f"shared after the last run, job {OTHER_JOB!r}: {describe_ids(theirs, split)}"
            )


def tables_reference_only_existing_files(
    world: World, versions: dict[str, int] | None = None
) -> None:
    """No table version a reader can read names a file that is gone."""
    from deltalake import DeltaTable

    for sink in ("ledger", "last", "shared"):
        path = world.table_path(sink)
        if not (path / "_delta_log").exists():
            continue
        version = None if versions is None else versions.get(sink)
        table = DeltaTable(str(path), version=version)
        missing = [f for f in table.file_uris() if not Path(f.removeprefix("file://")).exists()]
        if missing:
            at = "latest" if version is None else f"version {version}"
            raise Violation(
                f"table {sink} ({at}) references {len(missing)} missing files: {missing[:3]}"
            )


def savepoints_are_whole(world: World, layout: LineageLayout) -> None:
    """Invariant 5: a complete savepoint keeps its files and every table version it names."""
    store = layout.root.store()
    for entry in SavepointRegistry(store, layout).read().savepoints:
        if entry.state != "complete":
            continue
        manifest = SavepointPlace(store, layout.savepoint(entry.id)).read()
        if manifest is None:
            raise Violation(f"savepoint {entry.id} is complete in the registry but has no manifest")
        for file in manifest.files:
            key = SavepointPlace(store, layout.savepoint(entry.id)).file_key(manifest, file)
            if not store.exists(key):
                raise Violation(f"savepoint {entry.id} lost its file {file.path}")
        versions = {name: t.version for name, t in manifest.tables.items() if t.version is not None}
        try:
            tables_reference_only_existing_files(world, versions)
        except Violation as violation:
            raise Violation(f"savepoint {entry.id}: {violation}") from None


class IndexWatch:
    """Invariant 5 for externalized checkpoints: retention keeps whole, distinct checkpoints,
    and never drops the last one once there was one."""

    def __init__(self) -> None:
        self.seen_any = False
        self.rollback: dict | None = None

    def check(self, layout: LineageLayout) -> None:
        store = layout.root.store()
        rollback = store.read_json(layout.rollback)
        # A rollback forgets the checkpoints after its savepoint; until its start from the
        # savepoint made that the latest checkpoint (and cleared the rewind-pending record)
        # the index may be empty: a restart then redoes the rollback, never reads it.
        in_rollback = store.read_json(layout.rewind_pending) is not None
        if rollback != self.rollback or in_rollback:
            self.rollback, self.seen_any = rollback, False
        index = read_index(store, layout)
        ids = index.ids
        if len(ids) != len(set(ids)):
            raise Violation(f"the checkpoint index lists a checkpoint twice: {ids}")
        if self.seen_any and not ids:
            raise Violation("retention dropped every externalized checkpoint")
        self.seen_any = self.seen_any or bool(ids)
        for checkpoint_id in ids:
            manifest = read_manifest(store, layout, checkpoint_id)
            if manifest is None:
                raise Violation(f"indexed checkpoint {checkpoint_id} has no manifest")
            gone = [f.key for f in manifest.files if not store.exists(f.key)]
            if gone:
                raise Violation(f"indexed checkpoint {checkpoint_id} lost files {gone[:3]}")


def every_version_is_whole(world: World) -> None:
    """Invariant 5 for time travel: every version still in a table's log reads whole."""
    from deltalake import DeltaTable

    for sink in ("ledger", "last", "shared"):
        path = world.table_path(sink)
        if not (path / "_delta_log").exists():
            continue
        for version in range(DeltaTable(str(path)).version() + 1):
            try:
                DeltaTable(str(path), version=version)
            except Exception:  # noqa: BLE001 - expired below the log's floor: not readable
                continue
            tables_reference_only_existing_files(world, {sink: version})
