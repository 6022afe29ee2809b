"""An Airflow connection as a streamkeeper storage root: where it is and how to reach it.

Connection type `streamkeeper` (its form in Airflow's UI: connection_form.py):

    host      the S3 endpoint URL, e.g. http://127.0.0.1:8333 (empty: AWS itself)
    login     the access key id
    password  the secret access key
    extra     {"root": "s3://bucket/prefix", "region": "us-east-1", "allow_http": true,
               "role_arn": "arn:aws:iam::123456789012:role/streaming"}
              (the form's fields Storage root, Region, Allow plain HTTP, Role ARN)

`role_arn`: every client (the Airflow side's and the drivers') assumes that role with
the connection's key, or with the default AWS chain when there is none, and refreshes
its temporary credentials (streamkeeper/storage/credentials.py). Without a key and a
role, the default chain (IRSA, container and instance roles, profiles) is used as is.

`root` may also be a local absolute path (the embedded default needs no credentials).
An `aws` connection (the Amazon provider's) is read too: login/password, or
`aws_access_key_id`/`aws_secret_access_key`/`aws_session_token` in extra; `endpoint_url`,
`region_name` and `role_arn` in extra; `root` in extra as above. A `generic` connection
takes the streamkeeper fields.

The credentials never appear in `repr`, in an error message, or in a driver's command
line (they reach a driver through its environment only).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlparse

from streamkeeper_airflow.errors import ConnectionConfigError

CONN_TYPE = "streamkeeper"
ACCEPTED_TYPES = (CONN_TYPE, "aws", "generic", "")
EXAMPLE_EXTRA = '{"root": "s3://bucket/prefix", "region": "us-east-1"}'
ROLE_ARN_PATTERN = r"arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]{1,512}"
# The variable a driver reads the role from (storage/location.py; not AWS_ROLE_ARN, which
# the default chain takes for web identity).
ROLE_ARN_VARIABLE = "STREAMKEEPER_S3_ROLE_ARN"


class ConnectionLike(Protocol):
    """What is read from an Airflow connection (airflow.sdk.Connection has it)."""

    conn_id: str
    conn_type: str | None
    host: str | None
    port: int | None
    login: str | None
    password: str | None

    @property
    def extra_dejson(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ConnectionSettings:
    """A parsed connection. `repr` shows neither the access key nor the secret."""

    conn_id: str
    root: str | None
    endpoint_url: str | None = None
    region: str = "us-east-1"
    allow_http: bool = False
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    role_arn: str | None = None

    @classmethod
    def from_connection(cls, conn: ConnectionLike) -> ConnectionSettings:
        """Parse an Airflow connection.

        Raises:
            ConnectionConfigError: an unsupported type, a malformed extra or root (the
                message names the connection, the field and the fix, never a secret).
        """
        conn_type = (conn.conn_type or "").lower()
        if conn_type not in ACCEPTED_TYPES:
            raise ConnectionConfigError(
                f"connection {conn.conn_id!r} has type {conn.conn_type!r}; expected "
                f"{CONN_TYPE!r} (or 'aws'/'generic' with the same fields): host = endpoint "
                f"URL, login/password = access key/secret, extra = {EXAMPLE_EXTRA}"
            )
        extra = _extra(conn)
        endpoint = _endpoint(conn, conn_type, extra)
        allow_http = _flag(conn.conn_id, extra, "allow_http")
        return cls(
            conn_id=conn.conn_id,
            root=_root(conn.conn_id, extra.get("root")),
            endpoint_url=endpoint,
            region=str(extra.get("region") or extra.get("region_name") or "us-east-1"),
            allow_http=bool(endpoint and endpoint.startswith("http://"))
            if allow_http is None
            else allow_http,
            access_key=conn.login or extra.get("aws_access_key_id") or None,
            secret_key=conn.password or extra.get("aws_secret_access_key") or None,
            session_token=extra.get("aws_session_token") or None,
            role_arn=_role_arn(conn.conn_id, extra.get("role_arn")),
        )

    @property
    def secrets(self) -> tuple[str, ...]:
        """Values that must never be shown: the access key, the secret, the token."""
        return tuple(s for s in (self.secret_key, self.access_key, self.session_token) if s)

    def s3_settings(self) -> Any:
        """`streamkeeper.storage.S3Settings` for the client (imported here: light)."""
        from streamkeeper.storage import S3Settings

        return S3Settings(
            endpoint_url=self.endpoint_url,
            region=self.region,
            access_key=self.access_key,
            secret_key=self.secret_key,
            allow_http=self.allow_http,
            session_token=self.session_token,
            role_arn=self.role_arn,
        )

    def driver_env(self) -> dict[str, str]:
        """The AWS_* variables a driver process reads its storage settings from."""
        env = {"AWS_REGION": self.region, "AWS_ALLOW_HTTP": str(self.allow_http).lower()}
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL"] = self.endpoint_url
        if self.access_key:
            env["AWS_ACCESS_KEY_ID"] = self.access_key
        if self.secret_key:
            env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        if self.session_token:
            env["AWS_SESSION_TOKEN"] = self.session_token
        if self.role_arn:
            env[ROLE_ARN_VARIABLE] = self.role_arn
        return env


def _extra(conn: ConnectionLike) -> dict[str, Any]:
    try:
        extra = conn.extra_dejson
    except Exception:  # noqa: BLE001 - its text may hold a secret: name only the field
        extra = None
    if not isinstance(extra, dict):
        raise ConnectionConfigError(
            f"connection {conn.conn_id!r}: extra is not a JSON object; expected e.g. "
            f"{EXAMPLE_EXTRA}"
        )
    return extra


def _endpoint(conn: ConnectionLike, conn_type: str, extra: dict[str, Any]) -> str | None:
    """The endpoint URL: extra's endpoint_url, else the host (with a scheme and the port)."""
    explicit = extra.get("endpoint_url") or (extra.get("host") if conn_type == "aws" else None)
    if explicit:
        return str(explicit).rstrip("/")
    host = (conn.host or "").strip()
    if conn_type == "aws" or not host:
        return None
    if "://" not in host:
        scheme = "http" if extra.get("allow_http") in (True, "true", "True") else "https"
        host = f"{scheme}://{host}"
    parsed = urlparse(host)
    if conn.port and not parsed.port:
        host = f"{parsed.scheme}://{parsed.hostname}:{conn.port}{parsed.path}"
    return host.rstrip("/")


def _flag(conn_id: str, extra: dict[str, Any], name: str) -> bool | None:
    value = extra.get(name)
    if value is None or isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ConnectionConfigError(
        f"connection {conn_id!r}: extra.{name} is {value!r}; expected true or false"
    )


def _role_arn(conn_id: str, value: Any) -> str | None:
    """An IAM role ARN (arn:PARTITION:iam::ACCOUNT:role/NAME), or None."""
    if value is None or value == "":
        return None
    text = str(value).strip()
    if not re.fullmatch(ROLE_ARN_PATTERN, text):
        raise ConnectionConfigError(
            f"connection {conn_id!r}: extra.role_arn {text!r} is not a role ARN; expected "
            "arn:aws:iam::123456789012:role/NAME (or leave it empty)"
        )
    return text


def _root(conn_id: str, root: Any) -> str | None:
    """The storage root: s3://bucket/prefix or an absolute local path (workers differ in cwd)."""
    if root is None or root == "":
        return None
    text = str(root).rstrip("/")
    parsed = urlparse(text)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise ConnectionConfigError(
                f"connection {conn_id!r}: extra.root {text!r} has no bucket; expected "
                "s3://bucket/prefix"
            )
        return text
    path = parsed.path if parsed.scheme == "file" else text
    if parsed.scheme not in ("", "file") or not os.path.isabs(path):
        raise ConnectionConfigError(
            f"connection {conn_id!r}: extra.root {text!r} is neither s3://bucket/prefix nor "
            "an absolute local path; a relative path would depend on each worker's directory"
        )
    return path
