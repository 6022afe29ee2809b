"""The credentials an S3 client signs with: the settings' own, or a role assumed with them.

Without `role_arn`: the settings' static key (with its session token, if any), or, when
there is none, boto3's default chain (web identity / IRSA, container and instance roles,
profiles), each client resolving it itself; with a web-identity token file, botocore's
chain signs for every client (pyarrow's SDK would ask AWS's STS, not the endpoint's).

With `role_arn`: the role is assumed through STS with those credentials. STS is asked at
the settings' endpoint when one is set (S3-compatible stores such as MinIO, Ceph RGW and
SeaweedFS answer STS on their S3 port), else at AWS's regional STS. botocore refreshes
the temporary credentials before they expire (15 minutes ahead); one refreshing object
per role and base identity serves every client of the process, so a driver that runs
for days never signs with an expired key. Clients that take fixed credentials (pyarrow's
file system, delta-rs) get the current ones each time they are built.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from streamkeeper.errors import StorageError

if TYPE_CHECKING:
    import botocore.session

    from streamkeeper.storage.location import S3Settings

_LOCK = threading.Lock()
_ROLES: dict[tuple[str | None, ...], Any] = {}


def botocore_session(s3: S3Settings) -> botocore.session.Session:
    """A botocore session signing as `s3` says (a role's credentials refresh themselves)."""
    import botocore.session

    session = botocore.session.Session()
    if s3.role_arn:
        # botocore's own way to hand a session refreshing credentials (as its
        # assume-role provider does); the public setter only takes fixed ones.
        session._credentials = assumed_role(s3)
    elif s3.access_key:
        session.set_credentials(s3.access_key, s3.secret_key, s3.session_token)
    return session


def signing_credentials(s3: S3Settings) -> tuple[str | None, str | None, str | None]:
    """Access key, secret and session token to sign with now (all None: the default
    chain, which the client resolves itself)."""
    if s3.role_arn:
        chain = assumed_role(s3)
    elif s3.access_key or not os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return s3.access_key, s3.secret_key, s3.session_token
    else:
        # Web identity (IRSA): pyarrow's SDK asks AWS's STS whatever the endpoint, while
        # botocore asks where AWS_ENDPOINT_URL_STS / AWS_ENDPOINT_URL say: every client
        # signs with botocore's refreshing credentials, one chain per process.
        chain = _web_identity()
        if chain is None:
            return None, None, None
    frozen = chain.get_frozen_credentials()
    return frozen.access_key, frozen.secret_key, frozen.token


def _web_identity() -> Any:
    import botocore.session

    with _LOCK:
        if ("web-identity",) not in _ROLES:
            _ROLES[("web-identity",)] = botocore.session.Session().get_credentials()
        return _ROLES[("web-identity",)]


def assumed_role(s3: S3Settings) -> Any:
    """The process's refreshing credentials of `s3.role_arn` for this base identity."""
    key = (s3.role_arn, s3.role_session_name, s3.access_key, s3.endpoint_url, s3.region)
    key += (str(s3.role_duration_seconds),)
    with _LOCK:
        credentials = _ROLES.get(key)
        if credentials is None:
            credentials = _ROLES[key] = _refreshing(s3)
        return credentials


def _refreshing(s3: S3Settings) -> Any:
    import botocore.session
    from botocore.config import Config
    from botocore.credentials import AssumeRoleCredentialFetcher, DeferredRefreshableCredentials
    from botocore.exceptions import BotoCoreError, ClientError

    base = botocore.session.Session()
    if s3.access_key:
        base.set_credentials(s3.access_key, s3.secret_key, s3.session_token)
    source = base.get_credentials()
    if source is None:
        raise StorageError(
            f"role {s3.role_arn!r} cannot be assumed: no credentials to assume it with; "
            "give the connection an access key, or run where the default AWS chain has "
            "an identity (web identity, instance or container role, profile)"
        )
    where = s3.endpoint_url or f"AWS STS ({s3.region})"
    config = Config(connect_timeout=5, read_timeout=30, retries={"total_max_attempts": 5})

    def sts_client(service: str, **credentials: Any) -> Any:
        return base.create_client(
            service, region_name=s3.region, endpoint_url=s3.endpoint_url, config=config,
            **credentials,
        )  # fmt: skip

    fetcher = AssumeRoleCredentialFetcher(
        sts_client,
        source,
        s3.role_arn,
        extra_args={
            "RoleSessionName": s3.role_session_name,
            **({"DurationSeconds": s3.role_duration_seconds} if s3.role_duration_seconds else {}),
        },
    )

    def fetch() -> dict[str, Any]:
        try:
            return fetcher.fetch_credentials()
        except (ClientError, BotoCoreError) as error:
            raise StorageError(
                f"could not assume role {s3.role_arn!r} at {where}: {error}; check that the "
                "role exists and that its trust policy allows the connection's identity "
                "(sts:AssumeRole)"
            ) from error

    return DeferredRefreshableCredentials(refresh_using=fetch, method="assume-role")
