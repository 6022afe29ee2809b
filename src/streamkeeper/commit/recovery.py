"""Recovery: reconcile the WAL with Spark's commit log before the query starts.

Runs on every start, by the new owner only (every step passes the fence), after the
target tables were fenced with its epoch. It walks the pending manifests in seq order:

- A manifest at or below the lineage's head (its last committed seq) is obsolete: the
  lineage commits in seq order, so it can never be committed. Discarded.
- A manifest still `writing` was claimed by a batch that never sealed it (a crash, or
  a runner fenced mid-batch): it is made void (compare-and-swap, so its runner can no
  longer seal it), then the files in its batch folders are swept. The claim itself is
  forgotten once its runner is gone; a fenced runner still alive may write more.
- A manifest of an epoch older than the lineage's latest rollback is never committed.
- A complete manifest is committed if the checkpoint vouches for it: the same Spark
  query, batch N completed, `offsets/N` the same as when the manifest was written (two
  runners restored from one checkpoint can plan a different batch N), and no newer
  epoch wrote another manifest for that batch. Otherwise it is discarded; parts an
  in-batch (idempotent) sink already committed are kept, so the replayed batch reuses
  the seq and the table skips it.
- Unless its batch may still complete: a complete manifest whose batch Spark has not
  completed, whose `offsets/N` still matches, whose runner may still be alive (a fenced
  runner keeps running until it notices) is left pending. Spark writes `commits/N`
  after the batch function returns, outside any fence: discarding the manifest while
  its runner can still write `commits/N` loses the batch (Spark then never runs it
  again). Left pending, it is committed by the next start if its batch completes, or
  becomes obsolete once this runner replays the batch under a higher seq.

Files are found through manifests only, and a file some table version holds is never
deleted (commit/disposal.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from streamkeeper.commit import crashpoints
from streamkeeper.commit.coordinator import CommitCoordinator, CommitStats
from streamkeeper.commit.disposal import Disposed, ManifestDisposal, claimant_gone
from streamkeeper.commit.sequence import CommitSequence
from streamkeeper.commit.wal import Manifest
from streamkeeper.lineage.control import ControlPlane
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport(Disposed):
    """What recovery did, for logs and tests: what it committed, and what it disposed of."""

    committed: list[int] = field(default_factory=list)
    left_pending: list[int] = field(default_factory=list)  # their batch may still complete

    def add(self, done: Disposed) -> None:
        self.discarded += done.discarded
        self.kept_for_replay += done.kept_for_replay
        self.swept_claims += done.swept_claims
        self.files_removed += done.files_removed


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


def _batch_committed_since(manifest: Manifest, stats: CommitStats) -> bool:
    """Whether the lineage's head already holds this manifest's batch, committed by the
    manifest's epoch or a newer one.

    A fenced runner keeps running its batch and may seal it after the runner that fenced
    it ran and committed the same batch of the same query (both run from one checkpoint
    folder) and retired its manifest: the zombie's manifest then has the higher seq and
    Spark's log vouches for its batch, so by seq alone it would be committed a second
    time. A rewind (a start from an older savepoint or checkpoint) runs under a newer
    epoch than the head's, so its batches are never taken for done.
    """
    return (
        manifest.query_id == stats.last_query
        and manifest.batch_id <= stats.last_batch
        and manifest.epoch <= stats.last_epoch
    )


def _may_still_complete(
    manifest: Manifest, checkpoint: SparkCheckpoint, control: ControlPlane
) -> bool:
    """Whether a live runner can still complete this manifest's batch in Spark's log."""
    owner = _checkpoint_of(manifest, checkpoint)
    if owner is None or owner.is_complete(manifest.batch_id):
        return False  # gone with its machine, or completed: decided either way
    planned = owner.offsets_sha256(manifest.batch_id)
    if planned is not None and manifest.offsets_sha256 not in (None, planned):
        return False  # batch N was planned again with other offsets: never this one's
    return not claimant_gone(control, manifest)


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


def rolled_back_epoch(coordinator: CommitCoordinator) -> int:
    """The epoch of the lineage's latest rollback (0 if none): no manifest of an older
    epoch is ever committed (the rollback disposed of those it found; any other was
    written by a runner the rollback had fenced already)."""
    record = coordinator.store.read_json(coordinator.layout.rollback) or {}
    return int(record.get("epoch", 0) or 0)


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
    disposal = ManifestDisposal(
        coordinator.store, coordinator.layout, coordinator.wal, coordinator.targets
    )
    rolled_back = rolled_back_epoch(coordinator)
    pending = coordinator.wal.pending()
    complete = [m for m in pending if m.complete]
    candidates = _newest_per_batch(complete)
    for manifest in pending:
        fence.check()
        sequence.skip_past(manifest.seq)
        done = Disposed()
        if not manifest.complete and disposal.sweep_claim(manifest, control, fence.epoch, done):
            report.add(done)
            continue
        if not manifest.complete:
            sealed = coordinator.wal.read(manifest.seq)  # sealed while we looked
            if sealed is None or not sealed.complete:
                continue
            manifest = sealed
            candidates = _newest_per_batch([*complete, sealed])
        obsolete = (
            manifest.seq <= coordinator.stats.last_seq
            or manifest.epoch < rolled_back
            or _batch_committed_since(manifest, coordinator.stats)
        )
        if (
            not obsolete
            and manifest.seq in candidates
            and _vouched(manifest, checkpoint, coordinator)
        ):
            coordinator.commit_manifest(manifest, batch_end=None)
            report.committed.append(manifest.seq)
            crashpoints.reached("recovery_after_commit")
            continue
        if (
            not obsolete
            and manifest.seq in candidates
            and _may_still_complete(manifest, checkpoint, control)
        ):
            report.left_pending.append(manifest.seq)
            continue
        if disposal.discard(manifest, obsolete=obsolete, done=done):
            sequence.reserve_existing(manifest.query_id, manifest.batch_id, manifest.seq)
        report.add(done)
    crashpoints.reached("recovery_before_cleanup")
    return report
