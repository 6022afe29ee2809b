"""Deleting savepoints: on request, by retention, and what a crash left half done.

Order (each step safe to crash in): the registry entry becomes `deleting` (nobody
restores it any more), the manifest goes, then every object in the savepoint's folder,
then its pin in the checkpoint index; the entry is forgotten last. A crash leaves an
entry `deleting`, which the next `delete` or the owner's sweep at start finishes. A
pinned checkpoint's files are shared with checkpoints: once unpinned, the checkpoint
index's owner drops it at its next checkpoint retention.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from streamkeeper.errors import SavepointError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots import savepoint_points
from streamkeeper.snapshots.index import CheckpointIndex
from streamkeeper.snapshots.savepoint_check import check_savepoint
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest, SavepointPlace
from streamkeeper.snapshots.savepoints import (
    SAVEPOINT_ID_PATTERN,
    Registry,
    SavepointRegistry,
    expired,
    reasons_to_keep,
    savepoints_in_use,
)
from streamkeeper.storage import ObjectStore
from streamkeeper.storage.confine import checked_name, joined_key

log = logging.getLogger(__name__)


@dataclass
class DisposalReport:
    """What a retention pass or a sweep deleted or completed."""

    deleted: list[str] = field(default_factory=list)
    completed: list[str] = field(default_factory=list)


def unpin(store: ObjectStore, layout: LineageLayout, savepoint_id: str) -> None:
    """Remove a savepoint's pin from the checkpoint index, keeping the index's owner."""
    key = layout.checkpoint_index
    while True:
        data, version = store.read_versioned(key)
        if data is None:
            return
        index = CheckpointIndex.from_json(data, f"the checkpoint index {key!r}")
        if savepoint_id not in index.pins:
            return
        del index.pins[savepoint_id]
        index.updated_at = time.time()
        if store.write_if(key, index.to_json(), version) is not None:
            return


def delete_savepoint(
    store: ObjectStore,
    layout: LineageLayout,
    savepoint_id: str,
    *,
    epoch: int | None = None,
    abandoned: bool = False,
) -> None:
    """Dispose of a savepoint's data, then forget it.

    Args:
        epoch: the owning runner's epoch (retention, sweep); None for an operator.
        abandoned: a pending entry whose runner is gone (the sweep); else a pending
            savepoint is refused.

    Raises:
        SavepointError: it is protected, held, in use or being taken (names why).
        UnknownSavepointError: no such savepoint.
        FencedError: `epoch` no longer owns the registry.
    """
    registry = SavepointRegistry(store, layout)
    entry = registry.entry(savepoint_id)
    if entry.state == "pending" and abandoned:
        keep = []  # never became a savepoint: a hold it was born with had nothing to hold
    elif entry.state != "deleting":
        keep = reasons_to_keep(entry, savepoints_in_use(store))
        if entry.state == "pending":
            keep.append("it is being taken")
    if entry.state != "deleting":
        if keep:
            raise SavepointError(
                f"savepoint {savepoint_id!r} is not deleted: {'; '.join(keep)}; "
                "unprotect or release it first, or delete another savepoint"
            )
        recheck = not (entry.state == "pending" and abandoned)
        registry.update(lambda r: _mark_deleting(r, savepoint_id, recheck), epoch)
    savepoint_points.reached("savepoint_dispose_after_mark")
    # Confined to the savepoint's own folder, whatever id reached here.
    folder = joined_key(
        layout.savepoints,
        checked_name(savepoint_id, SAVEPOINT_ID_PATTERN, **_deleted(layout)),
        what="savepoint",
        source=f"the savepoint registry {layout.savepoint_registry!r}",
    )
    store.delete([layout.savepoint_manifest(savepoint_id)])  # nothing restores from it now
    store.delete_folder(folder)  # with what a copy interrupted by a crash left
    savepoint_points.reached("savepoint_dispose_after_data")
    unpin(store, layout, savepoint_id)
    registry.update(lambda r: _forget(r, savepoint_id), epoch)
    log.info("savepoint %s of lineage %s deleted", savepoint_id, layout.lineage)


def _deleted(layout: LineageLayout) -> dict[str, str]:
    return {
        "what": "savepoint",
        "source": f"the savepoint registry {layout.savepoint_registry!r}",
        "expected": "a savepoint id (like sp-20270115T080000-1a2b3c4d)",
    }


def _set_state(registry: Registry, savepoint_id: str, state: str) -> None:
    found = registry.find(savepoint_id)
    if found is not None:
        found.state = state  # type: ignore[assignment]


def _mark_deleting(registry: Registry, savepoint_id: str, recheck: bool) -> None:
    """`deleting`, unless a protection or hold landed since the check (a rollback holds its
    target by compare-and-swap on this registry: one of the two writes sees the other).
    An abandoned pending entry is not rechecked: it never became a savepoint."""
    found = registry.find(savepoint_id)
    if found is None:
        return
    if recheck and (found.protected or found.holds):
        keep = reasons_to_keep(found, {})
        raise SavepointError(
            f"savepoint {savepoint_id!r} is not deleted: {'; '.join(keep)}; "
            "unprotect or release it first, or delete another savepoint"
        )
    found.state = "deleting"


def _forget(registry: Registry, savepoint_id: str) -> None:
    registry.savepoints = [e for e in registry.savepoints if e.id != savepoint_id]


def apply_savepoint_retention(
    store: ObjectStore,
    layout: LineageLayout,
    *,
    retained: int | None,
    max_age: float | None,
    epoch: int,
    now: float | None = None,
) -> list[str]:
    """Delete the savepoints beyond `retained` or older than `max_age` (spec `savepoints`).

    Never the newest, nor one protected, held, or that a job was restored from.

    Returns:
        The ids deleted.
    """
    if retained is None and max_age is None:
        return []
    entries = SavepointRegistry(store, layout).read().savepoints
    chosen = expired(
        entries,
        retained=retained,
        max_age=max_age,
        now=time.time() if now is None else now,
        in_use=savepoints_in_use(store),
    )
    for savepoint_id in chosen:
        delete_savepoint(store, layout, savepoint_id, epoch=epoch)
    if chosen:
        log.info("savepoint retention deleted %s", chosen)
    return chosen


def sweep_savepoints(store: ObjectStore, layout: LineageLayout, epoch: int) -> DisposalReport:
    """At a runner's start: finish what runners of older epochs left half done.

    A pending savepoint whose manifest is whole is marked complete (the runner died
    right after writing it); any other pending one is disposed of; a `deleting` one is
    deleted. Entries of this or a newer epoch are left alone.
    """
    report = DisposalReport()
    registry = SavepointRegistry(store, layout)
    for entry in registry.read().savepoints:
        if entry.epoch >= epoch or entry.state == "complete":
            continue
        if entry.state == "pending":
            place = SavepointPlace(store, layout.savepoint(entry.id))
            check = check_savepoint(place, entry.id, layout=layout)
            if not check.broken and check.manifest is not None:
                manifest = check.manifest
                registry.update(lambda r, m=manifest: _complete(r, m), epoch)
                report.completed.append(entry.id)
                continue
        delete_savepoint(store, layout, entry.id, epoch=epoch, abandoned=True)
        report.deleted.append(entry.id)
    if report.deleted or report.completed:
        log.info("savepoint sweep: %s", report)
    return report


def _complete(registry: Registry, manifest: SavepointManifest) -> None:
    found = registry.find(manifest.id)
    if found is not None:
        found.state = "complete"
        found.completed_at = manifest.ended_at or time.time()
        found.size = manifest.size
