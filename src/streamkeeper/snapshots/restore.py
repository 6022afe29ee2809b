"""Restore an externalized checkpoint into an empty local Spark checkpoint directory.

`streamkeeper run SPEC --from-checkpoint latest|ID` calls it before the query starts, on
a machine whose checkpoint directory was lost (or on a new one). Restoring the latest
checkpoint resumes exactly where the visible output ends (see checkpoint_store);
restoring an older one rewinds the job, and the batches after it run again.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.manifest import (
    WORKERS,
    CheckpointFile,
    CheckpointManifest,
    CheckpointRestoreError,
    FileTransfer,
    checkpoint_ids,
    read_manifest,
    sha256_of,
)
from streamkeeper.storage import ObjectStore
from streamkeeper.storage.confine import clean_relative, confined_path

log = logging.getLogger(__name__)


def restore_checkpoint(
    store: ObjectStore,
    layout: LineageLayout,
    local_dir: Path,
    checkpoint: str | int = "latest",
    progress: Callable[[int, int], None] | None = None,
) -> CheckpointManifest:
    """Rebuild a Spark checkpoint directory from an externalized checkpoint.

    Files are downloaded into a sibling folder, verified against their sha256 and
    renamed into place at the end, so an interrupted restore leaves `local_dir` empty.

    Args:
        store: the storage root's object store.
        layout: the lineage's keys.
        local_dir: the job's checkpoint directory; it must be empty or absent.
        checkpoint: "latest" or a checkpoint id.
        progress: called with (files done, files in all) as files arrive, from worker
            threads (e.g. `observability.progress.RunProgress.restore`).

    Raises:
        CheckpointRestoreError: the directory is not empty, the id does not exist, or a
            file is missing or corrupt.
    """
    local_dir = Path(local_dir).resolve()
    manifest = check_restorable(store, layout, local_dir, checkpoint)
    download(
        store,
        manifest.files,
        local_dir,
        label=f"checkpoint {manifest.checkpoint_id}",
        progress=progress,
    )
    log.info(
        "restored checkpoint %d (batch %d, %d files, %d bytes) into %s",
        manifest.checkpoint_id,
        manifest.batch_id,
        len(manifest.files),
        manifest.size,
        local_dir,
    )
    return manifest


def download(
    store: ObjectStore,
    files: list[CheckpointFile],
    local_dir: Path,
    *,
    label: str,
    keys: Callable[[CheckpointFile], str] | None = None,
    progress: Callable[[int, int], None] | None = None,
    extra: dict[str, bytes] | None = None,
    before_rename: Callable[[], None] | None = None,
) -> None:
    """Download `files` into a sibling staging folder, verify each, rename it into place.

    An interrupted download leaves `local_dir` as it was (empty or absent).

    Args:
        label: what is restored, for errors ("checkpoint 12", "savepoint sp-...").
        keys: each file's storage key (default: its `key`).
        extra: more files to write into the directory (path -> bytes), e.g. a marker.
        before_rename: called once every file is in the staging folder.

    Raises:
        CheckpointRestoreError: a file is missing or does not match its size/sha256.
        UnsafePathError: a path outside the directory (checked before anything is written).
    """
    for relative in [*(f.path for f in files), *(extra or {})]:  # before the first byte
        clean_relative(relative, what="file path", source=label, within=repr(str(local_dir)))
    staging = local_dir.parent / f".{local_dir.name}.restore-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    transfer = FileTransfer(store)
    key_of = keys or (lambda f: f.key)
    fetch = _counting(_fetch, len(files), progress)
    try:
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            list(pool.map(lambda f: fetch(transfer, f, key_of(f), staging, label), files))
        for path, body in (extra or {}).items():
            confined_path(staging, path, what="file path", source=label).write_bytes(body)
        if before_rename is not None:
            before_rename()
        os.replace(staging, local_dir)  # onto an empty directory too (rename(2))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def check_restorable(
    store: ObjectStore, layout: LineageLayout, local_dir: Path, checkpoint: str | int
) -> CheckpointManifest:
    """The manifest a restore would use; reads only.

    Raises:
        CheckpointRestoreError: the directory is not empty, or the id does not exist.
    """
    local_dir = Path(local_dir).resolve()
    if local_dir.exists() and (not local_dir.is_dir() or any(local_dir.iterdir())):
        raise CheckpointRestoreError(
            f"cannot restore checkpoint {checkpoint!r} into {str(local_dir)!r}: it is not "
            "empty; move it away or delete it first, or start without --from-checkpoint "
            "to resume from what it holds"
        )
    return _choose(store, layout, checkpoint)


def _choose(store: ObjectStore, layout: LineageLayout, checkpoint: str | int) -> CheckpointManifest:
    ids = checkpoint_ids(store, layout)
    where = f"lineage {layout.lineage!r} under {layout.root.uri!r}"
    if not ids:
        raise CheckpointRestoreError(
            f"cannot restore checkpoint {checkpoint!r}: no externalized checkpoints for "
            f"{where}; enable checkpoint.externalized and let the job complete a batch, or "
            "start without --from-checkpoint"
        )
    wanted = ids[-1] if checkpoint == "latest" else _parse_id(checkpoint)
    manifest = read_manifest(store, layout, wanted) if wanted in ids else None
    if manifest is None:
        # Ids are commit seqs; the batch each one resumes after helps pick one.
        available = [read_manifest(store, layout, i) for i in ids]
        listed = ", ".join(f"{m.checkpoint_id} (batch {m.batch_id})" for m in available if m)
        raise CheckpointRestoreError(
            f"checkpoint {checkpoint!r} does not exist for {where}; available: {listed} "
            "(or 'latest')"
        )
    return manifest


def _parse_id(checkpoint: str | int) -> int:
    if isinstance(checkpoint, int) or str(checkpoint).isdigit():
        return int(checkpoint)
    raise CheckpointRestoreError(
        f"checkpoint {checkpoint!r} is neither 'latest' nor a checkpoint id (a number)"
    )


def _counting(
    fetch: Callable[..., None], total: int, progress: Callable[[int, int], None] | None
) -> Callable[..., None]:
    """`fetch`, reporting (done, total) after each file if asked."""
    if progress is None:
        return fetch
    lock, done = threading.Lock(), [0]
    progress(0, total)

    def counted(*args: object) -> None:
        fetch(*args)
        with lock:
            done[0] += 1
            progress(done[0], total)

    return counted


def _fetch(
    transfer: FileTransfer, file: CheckpointFile, key: str, staging: Path, label: str
) -> None:
    target = confined_path(staging, file.path, what="file path", source=label)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        transfer.get(key, target, file.size)
    except FileNotFoundError:
        raise CheckpointRestoreError(
            f"{label} lists {file.path!r} as {key!r}, which is missing from storage; "
            "restore another one"
        ) from None
    if target.stat().st_size != file.size or sha256_of(target) != file.sha256:
        raise CheckpointRestoreError(
            f"{label}: {key!r} does not match its recorded size/sha256 for {file.path!r}; "
            "restore another one"
        )
    os.utime(target, ns=(file.mtime_ns, file.mtime_ns))  # so uploads after restore dedup
