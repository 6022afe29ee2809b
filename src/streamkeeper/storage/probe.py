"""The start-up probe: fail fast, with the fix, when storage cannot be used.

A server that is restarting, overloaded or behind a flaky network is retried for a few
seconds and at least four times (with `S3Store(fail_fast=True)`'s short timeouts, an
unreachable endpoint fails within about 10 s); a refusal that no retry can change
(credentials, a missing bucket) fails at once.
"""

from __future__ import annotations

import errno
import uuid
from typing import Any

from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_all,
    stop_before_delay,
    wait_exponential,
)

from streamkeeper.errors import UnusableRootError
from streamkeeper.storage.location import Location
from streamkeeper.storage.objects import LocalStore, S3Store

RETRY_SECONDS = 5.0  # no new attempt starts later than this after the first
# ...unless fewer attempts ran: on a loaded machine one slow attempt can use the 5 s, and
# a start must not fail on a server that answered once with a transient error.
MIN_ATTEMPTS = 4
# Answers a busy or restarting S3 server gives; anything else is final.
TRANSIENT_CODES = frozenset(
    {
        "500",
        "502",
        "503",
        "504",
        "InternalError",
        "ServiceUnavailable",
        "SlowDown",
        "RequestTimeout",
    }
)
CREDENTIAL_CODES = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"})
MISSING_BUCKET_CODES = frozenset({"NoSuchBucket", "404"})


def probe(location: Location, *, retry_seconds: float = RETRY_SECONDS) -> None:
    """Fail fast, with the fix, when storage is unreachable or refuses our credentials.

    Writes and deletes one small object below the location. Transient S3 errors
    (connection refused, reset or closed without a response, timeouts, 5xx, SlowDown)
    are retried for `retry_seconds` and at least `MIN_ATTEMPTS` times; refused
    credentials and a missing bucket are not.

    Raises:
        UnusableRootError: naming the location, the cause and the fix.
    """
    try:
        if location.is_s3:
            store = S3Store(location, fail_fast=True)
            retrying = Retrying(
                retry=retry_if_exception(is_transient),
                stop=stop_all(stop_before_delay(retry_seconds), stop_after_attempt(MIN_ATTEMPTS)),
                wait=wait_exponential(multiplier=0.25, max=2),
                reraise=True,
            )
            retrying(_probe_s3, store)
        else:
            _probe_local(location)
    except Exception as error:  # noqa: BLE001 - translated into an actionable message
        raise UnusableRootError(_explain_storage_failure(location, error)) from error


def _probe_s3(store: S3Store) -> None:
    # A fresh key per attempt: a retried PUT whose first response was lost is harmless.
    key = f"_probe/{uuid.uuid4().hex}.json"
    # Some servers create a missing bucket on PUT; a typo must not do that.
    store.client.head_bucket(Bucket=store.bucket)
    store.write_json(key, {"probe": True})
    store.delete([key])


def _probe_local(location: Location) -> None:
    store = location.store()
    key = f"_probe/{uuid.uuid4().hex}.json"
    store.write_json(key, {"probe": True})
    store.delete([key])
    if isinstance(store, LocalStore):
        # Another driver starting on this root may be probing too: its file keeps the
        # folder (and it removes the folder itself), so a folder not empty is no error.
        try:
            (store.root / "_probe").rmdir()
        except OSError as error:
            if error.errno not in (errno.ENOTEMPTY, errno.ENOENT):
                raise


def error_code(error: BaseException) -> str:
    """The S3 error code (or HTTP status) of a botocore error; '' if it has no response.

    Connection errors (refused, reset, closed, timed out) carry no response at all, and
    some errors carry `response = None`.
    """
    response: Any = getattr(error, "response", None)
    if not isinstance(response, dict):
        return ""
    details = response.get("Error")
    code = details.get("Code") if isinstance(details, dict) else None
    if code:
        return str(code)
    metadata = response.get("ResponseMetadata")
    status = metadata.get("HTTPStatusCode") if isinstance(metadata, dict) else None
    return str(status) if status else ""


def is_transient(error: BaseException) -> bool:
    """True for errors a retry a moment later may not see again."""
    from botocore.exceptions import (
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
        ResponseStreamingError,
        SSLError,
    )

    if isinstance(error, SSLError):
        return False  # a TLS misconfiguration stays one
    transient_types = (
        EndpointConnectionError,  # refused, or no route yet (a server starting up)
        ConnectTimeoutError,
        ConnectionClosedError,  # reset, or closed without a response
        ReadTimeoutError,
        ResponseStreamingError,
        ConnectionError,  # the built-in one: refused, reset, broken pipe
        TimeoutError,
    )
    return isinstance(error, transient_types) or error_code(error) in TRANSIENT_CODES


def _explain_storage_failure(location: Location, error: Exception) -> str:
    text = f"{type(error).__name__}: {error}"
    if not location.is_s3:
        return f"cannot write to {location.uri!r} ({text}); check the path exists and is writable"
    endpoint = (location.s3.endpoint_url if location.s3 else None) or "AWS"
    code = error_code(error)
    if code in CREDENTIAL_CODES:
        return (
            f"object storage at {endpoint} refused the credentials for {location.uri!r} "
            f"({code}); check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    if code in MISSING_BUCKET_CODES:
        return (
            f"bucket {location.bucket!r} does not exist at {endpoint} (for {location.uri!r}); "
            "create it first, or fix storage.root"
        )
    if code in TRANSIENT_CODES:
        return (
            f"object storage at {endpoint} kept failing for {location.uri!r} ({text}); it is "
            "overloaded or unhealthy: check the server, then start again"
        )
    return (
        f"cannot reach object storage at {endpoint} for {location.uri!r} ({text}); "
        "check storage.endpoint_url or AWS_ENDPOINT_URL and that the server is running"
    )
