"""Small JSON objects by key, on the local file system or S3 (boto3)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from streamkeeper.errors import CorruptObjectError
from streamkeeper.storage.confine import check_store_key
from streamkeeper.storage.location import Location, S3Settings


class ObjectStore:
    """Small JSON objects by key. Writes are atomic; `create` is put-if-absent.

    Versioned access (`read_versioned`, `write_if`, `delete_if`) is compare-and-swap on
    an opaque version tag (the S3 ETag; a content hash locally): what the control plane
    uses so that an older runner can never overwrite what a newer one wrote.
    """

    def read_json(self, key: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def write_json(self, key: str, value: dict[str, Any]) -> None:
        raise NotImplementedError

    def create_json(self, key: str, value: dict[str, Any]) -> bool:
        """Write only if absent. Returns False if the key already existed."""
        return self.write_if(key, value, None) is not None

    def read_versioned(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """The object and its version tag; (None, None) if absent."""
        raise NotImplementedError

    def write_if(self, key: str, value: dict[str, Any], expected: str | None) -> str | None:
        """Write if the object is still at version `expected` (None: only if absent).

        Values must be unique per writer (a token, a time): a write whose response was
        lost is recognised on retry by the object holding exactly its bytes.

        Returns:
            The new version tag, or None if the precondition failed (nothing written).
        """
        raise NotImplementedError

    def delete_if(self, key: str, expected: str) -> bool:
        """Delete if the object is still at version `expected`; False if it was not."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        """Keys under `prefix` (a folder path, no trailing slash), sorted.

        Args:
            start_after: only keys lexically after this one (a key under `prefix`), so a
                caller that knows where the interesting tail begins does not pay for the
                whole folder (S3 StartAfter).
        """
        raise NotImplementedError

    def children(self, prefix: str) -> list[str]:
        """Names of the immediate sub-folders of `prefix`, sorted."""
        raise NotImplementedError

    def sizes(self, prefix: str) -> dict[str, int]:
        """Every key under `prefix` with its size in bytes: one listing, no read."""
        raise NotImplementedError

    def delete(self, keys: list[str]) -> None:
        raise NotImplementedError

    def delete_folder(self, prefix: str) -> None:
        """Delete every object below `prefix`, and whatever unfinished writes left there."""
        if not prefix.strip("/"):
            raise ValueError("delete_folder needs a folder below the root, not the root")
        self.delete(self.list(prefix))


def _tag(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def decode_object(body: bytes | str, key: str, where: str) -> dict[str, Any]:
    """A stored object's JSON, which must be an object.

    Raises:
        CorruptObjectError: naming the key, what is wrong and the fix.
    """
    try:
        value = json.loads(body)
    except ValueError as error:
        problem = f"is not valid JSON ({error})"
    else:
        if isinstance(value, dict):
            return value
        problem = f"is not a JSON object (it holds a {type(value).__name__})"
    raise CorruptObjectError(
        f"{key!r} under {where!r} {problem}: it was changed or damaged outside streamkeeper; "
        "restore it from a backup (or a copy of the storage root)"
    )


class LocalStore(ObjectStore):
    """The embedded default: files below a local directory.

    Compare-and-swap holds across processes of this host: it runs under an exclusive
    `flock` on a hidden lock file beside the object.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        # The backstop under every caller's own check: no key reaches outside the root.
        return self.root / check_store_key(key, str(self.root))

    def read_json(self, key: str) -> dict[str, Any] | None:
        try:
            body = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return decode_object(body, key, str(self.root))

    def _replace(self, path: Path, body: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

    def write_json(self, key: str, value: dict[str, Any]) -> None:
        self._replace(self._path(key), json.dumps(value).encode())

    def create_json(self, key: str, value: dict[str, Any]) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(value))
        try:
            os.link(tmp, path)  # atomic and fails if present
            return True
        except FileExistsError:
            return False
        finally:
            tmp.unlink()

    def read_versioned(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        try:
            body = self._path(key).read_bytes()
        except FileNotFoundError:
            return None, None
        return decode_object(body, key, str(self.root)), _tag(body)

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        """The folder's lock: one file per folder, not one per object (a lineage writes
        an object per checkpoint, and a lock file can never be deleted safely: a process
        waiting on it would lock a file no one else sees)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / FOLDER_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _current_tag(self, path: Path) -> str | None:
        try:
            return _tag(path.read_bytes())
        except FileNotFoundError:
            return None

    def write_if(self, key: str, value: dict[str, Any], expected: str | None) -> str | None:
        path = self._path(key)
        body = json.dumps(value).encode()
        with self._locked(path):
            if self._current_tag(path) != expected:
                return None
            self._replace(path, body)
        return _tag(body)

    def delete_if(self, key: str, expected: str) -> bool:
        path = self._path(key)
        with self._locked(path):
            if self._current_tag(path) != expected:
                return False
            path.unlink()
        return True

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        prefix = prefix.rstrip("/")  # a folder's keys are `folder/name`, as S3 lists them
        base = f"{prefix}/" if prefix else ""
        if start_after is not None and not start_after.startswith(base):
            # A start key outside the prefix sorts before or after every key below it.
            return [] if start_after > base else self.list(prefix)
        after = None if start_after is None else start_after[len(base) :]
        found: list[str] = []
        _collect_keys(str(self._path(prefix)), "", after, found)
        found.sort()
        return [base + key for key in found]

    def children(self, prefix: str) -> list[str]:
        folder = self._path(prefix)
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))

    def sizes(self, prefix: str) -> dict[str, int]:
        found = {}
        for key in self.list(prefix):
            try:
                found[key] = self._path(key).stat().st_size
            except FileNotFoundError:
                continue  # deleted since listed
        return found

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)

    def delete_folder(self, prefix: str) -> None:
        """Also the temp files of writes a crash interrupted, and the folders."""
        if not prefix.strip("/"):
            raise ValueError("delete_folder needs a folder below the root, not the root")
        self.delete(self.list(prefix))
        shutil.rmtree(self._path(prefix), ignore_errors=True)


class S3Store(ObjectStore):
    """Objects below s3://bucket/prefix through boto3."""

    def __init__(self, location: Location, *, fail_fast: bool = False) -> None:
        import boto3
        from botocore.config import Config

        from streamkeeper.storage.credentials import botocore_session

        s3 = location.s3 or S3Settings()
        # A probe must answer in seconds (it retries transient errors itself, see probe.py);
        # data-path calls ride out short outages.
        attempts = 1 if fail_fast else 5
        self.location = location
        self.bucket = location.bucket
        self.prefix = location.key_prefix
        session = boto3.Session(botocore_session=botocore_session(s3))
        self.client = session.client(
            "s3",
            endpoint_url=s3.endpoint_url,
            region_name=s3.region,
            config=Config(
                connect_timeout=2 if fail_fast else 5,
                read_timeout=3 if fail_fast else 30,
                retries={"total_max_attempts": attempts, "mode": "standard"},
            ),
        )

    def _key(self, key: str) -> str:
        # The backstop under every caller's own check: S3 takes `..` literally, but a key
        # with it is never ours, and a prefix-less store must not be steered across.
        check_store_key(key, self.location.uri)
        return f"{self.prefix}/{key}" if self.prefix else key

    def read_json(self, key: str) -> dict[str, Any] | None:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None
        return decode_object(body, key, self.location.uri)

    def write_json(self, key: str, value: dict[str, Any]) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=json.dumps(value).encode()
        )

    def read_versioned(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        except self.client.exceptions.NoSuchKey:
            return None, None
        body = response["Body"].read()
        return decode_object(body, key, self.location.uri), response["ETag"]

    def write_if(self, key: str, value: dict[str, Any], expected: str | None) -> str | None:
        from botocore.exceptions import ClientError

        body = json.dumps(value).encode()
        condition = {"IfNoneMatch": "*"} if expected is None else {"IfMatch": expected}
        try:
            response = self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=body, **condition
            )
            return response["ETag"]
        except ClientError as error:
            if _error_code(error) not in _PRECONDITION_FAILED:
                raise
        # A retry of a write whose response was lost fails its own precondition: if the
        # object now holds exactly our bytes, the write landed.
        current = self.client.get_object(Bucket=self.bucket, Key=self._key(key))
        return current["ETag"] if current["Body"].read() == body else None

    def delete_if(self, key: str, expected: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key), IfMatch=expected)
            return True
        except ClientError as error:
            code = _error_code(error)
            if code in ("NoSuchKey", "404"):
                return True  # gone already (a retry of a delete whose response was lost)
            if code in _PRECONDITION_FAILED:
                return False
            raise

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return True
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        full = self._key(prefix).rstrip("/") + "/"
        strip = len(self.prefix) + 1 if self.prefix else 0
        extra = {"StartAfter": self._key(start_after)} if start_after is not None else {}
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full, **extra):
            keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)

    def children(self, prefix: str) -> list[str]:
        full = self._key(prefix).rstrip("/") + "/"
        names: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full, Delimiter="/"):
            common = page.get("CommonPrefixes", [])
            names.extend(p["Prefix"][len(full) :].rstrip("/") for p in common)
        return sorted(names)

    def sizes(self, prefix: str) -> dict[str, int]:
        full = self._key(prefix).rstrip("/") + "/"
        strip = len(self.prefix) + 1 if self.prefix else 0
        found: dict[str, int] = {}
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            found.update((o["Key"][strip:], int(o["Size"])) for o in page.get("Contents", []))
        return found

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            if chunk:
                self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self._key(k)} for k in chunk], "Quiet": True},
                )


_PRECONDITION_FAILED = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


def _error_code(error: Exception) -> str:
    response = getattr(error, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


_INTERNAL = re.compile(r"^\..+\.(?:tmp|lock)$")
FOLDER_LOCK = ".streamkeeper.lock"  # a local store's compare-and-swap lock, per folder


def _internal(name: str) -> bool:
    """A local store's own file: a write in progress (`.name.uuid.tmp`) or a lock
    (`FOLDER_LOCK`; `.name.lock` from earlier versions). Other names starting with a dot
    are keys like any other (Spark's `.1.delta.crc` in a self-contained savepoint), as
    they are on S3."""
    return _INTERNAL.match(name) is not None


def _collect_keys(directory: str, inner: str, after: str | None, found: list[str]) -> None:
    """Keys (relative to the listed prefix) below `directory` that sort after `after`.

    A long-lived lineage's markers folder holds one file per checkpoint, and a status
    asks for the few after a recent one: names are compared before anything else is
    done with them, and a subfolder whose keys all sort before `after` is not opened.
    Reads each directory once and stats nothing (`DirEntry.is_dir` comes from readdir).
    """
    try:
        entries = os.scandir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return
    with entries:
        for entry in entries:
            relative = inner + entry.name
            if entry.is_dir(follow_symlinks=False):
                below = relative + "/"
                if after is None or below > after or after.startswith(below):
                    _collect_keys(entry.path, below, after, found)
            elif (after is None or relative > after) and not _internal(entry.name):
                found.append(relative)
