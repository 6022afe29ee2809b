"""The storage side of taking a savepoint, in the order that makes each crash safe.

1. `register`: the registry gets a `pending` entry (nothing else exists yet);
2. `pinned` / `self_contained` / `canonical_files`: the data is made durable: the
   checkpoint is pinned in the checkpoint store (uploaded once if checkpoints are not
   externalized), or its files are copied into the savepoint's folder;
3. `complete`: the manifest is written (the savepoint's commit point), then the entry
   marked complete. A crash before it leaves a pending entry, which the runner removes
   at once (`abandon`) or the next owner sweeps (snapshots/savepoint_disposal.py).

Every step is the owner's: it passes the fence and the registry refuses older epochs.
The runtime (runtime/savepointing.py) decides *when* (at a batch boundary) and *what*
(checkpoint N, its Spark metadata); this module only stores it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamkeeper.errors import FencedError, SavepointError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots import savepoint_points
from streamkeeper.snapshots.externalized import (
    CheckpointUploader,
    ExternalizedCheckpoints,
    pin_checkpoint,
    stored_checkpoint,
)
from streamkeeper.snapshots.manifest import CheckpointFile, scan_checkpoint
from streamkeeper.snapshots.savepoint_capture import (
    SelfContainedCopy,
    in_savepoint,
    savepoint_view,
    source_log_offsets,
)
from streamkeeper.snapshots.savepoint_disposal import apply_savepoint_retention, delete_savepoint
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest
from streamkeeper.snapshots.savepoints import Registry, SavepointEntry, SavepointRegistry
from streamkeeper.storage import ObjectStore

log = logging.getLogger(__name__)


class SavepointWriter:
    """Stores savepoints of one lineage for the runner of `epoch`."""

    def __init__(
        self,
        store: ObjectStore,
        layout: LineageLayout,
        directory: Path,
        *,
        epoch: int,
        guard: Callable[[], None],
        checkpoints: ExternalizedCheckpoints | None = None,
    ) -> None:
        """
        Args:
            directory: the local Spark checkpoint directory.
            guard: the fence check, called before each side effect.
            checkpoints: the externalized checkpoints, if the job has them; else a
                pinned savepoint uploads its checkpoint itself.
        """
        self.store = store
        self.layout = layout
        self.directory = directory
        self.epoch = epoch
        self.guard = guard
        self.checkpoints = checkpoints
        self.registry = SavepointRegistry(store, layout)
        self._uploader: CheckpointUploader | None = None

    def register(self, entry: SavepointEntry) -> None:
        self.guard()
        self.registry.update(lambda registry: registry.savepoints.append(entry), self.epoch)
        savepoint_points.reached("savepoint_after_register")

    def pinned(self, savepoint_id: str, seq: int, batch_id: int) -> list[CheckpointFile]:
        """Pin checkpoint `seq` (batch N) for the savepoint; returns the files it captures."""
        self.guard()
        if self.checkpoints is not None:
            base = self.checkpoints.pin_for_savepoint(savepoint_id, seq, batch_id)
        else:
            uploader = self._own_uploader()
            base = stored_checkpoint(uploader, seq, batch_id, self.guard)
            pin_checkpoint(uploader, savepoint_id, seq)
            uploader.discard_all()  # not externalized: keep only what savepoints pin
        savepoint_points.reached("savepoint_after_pin")
        return savepoint_view(base.files, batch_id, source_log_offsets(self.directory, batch_id))

    def self_contained(self, savepoint_id: str, seq: int, batch_id: int) -> list[CheckpointFile]:
        """Copy checkpoint N's files into the savepoint's folder; returns their entries.

        From the checkpoint store when it holds them (server-side on S3), else from the
        local directory.
        """
        copier = SelfContainedCopy(self.store, self.directory, self.layout.savepoint(savepoint_id))
        base = None if self.checkpoints is None else self.checkpoints.stored(seq, batch_id)
        source_logs = source_log_offsets(self.directory, batch_id)
        self.guard()
        if base is not None:
            files = copier.copy(savepoint_view(base.files, batch_id, source_logs), [])
        else:
            local = [
                f
                for f in scan_checkpoint(self.directory)
                if in_savepoint(f.path, batch_id, source_logs)
            ]
            files = copier.copy([], local)
        savepoint_points.reached("savepoint_after_pin")
        return files

    def complete(self, manifest: SavepointManifest) -> None:
        """Write the manifest (the commit point), then mark the entry complete."""
        savepoint_points.reached("savepoint_before_manifest")
        manifest.ended_at = manifest.ended_at or time.time()
        self.guard()
        self.store.write_json(self.layout.savepoint_manifest(manifest.id), manifest.to_json())
        savepoint_points.reached("savepoint_after_manifest")
        self.registry.update(_completed(manifest), self.epoch)
        savepoint_points.reached("savepoint_after_complete")

    def abandon(self, savepoint_id: str) -> None:
        """A savepoint that failed: remove what it left now (the sweep does otherwise)."""
        try:
            self.guard()
            delete_savepoint(
                self.store, self.layout, savepoint_id, epoch=self.epoch, abandoned=True
            )
        except Exception:  # noqa: BLE001 - the savepoint's own error is the one to report
            log.warning("could not remove failed savepoint %s", savepoint_id, exc_info=True)

    def retention(self, retained: int | None, max_age: float | None) -> list[str]:
        """Savepoint retention after a savepoint: garbage collection, never a failure."""
        try:
            self.guard()
            return apply_savepoint_retention(
                self.store, self.layout, retained=retained, max_age=max_age, epoch=self.epoch
            )
        except FencedError:
            raise
        except Exception:  # noqa: BLE001 - retried after the next savepoint
            log.warning("savepoint retention failed; retried next time", exc_info=True)
            return []

    def _own_uploader(self) -> CheckpointUploader:
        if self._uploader is None:
            self._uploader = CheckpointUploader(
                self.store, self.layout, self.directory, epoch=self.epoch
            )
        return self._uploader


def _completed(manifest: SavepointManifest) -> Callable[[Registry], Any]:
    def mark(registry: Registry) -> None:
        found = registry.find(manifest.id)
        if found is None:
            raise SavepointError(f"savepoint {manifest.id!r} vanished from the registry")
        found.state = "complete"
        found.completed_at = manifest.ended_at
        found.seq, found.batch_id = manifest.seq, manifest.batch_id
        found.checkpoint_id, found.size = manifest.checkpoint_id, manifest.size

    return mark
