"""Externalized checkpoints: Spark's local checkpoint directory, kept on durable storage.

Flink keeps completed checkpoints on durable storage; Spark keeps its checkpoint on the
driver's disk. After checkpoint N completes (`commits/N`), `CheckpointUploader` uploads
what changed in the directory, content-addressed (a file already in the store is not
uploaded again), then writes a manifest listing every file a restore needs
(snapshots/manifest.py), and adds it to the checkpoint index (snapshots/index.py).
`snapshots.restore.restore_checkpoint` rebuilds the directory on another machine;
retention keeps the last K checkpoints.

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
from streamkeeper.errors import FencedError, SavepointError
from streamkeeper.lineage.control import Fence
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.snapshots.index import IndexEntry, IndexWriter
from streamkeeper.snapshots.manifest import (
    WORKERS,
    CheckpointFile,
    CheckpointManifest,
    FileTransfer,
    LocalFile,
    latest_commit,
    read_manifest,
    scan_checkpoint,
    sha256_of,
)
from streamkeeper.snapshots.retention import ManifestKeys, apply_retention, discard_all, sweep
from streamkeeper.snapshots.spark_checkpoint import SparkCheckpoint
from streamkeeper.spec import ExternalizedSpec
from streamkeeper.storage import ObjectStore

log = logging.getLogger(__name__)


class CheckpointUploader:
    """Uploads completed checkpoints of one local directory, incrementally.

    Which objects exist is known from the indexed checkpoints' manifests (read once,
    then kept up to date), so deciding what to upload costs no request. Not
    thread-safe: the coordinator calls it from one thread, and retention must not run
    during an upload.
    """

    def __init__(
        self, store: ObjectStore, layout: LineageLayout, directory: Path, epoch: int = 0
    ) -> None:
        self.store = store
        self.layout = layout
        self.directory = Path(directory)
        self.epoch = epoch
        self.transfer = FileTransfer(store)
        self.index = IndexWriter(store, layout, epoch)
        self.keys_of = ManifestKeys(store, layout)
        self._digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha
        self._by_sha: dict[str, str] | None = None  # sha256 -> a key an indexed checkpoint has

    def upload(
        self, checkpoint_id: int, guard: Callable[[], None] | None = None
    ) -> CheckpointManifest | None:
        """Upload the directory's new files, write manifest `checkpoint_id`, index it.

        Args:
            checkpoint_id: the manifest's id (the batch's commit seq).
            guard: called just before the manifest is written (a fencing check).

        Returns:
            The manifest, or None when the directory holds no completed batch.

        Raises:
            FencedError: a newer runner owns the checkpoint index.
        """
        started = time.monotonic()
        by_sha = self._load()  # also seeds the digests of a restored directory
        listed = scan_checkpoint(self.directory)
        batch_id = latest_commit(listed)
        query_id = SparkCheckpoint(self.directory).query_id()
        if batch_id is None or query_id is None:
            return None
        keyed = {f: self._digest(f) for f in listed}
        # Only listed files can be asked for again; Spark deletes the rest for good.
        self._digests = {(f.path, f.size, f.mtime_ns): sha for f, sha in keyed.items() if sha}
        wanted: dict[str, list[LocalFile]] = {}
        for local, sha in keyed.items():
            if sha is not None and sha not in by_sha:
                wanted.setdefault(self._new_key(sha), []).append(local)
        uploaded = self._upload(wanted)
        failed = {key for key, size in uploaded.items() if size is None}
        files = []
        for local, sha in keyed.items():
            key = by_sha.get(sha) if sha else None
            key = key or (self._new_key(sha) if sha else None)
            if key is not None and key not in failed:
                files.append(CheckpointFile(local.path, local.size, local.mtime_ns, sha, key))
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
        self._write_manifest(manifest, guard)
        entry = IndexEntry(checkpoint_id, batch_id, self.epoch)

        self.index.update(lambda index: index.add(entry))
        self.keys_of.remember(checkpoint_id, manifest.keys)
        by_sha.update({f.sha256: f.key for f in files})
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

    def _write_manifest(
        self, manifest: CheckpointManifest, guard: Callable[[], None] | None
    ) -> None:
        """Write the manifest by compare-and-swap, the fencing check right before each try.

        Two runners can upload the same checkpoint id (a fenced one still finishing its
        batch, and its successor): a plain overwrite let the fenced one replace, after its
        check, the manifest its successor had indexed with one listing files the
        successor's sweep had deleted (found by the lifecycle property test). Now a write
        that lost the race reads again and checks the fence again, and a fenced runner
        stops there.
        """
        key = self.layout.checkpoint_manifest(manifest.checkpoint_id)
        while True:
            _, version = self.store.read_versioned(key)
            if guard is not None:
                guard()
            if self.store.write_if(key, manifest.to_json(), version) is not None:
                return

    def _new_key(self, sha: str) -> str:
        """Where this epoch uploads a file (see snapshots/index.py: why the epoch)."""
        return self.layout.checkpoint_file(f"{sha}.e{self.epoch}")

    def _upload(self, wanted: dict[str, list[LocalFile]]) -> dict[str, int | None]:
        """Upload each key (from any of its identical files); bytes per key, None: failed."""
        items = list(wanted.items())
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            sizes = pool.map(self._put_one, items)
            return {key: size for (key, _files), size in zip(items, sizes, strict=True)}

    def retain(self, retained: int) -> list[int]:
        """Keep the newest `retained` checkpoints; returns the ids kept."""
        report = apply_retention(self.index, retained, self.keys_of)
        self._forget_deleted(report.files_deleted)
        return report.retained

    def discard_all(self) -> None:
        report = discard_all(self.index, self.keys_of)
        self._forget_deleted(report.files_deleted)

    def take_ownership(self) -> None:
        """Become the index's owner (fencing older runners' uploads), then sweep leftovers."""
        self.index.update(lambda index: None)
        self._forget_deleted(sweep(self.index, self.keys_of))

    def _forget_deleted(self, keys: list[str]) -> None:
        if self._by_sha is not None and keys:
            gone = set(keys)
            self._by_sha = {sha: key for sha, key in self._by_sha.items() if key not in gone}

    def forget(self) -> None:
        """Re-read the index and manifests before the next upload."""
        self._by_sha = None
        self.index = IndexWriter(self.store, self.layout, self.epoch)
        self.keys_of = ManifestKeys(self.store, self.layout)

    def _load(self) -> dict[str, str]:
        if self._by_sha is None:
            self._by_sha = {}
            for checkpoint_id in self.index.read().ids:
                manifest = read_manifest(self.store, self.layout, checkpoint_id)
                if manifest is None:
                    continue
                self.keys_of.remember(checkpoint_id, manifest.keys)
                for f in manifest.files:
                    self._by_sha[f.sha256] = f.key
                    # A restored directory keeps its files' mtimes: no need to hash again.
                    self._digests[(f.path, f.size, f.mtime_ns)] = f.sha256
        return self._by_sha

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


def stored_checkpoint(
    uploader: CheckpointUploader,
    checkpoint_id: int,
    batch_id: int,
    guard: Callable[[], None] | None = None,
) -> CheckpointManifest:
    """Checkpoint `checkpoint_id` (batch `batch_id`) in the store: indexed, or uploaded now.

    A savepoint pins it; with externalized checkpoints it is there already (uploaded
    before its batch committed), else this uploads it once (incrementally after that).

    Raises:
        SavepointError: the stored checkpoint of that id is of another batch.
        FencedError: a newer runner owns the checkpoint index.
    """
    manifest = None
    if checkpoint_id in uploader.index.read().ids:
        manifest = read_manifest(uploader.store, uploader.layout, checkpoint_id)
    if manifest is None:
        manifest = uploader.upload(checkpoint_id, guard)
    if manifest is None or manifest.batch_id != batch_id:
        found = None if manifest is None else manifest.batch_id
        raise SavepointError(
            f"checkpoint {checkpoint_id} in the store is of batch {found}, not of batch "
            f"{batch_id} that the savepoint captures; take the savepoint again after the "
            "next checkpoint"
        )
    return manifest


def pin_checkpoint(uploader: CheckpointUploader, savepoint_id: str, checkpoint_id: int) -> None:
    """Pin a checkpoint for a savepoint: retention keeps it (and its files) while pinned."""
    uploader.index.update(lambda index: index.pins.update({savepoint_id: checkpoint_id}))


class ExternalizedCheckpoints:
    """The commit coordinator's checkpoint hook (`coordinator.CheckpointHook`)."""

    def __init__(
        self,
        store: ObjectStore,
        layout: LineageLayout,
        directory: Path,
        spec: ExternalizedSpec,
        fence: Fence,
    ) -> None:
        self.store = store
        self.layout = layout
        self.checkpoint = SparkCheckpoint(directory)
        self.spec = spec
        self.fence = fence
        self.uploader = CheckpointUploader(
            store, layout, self.checkpoint.directory, epoch=fence.epoch
        )
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
        fence: Fence,
    ) -> ExternalizedCheckpoints | None:
        """The coordinator's hook if the spec enables externalized checkpoints, else None."""
        return cls(store, layout, directory, spec, fence) if spec.enabled else None

    def take_ownership(self) -> None:
        """At start: own the checkpoint index (older runners can no longer change it)."""
        with self._lock:
            self.fence.check()
            self._fenced_by(self.uploader.take_ownership)

    def _fenced_by(self, action: Callable[[], object]) -> None:
        try:
            action()
        except FencedError as error:
            self.fence.mark_fenced(error)
            raise

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
            self.fence.check()
            uploaded: list = []
            self._fenced_by(
                lambda: uploaded.append(self.uploader.upload(manifest.seq, self.fence.check))
            )
        return None if uploaded[0] is None else uploaded[0].uploaded_bytes

    def after_commit(self, manifest: Manifest) -> None:
        """Batch N is visible: drop checkpoints beyond the retained count."""
        with self._lock:
            self.fence.check()
            try:
                self._fenced_by(lambda: self.uploader.retain(self.spec.retained))
            except FencedError:
                raise
            except Exception:  # noqa: BLE001 - garbage collection; the next checkpoint retries
                log.warning("checkpoint retention failed; retried next time", exc_info=True)
                self.uploader.forget()  # some files may be gone: re-read the manifests

    def pin_for_savepoint(
        self, savepoint_id: str, checkpoint_id: int, batch_id: int
    ) -> CheckpointManifest:
        """The stored checkpoint a pinned savepoint captures, pinned for it.

        Raises:
            FencedError: a newer runner owns the checkpoint index.
        """
        with self._lock:  # no upload or retention in between
            self.fence.check()
            captured: list[CheckpointManifest] = []

            def capture() -> None:
                captured.append(
                    stored_checkpoint(self.uploader, checkpoint_id, batch_id, self.fence.check)
                )
                pin_checkpoint(self.uploader, savepoint_id, checkpoint_id)

            self._fenced_by(capture)
            return captured[0]

    def restore_point(self, seq: int, savepoint_id: str) -> None:
        """The directory, just restored from savepoint `savepoint_id` (taken at `seq`),
        externalized as checkpoint `seq` unless the index holds one of that id already.

        Raises:
            FencedError: a newer runner owns the checkpoint index.
        """
        with self._lock:
            self.fence.check()
            held = self.stored_entry(seq)
            if held is not None:
                if not self.checkpoint.belongs_to(held.query_id):
                    # A canonical restore (a new query) at a seq whose checkpoint is still
                    # kept: never overwritten, a native savepoint may pin that checkpoint.
                    log.info(
                        "checkpoint %d is of query %s, not of savepoint %s's restore; kept",
                        seq,
                        held.query_id,
                        savepoint_id,
                    )
                return
            uploaded: list[CheckpointManifest | None] = []
            self._fenced_by(lambda: uploaded.append(self.uploader.upload(seq, self.fence.check)))
            if uploaded[0] is None:
                log.warning(
                    "savepoint %s restored no completed batch; not externalized", savepoint_id
                )

    def stored_entry(self, checkpoint_id: int) -> CheckpointManifest | None:
        """The manifest of indexed checkpoint `checkpoint_id`, or None."""
        if checkpoint_id not in self.uploader.index.read().ids:
            return None
        return read_manifest(self.store, self.layout, checkpoint_id)

    def stored(self, checkpoint_id: int, batch_id: int) -> CheckpointManifest | None:
        """The stored checkpoint if the store has it (a self-contained copy's source)."""
        with self._lock:
            manifest = self.stored_entry(checkpoint_id)
            return manifest if manifest is not None and manifest.batch_id == batch_id else None

    def on_stop(self, cancelled: bool) -> None:
        """DELETE_ON_CANCELLATION discards every checkpoint when the job is cancelled.

        A cancel is a stop by signal. A finished available-now run is not one: the next
        run resumes from its checkpoint, so it is kept under either policy.
        """
        if cancelled and self.spec.retention == "delete_on_cancellation":
            with self._lock:
                self.fence.check()  # only the owner discards; a fenced runner leaves them
                self._fenced_by(self.uploader.discard_all)
