"""Is a savepoint whole? Checked by `describe` and before every restore.

A savepoint whose manifest or any file is missing, or the wrong size, is *broken*:
it is reported with what is missing and never restored. One listing per storage
place (the savepoint's own folder, the content-addressed checkpoint store), no read
of the files; a restore checks each file's sha256 as it downloads it.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from streamkeeper.errors import BrokenSavepointError, UnsafePathError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.index import read_index
from streamkeeper.snapshots.manifest import confine_files
from streamkeeper.snapshots.savepoint_manifest import (
    SELF_CONTAINED_FOLDER,
    SavepointManifest,
    SavepointPlace,
)
from streamkeeper.snapshots.savepoints import SavepointEntry
from streamkeeper.state.format import STATE_FOLDER
from streamkeeper.state.positions import file_log_offset
from streamkeeper.storage.confine import (
    NAME_PATTERN,
    checked_name,
    clean_relative,
    confined_key,
)

log = logging.getLogger(__name__)
SHOWN_PROBLEMS = 5


@dataclass
class SavepointCheck:
    """The verdict on one savepoint."""

    savepoint_id: str
    problems: list[str] = field(default_factory=list)
    manifest: SavepointManifest | None = None

    @property
    def broken(self) -> bool:
        return bool(self.problems)

    def raise_if_broken(self) -> SavepointManifest:
        """Raises BrokenSavepointError listing the problems; else returns the manifest."""
        if self.problems or self.manifest is None:
            fix = "; restore another savepoint"  # said once, below
            shown = "; ".join(p.removesuffix(fix) for p in self.problems[:SHOWN_PROBLEMS])
            more = len(self.problems) - SHOWN_PROBLEMS
            raise BrokenSavepointError(
                f"savepoint {self.savepoint_id!r} is broken: {shown}"
                + (f" (and {more} more)" if more > 0 else "")
                + "; restore another savepoint (`streamkeeper savepoints JOB`), and delete "
                "this one"
            )
        return self.manifest

    def to_json(self) -> dict[str, Any]:
        return {"savepoint_id": self.savepoint_id, "broken": self.broken, "problems": self.problems}


def check_savepoint(
    place: SavepointPlace,
    savepoint_id: str,
    *,
    entry: SavepointEntry | None = None,
    layout: LineageLayout | None = None,
) -> SavepointCheck:
    """Check the registry entry (if any), the manifest and every file.

    Args:
        place: where the savepoint's manifest is.
        entry: its registry entry; None for a savepoint copied out of its lineage.
        layout: the lineage's keys, to check a pinned savepoint's pin and files.
    """
    check = SavepointCheck(savepoint_id)
    if entry is not None and entry.state != "complete":
        doing = {"pending": "being taken, or abandoned by a runner that died"}
        check.problems.append(f"it is {entry.state} ({doing.get(entry.state, 'being deleted')})")
        return check
    try:
        manifest = place.read()
    except BrokenSavepointError as error:
        check.problems.append(str(error))
        return check
    if manifest is None:
        check.problems.append(f"its manifest {place.manifest_key!r} is missing")
        return check
    check.manifest = manifest
    if manifest.id != savepoint_id:
        check.problems.append(f"its manifest is savepoint {manifest.id!r}'s")
    unsafe = unsafe_paths(place, manifest)
    if unsafe:  # nothing it names is looked at
        check.problems.append(unsafe)
        return check
    if manifest.storage == "pinned":
        check.problems += _pin_problems(place, manifest, layout)
    check.problems += _file_problems(place, manifest)
    if manifest.format == "canonical":
        check.problems += _canonical_problems(place, manifest)
    else:
        check.problems += _source_log_problems(manifest)
    return check


def unsafe_paths(place: SavepointPlace, manifest: SavepointManifest) -> str | None:
    """Why a path or key the manifest lists would reach outside its folder, or None.

    Checked before any of them is listed, read or written: file paths are joined to the
    restored checkpoint directory, file keys to the savepoint's folder (self-contained)
    or its lineage's content-addressed store (pinned), state tables to the savepoint's
    `state/` folder, source log names to a source's folder in the new checkpoint.
    """
    source = f"savepoint manifest {place.manifest_key!r}"
    try:
        confine_files(manifest.files, key_folder=key_folder(manifest, source), source=source)
        for op in manifest.operators:
            if op.table:
                confined_key(STATE_FOLDER, op.table, what="state table", source=source)
        for log in ((manifest.source or {}).get("log") or {}).values():
            for name in (log or {}).get("files") or {}:
                clean_relative(
                    name, what="source log file", source=source, within="its source's folder"
                )
    except UnsafePathError as error:
        return str(error)
    return None


def key_folder(manifest: SavepointManifest, source: str) -> str:
    """Where every file key of the manifest lies: relative to the savepoint's folder for
    a self-contained savepoint, the lineage's checkpoint store's for a pinned one."""
    if manifest.storage == "self_contained":
        return SELF_CONTAINED_FOLDER
    lineage = checked_name(
        manifest.lineage, NAME_PATTERN, what="lineage", source=source, expected="a lineage name"
    )
    return f"lineages/{lineage}/checkpoints/files"


def _source_log_problems(manifest: SavepointManifest) -> list[str]:
    """A native savepoint holds the file source's log entry its batch read: Spark reads
    it back to resume (the log numbers entries apart from batches)."""
    if not manifest.files:
        return []
    paths = {file.path for file in manifest.files}
    problems = []
    for index, offset in enumerate(manifest.source_offsets):
        entry = None if offset is None else file_log_offset(json.dumps(offset))
        if entry is None or entry < 0:
            continue
        if not {f"sources/{index}/{entry}", f"sources/{index}/{entry}.compact"} & paths:
            problems.append(
                f"it lacks entry {entry} of source {index}'s file log (sources/{index}/{entry}), "
                "which a restored query reads to resume; take a new savepoint"
            )
    return problems


def _pin_problems(
    place: SavepointPlace, manifest: SavepointManifest, layout: LineageLayout | None
) -> list[str]:
    if layout is None:
        return ["it is pinned in its lineage's checkpoint store, which is not known here"]
    index = read_index(place.store, layout)
    pinned = index.pins.get(manifest.id)
    if pinned != manifest.checkpoint_id:
        return [f"its checkpoint {manifest.checkpoint_id} is not pinned (pin: {pinned})"]
    if pinned not in index.ids:
        return [f"its pinned checkpoint {pinned} is no longer indexed"]
    return []


def _file_problems(place: SavepointPlace, manifest: SavepointManifest) -> list[str]:
    if not manifest.files:
        return []
    if manifest.storage == "self_contained":
        folder = place.key(SELF_CONTAINED_FOLDER)
    else:  # one folder: the content-addressed checkpoint store
        folder = manifest.files[0].key.rsplit("/", 1)[0]
    stored = place.store.sizes(folder)
    problems = []
    for file in manifest.files:
        key = place.file_key(manifest, file)
        size = stored.get(key)
        if size is None:
            problems.append(f"{file.path!r} is missing ({key!r})")
        elif size != file.size:
            problems.append(f"{file.path!r} has {size} bytes, the manifest says {file.size}")
    return problems


def _canonical_problems(place: SavepointPlace, manifest: SavepointManifest) -> list[str]:
    """Each operator's Delta table must have its log and every file it references."""
    tables = {op.uid: op.table for op in manifest.operators}
    problems = [f"operator {uid!r} has no state table" for uid, t in tables.items() if not t]
    for uid, relative in sorted((u, t) for u, t in tables.items() if t):
        prefix = place.key(relative)
        stored = place.store.sizes(prefix)
        if not any(k.startswith(f"{prefix}/_delta_log/") for k in stored):
            problems.append(f"the state table of operator {uid!r} ({prefix!r}) has no Delta log")
            continue
        problems += [
            f"the state table of operator {uid!r} lacks {name!r}"
            for name in _delta_files(place, prefix)
            if f"{prefix}/{name}" not in stored
        ]
    return problems


def _delta_files(place: SavepointPlace, prefix: str) -> list[str]:
    """Relative paths of the data files a Delta table's current version references."""
    from deltalake import DeltaTable

    from streamkeeper.storage import LocalStore, S3Store

    store = place.store
    if isinstance(store, LocalStore):
        uri, options = str(store.root / prefix), {}
    elif isinstance(store, S3Store):
        uri = f"s3://{store.bucket}/{store._key(prefix)}"
        options = store.location.storage_options()
    else:  # pragma: no cover - every store is one of the two
        return []
    try:
        table = DeltaTable(uri, storage_options=options)
    except Exception as error:  # noqa: BLE001 - reported as the problem it is
        return [f"_delta_log (unreadable: {type(error).__name__}: {error})"]
    return [uri_.removeprefix(uri.rstrip("/") + "/") for uri_ in table.file_uris()]
