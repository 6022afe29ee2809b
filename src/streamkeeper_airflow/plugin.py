"""The streamkeeper Airflow plugin: the operations page (a nav entry and its FastAPI app).

Loaded from the plugins folder (`plugins/streamkeeper_plugin.py` imports this class; a
deployment puts that one line in its own plugins folder). Not registered as an
`airflow.plugins` entry point: with an editable install Airflow finds that entry point
twice (the dist-info and the source tree's egg-info) and reports a duplicate. The page
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
