"""Disposing of WAL manifests that will never be committed: their files, then the manifest.

Used by recovery (a new owner resolving what older runners left) and by a rollback
(which disposes of every manifest of the epochs it rolls back). Files are found through
manifests only: each batch's folder `sk-{lineage}/{seq}/` in each append table, and the
WAL's staging folder of the seq. A file is never deleted while some version of its table
references it: a table version that holds a seq holds that seq's files, and versions stay
readable after a rollback's RESTORE (time travel, savepoints taken in the rolled-back
era), so those files stay with them.

A claim (`writing`) whose files are swept is first made *void* by compare-and-swap: the
runner that claimed it, if it still runs, can then never seal it over files that are gone
(its seal is refused, and it stops).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from streamkeeper.commit.tables import TableTarget
from streamkeeper.commit.wal import Manifest, SinkBatch, WriteAheadLog
from streamkeeper.lineage.control import ControlPlane, pid_meaningful, process_alive_here
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import Location, ObjectStore
from streamkeeper.storage.confine import confined_uri

log = logging.getLogger(__name__)

# A claim of a runner on another host is forgotten after this long (its batch is long over).
FORGET_FOREIGN_CLAIMS_AFTER = 3600.0


@dataclass
class Disposed:
    """What a disposal did, for recovery's report and the rollback's record."""

    discarded: list[int] = field(default_factory=list)
    kept_for_replay: list[int] = field(default_factory=list)
    swept_claims: list[int] = field(default_factory=list)
    files_removed: list[str] = field(default_factory=list)


def sweep_precommit_folder(
    target: TableTarget, layout: LineageLayout, seq: int, keep: set[str]
) -> list[str]:
    """Delete the files of batch `seq`'s folder in a table, except those named in `keep`."""
    folder = target.location.child(layout.precommit_dir(seq))
    store = folder.store()
    doomed = [key for key in store.list("") if key.rsplit("/", 1)[-1] not in keep]
    store.delete(doomed)
    return [f"{folder.uri}/{key}" for key in doomed]


def referenced_now(target: TableTarget, layout: LineageLayout, seq: int) -> set[str]:
    """Names of the files in batch `seq`'s folder that the table's latest version references."""
    import pyarrow as pa

    prefix = layout.precommit_dir(seq) + "/"
    paths = pa.table(target.open().get_add_actions(flatten=True)).column("path").to_pylist()
    return {path.rsplit("/", 1)[-1] for path in paths if path.startswith(prefix)}


def sweep_unheld(target: TableTarget, layout: LineageLayout, seq: int) -> list[str]:
    """Delete an unsealed claim's files in a table, except those its latest version holds.

    A stale runner can claim a seq whose manifest another runner committed and retired:
    the folder then holds that commit's files, which stay.
    """
    keep = referenced_now(target, layout, seq) if target.exists() else set()
    return sweep_precommit_folder(target, layout, seq, keep)


def committed_in_history(target: TableTarget, seq: int) -> bool:
    """Whether a version still in the table's log was committed as this lineage's `seq`.

    Versions below the log's floor are unreadable, so their files are not needed by them.
    """
    wanted = {"streamkeeper.seq": str(seq), "streamkeeper.lineage": target.lineage}
    return any(all(c.get(k) == v for k, v in wanted.items()) for c in target.open().history())


class ManifestDisposal:
    """Disposes of one lineage's manifests, as the owner of `control`'s newest epoch."""

    def __init__(
        self,
        store: ObjectStore,
        layout: LineageLayout,
        wal: WriteAheadLog,
        targets: dict[str, TableTarget],
    ) -> None:
        self.store = store
        self.layout = layout
        self.wal = wal
        self.targets = targets

    def sweep_claim(
        self, claim: Manifest, control: ControlPlane, epoch: int, done: Disposed
    ) -> bool:
        """Void an unsealed batch's claim, delete what it wrote; forget it once its runner
        is gone (a runner still alive may write more files, which the next sweep finds).

        Returns:
            False if the claim changed under us (its runner sealed it): not swept.
        """
        targets = {name: self._target(name, part, claim.seq) for name, part in claim.sinks.items()}
        if claim.state == "writing" and not self.wal.void(claim, epoch):
            return False
        for name, part in claim.sinks.items():
            target = targets[name]
            if part.output == "append":
                done.files_removed += sweep_unheld(target, self.layout, claim.seq)
        self.store.delete(self.store.list(self.layout.staging_prefix(claim.seq)))
        done.swept_claims.append(claim.seq)
        if claimant_gone(control, claim):
            self.store.delete([self.layout.manifest(claim.seq)])
        return True

    def discard(self, manifest: Manifest, *, obsolete: bool, done: Disposed) -> bool:
        """Drop what an uncommittable batch wrote; files a table version holds stay.

        Args:
            obsolete: at or below the lineage's head (or of a rolled-back epoch): never
                committed again, not even by an idempotent sink's replay.

        Returns:
            True if in-batch (idempotent) commits keep the manifest for the replay.
        """
        kept: dict[str, SinkBatch] = {}
        targets = {n: self._target(n, part, manifest.seq) for n, part in manifest.sinks.items()}
        for name, part in manifest.sinks.items():
            target = targets[name]
            at_or_past = target.exists() and target.committed_seq() >= manifest.seq
            if part.mode == "idempotent" and at_or_past and not obsolete:
                kept[name] = part
            elif part.output == "append":
                keep = self._held_files(target, manifest, part) if at_or_past else set()
                done.files_removed += sweep_precommit_folder(
                    target, self.layout, manifest.seq, keep
                )
        if kept:
            manifest.sinks = kept
            self.wal.write(manifest)
            done.kept_for_replay.append(manifest.seq)
            return True
        self.wal.retire(manifest.seq)
        done.discarded.append(manifest.seq)
        return False

    def _target(self, name: str, part: SinkBatch, manifest_seq: int) -> TableTarget:
        """The sink's table; one the current spec lacks (a green's new sink, rolled
        back) is found by the URI its manifest recorded."""
        if name in self.targets:
            return self.targets[name]
        # Read from storage, and this deletes files below it: a sink's table always lies
        # below the root (`resolve_paths`), so a manifest naming one elsewhere is refused.
        uri = confined_uri(
            self.layout.root.uri,
            part.table,
            what=f"sink {name!r}'s table",
            source=f"WAL manifest {manifest_seq}",
        )
        location = Location(uri, self.layout.root.s3)
        return TableTarget(
            name, location, self.layout.data_app_id(name), self.layout.fence_app_id()
        )

    def _held_files(self, target: TableTarget, manifest: Manifest, part: SinkBatch) -> set[str]:
        """The batch's files some version of the table references.

        A table past the seq does not make the seq's files its own: a fenced runner can
        seal a seq its successor skipped (the claim was still held) and committed above.
        Only a version committed as this seq holds them (the latest, or one a rollback
        restored past: its history is still read).
        """
        held = referenced_now(target, self.layout, manifest.seq)
        if not held and committed_in_history(target, manifest.seq):
            held = {f.path.rsplit("/", 1)[-1] for f in part.files}
        return held


def claimant_gone(control: ControlPlane, claim: Manifest) -> bool:
    """Whether the runner that wrote a manifest is gone (dead in this pid namespace, or
    long ago elsewhere)."""
    record = control.epoch_record(claim.epoch) or {}
    if pid_meaningful(record):
        return not process_alive_here(record)
    return time.time() - claim.created_at > FORGET_FOREIGN_CLAIMS_AFTER
