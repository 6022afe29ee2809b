"""Storage locations as URIs: a local path (the embedded default) or s3:// (any S3 API).

One `Location` is a picklable description of where something lives and how to reach
it. It hands out the three clients that reach it: a key-value `ObjectStore` for our own
small JSON files (boto3 or the local file system), a pyarrow file system for Parquet
(used on executors), and delta-rs storage options.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from streamkeeper.errors import StorageError
from streamkeeper.storage.credentials import signing_credentials

if TYPE_CHECKING:
    import pyarrow.fs

    from streamkeeper.spec import StorageSpec
    from streamkeeper.storage.objects import ObjectStore


ROLE_ARN_VARIABLE = "STREAMKEEPER_S3_ROLE_ARN"


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3 endpoint. Credentials come from the environment, never a spec."""

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    allow_http: bool = False
    session_token: str | None = field(default=None, repr=False)
    # A role assumed with the credentials above (credentials.py); STREAMKEEPER_S3_ROLE_ARN
    # in a driver's environment (AWS_ROLE_ARN is the default chain's web identity).
    role_arn: str | None = None
    role_session_name: str = "streamkeeper"
    role_duration_seconds: int | None = None  # None: the role's own (STS: an hour)

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
            session_token=os.environ.get("AWS_SESSION_TOKEN") or None,
            role_arn=os.environ.get(ROLE_ARN_VARIABLE) or None,
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
        access_key, secret_key, token = signing_credentials(self.s3)
        for name, value in (
            ("AWS_ACCESS_KEY_ID", access_key),
            ("AWS_SECRET_ACCESS_KEY", secret_key),
            ("AWS_SESSION_TOKEN", token),
        ):
            if value:
                options[name] = value
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
        access_key, secret_key, token = signing_credentials(s3)
        return pafs.S3FileSystem(
            access_key=access_key,
            secret_key=secret_key,
            session_token=token,
            region=s3.region,
            endpoint_override=endpoint.netloc if endpoint else None,
            scheme=endpoint.scheme if endpoint else "https",
            connect_timeout=5,
            request_timeout=30,
            # Six attempts with exponential back-off and no retry quota: the default
            # (standard: three attempts, and a quota per client that faults drain, after
            # which nothing is retried) failed writes and reads under a few % of 503s.
            retry_strategy=pafs.AwsDefaultS3RetryStrategy(max_attempts=6),
        )

    def store(self, *, fail_fast: bool = False) -> ObjectStore:
        """A small-object store rooted here.

        Args:
            fail_fast: S3 calls give up in seconds instead of riding out an outage (for
                writes that are repeated anyway, like a heartbeat's); local files ignore it.
        """
        from streamkeeper.storage.objects import LocalStore, S3Store

        if self.is_s3:
            return S3Store(self, fail_fast=fail_fast)
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
