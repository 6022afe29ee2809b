"""Small JSON objects by key, on the local file system or S3 (boto3)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from streamkeeper.storage.location import Location, S3Settings


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
        # A probe must answer in seconds (it retries transient errors itself, see probe.py);
        # data-path calls ride out short outages.
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
                read_timeout=3 if fail_fast else 30,
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
