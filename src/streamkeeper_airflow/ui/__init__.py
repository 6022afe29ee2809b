"""The operations page: an Airflow plugin view over every streaming job.

`streamkeeper_airflow.plugin` (registered by the provider) mounts `build_app()` at
`/streamkeeper` and adds a nav entry showing it. The modules, by purpose: `summaries`
(the jobs table), `details` (one job's charts, savepoints, upgrades), `actions` (which
DAG run each button asks for), `access` (which jobs a user may see and act on: their
DAGs' permissions), `airflow_api` (Airflow's REST API with the user's token, at a
configured address), `app` (the routes), `static/` (the page: plain HTML, CSS and
JavaScript, no build step, nothing fetched from outside, nothing inline: the page's
Content-Security-Policy allows only its own files).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

URL_PREFIX = "/streamkeeper"


def upgrade_specs(jobs_folder: Path) -> dict[str, list[str]]:
    """Job name -> the spec files beside its spec (its versions), for the upgrade form."""
    from streamkeeper_airflow.dag_factory import find_jobs

    found = {}
    for entry in find_jobs(jobs_folder):
        folder = entry.spec_path.parent
        candidates = sorted(folder.glob("*.yaml")) + sorted(folder.glob("versions/*.yaml"))
        found[entry.name] = [str(p) for p in candidates if p != entry.spec_path]
    return found


def build_app(default_jobs_folder: Path) -> FastAPI:
    """The page's app, reading the control plane through the `streamkeeper_default`
    connection (`[streamkeeper] ui_conn_id` to change it) and the specs in the jobs folder."""
    from streamkeeper_airflow import settings
    from streamkeeper_airflow.hooks.streamkeeper import DEFAULT_CONN_ID, StreamkeeperHook
    from streamkeeper_airflow.ui.app import create_app

    conn_id = settings.option("ui_conn_id", DEFAULT_CONN_ID) or DEFAULT_CONN_ID
    return create_app(
        client_factory=lambda: StreamkeeperHook(conn_id).client,
        spec_jobs=lambda: upgrade_specs(settings.jobs_folder(default_jobs_folder)),
        secrets=lambda: StreamkeeperHook(conn_id).settings.secrets,
    )
