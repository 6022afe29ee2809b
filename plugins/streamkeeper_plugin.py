"""The streamkeeper Airflow plugin: the operations page (a nav entry and its FastAPI app).

Thin: the page lives in `streamkeeper_airflow.ui`. Hooks, operators, sensors and
triggers live in the importable `streamkeeper_airflow` package (a provider: the
triggerer imports triggers by class path), not here.
"""

from __future__ import annotations

from pathlib import Path

from airflow.plugins_manager import AirflowPlugin

from streamkeeper_airflow.ui import URL_PREFIX, build_app

JOBS = Path(__file__).resolve().parents[1] / "jobs"


class StreamkeeperPlugin(AirflowPlugin):
    """The `Streaming jobs` page: Airflow shows `/streamkeeper/` in its frame at
    `/plugin/streamkeeper`; the app checks the user's Airflow login itself."""

    name = "streamkeeper"
    fastapi_apps = [{"app": build_app(JOBS), "url_prefix": URL_PREFIX, "name": "streamkeeper"}]
    external_views = [
        {
            "name": "Streaming jobs",
            "href": f"{URL_PREFIX}/",
            "url_route": "streamkeeper",
            "destination": "nav",
        }
    ]
