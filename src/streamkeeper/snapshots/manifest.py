"""The stored form of an externalized checkpoint: its manifest, the local files it
captures, and how a file travels to and from the object store (`FileTransfer`).

A manifest (`checkpoints/manifests/{id}.json`) lists every file of the Spark checkpoint
directory a restore needs, each with its size, modification time and content key
(`checkpoints/files/{sha256}`). The id is the lineage's commit seq of the batch whose
completion triggered it, not the Spark batch id: batch ids restart at 0 when a
checkpoint is reset, the seq never goes back (see PROTOCOL.md, "Names").

What Spark 4.2 writes, and why "every file present" is the right capture (read from
the sample job's checkpoint with both state backends):

- `metadata` (the query id, written once), `offsets/N`, `commits/N`, `sources/0/N`
  (and `N.compact`): written to a temp file and renamed, never changed afterwards;
  Spark deletes entries older than `spark.sql.streaming.minBatchesToRetain`.
- HDFS-backed state: `state/{op}/{part}/N.delta` and `N.snapshot`, also renamed into
  place, immutable; maintenance deletes versions no retained batch needs.
- RocksDB: `N.zip` (renamed into place; it is the commit point of a version and names
  its SST files), `SSTs/*.sst` (copied in place *before* the zip that references them,
  so an SST can be seen half-written, but never one a visible zip references) and
  with changelog checkpointing `N.changelog` (renamed into place).
- `.crc` files next to each: Hadoop's checksums, kept so the restored tree is
  byte-identical. Temp files (`.name.uuid.tmp`, `..name.uuid.tmp.crc`) are skipped.

The scan lists folders in the reverse of Spark's write order (commits, state,
offsets, sources, metadata): a file listed early had its prerequisites written
before it, so they are still there when their folder is listed later. The capture is
thus a state some crash could have left, which Spark recovers from by design.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamkeeper.errors import CheckpointRestoreError
from streamkeeper.lineage.layout import LineageLayout
from streamkeeper.storage import LocalStore, ObjectStore, S3Store
from streamkeeper.storage.confine import clean_relative, confined_key

CHECKPOINT_FORMAT = 1
WORKERS = 8  # concurrent file transfers; small files dominate, so requests, not bytes, cost
MULTIPART_BYTES = 8 * 1024 * 1024  # boto3's default multipart threshold
SINGLE_COPY_BYTES = 5 * 1024**3  # S3's limit of one CopyObject

# Listing order: the reverse of the order in which Spark writes a batch's files.
_SCAN_ORDER = ("commits", "state", "offsets", "sources", "metadata")


@dataclass(frozen=True)
class LocalFile:
    """A file of the local checkpoint directory, as seen when it was listed."""

    path: str  # relative to the checkpoint directory, POSIX separators
    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def stat(cls, directory: Path, path: str) -> LocalFile | None:
        """Stat `directory/path`; None if it has gone (Spark deletes what it no longer needs)."""
        try:
            info = os.stat(directory / path)
        except FileNotFoundError:
            return None
        return cls(path, info.st_size, info.st_mtime_ns, info.st_ino)


@dataclass(frozen=True)
class CheckpointFile:
    """One file of an externalized checkpoint."""

    path: str
    size: int
    mtime_ns: int
    sha256: str
    key: str  # storage key, relative to the storage root


@dataclass
class CheckpointManifest:
    """Everything needed to rebuild one Spark checkpoint directory."""

    lineage: str
    checkpoint_id: int
    query_id: str
    batch_id: int  # the latest `commits/N` captured: a restore resumes after it
    files: list[CheckpointFile]
    uploaded_files: int = 0  # what this checkpoint added to the store (the increment)
    uploaded_bytes: int = 0
    created_at: float = field(default_factory=time.time)
    format: int = CHECKPOINT_FORMAT

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def keys(self) -> set[str]:
        return {f.key for f in self.files}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str) -> CheckpointManifest:
        if data.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointRestoreError(
                f"checkpoint manifest {source} has format {data.get('format')!r}, expected "
                f"{CHECKPOINT_FORMAT}; it was written by another streamkeeper version"
            )
        return cls(**{**data, "files": [CheckpointFile(**f) for f in data["files"]]})


def is_temporary(name: str) -> bool:
    """Spark's in-flight writes: `.name.uuid.tmp` and its checksum `..name.uuid.tmp.crc`."""
    return name.endswith(".tmp") or name.endswith(".tmp.crc")


def scan_checkpoint(directory: Path) -> list[LocalFile]:
    """The checkpoint's files, listed in the reverse of Spark's write order."""
    if not directory.is_dir():
        return []
    tops = {p.name: p for p in directory.iterdir()}
    ordered = [tops.pop(name) for name in _SCAN_ORDER if name in tops]
    ordered += [tops[name] for name in sorted(tops)]
    found: list[LocalFile] = []
    for top in ordered:
        for relative in _walk(directory, top):
            local = LocalFile.stat(directory, relative)
            if local is not None:
                found.append(local)
    return found


def _walk(directory: Path, top: Path) -> list[str]:
    """Relative paths of the regular files below `top` (or `top` itself), temp files skipped.

    os.walk ignores folders that vanish mid-walk, as Spark's clean-up makes them do.
    """
    if top.is_file():
        return [] if is_temporary(top.name) else [top.name]
    paths = []
    for folder, _dirs, names in os.walk(top):
        base = Path(folder).relative_to(directory).as_posix()
        paths += [f"{base}/{n}" for n in names if not is_temporary(n)]
    return sorted(paths)


def latest_commit(files: list[LocalFile]) -> int | None:
    """The highest `commits/N` among `files`."""
    ids = [int(f.path[8:]) for f in files if f.path.startswith("commits/") and f.path[8:].isdigit()]
    return max(ids, default=None)


def checkpoint_ids(store: ObjectStore, layout: LineageLayout) -> list[int]:
    """Ids of the lineage's retained externalized checkpoints, ascending (from the index)."""
    from streamkeeper.snapshots.index import read_index

    return read_index(store, layout).ids


def read_manifest(
    store: ObjectStore, layout: LineageLayout, checkpoint_id: int
) -> CheckpointManifest | None:
    """The checkpoint's manifest, every path and key in it checked (None if absent).

    Raises:
        CheckpointRestoreError: another format.
        UnsafePathError: a path or key outside its folder (nothing was written or deleted).
    """
    key = layout.checkpoint_manifest(checkpoint_id)
    data = store.read_json(key)
    if data is None:
        return None
    manifest = CheckpointManifest.from_json(data, key)
    confine_files(
        manifest.files, key_folder=layout.checkpoint_files, source=f"checkpoint manifest {key!r}"
    )
    return manifest


def confine_files(files: list[CheckpointFile], *, key_folder: str, source: str) -> None:
    """Check a manifest's files before anything is fetched, written or deleted: each path
    is joined to the directory a restore writes, each key must lie below `key_folder`.

    Raises:
        UnsafePathError: naming the first bad path or key, `source` and the fix.
    """
    for file in files:
        clean_relative(
            file.path, what="file path", source=source, within="the checkpoint directory"
        )
        confined_key(key_folder, file.key, what="file key", source=source)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class FileTransfer:
    """Whole files in and out of the object store that holds our JSON keys."""

    def __init__(self, store: ObjectStore) -> None:
        if not isinstance(store, LocalStore | S3Store):
            raise TypeError(f"no file transfer for {type(store).__name__}")
        self.store = store

    def put(self, source: Path, key: str) -> None:
        """Upload `source` to `key`: one PUT, or boto3's multipart upload_file for big files."""
        if isinstance(self.store, S3Store):
            client, bucket = self.store.client, self.store.bucket
            with open(source, "rb") as body:
                if os.fstat(body.fileno()).st_size < MULTIPART_BYTES:
                    # upload_file starts a transfer manager (threads) per call: too dear for
                    # the many small files of a checkpoint.
                    client.put_object(Bucket=bucket, Key=self._s3_key(key), Body=body)
                    return
            client.upload_file(str(source), bucket, self._s3_key(key))
            return
        target = self.store._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")  # hidden from list()
        try:
            with open(source, "rb") as reader, open(tmp, "wb") as writer:
                shutil.copyfileobj(reader, writer, 1 << 20)
                writer.flush()
                os.fsync(writer.fileno())  # durable before the manifest that names it
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def put_hashed(self, source: Path, key: str) -> tuple[int, str]:
        """Upload `source` to `key`, hashing it on the way; returns (size, sha256)."""
        digest, size = hashlib.sha256(), 0
        if isinstance(self.store, S3Store):
            if os.stat(source).st_size >= MULTIPART_BYTES:
                sha = sha256_of(source)  # a big file is read twice rather than held in memory
                self.put(source, key)
                return os.stat(source).st_size, sha
            body = source.read_bytes()
            self.store.client.put_object(Bucket=self.store.bucket, Key=self._s3_key(key), Body=body)
            return len(body), hashlib.sha256(body).hexdigest()
        target = self.store._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(source, "rb") as reader, open(tmp, "wb") as writer:
                for block in iter(lambda: reader.read(1 << 20), b""):
                    digest.update(block)
                    writer.write(block)
                    size += len(block)
                writer.flush()
                os.fsync(writer.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return size, digest.hexdigest()

    def copy(self, source_key: str, target_key: str, size: int | None = None) -> None:
        """Copy an object within the store: server-side on S3 (no bytes through us)."""
        if isinstance(self.store, S3Store):
            client, bucket = self.store.client, self.store.bucket
            source = {"Bucket": bucket, "Key": self._s3_key(source_key)}
            if size is not None and size < SINGLE_COPY_BYTES:
                client.copy_object(CopySource=source, Bucket=bucket, Key=self._s3_key(target_key))
            else:
                client.copy(source, bucket, self._s3_key(target_key))  # multipart when large
            return
        target = self.store._path(target_key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        try:
            shutil.copyfile(self.store._path(source_key), tmp)  # the kernel's copy path
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)

    def get(self, key: str, target: Path, size: int | None = None) -> None:
        """Download `key` to `target`; a missing key raises FileNotFoundError."""
        if not isinstance(self.store, S3Store):
            shutil.copyfile(self.store._path(key), target)
            return
        from botocore.exceptions import ClientError

        client, bucket = self.store.client, self.store.bucket
        try:
            if size is not None and size < MULTIPART_BYTES:
                body = client.get_object(Bucket=bucket, Key=self._s3_key(key))["Body"]
                target.write_bytes(body.read())
            else:
                client.download_file(bucket, self._s3_key(key), str(target))
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                raise FileNotFoundError(key) from error
            raise

    def _s3_key(self, key: str) -> str:
        return self.store._key(key)  # type: ignore[union-attr]  # checks the key
