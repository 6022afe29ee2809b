"""Retention of externalized checkpoints: keep the last K, never delete a referenced file.

Files are shared between checkpoints (an immutable Spark file is uploaded once), so a
file object is deleted only when no retained manifest lists it, and only after the
manifests that listed it are gone. A crash anywhere leaves at worst unreferenced
files, which the next `apply_retention` removes; never a manifest with a missing file.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.manifest import checkpoint_ids, read_manifest
from streamkeeper.storage import ObjectStore

log = logging.getLogger(__name__)


@dataclass
class RetentionReport:
    """What one retention pass kept and removed."""

    retained: list[int] = field(default_factory=list)
    manifests_deleted: list[int] = field(default_factory=list)
    files_deleted: list[str] = field(default_factory=list)


def apply_retention(store: ObjectStore, layout: LineageLayout, retained: int) -> RetentionReport:
    """Keep the newest `retained` checkpoints; delete older manifests, then orphaned files.

    Must not run while an upload of the same lineage is in flight: the files of a
    checkpoint whose manifest is not written yet are unreferenced by definition. The
    coordinator runs uploads and retention on one thread, one after the other.

    Args:
        store: the storage root's object store.
        layout: the lineage's keys.
        retained: how many checkpoints to keep (spec.checkpoint.externalized.retained).
    """
    if retained < 1:
        raise ValueError(f"retained={retained!r}: keep at least 1 checkpoint")
    ids = checkpoint_ids(store, layout)
    keep, drop = ids[-retained:], ids[:-retained]
    # Manifests first: once a manifest is gone nothing can restore from it, so its files
    # may go; the other order could leave a manifest naming a deleted file.
    store.delete([layout.checkpoint_manifest(i) for i in drop])
    referenced: set[str] = set()
    for checkpoint_id in keep:
        manifest = read_manifest(store, layout, checkpoint_id)
        if manifest is not None:
            referenced |= manifest.keys
    garbage = [k for k in store.list(layout.checkpoint_files) if k not in referenced]
    store.delete(garbage)
    if drop or garbage:
        log.info(
            "checkpoint retention: kept %s, deleted checkpoints %s and %d files",
            keep,
            drop,
            len(garbage),
        )
    return RetentionReport(retained=keep, manifests_deleted=drop, files_deleted=garbage)


def discard_all(store: ObjectStore, layout: LineageLayout) -> RetentionReport:
    """Delete every externalized checkpoint of the lineage (DELETE_ON_CANCELLATION)."""
    ids = checkpoint_ids(store, layout)
    store.delete([layout.checkpoint_manifest(i) for i in ids])
    files = store.list(layout.checkpoint_files)
    store.delete(files)
    log.info("discarded %d externalized checkpoints (%d files)", len(ids), len(files))
    return RetentionReport(manifests_deleted=ids, files_deleted=files)
