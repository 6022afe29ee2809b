"""The streamkeeper Airflow plugin: the operations page (a nav entry and its FastAPI app).

Registered by the provider distribution (provider/pyproject.toml) as an `airflow.plugins`
entry point and in its provider info, so installing the provider is enough: nothing goes
into a plugins folder (a copy there would be loaded twice, "already registered"). The page
lives in `streamkeeper_airflow.ui`; it reads the specs in `[streamkeeper] jobs_folder`,
by default `jobs/` beside the DAG folder (where the DAG files look too).
"""

from __future__ import annotations

from pathlib import Path

from airflow.plugins_manager import AirflowPlugin

from streamkeeper_airflow.ui import URL_PREFIX, build_app


def default_jobs_folder() -> Path:
    """`jobs/` beside `[core] dags_folder`: the DAG files' own default."""
    try:
        from airflow.configuration import conf

        dags = conf.get("core", "dags_folder", fallback="") or ""
    except Exception:  # noqa: BLE001 - outside a configured Airflow
        dags = ""
    return Path(dags).resolve().parent / "jobs" if dags else Path.cwd() / "jobs"


class StreamkeeperPlugin(AirflowPlugin):
    """The `Streaming jobs` page: Airflow shows `/streamkeeper/` in its frame at
    `/plugin/streamkeeper`; the app checks the user's Airflow login itself."""

    name = "streamkeeper"
    fastapi_apps = [
        {"app": build_app(default_jobs_folder()), "url_prefix": URL_PREFIX, "name": "streamkeeper"}
    ]
    external_views = [
        {
            "name": "Streaming jobs",
            "href": f"{URL_PREFIX}/",
            "url_route": "streamkeeper",
            "destination": "nav",
        }
    ]
