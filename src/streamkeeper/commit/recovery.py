"""Recovery: reconcile the WAL with Spark's commit log before the query starts.

- A manifest whose batch completed (`commits/N` exists) is committed (idempotently).
- A manifest whose batch never completed is discarded: its files are deleted unless a
  table references them. Parts an in-batch (idempotent) sink already committed are
  kept, so the replayed batch reuses the same commit sequence and is skipped there.
- Files of ours that no manifest lists, whose seq the table never committed and that
  the table does not reference, are orphans of a crash and are deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from streamkeeper.commit import crashpoints
from streamkeeper.commit.coordinator import CommitCoordinator, CommitSequence
from streamkeeper.commit.tables import TableTarget
from streamkeeper.commit.wal import Manifest, SinkBatch
from streamkeeper.commit.writer import seq_of_data_file
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    """What recovery did, for logs and tests."""

    committed: list[int] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    kept_for_replay: list[int] = field(default_factory=list)
    orphans_removed: list[str] = field(default_factory=list)


def _checkpoint_of(manifest: Manifest, current: SparkCheckpoint) -> SparkCheckpoint | None:
    """The checkpoint that can vouch for a manifest's batch, if it still exists."""
    for candidate in (current, SparkCheckpoint(manifest.checkpoint_dir)):
        if candidate.belongs_to(manifest.query_id):
            return candidate
    return None


def recover(
    coordinator: CommitCoordinator, checkpoint: SparkCheckpoint, sequence: CommitSequence
) -> RecoveryReport:
    """Resolve every pending manifest, then remove orphaned files."""
    report = RecoveryReport()
    for manifest in coordinator.wal.pending():
        owner = _checkpoint_of(manifest, checkpoint)
        batch_end = owner.completed_at(manifest.batch_id) if owner else None
        if batch_end is not None:
            coordinator.commit_manifest(manifest, batch_end=None)
            report.committed.append(manifest.seq)
            crashpoints.reached("recovery_after_commit")
            continue
        if owner is None:
            log.warning(
                "manifest %s belongs to checkpoint %s (query %s), which no longer exists; "
                "its batch cannot be shown complete, so it is discarded",
                manifest.seq,
                manifest.checkpoint_dir,
                manifest.query_id,
            )
        if _discard(coordinator, manifest):
            sequence.reserve_existing(manifest.query_id, manifest.batch_id, manifest.seq)
            report.kept_for_replay.append(manifest.seq)
        else:
            report.discarded.append(manifest.seq)
    crashpoints.reached("recovery_before_cleanup")
    report.orphans_removed = remove_orphans(coordinator)
    return report


def _discard(coordinator: CommitCoordinator, manifest: Manifest) -> bool:
    """Drop what an incomplete batch wrote. Returns True if in-batch commits keep it."""
    kept: dict[str, SinkBatch] = {}
    for name, part in manifest.sinks.items():
        target = coordinator.targets[name]
        if part.mode == "idempotent" and target.committed_seq() >= manifest.seq:
            kept[name] = part
            continue
        _delete_unreferenced(target, part)
    if kept:
        manifest.sinks = kept
        coordinator.wal.write(manifest)
        return True
    coordinator.wal.retire(manifest.seq)
    return False


def _table_files(target: TableTarget) -> set[str]:
    return {Path(f).name for f in target.open().file_uris()}


def _delete_unreferenced(target: TableTarget, part: SinkBatch) -> None:
    if part.output == "merge":
        return  # staged rows live in the WAL and go with the manifest
    referenced = _table_files(target)
    filesystem = target.location.arrow_filesystem()
    for data_file in part.files:
        if data_file.path not in referenced:
            _delete(filesystem, f"{target.location.fs_path}/{data_file.path}")


def _delete(filesystem, path: str) -> None:  # noqa: ANN001 - pyarrow FileSystem
    import pyarrow.fs as pafs

    if filesystem.get_file_info(path).type != pafs.FileType.NotFound:
        filesystem.delete_file(path)


def remove_orphans(coordinator: CommitCoordinator) -> list[str]:
    """Delete our files that nothing can ever commit; never one a table references."""
    import pyarrow.fs as pafs

    pending = set(coordinator.wal.pending_seqs())
    removed: list[str] = []
    for target in coordinator.targets.values():
        filesystem = target.location.arrow_filesystem()
        selector = pafs.FileSelector(target.location.fs_path, allow_not_found=True)
        committed = target.committed_seq()
        referenced: set[str] | None = None
        for info in filesystem.get_file_info(selector):
            seq = seq_of_data_file(info.path)
            if seq is None or seq in pending or seq <= committed:
                continue
            referenced = _table_files(target) if referenced is None else referenced
            if info.base_name not in referenced:
                filesystem.delete_file(info.path)
                removed.append(info.path)
    store, layout = coordinator.store, coordinator.layout
    prefix = len(layout.staging_root) + 1
    stale = [
        key
        for key in store.list(layout.staging_root)
        if int(key[prefix:].split("/", 1)[0]) not in pending
    ]
    store.delete(stale)
    removed.extend(stale)
    return removed
