"""Recovery: reconcile the WAL with Spark's commit log before the query starts.

Runs on every start, by the new owner only (every step passes the fence), after the
target tables were fenced with its epoch. It walks the pending manifests in seq order:

- A manifest at or below the lineage's head (its last committed seq) is obsolete: the
  lineage commits in seq order, so it can never be committed. Discarded.
- A manifest still `writing` was claimed by a batch that never sealed it (a crash, or
  a runner fenced mid-batch): the files in its batch folders are swept. The claim itself
  is forgotten once its runner is gone; a fenced runner still alive may write more.
- A complete manifest is committed if the checkpoint vouches for it: the same Spark
  query, batch N completed, `offsets/N` the same as when the manifest was written (two
  runners restored from one checkpoint can plan a different batch N), and no newer
  epoch wrote another manifest for that batch. Otherwise it is discarded; parts an
  in-batch (idempotent) sink already committed are kept, so the replayed batch reuses
  the seq and the table skips it.

Files are found through manifests only (each batch's folder `sk-{lineage}/{seq}/` in
each table, and `wal/staging/{seq}/`); no table folder is ever listed in full.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass, field

from streamkeeper.commit import crashpoints
from streamkeeper.commit.coordinator import CommitCoordinator
from streamkeeper.commit.sequence import CommitSequence
from streamkeeper.commit.tables import TableTarget
from streamkeeper.commit.wal import Manifest, SinkBatch
from streamkeeper.lineage.control import ControlPlane
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint

log = logging.getLogger(__name__)

# A claim of a runner on another host is forgotten after this long (its batch is long over).
FORGET_FOREIGN_CLAIMS_AFTER = 3600.0


@dataclass
class RecoveryReport:
    """What recovery did, for logs and tests."""

    committed: list[int] = field(default_factory=list)
    discarded: list[int] = field(default_factory=list)
    kept_for_replay: list[int] = field(default_factory=list)
    swept_claims: list[int] = field(default_factory=list)
    files_removed: list[str] = field(default_factory=list)


def _checkpoint_of(manifest: Manifest, current: SparkCheckpoint) -> SparkCheckpoint | None:
    """The checkpoint that can vouch for a manifest's batch, if it still exists."""
    for candidate in (current, SparkCheckpoint(manifest.checkpoint_dir)):
        if candidate.belongs_to(manifest.query_id):
            return candidate
    return None


def _vouched(
    manifest: Manifest, checkpoint: SparkCheckpoint, coordinator: CommitCoordinator
) -> bool:
    if any(
        part.mode == "exactly_once" and coordinator.targets[name].committed_seq() >= manifest.seq
        for name, part in manifest.sinks.items()
        if name in coordinator.targets
    ):
        return True  # a table committed it, which happens only once its batch completed
    owner = _checkpoint_of(manifest, checkpoint)
    if owner is None:
        log.warning(
            "manifest %s belongs to checkpoint %s (query %s), which no longer exists; its "
            "batch cannot be shown complete, so it is discarded",
            manifest.seq,
            manifest.checkpoint_dir,
            manifest.query_id,
        )
        return False
    if not owner.is_complete(manifest.batch_id):
        return False
    planned = owner.offsets_sha256(manifest.batch_id)  # None: purged with its commit entry
    return planned is None or manifest.offsets_sha256 in (None, planned)


def _newest_per_batch(manifests: list[Manifest]) -> set[int]:
    """Seqs of the manifests that are the newest epoch's for their (query, batch)."""
    newest: dict[tuple[str, int], Manifest] = {}
    for manifest in manifests:
        key = (manifest.query_id, manifest.batch_id)
        if key not in newest or (manifest.epoch, manifest.seq) > (
            newest[key].epoch,
            newest[key].seq,
        ):
            newest[key] = manifest
    return {m.seq for m in newest.values()}


def recover(
    coordinator: CommitCoordinator,
    checkpoint: SparkCheckpoint,
    sequence: CommitSequence,
    control: ControlPlane,
) -> RecoveryReport:
    """Resolve every pending manifest (see the module docstring)."""
    fence = coordinator.fence
    fence.check()
    report = RecoveryReport()
    pending = coordinator.wal.pending()
    complete = [m for m in pending if m.complete]
    candidates = _newest_per_batch(complete)
    for manifest in pending:
        fence.check()
        if not manifest.complete:
            _sweep_claim(coordinator, control, manifest, report)
        elif (
            manifest.seq > coordinator.stats.last_seq
            and manifest.seq in candidates
            and _vouched(manifest, checkpoint, coordinator)
        ):
            coordinator.commit_manifest(manifest, batch_end=None)
            report.committed.append(manifest.seq)
            crashpoints.reached("recovery_after_commit")
        elif _discard(coordinator, manifest, report):
            sequence.reserve_existing(manifest.query_id, manifest.batch_id, manifest.seq)
            report.kept_for_replay.append(manifest.seq)
        else:
            report.discarded.append(manifest.seq)
    crashpoints.reached("recovery_before_cleanup")
    return report


def _sweep_claim(
    coordinator: CommitCoordinator, control: ControlPlane, claim: Manifest, report: RecoveryReport
) -> None:
    """Delete what an unsealed batch wrote; forget the claim once its runner is gone."""
    for name, part in claim.sinks.items():
        target = coordinator.targets.get(name)
        if target is not None and part.output == "append":
            report.files_removed += sweep_precommit_folder(
                target, coordinator.layout, claim.seq, keep=set()
            )
    store = coordinator.store
    store.delete(store.list(coordinator.layout.staging_prefix(claim.seq)))
    report.swept_claims.append(claim.seq)
    if _claimant_gone(control, claim):
        store.delete([coordinator.layout.manifest(claim.seq)])


def _claimant_gone(control: ControlPlane, claim: Manifest) -> bool:
    from streamkeeper.lineage.control import _pid_alive

    record = control.epoch_record(claim.epoch) or {}
    if record.get("host") == socket.gethostname():
        return not _pid_alive(record)
    return time.time() - claim.created_at > FORGET_FOREIGN_CLAIMS_AFTER


def _discard(coordinator: CommitCoordinator, manifest: Manifest, report: RecoveryReport) -> bool:
    """Drop what an uncommittable batch wrote. Returns True if in-batch commits keep it."""
    kept: dict[str, SinkBatch] = {}
    obsolete = manifest.seq <= coordinator.stats.last_seq
    for name, part in manifest.sinks.items():
        target = coordinator.targets.get(name)
        committed = target is not None and target.committed_seq() >= manifest.seq
        if part.mode == "idempotent" and committed and not obsolete:
            kept[name] = part
        elif target is not None and part.output == "append":
            # Files the table references stay (a table never loses data); the rest go.
            # The table being past this seq does not mean this seq's files are in it: a
            # fenced runner may seal a seq its successor skipped (and committed above).
            keep = _referenced(target, coordinator.layout, manifest.seq) if committed else set()
            report.files_removed += sweep_precommit_folder(
                target, coordinator.layout, manifest.seq, keep
            )
    if kept:
        manifest.sinks = kept
        coordinator.wal.write(manifest)
        return True
    coordinator.wal.retire(manifest.seq)
    return False


def _referenced(target: TableTarget, layout: LineageLayout, seq: int) -> set[str]:
    """Names of the files in batch `seq`'s folder that the table's snapshot references."""
    import pyarrow as pa

    prefix = layout.precommit_dir(seq) + "/"
    paths = pa.table(target.open().get_add_actions(flatten=True)).column("path").to_pylist()
    return {path.rsplit("/", 1)[-1] for path in paths if path.startswith(prefix)}


def sweep_precommit_folder(
    target: TableTarget, layout: LineageLayout, seq: int, keep: set[str]
) -> list[str]:
    """Delete the files of batch `seq`'s folder in a table, except those named in `keep`."""
    folder = target.location.child(layout.precommit_dir(seq))
    store = folder.store()
    doomed = [key for key in store.list("") if key.rsplit("/", 1)[-1] not in keep]
    store.delete(doomed)
    return [f"{folder.uri}/{key}" for key in doomed]
