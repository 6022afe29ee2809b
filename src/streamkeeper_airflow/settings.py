"""Deployment settings of the Airflow layer: Airflow config section `[streamkeeper]`.

    [streamkeeper]
    jobs_folder = /opt/jobs        # job specs (*/job.yaml) the DAGs are generated from
    workdir = /var/lib/streamkeeper  # drivers' working directory (relative spec paths)
    alert_sink = /var/log/streamkeeper/alerts.jsonl   # or https://hooks.example/alerts

Each is also an environment variable (AIRFLOW__STREAMKEEPER__WORKDIR, ...), as any
Airflow option is.
"""

from __future__ import annotations

import os
from pathlib import Path

SECTION = "streamkeeper"


def option(key: str, fallback: str | None = None) -> str | None:
    """`[streamkeeper] key` from Airflow's configuration, else `fallback`."""
    try:
        from airflow.sdk import conf

        value = conf.get(SECTION, key, fallback=None)
    except Exception:  # noqa: BLE001 - outside Airflow, or the section is not declared
        value = os.environ.get(f"AIRFLOW__{SECTION.upper()}__{key.upper()}")
    return value or fallback


def jobs_folder(default: Path) -> Path:
    return Path(option("jobs_folder") or default)


def workdir() -> str:
    """Where drivers run: `[streamkeeper] workdir`, else this process's directory."""
    return str(Path(option("workdir") or os.getcwd()).resolve())


def alert_sink() -> str | None:
    return option("alert_sink")
