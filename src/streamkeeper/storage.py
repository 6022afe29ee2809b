"""Storage locations as URIs: a local path (the embedded default) or s3:// (any S3 API).

One `Location` is a picklable description of where something lives and how to reach
it. It hands out the three clients that reach it: a key-value `ObjectStore` for our own
small JSON files (boto3 or the local file system), a pyarrow file system for Parquet
(used on executors), and delta-rs storage options.
"""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from streamkeeper.errors import StorageError

if TYPE_CHECKING:
    import pyarrow.fs

    from streamkeeper.spec import StorageSpec


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3 endpoint. Credentials come from the environment, never a spec."""

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    allow_http: bool = False

    @classmethod
    def from_env(cls, spec: StorageSpec | None = None) -> S3Settings:
        """Spec values win over AWS_* environment variables."""
        endpoint = (spec.endpoint_url if spec else None) or os.environ.get("AWS_ENDPOINT_URL")
        region = (spec.region if spec else None) or os.environ.get("AWS_REGION", "us-east-1")
        allow_http = spec.allow_http if spec and spec.allow_http is not None else None
        if allow_http is None:
            allow_http = os.environ.get("AWS_ALLOW_HTTP", "").lower() == "true" or bool(
                endpoint and endpoint.startswith("http://")
            )
        return cls(
            endpoint_url=endpoint,
            region=region,
            access_key=os.environ.get("AWS_ACCESS_KEY_ID"),
            secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY"),
            allow_http=allow_http,
        )


@dataclass(frozen=True)
class Location:
    """A directory-like location: `/abs/path` or `s3://bucket/prefix`."""

    uri: str
    s3: S3Settings | None = None

    @property
    def is_s3(self) -> bool:
        return self.uri.startswith("s3://")

    @property
    def bucket(self) -> str:
        return urlparse(self.uri).netloc

    @property
    def key_prefix(self) -> str:
        return urlparse(self.uri).path.lstrip("/").rstrip("/")

    @property
    def fs_path(self) -> str:
        """The path as pyarrow's file system wants it (bucket/prefix for S3)."""
        if self.is_s3:
            return f"{self.bucket}/{self.key_prefix}".rstrip("/")
        return self.uri

    def child(self, relative: str) -> Location:
        """A location below this one; refuses paths that escape it."""
        return replace(self, uri=join_under(self.uri, relative))

    def storage_options(self) -> dict[str, str]:
        """Options for delta-rs (`DeltaTable(..., storage_options=...)`)."""
        if not self.is_s3 or self.s3 is None:
            return {}
        options = {"AWS_REGION": self.s3.region, "AWS_ALLOW_HTTP": str(self.s3.allow_http).lower()}
        if self.s3.endpoint_url:
            options["AWS_ENDPOINT_URL"] = self.s3.endpoint_url
        if self.s3.access_key:
            options["AWS_ACCESS_KEY_ID"] = self.s3.access_key
        if self.s3.secret_key:
            options["AWS_SECRET_ACCESS_KEY"] = self.s3.secret_key
        # Concurrent writers are made safe by S3 conditional puts (If-None-Match).
        options["AWS_S3_LOCKING_PROVIDER"] = "none"
        options["AWS_CONDITIONAL_PUT"] = "etag"
        return options

    def arrow_filesystem(self) -> pyarrow.fs.FileSystem:
        """A pyarrow file system for Parquet reads and writes (executor side)."""
        import pyarrow.fs as pafs

        if not self.is_s3:
            return pafs.LocalFileSystem()
        s3 = self.s3 or S3Settings()
        endpoint = urlparse(s3.endpoint_url) if s3.endpoint_url else None
        return pafs.S3FileSystem(
            access_key=s3.access_key,
            secret_key=s3.secret_key,
            region=s3.region,
            endpoint_override=endpoint.netloc if endpoint else None,
            scheme=endpoint.scheme if endpoint else "https",
            connect_timeout=5,
            request_timeout=30,
        )

    def store(self) -> ObjectStore:
        """A small-object store rooted here."""
        if self.is_s3:
            return S3Store(self)
        return LocalStore(Path(self.uri))


def join_under(root: str, relative: str) -> str:
    """Join `relative` below `root`; absolute URIs pass through; `..` escapes are refused."""
    if "://" in relative or relative.startswith("/"):
        return relative
    normalized = posixpath.normpath(relative)
    if normalized == ".." or normalized.startswith("../") or normalized == ".":
        raise StorageError(
            f"path {relative!r} escapes its root {root!r}; use a path inside the root "
            "or an absolute URI"
        )
    return root.rstrip("/") + "/" + normalized


def resolve_root(uri: str, base_dir: Path | None = None) -> str:
    """Make a local root absolute; s3:// URIs pass through; other schemes are refused."""
    scheme = urlparse(uri).scheme
    if scheme == "s3":
        if not urlparse(uri).netloc:
            raise StorageError(f"storage URI {uri!r} has no bucket; expected s3://bucket/prefix")
        return uri.rstrip("/")
    if scheme == "file":
        uri = urlparse(uri).path
    elif scheme:
        raise StorageError(
            f"unsupported storage URI {uri!r}; use a local path or s3://bucket/prefix"
        )
    path = Path(uri)
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    return str(path.resolve())


class ObjectStore:
    """Small JSON objects by key. Writes are atomic; `create` is put-if-absent."""

    def read_json(self, key: str) -> dict[str, Any] | None:
        raise NotImplementedError

    def write_json(self, key: str, value: dict[str, Any]) -> None:
        raise NotImplementedError

    def create_json(self, key: str, value: dict[str, Any]) -> bool:
        """Write only if absent. Returns False if the key already existed."""
        raise NotImplementedError

    def exists(self, key: str) -> bool:
        raise NotImplementedError

    def list(self, prefix: str) -> list[str]:
        """Keys under `prefix` (a folder path, no trailing slash), sorted."""
        raise NotImplementedError

    def delete(self, keys: list[str]) -> None:
        raise NotImplementedError


class LocalStore(ObjectStore):
    """The embedded default: files below a local directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / key

    def read_json(self, key: str) -> dict[str, Any] | None:
        try:
            return json.loads(self._path(key).read_text())
        except FileNotFoundError:
            return None

    def write_json(self, key: str, value: dict[str, Any]) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "w") as handle:
            json.dump(value, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)

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

    def exists(self, key: str) -> bool:
        return self._path(key).exists()

    def list(self, prefix: str) -> list[str]:
        folder = self._path(prefix)
        if not folder.is_dir():
            return []
        return sorted(
            f"{prefix}/{p.relative_to(folder).as_posix()}"
            for p in folder.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)


class S3Store(ObjectStore):
    """Objects below s3://bucket/prefix through boto3."""

    def __init__(self, location: Location, *, fail_fast: bool = False) -> None:
        import boto3
        from botocore.config import Config

        s3 = location.s3 or S3Settings()
        # A probe must answer in seconds; data-path calls ride out short outages.
        attempts = 1 if fail_fast else 5
        self.location = location
        self.bucket = location.bucket
        self.prefix = location.key_prefix
        self.client = boto3.client(
            "s3",
            endpoint_url=s3.endpoint_url,
            region_name=s3.region,
            aws_access_key_id=s3.access_key,
            aws_secret_access_key=s3.secret_key,
            config=Config(
                connect_timeout=2 if fail_fast else 5,
                read_timeout=10 if fail_fast else 30,
                retries={"total_max_attempts": attempts, "mode": "standard"},
            ),
        )

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def read_json(self, key: str) -> dict[str, Any] | None:
        try:
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except self.client.exceptions.NoSuchKey:
            return None
        return json.loads(body)

    def write_json(self, key: str, value: dict[str, Any]) -> None:
        self.client.put_object(
            Bucket=self.bucket, Key=self._key(key), Body=json.dumps(value).encode()
        )

    def create_json(self, key: str, value: dict[str, Any]) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=self._key(key),
                Body=json.dumps(value).encode(),
                IfNoneMatch="*",
            )
            return True
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in ("PreconditionFailed", "ConditionalRequestConflict", "412"):
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

    def list(self, prefix: str) -> list[str]:
        full = self._key(prefix).rstrip("/") + "/"
        strip = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=full):
            keys.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
        return sorted(keys)

    def delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):
            chunk = keys[start : start + 1000]
            if chunk:
                self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": self._key(k)} for k in chunk], "Quiet": True},
                )


def probe(location: Location) -> None:
    """Fail fast, with the fix, when storage is unreachable or refuses our credentials.

    Writes and deletes one small object below the location.
    """
    key = f"_probe/{uuid.uuid4().hex}.json"
    try:
        store = S3Store(location, fail_fast=True) if location.is_s3 else location.store()
        if isinstance(store, S3Store):
            # Some servers create a missing bucket on PUT; a typo must not do that.
            store.client.head_bucket(Bucket=store.bucket)
        store.write_json(key, {"probe": True})
        store.delete([key])
        if isinstance(store, LocalStore):
            (store.root / "_probe").rmdir()
    except Exception as error:  # noqa: BLE001 - translated into an actionable message
        raise StorageError(_explain_storage_failure(location, error)) from error


def _explain_storage_failure(location: Location, error: Exception) -> str:
    text = f"{type(error).__name__}: {error}"
    if not location.is_s3:
        return f"cannot write to {location.uri!r} ({text}); check the path exists and is writable"
    endpoint = location.s3.endpoint_url if location.s3 else None
    code = getattr(error, "response", {}).get("Error", {}).get("Code", "")
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
        return (
            f"object storage at {endpoint or 'AWS'} refused the credentials for {location.uri!r} "
            f"({code}); check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    if code in ("NoSuchBucket", "404"):
        return f"bucket {location.bucket!r} does not exist at {endpoint or 'AWS'}; create it first"
    return (
        f"cannot reach object storage at {endpoint or 'AWS'} for {location.uri!r} ({text}); "
        "check storage.endpoint_url or AWS_ENDPOINT_URL and that the server is running"
    )
