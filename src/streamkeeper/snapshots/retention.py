"""Retention of externalized checkpoints: keep the last K, never delete a referenced file.

Files are shared between checkpoints (an immutable Spark file is uploaded once), so a
file is deleted only when no retained checkpoint lists it, and only after the index
(compare-and-swap, see snapshots/index.py) stopped listing the checkpoints that did. A
checkpoint a savepoint pins is never dropped. A crash anywhere leaves at worst
unreferenced objects, which the next owner's `sweep` removes; never an indexed
checkpoint with a missing file. No listing happens per checkpoint: what each retained
checkpoint references is known from its manifest, read once.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from streamkeeper.lineage.layout import LineageLayout, seq_of
from streamkeeper.snapshots.index import CheckpointIndex, IndexWriter, unique_entries
from streamkeeper.snapshots.manifest import read_manifest
from streamkeeper.storage import ObjectStore
from streamkeeper.storage.confine import confined_key

log = logging.getLogger(__name__)

KeysOf = Callable[[int], set[str]]
_EPOCH_SUFFIX = re.compile(r"\.e(\d+)$")


@dataclass
class RetentionReport:
    """What one retention pass kept and removed."""

    retained: list[int] = field(default_factory=list)
    manifests_deleted: list[int] = field(default_factory=list)
    files_deleted: list[str] = field(default_factory=list)


class ManifestKeys:
    """The storage keys each checkpoint references, read from its manifest once."""

    def __init__(self, store: ObjectStore, layout: LineageLayout) -> None:
        self.store = store
        self.layout = layout
        self._keys: dict[int, set[str]] = {}

    def remember(self, checkpoint_id: int, keys: set[str]) -> None:
        self._keys[checkpoint_id] = keys

    def forget(self, checkpoint_id: int) -> None:
        self._keys.pop(checkpoint_id, None)

    def __call__(self, checkpoint_id: int) -> set[str]:
        if checkpoint_id not in self._keys:
            manifest = read_manifest(self.store, self.layout, checkpoint_id)
            self._keys[checkpoint_id] = set() if manifest is None else manifest.keys
        return self._keys[checkpoint_id]


def _referenced(index: CheckpointIndex, keys_of: KeysOf) -> set[str]:
    return set().union(*(keys_of(i) for i in index.ids)) if index.ids else set()


def _drop(
    writer: IndexWriter, before: CheckpointIndex, after: CheckpointIndex, keys_of: KeysOf
) -> RetentionReport:
    """Delete what the index stopped referencing (it was already stored without it)."""
    dropped = [i for i in before.ids if i not in after.ids]
    garbage = set().union(*(keys_of(i) for i in dropped)) if dropped else set()
    garbage -= _referenced(after, keys_of)
    store, layout = writer.store, writer.layout
    for key in garbage:  # every delete stays in the checkpoint store (read_manifest checked)
        confined_key(layout.checkpoint_files, key, what="file key", source="a dropped checkpoint")
    # Manifests first: once a manifest is gone nothing can restore from it.
    store.delete([layout.checkpoint_manifest(i) for i in dropped])
    store.delete(sorted(garbage))
    if isinstance(keys_of, ManifestKeys):
        for checkpoint_id in dropped:
            keys_of.forget(checkpoint_id)
    if dropped:
        log.info(
            "checkpoint retention: kept %s, deleted checkpoints %s and %d files",
            after.ids,
            dropped,
            len(garbage),
        )
    return RetentionReport(after.ids, dropped, sorted(garbage))


def apply_retention(writer: IndexWriter, retained: int, keys_of: KeysOf) -> RetentionReport:
    """Keep the newest `retained` checkpoints (and every pinned one); delete the rest.

    Raises:
        FencedError: a newer runner owns the index (nothing is deleted).
    """
    if retained < 1:
        raise ValueError(f"retained={retained!r}: keep at least 1 checkpoint")
    before = writer.read()

    def keep_newest(index: CheckpointIndex) -> None:
        # By distinct id: an index written before entries were unique may repeat one.
        pinned = set(index.pins.values())
        unpinned = sorted({e.id for e in index.checkpoints} - pinned)
        drop = set(unpinned[:-retained])
        index.checkpoints = unique_entries(e for e in index.checkpoints if e.id not in drop)

    after = writer.update(keep_newest)
    return _drop(writer, before, after, keys_of)


def forget_checkpoints_after(
    store: ObjectStore, layout: LineageLayout, epoch: int, seq: int
) -> RetentionReport:
    """A rollback to the savepoint at `seq`: the checkpoints after it leave the index (and
    their files no other checkpoint references go), unless a savepoint pins them. The
    latest externalized checkpoint is then of the savepoint's era again: a restore of it
    never resumes the state the rollback took back.

    Raises:
        FencedError: a newer runner owns the index (nothing is deleted).
    """
    writer = IndexWriter(store, layout, epoch)
    before = writer.read()

    def keep_up_to(index: CheckpointIndex) -> None:
        pinned = set(index.pins.values())
        index.checkpoints = [e for e in index.checkpoints if e.id <= seq or e.id in pinned]

    after = writer.update(keep_up_to)
    return _drop(writer, before, after, ManifestKeys(store, layout))


def discard_all(writer: IndexWriter, keys_of: KeysOf) -> RetentionReport:
    """Delete every checkpoint no savepoint pins (DELETE_ON_CANCELLATION).

    Raises:
        FencedError: a newer runner owns the index (nothing is deleted).
    """
    before = writer.read()

    def drop_unpinned(index: CheckpointIndex) -> None:
        pinned = set(index.pins.values())
        index.checkpoints = [e for e in index.checkpoints if e.id in pinned]

    after = writer.update(drop_unpinned)
    return _drop(writer, before, after, keys_of)


def _uploaded_by_older_epoch(key: str, epoch: int) -> bool:
    match = _EPOCH_SUFFIX.search(key)
    return match is None or int(match.group(1)) < epoch


def sweep(writer: IndexWriter, keys_of: KeysOf) -> list[str]:
    """Delete leftovers of crashed uploads: manifests and files no indexed checkpoint has.

    Run by a new owner at start (after taking the index over), the one listing of the
    checkpoint store per start. Files uploaded by this or a newer epoch are never touched.
    """
    index = writer.read()
    store, layout = writer.store, writer.layout
    stray_manifests = [
        key
        for key in store.list(layout.checkpoint_manifests)
        if key.endswith(".json") and seq_of(key) not in index.ids
    ]
    referenced = _referenced(index, keys_of)
    stray_files = [
        key
        for key in store.list(layout.checkpoint_files)
        if key not in referenced and _uploaded_by_older_epoch(key, writer.epoch)
    ]
    store.delete(stray_manifests)
    store.delete(stray_files)
    if stray_manifests or stray_files:
        log.info(
            "swept %d unindexed checkpoint manifests and %d unreferenced files",
            len(stray_manifests),
            len(stray_files),
        )
    return stray_manifests + stray_files
