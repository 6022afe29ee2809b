"""Airflow's REST API, called with the logged-in user's own token.

The page never holds a credential of its own: the JWT that authenticated the request
to the plugin (the `Authorization` header, else Airflow's `_token` cookie) is sent on
to `/api/v2`, so Airflow's auth manager decides what this user may trigger or read,
exactly as if they had used Airflow's own UI, and its audit log names them.

Where the token goes is configuration, never the request: `[streamkeeper]
airflow_api_url` (https unless it is a loopback address), else this api-server's own
loopback address from `[api] host`/`port`. A request's `Host` header names whatever the
client likes; sending the user's token there would hand it, and the api-server's
network position, to them. Every path segment is quoted, and `.`/`..` refused, so a
value can only ever be one segment of the path it was meant for.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

COOKIE_NAME_JWT_TOKEN = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager
TIMEOUT_S = 30.0


@dataclass(frozen=True)
class AirflowReply:
    """Airflow's answer, passed on to the page as it came (status and body)."""

    status: int
    body: Any


def user_token(authorization: str | None, cookies: dict[str, str]) -> str | None:
    """The JWT the request was authenticated with: a Bearer header wins over the cookie,
    as in Airflow's own `get_user`."""
    if authorization and authorization.lower().startswith("bearer "):
        return authorization.split(" ", 1)[1].strip() or None
    return cookies.get(COOKIE_NAME_JWT_TOKEN) or None


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _checked_url(url: str) -> str:
    """`[streamkeeper] airflow_api_url`, checked: http(s), no credentials, https unless loopback."""
    parts = urlsplit(url)
    fix = "set it to https://<airflow api-server> or http://127.0.0.1:<[api] port>"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"Invalid [streamkeeper] airflow_api_url {url!r}; {fix}")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(
            f"Invalid [streamkeeper] airflow_api_url {url!r}: no credentials, query or "
            f"fragment (the user's own token is sent); {fix}"
        )
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        raise ValueError(
            f"Invalid [streamkeeper] airflow_api_url {url!r}: a non-loopback Airflow API must "
            f"be reached over https (every call carries the user's token); {fix}"
        )
    return url.rstrip("/")


def api_base_url(
    configured: str | None, *, base_url: str | None, host: str, port: str, ssl: bool
) -> str:
    """Where Airflow's API is, from configuration only (never from a request).

    Args:
        configured: `[streamkeeper] airflow_api_url`; wins when set.
        base_url: `[api] base_url`: only its path is kept (a deployment under a prefix).
        host, port: `[api] host` and `[api] port`: the api-server this plugin runs in.
        ssl: whether the api-server serves https (`[api] ssl_cert` set).

    Raises:
        ValueError: a configured URL that is not http(s), carries credentials, or is
            plain http to a non-loopback host; an api-server bound to no loopback address.
    """
    if configured:
        return _checked_url(configured)
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if not _is_loopback(host):
        raise ValueError(
            f"The api-server listens on [api] host {host!r}, not on a loopback address, so "
            "the page cannot reach it on this machine; set [streamkeeper] airflow_api_url "
            "to its https:// address"
        )
    netloc = f"[{host}]" if ":" in host else host
    prefix = urlsplit(base_url or "").path.rstrip("/")
    return f"{'https' if ssl else 'http'}://{netloc}:{port}{prefix}"


def configured_api_url() -> str:
    """`api_base_url` from Airflow's configuration."""
    from airflow.configuration import conf

    from streamkeeper_airflow.settings import option

    return api_base_url(
        option("airflow_api_url"),
        base_url=conf.get("api", "base_url", fallback=None),
        host=conf.get("api", "host", fallback="0.0.0.0"),
        port=conf.get("api", "port", fallback="8080"),
        ssl=bool(conf.get("api", "ssl_cert", fallback="")),
    )


def api_path(*segments: str) -> str:
    """`/api/v2/` and the segments, each quoted whole.

    Raises:
        ValueError: an empty, `.` or `..` segment (quoting leaves dots as they are).
    """
    for segment in segments:
        if segment in ("", ".", ".."):
            raise ValueError(f"Invalid path segment {segment!r} for Airflow's API")
    return "/api/v2/" + "/".join(quote(s, safe="") for s in segments)


class AirflowApi:
    """A few calls of Airflow's public API, as one user.

    Args:
        base_url: where Airflow's API server is (`configured_api_url()`).
        token: the user's JWT.
    """

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}

    def trigger(self, dag_id: str, conf: dict[str, Any], note: str) -> AirflowReply:
        """`POST /api/v2/dags/{dag_id}/dagRuns`: a manual run now."""
        body = {"logical_date": None, "conf": conf, "note": note}
        return self._call("POST", api_path("dags", dag_id, "dagRuns"), body)

    def dag_run(self, dag_id: str, run_id: str) -> AirflowReply:
        return self._call("GET", api_path("dags", dag_id, "dagRuns", run_id))

    def recent_runs(self, dag_ids: list[str], limit: int = 10) -> AirflowReply:
        """The newest runs of these DAGs (one call: the batch list endpoint)."""
        body = {"dag_ids": dag_ids, "page_limit": limit, "order_by": "-run_after"}
        return self._call("POST", api_path("dags", "~", "dagRuns", "list"), body)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> AirflowReply:
        try:
            with httpx.Client(timeout=TIMEOUT_S) as http:
                response = http.request(
                    method, self.base_url + path, json=body, headers=self.headers
                )
        except httpx.HTTPError as error:
            detail = (
                f"Airflow's API at {self.base_url} did not answer ({type(error).__name__}); "
                "set [streamkeeper] airflow_api_url to where it is"
            )
            return AirflowReply(502, {"detail": detail})
        try:
            payload = response.json()
        except ValueError:
            payload = {"detail": response.text[:500]}
        return AirflowReply(response.status_code, payload)
