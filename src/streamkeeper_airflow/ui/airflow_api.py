"""Airflow's REST API, called with the logged-in user's own token.

The page never holds a credential of its own: the JWT that authenticated the request
to the plugin (the `Authorization` header, else Airflow's `_token` cookie) is sent on
to `/api/v2`, so Airflow's auth manager decides what this user may trigger or read,
exactly as if they had used Airflow's own UI, and its audit log names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

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


class AirflowApi:
    """A few calls of Airflow's public API, as one user.

    Args:
        base_url: where Airflow's API server is (`[api] base_url`, else this request's
            own origin: the plugin runs inside the api-server).
        token: the user's JWT.
    """

    def __init__(self, base_url: str, token: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"}

    def trigger(self, dag_id: str, conf: dict[str, Any], note: str) -> AirflowReply:
        """`POST /api/v2/dags/{dag_id}/dagRuns`: a manual run now."""
        body = {"logical_date": None, "conf": conf, "note": note}
        return self._call("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)

    def dag_run(self, dag_id: str, run_id: str) -> AirflowReply:
        return self._call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{quote(run_id, safe='')}")

    def recent_runs(self, dag_ids: list[str], limit: int = 10) -> AirflowReply:
        """The newest runs of these DAGs (one call: the batch list endpoint)."""
        body = {"dag_ids": dag_ids, "page_limit": limit, "order_by": "-run_after"}
        return self._call("POST", "/api/v2/dags/~/dagRuns/list", body)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> AirflowReply:
        with httpx.Client(timeout=TIMEOUT_S) as http:
            response = http.request(method, self.base_url + path, json=body, headers=self.headers)
        try:
            payload = response.json()
        except ValueError:
            payload = {"detail": response.text[:500]}
        return AirflowReply(response.status_code, payload)
