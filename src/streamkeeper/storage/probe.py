"""The start-up probe: fail fast, with the fix, when storage cannot be used."""

from __future__ import annotations

import uuid

from streamkeeper.errors import StorageError
from streamkeeper.storage.location import Location
from streamkeeper.storage.objects import LocalStore, S3Store


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
