"""`streamkeeper run SPEC --from-savepoint ID|PATH`: rebuild the checkpoint directory.

Everything is checked before anything changes (`plan_restore`, read-only): the
savepoint is found (by id in the job's lineage, or a copied savepoint folder by path or
URI), whole (`savepoint_check`), of this job and lineage, and, if the lineage's head is
past it, restoring it must be asked for (`--allow-rewind`): the batches after it run
again; what they committed stays in the tables and they commit again under new seqs.
The runner then checks the topology against the query (native savepoints restore into
the same stateful operators and partition count only) and restores.

A native restore downloads the files into a staging folder beside the directory,
verifies each sha256, adds a marker naming the savepoint and renames the folder into
place: an interrupted restore leaves the directory as it was. A start retried after a
restore finished (the marker names the same savepoint) resumes from the directory
instead of restoring again. A canonical restore hands the state tables and source
positions to `streamkeeper.state` (snapshots/canonical.py), which writes a fresh
checkpoint for the job's query as it is now (changed code, another partition count).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from streamkeeper.errors import IncompatibleSavepointError, SavepointError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots import canonical, savepoint_points
from streamkeeper.snapshots.restore import download
from streamkeeper.snapshots.savepoint_check import check_savepoint
from streamkeeper.snapshots.savepoint_manifest import SavepointManifest, SavepointPlace
from streamkeeper.snapshots.savepoints import SavepointEntry, SavepointRegistry, locate
from streamkeeper.spec import JobSpec
from streamkeeper.storage import Location, ObjectStore, S3Settings, resolve_root

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)
RESTORE_MARKER = ".streamkeeper-restored-from.json"


@dataclass(frozen=True)
class RestorePlan:
    """A checked savepoint and what restoring it into the directory means."""

    manifest: SavepointManifest
    place: SavepointPlace
    location: Location  # where the savepoint's folder is (for canonical state tables)
    already_restored: bool  # a retried start: the directory holds this restore already
    rewinds: bool  # the lineage's head is past the savepoint

    def reference(self) -> dict[str, object]:
        """What the job record says it was restored from (keeps it from retention)."""
        m = self.manifest
        return {"id": m.id, "lineage": m.lineage, "seq": m.seq, "batch_id": m.batch_id}


def plan_restore(
    root: Location,
    layout: LineageLayout,
    reference: str,
    local_dir: Path,
    *,
    head_seq: int | None,
    allow_rewind: bool,
    shadow_of: tuple[str, str] | None = None,
) -> RestorePlan:
    """Find and check the savepoint; reads only.

    Args:
        shadow_of: (job, lineage) whose savepoint this job may restore too: an upgrade's
            shadow run starts from the running version's savepoint (upgrade/).

    Raises:
        SavepointError: unknown, broken, of another job or lineage, a rewind not
            allowed, or a directory that is not empty (each names the fix).
    """
    store = root.store()
    place, entry, location = _find(root, store, layout, reference)
    check = check_savepoint(place, _id_of(place, entry), entry=entry, layout=layout)
    manifest = check.raise_if_broken()
    if (manifest.job, manifest.lineage) not in ((layout.job, layout.lineage), shadow_of):
        raise IncompatibleSavepointError(
            f"savepoint {manifest.id!r} was taken by job {manifest.job!r} (lineage "
            f"{manifest.lineage!r}); this spec runs job {layout.job!r} (lineage "
            f"{layout.lineage!r}); restore it with its own job's spec, or take a savepoint "
            f"of {layout.job!r}"
        )
    already = _already_restored(local_dir, manifest)
    rewinds = head_seq is not None and head_seq > manifest.seq
    if rewinds and not allow_rewind and not already:
        raise SavepointError(
            f"savepoint {manifest.id!r} is at seq {manifest.seq} (batch {manifest.batch_id}) "
            f"but lineage {layout.lineage!r} has committed up to seq {head_seq}: restoring it "
            "rewinds the job, and the batches after it run again (the output they committed "
            "stays; it is committed again under new seqs); pass --allow-rewind to do that, or "
            "restore a newer savepoint (`streamkeeper savepoints " + layout.job + "`)"
        )
    return RestorePlan(manifest, place, location, already, rewinds)


def _id_of(place: SavepointPlace, entry: SavepointEntry | None) -> str:
    """The registry's id; a copied folder (any name) says its id in its manifest."""
    if entry is not None:
        return entry.id
    manifest = place.read()
    return manifest.id if manifest is not None else place.folder


def _find(
    root: Location, store: ObjectStore, layout: LineageLayout, reference: str
) -> tuple[SavepointPlace, SavepointEntry | None, Location]:
    """The savepoint's place: an id in this lineage, or a copied folder by path or URI."""
    if "/" not in reference:
        registry = SavepointRegistry(store, layout)
        if registry.read().find(reference) is None:
            lineage, entry = locate(store, reference)  # raises UnknownSavepointError
            raise IncompatibleSavepointError(
                f"savepoint {reference!r} belongs to lineage {lineage!r} of job "
                f"{entry.job!r}, not to lineage {layout.lineage!r} of job {layout.job!r}; "
                f"restore it with job {entry.job!r}'s spec"
            )
        folder = layout.savepoint(reference)
        return SavepointPlace(store, folder), registry.entry(reference), root.child(folder)
    location = Location(resolve_root(reference), S3Settings.from_env())
    if not location.store().exists("manifest.json"):
        raise SavepointError(
            f"{reference!r} is no savepoint folder (it has no manifest.json); pass a savepoint "
            "id (`streamkeeper savepoints JOB`) or the folder of a copied savepoint"
        )
    return SavepointPlace(location.store(), ""), None, location


def _already_restored(local_dir: Path, manifest: SavepointManifest) -> bool:
    """Whether the directory is this savepoint's restore (an empty one is not).

    Raises:
        SavepointError: it holds anything else.
    """
    if not local_dir.exists() or (local_dir.is_dir() and not any(local_dir.iterdir())):
        return False
    try:
        marker = json.loads((local_dir / RESTORE_MARKER).read_text())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        marker = {}
    if marker.get("savepoint_id") == manifest.id:
        return True
    raise SavepointError(
        f"cannot restore savepoint {manifest.id!r} into {str(local_dir)!r}: it is not empty; "
        "move it away or delete it first, or start without --from-savepoint to resume from "
        "what it holds"
    )


def restore_native(plan: RestorePlan, local_dir: Path) -> None:
    """Download the savepoint's checkpoint into `local_dir` (empty or absent)."""
    manifest, place = plan.manifest, plan.place
    marker = {
        "savepoint_id": manifest.id,
        "seq": manifest.seq,
        "batch_id": manifest.batch_id,
        "restored_at": time.time(),
    }
    download(
        place.store,
        manifest.files,
        local_dir,
        label=f"savepoint {manifest.id}",
        keys=lambda f: place.file_key(manifest, f),
        progress=lambda _done, _total: savepoint_points.reached(
            "restore_savepoint_during_download"
        ),
        extra={RESTORE_MARKER: json.dumps(marker).encode()},
    )
    savepoint_points.reached("restore_savepoint_after_rename")
    log.info(
        "restored savepoint %s (seq %d, batch %d, %d files, %d bytes) into %s",
        manifest.id,
        manifest.seq,
        manifest.batch_id,
        len(manifest.files),
        manifest.size,
        local_dir,
    )


def restore_canonical(
    plan: RestorePlan,
    local_dir: Path,
    spark: SparkSession,
    spec: JobSpec,
    output: DataFrame,
    *,
    uid_mapping: dict[str, str],
    allow_non_restored_state: bool,
    bootstrap: Any = None,
) -> None:
    """Write a canonical savepoint's state into `local_dir` (empty or absent) for `output`.

    Canonical state writes a staging folder (or takes `bootstrap`'s, prepared ahead)
    and moves it into place; the marker follows.
    """
    canonical.restore_state(
        spark,
        spec,
        plan.manifest,
        plan.location,
        local_dir,
        output,
        uid_mapping=uid_mapping,
        allow_non_restored_state=allow_non_restored_state,
        bootstrap=bootstrap,
    )
    marker = {
        "savepoint_id": plan.manifest.id,
        "seq": plan.manifest.seq,
        "restored_at": time.time(),
    }
    (local_dir / RESTORE_MARKER).write_text(json.dumps(marker))
    savepoint_points.reached("restore_savepoint_after_rename")
    log.info("restored canonical savepoint %s into %s", plan.manifest.id, local_dir)
