"""Externalized checkpoints: Spark's local checkpoint directory, kept on durable storage.

Flink keeps completed checkpoints on durable storage; Spark keeps its checkpoint on the
driver's disk. After checkpoint N completes (`commits/N`), `CheckpointUploader` uploads
what changed in the directory, content-addressed (a file already in the store is not
uploaded again), then writes a manifest listing every file a restore needs
(checkpoint_manifest). `checkpoint_restore.restore_checkpoint` rebuilds the directory
on another machine; retention keeps the last K checkpoints.

Order (the coordinator's hook, `ExternalizedCheckpoints`): files, then the manifest,
then the batch's Delta commits, then retention. As in Flink, a checkpoint is durable
before the output it covers becomes visible, so restoring the latest checkpoint never
replays a batch whose output is already visible: what it cannot vouch for is not
committed yet, and recovery commits (from the WAL) what it can. Restoring an older
checkpoint rewinds the job: batches after it are processed again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from streamkeeper import injection
from streamkeeper.commit.wal import Manifest
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.manifest import (
    WORKERS,
    CheckpointFile,
    CheckpointManifest,
    FileTransfer,
    LocalFile,
    checkpoint_ids,
    latest_commit,
    read_manifest,
    scan_checkpoint,
    sha256_of,
)
from streamkeeper.snapshots.retention import apply_retention, discard_all
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.spec import ExternalizedSpec
from streamkeeper.storage import ObjectStore

log = logging.getLogger(__name__)


class CheckpointUploader:
    """Uploads completed checkpoints of one local directory, incrementally.

    Which objects exist is known from the retained manifests (read once, then kept up to
    date), so deciding what to upload costs no request. Not thread-safe: the coordinator
    calls it from one thread, and retention must not run during an upload.
    """

    def __init__(self, store: ObjectStore, layout: LineageLayout, directory: Path) -> None:
        self.store = store
        self.layout = layout
        self.directory = Path(directory)
        self.transfer = FileTransfer(store)
        self._digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha
        self._stored: dict[int, set[str]] | None = None  # checkpoint id -> keys it lists

    def upload(
        self, checkpoint_id: int, guard: Callable[[], None] | None = None
    ) -> CheckpointManifest | None:
        """Upload the directory's new files, then write manifest `checkpoint_id`.

        Args:
            checkpoint_id: the manifest's id (the batch's commit seq).
            guard: called just before the manifest is written (a fencing check).

        Returns:
            The manifest, or None when the directory holds no completed batch.
        """
        started = time.monotonic()
        self._load_stored()  # also seeds the digests of a restored directory
        listed = scan_checkpoint(self.directory)
        batch_id = latest_commit(listed)
        query_id = SparkCheckpoint(self.directory).query_id()
        if batch_id is None or query_id is None:
            return None
        keyed = {f: self._digest(f) for f in listed}
        # Only listed files can be asked for again; Spark deletes the rest for good.
        self._digests = {(f.path, f.size, f.mtime_ns): sha for f, sha in keyed.items() if sha}
        by_key: dict[str, list[LocalFile]] = {}
        for local, sha in keyed.items():
            if sha is not None:
                by_key.setdefault(self.layout.checkpoint_file(sha), []).append(local)
        uploaded = self._upload_missing(by_key)
        failed = {key for key, size in uploaded.items() if size is None}
        files = [
            CheckpointFile(f.path, f.size, f.mtime_ns, sha, self.layout.checkpoint_file(sha))
            for f, sha in keyed.items()
            if sha is not None and self.layout.checkpoint_file(sha) not in failed
        ]
        sizes = [size for size in uploaded.values() if size is not None]
        manifest = CheckpointManifest(
            lineage=self.layout.lineage,
            checkpoint_id=checkpoint_id,
            query_id=query_id,
            batch_id=batch_id,
            files=files,
            uploaded_files=len(sizes),
            uploaded_bytes=sum(sizes),
        )
        if guard is not None:
            guard()
        self.store.write_json(self.layout.checkpoint_manifest(checkpoint_id), manifest.to_json())
        self._load_stored()[checkpoint_id] = manifest.keys
        log.info(
            "checkpoint %d (batch %d) externalized: %d files, %d new (%d bytes) in %.0f ms",
            checkpoint_id,
            batch_id,
            len(files),
            manifest.uploaded_files,
            manifest.uploaded_bytes,
            (time.monotonic() - started) * 1000,
        )
        return manifest

    def _upload_missing(self, by_key: dict[str, list[LocalFile]]) -> dict[str, int | None]:
        """Upload every key no retained checkpoint has; returns bytes per key (None: failed)."""
        known = set().union(*self._load_stored().values())
        missing = [(key, files) for key, files in by_key.items() if key not in known]
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            sizes = pool.map(self._put_one, missing)
            return {key: size for (key, _files), size in zip(missing, sizes, strict=True)}

    def retain_only(self, checkpoint_ids_kept: list[int]) -> None:
        """Forget the keys of checkpoints retention deleted (their files may be gone)."""
        stored = self._load_stored()
        for checkpoint_id in list(stored):
            if checkpoint_id not in checkpoint_ids_kept:
                del stored[checkpoint_id]

    def forget(self) -> None:
        """Re-read the stored manifests before the next upload."""
        self._stored = None

    def _load_stored(self) -> dict[int, set[str]]:
        if self._stored is None:
            self._stored = {}
            for checkpoint_id in checkpoint_ids(self.store, self.layout):
                manifest = read_manifest(self.store, self.layout, checkpoint_id)
                if manifest is not None:
                    self._stored[checkpoint_id] = manifest.keys
                    # A restored directory keeps its files' mtimes: no need to hash again.
                    for f in manifest.files:
                        self._digests[(f.path, f.size, f.mtime_ns)] = f.sha256
        return self._stored

    def _digest(self, local: LocalFile) -> str | None:
        """The file's sha256, or None if it vanished or is being written."""
        cache_key = (local.path, local.size, local.mtime_ns)
        if cache_key in self._digests:
            return self._digests[cache_key]
        try:
            sha = sha256_of(self.directory / local.path)
        except FileNotFoundError:
            return None
        if LocalFile.stat(self.directory, local.path) != local:
            return None  # changed while hashed: still being written (an SST), not needed yet
        self._digests[cache_key] = sha
        return sha

    def _put_one(self, item: tuple[str, list[LocalFile]]) -> int | None:
        """Upload one key from any of its (identical) files; returns the bytes, or None."""
        key, candidates = item
        for local in candidates:
            try:
                self.transfer.put(self.directory / local.path, key)
            except FileNotFoundError:
                continue  # deleted by Spark's clean-up; another copy may still be there
            if LocalFile.stat(self.directory, local.path) == local:
                return local.size
            # Changed during the upload: the object may not hold the content its key names.
            self.store.delete([key])
        log.debug("checkpoint file %s vanished or changed during upload; not captured", key)
        return None


class ExternalizedCheckpoints:
    """The commit coordinator's checkpoint hook (`coordinator.CheckpointHook`)."""

    def __init__(
        self,
        store: ObjectStore,
        layout: LineageLayout,
        directory: Path,
        spec: ExternalizedSpec,
        guard: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.layout = layout
        self.checkpoint = SparkCheckpoint(directory)
        self.spec = spec
        self.guard = guard
        self.uploader = CheckpointUploader(store, layout, self.checkpoint.directory)
        # Retention must never run during an upload (it would delete the files of a manifest
        # not yet written): a stuck committer thread of a previous attempt may overlap the
        # next attempt's recovery, so every entry point takes this lock.
        self._lock = threading.Lock()

    @classmethod
    def for_spec(
        cls,
        spec: ExternalizedSpec,
        store: ObjectStore,
        layout: LineageLayout,
        directory: Path,
        guard: Callable[[], None] | None = None,
    ) -> ExternalizedCheckpoints | None:
        """The coordinator's hook if the spec enables externalized checkpoints, else None."""
        return cls(store, layout, directory, spec, guard) if spec.enabled else None

    def before_commit(self, manifest: Manifest) -> int | None:
        """Checkpoint N completed: make it durable before its output becomes visible.

        Returns:
            The bytes uploaded (the increment), or None if nothing was externalized.
        """
        if not (
            self.checkpoint.belongs_to(manifest.query_id)
            and self.checkpoint.is_complete(manifest.batch_id)
        ):
            # Recovery of a batch whose checkpoint lives in another directory: that
            # directory is not the one this runner externalizes.
            log.info(
                "batch %d is not in %s; not externalized",
                manifest.batch_id,
                self.checkpoint.directory,
            )
            return None
        injection.reached("before_upload")
        with self._lock:
            externalized = self.uploader.upload(manifest.seq, guard=self.guard)
        return None if externalized is None else externalized.uploaded_bytes

    def after_commit(self, manifest: Manifest) -> None:
        """Batch N is visible: drop checkpoints beyond the retained count."""
        with self._lock:
            try:
                report = apply_retention(self.store, self.layout, self.spec.retained)
            except Exception:  # noqa: BLE001 - garbage collection; the next checkpoint retries
                log.warning("checkpoint retention failed; retried next time", exc_info=True)
                self.uploader.forget()  # some files may be gone: re-read the manifests
                return
            self.uploader.retain_only(report.retained)

    def on_stop(self, cancelled: bool) -> None:
        """DELETE_ON_CANCELLATION discards every checkpoint when the job is cancelled.

        A cancel is a stop by signal. A finished available-now run is not one: the next
        run resumes from its checkpoint, so it is kept under either policy.
        """
        if cancelled and self.spec.retention == "delete_on_cancellation":
            with self._lock:
                discard_all(self.store, self.layout)
                self.uploader.forget()
