"""The streamkeeper Airflow plugin: registers nothing heavy yet (the UI page comes later).

Hooks, operators, sensors and triggers live in the importable `streamkeeper_airflow`
package (a provider: the triggerer imports triggers by class path), not here.
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class StreamkeeperPlugin(AirflowPlugin):
    """Named so `airflow plugins` lists it; the jobs page will be an external view."""

    name = "streamkeeper"
